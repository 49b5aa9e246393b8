// Internal to the kernels_*.cpp files (one op each): the vector-level attributes, the switches of
// set_option/option, the decode-step loop and helpers the ops share.
#pragma once
#include "strata/kernels.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include <string>
#include <vector>
#ifdef STRATA_HAVE_OPENMP
#include <omp.h>
#endif

#define STRATA_AVX2 __attribute__((target("avx2,fma,f16c")))
#define STRATA_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,fma,f16c")))
#define STRATA_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,fma,f16c")))

namespace strata {
namespace kernels {

// The switches (kernels_options.cpp; kernels.h documents them).
extern bool g_gdn_matrix;
extern bool g_attn_tiled;
extern bool g_int8_dot;
extern bool g_attn_decode;
extern bool g_kv_f16;
extern bool g_moe_parallel;
constexpr int64_t kPrefetchAhead = 8192;
// matmul: up to this many tokens take the decode path (rows streamed once for all of them: a batched decode
// step), more the blocked prefill GEMM.
constexpr int64_t kDecodeBatch = 8;

// The f32-activation kernels of a level: AVX512BF16 differs from AVX512 only for bf16 weights.
inline Level vec(Level l) { return l == Level::AVX512BF16 ? Level::AVX512 : l; }

STRATA_AVX2 inline float hsum256(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

// Threads a decode-step loop may use: the calling thread's OpenMP thread count (1 without OpenMP).
inline int decode_threads() {
#ifdef STRATA_HAVE_OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

// A decode-step loop over [0, n) in chunks of grain: each OpenMP thread takes one contiguous run of chunks,
// its rows streaming from memory as one range (the hardware prefetchers follow one stream per thread), then
// steals from the far end of another's run. Which thread ran a chunk changes no result.
template <class F>
inline void decode_for(int64_t n, int64_t grain, F&& f) {
#ifdef STRATA_HAVE_OPENMP
  if (omp_in_parallel()) {  // inside a parallel loop (MoE experts side by side): this thread, in order
    for (int64_t c0 = 0; c0 < n; c0 += grain) f(c0, std::min(n, c0 + grain));
    return;
  }
#endif
  const int64_t chunks = (n + grain - 1) / grain;
  if (chunks <= 1) {  // one chunk (a MoE router, a small matrix): no parallel region to wake threads for
    if (n > 0) f(0, n);
    return;
  }
#ifdef STRATA_HAVE_OPENMP
  const int T = int(std::min<int64_t>(omp_get_max_threads(), chunks));
  if (T > 1) {
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
  for (int64_t c = 0; c < chunks; ++c) f(c * grain, std::min(n, (c + 1) * grain));  // one thread
}

}  // namespace kernels
}  // namespace strata
