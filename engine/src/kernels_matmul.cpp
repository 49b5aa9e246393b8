// GCC 12 warns about its own AVX-512 intrinsic headers (false positives on the masked forms).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "kernels_internal.h"

#include <sys/mman.h>

namespace strata {
namespace kernels {

// ---------------------------------------------------------------- scalar kernels
static float dot_scalar(const float* a, const float* b, int64_t n) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

static void cvt_scalar(DType dt, const void* src, int64_t n, float* out) {
  if (dt == DType::F32) { std::memcpy(out, src, size_t(n) * 4); return; }
  if (dt == DType::I8) {
    const int8_t* q = static_cast<const int8_t*>(src);
    for (int64_t i = 0; i < n; ++i) out[i] = float(q[i]);
    return;
  }
  const uint16_t* p = static_cast<const uint16_t*>(src);
  if (dt == DType::BF16) for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(p[i]);
  else for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(p[i]);
}

static float dotw_scalar(DType dt, const void* w, const float* x, int64_t n) {
  if (dt == DType::F32) return dot_scalar(static_cast<const float*>(w), x, n);
  float buf[256];
  float s = 0.f;
  const uint8_t* p = static_cast<const uint8_t*>(w);
  const size_t es = dtype_size(dt);
  for (int64_t i = 0; i < n; i += 256) {
    int64_t m = std::min<int64_t>(256, n - i);
    cvt_scalar(dt, p + size_t(i) * es, m, buf);
    s += dot_scalar(buf, x + i, m);
  }
  return s;
}

// ---------------------------------------------------------------- AVX2 + FMA + F16C

// One weight element as float (tails); es: bytes per element of a weight dtype.
template <DType DT>
static inline float elem(const void* p, int64_t i) {
  if constexpr (DT == DType::F32) return static_cast<const float*>(p)[i];
  else if constexpr (DT == DType::BF16) return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
  else if constexpr (DT == DType::I8) return float(static_cast<const int8_t*>(p)[i]);
  else return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
}
template <DType DT>
constexpr size_t esize() { return DT == DType::F32 ? 4 : DT == DType::I8 ? 1 : 2; }

template <DType DT>
STRATA_AVX2 static inline __m256 ld8(const void* p, int64_t i) {
  if constexpr (DT == DType::F32) return _mm256_loadu_ps(static_cast<const float*>(p) + i);
  else if constexpr (DT == DType::I8)
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(static_cast<const int8_t*>(p) + i))));
  else if constexpr (DT == DType::BF16) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + i));
    return _mm256_cvtph_ps(h);
  }
}

template <DType DT>
STRATA_AVX2 static float dotw_avx2(const void* w, const float* x, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_fmadd_ps(ld8<DT>(w, i), _mm256_loadu_ps(x + i), a0);
    a1 = _mm256_fmadd_ps(ld8<DT>(w, i + 8), _mm256_loadu_ps(x + i + 8), a1);
    a2 = _mm256_fmadd_ps(ld8<DT>(w, i + 16), _mm256_loadu_ps(x + i + 16), a2);
    a3 = _mm256_fmadd_ps(ld8<DT>(w, i + 24), _mm256_loadu_ps(x + i + 24), a3);
  }
  for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(ld8<DT>(w, i), _mm256_loadu_ps(x + i), a0);
  float s = hsum256(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  for (; i < n; ++i) s += elem<DT>(w, i) * x[i];
  return s;
}

template <DType DT>
STRATA_AVX2 static void cvt_avx2(const void* src, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, ld8<DT>(src, i));
  for (; i < n; ++i) out[i] = elem<DT>(src, i);
}

STRATA_AVX2 static void axpy_avx2(float a, const float* x, float* y, int64_t n) {
  __m256 av = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += a * x[i];
}

// NT tokens x NR rows of dot products over K; w rows in dtype DT (f32 for converted blocks), ldw in
// elements. Prefill and decode both run through these kernels, so a token's logits do not depend on how
// many tokens were computed with it (bit-identical reuse).
// PF (decode: rows contiguous, ldw == K, streamed from memory): software prefetch of the next block in
// memory order (linear prefetch, below).
template <DType DT, int NT, int NR, bool PF = false>
STRATA_AVX2 static void micro_avx2(const void* w, int64_t ldw, const float* x, int64_t ldx, int64_t K, float* y,
                                   int64_t ldy) {
  const size_t es = esize<DT>();
  const uint8_t* wb = static_cast<const uint8_t*>(w);
  __m256 acc[NT][NR];
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < NR; ++r) acc[t][r] = _mm256_setzero_ps();
  constexpr int64_t step = int64_t(NR) * 8 * int64_t(esize<DT>());  // block bytes read per k step
  const char* pf = reinterpret_cast<const char*>(wb) + size_t(NR * ldw) * es + kPrefetchAhead;
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    if constexpr (PF) {
      for (int64_t l = 0; l < step; l += 64) _mm_prefetch(pf + l, _MM_HINT_T1);
      pf += step;
    }
    __m256 xv[NT];
    for (int t = 0; t < NT; ++t) xv[t] = _mm256_loadu_ps(x + t * ldx + k);
    for (int r = 0; r < NR; ++r) {
      __m256 wv = ld8<DT>(wb + size_t(r * ldw) * es, k);
      for (int t = 0; t < NT; ++t) acc[t][r] = _mm256_fmadd_ps(xv[t], wv, acc[t][r]);
    }
  }
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < NR; ++r) {
      float s = hsum256(acc[t][r]);
      const void* row = wb + size_t(r * ldw) * es;
      // std::fma: the same rounding in every instantiation (no contraction left to the compiler)
      for (int64_t kk = k; kk < K; ++kk) s = std::fma(x[t * ldx + kk], elem<DT>(row, kk), s);
      y[t * ldy + r] = s;
    }
}


// bf16 rows at AVX2 with K % 16 == 0 ("eo" order): one 32-byte load holds 16 weights; a shift yields the
// 8 even ones as f32 and a mask the 8 odd ones (3 ops per 16 weights instead of 6 with two widening
// loads). x is read in the matching order (each block of 16 as its 8 even, then its 8 odd elements), and
// prefill converts rows to that same order, so decode and prefill add the same products in the same order
// (a token's logits stay bit-identical whatever n is).
static void perm_eo(const float* x, int64_t K, float* xp) {
  for (int64_t b = 0; b < K; b += 16)
    for (int l = 0; l < 8; ++l) {
      xp[b + l] = x[b + 2 * l];
      xp[b + 8 + l] = x[b + 2 * l + 1];
    }
}

STRATA_AVX2 static void cvt_bf16_eo(const void* src, int64_t K, float* out) {
  const uint16_t* p = static_cast<const uint16_t*>(src);
  const __m256i hi = _mm256_set1_epi32(int(0xffff0000u));
  for (int64_t k = 0; k < K; k += 16) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + k));
    _mm256_storeu_ps(out + k, _mm256_castsi256_ps(_mm256_slli_epi32(raw, 16)));
    _mm256_storeu_ps(out + k + 8, _mm256_castsi256_ps(_mm256_and_si256(raw, hi)));
  }
}

template <int NT, int NR>
STRATA_AVX2 static void micro_bf16eo(const void* w, int64_t ldw, const float* x, int64_t ldx, int64_t K, float* y,
                                     int64_t ldy) {
  const uint16_t* wb = static_cast<const uint16_t*>(w);
  const __m256i hi = _mm256_set1_epi32(int(0xffff0000u));
  __m256 acc[NT][NR];
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < NR; ++r) acc[t][r] = _mm256_setzero_ps();
  // decode only (rows contiguous): each k step prefetches NR*32 bytes of the next block into L2 (linear
  // prefetch, below)
  const char* pf = reinterpret_cast<const char*>(wb + NR * ldw) + kPrefetchAhead;
  for (int64_t k = 0; k < K; k += 16) {
    for (int l = 0; l < NR * 32; l += 64) _mm_prefetch(pf + l, _MM_HINT_T1);
    pf += NR * 32;
    __m256 xv[NT];
    for (int t = 0; t < NT; ++t) xv[t] = _mm256_loadu_ps(x + t * ldx + k);  // the even half
    for (int r = 0; r < NR; ++r) {
      const __m256 wv = _mm256_castsi256_ps(
          _mm256_slli_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + r * ldw + k)), 16));
      for (int t = 0; t < NT; ++t) acc[t][r] = _mm256_fmadd_ps(xv[t], wv, acc[t][r]);
    }
    for (int t = 0; t < NT; ++t) xv[t] = _mm256_loadu_ps(x + t * ldx + k + 8);  // the odd half
    for (int r = 0; r < NR; ++r) {
      const __m256 wv = _mm256_castsi256_ps(
          _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + r * ldw + k)), hi));
      for (int t = 0; t < NT; ++t) acc[t][r] = _mm256_fmadd_ps(xv[t], wv, acc[t][r]);
    }
  }
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < NR; ++r) y[t * ldy + r] = hsum256(acc[t][r]);
}

