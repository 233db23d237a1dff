#!/usr/bin/env bash
# The runners of issue 27 on one GPU, into $OUT (default ./gpu-runners-out):
#   1. tests/test_runners_gpu.py: HUMMING on gpt-oss-120b MXFP4 and DeepSeek-V3-shaped NVFP4, TRITON forced on
#      gpt-oss-120b, through MoELayer (profile vllm-0.33) vs the emulation at T = 1, 37, 1000
#   2. `moe-oracle bench` on both layers (CSV + overrides YAML per layer)
#   3. benchmarks/bench_moe.py at the same T: this project's kernels timed by the benchmark itself in the same run,
#      to compare with bench's TRITON_MOE row
# Needs: torch with CUDA, triton 3.6, humming-kernels 0.1.19 (pip install 'moe-oracle[humming]'), triton_kernels
# of the triton 3.6 API on PYTHONPATH (see backends/runners/oai_triton.py). Every step is time-boxed so that one
# slow step cannot take the others' records with it.
set -u -o pipefail
OUT=${OUT:-gpu-runners-out}
TOKENS=${TOKENS:-1,37,1000}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
log="$OUT/log.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee "$log"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" 2>&1 | tee -a "$log"
python3 -c "import humming; print('humming', getattr(humming, '__version__', '?'))" 2>&1 | tee -a "$log"
python3 -c "import triton_kernels, os; print('triton_kernels at', os.path.dirname(triton_kernels.__file__))" 2>&1 | tee -a "$log"
echo "## 1. runner tests" | tee -a "$log"
timeout "${TEST_S:-240}" python3 -m pytest tests/test_runners_gpu.py -q -rs -s -p no:cacheprovider 2>&1 | tee -a "$log"
echo "## 2. moe-oracle bench" | tee -a "$log"
timeout "${BENCH_S:-150}" python3 -m oracle.cli bench --shape 128,4,2880,2880 --format mxfp4 --tokens "$TOKENS" \
    --iters 20 --no-progress --csv "$OUT/bench-gpt-oss-120b.csv" --overrides-out "$OUT/overrides-gpt-oss-120b.yaml" \
    --model 'openai/gpt-oss-120b' 2>&1 | tee -a "$log"
timeout "${BENCH_S:-150}" python3 -m oracle.cli bench --shape 256,8,7168,2048 --format nvfp4 --tokens "$TOKENS" \
    --iters 20 --no-progress --csv "$OUT/bench-deepseek-nvfp4.csv" \
    --overrides-out "$OUT/overrides-deepseek-nvfp4.yaml" 2>&1 | tee -a "$log"
echo "## 3. benchmarks/bench_moe.py, same run" | tee -a "$log"
timeout "${MOE_S:-90}" python3 benchmarks/bench_moe.py --shapes gpt-oss-120b,deepseek-v3 --tokens "$TOKENS" \
    --iters 20 --no-baselines --out "$OUT" 2>&1 | tee -a "$log"
echo "## done" | tee -a "$log"
