#!/usr/bin/env bash
# The model matrix on one GPU, and its correctness tests, into $OUT (default ./matrix-out):
#   ours:     benchmarks/bench_matrix.py: this project (tuned and heuristic-only), every matrix layer and T
#   tk:       the same run, OpenAI triton_kernels (its MXFP4 layers), in a process of its own
#   humming:  the same run, Humming layer by layer, each layer in a process of its own
#   tests:    the GPU tests: every matrix layer at T = 1, 37, 1000 vs the emulation; `moe-oracle tune` pickup
# Needs: torch with CUDA, triton 3.6, humming-kernels (pip install 'moe-oracle[humming]'), triton_kernels of the
# triton 3.6 API on PYTHONPATH (see backends/runners/oai_triton.py). Each step is time-boxed (seconds in
# MATRIX_S, TK_S, PEER_S per Humming layer, TESTS_S). On an H100 the steps take about 4, 0.5, 5 and 4 minutes.
# MATRIX_STEPS picks a subset in this order (default "ours tk humming tests"); RUN_ID continues a run whose first
# steps an earlier command of the same machine session wrote (its matrix.csv rows go to this $OUT, the report joins
# them by run id). Then copy $OUT/run into benchmarks/results/<date>-<gpu>/ and run report_matrix.py.
set -u -o pipefail
OUT=${OUT:-./matrix-out}
STEPS=" ${MATRIX_STEPS:-ours tk humming tests} "
mkdir -p "$OUT/run"
export PYTHONUNBUFFERED=1
commit=$(git rev-parse HEAD 2>/dev/null || echo "${MOE_ORACLE_COMMIT:-unknown}")
run_id=${RUN_ID:-"$(python3 -c 'import torch; print(torch.cuda.get_device_name().removeprefix("NVIDIA ").split()[0])')-$(date -u +%Y-%m-%dT%H:%M:%SZ)"}
echo "run id $run_id, steps:$STEPS"
# this project alone first, then each peer in a process of its own: a peer kernel that crashes the CUDA context
# (Humming on glm-4.5 at T >= 256 and on qwen3-next at T = 4096, H100) then loses only its own layer's later cells;
# triton_kernels (short) before Humming's layers (long), so a time-boxed command keeps both peers' cells of a layer
opts=(--out "$OUT/run" --run-id "$run_id" --commit "$commit" --iters "${ITERS:-10}")
if [[ $STEPS == *" ours "* ]]; then
    timeout "${MATRIX_S:-900}" python3 benchmarks/bench_matrix.py "${opts[@]}" --peers "" 2>&1 | tee "$OUT/bench.log" \
        | grep -v "^  "
fi
if [[ $STEPS == *" tk "* ]]; then
    timeout "${TK_S:-600}" python3 benchmarks/bench_matrix.py "${opts[@]}" --no-ours --peers triton_kernels 2>&1 \
        | tee "$OUT/bench-triton-kernels.log" | grep -v "^  "
fi
if [[ $STEPS == *" humming "* ]]; then
    layers=$(python3 -c 'from backends.model_shapes import SHAPES; print(" ".join(n for n, s in SHAPES.items() if s.matrix))')
    for layer in $layers; do
        timeout "${PEER_S:-120}" python3 benchmarks/bench_matrix.py "${opts[@]}" --no-ours --peers Humming \
            --layers "$layer" >> "$OUT/bench-humming.log" 2>&1
    done
fi
if [[ $STEPS == *" tests "* ]]; then
    timeout "${TESTS_S:-900}" python3 -m pytest tests/test_triton_moe_matrix.py tests/test_tune_cli.py -q -rf \
        -p no:cacheprovider 2>&1 | tee "$OUT/pytest.log" | tail -5
fi
