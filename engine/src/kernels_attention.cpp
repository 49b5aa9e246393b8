// GCC 12 warns about its own AVX-512 intrinsic headers (false positives on the masked forms).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "kernels_internal.h"
#include "strata/state.h"  // kQ8Block

#include <type_traits>
#include <utility>

namespace strata {
namespace kernels {

// ---------------------------------------------------------------- attention (AVX-512)
// exp for x <= 0 (softmax): Cephes expf polynomial after n = round(x log2 e), scaled by 2^n (~1 ulp).
STRATA_AVX512 static inline __m512 exp_avx512(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  __m512 y = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(y, n);
}

// One query vector against keys 0..nk-1: scores, softmax, weighted sum of values, all in registers
// (NC = ceil(hd / 16) vectors per head). The work for a query does not depend on which other queries
// share the call, so prefill and decode give it the same bits.
template <int NC>
STRATA_AVX512 static void attend_avx512(const float* qv, const float* k, const float* v, int64_t stride, int64_t nk,
                                        int hd, float scale, float* sc, float* o) {
  const __mmask16 last = hd % 16 ? __mmask16((1u << (hd % 16)) - 1) : __mmask16(0xffff);
#define ld(p, c) ((c) == NC - 1 ? _mm512_maskz_loadu_ps(last, (p) + 16 * (c)) : _mm512_loadu_ps((p) + 16 * (c)))
  __m512 q[NC];
  for (int c = 0; c < NC; ++c) q[c] = ld(qv, c);
  int64_t j = 0;
  for (; j + 4 <= nk; j += 4) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int c = 0; c < NC; ++c) {
      a0 = _mm512_fmadd_ps(q[c], ld(k + (j + 0) * stride, c), a0);
      a1 = _mm512_fmadd_ps(q[c], ld(k + (j + 1) * stride, c), a1);
      a2 = _mm512_fmadd_ps(q[c], ld(k + (j + 2) * stride, c), a2);
      a3 = _mm512_fmadd_ps(q[c], ld(k + (j + 3) * stride, c), a3);
    }
    sc[j] = _mm512_reduce_add_ps(a0) * scale;
    sc[j + 1] = _mm512_reduce_add_ps(a1) * scale;
    sc[j + 2] = _mm512_reduce_add_ps(a2) * scale;
    sc[j + 3] = _mm512_reduce_add_ps(a3) * scale;
  }
  for (; j < nk; ++j) {
    __m512 a = _mm512_setzero_ps();
    for (int c = 0; c < NC; ++c) a = _mm512_fmadd_ps(q[c], ld(k + j * stride, c), a);
    sc[j] = _mm512_reduce_add_ps(a) * scale;
  }
  __m512 mxv = _mm512_set1_ps(-INFINITY);
  for (j = 0; j < nk; j += 16) {
    const __mmask16 m = nk - j >= 16 ? __mmask16(0xffff) : __mmask16((1u << (nk - j)) - 1);
    mxv = _mm512_mask_max_ps(mxv, m, mxv, _mm512_maskz_loadu_ps(m, sc + j));
  }
  const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(mxv));
  __m512 sum = _mm512_setzero_ps();
  for (j = 0; j < nk; j += 16) {
    const __mmask16 m = nk - j >= 16 ? __mmask16(0xffff) : __mmask16((1u << (nk - j)) - 1);
    __m512 e = _mm512_maskz_mov_ps(m, exp_avx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, sc + j), mx)));
    _mm512_mask_storeu_ps(sc + j, m, e);
    sum = _mm512_add_ps(sum, e);
  }
  const float inv = 1.0f / _mm512_reduce_add_ps(sum);
  __m512 acc[NC];
  for (int c = 0; c < NC; ++c) acc[c] = _mm512_setzero_ps();
  for (j = 0; j < nk; ++j) {
    const __m512 w = _mm512_set1_ps(sc[j] * inv);
    for (int c = 0; c < NC; ++c) acc[c] = _mm512_fmadd_ps(w, ld(v + j * stride, c), acc[c]);
  }
  for (int c = 0; c < NC; ++c) {
    if (c == NC - 1) _mm512_mask_storeu_ps(o + 16 * c, last, acc[c]);
    else _mm512_storeu_ps(o + 16 * c, acc[c]);
  }
#undef ld
}

using Attend = void (*)(const float*, const float*, const float*, int64_t, int64_t, int, float, float*, float*);
static Attend attend_fn(int hd) {
  static const Attend t[8] = {attend_avx512<1>, attend_avx512<2>, attend_avx512<3>, attend_avx512<4>,
                              attend_avx512<5>, attend_avx512<6>, attend_avx512<7>, attend_avx512<8>};
  return hd <= 128 ? t[(hd + 15) / 16 - 1] : nullptr;
}

// ---------------------------------------------------------------- attention (AVX2 + FMA): tiled
// Flash-style: a block of query rows (QB positions x the G query heads of one kv head, so GQA heads share
// every K/V load) walks key tiles of KT keys with an online softmax (running max m, sum l, output O
// rescaled by exp(m_old - m_new) per tile). K/V tiles are read once per block (packed contiguous when the
// block has enough rows to pay for the copy) instead of once per query head, and no [n, n] or per-query
// score row is materialised. Numerics: a query row's result depends only on its own position, not on the
// other rows of its block: key tiles start at 0 and are KT long whatever the block, each score is one FMA
// chain over hd then the same 8-lane reduction, and each row's sums run over its own keys in key order --
// so decode gives a position exactly the bits the full forward gives it.
constexpr int ATT_KT = 64;  // keys per tile (packed K and V tiles: 2 x 32 KiB at hd 128)
constexpr int ATT_QB = 128;  // query positions per prefill block (each block copies its K/V tiles again: 16 -> 64
                             // 4K x1.17; 64 -> 128 with the f16 tiles read in place, ~x1.1, one thread)
constexpr int ATT_QK_KC = 16;  // scores: keys per chunk (4 KiB of f16 K rows at hd 128, 8 KiB f32: kept in L1)
constexpr int ATT_QK_RC = 24;  // scores: query rows per chunk (a multiple of the 3-row micro-tile; 12 KiB)

// exp for x <= 0 (softmax): Cephes expf polynomial after n = round(x log2 e), scaled by 2^n.
STRATA_AVX2 static inline __m256 exp_avx2(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));  // 2^n stays a normal float
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 y = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

// The four horizontal sums of a0..a3 as one __m128; each lane sums its own vector in the same order.
STRATA_AVX2 static inline __m128 hsum4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
  const __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

// 8 cache values as f32: f32 rows, or f16 rows (the kv_f16 cache) widened exactly.
STRATA_AVX2 static inline __m256 att_ld8(const float* p) { return _mm256_loadu_ps(p); }
STRATA_AVX2 static inline __m256 att_ld8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
// A key tile of a q8 cache, read in place: q at the tile's first value (key t0, the block's kv head), s at
// that value's scale; rows ld values apart (their scales ld / 32 apart).
struct Q8Ptr {
  const int8_t* q;
  const uint16_t* s;  // f16 scales
};
// The q8 cache's pages (state.h; null: not a q8 cache).
struct Q8Cache {
  const int8_t* c = nullptr;
  int64_t cap = 0;  // pages per kv head
  bool vnni = false;  // scores and P V with AVX-512 VNNI (att_qk_q8_vnni, att_pv_q8i_zmm): the same bits as without
};

