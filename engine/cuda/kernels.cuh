// The CUDA backend's kernels, one implementation each (gemm.cu, attention.cu; the small per-row ops live in
// qwen3_cuda.cu beside the forward that calls them). Shapes in comments are row-major.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace strata_cuda {

using bf16 = __nv_bfloat16;

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Y[M, N] = X[M, K] @ W[N, K]^T (accumulate: Y +=), bf16 in, fp32 accumulate on tensor cores (WMMA 16x16x16).
// X: round_up(M, 16) readable rows of K values (rows past M are read, their results dropped); W:
// round_up(N, 16) rows (padding rows zero); K a multiple of 16; pointers 32-byte aligned; Y row stride ldy.
// K is cut into slices of kGemmSlice, summed in slice order (gemm_splits), so a row's result depends only on
// that row of X and never on M: a token gets the same bits in a prefill chunk, alone, or in a decode batch.
constexpr int kGemmSlice = 256;
int gemm_splits(int64_t N, int64_t K);  // 1 for wide matrices (the lm_head), else ceil(K / kGemmSlice)
// work: gemm_splits(N, K) * M * N floats when that is > 1 (the partial sums), else unused.
void gemm_bf16(const bf16* X, const bf16* W, float* Y, int M, int N, int K, int ldy, bool accumulate, float* work,
               cudaStream_t s);

// Causal attention with GQA of n query rows over one layer's cache. q: fp32 rows of ldq floats, heads
// [H, hd] at the start of each row (after q_norm and RoPE); kc, vc: bf16 [Hkv, cap, hd] holding positions
// [0, pos0 + n); row t (position pos0 + t) sees keys [0, pos0 + t]. out: bf16 [n, H * hd].
// n > 1 (prefill): one pass per block of rows over all its keys (flash-style: 32-key tiles in shared memory,
// online softmax). n == 1 (decode): the keys are split into chunks across blocks (flash-decoding) and the
// partial softmaxes combined; work: attention_work_floats(H, hd) floats.
constexpr int kAttnMaxSplits = 256;
inline int64_t attention_work_floats(int64_t H, int64_t hd) { return kAttnMaxSplits * H * (hd + 2); }
void attention(const float* q, int ldq, int n, int H, int Hkv, int hd, const bf16* kc, const bf16* vc, int64_t cap,
               int64_t pos0, bf16* out, float* work, int sms, cudaStream_t s);

}  // namespace strata_cuda
