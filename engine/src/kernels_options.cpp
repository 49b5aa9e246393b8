// GCC 12 warns about its own AVX-512 intrinsic headers (false positives on the masked forms).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "kernels_internal.h"

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
bool g_decode_pool = false;  // decode loops on pool.h (false: OpenMP dynamic loops)
bool g_bf16_eo = true;      // AVX2 bf16 rows in even/odd order (false: widening loads)
bool g_gdn_matrix = [] {    // GDN chunked prefill in matrix form (false: the older row loops)
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
bool g_linear_prefetch = true;
bool g_attn_tiled = true;   // AVX2 attention tiled with an online softmax (false: the per-query scalar loop)
// int8 weights x activations quantised to int8 per token in blocks of 32 (integer dot products); false: the
// weights widened to f32 against f32 activations.
bool g_int8_dot = true;
bool g_attn_decode = true;  // AVX2 decode attention streams the cache with prefetch in step (false: per-tile burst)
// Decode attention's prefetch (attn_decode): a line cursor over the next tile's rows, a few lines per step of
// the score and P V loops (false: whole rows per score step, none during P V). Prefetch only: same bits.
// A/B: benchmarks/decode_attention_ab.py (in-process interleaved rounds, 2 threads, 4K and 16K keys).
bool g_attn_pf_lines = true;
// On: new KV caches of engines loaded with kv_cache "auto" hold f16 whatever the weights (kv_cache_half());
// off (default): "auto" decides from the weights (f16 for bf16/f16/int8, f32 for f32).
bool g_kv_f16 = false;
// Decode (one token) takes 8 rows per micro-kernel call where two whole 4-row quads of one matrix follow each
// other (false: 4 rows). Each row keeps its own accumulator and order, so the sums are bit-identical; with 4
// rows a step's FMA chains are too few to hide their latency and one core streamed bf16 rows at ~0.6 of a
// read loop (benchmarks/ab_decode.py measures the two).
bool g_decode_rows8 = true;
// Decode loops hand each thread one contiguous run of chunks (its rows stream from memory as one run, so the
// next-block prefetch never lands in the other thread's rows) and a thread that finishes its run takes chunks
// from the far end of another's (a preempted thread on a shared machine holds no one up); false: OpenMP's
// dynamic schedule, chunks in turn, the two threads' runs interleaved.
bool g_decode_runs = true;
// Qwen3-Next MoE: the active experts run side by side, one per thread (moe.cpp; false: one after another,
// each expert's matmuls split across the threads).
bool g_moe_parallel = true;
bool g_release_teams = true;    // read by release_threads() (model.cpp)
bool g_attn_first_tile = true;  // decode attention asks for key tile 0 up front
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

Level best_level() { return detect(); }
Level level() { return g_level; }
void set_level(Level l) { g_level = int(l) <= int(best_level()) ? l : best_level(); }

const char* level_name(Level l) {
  return l == Level::AVX512BF16 ? "avx512bf16" : l == Level::AVX512 ? "avx512" : l == Level::AVX2 ? "avx2" : "scalar";
}

}  // namespace kernels
}  // namespace strata
