#include "strata/engine.h"

#include <stdexcept>

namespace strata {

Engine::Engine(const std::string& dir, const LoadOptions& opts) : model_(load_model(dir, opts)) {}

void Engine::check(const std::vector<int32_t>& ids) const {
  const ModelInfo& mi = model_->info();
  if (ids.empty()) throw std::invalid_argument("ids must not be empty");
  if (int64_t(ids.size()) > mi.max_context)
    throw std::invalid_argument("context overflow: len(ids) = " + std::to_string(ids.size()) +
                                " exceeds max_context = " + std::to_string(mi.max_context));
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= mi.vocab_size)
      throw std::invalid_argument("ids[" + std::to_string(i) + "] = " + std::to_string(ids[i]) +
                                  " is out of range [0, " + std::to_string(mi.vocab_size) + ")");
}

std::vector<float> Engine::forward(const std::vector<int32_t>& ids) {
  const ModelInfo& mi = model_->info();
  check(ids);
  auto st = model_->new_state();
  const int64_t n = int64_t(ids.size());
  std::vector<float> logits(size_t(n * mi.vocab_size));
  model_->forward(ids.data(), n, *st, Logits::All, logits.data());
  return logits;
}

std::vector<TokenLogprob> Engine::prompt_logprobs(const std::vector<int32_t>& ids, int64_t top_n) {
  const ModelInfo& mi = model_->info();
  if (top_n < 0 || top_n > 1024) throw std::invalid_argument("top_n must be in 0..1024, got " + std::to_string(top_n));
  check(ids);
  const int64_t V = mi.vocab_size, n = int64_t(ids.size());
  constexpr int64_t kChunk = 64;  // 64 x 151669 floats = 39 MB of logits at a time
  auto st = model_->new_state();
  std::vector<float> logits(size_t(kChunk * V));
  std::vector<TokenLogprob> out;
  out.reserve(size_t(std::max<int64_t>(n - 1, 0)));
  for (int64_t s = 0; s < n - 1; s += kChunk) {  // the last id's logits predict nothing in the prompt
    const int64_t m = std::min(kChunk, n - 1 - s);
    model_->forward(ids.data() + s, m, *st, Logits::All, logits.data());
    for (int64_t j = 0; j < m; ++j)
      out.push_back(token_logprob(logits.data() + j * V, V, ids[size_t(s + j + 1)], top_n));
  }
  return out;
}

std::shared_ptr<Session> Engine::session(const std::string& name, const CheckpointPolicy* policy) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = sessions_.find(name);
  if (it != sessions_.end()) {
    if (policy) it->second->set_policy(*policy);
    return it->second;
  }
  auto s = std::make_shared<Session>(model_, name, policy ? *policy : CheckpointPolicy{});
  sessions_[name] = s;
  return s;
}

std::vector<std::string> Engine::session_names() const {
  std::lock_guard<std::mutex> g(mu_);
  std::vector<std::string> out;
  for (const auto& kv : sessions_) out.push_back(kv.first);
  return out;
}

void Engine::drop_session(const std::string& name) {
  std::lock_guard<std::mutex> g(mu_);
  sessions_.erase(name);
}

std::vector<float> Engine::decode_fresh(const std::vector<std::vector<int32_t>>& seqs, bool batched) {
  const int64_t B = int64_t(seqs.size()), V = model_->info().vocab_size;
  if (B < 1) throw std::invalid_argument("decode_fresh: at least one sequence");
  for (const auto& s : seqs) {
    check(s);
    if (s.size() < 2) throw std::invalid_argument("decode_fresh: each sequence needs at least 2 ids");
  }
  std::vector<std::unique_ptr<SessionState>> states;
  for (const auto& s : seqs) {
    states.push_back(model_->new_state());
    model_->forward(s.data(), int64_t(s.size()) - 1, *states.back(), Logits::None, nullptr);
  }
  std::vector<float> logits(size_t(B * V));
  std::vector<int32_t> last;
  std::vector<SessionState*> st;
  std::vector<float*> out;
  for (int64_t b = 0; b < B; ++b) {
    last.push_back(seqs[size_t(b)].back());
    st.push_back(states[size_t(b)].get());
    out.push_back(logits.data() + b * V);
  }
  if (batched) model_->forward_batch(last.data(), B, st.data(), out.data());
  else
    for (int64_t b = 0; b < B; ++b) model_->forward(&last[size_t(b)], 1, *st[size_t(b)], Logits::Last, out[size_t(b)]);
  return logits;
}

}  // namespace strata
