#!/usr/bin/env bash
# The CUDA backend's one device run (docs/ENGINE.md "GPU"), on a machine with an NVIDIA GPU (sm_80 or newer),
# CUDA's nvcc, CMake, ninja, pybind11, PyTorch with CUDA and transformers, and no network:
#   1. builds both extensions and libstrata_cuda.so from this checkout (build/device, this GPU's arch only), and
#      copies them next to the Python sources (as scripts/dev_build.sh does);
#   2. runs tests/test_cuda.py (the gpu tests and the CPU-side ones);
#   3. runs benchmarks/cuda.py against transformers (SDPA, bf16) on the same GPU.
# Writes under $OUT (default /tmp/strata_device): device_check.log (everything), build.log, pytest.log and cuda.md,
# the results table to commit as benchmarks/results/cuda.md. It carries nothing but the working tree (about
# 7 MiB: the sources; nothing built here travels, since the extensions are built for the machine's Python).
# About 2-3 minutes of build on 16 cores, 1-2 of tests, 2-3 of benchmark: budgeted to end within 8 minutes.
# From the session's device tool:  run(command="bash scripts/device_check.sh", timeout_s=560)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/strata_device}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
exec > >(tee "$OUT/device_check.log") 2>&1
start=$(date +%s)
stamp() { echo "== $1 ($(( $(date +%s) - start )) s)"; }

stamp "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv
py=$(command -v python3)
$py -c "import sys, torch, transformers; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"
nvcc --version | tail -1

stamp "build"
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '. ')
pyb=$($py -c 'import pybind11; print(pybind11.get_cmake_dir())')
if ! { cmake -S . -B build/device -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$py" \
         -Dpybind11_DIR="$pyb" -DSTRATA_CUDA_ARCHS="$arch" && cmake --build build/device -j"$(nproc)"; } \
       > "$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"
  echo "BUILD FAILED (build.log)"
  exit 1
fi
cp build/device/engine/_engine*.so build/device/engine/_replay*.so build/device/engine/libstrata_cuda.so strata_lab/
export PYTHONPATH=$PWD
$py -c "import strata_lab._engine as e; print('extension', e.__file__)"

stamp "tests"
timeout 240 $py -m pytest tests/test_cuda.py -q -rs -p no:cacheprovider 2>&1 | tee "$OUT/pytest.log"
tests_rc=${PIPESTATUS[0]}

stamp "benchmark"
timeout 240 $py benchmarks/cuda.py --out "$OUT/cuda.md"
bench_rc=$?

stamp "done: tests rc=$tests_rc, benchmark rc=$bench_rc; commit $OUT/cuda.md as benchmarks/results/cuda.md"
[ "$tests_rc" = 0 ] && [ "$bench_rc" = 0 ]
