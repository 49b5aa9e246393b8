// The CUDA backend's interface: a table of plain C functions that libstrata_cuda.so (built by nvcc, the CUDA
// runtime linked in statically) exports through one symbol, strata_cuda_api. The extension strata_lab._engine
// never links CUDA: engine/src/qwen3_cuda.cpp dlopens the library the first time an engine is loaded with
// device="cuda", so `import strata_lab._engine` works on a machine without a GPU driver, and a build without
// nvcc has the same extension minus the library. Only C types cross the boundary (no exceptions, no STL):
// every call that can fail returns 0, or -1 with a one-line message in err.
//
// What runs on the GPU (docs/ENGINE.md "GPU"): the dense Qwen3 forward with bf16 weights, fp32 activations
// between the ops (the residual stream, q/k/v, the MLP's gate and up) rounded to bf16 at each matmul's input,
// matmuls on tensor cores (WMMA bf16 in, fp32 accumulate), and a bf16 KV cache per session, contiguous,
// [2 (K, V)][layer][kv head][capacity][head_dim].
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define STRATA_CUDA_ABI 1

// Sizes of a Qwen3 dense model (config.json); hidden, intermediate and head_dim multiples of 16 (the
// tensor-core tiles), head_dim <= 256.
typedef struct StrataCudaShape {
  int64_t vocab, hidden, layers, heads, kv_heads, head_dim, inter;
  float eps;
} StrataCudaShape;

// The tensors model_upload() takes: matrices as bf16 rows [rows, cols] in the model folder's layout ([out, in]),
// norm weights as fp32 (the CPU engine's values, so both engines scale by the same numbers). Q/K/V land in one
// fused [(H + 2 Hkv) hd, D] matrix and GATE/UP in one [2 I, D] matrix per layer (one matmul each).
enum StrataCudaTensor {
  STRATA_CUDA_EMBED = 0,   // [V, D] (layer ignored)
  STRATA_CUDA_LM_HEAD,     // [V, D] (layer ignored; a tied model uploads the embedding again)
  STRATA_CUDA_FINAL_NORM,  // [D]
  STRATA_CUDA_INPUT_NORM,  // [D]
  STRATA_CUDA_POST_NORM,   // [D]
  STRATA_CUDA_Q_NORM,      // [hd]
  STRATA_CUDA_K_NORM,      // [hd]
  STRATA_CUDA_WQ,          // [H hd, D]
  STRATA_CUDA_WK,          // [Hkv hd, D]
  STRATA_CUDA_WV,          // [Hkv hd, D]
  STRATA_CUDA_WO,          // [D, H hd]
  STRATA_CUDA_W_GATE,      // [I, D]
  STRATA_CUDA_W_UP,        // [I, D]
  STRATA_CUDA_W_DOWN,      // [D, I]
  STRATA_CUDA_TENSORS
};

typedef struct StrataCudaModel StrataCudaModel;  // weights and activation buffers on the device
typedef struct StrataCudaCache StrataCudaCache;  // one session's KV cache on the device

// logits_mode of forward(): what it writes to the host buffer
enum { STRATA_CUDA_LOGITS_NONE = 0, STRATA_CUDA_LOGITS_LAST = 1, STRATA_CUDA_LOGITS_ALL = 2 };

typedef struct StrataCudaApi {
  int abi;  // STRATA_CUDA_ABI
  // The first CUDA device: its name and memory (bytes); fails when no device or driver is usable.
  int (*probe)(char* name, size_t name_len, int64_t* total_bytes, char* err, size_t err_len);
  // inv_freq: head_dim / 2 floats (the host computes them as the CPU engine does).
  int (*model_create)(const StrataCudaShape* shape, const float* inv_freq, StrataCudaModel** out, char* err,
                      size_t err_len);
  // data: uint16_t bf16 bits for a matrix, float for a norm (cols == 1 for a norm); shapes are checked.
  int (*model_upload)(StrataCudaModel* m, int layer, int tensor, const void* data, int64_t rows, int64_t cols,
                      char* err, size_t err_len);
  int64_t (*model_bytes)(const StrataCudaModel* m);  // device bytes of the weights
  void (*model_free)(StrataCudaModel* m);
  int (*cache_create)(StrataCudaModel* m, StrataCudaCache** out, char* err, size_t err_len);
  void (*cache_free)(StrataCudaCache* c);
  int64_t (*cache_bytes)(const StrataCudaCache* c);   // device bytes held
  int64_t (*cache_length)(const StrataCudaCache* c);  // positions held
  void (*cache_truncate)(StrataCudaCache* c, int64_t n);  // keep the first n positions (n <= length)
  void (*cache_reset)(StrataCudaCache* c);                // length 0, device memory freed
  // Reads tokens[0..n) at positions length .. length + n - 1 of c; logits (host, fp32): nothing, [1, V] after
  // the last token, or [n, V]. Calls on one model are serialised by the caller.
  int (*forward)(StrataCudaModel* m, StrataCudaCache* c, const int32_t* tokens, int64_t n, int logits_mode,
                 float* logits, char* err, size_t err_len);
  // One token for each of B distinct caches (a batched decode step); logits[b] gets its V logits.
  int (*forward_batch)(StrataCudaModel* m, StrataCudaCache* const* caches, const int32_t* tokens, int64_t B,
                       float* const* logits, char* err, size_t err_len);
} StrataCudaApi;

// The one exported symbol: the table, or NULL when abi differs from the library's.
const StrataCudaApi* strata_cuda_api(int abi);

#ifdef __cplusplus
}
#endif
