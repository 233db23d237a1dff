"""One vocabulary per format (oracle/vocabulary.py): the rules, the codecs and the Quark/OCP names agree with it."""
from __future__ import annotations

import yaml

from oracle import vocabulary as voc


def test_every_quant_key_of_the_rules_is_in_the_vocabulary(oracle):
    root = oracle.root
    keys = yaml.safe_load((root / "common" / "platform.yaml").read_text())["quant_keys"]
    assert set(keys) <= set(voc.BY_QUANT_KEY), set(keys) - set(voc.BY_QUANT_KEY)


def test_codecs_are_the_backends_codecs():
    from backends import emulation, formats

    known = set(emulation.WEIGHT_FORMATS) | {s for s in formats.ACTIVATION_SCHEMES if s} | {"mxfp8", "fp8_per_token_group"}
    assert set(voc.CODECS) <= known, set(voc.CODECS) - known
    for fmt in voc.FORMATS:
        if fmt.codec in ("mxfp4", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp8"):
            assert fmt.block == formats.MX_BLOCK_SIZE and fmt.scale == "e8m0", fmt


def test_activations_are_defined_once():
    from backends import emulation

    assert set(voc.GATED_ACTIVATIONS + voc.UNGATED_ACTIVATIONS) <= set(voc.ACTIVATIONS)
    assert not set(voc.GATED_ACTIVATIONS) & set(voc.UNGATED_ACTIVATIONS)
    assert set(emulation.ACTIVATIONS) <= set(voc.ACTIVATIONS), "the emulation runs only names the scenario knows"
    assert set(emulation.GATED_ACTIVATIONS) == set(voc.GATED_ACTIVATIONS)


def test_the_quark_dtype_renaming_of_the_rules_is_the_vocabulary(oracle):
    """The OCP-MX rules rename Quark input dtypes (fp4 -> mxfp4 ...): the same map as the vocabulary's."""
    data = yaml.safe_load((oracle.root / "vllm-0.20" / "ocp-mx.yaml").read_text())
    rename = data["values"]["ocp_mx_input_dtype"]["map"]
    assert rename == {q: voc.quark_to_ocp(q) for q in rename}
    assert voc.quark_to_ocp("int8") is None
