#!/usr/bin/env bash
# In-place developer build of strata_lab._engine and strata_lab._replay: compiles engine/ into build/dev and
# copies both modules next to the Python sources, so `PYTHONPATH=$PWD pytest` runs this checkout without installing.
set -euo pipefail
cd "$(dirname "$0")/.."
pyb=$(python -c 'import pybind11; print(pybind11.get_cmake_dir())')
cmake -S . -B build/dev -DCMAKE_BUILD_TYPE=Release -Dpybind11_DIR="$pyb" "$@" >/dev/null
cmake --build build/dev -j2
cp build/dev/engine/_engine*.so build/dev/engine/_replay*.so strata_lab/
# the CUDA backend, built when nvcc was found (loaded only by Engine.load(device="cuda"))
if [ -f build/dev/engine/libstrata_cuda.so ]; then cp build/dev/engine/libstrata_cuda.so strata_lab/; fi
echo "built $(ls strata_lab/_engine*.so strata_lab/_replay*.so)"