// Decode streams the cache in place. A thread owns a contiguous run of kv heads, i.e. one contiguous span of
// every cache row (span floats from column c0 of each K and V row); while it works on key tile t it asks
// for the rows of tile t + 1 in address order, a few rows per step of the score loop, so the lines come in
// as one steady sequential stream (into L2) behind the arithmetic rather than in the tile's strided order.
struct AttPrefetch {
  const char *k = nullptr, *v = nullptr;  // row 0, column c0 of the span
  int64_t kvs = 0, span = 0;              // row stride, span length (bytes)
  int64_t row = 0, end = 0;                // next row to ask for, rows this tile-head asks for stop at end
  int64_t col = 0;                         // next byte of row `row` to ask for
  int lines_step = 0;                      // K and V lines per step (score and P V loops)
  // q8 (pages, state.h): the thread's piece of the next page is one run of bytes [0, pend) from pk (its kv
  // heads' K, V and scales); pcur: the next byte to ask for. pk null: rows.
  const char* pk = nullptr;
  int64_t pcur = 0, pend = 0;
  // decode: steps in the softmax too (ATT_PF_SM) and, for the f32 / f16 rows, inside P V's key loop (ATT_PF_PV)
  // instead of one per P V column block (prefill: false)
  bool spread = false;
};
constexpr int ATT_DEC_DIST = 1;  // tiles ahead (1, 2, 3: within noise at 16K)
// Decode: a tile's prefetch steps, spread over its phases in proportion to their time (scores, softmax,
// P V: about 2 : 1 : 2). A software prefetch waits for a free miss buffer, so a burst of them stalls the core,
// and a phase without them (the softmax, q8's P weights) lets the memory pipe run dry. With the steps in the
// scores and one per P V column block (16 : 0 : 4) the q8 kernel read 28 layers of a 16K cache x1.2-1.4 slower
// (benchmarks/results/history.md, "The q8 KV cache"). The f32 / f16 rows take ATT_KT / 4 score steps (one per micro-tile).
constexpr int ATT_PF_QK = 16, ATT_PF_SM = 8, ATT_PF_PV = 16;
static inline int att_share(int total, int64_t k, int64_t parts) {  // part k's steps of total over parts
  return int(total * (k + 1) / parts - total * k / parts);
}
STRATA_AVX2 static inline void att_decode_prefetch(AttPrefetch& p) {
  if (p.pk) {  // q8 pages: lines_step lines in address order
    int64_t c = p.pcur;
    const int64_t e = std::min(p.pend, c + 64 * int64_t(p.lines_step));
    for (; c < e; c += 64) _mm_prefetch(p.pk + c, _MM_HINT_T1);
    p.pcur = c;
    return;
  }
  {  // the span's lines, the last one too when the span does not start on a line
    // (in locals: through p, GCC reloaded and stored the cursor on every line, 17% of a 1-thread decode)
    int64_t row = p.row, col = p.col;
    const int64_t end = p.end, span = p.span, kvs = p.kvs;
    if (row >= end) return;
    const char *kr = p.k + row * kvs, *vr = p.v + row * kvs;
    for (int i = p.lines_step; i > 0; --i) {
      const int64_t c = col < span ? col : span - 1;
      _mm_prefetch(kr + c, _MM_HINT_T1);
      _mm_prefetch(vr + c, _MM_HINT_T1);
      col += 64;
      if (col >= span + 63) {
        col = 0;
        if (++row >= end) break;
        kr += kvs;
        vr += kvs;
      }
    }
    p.row = row;
    p.col = col;
  }
}
STRATA_AVX2 static inline void att_decode_prefetch(AttPrefetch* p, int steps) {
  if (p)
    for (int i = 0; i < steps; ++i) att_decode_prefetch(*p);
}
// body(i) for i < n in order; with pf and pfn > 0 steps, in pfn segments with a prefetch step before each. (The
// P V loops: a step inside the loop made GCC copy all the accumulators to other registers and back on every
// iteration.) Inlined into its caller, so body takes the caller's vector level.
template <typename F>
__attribute__((always_inline)) static inline void att_segments(AttPrefetch* pf, int pfn, int n, F&& body) {
  const bool steps = pf && pfn > 0;
  const int segs = steps ? pfn : 1;
  for (int sg = 0, i0 = 0; sg < segs; ++sg) {
    if (steps) att_decode_prefetch(*pf);
    const int i1 = n * (sg + 1) / segs;
    for (int i = std::exchange(i0, i1); i < i1; ++i) body(i);
  }
}

// q8 scores: the query rows are quantised like the cache (blocks of 32, att_begin), each block's dot q_b . k_b is
// exact in int32, and s[r, j] = (sum over blocks b, in order, of float(dot_b) * (dq_b * dk_b) by FMA from 0) *
// scale. K is held with the keys in the lanes (state.h: [hd / 4][kQ8Page][4] bytes a page and kv head), so a
// block's dots of 16 keys come out of its 8 groups of 4 values one key per lane, with no reduction across lanes:
// - AVX-512 VNNI: vpdpbusd on k + 128 (one 64-byte line: 16 keys x 4 values) against the row's 4 query bytes of
//   the group broadcast, each block's accumulator starting at the row's correction -128 * (sum of the block's 32
//   query bytes, qc: att_begin); R <= 2 rows x the whole tile, K read in address order;
// - AVX2: maddubs on |k| and sign(q, k), then madd (|products| <= 127^2, pairs < 2^15), R <= 2 rows x 16 keys
//   (two 8-key halves: AVX2's 16 registers).
// The same integers either way, then the same float steps per key and block -- so the same bits at every level,
// and each (row, key) is the same sequence whichever rows and keys share the call (lanes past C: whatever the
// page holds there, their scores not stored).
// The key scales: dk[b * kQ8Page + j] (the page's K scales, block-major: state.h), 16 keys' scales of a block one
// 512-bit load.
//
// AVX2 kernel: kp the page's K at key j0 (kt.q + 4 j0), dk its K scales at key j0; C <= 16 keys stored.
template <int R>
STRATA_AVX2 static inline void att_qk_q8_store8(const __m256* acc, float scale, float* s, int64_t lds, int C) {
  if (C <= 0) return;
  for (int r = 0; r < R; ++r) {
    const __m256 v = _mm256_mul_ps(acc[r], _mm256_set1_ps(scale));
    if (C >= 8) {
      _mm256_storeu_ps(s + r * lds, v);
    } else {
      alignas(32) float t[8];
      _mm256_store_ps(t, v);
      for (int j = 0; j < C; ++j) s[r * lds + j] = t[j];
    }
  }
}

STRATA_AVX2 static inline __m256i att_q4(const int8_t* q) {  // 4 query bytes broadcast
  int32_t x;
  std::memcpy(&x, q, 4);
  return _mm256_set1_epi32(x);
}

template <int R, int NB>
STRATA_AVX2 static void att_qk_q8(const int8_t* q, const float* qs, int nb_, const int8_t* kp, const uint16_t* dk,
                                  float scale, float* s, int64_t lds, int C) {
  const int nb = NB ? NB : nb_, hd = 32 * nb;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int b = 0; b < nb; ++b) {
    __m256i d[R][2];
    for (int r = 0; r < R; ++r) d[r][0] = d[r][1] = _mm256_setzero_si256();
    for (int g = 0; g < 8; ++g) {
      const int8_t* kg = kp + (8 * b + g) * (4 * kQ8Page);
      const __m256i k0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kg));
      const __m256i k1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kg + 32));
      const __m256i a0 = _mm256_abs_epi8(k0), a1 = _mm256_abs_epi8(k1);
      for (int r = 0; r < R; ++r) {
        const __m256i qb = att_q4(q + r * hd + 32 * b + 4 * g);
        d[r][0] = _mm256_add_epi32(d[r][0], _mm256_madd_epi16(_mm256_maddubs_epi16(a0, _mm256_sign_epi8(qb, k0)), ones));
        d[r][1] = _mm256_add_epi32(d[r][1], _mm256_madd_epi16(_mm256_maddubs_epi16(a1, _mm256_sign_epi8(qb, k1)), ones));
      }
    }
    const __m256 dk0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(dk + kQ8Page * b)));
    const __m256 dk1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(dk + kQ8Page * b + 8)));
    for (int r = 0; r < R; ++r) {
      const __m256 dq = _mm256_set1_ps(qs[r * nb + b]);
      acc[r][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d[r][0]), _mm256_mul_ps(dq, dk0), acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d[r][1]), _mm256_mul_ps(dq, dk1), acc[r][1]);
    }
  }
  __m256 lo[R], hi[R];
  for (int r = 0; r < R; ++r) { lo[r] = acc[r][0]; hi[r] = acc[r][1]; }
  att_qk_q8_store8<R>(lo, scale, s, lds, std::min(C, 8));
  att_qk_q8_store8<R>(hi, scale, s + 8, lds, C - 8);
}

#define STRATA_VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
// R rows x the tile's first 16 NK keys (kp: the page's K; dk: its K scales), blocks in order, and within a
// block its 8 groups of 4 values in address order (16 NK keys' 64-byte lines one after the other): the block's
// 2 x NK accumulators are independent vpdpbusd chains. pf (decode): pfn prefetch steps spread over the blocks.
// C <= 16 NK keys stored.
template <int R, int NK>
STRATA_VNNI static void att_qk_q8_vnni(const int8_t* q, const int32_t* qc, const float* qs, int nb,
                                       const int8_t* kp, const uint16_t* dk, float scale, float* s, int64_t lds, int C,
                                       AttPrefetch* pf, int pfn) {
  const int hd = 32 * nb;
  const __m512i x80 = _mm512_set1_epi8(char(0x80));
  __m512 acc[R][NK];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NK; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int b = 0; b < nb; ++b) {
    __m512i d[R][NK];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < NK; ++c) d[r][c] = _mm512_set1_epi32(qc[r * nb + b]);
    const int8_t* kb = kp + 8 * b * (4 * kQ8Page);
    for (int g = 0; g < 8; ++g) {
      __m512i qb[R];
      for (int r = 0; r < R; ++r) {
        int32_t x;
        std::memcpy(&x, q + r * hd + 32 * b + 4 * g, 4);
        qb[r] = _mm512_set1_epi32(x);
      }
      for (int c = 0; c < NK; ++c) {
        const __m512i kv =
            _mm512_xor_si512(_mm512_loadu_si512(reinterpret_cast<const void*>(kb + g * (4 * kQ8Page) + 64 * c)), x80);
        for (int r = 0; r < R; ++r) d[r][c] = _mm512_dpbusd_epi32(d[r][c], kv, qb[r]);
      }
    }
    for (int r = 0; r < R; ++r) {
      const __m512 dq = _mm512_set1_ps(qs[r * nb + b]);
      for (int c = 0; c < NK; ++c)
        acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d[r][c]),
                                    _mm512_mul_ps(dq, _mm512_cvtph_ps(_mm256_loadu_si256(
                                                          reinterpret_cast<const __m256i*>(dk + kQ8Page * b + 16 * c)))),
                                    acc[r][c]);
    }
    att_decode_prefetch(pf, att_share(pfn, b, nb));
  }
  const __m512 sc = _mm512_set1_ps(scale);
  for (int c = 0; c < NK; ++c) {
    const int n = std::min(16, C - 16 * c);
    const __mmask16 m = n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1);
    for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(s + r * lds + 16 * c, m, _mm512_mul_ps(acc[r][c], sc));
  }
}

