#include "strata/kernels.h"

#include "pool.h"

// GCC 12 warns about its own AVX-512 intrinsic headers (false positives on the masked forms).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#ifdef STRATA_HAVE_OPENMP
#include <omp.h>
#endif

namespace strata {
namespace kernels {

// ---------------------------------------------------------------- dispatch
static Level detect() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
    return __builtin_cpu_supports("avx512bf16") ? Level::AVX512BF16 : Level::AVX512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
    return Level::AVX2;
#endif
  return Level::Scalar;
}

static Level initial_level() {
  Level best = detect();
  const char* env = std::getenv("STRATA_KERNEL");  // scalar | avx2 | avx512 | avx512bf16: cap for debugging
  if (env) {
    std::string s(env);
    Level want = s == "scalar" ? Level::Scalar : s == "avx2" ? Level::AVX2 : s == "avx512" ? Level::AVX512
                                                                                         : Level::AVX512BF16;
    if (int(want) < int(best)) return want;
  }
  return best;
}

static Level g_level = initial_level();

// Switches for A/B measurements in one process (benchmarks/ab_decode.py); the defaults are the fast paths.
// Measured on a 2-core machine shared by ~8 builds (benchmarks/ab_decode.py, interleaved rounds): OpenMP
// loops (threads sleeping at barriers) decoded 1.27x faster than the pool, whose helpers' spinning competes
// for the same cores; the pool stays as an option for dedicated machines.
static bool g_decode_pool = false;  // decode loops on pool.h (false: OpenMP dynamic loops)
static bool g_bf16_eo = true;      // AVX2 bf16 rows in even/odd order (false: widening loads)
static bool g_gdn_matrix = [] {    // GDN chunked prefill in matrix form (false: the older row loops)
  const char* e = std::getenv("STRATA_GDN_SCALAR");
  return !(e && *e && std::string(e) != "0");
}();
// Decode matvec prefetch: a block of NR rows is one contiguous range of memory, read as NR interleaved
// row streams, which the hardware prefetcher follows poorly. With linear prefetch each k step of a block
// prefetches its share (1/(K/16)) of the next block plus kPrefetchAhead bytes, in memory order, into L2
// (into L1 the next block and the current one evict each other); false: the earlier per-row prefetch 512
// bytes ahead in each row, into L1. Measured on a shared 2-core EPYC (AVX2), 2 threads: bf16 decode
// x2.0-2.4 faster (benchmarks/ab_decode.py, in-process interleaved rounds; x2.1 old vs new .so in
// alternating interpreters), int8 x1.6; prefetching into L1 instead lost ~1.4x; 8 KiB beyond the next
// block vs 0 or 32 KiB: within noise; 8-row blocks instead of 4: not measurably faster.
static bool g_linear_prefetch = true;
static bool g_attn_tiled = true;   // AVX2 attention tiled with an online softmax (false: the per-query scalar loop)
// int8 weights x activations quantised to int8 per token in blocks of 32 (integer dot products); false: the
// weights widened to f32 against f32 activations.
static bool g_int8_dot = true;
static bool g_attn_decode = true;  // AVX2 decode attention streams the cache with prefetch in step (false: per-tile burst)
// Decode attention's prefetch (attn_decode): a line cursor over the next tile's rows, a few lines per step of
// the score and P V loops (false: whole rows per score step, none during P V). Prefetch only: same bits.
// A/B: benchmarks/decode_attention_ab.py (in-process interleaved rounds, 2 threads, 4K and 16K keys).
static bool g_attn_pf_lines = true;
// On: new KV caches of engines loaded with kv_cache "auto" hold f16 whatever the weights (kv_cache_half());
// off (default): "auto" decides from the weights (f16 for bf16/f16/int8, f32 for f32).
static bool g_kv_f16 = false;
// Decode (one token) takes 8 rows per micro-kernel call where two whole 4-row quads of one matrix follow each
// other (false: 4 rows). Each row keeps its own accumulator and order, so the sums are bit-identical; with 4
// rows a step's FMA chains are too few to hide their latency and one core streamed bf16 rows at ~0.6 of a
// read loop (benchmarks/ab_decode.py measures the two).
static bool g_decode_rows8 = true;
// Decode loops hand each thread one contiguous run of chunks (its rows stream from memory as one run, so the
// next-block prefetch never lands in the other thread's rows) and a thread that finishes its run takes chunks
// from the far end of another's (a preempted thread on a shared machine holds no one up); false: OpenMP's
// dynamic schedule, chunks in turn, the two threads' runs interleaved.
static bool g_decode_runs = true;
// Qwen3-Next MoE: the active experts run side by side, one per thread (moe.cpp; false: one after another,
// each expert's matmuls split across the threads).
static bool g_moe_parallel = true;
static bool g_release_teams = true;    // read by release_threads() (model.cpp)
static bool g_attn_first_tile = true;  // decode attention asks for key tile 0 up front
constexpr int64_t kPrefetchAhead = 8192;
void set_option(const std::string& name, bool on) {
  if (name == "decode_pool") g_decode_pool = on;
  else if (name == "bf16_eo") g_bf16_eo = on;
  else if (name == "gdn_matrix") g_gdn_matrix = on;
  else if (name == "linear_prefetch") g_linear_prefetch = on;
  else if (name == "attn_tiled") g_attn_tiled = on;
  else if (name == "int8_dot") g_int8_dot = on;
  else if (name == "attn_decode") g_attn_decode = on;
  else if (name == "attn_pf_lines") g_attn_pf_lines = on;
  else if (name == "kv_f16") g_kv_f16 = on;
  else if (name == "decode_rows8") g_decode_rows8 = on;
  else if (name == "decode_runs") g_decode_runs = on;
  else if (name == "moe_parallel") g_moe_parallel = on;
  else if (name == "release_teams") g_release_teams = on;
  else if (name == "attn_first_tile") g_attn_first_tile = on;
  else throw std::invalid_argument("unknown kernel option '" + name +
                                   "' (decode_pool, bf16_eo, gdn_matrix, linear_prefetch, attn_tiled, int8_dot, attn_decode, attn_pf_lines, kv_f16, decode_rows8, decode_runs, moe_parallel, release_teams, attn_first_tile)");
}
bool option(const std::string& name) {
  if (name == "decode_pool") return g_decode_pool;
  if (name == "bf16_eo") return g_bf16_eo;
  if (name == "gdn_matrix") return g_gdn_matrix;
  if (name == "linear_prefetch") return g_linear_prefetch;
  if (name == "attn_tiled") return g_attn_tiled;
  if (name == "int8_dot") return g_int8_dot;
  if (name == "attn_decode") return g_attn_decode;
  if (name == "attn_pf_lines") return g_attn_pf_lines;
  if (name == "kv_f16") return g_kv_f16;
  if (name == "decode_rows8") return g_decode_rows8;
  if (name == "decode_runs") return g_decode_runs;
  if (name == "moe_parallel") return g_moe_parallel;
  if (name == "release_teams") return g_release_teams;
  if (name == "attn_first_tile") return g_attn_first_tile;
  throw std::invalid_argument("unknown kernel option '" + name +
                              "' (decode_pool, bf16_eo, gdn_matrix, linear_prefetch, attn_tiled, int8_dot, attn_decode, attn_pf_lines, kv_f16, decode_rows8, decode_runs, moe_parallel, release_teams, attn_first_tile)");
}

// A decode-step loop over [0, n) in chunks of grain: the barrier-free pool, or OpenMP for comparison.
template <class F>
static void decode_for(int64_t n, int64_t grain, F&& f) {
#ifdef STRATA_HAVE_OPENMP
  if (omp_in_parallel()) {  // inside a parallel loop (MoE experts side by side): this thread, in order
    for (int64_t c0 = 0; c0 < n; c0 += grain) f(c0, std::min(n, c0 + grain));
    return;
  }
#endif
  if (g_decode_pool) {
    pool::parallel_for(pool::current_threads(), n, grain, f);
    return;
  }
  const int64_t chunks = (n + grain - 1) / grain;
  if (chunks <= 1) {  // one chunk (a MoE router, a small matrix): no parallel region to wake threads for
    if (n > 0) f(0, n);
    return;
  }
#ifdef STRATA_HAVE_OPENMP
  const int T = int(std::min<int64_t>(omp_get_max_threads(), chunks));
  if (g_decode_runs && T > 1) {
    // Run t is chunks [lo_t, hi_t): its owner takes from the front, other threads (once their own run is
    // done) from the back; both ends of a run live in one 64-bit word (front << 32 | back), claimed by CAS.
    struct alignas(64) Run {
      std::atomic<uint64_t> ends;
    };
    std::vector<Run> runs(static_cast<size_t>(T));
    for (int t = 0; t < T; ++t)
      runs[size_t(t)].ends.store(uint64_t(chunks * t / T) << 32 | uint64_t(chunks * (t + 1) / T),
                                 std::memory_order_relaxed);
    auto claim = [&](Run& r, bool front) -> int64_t {
      uint64_t e = r.ends.load(std::memory_order_relaxed);
      for (;;) {
        const uint64_t lo = e >> 32, hi = e & 0xffffffffu;
        if (lo >= hi) return -1;
        const uint64_t next = front ? (lo + 1) << 32 | hi : lo << 32 | (hi - 1);
        if (r.ends.compare_exchange_weak(e, next, std::memory_order_acq_rel, std::memory_order_relaxed))
          return int64_t(front ? lo : hi - 1);
      }
    };
#pragma omp parallel num_threads(T)
    {
      const int me = omp_get_thread_num();
      for (int64_t c; (c = claim(runs[size_t(me)], true)) >= 0;) f(c * grain, std::min(n, (c + 1) * grain));
      for (int d = 1; d < T; ++d) {
        Run& other = runs[size_t((me + d) % T)];
        for (int64_t c; (c = claim(other, false)) >= 0;) f(c * grain, std::min(n, (c + 1) * grain));
      }
    }
    return;
  }
#endif
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t c = 0; c < chunks; ++c) f(c * grain, std::min(n, (c + 1) * grain));
}

