#!/usr/bin/env bash
# Build llama.cpp's llama-server (and nothing else) from the llama.cpp that the llama-cpp-python sdist vendors: the
# peer of benchmarks/engine.py (STRATA_LLAMA_SERVER=<printed path>) and benchmarks/concurrency.py.
# Usage: scripts/build_llama_server.sh [--isa native|avx2] [OUT_DIR] [LLAMA_CPP_PYTHON_VERSION]
#   --isa native (default): ggml's CPU backend built for this CPU (-march=native), into build/.
#   --isa avx2: the CPU backend built for AVX2 + FMA + F16C (+ BMI2, which every AVX2 CPU has) and no AVX-512,
#     into build-avx2/: the llama.cpp an AVX2-only machine runs, to compare against strata at STRATA_KERNEL=avx2
#     on a machine that has AVX-512. Only ggml's CPU backend (libggml-cpu.so) differs between the two builds.
#   OUT_DIR defaults to ~/.cache/strata-llama-server; prints the path of the llama-server binary at the end.
#   JOBS (environment) sets the build's parallel jobs (default: all cores).
# Known good: llama-cpp-python 0.3.36 (llama.cpp 0c1e570). On 2 busy cores a build takes up to 85 min; it is reused
# when OUT_DIR already holds it. The server's lib*.so files sit next to the binary (RUNPATH points there).
set -euo pipefail
ISA=native
if [ "${1:-}" = "--isa" ]; then ISA=${2:?--isa needs native or avx2}; shift 2; fi
case "$ISA" in
  native) BUILD=build; ISA_FLAGS=(-DGGML_NATIVE=ON) ;;
  avx2) BUILD=build-avx2
        ISA_FLAGS=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
                   -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF
                   -DGGML_AVX_VNNI=OFF) ;;
  *) echo "build_llama_server.sh: --isa must be native or avx2, not '$ISA'" >&2; exit 2 ;;
esac
OUT=${1:-$HOME/.cache/strata-llama-server}
VER=${2:-0.3.36}
SRC="$OUT/llama_cpp_python-$VER/vendor/llama.cpp"
BIN="$SRC/$BUILD/bin/llama-server"
if [ -x "$BIN" ]; then echo "$BIN"; exit 0; fi
mkdir -p "$OUT" && cd "$OUT"
if [ ! -d "$SRC" ]; then
  python3 -m pip download --no-binary :all: --no-deps "llama-cpp-python==$VER" -d . >/dev/null
  tar xzf "llama_cpp_python-$VER.tar.gz"
fi
cd "$SRC"
cmake -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF "${ISA_FLAGS[@]}" \
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_APP=OFF >/dev/null
cmake --build "$BUILD" --target llama-server -j"${JOBS:-$(nproc)}" >/dev/null
if [ "$ISA" = avx2 ] && grep -q -- '-march=native' "$BUILD/compile_commands.json" 2>/dev/null; then
  echo "build_llama_server.sh: $BUILD still compiled with -march=native" >&2; exit 1
fi
echo "$BIN"