template <int R>
STRATA_VNNI static void att_qk_q8_vnni_r(const int8_t* q, const int32_t* qc, const float* qs, int nb,
                                         const int8_t* kp, const uint16_t* dk, float scale, float* s, int64_t lds, int C,
                                         AttPrefetch* pf, int pfn) {
  switch ((C + 15) / 16) {
    case 1: att_qk_q8_vnni<R, 1>(q, qc, qs, nb, kp, dk, scale, s, lds, C, pf, pfn); break;
    case 2: att_qk_q8_vnni<R, 2>(q, qc, qs, nb, kp, dk, scale, s, lds, C, pf, pfn); break;
    case 3: att_qk_q8_vnni<R, 3>(q, qc, qs, nb, kp, dk, scale, s, lds, C, pf, pfn); break;
    default: att_qk_q8_vnni<R, 4>(q, qc, qs, nb, kp, dk, scale, s, lds, C, pf, pfn); break;
  }
}

// head_dim 128 and 256 (nb 4 and 8 blocks) compiled for their block count, any other multiple of 32 at run time
template <int R>
STRATA_AVX2 static void att_qk_q8_r(const int8_t* q, const float* qs, int nb, const int8_t* kp,
                                    const uint16_t* dk, float scale, float* s, int64_t lds, int C) {
  switch (nb) {
    case 4: att_qk_q8<R, 4>(q, qs, nb, kp, dk, scale, s, lds, C); break;
    case 8: att_qk_q8<R, 8>(q, qs, nb, kp, dk, scale, s, lds, C); break;
    default: att_qk_q8<R, 0>(q, qs, nb, kp, dk, scale, s, lds, C); break;
  }
}

// q8 P V in integers. Per row pair and key tile, the weights w[r, j, b] = p[r, j] * dv[j, b] (the f32 products)
// are quantised per (row, block) over the tile's keys to int16, W[r, b] = max_j w / 32767, wq = round(w / W)
// (nearest even; 0 for keys j >= cnt_r), and the block's sums over the tile's keys are exact int32 sums of
// wq * v (int16 x int8 products, taken two keys at a time: pmaddwd on (v_j, v_j+1) against (wq_j, wq_j+1);
// |sum| <= 64 * 32767 * 127 < 2^31), then O = O * alpha + float(sum) * W. The int32 sums are exact, so their
// order (AVX2 pmaddwd + add, AVX-512 VNNI vpdpwssd) does not change them: every level gives the same bits, and
// a row's result depends only on its own keys (prefill and decode alike). The P quantisation adds at most
// W / 65534 per weight (2^-16 of the tile's largest weight), far below the cache's own int8 step of V.
// The widening to float and the f32 FMA per value and key (the old P V: 16 512-bit FMAs and 8 widenings per
// key and row pair) become 8 pmovsx + 16 vpdpwssd per two keys (V held in pairs of keys: no unpacks).
//
// Weights of R <= 2 rows: wq[(r * ldq + i) * nb + b] = int16 pair (key 2 i low, key 2 i + 1 high) of block b,
// for pairs i < np (np: the pairs the row pair takes, keys past cnt_r zero); ws[r * nb + b] = W. tmp: 8 * ATT_KT + 8
// floats.
STRATA_AVX2 static inline __m128 att_vs4(const uint16_t* p) {  // 4 f16 scales widened
  return _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
STRATA_AVX2 static inline __m256 att_vs4x2(const uint16_t* p) {  // the same in both halves
  const __m128 x = att_vs4(p);
  return _mm256_set_m128(x, x);
}
template <int NB>
STRATA_AVX2 static void att_pv_q8_wq(const float* p, int64_t ldp, const int* cnt, int R, int np, const uint16_t* vs,
                                     int64_t lds8, int nb_, float* tmp, int32_t* wq, int64_t ldq, float* ws) {
  const int nb = NB ? NB : nb_;
  if (R == 2 && nb % 4 == 0) {  // the two rows side by side (row 0 in the low lanes): the same products, maxima
                                // and roundings, on 8 lanes (tmp: 8 floats a key)
    const int c0 = cnt[0], c1 = cnt[1], cmin = std::min(c0, c1), cmax = std::max(c0, c1);
    const float *p0 = p, *p1 = p + ldp;
    int32_t *q0 = wq, *q1 = wq + ldq * nb;
    const __m256i pairs = _mm256_setr_epi8(0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15,
                                           0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15);
    for (int b0 = 0; b0 < nb; b0 += 4) {
      __m256 mxa = _mm256_setzero_ps(), mxb = _mm256_setzero_ps();  // (two chains: even and odd keys)
      int j = 0;
      for (; j + 2 <= cmin; j += 2) {
        const __m256 wa = _mm256_mul_ps(_mm256_set_m128(_mm_set1_ps(p1[j]), _mm_set1_ps(p0[j])),
                                        att_vs4x2(vs + j * lds8 + b0));
        const __m256 wb = _mm256_mul_ps(_mm256_set_m128(_mm_set1_ps(p1[j + 1]), _mm_set1_ps(p0[j + 1])),
                                        att_vs4x2(vs + (j + 1) * lds8 + b0));
        _mm256_storeu_ps(tmp + 8 * j, wa);
        _mm256_storeu_ps(tmp + 8 * j + 8, wb);
        mxa = _mm256_max_ps(mxa, wa);
        mxb = _mm256_max_ps(mxb, wb);
      }
      for (; j < cmax; ++j) {  // keys only one row sees: 0 for the other (a product of 0, as its own rows' zeros)
        const __m256 w = _mm256_mul_ps(_mm256_set_m128(_mm_set1_ps(j < c1 ? p1[j] : 0.f), _mm_set1_ps(j < c0 ? p0[j] : 0.f)),
                                       att_vs4x2(vs + j * lds8 + b0));
        _mm256_storeu_ps(tmp + 8 * j, w);
        mxa = _mm256_max_ps(mxa, w);
      }
      _mm256_storeu_ps(tmp + 8 * cmax, _mm256_setzero_ps());  // the odd key's partner
      const __m256 mx = _mm256_max_ps(mxa, mxb);  // (weights >= 0: the same maximum in any order)
      const __m256 W = _mm256_div_ps(mx, _mm256_set1_ps(32767.0f));
      _mm_storeu_ps(ws + b0, _mm256_castps256_ps128(W));
      _mm_storeu_ps(ws + nb + b0, _mm256_extractf128_ps(W, 1));
      const __m256 iw = _mm256_and_ps(_mm256_div_ps(_mm256_set1_ps(32767.0f), mx), _mm256_cmp_ps(mx, _mm256_setzero_ps(), _CMP_GT_OQ));
      for (int i = 0; i < np; ++i) {  // (pairs past a row's keys: its zeros, rounded to 0)
        const __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(tmp + 16 * i), iw));
        const __m256i e = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(tmp + 16 * i + 8), iw));
        const __m256i x = _mm256_shuffle_epi8(_mm256_packs_epi32(a, e), pairs);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q0 + i * nb + b0), _mm256_castsi256_si128(x));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q1 + i * nb + b0), _mm256_extracti128_si256(x, 1));
      }
    }
    return;
  }
  for (int r = 0; r < R; ++r) {
    const int c = cnt[r];
    const float* pr = p + r * ldp;
    int32_t* q = wq + r * ldq * nb;
    if (nb % 4 == 0) {
      const __m128i pairs = _mm_setr_epi8(0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15);
      for (int b0 = 0; b0 < nb; b0 += 4) {
        __m128 mx = _mm_setzero_ps();
        for (int j = 0; j < c; ++j) {
          const __m128 w = _mm_mul_ps(_mm_set1_ps(pr[j]), att_vs4(vs + j * lds8 + b0));
          _mm_storeu_ps(tmp + 4 * j, w);
          mx = _mm_max_ps(mx, w);
        }
        _mm_storeu_ps(tmp + 4 * c, _mm_setzero_ps());  // the odd key's partner
        _mm_storeu_ps(ws + r * nb + b0, _mm_div_ps(mx, _mm_set1_ps(32767.0f)));
        const __m128 iw = _mm_and_ps(_mm_div_ps(_mm_set1_ps(32767.0f), mx), _mm_cmpgt_ps(mx, _mm_setzero_ps()));
        const int ip = (c + 1) / 2;
        for (int i = 0; i < ip; ++i) {
          const __m128i a = _mm_cvtps_epi32(_mm_mul_ps(_mm_loadu_ps(tmp + 8 * i), iw));
          const __m128i e = _mm_cvtps_epi32(_mm_mul_ps(_mm_loadu_ps(tmp + 8 * i + 4), iw));
          _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i * nb + b0), _mm_shuffle_epi8(_mm_packs_epi32(a, e), pairs));
        }
        for (int i = ip; i < np; ++i) _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i * nb + b0), _mm_setzero_si128());
      }
      continue;
    }
    for (int b = 0; b < nb; ++b) {  // any other block count (head_dim 32, 64, 96, ...): the same steps in scalars
      float mx = 0.f;
      for (int j = 0; j < c; ++j) {
        tmp[j] = pr[j] * f16_to_f32(vs[j * lds8 + b]);
        mx = std::max(mx, tmp[j]);
      }
      tmp[c] = 0.f;
      ws[r * nb + b] = mx / 32767.0f;
      const float iw = mx > 0.f ? 32767.0f / mx : 0.f;
      const int ip = (c + 1) / 2;
      for (int i = 0; i < np; ++i) {
        int32_t lo = 0, hi = 0;
        if (i < ip) {
          lo = int32_t(std::nearbyint(tmp[2 * i] * iw));
          hi = int32_t(std::nearbyint(tmp[2 * i + 1] * iw));
        }
        q[i * nb + b] = int32_t(uint32_t(uint16_t(int16_t(lo))) | (uint32_t(uint16_t(int16_t(hi))) << 16));
      }
    }
  }
}

