#include "strata/session.h"

#include "strata/reuse_rule.h"

#include <algorithm>
#include <chrono>
#include <iterator>
#include <stdexcept>

namespace strata {

namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}
constexpr int64_t kMaxChunk = 512;  // prefill chunk: bounds activation memory
}  // namespace

Session::Session(std::shared_ptr<Model> model, std::string name, CheckpointPolicy policy)
    : model_(std::move(model)), name_(std::move(name)), policy_(std::move(policy)) {
  policy_.validate();
  state_ = model_->new_state();
}

void Session::set_policy(const CheckpointPolicy& p) {
  p.validate();
  std::lock_guard<std::mutex> g(mu_);
  policy_ = p;
  enforce_budget();
}

static void check_ids(const std::vector<int32_t>& ids, int64_t V, const char* field) {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= V)
      throw std::invalid_argument(std::string(field) + "[" + std::to_string(i) + "] = " + std::to_string(ids[i]) +
                                  " is out of range [0, " + std::to_string(V) + ")");
}

void Session::validate(const std::vector<int32_t>& prompt, const GenerateOptions& opts) const {
  const ModelInfo& mi = model_->info();
  if (prompt.empty()) throw std::invalid_argument("prompt_ids must not be empty");
  check_ids(prompt, mi.vocab_size, "prompt_ids");
  if (opts.max_new_tokens < 0)
    throw std::invalid_argument("max_new_tokens must be >= 0, got " + std::to_string(opts.max_new_tokens));
  if (opts.logprobs < -1 || opts.logprobs > 1024)
    throw std::invalid_argument("logprobs must be -1 (off) or in 0..1024, got " + std::to_string(opts.logprobs));
  if (opts.stop_latency < 0)
    throw std::invalid_argument("stop_latency must be >= 0, got " + std::to_string(opts.stop_latency));
  opts.sampling.validate();
  for (const auto& b : opts.sampling.logit_bias)
    if (b.first < 0 || b.first >= mi.vocab_size)
      throw std::invalid_argument("sampling.logit_bias: id " + std::to_string(b.first) + " is out of range [0, " +
                                  std::to_string(mi.vocab_size) + ")");
  check_ids(opts.stop_ids, mi.vocab_size, "stop_ids");
  if (opts.has_force) check_ids(opts.force_ids, mi.vocab_size, "force_ids");
  const int64_t need = int64_t(prompt.size()) + opts.max_new_tokens;
  if (need > mi.max_context)
    throw std::invalid_argument("context overflow: len(prompt_ids) + max_new_tokens = " + std::to_string(need) +
                                " exceeds max_context = " + std::to_string(mi.max_context));
}

Session::ReusePlan Session::plan(const std::vector<int32_t>& prompt) const {
  std::lock_guard<std::mutex> g(mu_);
  ReusePlan p;
  const int64_t P = int64_t(prompt.size()), Hn = int64_t(held_.size());
  while (p.lcp < std::min(P, Hn) && prompt[size_t(p.lcp)] == held_[size_t(p.lcp)]) ++p.lcp;
  const bool truncatable = state_->can_truncate();
  const Reuse r = plan_reuse(
      P, Hn, p.lcp, truncatable, FullHit::held_logits, [&](int64_t pos) { return snapshots_.count(pos) != 0; },
      [&](int64_t pos) {
        auto it = snapshots_.upper_bound(pos);
        return it == snapshots_.begin() ? int64_t(0) : std::prev(it)->first;
      });
  p.reused = r.reused;
  p.saved_logits = r.saved_logits;
  // cut_to's action: nothing (the state is already there), restore the snapshot, cut the KV (-1), or reset (0:
  // a hybrid state with no snapshot at or before the target)
  p.restore = r.reused == Hn ? -1 : r.restored >= 0 ? r.restored : truncatable ? -1 : 0;
  return p;
}

void Session::cut_to(int64_t pos, int64_t restore) {
  std::lock_guard<std::mutex> g(mu_);
  if (pos == int64_t(held_.size())) return;
  if (restore > 0) {
    Entry& e = snapshots_.at(restore);
    e.last_used = ++tick_;
    e.snap.restore_into(*state_);
    last_logits_ = e.snap.logits;
  } else if (restore == 0) {
    state_->reset();
  } else {
    state_->truncate(pos);
  }
  held_.resize(size_t(pos));
  // Snapshots past the cut describe ids that are no longer held.
  snapshots_.erase(snapshots_.upper_bound(pos), snapshots_.end());
}

