#!/usr/bin/env bash
# Build, check and time the three Triton kernels on one CUDA GPU (written for an H200) in one call:
# each against its torch reference on the same inputs, torch eager, and the bytes-moved floor at
# 4.3 TB/s. Prints one table; exits non-zero if a check fails.
#
#   bench/gpu_kernels.sh            # on the GPU machine, from the repository root or anywhere
#   bench/gpu_kernels.sh --smoke    # tiny shapes on the CPU under TRITON_INTERPRET=1 (no GPU)
#
# Needs torch with CUDA and triton (pip install triton==3.9.0, the `test` extra) in the active Python;
# PYTHON=... picks another interpreter.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
python="${PYTHON:-python3}"
cd "$repo"
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
if [[ "${1:-}" != "--smoke" ]]; then
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader || true
fi
"$python" -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
exec "$python" "$here/gpu_kernels.py" "$@"
