// The matmul of the CUDA backend (kernels.cuh): bf16 tensor cores through WMMA, fp32 accumulate.
// The toolkit this is built with in CI has no cuBLAS (CUDA 13's nvcc and runtime only), and the library must
// load without extra shared objects, so the matmul is our own: each warp owns one 16 x 16 tile of Y and one
// K slice, loading its fragments straight from global memory (X and the weight rows are re-read through L2,
// no shared-memory staging: simple over fast). Decode (M <= 8) is memory-bound: the K slices multiply the
// warps in flight (a 1024 x 1024 matrix: 64 tiles x 4 slices) so the weight rows stream in parallel.
#include <mma.h>

#include "kernels.cuh"

namespace strata_cuda {

using namespace nvcuda;

int gemm_splits(int64_t N, int64_t K) {
  if (N >= 16384) return 1;  // the lm_head: enough tiles already, and no [M, V] partials to hold
  return int((K + kGemmSlice - 1) / kGemmSlice);
}

namespace {

constexpr int kWarps = 4;  // a block: 4 warps side by side along N (a 16 x 64 strip of Y)

// grid: x = round_up(N, 16) / 64 (rounded up), y = round_up(M, 16) / 16, z = K slices.
// part == nullptr: the one slice writes (or adds to) Y; else slice z writes part[z][M][N].
__global__ void gemm_kernel(const bf16* __restrict__ X, const bf16* __restrict__ W, float* __restrict__ Y, int M,
                            int N, int K, int ldy, int accumulate, float* __restrict__ part) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n0 = (blockIdx.x * kWarps + warp) * 16, m0 = blockIdx.y * 16;
  __shared__ float stage[kWarps][16 * 16];
  if (n0 >= N) return;  // whole tile past N (W has round_up(N, 16) rows: a tile that starts below N is readable)
  const int k_begin = blockIdx.z * kGemmSlice, k_end = min(K, k_begin + kGemmSlice);
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::fill_fragment(acc, 0.0f);
  const bf16* xa = X + int64_t(m0) * K;
  const bf16* wb = W + int64_t(n0) * K;
#pragma unroll 4
  for (int k = k_begin; k < k_end; k += 16) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> b;  // (k, n) at W[n][k]
    wmma::load_matrix_sync(a, xa + k, K);
    wmma::load_matrix_sync(b, wb + k, K);
    wmma::mma_sync(acc, a, b, acc);
  }
  wmma::store_matrix_sync(stage[warp], acc, 16, wmma::mem_row_major);
  __syncwarp();
  for (int i = lane; i < 256; i += 32) {
    const int m = m0 + i / 16, n = n0 + i % 16;
    if (m >= M || n >= N) continue;
    const float v = stage[warp][i];
    if (part) part[(int64_t(blockIdx.z) * M + m) * N + n] = v;
    else if (accumulate) Y[int64_t(m) * ldy + n] += v;
    else Y[int64_t(m) * ldy + n] = v;
  }
}

// Y[m, n] (+)= sum over z in order of part[z][m][n].
__global__ void gemm_reduce(const float* __restrict__ part, int splits, float* __restrict__ Y, int M, int N, int ldy,
                            int accumulate) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(M) * N) return;
  float s = 0.f;
  for (int z = 0; z < splits; ++z) s += part[int64_t(z) * M * N + i];
  const int64_t m = i / N, n = i % N;
  if (accumulate) Y[m * ldy + n] += s;
  else Y[m * ldy + n] = s;
}

}  // namespace

void gemm_bf16(const bf16* X, const bf16* W, float* Y, int M, int N, int K, int ldy, bool accumulate, float* work,
               cudaStream_t s) {
  const int splits = gemm_splits(N, K);
  const int tiles_n = int(round_up(N, 16) / 16);
  const dim3 grid(unsigned((tiles_n + kWarps - 1) / kWarps), unsigned(round_up(M, 16) / 16), unsigned(splits));
  gemm_kernel<<<grid, kWarps * 32, 0, s>>>(X, W, Y, M, N, K, ldy, accumulate ? 1 : 0, splits > 1 ? work : nullptr);
  if (splits > 1) {
    const int64_t total = int64_t(M) * N;
    gemm_reduce<<<unsigned((total + 255) / 256), 256, 0, s>>>(work, splits, Y, M, N, ldy, accumulate ? 1 : 0);
  }
}

}  // namespace strata_cuda