// ---------------------------------------------------------------- int8 weights x int8 activations
// Q8_0-style: each token row of x is quantised in blocks of QB = 32 (scale absmax/127, round to nearest
// even, zero-padded to whole blocks); weights are int8 rows with one scale per row. A block's dot is an
// exact int32 sum. Float order, identical in the scalar and the AVX2 kernel: lane j (bytes 4j..4j+3 of
// every full block) accumulates fma(isum, xscale_b, acc_j) over blocks in order; then hsum256's tree
// ((l0+l4)+(l2+l6))+((l1+l5)+(l3+l7)); then a partial last block (K % 32) as fma(isum, xscale, s); the
// row scale is applied by store_tile. A token's result depends only on its own row (decode == prefill).
constexpr int64_t QB = 32;

struct QAct {  // quantised activations: n rows of ldq int8 (whole blocks) and lds block scales
  std::vector<int8_t> q;
  std::vector<float> s;
  int64_t ldq = 0, lds = 0;
};

static inline float q8_inv(float amax) { return amax > 0.f ? 127.f / amax : 0.f; }

static void quant_row_scalar(const float* x, int64_t K, int8_t* q, float* s) {
  for (int64_t k0 = 0, b = 0; k0 < K; k0 += QB, ++b) {
    const int64_t m = std::min(QB, K - k0);
    float amax = 0.f;
    for (int64_t i = 0; i < m; ++i) amax = std::max(amax, std::fabs(x[k0 + i]));
    const float id = q8_inv(amax);
    for (int64_t i = 0; i < m; ++i) q[k0 + i] = int8_t(std::clamp(std::nearbyint(x[k0 + i] * id), -127.f, 127.f));
    for (int64_t i = m; i < QB; ++i) q[k0 + i] = 0;
    s[b] = amax / 127.f;
  }
}

// The same bits as quant_row_scalar (max is exact, one rounding per product, round to nearest even).
STRATA_AVX2 static void quant_row_avx2(const float* x, int64_t K, int8_t* q, float* s) {
  const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 lo = _mm256_set1_ps(-127.f), hi = _mm256_set1_ps(127.f);
  const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  int64_t k0 = 0, b = 0;
  for (; k0 + QB <= K; k0 += QB, ++b) {
    __m256 v[4];
    for (int j = 0; j < 4; ++j) v[j] = _mm256_loadu_ps(x + k0 + 8 * j);
    __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v[0], absm), _mm256_and_ps(v[1], absm)),
                             _mm256_max_ps(_mm256_and_ps(v[2], absm), _mm256_and_ps(v[3], absm)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    const __m256 id = _mm256_set1_ps(q8_inv(amax));
    __m256i iv[4];
    for (int j = 0; j < 4; ++j) {
      const __m256 r = _mm256_round_ps(_mm256_mul_ps(v[j], id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      iv[j] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo), hi));
    }
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(iv[0], iv[1]), _mm256_packs_epi32(iv[2], iv[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + k0), _mm256_permutevar8x32_epi32(p, perm));
    s[b] = amax / 127.f;
  }
  if (k0 < K) quant_row_scalar(x + k0, K - k0, q + k0, s + b);
}

static void quantize_act(bool vector, const float* x, int64_t n, int64_t K, QAct& a) {
  const int64_t nb = (K + QB - 1) / QB;
  a.ldq = nb * QB;
  a.lds = nb;
  if (int64_t(a.q.size()) < n * a.ldq) a.q.resize(size_t(n * a.ldq));
  if (int64_t(a.s.size()) < n * nb) a.s.resize(size_t(n * nb));
  int8_t* q = a.q.data();
  float* s = a.s.data();
#pragma omp parallel for schedule(static) if (n > 16)
  for (int64_t t = 0; t < n; ++t) {
    if (vector) quant_row_avx2(x + t * K, K, q + t * a.ldq, s + t * nb);
    else quant_row_scalar(x + t * K, K, q + t * a.ldq, s + t * nb);
  }
}

// Integer dot of the partial last block (m < 32 elements).
static inline int32_t idot_tail(const int8_t* w, const int8_t* x, int64_t m) {
  int32_t s = 0;
  for (int64_t i = 0; i < m; ++i) s += int32_t(w[i]) * int32_t(x[i]);
  return s;
}

// NT tokens x NR rows. w: int8 rows (ldw bytes apart), xq/xs: quantised rows (ldq, lds apart).
// PF: decode's linear prefetch of the next block (see kPrefetchAhead), the same sums.
// |w| <= 128 (sign_epi8 of -128 is 128 as u8), |x| <= 127: a maddubs pair sum is <= 32512, no saturation.
template <int NT, int NR, bool PF>
STRATA_AVX2 static void micro_q8(const int8_t* w, int64_t ldw, const int8_t* xq, int64_t ldq, const float* xs,
                                 int64_t lds, int64_t K, float* y, int64_t ldy) {
  __m256 acc[NT][NR];
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < NR; ++r) acc[t][r] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  const int64_t nbf = K / QB;
  const char* pf = reinterpret_cast<const char*>(w + NR * ldw) + kPrefetchAhead;
  for (int64_t b = 0; b < nbf; ++b) {
    if constexpr (PF) {
      for (int l = 0; l < NR * int(QB); l += 64) _mm_prefetch(pf + l, _MM_HINT_T1);
      pf += NR * QB;
    }
    __m256i xv[NT];
    __m256 sv[NT];
    for (int t = 0; t < NT; ++t) {
      xv[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + t * ldq + b * QB));
      sv[t] = _mm256_broadcast_ss(xs + t * lds + b);
    }
    for (int r = 0; r < NR; ++r) {
      const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + r * ldw + b * QB));
      const __m256i aw = _mm256_sign_epi8(wv, wv);
      for (int t = 0; t < NT; ++t) {
        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv[t], wv)), ones);
        acc[t][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), sv[t], acc[t][r]);
      }
    }
  }
  const int64_t k0 = nbf * QB;
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < NR; ++r) {
      float s = hsum256(acc[t][r]);
      if (k0 < K) s = std::fma(float(idot_tail(w + r * ldw + k0, xq + t * ldq + k0, K - k0)), xs[t * lds + nbf], s);
      y[t * ldy + r] = s;
    }
}

