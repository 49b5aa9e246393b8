// Qwen3 dense (model_type "qwen3"): docs/ENGINE.md "Qwen3 attention", SwiGLU MLP, tied or separate lm_head.
#pragma once
#include <memory>
#include <vector>

#include "strata/model_folder.h"
#include "strata/model.h"

namespace strata {

// config.json of a Qwen3 dense model, checked (ModelFolderError naming the field); read by both backends.
struct Qwen3Config {
  int64_t vocab = 0, hidden = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0, inter = 0;
  float eps = 1e-6f;
  double rope_theta = 10000.0;
  static Qwen3Config read(ModelFolder& c);
};

class Qwen3Model final : public Model {
 public:
  Qwen3Model(std::unique_ptr<ModelFolder> ckpt, const LoadOptions& opts);
  const ModelInfo& info() const override { return info_; }
  std::unique_ptr<SessionState> new_state() const override;
  void forward(const int32_t* tokens, int64_t n, SessionState& state, Logits mode, float* logits) override;
  void forward_batch(const int32_t* tokens, int64_t B, SessionState* const* states, float* const* logits) override;

 private:
  struct Layer {
    std::vector<float> input_norm, post_norm, q_norm, k_norm;  // [D], [D], [hd], [hd]
    Mat wq, wk, wv, wo, w_gate, w_up, w_down;                  // [out, in] as stored
  };
  std::unique_ptr<ModelFolder> ckpt_;  // owns the mappings the Mats point into
  ModelInfo info_;
  int64_t D_, H_, Hkv_, hd_, I_;
  float eps_;
  std::vector<float> inv_freq_;
  Mat embed_, lm_head_;
  std::vector<float> final_norm_;
  std::vector<Layer> layers_;
  WeightStore store_;  // int8 copies when loaded with weights=int8
};

}  // namespace strata
