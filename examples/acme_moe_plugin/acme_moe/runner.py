"""The ACME_MXFP4 runner. A real plugin launches its own kernel here; the example delegates to the
project's emulation so that it computes the right answer on any device."""
from __future__ import annotations

from typing import Any


def moe_forward(*args: Any, **kwargs: Any) -> Any:
    from backends.emulation import moe_forward as reference

    return reference(*args, **kwargs)
