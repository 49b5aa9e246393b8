// The dense Qwen3 forward on the GPU (docs/ENGINE.md "GPU"), behind the C table of strata_cuda.h: weights,
// activation buffers, per-session KV caches, and the per-row ops (embedding, RMSNorm, q/k norm + RoPE + cache
// write, SwiGLU). The matmuls and attention are kernels.cuh's. One stream per model; every call ends with a
// stream synchronisation (errors surface in the call that caused them, logits are on the host).
//
// Per layer, for the n rows of a read (docs/ENGINE.md "Math"):
//   xn = bf16(rmsnorm(h))                    h: fp32 [n, D], the residual stream
//   qkv = xn @ Wqkv^T                        fp32 [n, (H + 2 Hkv) hd]: q | k | v per row
//   q, k = rope(rmsnorm_head(q, k)); k, v -> the cache (bf16) at the rows' positions
//   att = attention(q, cache)                bf16 [n, H hd]
//   h += att @ Wo^T;  xn = bf16(rmsnorm(h));  gu = xn @ [Wgate; Wup]^T   fp32 [n, 2 I]
//   act = bf16(silu(gate) * up);  h += act @ Wdown^T
// then logits = bf16(rmsnorm_final(h)) @ lm_head^T (fp32, copied to the host).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "kernels.cuh"
#include "strata_cuda.h"

using strata_cuda::bf16;
using strata_cuda::round_up;

namespace {

constexpr int64_t kRowsMax = 512;   // token rows per pass (the session's prefill chunk); a longer read loops
constexpr int64_t kRowsPad = kRowsMax + 16;  // + the rows a 16-row matmul tile reads past the last
constexpr int64_t kLogitRows = 64;  // lm_head rows per pass when every position's logits are asked for

int fail(char* err, size_t len, const std::string& msg) {
  if (err && len) std::snprintf(err, len, "%s", msg.c_str());
  return -1;
}
int fail_cuda(char* err, size_t len, const char* what, cudaError_t e) {
  return fail(err, len, std::string(what) + ": " + cudaGetErrorString(e));
}
#define CK(call, what)                                                \
  do {                                                                \
    const cudaError_t e_ = (call);                                    \
    if (e_ != cudaSuccess) return fail_cuda(err, err_len, what, e_);  \
  } while (0)

// ------------------------------------------------------------------ per-row kernels

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// h[t] = embed[tokens[t]] (fp32). grid n, block 256.
__global__ void embed_kernel(const int32_t* __restrict__ tokens, const bf16* __restrict__ embed, int D,
                             float* __restrict__ h) {
  const bf16* row = embed + int64_t(tokens[blockIdx.x]) * D;
  for (int d = threadIdx.x; d < D; d += blockDim.x) h[int64_t(blockIdx.x) * D + d] = __bfloat162float(row[d]);
}

// y[t] = bf16(w * (x[t] * rsqrt(mean(x[t]^2) + eps))) (Qwen3's plain-w RMSNorm). grid n, block 256.
__global__ void rmsnorm_kernel(const float* __restrict__ x, const float* __restrict__ w, int D, float eps,
                               bf16* __restrict__ y) {
  __shared__ float red[8];
  const float* xr = x + int64_t(blockIdx.x) * D;
  float ss = 0.f;
  for (int d = threadIdx.x; d < D; d += blockDim.x) ss += xr[d] * xr[d];
  ss = warp_sum(ss);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = ss;
  __syncthreads();
  float total = 0.f;
  for (int i = 0; i < int(blockDim.x / 32); ++i) total += red[i];  // every thread, same order
  const float inv = rsqrtf(total / float(D) + eps);
  for (int d = threadIdx.x; d < D; d += blockDim.x) y[int64_t(blockIdx.x) * D + d] = __float2bfloat16(w[d] * (xr[d] * inv));
}

// Per row t and head: q heads get q_norm and RoPE in place (fp32); k heads k_norm and RoPE, v heads as they
// are, both written to the cache (bf16) at position pos0 + t. grid (n, ceil((H + 2 Hkv) / 4)), block 128:
// a warp per head, shared memory [4][hd] floats.
__global__ void qkv_prepare_kernel(float* __restrict__ qkv, int ldq, int H, int Hkv, int hd,
                                   const float* __restrict__ q_norm, const float* __restrict__ k_norm,
                                   const float* __restrict__ inv_freq, float eps, int64_t pos0, bf16* __restrict__ kc,
                                   bf16* __restrict__ vc, int64_t cap) {
  extern __shared__ float buf[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, hi = blockIdx.y * 4 + warp;
  if (hi >= H + 2 * Hkv) return;
  float* x = qkv + int64_t(blockIdx.x) * ldq + int64_t(hi) * hd;  // the row is q heads | k heads | v heads
  const int64_t pos = pos0 + blockIdx.x;
  if (hi >= H + Hkv) {
    bf16* dst = vc + (int64_t(hi - H - Hkv) * cap + pos) * hd;
    for (int d = lane; d < hd; d += 32) dst[d] = __float2bfloat16(x[d]);
    return;
  }
  const bool is_q = hi < H;
  const float* w = is_q ? q_norm : k_norm;
  float ss = 0.f;
  for (int d = lane; d < hd; d += 32) ss += x[d] * x[d];
  const float inv = rsqrtf(warp_sum(ss) / float(hd) + eps);
  float* b = buf + warp * hd;
  for (int d = lane; d < hd; d += 32) b[d] = w[d] * (x[d] * inv);
  __syncwarp();
  const int half = hd / 2;
  bf16* kdst = is_q ? nullptr : kc + (int64_t(hi - H) * cap + pos) * hd;
  for (int j = lane; j < half; j += 32) {
    float sn, cs;
    sincosf(float(pos) * inv_freq[j], &sn, &cs);
    const float x1 = b[j], x2 = b[j + half];
    const float o1 = x1 * cs - x2 * sn, o2 = x2 * cs + x1 * sn;
    if (is_q) {
      x[j] = o1;
      x[j + half] = o2;
    } else {
      kdst[j] = __float2bfloat16(o1);
      kdst[j + half] = __float2bfloat16(o2);
    }
  }
}

// act[t, i] = bf16(silu(gu[t, i]) * gu[t, I + i]).
__global__ void silu_mul_kernel(const float* __restrict__ gu, int I, int64_t total, bf16* __restrict__ act) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int64_t t = idx / I, i = idx % I;
  const float g = gu[t * 2 * I + i], u = gu[t * 2 * I + I + i];
  act[idx] = __float2bfloat16(g / (1.0f + expf(-g)) * u);
}

}  // namespace

