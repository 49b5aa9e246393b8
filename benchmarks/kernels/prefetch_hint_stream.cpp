// What a software prefetch costs a linear stream (issue 32, s10: benchmarks/results/history.md):
// 2 threads each read one contiguous half of a huge-page arena (256-bit loads, byte sums), once as a plain
// read loop and once per variant below that asks for the line LEAD bytes ahead with a prefetch hint; the
// "+wN" variants do 2N vpmaddwd per 64-byte line on the loaded data, two dependent chains of N (arithmetic
// the out-of-order core overlaps across lines: +w24 makes the loop compute-bound). Variants alternate within each round; printed: GB/s (median and best of the rounds) and the
// median over rounds of the variant's GB/s over the plain loop's in the same round.
//
//   g++ -O2 -pthread benchmarks/kernels/prefetch_hint_stream.cpp -o prefetch_hint_stream
//   ./prefetch_hint_stream [rounds] [MiB]          (default 8 rounds of 1,024 MiB)
#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

enum Hint { kNone, kT0, kT1, kT2, kNta };

template <Hint H>
static inline void ask(const char* p) {
  if constexpr (H == kT0) _mm_prefetch(p, _MM_HINT_T0);
  if constexpr (H == kT1) _mm_prefetch(p, _MM_HINT_T1);
  if constexpr (H == kT2) _mm_prefetch(p, _MM_HINT_T2);
  if constexpr (H == kNta) _mm_prefetch(p, _MM_HINT_NTA);
}

template <Hint H>
__attribute__((target("avx2"))) static long long stream(const char* p, long n, long lead, int work) {
  __m256i s0 = _mm256_setzero_si256(), s1 = s0;
  for (long i = 0; i < n; i += 64) {
    if constexpr (H != kNone) ask<H>(p + i + lead);
    __m256i a = _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i));
    __m256i b = _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32));
    for (int k = 0; k < work; ++k) {
      a = _mm256_madd_epi16(a, a);
      b = _mm256_madd_epi16(b, b);
    }
    s0 = _mm256_add_epi8(s0, a);
    s1 = _mm256_add_epi8(s1, b);
  }
  return _mm256_extract_epi64(_mm256_add_epi8(s0, s1), 0);
}

struct Variant {
  const char* name;
  Hint hint;
  long lead;
  int work;
};

static long long run(const Variant& v, const char* p, long n) {
  switch (v.hint) {
    case kT0: return stream<kT0>(p, n, v.lead, v.work);
    case kT1: return stream<kT1>(p, n, v.lead, v.work);
    case kT2: return stream<kT2>(p, n, v.lead, v.work);
    case kNta: return stream<kNta>(p, n, v.lead, v.work);
    default: return stream<kNone>(p, n, 0, v.work);
  }
}

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 8;
  const size_t bytes = size_t(argc > 2 ? std::atol(argv[2]) : 1024) << 20;
  const size_t pad = size_t(1) << 20;  // the last lines' leads stay inside the arena
  char* arena = static_cast<char*>(mmap(nullptr, bytes + pad, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (arena == MAP_FAILED) return 1;
  madvise(arena, bytes + pad, MADV_HUGEPAGE);
  std::memset(arena, 1, bytes + pad);
  const std::vector<Variant> vs = {
      {"plain", kNone, 0, 0},       {"T1 4 KiB", kT1, 4096, 0},  {"T1 16 KiB", kT1, 16384, 0},
      {"T2 16 KiB", kT2, 16384, 0}, {"T0 2 KiB", kT0, 2048, 0},  {"T0 8 KiB", kT0, 8192, 0},
      {"NTA 8 KiB", kNta, 8192, 0}, {"plain +w4", kNone, 0, 4}, {"T1 16 KiB +w4", kT1, 16384, 4},
      {"plain +w24", kNone, 0, 24}, {"T1 16 KiB +w24", kT1, 16384, 24},
  };
  std::vector<std::vector<double>> gbs(vs.size());
  std::atomic<long long> sink{0};
  for (int r = 0; r < rounds; ++r)
    for (size_t k = 0; k < vs.size(); ++k) {
      const long half = long(bytes / 2);
      const auto t0 = std::chrono::steady_clock::now();
      std::thread a([&] { sink += run(vs[k], arena, half); });
      std::thread b([&] { sink += run(vs[k], arena + half, half); });
      a.join();
      b.join();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      gbs[k].push_back(double(bytes) / s / 1e9);
    }
  std::printf("| variant | GB/s median | best | / plain (median of rounds) |\n|---|---:|---:|---:|\n");
  for (size_t k = 0; k < vs.size(); ++k) {
    std::vector<double> g = gbs[k], q;
    for (size_t i = 0; i < g.size(); ++i) q.push_back(g[i] / gbs[0][i]);
    std::sort(g.begin(), g.end());
    std::sort(q.begin(), q.end());
    std::printf("| %s | %.1f | %.1f | %.2f |\n", vs[k].name, g[g.size() / 2], g.back(), q[q.size() / 2]);
  }
  std::printf("(%d rounds of %zu MiB, 2 threads; checksum %lld)\n", rounds, bytes >> 20, sink.load() & 1);
  return 0;
}
