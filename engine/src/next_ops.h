// Small fp32 building blocks shared by the Qwen3-Next layers (gdn, gated_attention, moe, qwen3_next).
// Plain float pointers, row-major; "x @ W^T" everywhere because HF stores Linear weights as [out, in].
// These are deliberately simple (OpenMP over output rows, SIMD dot products) so the layers can later be
// pointed at the engine core's tuned kernels by replacing matmul_t() alone.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>

namespace strata::next {

inline float dot(const float* a, const float* b, int n) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

inline float sigmoidf(float x) { return 1.f / (1.f + std::exp(-x)); }
inline float siluf(float x) { return x / (1.f + std::exp(-x)); }
// torch.nn.functional.softplus with beta=1, threshold=20
inline float softplusf(float x) { return x > 20.f ? x : std::log1p(std::exp(x)); }

// y[T, N] = x[T, Din] @ W[N, Din]^T  (x rows have stride ldx, y rows stride ldy).
void matmul_t(const float* x, int T, int Din, int ldx, const float* W, int N, float* y, int ldy);
inline void matmul_t(const float* x, int T, int Din, const float* W, int N, float* y) {
  matmul_t(x, T, Din, Din, W, N, y, N);
}

// Qwen3-Next RMSNorm: y = x * rsqrt(mean(x^2) + eps) * (1 + w)   (the "1 + w" convention).
void rmsnorm_1p(const float* x, const float* w, int n, float eps, float* y);

// Rotate-half RoPE on the first rd dims of one head vector x[hd] at position pos (theta, rd given).
void rope_partial(float* x, int rd, int pos, float theta);

}  // namespace strata::next