// ------------------------------------------------------------------ model and caches

struct StrataCudaModel {
  StrataCudaShape s{};
  int device = 0, sms = 0;
  cudaStream_t stream = nullptr;
  int64_t qkv_rows = 0, vocab_pad = 0;
  struct Layer {
    float *in_norm = nullptr, *post_norm = nullptr, *q_norm = nullptr, *k_norm = nullptr;
    bf16 *wqkv = nullptr, *wo = nullptr, *wgu = nullptr, *wdown = nullptr;  // [(H + 2 Hkv) hd, D], [D, H hd], [2 I, D], [D, I]
  };
  std::vector<Layer> layers;
  bf16 *embed = nullptr, *lm_head = nullptr;  // [vocab_pad, D] each; lm_head == embed when tied
  float *final_norm = nullptr, *inv_freq = nullptr;
  // activations for up to kRowsMax rows (+ the padding rows a matmul tile reads)
  float *h = nullptr, *qkv = nullptr, *gu = nullptr, *logits = nullptr, *gemm_work = nullptr, *attn_work = nullptr;
  bf16 *xn = nullptr, *att = nullptr, *act = nullptr;
  int32_t* tokens = nullptr;
  std::vector<void*> allocs;  // everything above, freed together
  int64_t weight_bytes = 0;
};

struct StrataCudaCache {
  StrataCudaModel* m = nullptr;
  bf16* kv = nullptr;  // [2 (K, V)][layer][kv head][cap][hd]
  int64_t cap = 0, length = 0;
};

