#!/usr/bin/env bash
# Everything the GPU issue measures, most needed first, inside a time budget ($1 seconds): a
# first round of both trainers eager and compiled, the CUDA checks, the memory plan's cases,
# kernel profiles of one compiled step, then the other rounds. Results under $OUT (8 files at
# most). BASE: an older checkout to time as a third side in the first round.
set -u
cd "$(dirname "$0")/.."
export OUT=${OUT:-benchmarks/results} PYTHONUNBUFFERED=1
budget=${1:-450}
left() { echo $((budget - SECONDS)); }
bench() { python3 benchmarks/trainers_gpu.py --budget-s "$(left)" --run-timeout 150 "$@"; }
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    python3 -c "import torch, torchtitan; print('torch', torch.__version__, 'torchtitan', torchtitan.__version__)"
    bench --modes eager,compile --runs 1 ${BASE:+--base "$BASE"} --name round1
    echo "cuda_checks at ${SECONDS}s"
    timeout "$(left)" python3 benchmarks/cuda_checks.py
    echo "memory at ${SECONDS}s"
    timeout "$(left)" python3 benchmarks/memory_gpu.py measure
    echo "profiles at ${SECONDS}s"
    bench --profile "${PROFILE:-mmm-orch:compile,torchtitan:compile}"
    bench --modes eager,compile --runs 2 --name rounds23
    echo "done at ${SECONDS}s"
} 2>&1 | tee "$OUT/session.log"
