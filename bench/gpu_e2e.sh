#!/usr/bin/env bash
# squidcode's learning loop on one CUDA GPU, in one call: the runtime in bfloat16 (time to first
# token, decode tokens/s, GPU memory), then the simulated-user loop with the server and the trainer
# on the GPU (completion latency, GRPO step time, memory). Prints one table.
#
#   bench/gpu_e2e.sh [OUT.json]     # from anywhere; needs torch with CUDA (and triton) installed
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
python="${PYTHON:-python3}"
cd "$repo"
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
"$python" -c "import torch; assert torch.cuda.is_available(), 'no CUDA GPU'; print('torch', torch.__version__, torch.cuda.get_device_name())"
exec "$python" "$here/gpu_e2e.py" "$@"