// The int32 sums of R rows over one block of 32 columns (AVX2): key pairs i < np, V held in pairs of keys
// interleaved value by value (state.h: pair i at v + 2 hd i, the block at v), so widening 16 bytes gives 8
// columns' (key 2i, key 2i + 1) int16 pairs for pmaddwd against (wq_2i, wq_2i + 1). A lone last key's partner is
// the page's next position, whatever it holds, weighed by 0. wq as att_pv_q8_wq lays it out (wq at the block).
// out[r * ldo + 0..31]: the sums in column order. pf (decode): pfn prefetch steps spread over the pairs.
template <int R>
STRATA_AVX2 static void att_pv_q8i(const int32_t* wq, int64_t ldq, int nb, int np, const int8_t* v, int hd,
                                   int32_t* out, int64_t ldo, AttPrefetch* pf, int pfn) {
  __m256i acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) acc[r][c] = _mm256_setzero_si256();
  att_segments(pf, pfn, np, [&](int i) STRATA_AVX2 {
    const int8_t* vp = v + 2 * int64_t(hd) * i;
    __m256i x[4];
    for (int c = 0; c < 4; ++c) x[c] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(vp + 16 * c)));
    for (int r = 0; r < R; ++r) {
      const __m256i w = _mm256_set1_epi32(wq[(r * ldq + i) * nb]);
      for (int c = 0; c < 4; ++c) acc[r][c] = _mm256_add_epi32(acc[r][c], _mm256_madd_epi16(x[c], w));
    }
  });
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r * ldo + 8 * c), acc[r][c]);
}

// The same sums with AVX-512 VNNI (vpdpwssd), NCB <= 4 blocks (128 columns) a pass, each pair's bytes read once a
// pass: 32 bytes widened are 16 columns' pairs.
template <int R, int NCB>
STRATA_VNNI static void att_pv_q8i_zmm(const int32_t* wq, int64_t ldq, int nb, int np, const int8_t* v, int hd,
                                       int32_t* out, int64_t ldo, AttPrefetch* pf, int pfn) {
  __m512i acc[R][2 * NCB];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 2 * NCB; ++c) acc[r][c] = _mm512_setzero_si512();
  att_segments(pf, pfn, np, [&](int i) STRATA_VNNI {
    const int8_t* vp = v + 2 * int64_t(hd) * i;
    for (int c = 0; c < NCB; ++c) {
      const __m512i a = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(vp + 64 * c)));
      const __m512i e = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(vp + 64 * c + 32)));
      for (int r = 0; r < R; ++r) {
        const __m512i w = _mm512_set1_epi32(wq[(r * ldq + i) * nb + c]);
        acc[r][2 * c] = _mm512_dpwssd_epi32(acc[r][2 * c], a, w);
        acc[r][2 * c + 1] = _mm512_dpwssd_epi32(acc[r][2 * c + 1], e, w);
      }
    }
  });
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 2 * NCB; ++c) _mm512_storeu_si512(out + r * ldo + 16 * c, acc[r][c]);
}

template <int R>
STRATA_VNNI static void att_pv_q8i_zmm_r(const int32_t* wq, int64_t ldq, int nb, int ncb, int np, const int8_t* v,
                                         int hd, int32_t* out, int64_t ldo, AttPrefetch* pf, int pfn) {
  switch (ncb) {
    case 1: att_pv_q8i_zmm<R, 1>(wq, ldq, nb, np, v, hd, out, ldo, pf, pfn); break;
    case 2: att_pv_q8i_zmm<R, 2>(wq, ldq, nb, np, v, hd, out, ldo, pf, pfn); break;
    case 3: att_pv_q8i_zmm<R, 3>(wq, ldq, nb, np, v, hd, out, ldo, pf, pfn); break;
    default: att_pv_q8i_zmm<R, 4>(wq, ldq, nb, np, v, hd, out, ldo, pf, pfn); break;
  }
}

// O[:hd] = O * alpha + float(sum) * W (per block), the sums in column order (att_pv_q8i).
STRATA_AVX2 static void att_pv_q8_fin(const int32_t* acc, const float* ws, int nb, float alpha, float* o) {
  const __m256 al = _mm256_set1_ps(alpha);
  for (int b = 0; b < nb; ++b) {
    const __m256 W = _mm256_set1_ps(ws[b]);
    for (int k = 0; k < 4; ++k) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(acc + 32 * b + 8 * k));
      float* op = o + 32 * b + 8 * k;
      _mm256_storeu_ps(op, _mm256_fmadd_ps(_mm256_loadu_ps(op), al, _mm256_mul_ps(_mm256_cvtepi32_ps(x), W)));
    }
  }
}

// Scores of R query rows (q, ldq) against C <= 4 keys (k, ldk): s[r * lds + j] = (q_r . k_j) * scale.
template <int R, int C, typename E>
STRATA_AVX2 static void att_qk(const float* q, int64_t ldq, E k, int64_t ldk, int hd, float scale,
                               float* s, int64_t lds) {
  __m256 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 4; ++j) acc[r][j] = _mm256_setzero_ps();
  for (int c = 0; c < hd; c += 8) {  // registers: R x 4 accumulators, R query chunks, 1 key chunk
    __m256 qv[R];
    for (int r = 0; r < R; ++r) qv[r] = _mm256_loadu_ps(q + r * ldq + c);
    for (int j = 0; j < C; ++j) {
      const __m256 kv = att_ld8(k + j * ldk + c);
      for (int r = 0; r < R; ++r) acc[r][j] = _mm256_fmadd_ps(qv[r], kv, acc[r][j]);
    }
  }
  const __m128 sc = _mm_set1_ps(scale);
  if constexpr (C == 4) {  // a row's 4 scores in one store (the same values)
    for (int r = 0; r < R; ++r) _mm_storeu_ps(s + r * lds, _mm_mul_ps(hsum4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]), sc));
    return;
  }
  for (int r = 0; r < R; ++r) {
    alignas(16) float t[4];
    _mm_store_ps(t, _mm_mul_ps(hsum4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]), sc));
    for (int j = 0; j < C; ++j) s[r * lds + j] = t[j];
  }
}

// O[r, c0 : c0 + 8 C] = O * alpha_r + sum_{j < cnt_r} p[r, j] v[j, c0 : ...], keys in order, R rows sharing
// each V load for the keys all of them see (j < cmin) and alone for the rest.
template <int R, int C, typename E>
STRATA_AVX2 static void att_pv(const float* p, int64_t ldp, const int* cnt, const float* alpha, E v,
                               int64_t ldv, float* o, int64_t ldo, AttPrefetch* pf, int pfn) {
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  int cmin = cnt[0];
  for (int r = 1; r < R; ++r) cmin = std::min(cmin, cnt[r]);
  att_segments(pf, pfn, cmin, [&](int j) STRATA_AVX2 {  // (decode: pfn prefetch steps over the keys)
    __m256 b[R];
    for (int r = 0; r < R; ++r) b[r] = _mm256_broadcast_ss(p + r * ldp + j);
    for (int c = 0; c < C; ++c) {
      const __m256 vv = att_ld8(v + j * ldv + 8 * c);
      for (int r = 0; r < R; ++r) acc[r][c] = _mm256_fmadd_ps(b[r], vv, acc[r][c]);
    }
  });
  // (fully unrolled over r and c so that acc stays in registers: a run-time index into it made GCC store
  // all of acc to the stack on every key of the loop above)
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    __m256 a[C];
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) a[c] = acc[r][c];
    for (int j = cmin; j < cnt[r]; ++j) {
      const __m256 b = _mm256_broadcast_ss(p + r * ldp + j);
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) a[c] = _mm256_fmadd_ps(b, att_ld8(v + j * ldv + 8 * c), a[c]);
    }
    const __m256 al = _mm256_set1_ps(alpha[r]);
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) {
      float* op = o + r * ldo + 8 * c;
      _mm256_storeu_ps(op, _mm256_fmadd_ps(_mm256_loadu_ps(op), al, a[c]));
    }
  }
}

template <int R, typename E>
STRATA_AVX2 static void att_qk_r(const float* q, int64_t ldq, E k, int64_t ldk, int C, int hd, float scale,
                                 float* s, int64_t lds) {
  switch (C) {
    case 1: att_qk<R, 1, E>(q, ldq, k, ldk, hd, scale, s, lds); break;
    case 2: att_qk<R, 2, E>(q, ldq, k, ldk, hd, scale, s, lds); break;
    case 3: att_qk<R, 3, E>(q, ldq, k, ldk, hd, scale, s, lds); break;
    default: att_qk<R, 4, E>(q, ldq, k, ldk, hd, scale, s, lds); break;
  }
}

template <int R, typename E>
STRATA_AVX2 static void att_pv_r(const float* p, int64_t ldp, const int* cnt, const float* alpha, E v,
                                 int64_t ldv, float* o, int64_t ldo, int C, AttPrefetch* pf = nullptr, int pfn = 0) {
  switch (C) {
    case 1: att_pv<R, 1, E>(p, ldp, cnt, alpha, v, ldv, o, ldo, pf, pfn); break;
    case 2: att_pv<R, 2, E>(p, ldp, cnt, alpha, v, ldv, o, ldo, pf, pfn); break;
    case 3: att_pv<R, 3, E>(p, ldp, cnt, alpha, v, ldv, o, ldo, pf, pfn); break;
    default: att_pv<R, 4, E>(p, ldp, cnt, alpha, v, ldv, o, ldo, pf, pfn); break;
  }
}

