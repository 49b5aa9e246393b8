// Scalar activations of the Qwen3-Next layers (gdn, gated_attention, moe) that the core kernels
// (strata/kernels.h) do not cover. Everything vectorised (matmul, norms, RoPE, attention) is in kernels.
#pragma once
#include <cmath>

namespace strata::next {

inline float sigmoidf(float x) { return 1.f / (1.f + std::exp(-x)); }
inline float siluf(float x) { return x / (1.f + std::exp(-x)); }
// torch.nn.functional.softplus with beta=1, threshold=20
inline float softplusf(float x) { return x > 20.f ? x : std::log1p(std::exp(x)); }

}  // namespace strata::next