namespace {

template <class T>
int device_alloc(StrataCudaModel* m, T** p, int64_t count, bool weight, char* err, size_t err_len) {
  const size_t bytes = size_t(count) * sizeof(T);
  void* mem = nullptr;
  const cudaError_t e = cudaMalloc(&mem, bytes);
  if (e != cudaSuccess)
    return fail(err, err_len, "cudaMalloc of " + std::to_string(bytes) + " bytes: " + cudaGetErrorString(e));
  m->allocs.push_back(mem);
  CK(cudaMemset(mem, 0, bytes), "cudaMemset");  // padding rows of weights are zero
  *p = static_cast<T*>(mem);
  if (weight) m->weight_bytes += int64_t(bytes);
  return 0;
}

bf16* cache_k(const StrataCudaCache* c, int64_t layer) {
  const StrataCudaShape& s = c->m->s;
  return c->kv + layer * s.kv_heads * c->cap * s.head_dim;
}
bf16* cache_v(const StrataCudaCache* c, int64_t layer) {
  const StrataCudaShape& s = c->m->s;
  return c->kv + (s.layers + layer) * s.kv_heads * c->cap * s.head_dim;
}

// Room for need positions: a larger array (x1.5, whole 64-position pages), the held positions copied over.
int cache_reserve(StrataCudaCache* c, int64_t need, char* err, size_t err_len) {
  if (need <= c->cap) return 0;
  StrataCudaModel* m = c->m;
  const int64_t cap = round_up(std::max({need, c->cap * 3 / 2, int64_t(256)}), 64);
  const int64_t rows = 2 * m->s.layers * m->s.kv_heads, hd = m->s.head_dim;
  void* kv = nullptr;
  const size_t bytes = size_t(rows * cap * hd) * sizeof(bf16);
  const cudaError_t e = cudaMalloc(&kv, bytes);
  if (e != cudaSuccess)
    return fail(err, err_len, "cudaMalloc of the KV cache (" + std::to_string(cap) + " positions, " +
                                  std::to_string(bytes) + " bytes): " + cudaGetErrorString(e));
  if (c->length > 0) {
    const cudaError_t e2 = cudaMemcpy2DAsync(kv, size_t(cap * hd) * sizeof(bf16), c->kv, size_t(c->cap * hd) * sizeof(bf16),
                                             size_t(c->length * hd) * sizeof(bf16), size_t(rows),
                                             cudaMemcpyDeviceToDevice, m->stream);
    const cudaError_t e3 = e2 == cudaSuccess ? cudaStreamSynchronize(m->stream) : e2;
    if (e3 != cudaSuccess) {
      cudaFree(kv);
      return fail_cuda(err, err_len, "copying the KV cache", e3);
    }
  }
  if (c->kv) cudaFree(c->kv);
  c->kv = static_cast<bf16*>(kv);
  c->cap = cap;
  return 0;
}

// One sequence's rows in a pass: rows [row0, row0 + n) of the activations, read at positions pos0 ...
struct Seq {
  StrataCudaCache* c;
  int64_t pos0;
  int row0, n;
};

// Every layer over the pass's rows (tokens already in m->tokens); each sequence's cache holds its new positions.
int run_layers(StrataCudaModel* m, const Seq* seqs, int nseq, int rows, char* err, size_t err_len) {
  const StrataCudaShape& s = m->s;
  const int D = int(s.hidden), H = int(s.heads), Hkv = int(s.kv_heads), hd = int(s.head_dim), I = int(s.inter);
  const int ldq = int(m->qkv_rows);
  cudaStream_t st = m->stream;
  using strata_cuda::gemm_bf16;
  embed_kernel<<<rows, 256, 0, st>>>(m->tokens, m->embed, D, m->h);
  for (int64_t li = 0; li < s.layers; ++li) {
    const StrataCudaModel::Layer& ly = m->layers[size_t(li)];
    rmsnorm_kernel<<<rows, 256, 0, st>>>(m->h, ly.in_norm, D, s.eps, m->xn);
    gemm_bf16(m->xn, ly.wqkv, m->qkv, rows, ldq, D, ldq, false, m->gemm_work, st);
    for (int i = 0; i < nseq; ++i) {
      const Seq& q = seqs[i];
      float* qrow = m->qkv + int64_t(q.row0) * ldq;
      const dim3 grid(unsigned(q.n), unsigned((H + 2 * Hkv + 3) / 4));
      qkv_prepare_kernel<<<grid, 128, 4 * hd * sizeof(float), st>>>(qrow, ldq, H, Hkv, hd, ly.q_norm, ly.k_norm,
                                                                   m->inv_freq, s.eps, q.pos0, cache_k(q.c, li),
                                                                   cache_v(q.c, li), q.c->cap);
      strata_cuda::attention(qrow, ldq, q.n, H, Hkv, hd, cache_k(q.c, li), cache_v(q.c, li), q.c->cap, q.pos0,
                             m->att + int64_t(q.row0) * H * hd, m->attn_work, m->sms, st);
    }
    gemm_bf16(m->att, ly.wo, m->h, rows, D, H * hd, D, true, m->gemm_work, st);
    rmsnorm_kernel<<<rows, 256, 0, st>>>(m->h, ly.post_norm, D, s.eps, m->xn);
    gemm_bf16(m->xn, ly.wgu, m->gu, rows, 2 * I, D, 2 * I, false, m->gemm_work, st);
    const int64_t total = int64_t(rows) * I;
    silu_mul_kernel<<<unsigned((total + 255) / 256), 256, 0, st>>>(m->gu, I, total, m->act);
    gemm_bf16(m->act, ly.wdown, m->h, rows, D, I, D, true, m->gemm_work, st);
  }
  CK(cudaGetLastError(), "a kernel launch");
  return 0;
}

// logits of rows [row0, row0 + count) of h (count <= kLogitRows) to the host, V floats per row at dst[i].
int logits_to_host(StrataCudaModel* m, int row0, int count, float* const* dst, char* err, size_t err_len) {
  const StrataCudaShape& s = m->s;
  const int D = int(s.hidden), V = int(s.vocab);
  rmsnorm_kernel<<<count, 256, 0, m->stream>>>(m->h + int64_t(row0) * D, m->final_norm, D, s.eps, m->xn);
  strata_cuda::gemm_bf16(m->xn, m->lm_head, m->logits, count, V, D, V, false, m->gemm_work, m->stream);
  CK(cudaGetLastError(), "a kernel launch");
  for (int i = 0; i < count; ++i)
    CK(cudaMemcpyAsync(dst[i], m->logits + int64_t(i) * V, size_t(V) * sizeof(float), cudaMemcpyDeviceToHost,
                       m->stream),
       "copying logits");
  CK(cudaStreamSynchronize(m->stream), "the forward");
  return 0;
}

// ------------------------------------------------------------------ the C table

int api_probe(char* name, size_t name_len, int64_t* total_bytes, char* err, size_t err_len) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess)  // no driver at all reads "driver version is insufficient" too
    return fail(err, err_len, std::string("no usable CUDA GPU (no NVIDIA driver, or one older than this CUDA "
                                          "runtime; cudaGetDeviceCount: ") + cudaGetErrorString(e) + ")");
  if (count == 0) return fail(err, err_len, "no CUDA GPU is visible");
  cudaDeviceProp p{};
  CK(cudaGetDeviceProperties(&p, 0), "cudaGetDeviceProperties");
  if (p.major < 8)
    return fail(err, err_len, std::string(p.name) + " has compute capability " + std::to_string(p.major) + "." +
                                  std::to_string(p.minor) + "; the CUDA backend needs 8.0 or newer (bf16 tensor cores)");
  if (name && name_len) std::snprintf(name, name_len, "%s", p.name);
  if (total_bytes) *total_bytes = int64_t(p.totalGlobalMem);
  return 0;
}