// Per-thread buffers of the tiled kernel.
struct AttScratch {
  std::vector<float> q, o, s, kt, vt, m, l, alpha;
  std::vector<int> cnt;
  std::vector<int8_t> q8;  // q8 cache: the query rows quantised (blocks of 32), and their scales
  std::vector<float> qs;
  std::vector<int32_t> qc;  // q8 with VNNI: each row's per-block corrections (att_qk_q8_vnni)
  std::vector<float> ws, wtmp;  // q8: a row pair's P V weight scales, its weights in f32
  std::vector<int32_t> wq, pvi;     // q8: a row pair's int16 P V weights (in pairs of keys), its int32 P V sums
  void fit(int64_t rows, int hd) {
    if (int64_t(q.size()) < rows * hd) { q.resize(size_t(rows * hd)); o.resize(size_t(rows * hd)); }
    if (int64_t(s.size()) < rows * ATT_KT) s.resize(size_t(rows * ATT_KT));
    if (int64_t(kt.size()) < int64_t(ATT_KT) * hd) { kt.resize(size_t(ATT_KT * hd)); vt.resize(size_t(ATT_KT * hd)); }
    if (int64_t(m.size()) < rows) { m.resize(size_t(rows)); l.resize(size_t(rows)); alpha.resize(size_t(rows)); cnt.resize(size_t(rows)); }
  }
};

// One block of query rows of the tiled kernel: positions i0..i1-1 (of the call's n; position pos0 + i) x the
// G heads of kv head g; row r is position i0 + r / G, head g G + r % G. att_begin loads the rows, att_tile
// folds the key tile starting at t0 into their online softmax (tiles in order), att_end writes O / l.
struct AttBlock {
  int H, Hkv, hd, g;
  int64_t pos0, i0, i1, rows, kvs, pmax;
  float scale;
  AttScratch* w;
  const uint16_t *k16, *v16;  // f16 cache (null: f32): every tile is widened into the pack buffers
  Q8Cache q8;                 // q8 cache (q8.c null: not q8): the same
};

STRATA_AVX2 static void att_begin(AttBlock& b, const float* q, int H, int Hkv, int hd, int64_t pos0, int64_t i0,
                                  int64_t i1, int g, AttScratch& w, const uint16_t* k16 = nullptr,
                                  const uint16_t* v16 = nullptr, const Q8Cache* q8 = nullptr) {
  const int G = H / Hkv;
  b = AttBlock{H, Hkv, hd, g, pos0, i0, i1, (i1 - i0) * G, int64_t(Hkv) * hd, pos0 + i1 - 1,
               1.0f / std::sqrt(float(hd)), &w, k16, v16, q8 ? *q8 : Q8Cache{}};
  w.fit(b.rows, hd);
  float *Q = w.q.data(), *O = w.o.data(), *M = w.m.data(), *L = w.l.data();
  for (int64_t r = 0; r < b.rows; ++r) {
    std::memcpy(Q + r * hd, q + ((i0 + r / G) * H + int64_t(g) * G + r % G) * hd, size_t(hd) * 4);
    std::fill(O + r * hd, O + (r + 1) * hd, 0.f);
    M[r] = -INFINITY;
    L[r] = 0.f;
  }
  if (q8) {  // the rows quantised as the cache is (each row on its own: the same bits in any block)
    const int nb = hd / 32;
    if (int64_t(w.q8.size()) < b.rows * hd) { w.q8.resize(size_t(b.rows * hd)); w.qs.resize(size_t(b.rows * nb)); }
    if (int64_t(w.wq.size()) < ATT_KT * nb) {
      w.wq.resize(size_t(ATT_KT * nb));
      w.ws.resize(size_t(2 * nb));
      w.wtmp.resize(size_t(8 * ATT_KT + 8));
      w.pvi.resize(size_t(2 * hd));
    }
    quantize_q8_rows(Q, w.q8.data(), w.qs.data(), b.rows * hd);
    if (q8->vnni) {  // row r, block b: -128 * (q[32 b] + ... + q[32 b + 31])
      if (int64_t(w.qc.size()) < b.rows * nb) w.qc.resize(size_t(b.rows * nb));
      const int8_t* q8r = w.q8.data();
      for (int64_t i = 0; i < b.rows * nb; ++i) {
        int32_t sum = 0;
        for (int e = 0; e < kQ8Block; ++e) sum += q8r[kQ8Block * i + e];
        w.qc[size_t(i)] = -128 * sum;
      }
    }
  }
}

