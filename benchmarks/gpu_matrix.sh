#!/usr/bin/env bash
# The model matrix on one GPU, and its correctness tests, into $OUT (default ./matrix-out):
#   1. benchmarks/bench_matrix.py: this project (tuned and heuristic-only) and Humming, every matrix layer and T
#   2. the same run, OpenAI triton_kernels in a process of its own (a crash of its kernels ends only that process)
#   3. the GPU tests: every matrix layer at T = 1, 37, 1000 vs the emulation; `moe-oracle tune` pickup
# Needs: torch with CUDA, triton 3.6, humming-kernels (pip install 'moe-oracle[humming]'), triton_kernels of the
# triton 3.6 API on PYTHONPATH (see backends/runners/oai_triton.py). Each step is time-boxed (seconds in
# MATRIX_S, TK_S, TESTS_S). Then copy $OUT/run into benchmarks/results/<date>-<gpu>/ and run report_matrix.py.
set -u -o pipefail
OUT=${OUT:-./matrix-out}
mkdir -p "$OUT/run"
export PYTHONUNBUFFERED=1
commit=$(git rev-parse HEAD 2>/dev/null || echo "${MOE_ORACLE_COMMIT:-unknown}")
run_id="$(python3 -c 'import torch; print(torch.cuda.get_device_name().removeprefix("NVIDIA ").split()[0])')-$(date -u +%Y-%m-%dT%H:%M:%SZ)"
timeout "${MATRIX_S:-1500}" python3 benchmarks/bench_matrix.py --out "$OUT/run" --run-id "$run_id" --commit "$commit" \
    --iters "${ITERS:-10}" --peers Humming 2>&1 | tee "$OUT/bench.log" | grep -v "^  "
timeout "${TK_S:-600}" python3 benchmarks/bench_matrix.py --out "$OUT/run" --run-id "$run_id" --commit "$commit" \
    --iters "${ITERS:-10}" --no-ours --peers triton_kernels --layers gpt-oss-120b,gpt-oss-20b 2>&1 \
    | tee "$OUT/bench-triton-kernels.log" | grep -v "^  "
timeout "${TESTS_S:-900}" python3 -m pytest tests/test_triton_moe_matrix.py tests/test_tune_cli.py -q -rf \
    -p no:cacheprovider 2>&1 | tee "$OUT/pytest.log" | tail -5
