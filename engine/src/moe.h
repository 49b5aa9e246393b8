// Qwen3-Next MLPs, fp32: the dense SwiGLU MLP and the sparse MoE block (router softmax in fp32, top-k,
// optional renormalisation, shared expert scaled by sigmoid(x . w_sg)).
#pragma once
#include <cstddef>
#include <vector>

namespace strata::next {

struct MlpWeights {
  const float* gate = nullptr;  // [I, D]
  const float* up = nullptr;    // [I, D]
  const float* down = nullptr;  // [D, I]
  int I = 0;
};

struct MoeWeights {
  const float* router = nullptr;       // [E, D]
  std::vector<MlpWeights> experts;     // E experts of moe_intermediate_size
  MlpWeights shared;                   // shared expert
  const float* shared_gate = nullptr;  // [1, D]
  int top_k = 1;
  bool norm_topk_prob = true;
};

// out[T, D] = down(silu(gate(x)) * up(x)).
void mlp_forward(int D, const MlpWeights& w, const float* x, int T, float* out);

// out[T, D] = MoE(x). If `picked` is given it receives the chosen expert ids [T, top_k] (tests, stats).
void moe_forward(int D, const MoeWeights& w, const float* x, int T, float* out,
                 std::vector<int>* picked = nullptr);

}  // namespace strata::next
