// Why a read loop streams memory faster than a bf16 decode step (issue 32): access patterns over the same
// bytes, measured in one process, variants interleaved round by round, each as a fraction of the engine's
// read loop (kernels_matmul.cpp read_bandwidth: 256-bit loads, each thread one contiguous half) in that round.
//
//   g++ -O3 -march=native -fopenmp benchmarks/kernels/decode_stream.cpp -o decode_stream
//   OMP_NUM_THREADS=2 ./decode_stream [rounds] [MiB]
//
// The bytes: the 0.6B Qwen3 shape's decode weights (28 layers of q/k/v 4096x1024, o 1024x2048, gate/up
// 6144x1024, down 1024x3072, then the 151936x1024 lm_head), bf16, one 2 MiB-aligned arena on huge pages;
// [MiB] < the full 1.19 GB keeps the first layers only. Variants:
//   read256 / read512   the read loop with 32- / 64-byte loads over the whole arena, one parallel region
//   mv_one              the engine's old decode kernel (8 rows interleaved, vdpbf16ps, linear T1 prefetch 8 KiB
//                       past the block) over the arena as rows of K = 1024, each thread one contiguous half
//   mv_loops            the same kernel, one parallel region per matrix (113 per pass)
//   mv_nopf             mv_one without software prefetch
//   mv_pf{2,4}K         mv_one with the prefetch that far ahead
//   mv_packed_nopf      mv_one's sums over weights packed per 8-row block in k-steps of 32 (one linear
//                       stream), no software prefetch
//   mv_seq              rows one after another, one accumulator each, no software prefetch (the engine's
//                       AVX512BF16 bf16 decode); mv_seq_pf{1,4}K: with a prefetch that far ahead
//   mv_seq2             two rows at a time (two streams)
//   *_1t                the variant on one thread
// (the run kept in git, benchmarks/results/decode_bandwidth/decode_stream.log at f052806, measured an earlier set: prefetch 16/32 KiB ahead, T0 and NTA hints, packed
// with prefetch.)
#include <immintrin.h>
#include <omp.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace {

struct Matrix {
  int64_t rows, cols;
  size_t off;  // in uint16 elements
};

uint16_t* g_w = nullptr;
std::vector<Matrix> g_mats;
size_t g_elems = 0;
std::vector<uint16_t> g_x;  // bf16 activations, 3072 wide (largest K)
std::vector<float> g_y;
volatile uint64_t g_sink = 0;

// CPU seconds all processes used (user nice system irq softirq steal), and this process's own.
double busy_all() {
  FILE* f = std::fopen("/proc/stat", "r");
  if (!f) return 0;
  unsigned long long v[8] = {};
  if (std::fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", v, v + 1, v + 2, v + 3, v + 4, v + 5, v + 6, v + 7) != 8) v[0] = 0;
  std::fclose(f);
  return double(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / 100.0;
}
double busy_own() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

uint64_t read256(const uint8_t* p, int64_t bytes) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i + 128 <= bytes; i += 128) {
    a0 = _mm256_add_epi64(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_add_epi64(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    a2 = _mm256_add_epi64(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    a3 = _mm256_add_epi64(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  alignas(32) uint64_t l[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(l), _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3)));
  return l[0] + l[1] + l[2] + l[3];
}

uint64_t read512(const uint8_t* p, int64_t bytes) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i + 256 <= bytes; i += 256) {
    a0 = _mm512_add_epi64(a0, _mm512_load_si512(p + i));
    a1 = _mm512_add_epi64(a1, _mm512_load_si512(p + i + 64));
    a2 = _mm512_add_epi64(a2, _mm512_load_si512(p + i + 128));
    a3 = _mm512_add_epi64(a3, _mm512_load_si512(p + i + 192));
  }
  return _mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
}

// The engine's micro_bf16dp<1, 8, true> (one token, 8 rows, linear prefetch PF bytes past the block).
template <int NR, int PF, int HINT, bool PACKED>
void mv8(const uint16_t* w, int64_t K, const uint16_t* x, float* y) {
  __m512 acc[NR];
  for (int r = 0; r < NR; ++r) acc[r] = _mm512_setzero_ps();
  const char* pf = reinterpret_cast<const char*>(w + NR * K) + PF;
  for (int64_t k = 0; k < K; k += 32) {
    if constexpr (PF > 0) {
      for (int l = 0; l < NR * 64; l += 64) _mm_prefetch(pf + l, static_cast<_mm_hint>(HINT));
      pf += NR * 64;
    }
    const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + k);
    for (int r = 0; r < NR; ++r) {
      const uint16_t* p = PACKED ? w + k * NR + r * 32 : w + r * K + k;
      acc[r] = _mm512_dpbf16_ps(acc[r], xv, (__m512bh)_mm512_loadu_si512(p));
    }
  }
  for (int r = 0; r < NR; ++r) y[r] = _mm512_reduce_add_ps(acc[r]);
}
// Rows one after another (r outer, k inner): the same sums as mv8 (one accumulator per row, k order), the
// bytes read in memory order as one stream; PF > 0: prefetch PF bytes ahead of the current load, one line per step.
template <int NR, int PF>
void mvseq(const uint16_t* w, int64_t K, const uint16_t* x, float* y) {
  for (int r = 0; r < NR; ++r) {
    const uint16_t* wr = w + r * K;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 32) {
      if constexpr (PF > 0) _mm_prefetch(reinterpret_cast<const char*>(wr + k) + PF, _MM_HINT_T1);
      acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(x + k), (__m512bh)_mm512_loadu_si512(wr + k));
    }
    y[r] = _mm512_reduce_add_ps(acc);
  }
}
// Two rows at a time (2 streams), the same sums.
template <int NR>
void mvseq2(const uint16_t* w, int64_t K, const uint16_t* x, float* y) {
  for (int r = 0; r < NR; r += 2) {
    const uint16_t* wr = w + r * K;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0;
    for (int64_t k = 0; k < K; k += 32) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + k);
      a0 = _mm512_dpbf16_ps(a0, xv, (__m512bh)_mm512_loadu_si512(wr + k));
      a1 = _mm512_dpbf16_ps(a1, xv, (__m512bh)_mm512_loadu_si512(wr + K + k));
    }
    y[r] = _mm512_reduce_add_ps(a0);
    y[r + 1] = _mm512_reduce_add_ps(a1);
  }
}
}  // namespace