// The scalar reference: the same integer sums and the same float operations in the same order.
static void micro_q8_scalar(int nt, int nr, const int8_t* w, int64_t ldw, const int8_t* xq, int64_t ldq,
                            const float* xs, int64_t lds, int64_t K, float* y, int64_t ldy) {
  const int64_t nbf = K / QB, k0 = nbf * QB;
  for (int t = 0; t < nt; ++t)
    for (int r = 0; r < nr; ++r) {
      const int8_t* wr = w + r * ldw;
      const int8_t* xr = xq + t * ldq;
      float l[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      for (int64_t b = 0; b < nbf; ++b)
        for (int j = 0; j < 8; ++j) {
          const int64_t o = b * QB + 4 * j;
          l[j] = std::fma(float(idot_tail(wr + o, xr + o, 4)), xs[t * lds + b], l[j]);
        }
      float s = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
      if (k0 < K) s = std::fma(float(idot_tail(wr + k0, xr + k0, K - k0)), xs[t * lds + nbf], s);
      y[t * ldy + r] = s;
    }
}

using MicroQ8 = void (*)(const int8_t*, int64_t, const int8_t*, int64_t, const float*, int64_t, int64_t, float*,
                         int64_t);
#define STRATA_ROW4(T, P) micro_q8<T, 1, P>, micro_q8<T, 2, P>, micro_q8<T, 3, P>, micro_q8<T, 4, P>
template <bool PF>
static MicroQ8 micro_q8_fn(int nt, int nr) {
  static const MicroQ8 t[6][4] = {{STRATA_ROW4(1, PF)}, {STRATA_ROW4(2, PF)}, {STRATA_ROW4(3, PF)},
                                  {STRATA_ROW4(4, PF)}, {STRATA_ROW4(5, PF)}, {STRATA_ROW4(6, PF)}};
  return t[nt - 1][nr - 1];
}
#undef STRATA_ROW4

// nt x nr tile of int8 rows w (ldw = K) against quantised token rows t0.. of a; vector at any level above
// scalar (AVX2 instructions; the same bits as the scalar kernel).
static void run_q8(Level l, bool pf, int nt, int nr, const int8_t* w, const QAct& a, int64_t t0, int64_t K,
                   float* y, int64_t ldy) {
  const int8_t* xq = a.q.data() + t0 * a.ldq;
  const float* xs = a.s.data() + t0 * a.lds;
  if (l == Level::Scalar) micro_q8_scalar(nt, nr, w, K, xq, a.ldq, xs, a.lds, K, y, ldy);
  else (pf ? micro_q8_fn<true>(nt, nr) : micro_q8_fn<false>(nt, nr))(w, K, xq, a.ldq, xs, a.lds, K, y, ldy);
}

// ---------------------------------------------------------------- AVX-512

template <DType DT>
STRATA_AVX512 static inline __m512 ld16(const void* p, int64_t i) {
  if constexpr (DT == DType::F32) return _mm512_loadu_ps(static_cast<const float*>(p) + i);
  else if constexpr (DT == DType::I8)
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const int8_t*>(p) + i))));
  else if constexpr (DT == DType::BF16) {
    __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(p) + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else {
    __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(p) + i));
    return _mm512_cvtph_ps(h);
  }
}

template <DType DT>
STRATA_AVX512 static inline __m512 ld16m(const void* p, int64_t i, __mmask16 m) {
  if constexpr (DT == DType::F32) return _mm512_maskz_loadu_ps(m, static_cast<const float*>(p) + i);
  else if constexpr (DT == DType::I8)
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, static_cast<const int8_t*>(p) + i)));
  else if constexpr (DT == DType::BF16) {
    __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(p) + i);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else {
    __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(p) + i);
    return _mm512_cvtph_ps(h);
  }
}

template <DType DT>
STRATA_AVX512 static float dotw_avx512(const void* w, const float* x, int64_t n) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    a0 = _mm512_fmadd_ps(ld16<DT>(w, i), _mm512_loadu_ps(x + i), a0);
    a1 = _mm512_fmadd_ps(ld16<DT>(w, i + 16), _mm512_loadu_ps(x + i + 16), a1);
    a2 = _mm512_fmadd_ps(ld16<DT>(w, i + 32), _mm512_loadu_ps(x + i + 32), a2);
    a3 = _mm512_fmadd_ps(ld16<DT>(w, i + 48), _mm512_loadu_ps(x + i + 48), a3);
  }
  for (; i + 16 <= n; i += 16) a0 = _mm512_fmadd_ps(ld16<DT>(w, i), _mm512_loadu_ps(x + i), a0);
  if (i < n) {
    __mmask16 m = __mmask16((1u << (n - i)) - 1);
    a1 = _mm512_fmadd_ps(ld16m<DT>(w, i, m), _mm512_maskz_loadu_ps(m, x + i), a1);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

template <DType DT>
STRATA_AVX512 static void cvt_avx512(const void* src, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, ld16<DT>(src, i));
  if (i < n) {
    __mmask16 m = __mmask16((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(out + i, m, ld16m<DT>(src, i, m));
  }
}

STRATA_AVX512 static void axpy_avx512(float a, const float* x, float* y, int64_t n) {
  __m512 av = _mm512_set1_ps(a);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_fmadd_ps(av, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += a * x[i];
}

// PF: decode's linear prefetch of the next block, as micro_avx2 (same sums).
template <DType DT, int NT, int NR, bool PF = false>
STRATA_AVX512 static void micro_avx512(const void* w, int64_t ldw, const float* x, int64_t ldx, int64_t K, float* y,
                                       int64_t ldy) {
  const size_t es = esize<DT>();
  const uint8_t* wb = static_cast<const uint8_t*>(w);
  __m512 acc[NT][NR];
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < NR; ++r) acc[t][r] = _mm512_setzero_ps();
  constexpr int64_t step = int64_t(NR) * 16 * int64_t(esize<DT>());  // block bytes read per k step
  [[maybe_unused]] const char* pf = reinterpret_cast<const char*>(wb) + size_t(NR * ldw) * es + kPrefetchAhead;
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    if constexpr (PF) {
      for (int64_t l = 0; l < step; l += 64) _mm_prefetch(pf + l, _MM_HINT_T1);
      pf += step;
    }
    __m512 xv[NT];
    for (int t = 0; t < NT; ++t) xv[t] = _mm512_loadu_ps(x + t * ldx + k);
    for (int r = 0; r < NR; ++r) {
      __m512 wv = ld16<DT>(wb + size_t(r * ldw) * es, k);
      for (int t = 0; t < NT; ++t) acc[t][r] = _mm512_fmadd_ps(xv[t], wv, acc[t][r]);
    }
  }
  if (k < K) {
    __mmask16 m = __mmask16((1u << (K - k)) - 1);
    __m512 xv[NT];
    for (int t = 0; t < NT; ++t) xv[t] = _mm512_maskz_loadu_ps(m, x + t * ldx + k);
    for (int r = 0; r < NR; ++r) {
      __m512 wv = ld16m<DT>(wb + size_t(r * ldw) * es, k, m);
      for (int t = 0; t < NT; ++t) acc[t][r] = _mm512_fmadd_ps(xv[t], wv, acc[t][r]);
    }
  }
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < NR; ++r) y[t * ldy + r] = _mm512_reduce_add_ps(acc[t][r]);
}

// ---------------------------------------------------------------- AVX512-BF16 (vdpbf16ps)
// bf16 weights only: activations are rounded to bf16 (round to nearest even) once per matmul, and each
// instruction multiplies 32 bf16 pairs exactly and adds them into 16 f32 lanes, twice the MACs of an f32
// FMA. Decode and prefill share this kernel (one accumulator per token x row, the same k order), so a
// token's logits stay bit-identical however many tokens were computed with it.

template <int NT, int NR>
STRATA_AVX512BF16 static void micro_bf16dp(const uint16_t* w, int64_t ldw, const uint16_t* x, int64_t ldx,
                                           int64_t K, float* y, int64_t ldy) {
  __m512 acc[NT][NR];
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < NR; ++r) acc[t][r] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    __m512bh xv[NT];
    for (int t = 0; t < NT; ++t) xv[t] = (__m512bh)_mm512_loadu_si512(x + t * ldx + k);
    for (int r = 0; r < NR; ++r) {
      __m512bh wv = (__m512bh)_mm512_loadu_si512(w + r * ldw + k);
      for (int t = 0; t < NT; ++t) acc[t][r] = _mm512_dpbf16_ps(acc[t][r], xv[t], wv);
    }
  }
  if (k < K) {
    const __mmask32 m = __mmask32((1ull << (K - k)) - 1);
    __m512bh xv[NT];
    for (int t = 0; t < NT; ++t) xv[t] = (__m512bh)_mm512_maskz_loadu_epi16(m, x + t * ldx + k);
    for (int r = 0; r < NR; ++r) {
      __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(m, w + r * ldw + k);
      for (int t = 0; t < NT; ++t) acc[t][r] = _mm512_dpbf16_ps(acc[t][r], xv[t], wv);
    }
  }
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < NR; ++r) y[t * ldy + r] = _mm512_reduce_add_ps(acc[t][r]);
}

