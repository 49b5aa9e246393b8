// An Engine: one loaded model and its named sessions.
#pragma once
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "strata/logprobs.h"
#include "strata/model.h"
#include "strata/session.h"

namespace strata {

class Engine {
 public:
  Engine(const std::string& dir, const LoadOptions& opts);
  const ModelInfo& info() const { return model_->info(); }
  // Logits [len(ids), V] of a fresh sequence (no session touched).
  std::vector<float> forward(const std::vector<int32_t>& ids);
  // Prompt logprobs of a fresh sequence: entry j is ids[j + 1] under log-softmax of the logits after
  // ids[0..j] (len(ids) - 1 entries), with top_n alternatives each. Read in chunks, so memory stays
  // at chunk x vocab floats whatever the length.
  std::vector<TokenLogprob> prompt_logprobs(const std::vector<int32_t>& ids, int64_t top_n);
  // Test hook of batched decode: each sequence's ids but the last read into a fresh state, then the last ids
  // of all of them decoded in one Model::forward_batch (batched) or one forward each (not): logits [B, V].
  std::vector<float> decode_fresh(const std::vector<std::vector<int32_t>>& seqs, bool batched);
  StepStats step_stats() const { return model_->step_stats(); }
  // The session called name, created with policy if new (an existing one gets the policy when given).
  std::shared_ptr<Session> session(const std::string& name, const CheckpointPolicy* policy);
  std::vector<std::string> session_names() const;
  void drop_session(const std::string& name);

 private:
  void check(const std::vector<int32_t>& ids) const;  // non-empty, within max_context and the vocabulary
  std::shared_ptr<Model> model_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<Session>> sessions_;
};

}  // namespace strata