// Scores, online softmax and P V of one key tile (t0, kc keys; K/V rows kt, vt with stride ldk, f32 or f16).
template <typename E>
STRATA_AVX2 static void att_tile_body(const AttBlock& b, E kt, E vt, int64_t ldk, int kc, int64_t r0,
                                      int64_t t0, AttPrefetch* pf) {
  const int G = b.H / b.Hkv, hd = b.hd;
  const int64_t rows = b.rows, pos0 = b.pos0, i0 = b.i0;
  const float scale = b.scale;
  AttScratch& w = *b.w;
  float *Q = w.q.data(), *O = w.o.data(), *S = w.s.data(), *M = w.m.data(), *L = w.l.data(), *A = w.alpha.data();
  int* cnt = w.cnt.data();
  const int C8 = hd / 8;
  constexpr bool q8 = std::is_same<E, Q8Ptr>::value;
  // scores: 3 rows x 4 keys per micro-tile (q8: 2 rows x 8 keys), the keys' rows kept in L1 over all the rows
  if constexpr (q8) {
    const int8_t* Q8 = w.q8.data();
    const float* QS = w.qs.data();
    const int32_t* QC = b.q8.vnni ? w.qc.data() : nullptr;
    const int nb = hd / 32;
    if (QC) {  // VNNI: the whole tile a row pair at a time, K read in address order (each pair its share of the
               // prefetch steps, inside)
      const int64_t pairs = (rows - r0 + 1) / 2;
      int64_t r = r0;
      for (; r + 2 <= rows; r += 2)
        att_qk_q8_vnni_r<2>(Q8 + r * hd, QC + r * nb, QS + r * nb, nb, kt.q, kt.s, scale, S + r * ATT_KT, ATT_KT, kc,
                            pf, att_share(ATT_PF_QK, (r - r0) / 2, pairs));
      if (r < rows)
        att_qk_q8_vnni_r<1>(Q8 + r * hd, QC + r * nb, QS + r * nb, nb, kt.q, kt.s, scale, S + r * ATT_KT, ATT_KT, kc,
                            pf, att_share(ATT_PF_QK, (r - r0) / 2, pairs));
    } else {
      for (int j = 0; j < kc; j += 16) {  // (kt.q: the page's K, keys in the lanes: key j's bytes from 4 j)
        const int C = std::min(16, kc - j);
        att_decode_prefetch(pf, att_share(ATT_PF_QK, j / 16, (kc + 15) / 16));
        const int8_t* KP = kt.q + 4 * j;
        const uint16_t* DK = kt.s + j;  // (lanes past C: the page's later rows, their scores not stored)
        int64_t r = r0;
        for (; r + 2 <= rows; r += 2)
          att_qk_q8_r<2>(Q8 + r * hd, QS + r * nb, nb, KP, DK, scale, S + r * ATT_KT + j, ATT_KT, C);
        if (r < rows) att_qk_q8_r<1>(Q8 + r * hd, QS + r * nb, nb, KP, DK, scale, S + r * ATT_KT + j, ATT_KT, C);
      }
    }
  } else {
  // keys in chunks of ATT_QK_KC (their rows in L1) x rows in chunks of ATT_QK_RC (their q rows in L1): a block's
  // q rows (64 KiB at 128 rows of hd 128) come from L2 once per key chunk instead of once per 4 keys. Each
  // score is the same FMA chain and reduction whatever the chunking (the same bits).
  for (int jc = 0; jc < kc; jc += ATT_QK_KC) {
    const int je = std::min(kc, jc + ATT_QK_KC);
    for (int64_t rc = r0; rc < rows; rc += ATT_QK_RC) {
      const int64_t re = std::min(rows, rc + ATT_QK_RC);
      for (int j = jc; j < je; j += 4) {
        const int C = std::min(4, kc - j);
        if (pf && rc == r0) att_decode_prefetch(*pf);
        int64_t r = rc;
        for (; r + 3 <= re; r += 3) att_qk_r<3>(Q + r * hd, hd, kt + j * ldk, ldk, C, hd, scale, S + r * ATT_KT + j, ATT_KT);
        if (re - r == 2) att_qk_r<2>(Q + r * hd, hd, kt + j * ldk, ldk, C, hd, scale, S + r * ATT_KT + j, ATT_KT);
        else if (re - r == 1) att_qk_r<1>(Q + r * hd, hd, kt + j * ldk, ldk, C, hd, scale, S + r * ATT_KT + j, ATT_KT);
      }
    }
  }
  }
  // online softmax: each row over its own keys j < cnt (positions t0 + j <= its position)
  for (int64_t r = r0; r < rows; ++r) {
    if (pf && pf->spread) att_decode_prefetch(pf, att_share(ATT_PF_SM, r - r0, rows - r0));
    const int c = int(std::min<int64_t>(kc, pos0 + i0 + r / G + 1 - t0));
    cnt[r] = c;
    float* sr = S + r * ATT_KT;
    __m256 mx = _mm256_set1_ps(-INFINITY);
    int j = 0;
    for (; j + 8 <= c; j += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(sr + j));
    float mt = -INFINITY;
    {
      alignas(32) float t[8];
      _mm256_store_ps(t, mx);
      for (int e = 0; e < 8; ++e) mt = std::max(mt, t[e]);
      for (int e = j; e < c; ++e) mt = std::max(mt, sr[e]);
    }
    const float mnew = std::max(M[r], mt);
    A[r] = std::exp(M[r] - mnew);  // 0 on the first tile
    M[r] = mnew;
    const __m256 mv = _mm256_set1_ps(mnew);
    __m256 sum = _mm256_setzero_ps();
    for (j = 0; j < c; j += 8) {  // the last chunk's lanes past c are zeroed (S has room: KT % 8 == 0)
      __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(sr + j), mv));
      if (c - j < 8) {
        const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        e = _mm256_and_ps(e, _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(c - j), lane)));
      }
      _mm256_storeu_ps(sr + j, e);
      sum = _mm256_add_ps(sum, e);
    }
    L[r] = L[r] * A[r] + hsum256(sum);
  }
  // O = O * alpha + P V: 32 output columns x 3 rows per micro-tile (q8: 2), the V column slice kept in L1
  if constexpr (q8) {  // a row pair at a time: its int16 weights first, then the int32 sums, then O (att_pv_q8_wq)
    const int nb = hd / 32;
    int32_t *WQ = w.wq.data(), *PV = w.pvi.data();
    float *WS = w.ws.data(), *TMP = w.wtmp.data();
    constexpr int64_t ldq = ATT_KT / 2;  // key pairs per row
    const int64_t pairs = (rows - r0 + 1) / 2;
    for (int64_t r = r0; r < rows; r += 2) {
      const int R = rows - r >= 2 ? 2 : 1;
      const int pfn = att_share(ATT_PF_PV, (r - r0) / 2, pairs);  // the row pair's prefetch steps, over its passes
      const int cmax = R == 2 ? std::max(cnt[r], cnt[r + 1]) : cnt[r];
      const int np = (cmax + 1) / 2;
      if (nb == 4) att_pv_q8_wq<4>(S + r * ATT_KT, ATT_KT, cnt + r, R, np, vt.s, ldk / 32, nb, TMP, WQ, ldq, WS);
      else if (nb == 8) att_pv_q8_wq<8>(S + r * ATT_KT, ATT_KT, cnt + r, R, np, vt.s, ldk / 32, nb, TMP, WQ, ldq, WS);
      else att_pv_q8_wq<0>(S + r * ATT_KT, ATT_KT, cnt + r, R, np, vt.s, ldk / 32, nb, TMP, WQ, ldq, WS);
      if (b.q8.vnni) {  // up to 4 blocks per pass
        for (int b0 = 0; b0 < nb; b0 += 4) {
          const int ncb = std::min(4, nb - b0), ns = att_share(pfn, b0 / 4, (nb + 3) / 4);
          if (R == 2) att_pv_q8i_zmm_r<2>(WQ + b0, ldq, nb, ncb, np, vt.q + 64 * b0, hd, PV + 32 * b0, hd, pf, ns);
          else att_pv_q8i_zmm_r<1>(WQ + b0, ldq, nb, ncb, np, vt.q + 64 * b0, hd, PV + 32 * b0, hd, pf, ns);
        }
      } else {
        for (int b0 = 0; b0 < nb; ++b0) {
          const int ns = att_share(pfn, b0, nb);
          if (R == 2) att_pv_q8i<2>(WQ + b0, ldq, nb, np, vt.q + 64 * b0, hd, PV + 32 * b0, hd, pf, ns);
          else att_pv_q8i<1>(WQ + b0, ldq, nb, np, vt.q + 64 * b0, hd, PV + 32 * b0, hd, pf, ns);
        }
      }
      for (int i = 0; i < R; ++i) att_pv_q8_fin(PV + i * hd, WS + i * nb, nb, A[r + i], O + (r + i) * hd);
    }
  } else {
    const bool spread = pf && pf->spread;  // decode: ATT_PF_PV steps over the column blocks, inside the key loop
    for (int c0 = 0; c0 < C8; c0 += 4) {
      const int C = std::min(4, C8 - c0);
      if (pf && !spread) att_decode_prefetch(*pf);
      AttPrefetch* p1 = spread ? pf : nullptr;  // (the first row group's call takes the block's steps)
      const int n1 = spread ? att_share(ATT_PF_PV, c0 / 4, (C8 + 3) / 4) : 0;
      int64_t r = r0;
      for (; r + 3 <= rows; r += 3, p1 = nullptr)
        att_pv_r<3>(S + r * ATT_KT, ATT_KT, cnt + r, A + r, vt + 8 * c0, ldk, O + r * hd + 8 * c0, hd, C, p1, n1);
      if (rows - r == 2) att_pv_r<2>(S + r * ATT_KT, ATT_KT, cnt + r, A + r, vt + 8 * c0, ldk, O + r * hd + 8 * c0, hd, C, p1, n1);
      else if (rows - r == 1) att_pv_r<1>(S + r * ATT_KT, ATT_KT, cnt + r, A + r, vt + 8 * c0, ldk, O + r * hd + 8 * c0, hd, C, p1, n1);
    }
  }
}

// pack: copy the tile's K/V rows contiguous first (prefill blocks); stream: prefetch ahead (decode).
STRATA_AVX2 static void att_tile(const AttBlock& b, const float* k, const float* v, int64_t t0, bool pack,
                                 bool stream, AttPrefetch* pf = nullptr) {
  const int G = b.H / b.Hkv, hd = b.hd;
  const int64_t kvs = b.kvs, pmax = b.pmax, pos0 = b.pos0, i0 = b.i0;
  AttScratch& w = *b.w;
  const int kc = int(std::min<int64_t>(ATT_KT, pmax + 1 - t0));  // keys of this tile some row sees
  const int64_t r0 = std::max<int64_t>(0, (t0 - pos0 - i0) * G);  // first row that sees key t0
  const float *kt = nullptr, *vt = nullptr;
  int64_t ldk = kvs;
  if (b.k16 && stream) {  // f16 cache, decode: widened in registers as it is read, in place (same values)
    att_tile_body(b, b.k16 + int64_t(b.g) * hd + t0 * kvs, b.v16 + int64_t(b.g) * hd + t0 * kvs, kvs, kc, r0, t0, pf);
    return;
  }
  if (b.q8.c) {  // q8 cache: read in place (int8 dots for the scores, V widened in registers), prefill and
                 // decode alike
    const int64_t o = q8_run_offset(t0, b.g, b.q8.cap, hd);  // (t0 starts a page: its kv head's run, state.h)
    const int8_t* run = b.q8.c + o;
    att_tile_body(b, Q8Ptr{run, reinterpret_cast<const uint16_t*>(run + q8_run_kscales(hd))},
                  Q8Ptr{run + q8_run_v(hd), reinterpret_cast<const uint16_t*>(run + q8_run_vscales(hd))},
                  int64_t(hd), kc, r0, t0, pf);
    return;
  }
  if (b.k16) {
    // f16 cache, prefill: the tile's rows copied contiguous as they are (f16: 2 x 16 KiB at hd 128), then read
    // as decode reads them, widened in registers (exact: the same values and sums as widening them first into
    // f32 buffers, which wrote and re-read twice the bytes; 4,096 tokens, one thread: x1.45 with ATT_QB 128)
    const uint16_t *k16 = b.k16 + int64_t(b.g) * hd + t0 * kvs, *v16 = b.v16 + int64_t(b.g) * hd + t0 * kvs;
    uint16_t *kp = reinterpret_cast<uint16_t*>(w.kt.data()), *vp = reinterpret_cast<uint16_t*>(w.vt.data());
    for (int j = 0; j < kc; ++j) {
      std::memcpy(kp + j * hd, k16 + j * kvs, size_t(hd) * 2);
      std::memcpy(vp + j * hd, v16 + j * kvs, size_t(hd) * 2);
    }
    att_tile_body(b, static_cast<const uint16_t*>(kp), static_cast<const uint16_t*>(vp), int64_t(hd), kc, r0, t0, pf);
    return;
  }
  kt = k + int64_t(b.g) * hd + t0 * kvs;
  vt = v + int64_t(b.g) * hd + t0 * kvs;
  if (!b.k16 && !pack && !stream && t0 + ATT_KT <= pmax) {  // (old decode) the next tile's K/V rows, all at once
    const int64_t kn = std::min<int64_t>(ATT_KT, pmax + 1 - t0 - ATT_KT);
    for (int64_t j = 0; j < kn; ++j)
      for (int c = 0; c < hd; c += 16) {
        _mm_prefetch(reinterpret_cast<const char*>(kt + (ATT_KT + j) * kvs + c), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(vt + (ATT_KT + j) * kvs + c), _MM_HINT_T0);
      }
  }
  if (pack) {
    for (int j = 0; j < kc; ++j) {
      std::memcpy(w.kt.data() + j * hd, kt + j * kvs, size_t(hd) * 4);
      std::memcpy(w.vt.data() + j * hd, vt + j * kvs, size_t(hd) * 4);
    }
    kt = w.kt.data();
    vt = w.vt.data();
    ldk = hd;
  }
  att_tile_body(b, kt, vt, ldk, kc, r0, t0, pf);
}