using Kernel = void (*)(const uint16_t*, int64_t, const uint16_t*, float*);

// rows [r0, r1) of matrix m (r0, r1 multiples of 8)
static void rows_of(const Matrix& m, int64_t r0, int64_t r1, Kernel f) {
  const uint16_t* base = g_w + m.off;
  for (int64_t r = r0; r < r1; r += 8) f(base + r * m.cols, m.cols, g_x.data(), g_y.data() + (r % 4096));
}

// one parallel region over every matrix: each thread a contiguous half of the arena's rows-of-K=1024 view
static void mv_one(Kernel f) {
#pragma omp parallel
  {
    const int nt = omp_get_num_threads(), id = omp_get_thread_num();
    const int64_t K = 1024, R = int64_t(g_elems) / K / 8 * 8;
    const int64_t lo = R * id / nt / 8 * 8, hi = id == nt - 1 ? R : R * (id + 1) / nt / 8 * 8;
    float y[8];
    for (int64_t r = lo; r < hi; r += 8) f(g_w + r * K, K, g_x.data(), y);
    g_y[id] += y[0];
  }
}

static void mv_loops(Kernel f) {
  for (const Matrix& m : g_mats) {
#pragma omp parallel
    {
      const int nt = omp_get_num_threads(), id = omp_get_thread_num();
      const int64_t R = m.rows / 8;
      rows_of(m, R * id / nt * 8, R * (id + 1) / nt * 8, f);
    }
  }
}

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 8;
  const double mib = argc > 2 ? std::atof(argv[2]) : 1e9;
  const int64_t D = 1024, Q = 2048, KV = 1024, I = 3072, V = 151936;
  size_t off = 0;
  auto add = [&](int64_t r, int64_t c) {
    if ((off + size_t(r * c)) * 2 > mib * 1048576.0) return;
    g_mats.push_back({r, c, off});
    off += size_t(r * c);
  };
  for (int l = 0; l < 28; ++l) {
    add(Q + 2 * KV, D);
    add(D, Q);
    add(2 * I, D);
    add(D, I);
  }
  add(V, D);
  g_elems = off;
  const size_t bytes = g_elems * 2, cap = (bytes + (2 << 20) - 1) / (2 << 20) * (2 << 20);
  g_w = static_cast<uint16_t*>(std::aligned_alloc(2 << 20, cap));
  madvise(g_w, cap, MADV_HUGEPAGE);
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < g_elems; ++i) g_w[i] = uint16_t(0x3c00 + (i * 2654435761u >> 26));  // small bf16 values
  g_x.assign(4096, 0x3f80);
  g_y.assign(8192, 0.f);
  std::printf("%zu matrices, %.3f GB, %d threads\n", g_mats.size(), bytes / 1e9, omp_get_max_threads());

  struct Variant {
    std::string name;
    std::function<void()> run;
  };
  const uint8_t* p = reinterpret_cast<const uint8_t*>(g_w);
  auto rd = [&](uint64_t (*f)(const uint8_t*, int64_t)) {
    return [=] {
      uint64_t tot = 0;
#pragma omp parallel reduction(+ : tot)
      {
        const int nt = omp_get_num_threads(), id = omp_get_thread_num();
        const int64_t per = (int64_t(bytes) / nt) / 256 * 256, lo = per * id, hi = id == nt - 1 ? int64_t(bytes) : lo + per;
        tot += f(p + lo, hi - lo);
      }
      g_sink = g_sink + tot;
    };
  };
  std::vector<Variant> vs = {
      {"read256", rd(read256)},
      {"read256_1t", [&] { omp_set_num_threads(1); rd(read256)(); omp_set_num_threads(2); }},
      {"read512", rd(read512)},
      {"mv_one", [] { mv_one(mv8<8, 8192, 2, false>); }},
      {"mv_loops", [] { mv_loops(mv8<8, 8192, 2, false>); }},
      {"mv_nopf", [] { mv_one(mv8<8, 0, 2, false>); }},
      {"mv_pf2K", [] { mv_one(mv8<8, 2048, 2, false>); }},
      {"mv_pf4K", [] { mv_one(mv8<8, 4096, 2, false>); }},
      {"mv_packed_nopf", [] { mv_one(mv8<8, 0, 2, true>); }},
      {"mv_seq", [] { mv_one(mvseq<8, 0>); }},
      {"mv_seq_pf1K", [] { mv_one(mvseq<8, 1024>); }},
      {"mv_seq_pf4K", [] { mv_one(mvseq<8, 4096>); }},
      {"mv_seq2", [] { mv_one(mvseq2<8>); }},
      {"mv_seq_1t", [] { omp_set_num_threads(1); mv_one(mvseq<8, 0>); omp_set_num_threads(2); }},
      {"mv_seq_pf1K_1t", [] { omp_set_num_threads(1); mv_one(mvseq<8, 1024>); omp_set_num_threads(2); }},
      {"mv_seq_pf4K_1t", [] { omp_set_num_threads(1); mv_one(mvseq<8, 4096>); omp_set_num_threads(2); }},
      {"mv_seq2_1t", [] { omp_set_num_threads(1); mv_one(mvseq2<8>); omp_set_num_threads(2); }},
      {"mv_one_1t", [] { omp_set_num_threads(1); mv_one(mv8<8, 8192, 2, false>); omp_set_num_threads(2); }},
      {"mv_pf2K_1t", [] { omp_set_num_threads(1); mv_one(mv8<8, 2048, 2, false>); omp_set_num_threads(2); }},
      {"mv_packed_nopf_1t", [] { omp_set_num_threads(1); mv_one(mv8<8, 0, 2, true>); omp_set_num_threads(2); }},
  };
  for (auto& v : vs) v.run();  // warm
  std::vector<std::vector<double>> gbs(vs.size()), frac(vs.size());
  for (int r = 0; r < rounds; ++r) {
    double ref = 0;
    for (double t_end = now() + 20; now() < t_end;) {  // wait for a 0.5 s window with others < 0.25 cores
      const double b0 = busy_all(), o0 = busy_own(), w0 = now();
      usleep(500000);
      if ((busy_all() - b0 - (busy_own() - o0)) / (now() - w0) < 0.25) break;
    }
    const double b0 = busy_all(), o0 = busy_own(), w0 = now();
    for (size_t i = 0; i < vs.size(); ++i) {
      const double t0 = now();
      vs[i].run();
      const double g = bytes / (now() - t0) / 1e9;
      if (i == 0) ref = g;
      gbs[i].push_back(g);
      frac[i].push_back(g / ref);
    }
    std::printf("round %d:", r + 1);
    for (size_t i = 0; i < vs.size(); ++i) std::printf(" %s %.1f", vs[i].name.c_str(), gbs[i].back());
    std::printf("  | others %.2f cores\n", std::max(0.0, (busy_all() - b0 - (busy_own() - o0)) / (now() - w0)));
    std::fflush(stdout);
  }
  auto med = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::printf("%-16s %10s %10s %10s\n", "variant", "GB/s med", "GB/s max", "x read256");
  for (size_t i = 0; i < vs.size(); ++i)
    std::printf("%-16s %10.1f %10.1f %10.2f\n", vs[i].name.c_str(), med(gbs[i]),
                *std::max_element(gbs[i].begin(), gbs[i].end()), med(frac[i]));
  return 0;
}
