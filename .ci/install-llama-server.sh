#!/usr/bin/env bash
# Installs a real OpenAI-compatible model server for tests/e2e/test_openai_server.py, once per
# machine: llama-cpp-python's server, built from source (PyPI has no Linux wheel of it; about 6-7
# minutes on two cores), in its own venv so its dependencies never meet squidcode's. The result is
# cached under $SQUIDCODE_LLAMA_SERVER_DIR (default ~/.cache/squidcode/llama-server); a second run
# with the stamp present returns at once. Prints the venv's python on its last line.
#
# Also llama.cpp's own C++ server (`$DEST/bin/llama-server`: `/infill`, `/slots`, which the Python
# server lacks), built with CMake from the llama.cpp sources vendored in the same release's sdist
# (fetched from PyPI), for the completion-server tests (tests/e2e/test_completion_server.py).
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
SERVER_STAMP="$DEST/.installed-llama-server-$VERSION-noamx"
if [ ! -f "$SERVER_STAMP" ]; then
  echo "install-llama-server: building llama.cpp's llama-server $VERSION into $DEST/bin (several minutes, once)" >&2
  WORK="$(mktemp -d)"
  trap 'rm -rf "$WORK"' EXIT
  "$DEST/bin/python" -m pip --disable-pip-version-check -q download --no-deps --no-binary :all: \
    --dest "$WORK" "llama-cpp-python==$VERSION"
  tar -xzf "$WORK"/llama_cpp_python-"$VERSION".tar.gz -C "$WORK"
  SRC="$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp"
  # A static binary without the web UI, TLS or downloads: loopback tests need none of them.
  cmake -S "$SRC" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF -DGGML_NATIVE=ON \
    -DCMAKE_C_FLAGS="$FLAGS" -DCMAKE_CXX_FLAGS="$FLAGS" >/dev/null
  cmake --build "$WORK/build" --target llama-server -j "$(nproc)" >/dev/null
  install -m 755 "$WORK/build/bin/llama-server" "$DEST/bin/llama-server"
  "$DEST/bin/llama-server" --version >/dev/null 2>&1
  touch "$SERVER_STAMP"
fi
echo "$DEST/bin/python"