// out[0..K) = bf16(x[0..K)), round to nearest even (NaN kept quiet); the same bits as f32_to_bf16.
STRATA_AVX512BF16 static void to_bf16_avx512(const float* x, int64_t K, uint16_t* out) {
  const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
  int64_t k = 0;
  for (; k < K; k += 16) {
    const __mmask16 m = K - k >= 16 ? __mmask16(0xffff) : __mmask16((1u << (K - k)) - 1);
    __m512i u = _mm512_castps_si512(_mm512_maskz_loadu_ps(m, x + k));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(bias, _mm512_and_si512(_mm512_srli_epi32(u, 16), one)));
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(u, _mm512_set1_epi32(0x400000)));
    _mm256_mask_storeu_epi16(out + k, m, _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
  }
}

using MicroBh = void (*)(const uint16_t*, int64_t, const uint16_t*, int64_t, int64_t, float*, int64_t);
#define STRATA_ROW4(T) micro_bf16dp<T, 1>, micro_bf16dp<T, 2>, micro_bf16dp<T, 3>, micro_bf16dp<T, 4>
static MicroBh micro_bh(int nt, int nr) {
  static const MicroBh t[6][4] = {{STRATA_ROW4(1)}, {STRATA_ROW4(2)}, {STRATA_ROW4(3)},
                                  {STRATA_ROW4(4)}, {STRATA_ROW4(5)}, {STRATA_ROW4(6)}};
  return t[nt - 1][nr - 1];
}
#undef STRATA_ROW4

// The row blocks of several outputs numbered one after another, for one parallel loop over all of them (a
// matmul_multi's q/k/v or gate/up): block b is output out(b)'s block b - first[out(b)], of `per` rows each.
struct OutBlocks {
  int64_t first[9];
  int64_t total;
  OutBlocks(const MatOut* outs, int count, int64_t per) {
    first[0] = 0;
    for (int i = 0; i < count; ++i) first[i + 1] = first[i] + (outs[i].w->rows + per - 1) / per;
    total = first[count];
  }
  int out(int64_t b, int from = 0) const {  // from: an output at or before b's (blocks visited in order)
    while (b >= first[from + 1]) ++from;
    return from;
  }
};

constexpr int kBf16dpTile = 6;  // tokens per micro-kernel call (registers: NT * 4 accumulators)

// Decode rows in memory order: rows [0, R) of w (ldw == K) one after another, each row's
// NT sums exactly micro_bf16dp's (one accumulator per token x row, k in order, the masked tail last, the
// same reduction), so the bits are those of micro_bf16dp<NT, NR> for any NR. A thread's rows are then one
// linear stream that the hardware prefetchers follow with no software prefetch: on the 2-core Zen 4 VM one
// core streamed 27-28 GB/s this way against 21-24 for 8 interleaved rows with linear prefetch (a read loop
// 28-32; benchmarks/kernels/decode_stream.cpp), and the engine's bf16 decode went from 0.65-0.68 to 0.79-0.92
// of the read loop (benchmarks/results/history.md, "Kernel switches"). Software prefetches hold L1 miss
// buffers; the L2 stream prefetcher does not. The chains of consecutive rows overlap out of order.
template <int NT>
STRATA_AVX512BF16 static void seq_bf16dp(const uint16_t* w, int64_t K, const uint16_t* x, int64_t ldx, int64_t R,
                                         float* y, int64_t ldy) {
  const int64_t kfull = K / 32 * 32;
  const __mmask32 m = __mmask32((1ull << (K - kfull)) - 1);
  for (int64_t r = 0; r < R; ++r) {
    const uint16_t* wr = w + r * K;
    __m512 acc[NT];
    for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t k = 0; k < kfull; k += 32) {
      const __m512bh wv = (__m512bh)_mm512_loadu_si512(wr + k);
      for (int t = 0; t < NT; ++t)
        acc[t] = _mm512_dpbf16_ps(acc[t], (__m512bh)_mm512_loadu_si512(x + t * ldx + k), wv);
    }
    if (kfull < K) {
      const __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(m, wr + kfull);
      for (int t = 0; t < NT; ++t)
        acc[t] = _mm512_dpbf16_ps(acc[t], (__m512bh)_mm512_maskz_loadu_epi16(m, x + t * ldx + kfull), wv);
    }
    for (int t = 0; t < NT; ++t) y[t * ldy + r] = _mm512_reduce_add_ps(acc[t]);
  }
}
using SeqBh = void (*)(const uint16_t*, int64_t, const uint16_t*, int64_t, int64_t, float*, int64_t);
static SeqBh seq_bh(int nt) {
  static const SeqBh t[kBf16dpTile] = {seq_bf16dp<1>, seq_bf16dp<2>, seq_bf16dp<3>,
                                       seq_bf16dp<4>, seq_bf16dp<5>, seq_bf16dp<6>};
  return t[nt - 1];
}

// Decode (n <= kBf16dpTile tokens) of bf16 weights at AVX512BF16: x rounded to bf16 once for every output,
// then the rows of all `count` outputs stream from memory once in one decode_for (one parallel loop for
// q/k/v, one for gate/up), each chunk's rows of one output in one seq_bf16dp call, in memory order. A row's
// sums are micro_bf16dp's one accumulator per token x row in k order: the bits of prefill's, for any n.
static void decode_bf16dp(const MatOut* outs, int count, const float* x, int64_t n) {
  const int64_t K = outs[0].w->cols, ldx = (K + 31) / 32 * 32;
  thread_local std::vector<uint16_t> tl_xb;  // reused; the decode lambda reads it from other threads
  std::vector<uint16_t>& xb = tl_xb;
  if (xb.size() < size_t(n * ldx)) xb.resize(size_t(n * ldx));
  for (int64_t t = 0; t < n; ++t) {
    to_bf16_avx512(x + t * K, K, xb.data() + t * ldx);
    std::fill(xb.begin() + t * ldx + K, xb.begin() + (t + 1) * ldx, uint16_t(0));
  }
  const OutBlocks blk(outs, count, 4);
  const uint16_t* xbp = xb.data();
  const SeqBh f = seq_bh(int(n));
  decode_for(blk.total, 16, [&](int64_t q0, int64_t q1) {
    for (int m = 0; q0 < q1;) {
      m = blk.out(q0, m);
      const int64_t qe = std::min(q1, blk.first[m + 1]);
      const Mat& w = *outs[m].w;
      const int64_t r0 = (q0 - blk.first[m]) * 4, r1 = std::min(w.rows, (qe - blk.first[m]) * 4);
      f(static_cast<const uint16_t*>(w.data) + r0 * K, K, xbp, ldx, r1 - r0, outs[m].y + r0, w.rows);
      q0 = qe;
    }
  });
}

// Prefill of every bf16 output of a matmul_multi at once: x rounded to bf16 once (in parallel), then one
// loop over the row blocks of all outputs (no join between outputs, one tail instead of one per output).
// A block of RB rows (RB * K * 2 bytes, in L2) meets every 6-token tile through micro_bf16dp, the decode
// path's kernel: a token's values are the same bits whatever n. (The 24 sums of a tile reduced together with
// shuffles, the same tree as _mm512_reduce_add_ps, gave the same bits and no measurable gain, x0.96-1.12 on
// one thread: the reductions overlap the next tile's vdpbf16ps.)
static void prefill_bf16dp(const MatOut* outs, int count, const float* x, int64_t n) {
  const int64_t K = outs[0].w->cols, ldx = (K + 31) / 32 * 32;
  std::vector<uint16_t> xb(size_t(n * ldx), 0);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < n; ++t) to_bf16_avx512(x + t * K, K, xb.data() + t * ldx);
  constexpr int TN = 6;
  constexpr int64_t RB = 64;
  const OutBlocks blk(outs, count, RB);
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t b = 0; b < blk.total; ++b) {
    const int m = blk.out(b);
    const Mat& w = *outs[m].w;
    float* y = outs[m].y;
    const int64_t rows = w.rows, r0 = (b - blk.first[m]) * RB, nr_block = std::min(RB, rows - r0);
    const uint16_t* base = static_cast<const uint16_t*>(w.data);
    float tile[TN * 4];
    for (int64_t t0 = 0; t0 < n; t0 += TN) {
      const int nt = int(std::min<int64_t>(TN, n - t0));
      for (int64_t rr = 0; rr < nr_block; rr += 4) {
        const int nr = int(std::min<int64_t>(4, nr_block - rr));
        micro_bh(nt, nr)(base + (r0 + rr) * K, K, xb.data() + t0 * ldx, ldx, K, tile, 4);
        for (int t = 0; t < nt; ++t)
          for (int r = 0; r < nr; ++r) y[(t0 + t) * rows + r0 + rr + r] = tile[t * 4 + r];
      }
    }
  }
}

