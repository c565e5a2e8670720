#!/usr/bin/env bash
# Installs a real OpenAI-compatible model server for tests/e2e/test_openai_server.py, once per
# machine: llama-cpp-python's server, built from source (PyPI has no Linux wheel of it; about 6-7
# minutes on two cores), in its own venv so its dependencies never meet squidcode's. The result is
# cached under $SQUIDCODE_LLAMA_SERVER_DIR (default ~/.cache/squidcode/llama-server); a second run
# with the stamp present returns at once. Prints the venv's python on its last line.
set -euo pipefail

VERSION=0.3.36
DEST="${SQUIDCODE_LLAMA_SERVER_DIR:-$HOME/.cache/squidcode/llama-server}"
# x86-64: built for this machine's CPU but without AMX. Some virtual machines report AMX in CPUID
# yet fault on its first tile instruction (ldtilecfg), which killed every llama.cpp evaluation.
FLAGS=""
if [ "$(uname -m)" = x86_64 ]; then FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"; fi
STAMP="$DEST/.installed-llama-cpp-python-$VERSION-noamx"

if [ ! -f "$STAMP" ]; then
  echo "install-llama-server: building llama-cpp-python[server]==$VERSION into $DEST (several minutes, once)" >&2
  rm -rf "$DEST"
  "${PYTHON:-python3}" -m venv "$DEST"
  CFLAGS="$FLAGS" CXXFLAGS="$FLAGS" "$DEST/bin/python" -m pip --disable-pip-version-check -q install \
    --no-cache-dir "llama-cpp-python[server]==$VERSION"
  "$DEST/bin/python" -c 'import llama_cpp.server'
  touch "$STAMP"
fi
echo "$DEST/bin/python"