void api_model_free(StrataCudaModel* m) {
  if (!m) return;
  cudaSetDevice(m->device);
  for (void* p : m->allocs) cudaFree(p);
  if (m->stream) cudaStreamDestroy(m->stream);
  delete m;
}

int model_alloc(StrataCudaModel* m, const float* inv_freq, char* err, size_t err_len) {
  const StrataCudaShape& s = m->s;
  const int64_t D = s.hidden, H = s.heads, Hkv = s.kv_heads, hd = s.head_dim, I = s.inter;
  CK(cudaSetDevice(m->device), "cudaSetDevice");
  CK(cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking), "cudaStreamCreate");
  cudaDeviceProp p{};
  CK(cudaGetDeviceProperties(&p, m->device), "cudaGetDeviceProperties");
  m->sms = p.multiProcessorCount;
  m->qkv_rows = (H + 2 * Hkv) * hd;
  m->vocab_pad = round_up(s.vocab, 16);
  m->layers.resize(size_t(s.layers));
  for (auto& ly : m->layers) {
    if (device_alloc(m, &ly.in_norm, D, true, err, err_len) || device_alloc(m, &ly.post_norm, D, true, err, err_len) ||
        device_alloc(m, &ly.q_norm, hd, true, err, err_len) || device_alloc(m, &ly.k_norm, hd, true, err, err_len) ||
        device_alloc(m, &ly.wqkv, m->qkv_rows * D, true, err, err_len) ||
        device_alloc(m, &ly.wo, D * H * hd, true, err, err_len) ||
        device_alloc(m, &ly.wgu, 2 * I * D, true, err, err_len) || device_alloc(m, &ly.wdown, D * I, true, err, err_len))
      return -1;
  }
  if (device_alloc(m, &m->embed, m->vocab_pad * D, true, err, err_len) ||
      device_alloc(m, &m->final_norm, D, true, err, err_len) || device_alloc(m, &m->inv_freq, hd / 2, false, err, err_len))
    return -1;
  m->lm_head = m->embed;  // until an untied lm_head is uploaded
  CK(cudaMemcpy(m->inv_freq, inv_freq, size_t(hd / 2) * sizeof(float), cudaMemcpyHostToDevice), "uploading inv_freq");
  // the matmuls' split-K partials: the largest splits x rows x N over the model's matrices
  const int64_t shapes[5][3] = {{m->qkv_rows, D, kRowsMax}, {D, H * hd, kRowsMax}, {2 * I, D, kRowsMax},
                                {D, I, kRowsMax}, {s.vocab, D, kLogitRows}};
  int64_t work = 1;
  for (const auto& sh : shapes) {
    const int splits = strata_cuda::gemm_splits(sh[0], sh[1]);
    if (splits > 1) work = std::max(work, splits * sh[2] * sh[0]);
  }
  if (device_alloc(m, &m->h, kRowsPad * D, false, err, err_len) ||
      device_alloc(m, &m->xn, kRowsPad * D, false, err, err_len) ||
      device_alloc(m, &m->qkv, kRowsPad * m->qkv_rows, false, err, err_len) ||
      device_alloc(m, &m->att, kRowsPad * H * hd, false, err, err_len) ||
      device_alloc(m, &m->gu, kRowsPad * 2 * I, false, err, err_len) ||
      device_alloc(m, &m->act, kRowsPad * I, false, err, err_len) ||
      device_alloc(m, &m->logits, kLogitRows * s.vocab, false, err, err_len) ||
      device_alloc(m, &m->tokens, kRowsPad, false, err, err_len) ||
      device_alloc(m, &m->gemm_work, work, false, err, err_len) ||
      device_alloc(m, &m->attn_work, strata_cuda::attention_work_floats(H, hd), false, err, err_len))
    return -1;
  return 0;
}

