// Compute kernels shared by every model: matmul against f32/f16/bf16/int8 (row-scaled) weights, norms, RoPE, attention.
// Vector code is chosen at run time (AVX-512 BF16, AVX-512, AVX2+FMA+F16C, or scalar); builds stay portable.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "strata/model_folder.h"

namespace strata {
namespace kernels {

// AVX512BF16 = AVX512 plus vdpbf16ps: bf16 weights then meet bf16-rounded activations (2x the MACs of
// f32 FMAs); f32/f16 weights run exactly as at AVX512.
enum class Level : int { Scalar = 0, AVX2 = 1, AVX512 = 2, AVX512BF16 = 3 };
Level best_level();            // what this CPU supports
Level level();                 // what is in use
void set_level(Level l);       // force a lower level (tests); clamped to best_level()
const char* level_name(Level l);
// Runtime switches (set_option / option; Python: _engine._set_kernel_option / _kernel_option). Unknown
// names throw. Every one that stays keeps a path that is a reference or a choice, not a measured loser:
//
// | name         | default | on                                          | off (kept because)                            |
// |--------------|---------|---------------------------------------------|-----------------------------------------------|
// | int8_dot     | on      | int8 weights x activations quantised to     | weights widened to f32 against f32            |
// |              |         | int8 per token in blocks of 32              | activations: the accuracy reference of int8   |
// | attn_tiled   | on      | AVX2 attention tiled with an online softmax | the per-query scalar loop: test reference     |
// | attn_decode  | on      | AVX2 decode attention streams the cache,    | one task per kv head, same bits (x1.35 slower |
// |              |         | a thread per contiguous run of kv heads     | at 16K; engine.py --decode-ab reports both)   |
// | gdn_matrix   | on      | GDN chunked prefill in matrix form          | the row-loop form: test reference;            |
// |              |         |                                             | STRATA_GDN_SCALAR=1 starts a process with off |
// | moe_parallel | on      | MoE active experts side by side, one per    | one after another, each split across threads  |
// |              |         | thread                                      | (better with more threads than experts)       |
// | kv_f16       | off     | kv_cache "auto" engines loaded from then on | "auto" decides from the weights (a policy     |
// |              |         | hold f16 whatever the weights               | override, not an A/B)                         |
//
// Deleted with their losing paths, the kept side in parentheses (numbers: benchmarks/results/history.md,
// "Kernel switches"):
// linear_prefetch, attn_pf_lines, attn_first_tile, release_teams; decode_seq (AVX512BF16 bf16 decode reads
// rows in memory order), decode_pool (OpenMP), bf16_eo (AVX2 even/odd bf16), decode_rows8 (4 rows per
// one-token call at AVX2), decode_runs (a contiguous run of chunks per thread).
void set_option(const std::string& name, bool on);
bool option(const std::string& name);

float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);  // round to nearest even
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);                                   // round to nearest even (IEEE binary16)
void f32_to_f16_rows(const float* x, uint16_t* out, int64_t n);  // n values

// out[cols] = row r of w as float32.
void row_f32(const Mat& w, int64_t r, float* out);
// y[n, w.rows] = x[n, w.cols] @ w^T. n <= 8 streams rows once for all n tokens (decode, and a batched
// decode step of several sessions: memory-bound); larger n runs a
// blocked GEMM (prefill, compute-bound): over rows converted once to f32, or, for bf16 weights at level
// AVX512BF16, straight over the bf16 rows with x rounded to bf16; int8 weights (option int8_dot) against
// x quantised per token in blocks of 32, integer block dots. OpenMP over rows. Every path gives a token
// the same bits whatever n is.
void matmul(const Mat& w, const float* x, int64_t n, float* y);
// Several matrices with the same input width over the same x: outs[i].y = x @ outs[i].w^T. Decode runs
// them in one parallel region (one barrier instead of `count`); results are the bits matmul() gives.
struct MatOut {
  const Mat* w;
  float* y;
};
void matmul_multi(const MatOut* outs, int count, const float* x, int64_t n);
// Best GB/s of `reps` read passes over `bytes` with the current OpenMP threads (the decode bandwidth limit):
// a buffer on transparent huge pages as the weights are, one untimed pass before the timed ones.
double read_bandwidth(int64_t bytes, int reps);
// int8 weights with one f32 scale per row (absmax / 127, round to nearest): q [rows, cols], scale [rows].
void quantize_rows_int8(const Mat& w, int8_t* q, float* scale);

