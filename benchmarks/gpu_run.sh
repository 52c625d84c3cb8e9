#!/bin/bash
# Everything measured on a lent GPU, in one go (results under $OUT, logs in $OUT/run.log):
#   OUT=/tmp/out bash benchmarks/gpu_run.sh [profile] [steps] [emitted] [probe] [kernels]   (default: the first four)
# Needs torch + transformers with CUDA; ortools (the emitted-vs-eager cases plan on the machine).
# Predictions are computed elsewhere on the CPU: python -m benchmarks.gpu_step predict.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-}:$PWD
log=$OUT/run.log
parts=${*:-profile steps emitted probe}
{
  date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit,temperature.gpu --format=csv
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
} >>"$log" 2>&1
for part in $parts; do
  echo "== $part" >>"$log"
  case $part in
    profile) timeout 90 python3 -m autoshard.cli profile --out "$OUT/h100_measured.json" --name h100_measured \
      --base h100x8 --raw "$OUT/h100_profile_raw.json" --ranks 1 --gemm-sizes 256,512,1024,2048,3072,4096,6144,8192 \
      --repeats 20 ;;
    steps) timeout ${STEP_TIMEOUT:-330} python3 -m benchmarks.gpu_step measure --out "$OUT" --steps 10 \
      --recipes ${RECIPES:-bf16,amp} ${ONLY:+--only "$ONLY"} ;;
    emitted) timeout 200 python3 -m benchmarks.gpu_emitted --out "$OUT"
      timeout 150 python3 -c "
import json; from benchmarks.isolate import run_isolated
print(json.dumps(run_isolated('benchmarks.runtime:eager_case', {'hidden': 2048, 'layers': 8, 'batch': 8, 'seq': 1024, 'steps': 20}, timeout=140)))" ;;
    probe) OUT=$OUT timeout 60 python3 benchmarks/gpu_probe.py >/dev/null ;;
    kernels) OUT=$OUT timeout ${KERNEL_TIMEOUT:-120} python3 benchmarks/gpu_kernels.py ;;
  esac >>"$log" 2>&1
done
echo "== done" >>"$log"; date -u >>"$log"
