// Build and run: g++ -O2 -pthread -o q8_read_pattern benchmarks/kernels/q8_read_pattern.cpp && ./q8_read_pattern [rounds]
// (issue 32, s6: benchmarks/results/long_context/q8/s6/README.md; prints GB/s of each pattern, rounds alternating)
// Read pattern A/B for the q8 decode cache (per layer: K and V [16384 rows x 1024 B], scales [16384 x 128 B] each),
// 2 threads: A = head split (thread t reads bytes [512t, 512t+512) of every row, scales [64t, 64t+64)),
// B = key split (thread t reads full rows of its half of the keys). Light compute (byte sums); T1 prefetch 0 / 16 / 64 rows ahead.
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
  for (int i = 0; i < L; ++i) layers.push_back({(int8_t*)hp((size_t)N * RB), (int8_t*)hp((size_t)N * RB), (char*)hp((size_t)N * SB), (char*)hp((size_t)N * SB)});
  const double bytes = (double)L * N * (2 * RB + 2 * SB);
  for (int r = 0; r < rounds; ++r) {
    for (int cfg = 0; cfg < 6; ++cfg) {
      int mode = cfg % 2, dist = cfg / 2 == 0 ? 0 : cfg / 2 == 1 ? 16 : 64;
      std::atomic<long long> sink{0};
      auto t0 = std::chrono::steady_clock::now();
      std::thread a([&] { sink += work(0, mode, dist); }), b([&] { sink += work(1, mode, dist); });
      a.join(); b.join();
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      printf("round %d %s dist %2d: %.1f GB/s\n", r, mode ? "key split " : "head split", dist, bytes / s / 1e9);
    }
  }
}
