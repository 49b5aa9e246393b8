// Qwen3-Next gated full attention, fp32, per ENGINE_SPEC.md: q_proj rows are [H, (q hd | gate hd)]
// interleaved per head; q/k norms use (1 + w); partial RoPE on the first rd = hd * factor dims;
// causal GQA softmax attention; output multiplied by sigmoid(gate) before o_proj.
#pragma once
#include <cstddef>
#include <vector>

namespace strata::next {

struct AttnDims {
  int D = 0, H = 0, Hkv = 0, hd = 0;
  int rd = 0;             // rotary dims (even)
  float theta = 10000.f;  // rope theta
  float eps = 1e-6f;
};

struct AttnWeights {
  const float* q_proj = nullptr;  // [2*H*hd, D]
  const float* k_proj = nullptr;  // [Hkv*hd, D]
  const float* v_proj = nullptr;  // [Hkv*hd, D]
  const float* o_proj = nullptr;  // [D, H*hd]
  const float* q_norm = nullptr;  // [hd]
  const float* k_norm = nullptr;  // [hd]
};

// KV cache, position-major so appending and cutting back are plain resizes (attention rolls back free).
struct KvCache {
  std::vector<float> k, v;  // [pos, Hkv, hd]; k after k_norm and RoPE
  int len(const AttnDims& d) const { return (int)(k.size() / ((size_t)d.Hkv * d.hd)); }
  void truncate(const AttnDims& d, int n) { k.resize((size_t)n * d.Hkv * d.hd); v.resize(k.size()); }
  size_t bytes() const { return (k.size() + v.size()) * sizeof(float); }
};

// out[T, D] for tokens at positions cache.len() .. cache.len()+T-1; appends their K/V to the cache.
void gated_attention_forward(const AttnDims& d, const AttnWeights& w, const float* x, int T, KvCache& cache,
                             float* out);

}  // namespace strata::next
