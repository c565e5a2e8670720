#!/usr/bin/env bash
# Builds llama.cpp's llama-server with CUDA for an H100/H200 (sm_90) on a machine without a GPU or
# a CUDA install: the compiler, headers and libraries come from NVIDIA's PyPI wheels (CUDA 13.0), the
# source from the llama-cpp-python sdist the tests already use (.ci/install-llama-server.sh). About
# 40 minutes on two cores. The binary links libcudart/libcublas 13 dynamically: on the GPU machine,
# put the folder holding them (torch's nvidia/cu13/lib, or /usr/local/cuda/lib64) on LD_LIBRARY_PATH.
#
#   bench/build_llama_server_cuda.sh DEST     # DEST/bin/llama-server; DEST/llama-server.xz to carry
set -euo pipefail
DEST="$(mkdir -p "${1:?usage: bench/build_llama_server_cuda.sh DEST}" && cd "$1" && pwd)"
VERSION=0.3.36
CUDA_VERSION="13.0.*"
python="${PYTHON:-python3}"
WORK="$DEST/work"
mkdir -p "$WORK/wheels" "$WORK/cuda" "$DEST/bin"

"$python" -m pip --disable-pip-version-check -q download --no-deps -d "$WORK/wheels" \
  "nvidia-cuda-nvcc==$CUDA_VERSION" "nvidia-cuda-runtime==$CUDA_VERSION" "nvidia-cublas==$CUDA_VERSION" \
  "nvidia-cuda-crt==$CUDA_VERSION" "nvidia-nvvm==$CUDA_VERSION" "nvidia-cuda-cccl==$CUDA_VERSION"
for wheel in "$WORK"/wheels/*.whl; do "$python" -m zipfile -e "$wheel" "$WORK/cuda"; done
CUDA="$WORK/cuda/nvidia/cu13"
chmod +x "$CUDA"/bin/* "$CUDA"/nvvm/bin/*
# The layout nvcc and CMake look for: unversioned libraries, and lib64 beside lib.
(cd "$CUDA/lib" && for lib in libcudart libcublas libcublasLt; do ln -sf "$lib.so.13" "$lib.so"; done)
ln -sfn lib "$CUDA/lib64"

"$python" -m pip --disable-pip-version-check -q download --no-deps --no-binary :all: -d "$WORK" \
  "llama-cpp-python==$VERSION"
tar -xzf "$WORK/llama_cpp_python-$VERSION.tar.gz" -C "$WORK"
SRC="$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp"
# No CUDA driver library here: without VMM nothing links libcuda (the driver loads it there).
PATH="$CUDA/bin:$PATH" cmake -S "$SRC" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF \
  -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF -DGGML_NATIVE=OFF \
  -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA=OFF -DGGML_CUDA_NO_VMM=ON \
  -DGGML_CUDA_NCCL=OFF -DCUDAToolkit_ROOT="$CUDA" -DCMAKE_CUDA_COMPILER="$CUDA/bin/nvcc" >/dev/null
PATH="$CUDA/bin:$PATH" cmake --build "$WORK/build" --target llama-server -j "$(nproc)" >/dev/null
install -m 755 "$WORK/build/bin/llama-server" "$DEST/bin/llama-server"
"$python" -c "import lzma, sys; open(sys.argv[2], 'wb').write(lzma.compress(open(sys.argv[1], 'rb').read()))" \
  "$DEST/bin/llama-server" "$DEST/llama-server.xz"
ls -la "$DEST/bin/llama-server" "$DEST/llama-server.xz"