int api_model_create(const StrataCudaShape* shape, const float* inv_freq, StrataCudaModel** out, char* err,
                     size_t err_len) {
  const StrataCudaShape& s = *shape;
  if (s.vocab <= 0 || s.hidden <= 0 || s.layers <= 0 || s.heads <= 0 || s.kv_heads <= 0 || s.inter <= 0 ||
      s.heads % s.kv_heads != 0)
    return fail(err, err_len, "bad model shape");
  if (s.hidden % 16 || s.inter % 16 || s.head_dim % 16 || s.head_dim <= 0 || s.head_dim > 256)
    return fail(err, err_len, "the CUDA backend needs hidden_size, intermediate_size and head_dim multiples of 16 "
                              "and head_dim <= 256 (got " + std::to_string(s.hidden) + ", " + std::to_string(s.inter) +
                              ", " + std::to_string(s.head_dim) + ")");
  auto* m = new StrataCudaModel();
  m->s = s;
  if (model_alloc(m, inv_freq, err, err_len) != 0) {
    api_model_free(m);
    return -1;
  }
  *out = m;
  return 0;
}

int api_model_upload(StrataCudaModel* m, int layer, int tensor, const void* data, int64_t rows, int64_t cols,
                     char* err, size_t err_len) {
  const StrataCudaShape& s = m->s;
  const int64_t D = s.hidden, H = s.heads, Hkv = s.kv_heads, hd = s.head_dim, I = s.inter;
  const bool per_layer = tensor >= STRATA_CUDA_INPUT_NORM;
  if (tensor < 0 || tensor >= STRATA_CUDA_TENSORS) return fail(err, err_len, "unknown tensor " + std::to_string(tensor));
  if (per_layer && (layer < 0 || layer >= s.layers)) return fail(err, err_len, "layer " + std::to_string(layer) + " out of range");
  CK(cudaSetDevice(m->device), "cudaSetDevice");
  StrataCudaModel::Layer* ly = per_layer ? &m->layers[size_t(layer)] : nullptr;
  void* dst = nullptr;
  int64_t want_rows = 0, want_cols = 1;
  size_t elem = sizeof(bf16);
  switch (tensor) {
    case STRATA_CUDA_EMBED: dst = m->embed; want_rows = s.vocab; want_cols = D; break;
    case STRATA_CUDA_LM_HEAD:
      if (!data) {  // tied
        m->lm_head = m->embed;
        return 0;
      }
      if (m->lm_head == m->embed && device_alloc(m, &m->lm_head, m->vocab_pad * D, true, err, err_len)) return -1;
      dst = m->lm_head; want_rows = s.vocab; want_cols = D; break;
    case STRATA_CUDA_FINAL_NORM: dst = m->final_norm; want_rows = D; elem = sizeof(float); break;
    case STRATA_CUDA_INPUT_NORM: dst = ly->in_norm; want_rows = D; elem = sizeof(float); break;
    case STRATA_CUDA_POST_NORM: dst = ly->post_norm; want_rows = D; elem = sizeof(float); break;
    case STRATA_CUDA_Q_NORM: dst = ly->q_norm; want_rows = hd; elem = sizeof(float); break;
    case STRATA_CUDA_K_NORM: dst = ly->k_norm; want_rows = hd; elem = sizeof(float); break;
    case STRATA_CUDA_WQ: dst = ly->wqkv; want_rows = H * hd; want_cols = D; break;
    case STRATA_CUDA_WK: dst = ly->wqkv + H * hd * D; want_rows = Hkv * hd; want_cols = D; break;
    case STRATA_CUDA_WV: dst = ly->wqkv + (H + Hkv) * hd * D; want_rows = Hkv * hd; want_cols = D; break;
    case STRATA_CUDA_WO: dst = ly->wo; want_rows = D; want_cols = H * hd; break;
    case STRATA_CUDA_W_GATE: dst = ly->wgu; want_rows = I; want_cols = D; break;
    case STRATA_CUDA_W_UP: dst = ly->wgu + I * D; want_rows = I; want_cols = D; break;
    case STRATA_CUDA_W_DOWN: dst = ly->wdown; want_rows = D; want_cols = I; break;
  }
  if (rows != want_rows || cols != want_cols)
    return fail(err, err_len, "tensor " + std::to_string(tensor) + ": shape [" + std::to_string(rows) + ", " +
                                  std::to_string(cols) + "], expected [" + std::to_string(want_rows) + ", " +
                                  std::to_string(want_cols) + "]");
  CK(cudaMemcpy(dst, data, size_t(rows * cols) * elem, cudaMemcpyHostToDevice), "uploading weights");
  return 0;
}

