"""The one way the command line writes a file: inside the directory the user named, atomically.

A writer that follows a symlink could rewrite any file the user can write (a link planted in a rules
directory pointing at ~/.bashrc); a writer that truncates first leaves half a file behind when it is
interrupted. So every write resolves the path, refuses one whose real place leaves the target
directory (naming the link), and writes a temporary file beside the real one, then renames it over.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .errors import OracleError


def resolve_inside(path: Path, root: Path) -> Path:
    """The real path of `path`; OracleError when a symlink takes it outside `root` or loops."""
    try:
        real_root = root.resolve(strict=False)
        real = path.resolve(strict=False)
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop (Python < 3.13)
        raise OracleError(f"{path}: cannot resolve this path ({exc}); remove the symlink loop") from None
    if not real.is_relative_to(real_root):
        link = _first_link(path) or path
        target = os.readlink(link) if link.is_symlink() else str(real)
        raise OracleError(f"{path}: refusing to write through the symlink {link} -> {target}, which leaves {root}; "
                          "replace the link by a regular file, or name the file it points to")
    return real


def _first_link(path: Path) -> Path | None:
    """The first component of `path` that is a symlink (what the message names)."""
    current = Path(path.anchor) if path.is_absolute() else Path()
    for part in path.parts[1:] if path.is_absolute() else path.parts:
        current = current / part
        if current.is_symlink():
            return current
    return None


def write_inside(path: Path, text: str, root: Path | None = None) -> Path:
    """Write `text` to `path` (UTF-8) atomically; `root` (default: the path's directory) is where the real
    file must stay. Returns the real path written."""
    real = resolve_inside(path, path.parent if root is None else root)
    if real.exists() and not real.is_file():
        raise OracleError(f"{path}: not a regular file; name a file to write")
    fd, tmp = tempfile.mkstemp(prefix=f".{real.name}.", suffix=".tmp", dir=real.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            fh.write(text)
        if real.exists():
            os.chmod(tmp, real.stat().st_mode & 0o7777)
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, real)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return real
