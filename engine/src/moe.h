// Qwen3-Next MLPs: the dense SwiGLU MLP and the sparse MoE block (router softmax in fp32, top-k,
// optional renormalisation, shared expert scaled by sigmoid(x . w_sg)). Weights are views of the model folder.
#pragma once
#include <cstdint>
#include <vector>

#include "strata/model_folder.h"

namespace strata::next {

struct MlpWeights {
  Mat gate, up;   // [I, D]
  Mat down;       // [D, I]
  int64_t I = 0;
};

struct MoeWeights {
  Mat router;                        // [E, D]
  std::vector<MlpWeights> experts;   // E experts of moe_intermediate_size
  MlpWeights shared;                 // shared expert
  std::vector<float> shared_gate;    // [D]
  int64_t top_k = 1;
  bool norm_topk_prob = true;
};

// out[T, D] = down(silu(gate(x)) * up(x)).
void mlp_forward(int64_t D, const MlpWeights& w, const float* x, int64_t T, float* out);

// out[T, D] = MoE(x).
void moe_forward(int64_t D, const MoeWeights& w, const float* x, int64_t T, float* out);

}  // namespace strata::next
