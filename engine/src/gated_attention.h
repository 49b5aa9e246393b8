// Qwen3-Next gated full attention, per docs/ENGINE.md: q_proj rows are [H, (q hd | gate hd)]
// interleaved per head; q/k norms use (1 + w); partial RoPE on the first rd = hd * factor dims;
// causal GQA softmax attention (kernels::attention); output times sigmoid(gate) before o_proj.
// The KV cache is the core's AttentionKV (cut back to any prefix for free).
#pragma once
#include <cstdint>
#include <vector>

#include "strata/model_folder.h"
#include "strata/state.h"

namespace strata::next {

struct AttnDims {
  int64_t D = 0, H = 0, Hkv = 0, hd = 0;
  int64_t rd = 0;   // rotary dims (even)
  float eps = 1e-6f;
};

struct AttnWeights {
  Mat q_proj;                        // [2*H*hd, D]
  Mat k_proj, v_proj;                // [Hkv*hd, D]
  Mat o_proj;                        // [D, H*hd]
  std::vector<float> q_norm, k_norm; // [hd]
};

// out[T, D] for tokens at positions kv.length() .. kv.length()+T-1; appends their K/V to kv.
// inv_freq: kernels::rope_inv_freq(theta, rd).
void gated_attention_forward(const AttnDims& d, const AttnWeights& w, const float* inv_freq, const float* x,
                             int64_t T, AttentionKV& kv, float* out);

}  // namespace strata::next
