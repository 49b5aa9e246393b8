// Build and run: g++ -O2 -pthread -o q8_read_pattern benchmarks/kernels/q8_read_pattern.cpp &&
//   ./q8_read_pattern [rounds] [prefetch] [modes ...]   (s8: ./q8_read_pattern 4 1 2 5 6)
// (issue 32, s6-s8: benchmarks/results/history.md, "The q8 KV cache"; prints GB/s of each pattern, rounds
// alternating; modes 0-6 as below, all of them by default)
// Read pattern A/B for the q8 decode cache (per layer: K and V [16384 rows x 1024 B], scales [16384 x 128 B] each),
// 2 threads: A = head split (thread t reads bytes [512t, 512t+512) of every row, scales [64t, 64t+64)),
// B = key split (thread t reads full rows of its half of the keys), C = pages (s7: the layout of state.h kQ8Page, pages of
// 64 rows kv head by kv head; thread t reads its 4 kv heads' 32 KiB run of K and of V and 4 KiB of scales per page).
// s8: 3 = head-major in four arrays, 4 = C read K / V alternately 1 KiB at a time, 5 = one run per page and kv head
// (K, V, scales), 6 = 5 kv head by kv head (the engine's layout since s8: each thread one contiguous stream).
// Light compute (byte sums); T1 prefetch 0 / 16 rows ahead for modes 0-3 with "prefetch" (C: the next page's runs).
#include <immintrin.h>
#include <pthread.h>
#include <sys/mman.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>
#include <atomic>
#include <string>
static const int L = 28, N = 16384, RB = 1024, SB = 128;
struct Layer { int8_t *k, *v; char *ks, *vs; };
static std::vector<Layer> layers;
static void* hp(size_t n) { void* p = mmap(nullptr, n, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0); madvise(p, n, MADV_HUGEPAGE); memset(p, 1, n); return p; }
__attribute__((target("avx2"))) static long long rd(const char* p, long n, long long acc) {
  __m256i s = _mm256_setzero_si256();
  for (long i = 0; i < n; i += 32) s = _mm256_add_epi8(s, _mm256_loadu_si256((const __m256i*)(p + i)));
  return acc + _mm256_extract_epi64(s, 0);
}
static long long work(int t, int mode, int dist) {
  long long acc = 0;
  if (mode == 2) {  // paged: pages of 64 rows, each [8 heads][64 rows][128 B]: thread t reads its 4 heads' 32 KiB
    for (auto& l : layers)
      for (long p = 0; p < N / 64; ++p) {
        const long o = p * 64 * RB + t * 32768, so = p * 64 * SB + t * 4096;
        if (dist > 0 && p + 1 < N / 64) {
          for (long c = 0; c < 32768; c += 64) { _mm_prefetch((const char*)l.k + o + 64 * RB + c, _MM_HINT_T1); _mm_prefetch((const char*)l.v + o + 64 * RB + c, _MM_HINT_T1); }
          for (long c = 0; c < 4096; c += 64) { _mm_prefetch(l.ks + so + 64 * SB + c, _MM_HINT_T1); _mm_prefetch(l.vs + so + 64 * SB + c, _MM_HINT_T1); }
        }
        acc = rd((const char*)l.k + o, 32768, acc);
        acc = rd((const char*)l.v + o, 32768, acc);
        acc = rd(l.ks + so, 4096, acc);
        acc = rd(l.vs + so, 4096, acc);
      }
    return acc;
  }
  if (mode == 4) {  // paged, K and V read alternately 1 KiB at a time (the layout of mode 2, a finer order)
    for (auto& l : layers)
      for (long p = 0; p < N / 64; ++p) {
        const long o = p * 64 * RB + t * 32768, so = p * 64 * SB + t * 4096;
        for (long c = 0; c < 32768; c += 1024) {
          acc = rd((const char*)l.k + o + c, 1024, acc);
          acc = rd((const char*)l.v + o + c, 1024, acc);
          if (c % 8192 == 0) { acc = rd(l.ks + so + c / 8, 1024, acc); acc = rd(l.vs + so + c / 8, 1024, acc); }
        }
      }
    return acc;
  }
  if (mode == 5) {  // one run per page and kv head: [K 8 KiB | V 8 KiB | K's scales 1 KiB | V's 1 KiB] (the k array
                    // holds K and V, the ks array the scales' bytes unused: the same bytes read, from k and v's
                    // allocations laid end to end), thread t's 4 heads one 72 KiB run of each page
    for (auto& l : layers)
      for (long p = 0; p < N / 64; ++p)
        for (int h = 4 * t; h < 4 * t + 4; ++h) {
          const long o = (p * 8 + h) * 18432;  // (< 2 N RB: k and v are one 2 x 16 MiB span here, see main)
          acc = rd((const char*)l.k + o, 8192 + 1024, acc);
          acc = rd((const char*)l.k + o + 9216, 8192 + 1024, acc);
        }
    return acc;
  }
  if (mode == 6) {  // head-major runs (s8): [kv head][page][K 8 KiB | V 8 KiB | scales 2 x 1 KiB]: thread t's 4
                    // kv heads one contiguous region, read head by head, page by page (one stream)
    for (auto& l : layers)
      for (int h = 4 * t; h < 4 * t + 4; ++h)
        for (long p = 0; p < N / 64; ++p) {
          const long o = ((long)h * (N / 64) + p) * 18432;
          acc = rd((const char*)l.k + o, 8192 + 1024, acc);
          acc = rd((const char*)l.k + o + 9216, 8192 + 1024, acc);
        }
    return acc;
  }
  if (mode == 3) {  // head-major (s8): each kv head's K and V one run over all positions ([8 heads][N rows][128 B],
                   // scales [8 heads][N][16 B]); thread t reads its 4 heads one after the other, page by page (K
                   // 8 KiB, V 8 KiB, 1 KiB of each scale), the next page of the head asked for when dist > 0
    const long HB = (long)N * 128, HS = (long)N * 16;
    for (auto& l : layers)
      for (int h = 4 * t; h < 4 * t + 4; ++h)
        for (long p = 0; p < N / 64; ++p) {
          const long o = h * HB + p * 8192, so = h * HS + p * 1024;
          if (dist > 0 && p + 1 < N / 64) {
            for (long c = 0; c < 8192; c += 64) { _mm_prefetch((const char*)l.k + o + 8192 + c, _MM_HINT_T1); _mm_prefetch((const char*)l.v + o + 8192 + c, _MM_HINT_T1); }
            for (long c = 0; c < 1024; c += 64) { _mm_prefetch(l.ks + so + 1024 + c, _MM_HINT_T1); _mm_prefetch(l.vs + so + 1024 + c, _MM_HINT_T1); }
          }
          acc = rd((const char*)l.k + o, 8192, acc);
          acc = rd((const char*)l.v + o, 8192, acc);
          acc = rd(l.ks + so, 1024, acc);
          acc = rd(l.vs + so, 1024, acc);
        }
    return acc;
  }
  for (auto& l : layers) {
    long r0, r1, c0, cn, s0, sn;
    if (mode == 0) { r0 = 0; r1 = N; c0 = 512 * t; cn = 512; s0 = 64 * t; sn = 64; }
    else { r0 = (long)N / 2 * t; r1 = r0 + N / 2; c0 = 0; cn = RB; s0 = 0; sn = SB; }
    for (long r = r0; r < r1; ++r) {
      long pr = r + dist;
      if (dist > 0 && pr < r1) {
        for (long c = 0; c < cn; c += 64) { _mm_prefetch((const char*)l.k + pr * RB + c0 + c, _MM_HINT_T1); _mm_prefetch((const char*)l.v + pr * RB + c0 + c, _MM_HINT_T1); }
        _mm_prefetch(l.ks + pr * SB + s0, _MM_HINT_T1); _mm_prefetch(l.vs + pr * SB + s0, _MM_HINT_T1);
        if (sn > 64) { _mm_prefetch(l.ks + pr * SB + s0 + 64, _MM_HINT_T1); _mm_prefetch(l.vs + pr * SB + s0 + 64, _MM_HINT_T1); }
      }
      acc = rd((const char*)l.k + r * RB + c0, cn, acc);
      acc = rd((const char*)l.v + r * RB + c0, cn, acc);
      acc = rd(l.ks + r * SB + s0, sn, acc);
      acc = rd(l.vs + r * SB + s0, sn, acc);
    }
  }
  return acc;
}
int main(int argc, char** argv) {
  int rounds = argc > 1 ? atoi(argv[1]) : 4;
  const bool dist16 = argc > 2 && std::string(argv[2]) == "prefetch";  // modes 0-3 with T1 prefetch 16 rows / a page ahead
  std::vector<int> modes;
  for (int i = dist16 ? 3 : 2; i < argc; ++i) modes.push_back(atoi(argv[i]));
  if (modes.empty()) modes = {0, 1, 2, 3, 4, 5, 6};
  for (int i = 0; i < L; ++i) layers.push_back({(int8_t*)hp((size_t)N * RB * 2 + (size_t)N * SB * 2), (int8_t*)hp((size_t)N * RB), (char*)hp((size_t)N * SB), (char*)hp((size_t)N * SB)});
  const double bytes = (double)L * N * (2 * RB + 2 * SB);
  for (int r = 0; r < rounds; ++r) {
    for (int mode : modes) {
      int dist = mode <= 3 && dist16 ? 16 : 0;
      std::atomic<long long> sink{0};
      auto t0 = std::chrono::steady_clock::now();
      std::thread a([&] { sink += work(0, mode, dist); }), b([&] { sink += work(1, mode, dist); });
      a.join(); b.join();
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      printf("round %d %s dist %2d: %.1f GB/s\n", r, mode == 6 ? "head runs " : mode == 5 ? "page runs " : mode == 4 ? "paged 1KiB" : mode == 3 ? "head-major" : mode == 2 ? "paged     " : mode ? "key split " : "head split", dist, bytes / s / 1e9);
    }
  }
}