// ---------------------------------------------------------------- tables
using DotW = float (*)(const void*, const float*, int64_t);
using Cvt = void (*)(const void*, int64_t, float*);
using Micro = void (*)(const void*, int64_t, const float*, int64_t, int64_t, float*, int64_t);

static int dt_index(DType d) { return d == DType::F32 ? 0 : d == DType::BF16 ? 1 : d == DType::I8 ? 3 : 2; }

static float dotw_scalar_f32(const void* w, const float* x, int64_t n) { return dotw_scalar(DType::F32, w, x, n); }
static float dotw_scalar_bf16(const void* w, const float* x, int64_t n) { return dotw_scalar(DType::BF16, w, x, n); }
static float dotw_scalar_f16(const void* w, const float* x, int64_t n) { return dotw_scalar(DType::F16, w, x, n); }
static void cvt_scalar_f32(const void* s, int64_t n, float* o) { cvt_scalar(DType::F32, s, n, o); }
static void cvt_scalar_bf16(const void* s, int64_t n, float* o) { cvt_scalar(DType::BF16, s, n, o); }
static void cvt_scalar_f16(const void* s, int64_t n, float* o) { cvt_scalar(DType::F16, s, n, o); }
static float dotw_scalar_i8(const void* w, const float* x, int64_t n) { return dotw_scalar(DType::I8, w, x, n); }
static void cvt_scalar_i8(const void* s, int64_t n, float* o) { cvt_scalar(DType::I8, s, n, o); }

static DotW dotw_fn(Level l, DType d) {
  static const DotW t[3][4] = {
      {dotw_scalar_f32, dotw_scalar_bf16, dotw_scalar_f16, dotw_scalar_i8},
      {dotw_avx2<DType::F32>, dotw_avx2<DType::BF16>, dotw_avx2<DType::F16>, dotw_avx2<DType::I8>},
      {dotw_avx512<DType::F32>, dotw_avx512<DType::BF16>, dotw_avx512<DType::F16>, dotw_avx512<DType::I8>}};
  return t[int(vec(l))][dt_index(d)];
}

static Cvt cvt_fn(Level l, DType d) {
  static const Cvt t[3][4] = {
      {cvt_scalar_f32, cvt_scalar_bf16, cvt_scalar_f16, cvt_scalar_i8},
      {cvt_avx2<DType::F32>, cvt_avx2<DType::BF16>, cvt_avx2<DType::F16>, cvt_avx2<DType::I8>},
      {cvt_avx512<DType::F32>, cvt_avx512<DType::BF16>, cvt_avx512<DType::F16>, cvt_avx512<DType::I8>}};
  return t[int(vec(l))][dt_index(d)];
}

// Scalar: rows converted to f32 one at a time, then the same dot as everywhere else.
static void micro_scalar(DType dt, int nt, int nr, const void* w, int64_t ldw, const float* x, int64_t ldx,
                         int64_t K, float* y, int64_t ldy) {
  std::vector<float> row(static_cast<size_t>(K));
  const size_t es = dtype_size(dt);
  for (int r = 0; r < nr; ++r) {
    const void* wr = static_cast<const uint8_t*>(w) + size_t(r * ldw) * es;
    const float* wf = static_cast<const float*>(wr);
    if (dt != DType::F32) { cvt_scalar(dt, wr, K, row.data()); wf = row.data(); }
    for (int t = 0; t < nt; ++t) y[t * ldy + r] = dot_scalar(x + t * ldx, wf, K);
  }
}

#define STRATA_ROW4(F, D, T) F<D, T, 1>, F<D, T, 2>, F<D, T, 3>, F<D, T, 4>
template <DType DT>
static Micro micro512(int nt, int nr) {
  static const Micro t[6][4] = {{STRATA_ROW4(micro_avx512, DT, 1)}, {STRATA_ROW4(micro_avx512, DT, 2)},
                                {STRATA_ROW4(micro_avx512, DT, 3)}, {STRATA_ROW4(micro_avx512, DT, 4)},
                                {STRATA_ROW4(micro_avx512, DT, 5)}, {STRATA_ROW4(micro_avx512, DT, 6)}};
  return t[nt - 1][nr - 1];
}
#define STRATA_ROW4PF(D, T) micro_avx512<D, T, 1, true>, micro_avx512<D, T, 2, true>, micro_avx512<D, T, 3, true>, \
                            micro_avx512<D, T, 4, true>
template <DType DT>
static Micro micro512pf(int nt, int nr) {  // decode: the same sums as micro512, with linear prefetch
  static const Micro t[6][4] = {{STRATA_ROW4PF(DT, 1)}, {STRATA_ROW4PF(DT, 2)}, {STRATA_ROW4PF(DT, 3)},
                                {STRATA_ROW4PF(DT, 4)}, {STRATA_ROW4PF(DT, 5)}, {STRATA_ROW4PF(DT, 6)}};
  return t[nt - 1][nr - 1];
}
#undef STRATA_ROW4PF
template <DType DT>
static Micro micro256(int nt, int nr) {
  static const Micro t[3][4] = {{STRATA_ROW4(micro_avx2, DT, 1)}, {STRATA_ROW4(micro_avx2, DT, 2)},
                                {STRATA_ROW4(micro_avx2, DT, 3)}};
  return t[nt - 1][nr - 1];
}
#define STRATA_ROW4PF(D, T) micro_avx2<D, T, 1, true>, micro_avx2<D, T, 2, true>, micro_avx2<D, T, 3, true>, \
                            micro_avx2<D, T, 4, true>
template <DType DT>
static Micro micro256pf(int nt, int nr) {  // decode: the same sums as micro256, with linear prefetch
  static const Micro t[3][4] = {{STRATA_ROW4PF(DT, 1)}, {STRATA_ROW4PF(DT, 2)}, {STRATA_ROW4PF(DT, 3)}};
  return t[nt - 1][nr - 1];
}
#undef STRATA_ROW4PF
static Micro micro_eo(int nt, int nr) {
  static const Micro t[3][4] = {{micro_bf16eo<1, 1>, micro_bf16eo<1, 2>, micro_bf16eo<1, 3>, micro_bf16eo<1, 4>},
                                {micro_bf16eo<2, 1>, micro_bf16eo<2, 2>, micro_bf16eo<2, 3>, micro_bf16eo<2, 4>},
                                {micro_bf16eo<3, 1>, micro_bf16eo<3, 2>, micro_bf16eo<3, 3>, micro_bf16eo<3, 4>}};
  return t[nt - 1][nr - 1];
}
#undef STRATA_ROW4

static Micro micro_fn(Level l, DType dt, int nt, int nr) {
  if (vec(l) == Level::AVX512)
    return dt == DType::F32 ? micro512<DType::F32>(nt, nr) : dt == DType::BF16 ? micro512<DType::BF16>(nt, nr)
         : dt == DType::I8 ? micro512<DType::I8>(nt, nr) : micro512<DType::F16>(nt, nr);
  return dt == DType::F32 ? micro256<DType::F32>(nt, nr) : dt == DType::BF16 ? micro256<DType::BF16>(nt, nr)
       : dt == DType::I8 ? micro256<DType::I8>(nt, nr) : micro256<DType::F16>(nt, nr);
}

static void run_micro(Level l, DType dt, int nt, int nr, const void* w, int64_t ldw, const float* x, int64_t ldx,
                      int64_t K, float* y, int64_t ldy) {
  if (l == Level::Scalar) micro_scalar(dt, nt, nr, w, ldw, x, ldx, K, y, ldy);
  else micro_fn(l, dt, nt, nr)(w, ldw, x, ldx, K, y, ldy);
}