int64_t Session::before_last_pos(const std::vector<int32_t>& prompt) const {
  if (policy_.before_last < 0) return -1;
  for (int64_t i = int64_t(prompt.size()) - 1; i > 0; --i)
    if (prompt[size_t(i)] == policy_.before_last) return i;
  return -1;  // absent, or only at index 0 (no position before it)
}

bool Session::is_checkpoint_pos(int64_t pos) const {
  if (pos <= 0) return false;
  if (pos == extra_pos_) return true;
  if (policy_.every > 0 && pos % policy_.every == 0) return true;
  return std::find(policy_.positions.begin(), policy_.positions.end(), pos) != policy_.positions.end();
}

void Session::take_checkpoint() {
  Entry e;
  e.snap = StateSnapshot::take(*state_);
  e.snap.logits = last_logits_;  // read() computes logits for every chunk that ends at a checkpoint
  e.last_used = ++tick_;
  snapshots_[state_->n_tokens] = std::move(e);
  enforce_budget();
}

void Session::enforce_budget() {
  if (policy_.budget_mib <= 0.0) return;
  const double budget = policy_.budget_mib * 1024.0 * 1024.0;
  auto total = [&] {
    int64_t b = 0;
    for (const auto& kv : snapshots_) b += kv.second.snap.bytes();
    return b;
  };
  while (!snapshots_.empty() && double(total()) > budget) {
    auto lru = snapshots_.begin();
    for (auto it = snapshots_.begin(); it != snapshots_.end(); ++it)
      if (it->second.last_used < lru->second.last_used) lru = it;
    snapshots_.erase(lru);
  }
}

void Session::maybe_checkpoint(bool prompt_end) {
  if ((prompt_end && policy_.at_prompt_end) || is_checkpoint_pos(state_->n_tokens)) {
    std::lock_guard<std::mutex> g(mu_);
    take_checkpoint();
  }
}

// Reads ids into the state, splitting at checkpoint positions and at kMaxChunk.
void Session::read(const int32_t* ids, int64_t n, bool want_logits) {
  const int64_t V = model_->info().vocab_size;
  int64_t done = 0;
  while (done < n) {
    const int64_t pos = state_->n_tokens;
    int64_t m = std::min(kMaxChunk, n - done);
    for (int64_t j = 1; j < m; ++j)
      if (is_checkpoint_pos(pos + j)) { m = j; break; }
    const bool last = done + m == n;
    // logits for the last chunk, and for any chunk that ends at a checkpoint (its snapshot keeps them)
    const bool logits = (last && want_logits) || (!last && is_checkpoint_pos(pos + m));
    if (logits) last_logits_.resize(size_t(V));
    // on the model's step thread: a one-token read joins the other sessions' decode step (one batch)
    model_->forward_shared(ids + done, m, *state_, logits ? Logits::Last : Logits::None, last_logits_.data());
    {
      std::lock_guard<std::mutex> g(mu_);
      held_.insert(held_.end(), ids + done, ids + done + m);
    }
    done += m;
    if (!last && is_checkpoint_pos(state_->n_tokens)) {
      std::lock_guard<std::mutex> g(mu_);
      take_checkpoint();
    }
  }
}