int64_t api_model_bytes(const StrataCudaModel* m) { return m->weight_bytes; }

int api_cache_create(StrataCudaModel* m, StrataCudaCache** out, char* err, size_t err_len) {
  auto* c = new StrataCudaCache();
  c->m = m;
  *out = c;
  return 0;
}

void api_cache_reset(StrataCudaCache* c) {
  if (c->kv) {
    cudaSetDevice(c->m->device);
    cudaFree(c->kv);
  }
  c->kv = nullptr;
  c->cap = c->length = 0;
}

void api_cache_free(StrataCudaCache* c) {
  if (!c) return;
  api_cache_reset(c);
  delete c;
}

int64_t api_cache_bytes(const StrataCudaCache* c) {
  const StrataCudaShape& s = c->m->s;
  return 2 * s.layers * s.kv_heads * c->cap * s.head_dim * int64_t(sizeof(bf16));
}
int64_t api_cache_length(const StrataCudaCache* c) { return c->length; }
void api_cache_truncate(StrataCudaCache* c, int64_t n) { c->length = std::max<int64_t>(0, std::min(c->length, n)); }

int api_forward(StrataCudaModel* m, StrataCudaCache* c, const int32_t* tokens, int64_t n, int logits_mode,
                float* logits, char* err, size_t err_len) {
  CK(cudaSetDevice(m->device), "cudaSetDevice");
  if (cache_reserve(c, c->length + n, err, err_len)) return -1;
  const int64_t V = m->s.vocab;
  for (int64_t c0 = 0; c0 < n; c0 += kRowsMax) {
    const int rows = int(std::min(kRowsMax, n - c0));
    CK(cudaMemcpyAsync(m->tokens, tokens + c0, size_t(rows) * sizeof(int32_t), cudaMemcpyHostToDevice, m->stream),
       "copying token ids");
    const Seq seq{c, c->length, 0, rows};
    if (run_layers(m, &seq, 1, rows, err, err_len)) return -1;
    c->length += rows;
    if (logits_mode == STRATA_CUDA_LOGITS_ALL) {
      for (int r0 = 0; r0 < rows; r0 += int(kLogitRows)) {
        const int count = int(std::min<int64_t>(kLogitRows, rows - r0));
        std::vector<float*> dst(static_cast<size_t>(count));
        for (int i = 0; i < count; ++i) dst[size_t(i)] = logits + (c0 + r0 + i) * V;
        if (logits_to_host(m, r0, count, dst.data(), err, err_len)) return -1;
      }
    } else if (logits_mode == STRATA_CUDA_LOGITS_LAST && c0 + rows == n) {
      if (logits_to_host(m, rows - 1, 1, &logits, err, err_len)) return -1;
    }
  }
  CK(cudaStreamSynchronize(m->stream), "the forward");
  return 0;
}