// Decode rows straight from memory (ldw == K): at AVX2 and AVX512 the prefetching variant of the same kernel.
static void run_micro_decode(Level l, DType dt, int nt, int nr, const void* w, int64_t ldw, const float* x,
                             int64_t ldx, int64_t K, float* y, int64_t ldy) {
  if (vec(l) == Level::AVX512) {
    const Micro f = dt == DType::F32 ? micro512pf<DType::F32>(nt, nr) : dt == DType::BF16 ? micro512pf<DType::BF16>(nt, nr)
                  : dt == DType::I8 ? micro512pf<DType::I8>(nt, nr) : micro512pf<DType::F16>(nt, nr);
    return f(w, ldw, x, ldx, K, y, ldy);
  }
  if (l != Level::AVX2) return run_micro(l, dt, nt, nr, w, ldw, x, ldx, K, y, ldy);
  const Micro f = dt == DType::F32 ? micro256pf<DType::F32>(nt, nr) : dt == DType::BF16 ? micro256pf<DType::BF16>(nt, nr)
                : dt == DType::I8 ? micro256pf<DType::I8>(nt, nr) : micro256pf<DType::F16>(nt, nr);
  f(w, ldw, x, ldx, K, y, ldy);
}

void row_f32(const Mat& w, int64_t r, float* out) {
  size_t es = dtype_size(w.dtype);
  cvt_fn(level(), w.dtype)(static_cast<const uint8_t*>(w.data) + size_t(r * w.cols) * es, w.cols, out);
  if (w.scale)
    for (int64_t i = 0; i < w.cols; ++i) out[i] *= w.scale[r];
}

float dot(const float* a, const float* b, int64_t n) { return dotw_fn(level(), DType::F32)(a, b, n); }

void axpy(float a, const float* x, float* y, int64_t n) {
  Level l = vec(level());
  if (l == Level::AVX512) axpy_avx512(a, x, y, n);
  else if (l == Level::AVX2) axpy_avx2(a, x, y, n);
  else {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
  }
}

// ---------------------------------------------------------------- matmul
static bool use_eo(Level lv, const Mat& w) { return lv == Level::AVX2 && w.dtype == DType::BF16 && w.cols % 16 == 0; }

// y[t, r] = tile[t, r] (times the row's scale for int8 weights), t < nt, r < nr.
static inline void store_tile(const float* tile, int nt, int nr, const float* scale, float* y, int64_t ldy) {
  for (int t = 0; t < nt; ++t)
    for (int r = 0; r < nr; ++r) y[t * ldy + r] = scale ? tile[t * 4 + r] * scale[r] : tile[t * 4 + r];
}

// AVX2, K above kPrefillKC: a token tile meets the block's rows KC columns at a time (8-lane partial sums
// carried between ranges, the same bits), so its x slice (3 x KC floats) stays in L1 over the block's row quads
// instead of the whole rows (36 KiB at K = 3072) missing it. Unpacked, one thread, CPU time, n = 256, 1024 rows
// (against whole rows, best of 4 each, 3 runs at load 5): K = 3072 x1.06-1.20, K = 2048 x0.95-1.06.
constexpr int64_t kPrefillKC = 1024;

// ---------------------------------------------------------------- AVX2 prefill on packed operands
// The AVX2 prefill tile (kPackTN tokens x 4 rows, 12 accumulators + 3 x + 1 w of the 16 ymm registers) reads
// its operands as two contiguous streams: x packed once per matmul as token tiles ([k step][token][8 floats]),
// each row block's quads converted to f32 as [k step][row][8 floats]. Unpacked, the same tile read 3 x rows
// and 4 w rows K floats apart, 7 streams restarted at every call, which the hardware prefetchers did not keep
// in L1 (one thread, K = 1024, 3072 rows x 256 tokens: 27-30 GMAC/s unpacked against 34-46 packed, peak 56).
// Each (token, row) keeps one 8-lane accumulator over the k steps in order and hsum256: the sums of
// micro_avx2 (decode), so a token's values are the same bits whatever n.
constexpr int kPackTN = 3;

// tile[t * 4 + r] (t < NT, r < NR) = the dot of packed token t and packed row r over k steps [s0, s1); the
// 8-lane partial sums carried in acc between ranges (first: start from zero; last: reduce).
template <int NT, int NR>
STRATA_AVX2 static void micro_packed(const float* wp, const float* xp, int64_t s0, int64_t s1, bool first,
                                     bool last, float* acc, float* tile) {
  __m256 a[NT][NR];
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < NR; ++r) a[t][r] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(acc + (t * NR + r) * 8);
  wp += s0 * NR * 8;
  xp += s0 * NT * 8;
  for (int64_t st = s0; st < s1; ++st, wp += NR * 8, xp += NT * 8) {
    __m256 xv[NT];
    for (int t = 0; t < NT; ++t) xv[t] = _mm256_loadu_ps(xp + t * 8);
    for (int r = 0; r < NR; ++r) {
      const __m256 wv = _mm256_loadu_ps(wp + r * 8);
      for (int t = 0; t < NT; ++t) a[t][r] = _mm256_fmadd_ps(xv[t], wv, a[t][r]);
    }
  }
  if (!last) {
    for (int t = 0; t < NT; ++t)
      for (int r = 0; r < NR; ++r) _mm256_storeu_ps(acc + (t * NR + r) * 8, a[t][r]);
    return;
  }
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < NR; ++r) tile[t * 4 + r] = hsum256(a[t][r]);
}
using MicroPacked = void (*)(const float*, const float*, int64_t, int64_t, bool, bool, float*, float*);
static MicroPacked micro_packed_fn(int nt, int nr) {
  static const MicroPacked t[3][4] = {
      {micro_packed<1, 1>, micro_packed<1, 2>, micro_packed<1, 3>, micro_packed<1, 4>},
      {micro_packed<2, 1>, micro_packed<2, 2>, micro_packed<2, 3>, micro_packed<2, 4>},
      {micro_packed<3, 1>, micro_packed<3, 2>, micro_packed<3, 3>, micro_packed<3, 4>}};
  return t[nt - 1][nr - 1];
}

// x [n, K] -> token tiles of kPackTN (the last may be shorter): tile t0 at out + t0 * K as [k step][token][8].
// eo: each k step in the order micro_bf16eo reads x (a block of 16 as its 8 even, then its 8 odd elements).
static void pack_x(const float* x, int64_t n, int64_t K, bool eo, float* out) {
  const int64_t S = K / 8;
#pragma omp parallel for schedule(static) if (n * K > (int64_t(1) << 16))
  for (int64_t t0 = 0; t0 < n; t0 += kPackTN) {
    const int nt = int(std::min<int64_t>(kPackTN, n - t0));
    float* o = out + t0 * K;
    for (int64_t st = 0; st < S; ++st)
      for (int t = 0; t < nt; ++t) {
        const float* xr = x + (t0 + t) * K;
        float* d = o + (st * nt + t) * 8;
        if (eo) {
          const float* b = xr + (st >> 1) * 16 + (st & 1);
          for (int l = 0; l < 8; ++l) d[l] = b[2 * l];
        } else {
          for (int l = 0; l < 8; ++l) d[l] = xr[st * 8 + l];
        }
      }
  }
}

// nr rows (K elements, dtype of w) starting at `rows` -> f32 [k step][row][8] at out; eo: bf16 rows in the
// even/odd order of micro_bf16eo (one 32-byte load: the even 8 as one step, the odd 8 as the next).
STRATA_AVX2 static void pack_rows(const Mat& w, const uint8_t* rows, int nr, bool eo, float* out, float* tmp) {
  const int64_t K = w.cols, S = K / 8;
  if (eo) {
    const __m256i hi = _mm256_set1_epi32(int(0xffff0000u));
    for (int r = 0; r < nr; ++r) {
      const uint16_t* p = reinterpret_cast<const uint16_t*>(rows) + r * K;
      for (int64_t j = 0; j < K / 16; ++j) {
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + j * 16));
        _mm256_storeu_ps(out + ((2 * j) * nr + r) * 8, _mm256_castsi256_ps(_mm256_slli_epi32(raw, 16)));
        _mm256_storeu_ps(out + ((2 * j + 1) * nr + r) * 8, _mm256_castsi256_ps(_mm256_and_si256(raw, hi)));
      }
    }
    return;
  }
  const size_t es = dtype_size(w.dtype);
  const Cvt cvt = cvt_fn(Level::AVX2, w.dtype);
  for (int r = 0; r < nr; ++r) {
    cvt(rows + size_t(r * K) * es, K, tmp);
    for (int64_t st = 0; st < S; ++st) _mm256_storeu_ps(out + (st * nr + r) * 8, _mm256_loadu_ps(tmp + st * 8));
  }
}