STRATA_AVX2 static void att_end(const AttBlock& b, float* out) {
  const int G = b.H / b.Hkv, hd = b.hd;
  const float *O = b.w->o.data(), *L = b.w->l.data();
  for (int64_t r = 0; r < b.rows; ++r) {
    const __m256 inv = _mm256_set1_ps(1.0f / L[r]);
    float* dst = out + ((b.i0 + r / G) * b.H + int64_t(b.g) * G + r % G) * hd;
    for (int c = 0; c < hd; c += 8) _mm256_storeu_ps(dst + c, _mm256_mul_ps(_mm256_loadu_ps(O + r * hd + c), inv));
  }
}

STRATA_AVX2 static void attend_block_avx2(const float* q, int H, int Hkv, int hd, const float* k, const float* v,
                                          int64_t pos0, int64_t i0, int64_t i1, int g, bool pack, AttScratch& w,
                                          float* out, const uint16_t* k16 = nullptr, const uint16_t* v16 = nullptr,
                                          const Q8Cache* q8 = nullptr) {
  AttBlock b;
  att_begin(b, q, H, Hkv, hd, pos0, i0, i1, g, w, k16, v16, q8);
  if (k16 && !q8) {
    // f16 cache: every tile's rows are widened into the pack buffers before its arithmetic, and a block's
    // tiles lie 2 KiB-strided in a cache of several MiB: while it works on tile t it asks for tile t + 1's
    // K and V lines (into L2), spread over the tile's score and P V steps as decode's stream (att_decode_prefetch).
    // The widening waited on these lines (~10 % of a 4K prefill's attention, one thread).
    AttPrefetch pf;
    pf.k = reinterpret_cast<const char*>(k16 + int64_t(g) * hd);
    pf.v = reinterpret_cast<const char*>(v16 + int64_t(g) * hd);
    pf.kvs = int64_t(Hkv) * hd * 2;
    pf.span = int64_t(hd) * 2;
    const int64_t steps = ATT_KT / 4 + (hd + 31) / 32;
    pf.lines_step = int((ATT_KT * (pf.span / 64 + 1) + steps - 1) / steps);
    for (int64_t t0 = 0; t0 <= b.pmax; t0 += ATT_KT) {
      pf.row = t0 + ATT_KT;
      pf.col = 0;
      pf.end = std::min(b.pmax + 1, t0 + 2 * ATT_KT);
      att_tile(b, k, v, t0, pack, false, &pf);
    }
  } else {
    for (int64_t t0 = 0; t0 <= b.pmax; t0 += ATT_KT) att_tile(b, k, v, t0, pack, false);
  }
  att_end(b, out);
}

// Decode (attn_decode): each thread takes a contiguous run of kv heads and walks the key tiles once for all
// of them (tile outer, heads inner), so it reads one contiguous span of every cache row per tile and keeps
// a steady prefetch stream ahead; each row's arithmetic (tile order, per-tile softmax, P V) is the block
// kernel's, so decode keeps the full forward's bits whatever the thread count.
static void attention_decode_avx2(const float* q, int64_t n, int H, int Hkv, int hd, const float* k, const float* v,
                                  int64_t pos0, float* out, const uint16_t* k16, const uint16_t* v16,
                                  const Q8Cache* q8) {
  const int T = std::max(1, std::min(Hkv, decode_threads()));
  const int64_t grain = (Hkv + T - 1) / T;
  decode_for(Hkv, grain, [&](int64_t g0, int64_t g1) {
    thread_local std::vector<AttScratch> ws;
    std::vector<AttBlock> bs(size_t(g1 - g0));
    if (ws.size() < bs.size()) ws.resize(bs.size());
    for (int64_t g = g0; g < g1; ++g)
      att_begin(bs[size_t(g - g0)], q, H, Hkv, hd, pos0, 0, n, int(g), ws[size_t(g - g0)], k16, v16, q8);
    const int64_t pmax = pos0 + n - 1, nh = g1 - g0;
    AttPrefetch pf;
    if (q8) {
      // Pages (state.h): each kv head's pages are one run of K, V and their scales page after page, and a
      // thread's kv heads are one contiguous stretch of the cache, read head by head (tile order within each head:
      // the same per-row arithmetic as the tile-outer order of the f32 / f16 caches). While it works on a page it
      // asks for the next one (the head's next page, or the next head's first) in address order, spread over the
      // tile's score, softmax and P V steps (ATT_PF_QK ...). (benchmarks/results/history.md, "The q8 KV cache".)
      static_assert(ATT_KT == kQ8Page, "a key tile is a q8 page");
      const int64_t rb = q8_run_bytes(hd), steps = ATT_PF_QK + ATT_PF_SM + ATT_PF_PV;
      pf.lines_step = int((rb / 64 + steps - 1) / steps);
      pf.spread = true;
      auto run = [&](int64_t t0, int64_t g) {
        return reinterpret_cast<const char*>(q8->c + q8_run_offset(t0, int(g), q8->cap, hd));
      };
      {  // the first head's page 0 at once (as the rows below): its lines of the positions that exist, its scales
        const char* o = run(0, g0);
        const int64_t r1 = std::min<int64_t>(pmax + 1, kQ8Page), l16 = (r1 + 15) / 16;
        for (int64_t l = 0; l < l16; ++l)  // K: 16 positions a line in each group of 4 values
          for (int64_t gr = 0; gr < hd / 4; ++gr) _mm_prefetch(o + gr * 4 * kQ8Page + 64 * l, _MM_HINT_T1);
        for (int64_t c = 0; c < (r1 + 1) / 2 * 2 * hd; c += 64)  // V: pairs of positions, key by key
          _mm_prefetch(o + q8_run_v(hd) + c, _MM_HINT_T1);
        for (int64_t c = q8_run_kscales(hd); c < rb; c += 64) _mm_prefetch(o + c, _MM_HINT_T1);  // the scales
      }
      const int64_t P = pmax / kQ8Page + 1;  // pages a head holds
      for (int64_t g = g0; g < g1; ++g)
        for (int64_t t0 = 0; t0 <= pmax; t0 += ATT_KT) {
          // the page ATT_DEC_DIST ahead in the thread's stream (1, 2, 3: within noise at 16K; none: x1.3 slower)
          const int64_t nx = (g - g0) * P + t0 / kQ8Page + ATT_DEC_DIST;
          const bool any = nx < nh * P;
          pf.pk = any ? run(nx % P * kQ8Page, g0 + nx / P) : run(0, g);
          pf.pend = any ? rb : 0;
          pf.pcur = 0;
          att_tile(bs[size_t(g - g0)], k, v, t0, false, true, &pf);
        }
      for (auto& b : bs) att_end(b, out);
      return;
    }
    const int64_t es = k16 ? 2 : 4;  // bytes per cache element
    pf.k = k16 ? reinterpret_cast<const char*>(k16 + g0 * hd) : reinterpret_cast<const char*>(k + g0 * hd);
    pf.v = v16 ? reinterpret_cast<const char*>(v16 + g0 * hd) : reinterpret_cast<const char*>(v + g0 * hd);
    pf.kvs = int64_t(Hkv) * hd * es;
    pf.span = nh * hd * es;
    // A tile-head's share of the next tile's rows, line by line (the span's last line too:
    // spans need not start on a line, e.g. a malloc'ed cache 16 bytes past one, which the row-wise prefetch
    // missed), spread evenly over its ATT_KT / 4 score, ATT_PF_SM softmax and ATT_PF_PV P V steps. Bursts hurt:
    // whole rows per step, or the same lines over the first half of the steps, read the cache slower at 16K keys
    // (2 threads, f16), and so did the steps in the scores and one per P V column block alone (16 : 0 : 4, s9).
    const int64_t rows_th = (ATT_KT + nh - 1) / nh, lines_row = pf.span / 64 + 1,
                  steps = ATT_KT / 4 + ATT_PF_SM + ATT_PF_PV;
    pf.spread = true;
    pf.lines_step = int((rows_th * lines_row + steps - 1) / steps);
    // Tile 0 has no tile before it to ask for it, so its rows come in as demand misses, one
    // 4 KiB page (two cache rows) at a time -- most of a short context's cache. Ask for all of its lines at
    // once instead (into L2, in address order). Attention at 64-256 keys, int8 decode: x1.12-1.13.
    {
      const int64_t r1 = std::min<int64_t>(pmax + 1, ATT_KT);
      for (const char* base : {pf.k, pf.v})
        for (int64_t r = 0; r < r1; ++r)
          for (int64_t c = 0; c < pf.span + 63; c += 64) _mm_prefetch(base + r * pf.kvs + std::min(c, pf.span - 1), _MM_HINT_T1);
    }
    for (int64_t t0 = 0; t0 <= pmax; t0 += ATT_KT) {
      const int64_t a0 = t0 + ATT_DEC_DIST * ATT_KT, next_end = std::min(pmax + 1, a0 + ATT_KT);
      pf.row = a0;
      pf.col = 0;
      for (int64_t i = 0; i < nh; ++i) {
        pf.end = std::min(next_end, a0 + (i + 1) * ((ATT_KT + nh - 1) / nh));
        att_tile(bs[size_t(i)], k, v, t0, false, true, &pf);
      }
    }
    for (auto& b : bs) att_end(b, out);
  });
}

