// Qwen3 dense on the GPU (Engine.load(..., device="cuda")): the Model face of the CUDA backend
// (engine/cuda/strata_cuda.h). Compiled in every build: it holds no CUDA code and loads the backend library,
// libstrata_cuda.so beside the extension (or STRATA_CUDA_LIBRARY), with dlopen at the first CUDA load, so a
// build without nvcc or a machine without a GPU driver imports the extension as before and says why at load.
// Sessions, Contract 1's reuse, the step thread's batched decode and sampling are the CPU engine's: a session's
// state is one LayerState holding its KV cache on the device (cut back to any prefix for free), and logits are
// copied to the host, where the existing sampler picks the next id.
#pragma once
#include <memory>

#include "strata/model.h"
#include "strata/model_folder.h"

namespace strata {

// Throws std::runtime_error naming device='cuda' when the backend library is missing, no usable GPU is
// visible, or the shape is one the kernels do not take (hidden, intermediate, head_dim multiples of 16).
std::unique_ptr<Model> load_qwen3_cuda(std::unique_ptr<ModelFolder> ckpt, const LoadOptions& opts);

}  // namespace strata