// AVX2 prefill (K % 8 == 0) of every output of a matmul_multi that is not int8_dot, in one pass over the row
// blocks of all of them (as prefill_multi): a block of RB rows is packed once (in L2) and meets every token
// tile of a chunk, its quads one after another; above kPrefillKC the tile walks K in ranges (x's slice stays in
// L1). Tokens go in chunks of at most kPackChunk (a multiple of the tile): each block reads its chunk's packed x
// once, from L3 (all of x at 4,096 tokens, 16-48 MiB, came from memory once per block: x0.79 at 4,096 tokens).
constexpr int64_t kPackChunk = 384;
static void prefill_packed_avx2(const MatOut* outs, int count, const float* x, int64_t n) {
  const int64_t K = outs[0].w->cols, S = K / 8;
  const int64_t RB = K <= 1024 ? 64 : 32;  // rows per packed block: RB * K * 4 bytes, at most 384 KiB (L2)
  bool need[2] = {false, false};           // packed x in plain / eo order
  for (int i = 0; i < count; ++i) need[use_eo(Level::AVX2, *outs[i].w)] = true;
  thread_local std::vector<float> tl_px[2];  // reused; read from the other threads by pointer
  for (int e = 0; e < 2; ++e)
    if (need[e]) {
      if (tl_px[e].size() < size_t(n * K)) tl_px[e].resize(size_t(n * K));
      pack_x(x, n, K, e == 1, tl_px[e].data());
    }
  const float* px[2] = {tl_px[0].data(), tl_px[1].data()};
  const int64_t SC = kPrefillKC / 8;  // k steps per range
  const int64_t nch = (n + kPackChunk - 1) / kPackChunk;
  const int64_t NC = ((n + nch - 1) / nch + kPackTN - 1) / kPackTN * kPackTN;  // tokens per chunk
  const OutBlocks blk(outs, count, RB);
#pragma omp parallel
  {
    std::vector<float> wpk(size_t(RB * K)), tmp(static_cast<size_t>(K)), acc(size_t(RB / 4 * kPackTN * 4 * 8));
    float tile[kPackTN * 4];
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < nch * blk.total; ++i) {  // chunk-major: the threads share a chunk's x
      const int64_t b = i % blk.total, c0 = i / blk.total * NC, c1 = std::min(n, c0 + NC);
      const int m = blk.out(b);
      const Mat& w = *outs[m].w;
      float* y = outs[m].y;
      const int64_t rows = w.rows, r0 = (b - blk.first[m]) * RB, nr_block = std::min(RB, rows - r0);
      const bool eo = use_eo(Level::AVX2, w);
      const uint8_t* base = static_cast<const uint8_t*>(w.data) + size_t(r0 * K) * dtype_size(w.dtype);
      for (int64_t rr = 0; rr < nr_block; rr += 4)
        pack_rows(w, base + size_t(rr * K) * dtype_size(w.dtype), int(std::min<int64_t>(4, nr_block - rr)), eo,
                  wpk.data() + rr * K, tmp.data());
      const float* xin = px[eo];
      for (int64_t t0 = c0; t0 < c1; t0 += kPackTN) {
        const int nt = int(std::min<int64_t>(kPackTN, c1 - t0));
        for (int64_t s0 = 0; s0 < S; s0 += SC) {
          const int64_t s1 = std::min(S, s0 + SC);
          for (int64_t rr = 0; rr < nr_block; rr += 4) {
            const int nr = int(std::min<int64_t>(4, nr_block - rr));
            micro_packed_fn(nt, nr)(wpk.data() + rr * K, xin + t0 * K, s0, s1, s0 == 0, s1 == S,
                                    acc.data() + rr / 4 * (kPackTN * 4 * 8), tile);
            if (s1 == S)
              store_tile(tile, nt, nr, w.scale ? w.scale + r0 + rr : nullptr, y + t0 * rows + r0 + rr, rows);
          }
        }
      }
    }
  }
}

// Prefill (compute-bound) of every output of a matmul_multi that is not int8_dot, in one pass: one loop over
// the row blocks of all of them (no join between outputs, one tail instead of one per output). A block of RB
// rows is converted once to f32 (kept in L2) and meets every tile of TN tokens, 4 rows at a time. AVX512 and
// scalar; AVX2 only where K % 8 != 0 (prefill_packed_avx2 otherwise).
static void prefill_multi(Level lv, const MatOut* outs, int count, const float* x, const float* xp, int64_t n) {
  const int64_t K = outs[0].w->cols;
  const int TN = lv == Level::AVX512 ? 6 : 3;  // token tile (register budget: NT*4 accumulators)
  constexpr int64_t RB = 64;
  const OutBlocks blk(outs, count, RB);
#pragma omp parallel
  {
    std::vector<float> scratch;
    float tile[6 * 4];
#pragma omp for schedule(dynamic, 1)
    for (int64_t b = 0; b < blk.total; ++b) {
      const int m = blk.out(b);
      const Mat& w = *outs[m].w;
      float* y = outs[m].y;
      const int64_t rows = w.rows, r0 = (b - blk.first[m]) * RB, nr_block = std::min(RB, rows - r0);
      const size_t es = dtype_size(w.dtype);
      const uint8_t* base = static_cast<const uint8_t*>(w.data);
      const bool eo = use_eo(lv, w);
      const float* xin = eo ? xp : x;
      const float* wf;
      if (w.dtype == DType::F32) {
        wf = reinterpret_cast<const float*>(base) + r0 * K;
      } else {
        if (scratch.size() < size_t(RB * K)) scratch.resize(size_t(RB * K));
        const Cvt cvt = eo ? cvt_bf16_eo : cvt_fn(lv, w.dtype);
        for (int64_t r = 0; r < nr_block; ++r) cvt(base + size_t((r0 + r) * K) * es, K, scratch.data() + r * K);
        wf = scratch.data();
      }
      for (int64_t t0 = 0; t0 < n; t0 += TN) {
        const int nt = int(std::min<int64_t>(TN, n - t0));
        for (int64_t rr = 0; rr < nr_block; rr += 4) {
          const int nr = int(std::min<int64_t>(4, nr_block - rr));
          run_micro(lv, DType::F32, nt, nr, wf + rr * K, K, xin + t0 * K, K, K, tile, 4);
          store_tile(tile, nt, nr, w.scale ? w.scale + r0 + rr : nullptr, y + t0 * rows + r0 + rr, rows);
        }
      }
    }
  }
}

// Prefill of int8 rows against quantised activations: blocks of RB rows (int8, in L2) x tiles of TQ tokens.
static void prefill_q8(Level lv, const Mat& w, const QAct& a, int64_t n, float* y) {
  const int64_t rows = w.rows, K = w.cols;
  const int8_t* base = static_cast<const int8_t*>(w.data);
  constexpr int TQ = 3;  // token tile; 2..4 measured alike (AVX2, 1 and 2 threads)
  const int64_t RB = 64;
  const int64_t nblocks = (rows + RB - 1) / RB;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t b = 0; b < nblocks; ++b) {
    const int64_t r0 = b * RB, nr_block = std::min(RB, rows - r0);
    float tile[6 * 4];
    for (int64_t t0 = 0; t0 < n; t0 += TQ) {
      const int nt = int(std::min<int64_t>(TQ, n - t0));
      for (int64_t rr = 0; rr < nr_block; rr += 4) {
        const int nr = int(std::min<int64_t>(4, nr_block - rr));
        run_q8(lv, false, nt, nr, base + (r0 + rr) * K, a, t0, K, tile, 4);
        store_tile(tile, nt, nr, w.scale + r0 + rr, y + t0 * rows + r0 + rr, rows);
      }
    }
  }
}

static bool use_q8(const Mat& w) { return g_int8_dot && w.dtype == DType::I8; }

