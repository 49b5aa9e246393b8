// Qwen3-Next hybrid (model_type "qwen3_next"), per docs/ENGINE.md: Gated DeltaNet layers (GdnState:
// conv window + fp32 S, cannot roll back) interleaved with gated full-attention layers (AttentionKV),
// each followed by a dense SwiGLU MLP or a MoE block. Weights are zero-copy views of the mmapped
// model folder; mtp.* tensors (multi-token prediction) are ignored. Sessions (session.h) apply Contract 1
// generically through the LayerState interface, so checkpoints and their policies need nothing here.
#pragma once
#include <memory>
#include <vector>

#include "gated_attention.h"
#include "gdn.h"
#include "moe.h"
#include "strata/model_folder.h"
#include "strata/model.h"

namespace strata {

class Qwen3NextModel final : public Model {
 public:
  Qwen3NextModel(std::unique_ptr<ModelFolder> ckpt, const LoadOptions& opts);
  const ModelInfo& info() const override { return info_; }
  std::unique_ptr<SessionState> new_state() const override;
  void forward(const int32_t* tokens, int64_t n, SessionState& state, Logits mode, float* logits) override;
  void forward_batch(const int32_t* tokens, int64_t B, SessionState* const* states, float* const* logits) override;

 private:
  struct Layer {
    bool attn = false, moe = false;
    std::vector<float> input_norm, post_norm;  // [D], (1 + w) convention
    next::GdnWeights gdn;
    next::AttnWeights att;
    next::MlpWeights mlp;
    next::MoeWeights moe_w;
  };
  std::unique_ptr<ModelFolder> ckpt_;  // owns the mappings the Mats point into
  ModelInfo info_;
  int64_t D_ = 0;
  float eps_ = 1e-6f;
  next::GdnDims gd_;
  next::AttnDims ad_;
  std::vector<float> inv_freq_;
  Mat embed_, lm_head_;
  std::vector<float> final_norm_;
  std::vector<Layer> layers_;
  WeightStore store_;  // int8 copies when loaded with weights=int8
};

}  // namespace strata
