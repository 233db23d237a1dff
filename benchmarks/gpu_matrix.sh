#!/usr/bin/env bash
# The model matrix on one GPU, and its correctness tests, into $OUT (default ./matrix-out):
#   1. benchmarks/bench_matrix.py: this project (tuned and heuristic-only), every matrix layer and T
#   2. the same run, Humming layer by layer and OpenAI triton_kernels, each in a process of its own
#   3. the GPU tests: every matrix layer at T = 1, 37, 1000 vs the emulation; `moe-oracle tune` pickup
# Needs: torch with CUDA, triton 3.6, humming-kernels (pip install 'moe-oracle[humming]'), triton_kernels of the
# triton 3.6 API on PYTHONPATH (see backends/runners/oai_triton.py). Each step is time-boxed (seconds in
# MATRIX_S, PEER_S per Humming layer, TK_S, TESTS_S). Then copy $OUT/run into benchmarks/results/<date>-<gpu>/
# and run report_matrix.py.
set -u -o pipefail
OUT=${OUT:-./matrix-out}
mkdir -p "$OUT/run"
export PYTHONUNBUFFERED=1
commit=$(git rev-parse HEAD 2>/dev/null || echo "${MOE_ORACLE_COMMIT:-unknown}")
run_id="$(python3 -c 'import torch; print(torch.cuda.get_device_name().removeprefix("NVIDIA ").split()[0])')-$(date -u +%Y-%m-%dT%H:%M:%SZ)"
# this project alone first, then each peer layer in a process of its own: a peer kernel that crashes the CUDA context
# (Humming on glm-4.5 at T >= 256 and on qwen3-next at T = 4096, H100) then loses only its own layer's later cells
opts=(--out "$OUT/run" --run-id "$run_id" --commit "$commit" --iters "${ITERS:-10}")
timeout "${MATRIX_S:-900}" python3 benchmarks/bench_matrix.py "${opts[@]}" --peers "" 2>&1 | tee "$OUT/bench.log" \
    | grep -v "^  "
layers=$(python3 -c 'from backends.model_shapes import SHAPES; print(" ".join(n for n, s in SHAPES.items() if s.matrix))')
for layer in $layers; do
    timeout "${PEER_S:-120}" python3 benchmarks/bench_matrix.py "${opts[@]}" --no-ours --peers Humming \
        --layers "$layer" >> "$OUT/bench-humming.log" 2>&1
done
timeout "${TK_S:-600}" python3 benchmarks/bench_matrix.py "${opts[@]}" --no-ours --peers triton_kernels 2>&1 \
    | tee "$OUT/bench-triton-kernels.log" | grep -v "^  "
timeout "${TESTS_S:-900}" python3 -m pytest tests/test_triton_moe_matrix.py tests/test_tune_cli.py -q -rf \
    -p no:cacheprovider 2>&1 | tee "$OUT/pytest.log" | tail -5
