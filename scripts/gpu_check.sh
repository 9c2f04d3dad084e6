#!/usr/bin/env bash
# Every GPU path a one-GPU machine can exercise, in well under 4 minutes (see scripts/gpu_check.py
# for what it checks and what it cannot reach: NCCL between two ranks needs two GPUs).
# Without CUDA it says so and exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src:$PWD/examples/executor_plugin/src${PYTHONPATH:+:$PYTHONPATH}"
exec timeout 230 python scripts/gpu_check.py "$@"
