// GCC 12 warns about its own AVX-512 intrinsic headers (false positives on the masked forms).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "kernels_internal.h"

namespace strata {
namespace kernels {

// ---------------------------------------------------------------- small f32 GEMM (one thread)
// C[M, N] (+)= A[M, K] @ B[K, N]; A element (i, p) at A[i * ars + p * acs] (a transposed A is acs = ld,
// ars = 1), B and C row-major. The AVX2 tile holds MR rows x NV vectors of 8 columns in registers and
// broadcasts one A element per row per step; the last vector of a row may be masked (N % 8 columns).
// lower: A is lower triangular (A(i, p) = 0 for p > i), so row block i0.. stops at p < i0 + MR.
STRATA_AVX2 static inline __m256i tail_mask(int64_t r) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(r)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
template <int MR, int NV, bool MASK>
STRATA_AVX2 static void gemm_tile_avx2(int64_t K, const float* A, int64_t ars, int64_t acs, const float* B,
                                       int64_t ldb, float* C, int64_t ldc, bool acc, __m256i m) {
  // Named accumulators (an array of __m256 indexed in loops is kept on the stack by GCC 12).
  static_assert(MR >= 1 && MR <= 4 && NV >= 1 && NV <= 2, "tile");
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00;
#define ld(p, last) ((MASK && (last)) ? _mm256_maskload_ps((p), m) : _mm256_loadu_ps(p))
#define st(p, last, x) ((MASK && (last)) ? _mm256_maskstore_ps((p), m, (x)) : _mm256_storeu_ps((p), (x)))
  if (acc) {
    c00 = ld(C, NV == 1);
    if (NV == 2) c01 = ld(C + 8, true);
    if (MR > 1) { c10 = ld(C + ldc, NV == 1); if (NV == 2) c11 = ld(C + ldc + 8, true); }
    if (MR > 2) { c20 = ld(C + 2 * ldc, NV == 1); if (NV == 2) c21 = ld(C + 2 * ldc + 8, true); }
    if (MR > 3) { c30 = ld(C + 3 * ldc, NV == 1); if (NV == 2) c31 = ld(C + 3 * ldc + 8, true); }
  }
  const float* a0 = A;
  const float* a1 = A + ars;
  const float* a2 = A + 2 * ars;
  const float* a3 = A + 3 * ars;
  for (int64_t p = 0; p < K; ++p) {
    const float* bp = B + p * ldb;
    const __m256 b0 = ld(bp, NV == 1);
    const __m256 b1 = NV == 2 ? ld(bp + 8, true) : b0;
    const int64_t o = p * acs;
    __m256 a = _mm256_broadcast_ss(a0 + o);
    c00 = _mm256_fmadd_ps(a, b0, c00);
    if (NV == 2) c01 = _mm256_fmadd_ps(a, b1, c01);
    if (MR > 1) {
      a = _mm256_broadcast_ss(a1 + o);
      c10 = _mm256_fmadd_ps(a, b0, c10);
      if (NV == 2) c11 = _mm256_fmadd_ps(a, b1, c11);
    }
    if (MR > 2) {
      a = _mm256_broadcast_ss(a2 + o);
      c20 = _mm256_fmadd_ps(a, b0, c20);
      if (NV == 2) c21 = _mm256_fmadd_ps(a, b1, c21);
    }
    if (MR > 3) {
      a = _mm256_broadcast_ss(a3 + o);
      c30 = _mm256_fmadd_ps(a, b0, c30);
      if (NV == 2) c31 = _mm256_fmadd_ps(a, b1, c31);
    }
  }
  st(C, NV == 1, c00);
  if (NV == 2) st(C + 8, true, c01);
  if (MR > 1) { st(C + ldc, NV == 1, c10); if (NV == 2) st(C + ldc + 8, true, c11); }
  if (MR > 2) { st(C + 2 * ldc, NV == 1, c20); if (NV == 2) st(C + 2 * ldc + 8, true, c21); }
  if (MR > 3) { st(C + 3 * ldc, NV == 1, c30); if (NV == 2) st(C + 3 * ldc + 8, true, c31); }
#undef ld
#undef st
}
template <int MR>
STRATA_AVX2 static void gemm_rows_avx2(int64_t N, int64_t K, const float* A, int64_t ars, int64_t acs,
                                       const float* B, int64_t ldb, float* C, int64_t ldc, bool acc) {
  int64_t j = 0;
  const __m256i none = _mm256_setzero_si256();
  for (; j + 16 <= N; j += 16) gemm_tile_avx2<MR, 2, false>(K, A, ars, acs, B + j, ldb, C + j, ldc, acc, none);
  if (j + 8 <= N) { gemm_tile_avx2<MR, 1, false>(K, A, ars, acs, B + j, ldb, C + j, ldc, acc, none); j += 8; }
  if (j < N) gemm_tile_avx2<MR, 1, true>(K, A, ars, acs, B + j, ldb, C + j, ldc, acc, tail_mask(N - j));
}
STRATA_AVX2 static void gemm_avx2(int64_t M, int64_t N, int64_t K, const float* A, int64_t ars, int64_t acs,
                                  const float* B, int64_t ldb, float* C, int64_t ldc, bool acc, bool lower) {
  constexpr int MR = 4;
  int64_t i = 0;
  for (; i + MR <= M; i += MR)
    gemm_rows_avx2<MR>(N, lower ? std::min(K, i + MR) : K, A + i * ars, ars, acs, B, ldb, C + i * ldc, ldc, acc);
  for (; i < M; ++i)
    gemm_rows_avx2<1>(N, lower ? std::min(K, i + 1) : K, A + i * ars, ars, acs, B, ldb, C + i * ldc, ldc, acc);
}

void gemm_f32(int64_t M, int64_t N, int64_t K, const float* A, int64_t ars, int64_t acs, const float* B,
              int64_t ldb, float* C, int64_t ldc, bool accumulate, bool lower) {
  if (M <= 0 || N <= 0) return;
  if (vec(level()) != Level::Scalar) {
    gemm_avx2(M, N, K, A, ars, acs, B, ldb, C, ldc, accumulate, lower);
    return;
  }
  for (int64_t i = 0; i < M; ++i) {
    float* ci = C + i * ldc;
    if (!accumulate) std::fill(ci, ci + N, 0.f);
    const int64_t kend = lower ? std::min(K, i + 1) : K;
    for (int64_t p = 0; p < kend; ++p) {
      const float a = A[i * ars + p * acs];
      const float* bp = B + p * ldb;
#pragma omp simd
      for (int64_t j = 0; j < N; ++j) ci[j] += a * bp[j];
    }
  }
}

}  // namespace kernels
}  // namespace strata