Level best_level() { return detect(); }
Level level() { return g_level; }
void set_level(Level l) { g_level = int(l) <= int(best_level()) ? l : best_level(); }
// The f32-activation kernels of a level: AVX512BF16 differs from AVX512 only for bf16 weights.
static Level vec(Level l) { return l == Level::AVX512BF16 ? Level::AVX512 : l; }

const char* level_name(Level l) {
  return l == Level::AVX512BF16 ? "avx512bf16" : l == Level::AVX512 ? "avx512" : l == Level::AVX2 ? "avx2" : "scalar";
}

// ---------------------------------------------------------------- conversions
float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return uint16_t(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));  // inf, NaN
  if (ax >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to 65520 or more: inf
  if (ax < 0x38800000u) {  // below 2^-14: subnormal (or zero), round(|f| 2^24) to nearest even
    float a;
    std::memcpy(&a, &ax, 4);
    return uint16_t(sign | uint32_t(std::nearbyint(a * 16777216.0f)));
  }
  const uint32_t m = ax & 0x7fffffu, rem = m & 0x1fffu;
  uint32_t h = ((((ax >> 23) - 127 + 15) << 10) | (m >> 13));
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry into the exponent is right
  return uint16_t(sign | h);
}

void f32_to_f16_rows(const float* x, uint16_t* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = f32_to_f16(x[i]);
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
  if (exp == 0) {
    if (man == 0) u = sign;
    else {  // subnormal: normalise
      int e = -1;
      do { ++e; man <<= 1; } while (!(man & 0x400));
      u = sign | uint32_t(127 - 15 - e) << 23 | (man & 0x3ff) << 13;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | man << 13;
  } else {
    u = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

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
#define STRATA_AVX2 __attribute__((target("avx2,fma,f16c")))

STRATA_AVX2 static inline float hsum256(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

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

// NT tokens x NR rows of dot products over K; w rows are f32 (converted block), ldw = K.
// NT tokens x NR rows of dot products over K; w rows in dtype DT (f32 for converted blocks), ldw in
// elements. Prefill and decode both run through these kernels, so a token's logits do not depend on how
// many tokens were computed with it (bit-identical reuse).
// PF (decode: rows contiguous, ldw == K, streamed from memory): software prefetch of the next block in
// memory order (see g_linear_prefetch).
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
  // decode only (rows contiguous): each k step prefetches NR*32 bytes of the next block into L2
  // (g_linear_prefetch), or (false) the earlier per-row prefetch 512 bytes ahead into L1
  const bool linear = g_linear_prefetch;
  const char* pf = reinterpret_cast<const char*>(wb + NR * ldw) + kPrefetchAhead;
  for (int64_t k = 0; k < K; k += 16) {
    if (linear) {
      for (int l = 0; l < NR * 32; l += 64) _mm_prefetch(pf + l, _MM_HINT_T1);
      pf += NR * 32;
    } else if (NT == 1 && NR == 4) {
      for (int r = 0; r < NR; ++r) _mm_prefetch(reinterpret_cast<const char*>(wb + r * ldw + k) + 512, _MM_HINT_T0);
    }
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
// PF: decode's linear prefetch of the next block (see g_linear_prefetch), the same sums.
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
#define STRATA_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,fma,f16c")))

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

template <DType DT, int NT, int NR>
STRATA_AVX512 static void micro_avx512(const void* w, int64_t ldw, const float* x, int64_t ldx, int64_t K, float* y,
                                       int64_t ldy) {
  const size_t es = esize<DT>();
  const uint8_t* wb = static_cast<const uint8_t*>(w);
  __m512 acc[NT][NR];
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < NR; ++r) acc[t][r] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
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
#define STRATA_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,fma,f16c")))

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

static void matmul_bf16dp(const Mat& w, const float* x, int64_t n, float* y) {
  const int64_t rows = w.rows, K = w.cols, ldx = (K + 31) / 32 * 32;
  const uint16_t* base = static_cast<const uint16_t*>(w.data);
  std::vector<uint16_t> xb(size_t(n * ldx), 0);
#pragma omp parallel for schedule(static) if (n > 16)
  for (int64_t t = 0; t < n; ++t) to_bf16_avx512(x + t * K, K, xb.data() + t * ldx);
  constexpr int TN = 6;
  if (n <= TN) {  // decode: weight rows stream from memory once, 4 at a time
    const int64_t quads = (rows + 3) / 4;
    decode_for(quads, 16, [&](int64_t q0, int64_t q1) {
      for (int64_t qd = q0; qd < q1; ++qd) {
        const int64_t r0 = qd * 4;
        const int nr = int(std::min<int64_t>(4, rows - r0));
        float tile[TN * 4];
        micro_bh(int(n), nr)(base + r0 * K, K, xb.data(), ldx, K, tile, 4);
        for (int64_t t = 0; t < n; ++t)
          for (int r = 0; r < nr; ++r) y[t * rows + r0 + r] = tile[t * 4 + r];
      }
    });
    return;
  }
  // Prefill: a block of RB weight rows (bf16, RB*K*2 bytes) stays in L2 while every token tile passes.
  const int64_t RB = 64, nblocks = (rows + RB - 1) / RB;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t b = 0; b < nblocks; ++b) {
    const int64_t r0 = b * RB, nr_block = std::min(RB, rows - r0);
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

// Decode rows straight from memory (ldw == K): at AVX2 the prefetching variant of the same kernel.
static void run_micro_decode(Level l, DType dt, int nt, int nr, const void* w, int64_t ldw, const float* x,
                             int64_t ldx, int64_t K, float* y, int64_t ldy) {
  if (l != Level::AVX2 || !g_linear_prefetch) return run_micro(l, dt, nt, nr, w, ldw, x, ldx, K, y, ldy);
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

// ---------------------------------------------------------------- matmul
static bool use_eo(Level lv, const Mat& w) { return g_bf16_eo && lv == Level::AVX2 && w.dtype == DType::BF16 && w.cols % 16 == 0; }

// y[t, r] = tile[t, r] (times the row's scale for int8 weights), t < nt, r < nr.
static inline void store_tile(const float* tile, int nt, int nr, const float* scale, float* y, int64_t ldy) {
  for (int t = 0; t < nt; ++t)
    for (int r = 0; r < nr; ++r) y[t * ldy + r] = scale ? tile[t * 4 + r] * scale[r] : tile[t * 4 + r];
}

// Prefill (compute-bound): blocks of RB rows converted once to f32 (kept in L2) times tiles of TN tokens.
static void prefill_one(Level lv, const Mat& w, const float* x, const float* xp, int64_t n, float* y) {
  const int64_t rows = w.rows, K = w.cols;
  const size_t es = dtype_size(w.dtype);
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  const bool eo = use_eo(lv, w);
  const float* xin = eo ? xp : x;
  const int TN = lv == Level::AVX512 ? 6 : 3;  // token tile (register budget: NT*4 accumulators)
  const int64_t RB = 64;
  const int64_t nblocks = (rows + RB - 1) / RB;
  Cvt cvt = eo ? cvt_bf16_eo : cvt_fn(lv, w.dtype);
#pragma omp parallel
  {
    std::vector<float> scratch;
    if (w.dtype != DType::F32) scratch.resize(size_t(RB * K));
    float tile[6 * 4];
#pragma omp for schedule(dynamic, 1)
    for (int64_t b = 0; b < nblocks; ++b) {
      const int64_t r0 = b * RB, nr_block = std::min(RB, rows - r0);
      const float* wf;
      if (w.dtype == DType::F32) {
        wf = reinterpret_cast<const float*>(base) + r0 * K;
      } else {
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
    int nrest = 0;
    for (int i = 0; i < count; ++i) {
      if (outs[i].w->dtype == DType::BF16) matmul_bf16dp(*outs[i].w, x, n, outs[i].y);
      else rest[nrest++] = outs[i];
    }
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
  std::vector<float> xp;
  if (any_eo) {
    xp.resize(size_t(n * K));
    for (int64_t t = 0; t < n; ++t) perm_eo(x + t * K, K, xp.data() + t * K);
  }
  thread_local QAct tl_qa;  // reused buffers; the decode lambda reads them from other threads by reference
  QAct& qa = tl_qa;
  if (any_q8) quantize_act(lv != Level::Scalar, x, n, K, qa);
  if (n > TN) {
    for (int i = 0; i < count; ++i) {
      if (use_q8(*outs[i].w)) prefill_q8(lv, *outs[i].w, qa, n, outs[i].y);
      else prefill_one(lv, *outs[i].w, x, xp.data(), n, outs[i].y);
    }
    return;
  }
  // Decode (memory-bound): the rows of every output stream from memory once, 4 at a time, converted in
  // registers; one loop for all outputs, chunks of 64 rows taken from a counter by the caller and the
  // pool's helpers (pool.h: no join barrier, so a helper preempted on a shared machine holds no one up).
  int64_t start[9];
  start[0] = 0;
  for (int i = 0; i < count; ++i) start[i + 1] = start[i] + (outs[i].w->rows + 3) / 4;
  const int64_t total = start[count];
  const float* xpp = xp.data();
  const bool rows8 = g_decode_rows8 && n == 1 && lv == Level::AVX2;
  decode_for(total, 16, [&](int64_t q0, int64_t q1) {
    float tile[6 * 4];
    for (int64_t qd = q0; qd < q1; ++qd) {
      int m = 0;
      while (qd >= start[m + 1]) ++m;
      const Mat& w = *outs[m].w;
      const int64_t r0 = (qd - start[m]) * 4;
      const int nr = int(std::min<int64_t>(4, w.rows - r0));
      const uint8_t* rowp = static_cast<const uint8_t*>(w.data) + size_t(r0 * K) * dtype_size(w.dtype);
      if (rows8 && qd + 1 < q1 && r0 + 8 <= w.rows && use_eo(lv, w)) {
        // two whole quads of one bf16 matrix: 8 rows per call, tile[0..7] (one token). int8 rows stay 4 per
        // call: their kernel has 6 integer ops per load and 8 rows measured x0.98 (benchmarks/ab_decode.py)
        micro_bf16eo<1, 8>(rowp, K, xpp, K, K, tile, 8);
        store_tile(tile, 1, 8, nullptr, outs[m].y + r0, w.rows);  // one token: tile[r] for r < 8
        ++qd;
        continue;
      }
      if (use_q8(w)) run_q8(lv, g_linear_prefetch, int(n), nr, reinterpret_cast<const int8_t*>(rowp), qa, 0, K, tile, 4);
      else if (use_eo(lv, w)) micro_eo(int(n), nr)(rowp, K, xpp, K, K, tile, 4);
      else run_micro_decode(lv, w.dtype, int(n), nr, rowp, K, x, K, K, tile, 4);
      store_tile(tile, int(n), nr, w.scale ? w.scale + r0 : nullptr, outs[m].y + r0, w.rows);
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
// it streams per token.
double read_bandwidth(int64_t bytes, int reps) {
  bytes = std::max<int64_t>(bytes, int64_t(1) << 20) / 4096 * 4096;
  uint8_t* buf = static_cast<uint8_t*>(std::aligned_alloc(4096, size_t(bytes)));
  if (!buf) throw std::bad_alloc();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < bytes; i += 4096) std::memset(buf + i, int(i >> 12), 4096);  // first touch
  const bool avx = vec(level()) != Level::Scalar;
  double best = 0.0;
  uint64_t sink = 0;
  for (int rep = 0; rep < std::max(reps, 1); ++rep) {
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
    best = std::max(best, double(bytes) / s / 1e9);
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

// ---------------------------------------------------------------- small ops
static void rmsnorm_impl(const float* x, const float* w, int64_t d, float eps, float* y, float offset) {
  double ss = 0.0;
  for (int64_t i = 0; i < d; ++i) ss += double(x[i]) * double(x[i]);
  const float inv = 1.0f / std::sqrt(float(ss / double(d)) + eps);
  for (int64_t i = 0; i < d; ++i) {
    float wi = w ? w[i] + offset : 1.0f;
    y[i] = wi * (x[i] * inv);
  }
}

void rmsnorm(const float* x, const float* w, int64_t d, float eps, float* y) { rmsnorm_impl(x, w, d, eps, y, 0.f); }
void rmsnorm_1p(const float* x, const float* w, int64_t d, float eps, float* y) { rmsnorm_impl(x, w, d, eps, y, 1.f); }

std::vector<float> rope_inv_freq(double theta, int rd) {
  std::vector<float> f(size_t(rd / 2));
  for (int j = 0; j < rd / 2; ++j) {
    float expo = float(2 * j) / float(rd);
    f[j] = 1.0f / float(std::pow(theta, double(expo)));
  }
  return f;
}

void rope(float* x, int n_heads, int hd, int rd, int64_t pos, const float* inv_freq) {
  const int half = rd / 2;
  float c[512], s[512];
  for (int j = 0; j < half; ++j) {
    float a = float(pos) * inv_freq[j];
    c[j] = std::cos(a);
    s[j] = std::sin(a);
  }
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + int64_t(h) * hd;
    for (int j = 0; j < half; ++j) {
      float x1 = v[j], x2 = v[j + half];
      v[j] = x1 * c[j] - x2 * s[j];
      v[j + half] = x2 * c[j] + x1 * s[j];
    }
  }
}

void silu_mul(float* g, const float* u, int64_t n) {
  for (int64_t i = 0; i < n; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

void add(float* y, const float* x, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

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
constexpr int ATT_QB = 16;  // query positions per prefill block

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

// Scores of R query rows (q, ldq) against C <= 4 keys (k, ldk): s[r * lds + j] = (q_r . k_j) * scale.
template <int R, int C, typename E>
STRATA_AVX2 static void att_qk(const float* q, int64_t ldq, const E* k, int64_t ldk, int hd, float scale,
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
  for (int r = 0; r < R; ++r) {
    alignas(16) float t[4];
    _mm_store_ps(t, _mm_mul_ps(hsum4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]), sc));
    for (int j = 0; j < C; ++j) s[r * lds + j] = t[j];
  }
}

// O[r, c0 : c0 + 8 C] = O * alpha_r + sum_{j < cnt_r} p[r, j] v[j, c0 : ...], keys in order, R rows sharing
// each V load for the keys all of them see (j < cmin) and alone for the rest.
template <int R, int C, typename E>
STRATA_AVX2 static void att_pv(const float* p, int64_t ldp, const int* cnt, const float* alpha, const E* v,
                               int64_t ldv, float* o, int64_t ldo) {
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  int cmin = cnt[0];
  for (int r = 1; r < R; ++r) cmin = std::min(cmin, cnt[r]);
  for (int j = 0; j < cmin; ++j) {
    __m256 b[R];
    for (int r = 0; r < R; ++r) b[r] = _mm256_broadcast_ss(p + r * ldp + j);
    for (int c = 0; c < C; ++c) {
      const __m256 vv = att_ld8(v + j * ldv + 8 * c);
      for (int r = 0; r < R; ++r) acc[r][c] = _mm256_fmadd_ps(b[r], vv, acc[r][c]);
    }
  }
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
STRATA_AVX2 static void att_qk_r(const float* q, int64_t ldq, const E* k, int64_t ldk, int C, int hd, float scale,
                                 float* s, int64_t lds) {
  switch (C) {
    case 1: att_qk<R, 1, E>(q, ldq, k, ldk, hd, scale, s, lds); break;
    case 2: att_qk<R, 2, E>(q, ldq, k, ldk, hd, scale, s, lds); break;
    case 3: att_qk<R, 3, E>(q, ldq, k, ldk, hd, scale, s, lds); break;
    default: att_qk<R, 4, E>(q, ldq, k, ldk, hd, scale, s, lds); break;
  }
}

template <int R, typename E>
STRATA_AVX2 static void att_pv_r(const float* p, int64_t ldp, const int* cnt, const float* alpha, const E* v,
                                 int64_t ldv, float* o, int64_t ldo, int C) {
  switch (C) {
    case 1: att_pv<R, 1, E>(p, ldp, cnt, alpha, v, ldv, o, ldo); break;
    case 2: att_pv<R, 2, E>(p, ldp, cnt, alpha, v, ldv, o, ldo); break;
    case 3: att_pv<R, 3, E>(p, ldp, cnt, alpha, v, ldv, o, ldo); break;
    default: att_pv<R, 4, E>(p, ldp, cnt, alpha, v, ldv, o, ldo); break;
  }
}

// Per-thread buffers of the tiled kernel.
struct AttScratch {
  std::vector<float> q, o, s, kt, vt, m, l, alpha;
  std::vector<int> cnt;
  void fit(int64_t rows, int hd) {
    if (int64_t(q.size()) < rows * hd) { q.resize(size_t(rows * hd)); o.resize(size_t(rows * hd)); }
    if (int64_t(s.size()) < rows * ATT_KT) s.resize(size_t(rows * ATT_KT));
    if (int64_t(kt.size()) < int64_t(ATT_KT) * hd) { kt.resize(size_t(ATT_KT * hd)); vt.resize(size_t(ATT_KT * hd)); }
    if (int64_t(m.size()) < rows) { m.resize(size_t(rows)); l.resize(size_t(rows)); alpha.resize(size_t(rows)); cnt.resize(size_t(rows)); }
  }
};

// Decode streams the cache in place. A thread owns a contiguous run of kv heads, i.e. one contiguous span of
// every cache row (span floats from column c0 of each K and V row); while it works on key tile t it asks
// for the rows of tile t + 1 in address order, a few rows per step of the score loop, so the lines come in
// as one steady sequential stream (into L2) behind the arithmetic rather than in the tile's strided order.
struct AttPrefetch {
  const char *k = nullptr, *v = nullptr;  // row 0, column c0 of the span
  int64_t kvs = 0, span = 0;              // row stride, span length (bytes)
  int64_t row = 0, end = 0;                // next row to ask for, rows this tile-head asks for stop at end
  int per_step = 0;                        // rows per 4-key step (attn_pf_lines off)
  bool lines = false;                      // attn_pf_lines: a line cursor, steps in the score and the P V loops
  int64_t col = 0;                         // next byte of row `row` to ask for (lines)
  int lines_step = 0;                      // K and V lines per step (lines)
};
constexpr int ATT_DEC_DIST = 1;  // tiles ahead (1, 2, 3: within noise at 16K)
STRATA_AVX2 static inline void att_decode_prefetch(AttPrefetch& p) {
  if (p.lines) {  // the span's lines, the last one too when the span does not start on a line
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
    return;
  }
  for (int i = 0; i < p.per_step && p.row < p.end; ++i, ++p.row) {
    const char* kr = p.k + p.row * p.kvs;
    const char* vr = p.v + p.row * p.kvs;
    for (int64_t c = 0; c < p.span; c += 64) {
      _mm_prefetch(kr + c, _MM_HINT_T1);
      _mm_prefetch(vr + c, _MM_HINT_T1);
    }
  }
}

// One block of query rows of the tiled kernel: positions i0..i1-1 (of the call's n; position pos0 + i) x the
// G heads of kv head g; row r is position i0 + r / G, head g G + r % G. att_begin loads the rows, att_tile
// folds the key tile starting at t0 into their online softmax (tiles in order), att_end writes O / l.
struct AttBlock {
  int H, Hkv, hd, g;
  int64_t pos0, i0, i1, rows, kvs, pmax;
  float scale;
  AttScratch* w;
  const uint16_t *k16, *v16;  // f16 cache (null: f32): every tile is widened into the pack buffers
};

STRATA_AVX2 static void att_begin(AttBlock& b, const float* q, int H, int Hkv, int hd, int64_t pos0, int64_t i0,
                                  int64_t i1, int g, AttScratch& w, const uint16_t* k16 = nullptr,
                                  const uint16_t* v16 = nullptr) {
  const int G = H / Hkv;
  b = AttBlock{H, Hkv, hd, g, pos0, i0, i1, (i1 - i0) * G, int64_t(Hkv) * hd, pos0 + i1 - 1,
               1.0f / std::sqrt(float(hd)), &w, k16, v16};
  w.fit(b.rows, hd);
  float *Q = w.q.data(), *O = w.o.data(), *M = w.m.data(), *L = w.l.data();
  for (int64_t r = 0; r < b.rows; ++r) {
    std::memcpy(Q + r * hd, q + ((i0 + r / G) * H + int64_t(g) * G + r % G) * hd, size_t(hd) * 4);
    std::fill(O + r * hd, O + (r + 1) * hd, 0.f);
    M[r] = -INFINITY;
    L[r] = 0.f;
  }
}

// Scores, online softmax and P V of one key tile (t0, kc keys; K/V rows kt, vt with stride ldk, f32 or f16).
template <typename E>
STRATA_AVX2 static void att_tile_body(const AttBlock& b, const E* kt, const E* vt, int64_t ldk, int kc, int64_t r0,
                                      int64_t t0, AttPrefetch* pf) {
  const int G = b.H / b.Hkv, hd = b.hd;
  const int64_t rows = b.rows, pos0 = b.pos0, i0 = b.i0;
  const float scale = b.scale;
  AttScratch& w = *b.w;
  float *Q = w.q.data(), *O = w.o.data(), *S = w.s.data(), *M = w.m.data(), *L = w.l.data(), *A = w.alpha.data();
  int* cnt = w.cnt.data();
  const int C8 = hd / 8;
  // scores: 3 rows x 4 keys per micro-tile, the 4 keys' rows kept in L1 over all the rows
  for (int j = 0; j < kc; j += 4) {
    const int C = std::min(4, kc - j);
    if (pf) att_decode_prefetch(*pf);
    int64_t r = r0;
    for (; r + 3 <= rows; r += 3) att_qk_r<3>(Q + r * hd, hd, kt + j * ldk, ldk, C, hd, scale, S + r * ATT_KT + j, ATT_KT);
    if (rows - r == 2) att_qk_r<2>(Q + r * hd, hd, kt + j * ldk, ldk, C, hd, scale, S + r * ATT_KT + j, ATT_KT);
    else if (rows - r == 1) att_qk_r<1>(Q + r * hd, hd, kt + j * ldk, ldk, C, hd, scale, S + r * ATT_KT + j, ATT_KT);
  }
  // online softmax: each row over its own keys j < cnt (positions t0 + j <= its position)
  for (int64_t r = r0; r < rows; ++r) {
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
  // O = O * alpha + P V: 32 output columns x 3 rows per micro-tile, the V column slice kept in L1
  for (int c0 = 0; c0 < C8; c0 += 4) {
    const int C = std::min(4, C8 - c0);
    if (pf && pf->lines) att_decode_prefetch(*pf);
    int64_t r = r0;
    for (; r + 3 <= rows; r += 3)
      att_pv_r<3>(S + r * ATT_KT, ATT_KT, cnt + r, A + r, vt + 8 * c0, ldk, O + r * hd + 8 * c0, hd, C);
    if (rows - r == 2) att_pv_r<2>(S + r * ATT_KT, ATT_KT, cnt + r, A + r, vt + 8 * c0, ldk, O + r * hd + 8 * c0, hd, C);
    else if (rows - r == 1) att_pv_r<1>(S + r * ATT_KT, ATT_KT, cnt + r, A + r, vt + 8 * c0, ldk, O + r * hd + 8 * c0, hd, C);
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
  if (b.k16) {  // f16 cache: widen the tile's rows into the pack buffers (exact), then as f32
    const uint16_t *k16 = b.k16 + int64_t(b.g) * hd + t0 * kvs, *v16 = b.v16 + int64_t(b.g) * hd + t0 * kvs;
    float *kp = w.kt.data(), *vp = w.vt.data();
    for (int j = 0; j < kc; ++j)
      for (int c = 0; c < hd; c += 8) {
        _mm256_storeu_ps(kp + j * hd + c, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(k16 + j * kvs + c))));
        _mm256_storeu_ps(vp + j * hd + c, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v16 + j * kvs + c))));
      }
    kt = kp;
    vt = vp;
    ldk = hd;
    pack = false;
  } else {
    kt = k + int64_t(b.g) * hd + t0 * kvs;
    vt = v + int64_t(b.g) * hd + t0 * kvs;
  }
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
                                          float* out, const uint16_t* k16 = nullptr, const uint16_t* v16 = nullptr) {
  AttBlock b;
  att_begin(b, q, H, Hkv, hd, pos0, i0, i1, g, w, k16, v16);
  for (int64_t t0 = 0; t0 <= b.pmax; t0 += ATT_KT) att_tile(b, k, v, t0, pack, false);
  att_end(b, out);
}

// Decode (attn_decode): each thread takes a contiguous run of kv heads and walks the key tiles once for all
// of them (tile outer, heads inner), so it reads one contiguous span of every cache row per tile and keeps
// a steady prefetch stream ahead; each row's arithmetic (tile order, per-tile softmax, P V) is the block
// kernel's, so decode keeps the full forward's bits whatever the thread count.
static void attention_decode_avx2(const float* q, int64_t n, int H, int Hkv, int hd, const float* k, const float* v,
                                  int64_t pos0, float* out, const uint16_t* k16, const uint16_t* v16) {
  const int T = std::max(1, std::min(Hkv, pool::current_threads()));
  const int64_t grain = (Hkv + T - 1) / T;
  decode_for(Hkv, grain, [&](int64_t g0, int64_t g1) {
    thread_local std::vector<AttScratch> ws;
    std::vector<AttBlock> bs(size_t(g1 - g0));
    if (ws.size() < bs.size()) ws.resize(bs.size());
    for (int64_t g = g0; g < g1; ++g)
      att_begin(bs[size_t(g - g0)], q, H, Hkv, hd, pos0, 0, n, int(g), ws[size_t(g - g0)], k16, v16);
    const int64_t pmax = pos0 + n - 1, nh = g1 - g0;
    AttPrefetch pf;
    const int64_t es = k16 ? 2 : 4;  // bytes per cache element
    pf.k = k16 ? reinterpret_cast<const char*>(k16 + g0 * hd) : reinterpret_cast<const char*>(k + g0 * hd);
    pf.v = v16 ? reinterpret_cast<const char*>(v16 + g0 * hd) : reinterpret_cast<const char*>(v + g0 * hd);
    pf.kvs = int64_t(Hkv) * hd * es;
    pf.span = nh * hd * es;
    pf.per_step = int((ATT_KT / nh + 15) / 16);  // 16 score steps per tile-head
    // attn_pf_lines: a tile-head's share of the next tile's rows, line by line (the span's last line too:
    // spans need not start on a line, e.g. a malloc'ed cache 16 bytes past one, which the row-wise prefetch
    // missed), spread evenly over its 16 score and hd / 32 P V steps. Bursts hurt: whole rows per step, or
    // the same lines over the first half of the steps, read the cache slower at 16K keys (2 threads, f16).
    pf.lines = g_attn_pf_lines;
    const int64_t rows_th = (ATT_KT + nh - 1) / nh, lines_row = pf.span / 64 + 1,
                  steps = ATT_KT / 4 + (hd + 31) / 32;
    pf.lines_step = int((rows_th * lines_row + steps - 1) / steps);
    // attn_first_tile: tile 0 has no tile before it to ask for it, so its rows come in as demand misses, one
    // 4 KiB page (two cache rows) at a time -- most of a short context's cache. Ask for all of its lines at
    // once instead (into L2, in address order). Attention at 64-256 keys, int8 decode: x1.12-1.13.
    if (g_attn_first_tile) {
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
                                 int64_t pos0, float* out, const uint16_t* k16 = nullptr, const uint16_t* v16 = nullptr) {
  if (n <= 6 && g_attn_decode) {
    attention_decode_avx2(q, n, H, Hkv, hd, k, v, pos0, out, k16, v16);
    return;
  }
  if (n <= 6) {  // (old decode) one task per kv head, its n x G rows read the cache once, in place
    decode_for(Hkv, 1, [&](int64_t b, int64_t e) {
      thread_local AttScratch w;
      for (int64_t g = b; g < e; ++g) attend_block_avx2(q, H, Hkv, hd, k, v, pos0, 0, n, int(g), false, w, out, k16, v16);
    });
    return;
  }
  const int64_t nb = (n + ATT_QB - 1) / ATT_QB, tasks = nb * Hkv;
#pragma omp parallel
  {
    AttScratch w;
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tasks; ++t) {  // the longest blocks (last positions) first
      const int64_t b = nb - 1 - t / Hkv;
      attend_block_avx2(q, H, Hkv, hd, k, v, pos0, b * ATT_QB, std::min(n, (b + 1) * ATT_QB), int(t % Hkv),
                        true, w, out, k16, v16);
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
  if (n <= 6) {  // decode: the barrier-free pool (pool.h), one chunk per head
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

}  // namespace kernels
}  // namespace strata