// y[d] = w * x * rsqrt(mean(x^2) + eps); y may alias x. w may be nullptr (w = 1).
void rmsnorm(const float* x, const float* w, int64_t d, float eps, float* y);
// Same, with the Qwen3-Next (1 + w) convention.
void rmsnorm_1p(const float* x, const float* w, int64_t d, float eps, float* y);
// inv_freq[j] = 1 / theta^(2j/rd), j < rd/2, rounded to float32 as transformers does.
std::vector<float> rope_inv_freq(double theta, int rd);
// Rotate-half RoPE on the first rd dims of each of n_heads vectors of size hd at position pos.
void rope(float* x, int n_heads, int hd, int rd, int64_t pos, const float* inv_freq);
void silu_mul(float* g, const float* u, int64_t n);  // g = silu(g) * u
void add(float* y, const float* x, int64_t n);       // y += x
float dot(const float* a, const float* b, int64_t n);
// One-thread f32 GEMM for small blocks (callers parallelise around it): C[M, N] = A @ B, or C += A @ B
// with accumulate. A element (i, p) is A[i * ars + p * acs] (ars = lda, acs = 1 for row-major A; ars = 1,
// acs = ld for a transposed one); B [K, N] and C row-major with leading dims ldb, ldc. lower: A is lower
// triangular with zeros stored above the diagonal; the product then skips the all-zero blocks.
void gemm_f32(int64_t M, int64_t N, int64_t K, const float* A, int64_t ars, int64_t acs, const float* B,
              int64_t ldb, float* C, int64_t ldc, bool accumulate = false, bool lower = false);
void axpy(float a, const float* x, float* y, int64_t n);  // y += a * x

// Causal GQA attention for n queries at positions pos0..pos0+n-1.
// q: [n, H, hd]; k, v: [pos0 + n, Hkv, hd] (the cache, this chunk included); out: [n, H, hd].
// Query head h uses kv head h / (H / Hkv). Scores are scaled by 1/sqrt(hd); softmax in float32.
void attention(const float* q, int64_t n, int H, int Hkv, int hd, const float* k, const float* v,
               int64_t pos0, float* out);
// The same with an f16 cache (AttentionKV::half()): the AVX2 tiled kernel widens each key tile as it packs
// it (prefill) or in registers as it reads it (decode), the same values either way; other levels widen the
// whole cache first.
void attention_f16(const float* q, int64_t n, int H, int Hkv, int hd, const uint16_t* k, const uint16_t* v,
                   int64_t pos0, float* out);
// The same with a q8 cache (AttentionKV::q8()): kv head by kv head, cap pages of kQ8Page positions each (at least
// ceil((pos0 + n) / kQ8Page)), a kv head's part of a page one run of K (the keys in the lanes), V (in pairs of
// positions) and their f16 scales, one per 32 values, as state.h lays them out. The AVX2 tiled kernel (every vector level)
// quantises each query row the same way
// (quantize_q8_rows), scores with exact int8 block dots times dq * dk, and weighs V (widened in registers) by
// p * dv; it reads the cache in place with the same per-row arithmetic in prefill and decode, so decode keeps
// the bits the full forward gives a position. The scalar level widens the quantised q and the cache first.
void attention_q8(const float* q, int64_t n, int H, int Hkv, int hd, const int8_t* cache, int64_t cap, int64_t pos0,
                  float* out);
// A q8 cache held row by row (k, v [T, Hkv, hd] int8, ks, vs [T, Hkv, hd / 32], as quantize_q8_rows gives them)
// into attention_q8's pages, cap = ceil(T / kQ8Page) a kv head: out, Hkv * cap * q8_run_bytes(hd) bytes (positions
// past T zero).
void q8_to_pages(const int8_t* k, const float* ks, const int8_t* v, const float* vs, int64_t T, int Hkv, int hd,
                 int8_t* out);
// x [n] (n % 32 == 0) to q8 blocks of 32, llama.cpp's q8_0: d = absmax / 127 (f32), values round(x * (1 / d))
// (nearest, ties away from zero, clipped to +-127), and the scale held in f16: scale = d rounded to f16 (nearest
// even), given back as an f32; an all-zero block gets 0 and zeros. (A block whose d is past f16's range, absmax
// > 127 * 65504, gets f16's largest finite scale instead of an infinity.)
void quantize_q8_rows(const float* x, int8_t* q, float* scale, int64_t n);

}  // namespace kernels
}  // namespace strata