int api_forward_batch(StrataCudaModel* m, StrataCudaCache* const* caches, const int32_t* tokens, int64_t B,
                      float* const* logits, char* err, size_t err_len) {
  if (B > kLogitRows) return fail(err, err_len, "a batch of " + std::to_string(B) + " rows (at most 64)");
  CK(cudaSetDevice(m->device), "cudaSetDevice");
  std::vector<Seq> seqs(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    if (cache_reserve(caches[b], caches[b]->length + 1, err, err_len)) return -1;
    seqs[size_t(b)] = Seq{caches[b], caches[b]->length, int(b), 1};
  }
  CK(cudaMemcpyAsync(m->tokens, tokens, size_t(B) * sizeof(int32_t), cudaMemcpyHostToDevice, m->stream),
     "copying token ids");
  if (run_layers(m, seqs.data(), int(B), int(B), err, err_len)) return -1;
  for (int64_t b = 0; b < B; ++b) caches[b]->length += 1;
  return logits_to_host(m, 0, int(B), logits, err, err_len);
}

const StrataCudaApi kApi = {
    STRATA_CUDA_ABI, api_probe,       api_model_create, api_model_upload,   api_model_bytes, api_model_free,
    api_cache_create, api_cache_free, api_cache_bytes,  api_cache_length,   api_cache_truncate, api_cache_reset,
    api_forward,     api_forward_batch,
};

}  // namespace

extern "C" __attribute__((visibility("default"))) const StrataCudaApi* strata_cuda_api(int abi) {
  return abi == STRATA_CUDA_ABI ? &kApi : nullptr;
}