void matmul_multi(const MatOut* outs, int count, const float* x, int64_t n) {
  if (count <= 0) return;
  if (count > 8) throw std::invalid_argument("matmul_multi: at most 8 outputs");
  const int64_t K = outs[0].w->cols;
  for (int i = 1; i < count; ++i)
    if (outs[i].w->cols != K) throw std::invalid_argument("matmul_multi: outputs must share the input width");
  const Level l = level();
  MatOut rest[8];
  if (l == Level::AVX512BF16) {  // bf16 weights with vdpbf16ps, the others as at AVX512
    int nrest = 0, nbf = 0, ndec = 0;
    MatOut bf[8], dec[8];
    for (int i = 0; i < count; ++i) {
      if (outs[i].w->dtype != DType::BF16) rest[nrest++] = outs[i];
      else if (n <= kBf16dpTile) dec[ndec++] = outs[i];  // decode: one parallel loop (decode_bf16dp)
      else bf[nbf++] = outs[i];                           // prefill: all bf16 outputs in one pass (prefill_bf16dp)
    }
    if (ndec > 0) decode_bf16dp(dec, ndec, x, n);
    if (nbf > 0) prefill_bf16dp(bf, nbf, x, n);
    if (nrest == 0) return;
    outs = rest;
    count = nrest;
  }
  const Level lv = vec(l);
  const int TN = lv == Level::AVX512 ? 6 : 3;
  bool any_eo = false, any_q8 = false;
  for (int i = 0; i < count; ++i) {
    any_eo = any_eo || use_eo(lv, *outs[i].w);
    any_q8 = any_q8 || use_q8(*outs[i].w);
  }
  const bool packed = lv == Level::AVX2 && K % 8 == 0 && n > std::max<int64_t>(TN, kDecodeBatch);
  std::vector<float> xp;
  if (any_eo && !packed) {
    xp.resize(size_t(n * K));
#pragma omp parallel for schedule(static) if (n > 16)
    for (int64_t t = 0; t < n; ++t) perm_eo(x + t * K, K, xp.data() + t * K);
  }
  thread_local QAct tl_qa;  // reused buffers; the decode lambda reads them from other threads by reference
  QAct& qa = tl_qa;
  if (any_q8) quantize_act(lv != Level::Scalar, x, n, K, qa);
  if (n > std::max<int64_t>(TN, kDecodeBatch)) {
    MatOut f[8];
    int nf = 0;
    for (int i = 0; i < count; ++i) {
      if (use_q8(*outs[i].w)) prefill_q8(lv, *outs[i].w, qa, n, outs[i].y);
      else f[nf++] = outs[i];
    }
    if (nf > 0 && packed) prefill_packed_avx2(f, nf, x, n);
    else if (nf > 0) prefill_multi(lv, f, nf, x, xp.data(), n);
    return;
  }
  // Decode (memory-bound; up to kDecodeBatch tokens: a batched decode step of several sessions): the rows
  // of every output stream from memory once, 4 at a time, converted in registers, each quad meeting the
  // tokens in tiles of TN while it is in L1 (a token's sums are its own: the same bits for any n); one loop for all outputs, chunks of 64 rows dealt out by decode_for.
  const OutBlocks blk(outs, count, 4);
  const float* xpp = xp.data();
  // token tiles as even as TN allows (n = 4 at AVX2: 2 + 2, not 3 + 1: a 1-token tile has too few FMA chains
  // to hide their latency); a token's sums do not depend on its tile
  const int64_t tiles = (n + TN - 1) / TN;
  auto tile_n = [&](int64_t i) { return n / tiles + (i < n % tiles ? 1 : 0); };
  decode_for(blk.total, 16, [&](int64_t q0, int64_t q1) {
    float tile[6 * 4];
    for (int64_t qd = q0; qd < q1; ++qd) {
      const int m = blk.out(qd);
      const Mat& w = *outs[m].w;
      const int64_t r0 = (qd - blk.first[m]) * 4;
      const int nr = int(std::min<int64_t>(4, w.rows - r0));
      const uint8_t* rowp = static_cast<const uint8_t*>(w.data) + size_t(r0 * K) * dtype_size(w.dtype);
      // (8 rows per one-token call, the deleted decode_rows8, measured x0.78-0.95 of 4: history.md)
      for (int64_t t0 = 0, i = 0; t0 < n; t0 += tile_n(i++)) {
        const int nt = int(tile_n(i));
        if (use_q8(w)) run_q8(lv, true, nt, nr, reinterpret_cast<const int8_t*>(rowp), qa, t0, K, tile, 4);
        else if (use_eo(lv, w)) micro_eo(nt, nr)(rowp, K, xpp + t0 * K, K, K, tile, 4);
        else run_micro_decode(lv, w.dtype, nt, nr, rowp, K, x + t0 * K, K, K, tile, 4);
        store_tile(tile, nt, nr, w.scale ? w.scale + r0 : nullptr, outs[m].y + t0 * w.rows + r0, w.rows);
      }
    }
  });
}

void matmul(const Mat& w, const float* x, int64_t n, float* y) {
  MatOut o{&w, y};
  matmul_multi(&o, 1, x, n);
}

STRATA_AVX2 static uint64_t read_avx2(const uint8_t* p, int64_t bytes) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i + 128 <= bytes; i += 128) {
    a0 = _mm256_add_epi64(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_add_epi64(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    a2 = _mm256_add_epi64(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    a3 = _mm256_add_epi64(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes),
                     _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3)));
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

static uint64_t read_scalar(const uint8_t* p, int64_t bytes) {
  uint64_t s = 0;
  for (int64_t i = 0; i + 8 <= bytes; i += 8) {
    uint64_t v;
    std::memcpy(&v, p + i, 8);
    s += v;
  }
  return s;
}

// Reads `bytes` of memory with the current OpenMP threads, each thread one contiguous slice (as a decode
// step streams its rows): the best GB/s over `reps` passes. A model's decode limit is this over the bytes
// it streams per token. A fair peer of the weights: the buffer is 2 MiB-aligned and advised as transparent
// huge pages as the weight arenas are (model.cpp alloc_arena; 4 KiB pages read ~20% slower on the 2-core
// VM), and one untimed pass runs first (the first pass after the first-touch memset read up to 30% slower:
// a single-pass measurement, as the interleaved benchmark takes, understated the limit).
double read_bandwidth(int64_t bytes, int reps) {
  constexpr int64_t kHuge = int64_t(2) << 20;
  bytes = std::max<int64_t>(bytes, int64_t(1) << 20) / 4096 * 4096;
  const int64_t cap = (bytes + kHuge - 1) / kHuge * kHuge;
  uint8_t* buf = static_cast<uint8_t*>(std::aligned_alloc(size_t(kHuge), size_t(cap)));
  if (!buf) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
  ::madvise(buf, size_t(cap), MADV_HUGEPAGE);  // advisory: ignored where THP is off
#endif
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < bytes; i += 4096) std::memset(buf + i, int(i >> 12), 4096);  // first touch
  const bool avx = vec(level()) != Level::Scalar;
  double best = 0.0;
  uint64_t sink = 0;
  for (int rep = -1; rep < std::max(reps, 1); ++rep) {  // rep -1: the untimed warm pass
    const auto t0 = std::chrono::steady_clock::now();
    uint64_t tot = 0;
#pragma omp parallel reduction(+ : tot)
    {
      int nt = 1, id = 0;
#ifdef STRATA_HAVE_OPENMP
      nt = omp_get_num_threads();
      id = omp_get_thread_num();
#endif
      const int64_t per = (bytes / nt) / 128 * 128, lo = per * id, hi = id == nt - 1 ? bytes : lo + per;
      tot += avx ? read_avx2(buf + lo, hi - lo) : read_scalar(buf + lo, hi - lo);
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    sink += tot;
    if (rep >= 0) best = std::max(best, double(bytes) / s / 1e9);
  }
  std::free(buf);
  return sink == 1 ? best + 1e-300 : best;  // keep the sums observable
}

void quantize_rows_int8(const Mat& w, int8_t* q, float* scale) {
  const int64_t K = w.cols;
#pragma omp parallel
  {
    std::vector<float> row(static_cast<size_t>(K));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < w.rows; ++r) {
      row_f32(w, r, row.data());
      float amax = 0.f;
      for (int64_t i = 0; i < K; ++i) amax = std::max(amax, std::fabs(row[i]));
      const float s = amax > 0.f && std::isfinite(amax) ? amax / 127.f : 1.f;
      int8_t* qr = q + r * K;
      for (int64_t i = 0; i < K; ++i) qr[i] = int8_t(std::clamp(std::nearbyint(row[i] / s), -127.f, 127.f));
      scale[r] = s;
    }
  }
}

}  // namespace kernels
}  // namespace strata
