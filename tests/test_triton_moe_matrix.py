"""Every layer of the model matrix on a GPU, at T = 1, 37 and 1000, against the emulation: with the config the
runtime selects (a table entry or the heuristics) and with the heuristics alone."""

from __future__ import annotations

import pytest
import torch
from test_triton_moe import assert_matches_emulation, layer_and_reference

from backends.model_shapes import MATRIX, SHAPES
from backends.triton_moe import tuning

from conftest import requires_cuda


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 37, 1000])
@pytest.mark.parametrize("name", MATRIX)
def test_cuda_matrix_layer_matches_emulation(name, tokens):
    shape = SHAPES[name]
    arch, gpu = tuning.device_gpu(torch.device("cuda"))
    problem = tuning.Problem(tokens=tokens, **shape.fields())
    layer, ref = layer_and_reference(shape, tokens, device="cuda", seed=tokens, gate_up_layout=shape.gate_up_layout)
    assert_matches_emulation(layer(), ref)  # the runtime's own choice
    heuristic = tuning.select_config(arch, gpu, problem, use_tables=False)
    if heuristic != tuning.select_config(arch, gpu, problem):
        layer, _ = layer_and_reference(shape, tokens, device="cuda", seed=tokens, gate_up_layout=shape.gate_up_layout,
                                       config=heuristic)
        assert_matches_emulation(layer(), ref)