static void attention_tiled_avx2(const float* q, int64_t n, int H, int Hkv, int hd, const float* k, const float* v,
                                 int64_t pos0, float* out, const uint16_t* k16 = nullptr, const uint16_t* v16 = nullptr,
                                 const Q8Cache* q8 = nullptr) {
  if (n <= 6 && g_attn_decode) {
    attention_decode_avx2(q, n, H, Hkv, hd, k, v, pos0, out, k16, v16, q8);
    return;
  }
  if (n <= 6) {  // (old decode) one task per kv head, its n x G rows read the cache once, in place
    decode_for(Hkv, 1, [&](int64_t b, int64_t e) {
      thread_local AttScratch w;
      for (int64_t g = b; g < e; ++g) attend_block_avx2(q, H, Hkv, hd, k, v, pos0, 0, n, int(g), false, w, out, k16, v16, q8);
    });
    return;
  }
  const int64_t qb = ATT_QB, nb = (n + qb - 1) / qb, tasks = nb * Hkv;
#pragma omp parallel
  {
    AttScratch w;
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tasks; ++t) {  // the longest blocks (last positions) first
      const int64_t b = nb - 1 - t / Hkv;
      attend_block_avx2(q, H, Hkv, hd, k, v, pos0, b * qb, std::min(n, (b + 1) * qb), int(t % Hkv),
                        true, w, out, k16, v16, q8);
    }
  }
}

void attention(const float* q, int64_t n, int H, int Hkv, int hd, const float* k, const float* v, int64_t pos0,
               float* out) {
  const int group = H / Hkv;
  const float scale = 1.0f / std::sqrt(float(hd));
  const int64_t kv_stride = int64_t(Hkv) * hd;
  const Attend fast = vec(level()) == Level::AVX512 ? attend_fn(hd) : nullptr;
  if (!fast && g_attn_tiled && vec(level()) == Level::AVX2 && hd % 8 == 0) {
    attention_tiled_avx2(q, n, H, Hkv, hd, k, v, pos0, out);
    return;
  }
  // One query head: scores, softmax, weighted values. The same work whichever thread runs it.
  auto one = [&](int64_t i, int h, float* scores) {
    const int64_t p = pos0 + i;  // keys 0..p are visible
    const int g = h / group;
    const float* qv = q + (i * H + h) * hd;
    if (fast) {
      fast(qv, k + int64_t(g) * hd, v + int64_t(g) * hd, kv_stride, p + 1, hd, scale, scores,
           out + (i * H + h) * hd);
      return;
    }
    float mx = -INFINITY;
    for (int64_t j = 0; j <= p; ++j) {
      float sc = dot(qv, k + j * kv_stride + int64_t(g) * hd, hd) * scale;
      scores[j] = sc;
      mx = std::max(mx, sc);
    }
    float sum = 0.f;
    for (int64_t j = 0; j <= p; ++j) {
      scores[j] = std::exp(scores[j] - mx);
      sum += scores[j];
    }
    float* o = out + (i * H + h) * hd;
    std::fill(o, o + hd, 0.f);
    const float inv = 1.0f / sum;
    for (int64_t j = 0; j <= p; ++j) axpy(scores[j] * inv, v + j * kv_stride + int64_t(g) * hd, o, hd);
  };
  if (n <= 6) {  // decode: decode_for, one chunk per head
    decode_for(n * H, 1, [&](int64_t b, int64_t e) {
      thread_local std::vector<float> scores;
      if (scores.size() < size_t(pos0 + n)) scores.resize(size_t(pos0 + n));
      for (int64_t ih = b; ih < e; ++ih) one(ih / H, int(ih % H), scores.data());
    });
    return;
  }
#pragma omp parallel
  {
    std::vector<float> scores(size_t(pos0 + n));
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t i = 0; i < n; ++i)
      for (int h = 0; h < H; ++h) one(i, h, scores.data());
  }
}

void attention_f16(const float* q, int64_t n, int H, int Hkv, int hd, const uint16_t* k, const uint16_t* v,
                   int64_t pos0, float* out) {
  // The AVX2 tiled kernel at every vector level, AVX-512 too (its CPUs have AVX2 and F16C): it reads the f16
  // rows in place, widening them in registers, for prefill and decode alike. The AVX-512 attend kernels take
  // f32 rows only, and widening the whole cache on every call (below: the scalar level's way, and attn_tiled
  // off) costs decode three passes over an f32 copy per layer and token, now that f16 is the default cache.
  if (g_attn_tiled && vec(level()) != Level::Scalar && hd % 8 == 0) {
    attention_tiled_avx2(q, n, H, Hkv, hd, nullptr, nullptr, pos0, out, k, v);
    return;
  }
  const int64_t m = (pos0 + n) * Hkv * hd;  // scalar level: the whole cache widened (exact), then as f32
  std::vector<float> kf(static_cast<size_t>(m)), vf(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) {
    kf[size_t(i)] = f16_to_f32(k[i]);
    vf[size_t(i)] = f16_to_f32(v[i]);
  }
  attention(q, n, H, Hkv, hd, kf.data(), vf.data(), pos0, out);
}

void attention_q8(const float* q, int64_t n, int H, int Hkv, int hd, const int8_t* cache, int64_t cap, int64_t pos0,
                  float* out) {
  if (hd % kQ8Block != 0) throw std::invalid_argument("attention_q8: head_dim must be a multiple of 32");
  // The AVX2 tiled kernel at every vector level (as attention_f16), reading the cache in place, prefill and
  // decode alike: the query rows quantised like the cache, int8 dots for the scores, V widened in registers.
  if (g_attn_tiled && vec(level()) != Level::Scalar) {
    static const bool has_vnni = __builtin_cpu_supports("avx512vnni");
    const bool a512 = vec(level()) == Level::AVX512;
    const Q8Cache c{cache, cap, a512 && has_vnni};
    attention_tiled_avx2(q, n, H, Hkv, hd, nullptr, nullptr, pos0, out, nullptr, nullptr, &c);
    return;
  }
  // scalar level: the whole cache and the queries (quantised as the tiled kernel quantises them) widened,
  // then as f32
  const int64_t m = (pos0 + n) * Hkv * hd, mq = n * H * hd;
  std::vector<float> kf(static_cast<size_t>(m)), vf(static_cast<size_t>(m)), qf(static_cast<size_t>(mq));
  for (int64_t t = 0; t < pos0 + n; ++t)  // from the pages to rows [T, Hkv, hd]
    for (int g = 0; g < Hkv; ++g)
      for (int d = 0; d < hd; ++d) {
        const int64_t dst = (t * Hkv + g) * hd + d;
        uint16_t sk, sv;
        std::memcpy(&sk, cache + q8_kscale_offset(t, g, d / kQ8Block, cap, hd), 2);
        std::memcpy(&sv, cache + q8_vscale_offset(t, g, d / kQ8Block, cap, hd), 2);
        kf[size_t(dst)] = float(cache[q8_k_offset(t, g, d, cap, hd)]) * f16_to_f32(sk);
        vf[size_t(dst)] = float(cache[q8_v_offset(t, g, d, cap, hd)]) * f16_to_f32(sv);
      }
  std::vector<int8_t> q8(static_cast<size_t>(mq));
  std::vector<float> qs(static_cast<size_t>(mq / kQ8Block));
  quantize_q8_rows(q, q8.data(), qs.data(), mq);
  for (int64_t i = 0; i < mq; ++i) qf[size_t(i)] = float(q8[size_t(i)]) * qs[size_t(i / kQ8Block)];
  attention(qf.data(), n, H, Hkv, hd, kf.data(), vf.data(), pos0, out);
}

void q8_to_pages(const int8_t* k, const float* ks, const int8_t* v, const float* vs, int64_t T, int Hkv, int hd,
                 int8_t* out) {
  const int64_t pages = (T + kQ8Page - 1) / kQ8Page, nb = hd / kQ8Block;
  std::fill(out, out + pages * Hkv * q8_run_bytes(hd), int8_t(0));
  std::vector<uint16_t> s16(static_cast<size_t>(nb));
  for (int64_t t = 0; t < T; ++t)
    for (int g = 0; g < Hkv; ++g) {
      const int64_t src = (t * Hkv + g) * hd;
      for (const bool keys : {true, false}) {
        const float* xs = (keys ? ks : vs) + src / kQ8Block;
        for (int64_t b = 0; b < nb; ++b) s16[size_t(b)] = f32_to_f16(xs[b]);
        q8_put_row((keys ? k : v) + src, s16.data(), t, g, pages, hd, keys, out);
      }
    }
}

void quantize_q8_rows(const float* x, int8_t* q, float* scale, int64_t n) {
  if (n % kQ8Block != 0) throw std::invalid_argument("quantize_q8_rows: n must be a multiple of 32");
  for (int64_t b = 0; b < n / kQ8Block; ++b) {
    const float* xb = x + b * kQ8Block;
    float amax = 0.f;
    for (int i = 0; i < kQ8Block; ++i) amax = std::max(amax, std::fabs(xb[i]));
    const float d = amax / 127.0f, id = d != 0.f ? 1.0f / d : 0.f;
    uint16_t h = f32_to_f16(d);  // held in f16 (llama.cpp's q8_0: the values from the f32 step)
    if ((h & 0x7FFF) >= 0x7C00) h = 0x7BFF;  // (past f16's range: its largest finite value, not an infinity)
    scale[b] = f16_to_f32(h);
    for (int i = 0; i < kQ8Block; ++i) {
      const float r = std::round(xb[i] * id);  // nearest, ties away from zero
      q[b * kQ8Block + i] = int8_t(std::max(-127.f, std::min(127.f, r)));
    }
  }
}

}  // namespace kernels
}  // namespace strata