GenerateResult Session::generate(const std::vector<int32_t>& prompt, const GenerateOptions& opts,
                                 const OnToken& on_token, StreamReader* reader) {
  validate(prompt, opts);
  GenerateResult r;
  const auto t0 = Clock::now();
  const ReusePlan p = plan(prompt);
  const int64_t P = int64_t(prompt.size());
  r.prompt_len = P;
  r.lcp = p.lcp;
  r.held_before = int64_t(held().size());
  r.reused = p.reused;
  r.tokens_read = P - p.reused;
  r.restored_checkpoint = p.restore > 0 || (p.restore == 0 && r.held_before > 0) ? p.restore : -1;
  r.used_saved_logits = p.saved_logits;

  cut_to(p.reused, p.restore);
  extra_pos_ = before_last_pos(prompt);  // read() splits there and snapshots it (only when reused < it)
  try {
    if (!p.saved_logits) read(prompt.data() + p.reused, P - p.reused, true);
  } catch (...) {
    extra_pos_ = -1;
    throw;
  }
  extra_pos_ = -1;
  maybe_checkpoint(true);
  r.prefill_ms = ms_since(t0);

  const auto t1 = Clock::now();
  const int64_t V = model_->info().vocab_size;
  const int64_t steps = opts.has_force ? std::min<int64_t>(opts.max_new_tokens, int64_t(opts.force_ids.size()))
                                       : opts.max_new_tokens;
  Sampler sampler(opts.sampling);
  sampler.prime(prompt.data(), P);
  std::vector<float> masked;                   // the grammar's copy: the session's own logits stay untouched
  std::vector<uint32_t> bits(size_t((V + 31) / 32));
  std::vector<int32_t> produced;               // this call's ids so far (gen + drained), for the mask
  std::string natural = "length";
  int64_t req_step = -1;  // the last step whose id is a generated one once a STOP is seen
  struct Decoding {       // while in the loop, the model's batched steps wait (briefly) for this session
    Model* m;
    explicit Decoding(Model* model, bool on) : m(on ? model : nullptr) { if (m) m->enter_decode(); }
    ~Decoding() { if (m) m->leave_decode(); }
    void pause() { if (m) m->leave_decode(); }   // waiting for the reader: batched steps go on without us
    void resume() { if (m) m->enter_decode(); }
  } decoding(model_.get(), steps > 0);
  const bool paced = reader && opts.paced;
  // step: the last step whose id the loop itself counts as generated when the STOP is seen now
  auto see_stop = [&](int64_t step) {
    if (!reader || req_step >= 0) return;
    const int64_t at = std::min<int64_t>(reader->stop_at(), int64_t(r.gen_ids.size()));
    if (at < 0) return;
    if (!paced) {
      req_step = step;
      return;
    }
    // paced: the reader's position decides; ids it never took are drained (at <= gen_ids.size())
    req_step = at - 1;
    r.drained_ids.assign(r.gen_ids.begin() + at, r.gen_ids.end());
    r.gen_ids.resize(size_t(at));
    if (r.logprobs.size() > size_t(at)) r.logprobs.resize(size_t(at));
  };
  for (int64_t i = 0; i < steps; ++i) {
    if (paced && i > 0 && req_step < 0 && !reader->has_taken(i)) {
      decoding.pause();
      reader->wait_taken(i);
      decoding.resume();
    }
    see_stop(i - 1);  // arrived between steps
    if (req_step >= 0 && i > req_step + opts.stop_latency) break;
    int32_t id;
    if (opts.has_force) {
      id = opts.force_ids[size_t(i)];
    } else if (opts.token_mask && opts.token_mask(produced, bits.data())) {
      masked = last_logits_;
      apply_token_mask(masked.data(), V, bits.data());
      id = sampler.sample(masked.data(), V);
    } else {
      id = sampler.sample(last_logits_.data(), V);
    }
    produced.push_back(id);
    sampler.accept(id);
    see_stop(i);  // arrived while this id was sampled
    if (req_step >= 0) r.drained_ids.push_back(id);
    else {
      r.gen_ids.push_back(id);
      // raw logits: before temperature, filters and the grammar mask (see logprobs.h)
      if (opts.logprobs >= 0) r.logprobs.push_back(token_logprob(last_logits_.data(), V, id, opts.logprobs));
      if (on_token) on_token(id, opts.logprobs >= 0 ? &r.logprobs.back() : nullptr);
    }
    read(&id, 1, true);
    maybe_checkpoint(false);
    if (std::find(opts.stop_ids.begin(), opts.stop_ids.end(), id) != opts.stop_ids.end()) {
      natural = "stop";
      break;
    }
  }
  r.finish = req_step >= 0 ? "cancelled" : natural;
  r.decode_ms = ms_since(t1);
  r.checkpoints = checkpoints();
  return r;
}

std::vector<int32_t> Session::held() const {
  std::lock_guard<std::mutex> g(mu_);
  return held_;
}

std::vector<float> Session::last_logits() const {
  std::lock_guard<std::mutex> g(mu_);
  return held_.empty() ? std::vector<float>() : last_logits_;
}

std::vector<int64_t> Session::checkpoints() const {
  std::lock_guard<std::mutex> g(mu_);
  std::vector<int64_t> out;
  for (const auto& kv : snapshots_) out.push_back(kv.first);
  return out;
}

int64_t Session::snapshot_bytes() const {
  std::lock_guard<std::mutex> g(mu_);
  int64_t b = 0;
  for (const auto& kv : snapshots_) b += kv.second.snap.bytes();
  return b;
}

int64_t Session::memory_bytes() const {
  int64_t b = snapshot_bytes();
  std::lock_guard<std::mutex> g(mu_);
  return b + state_->bytes() + int64_t(last_logits_.capacity() * sizeof(float)) +
         int64_t(held_.capacity() * sizeof(int32_t));
}

void Session::reset() {
  if (busy_.load()) throw std::runtime_error("session '" + name_ + "' is busy: a generate call is running");
  std::lock_guard<std::mutex> g(mu_);
  state_->reset();
  held_.clear();
  snapshots_.clear();
  last_logits_.clear();
}

}  // namespace strata
