// An Engine: one loaded model and its named sessions.
#pragma once
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "strata/model.h"
#include "strata/session.h"

namespace strata {

class Engine {
 public:
  Engine(const std::string& dir, const LoadOptions& opts);
  const ModelInfo& info() const { return model_->info(); }
  // Logits [len(ids), V] of a fresh sequence (no session touched).
  std::vector<float> forward(const std::vector<int32_t>& ids);
  // The session called name, created with policy if new (an existing one gets the policy when given).
  std::shared_ptr<Session> session(const std::string& name, const CheckpointPolicy* policy);
  std::vector<std::string> session_names() const;
  void drop_session(const std::string& name);

 private:
  std::shared_ptr<Model> model_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<Session>> sessions_;
};

}  // namespace strata
