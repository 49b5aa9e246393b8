#include "step_scheduler.h"

#include <algorithm>
#include <vector>

namespace strata {

StepScheduler::~StepScheduler() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  work_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void StepScheduler::enter_decode() {
  std::lock_guard<std::mutex> g(mu_);
  ++decoding_;
}

void StepScheduler::leave_decode() {
  {
    std::lock_guard<std::mutex> g(mu_);
    --decoding_;
  }
  work_.notify_all();  // a step waiting for this session's read stops waiting
}

StepStats StepScheduler::stats() const {
  std::lock_guard<std::mutex> g(mu_);
  StepStats s = stats_;
  s.decoding = decoding_;
  s.waiting = int64_t(decodes_.size() + others_.size());
  return s;
}

void StepScheduler::run(const int32_t* tokens, int64_t n, SessionState& state, Logits mode, float* logits) {
  Job job{tokens, n, &state, mode, logits, false, nullptr};
  std::unique_lock<std::mutex> lk(mu_);
  if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
  (n == 1 && mode == Logits::Last ? decodes_ : others_).push_back(&job);
  work_.notify_all();
  done_.wait(lk, [&] { return job.done; });
  if (job.error) std::rethrow_exception(job.error);
}

void StepScheduler::loop() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    work_.wait(lk, [&] { return stop_ || !decodes_.empty() || !others_.empty(); });
    if (stop_ && decodes_.empty() && others_.empty()) return;
    // A prefill chunk and a decode step take turns while both wait.
    const bool decode = !decodes_.empty() && (others_.empty() || !last_was_decode_);
    if (decode && others_.empty()) {
      // gather: the sessions in their decode loop are sampling their next id; wait for them (bounded)
      work_.wait_for(lk, kGatherWait, [&] {
        return stop_ || !others_.empty() || int64_t(decodes_.size()) >= std::min<int64_t>(decoding_, kMaxBatch);
      });
    }
    std::vector<Job*> batch;
    if (decode) {
      while (!decodes_.empty() && int64_t(batch.size()) < kMaxBatch) {
        batch.push_back(decodes_.front());
        decodes_.pop_front();
      }
    } else {
      batch.push_back(others_.front());
      others_.pop_front();
    }
    last_was_decode_ = decode;
    lk.unlock();
    std::exception_ptr err;
    try {
      if (!decode) {
        Job& j = *batch[0];
        model_.forward(j.tokens, j.n, *j.state, j.mode, j.logits);
      } else if (batch.size() == 1) {
        Job& j = *batch[0];
        model_.forward(j.tokens, 1, *j.state, Logits::Last, j.logits);
      } else {
        const size_t B = batch.size();
        std::vector<int32_t> ids(B);
        std::vector<SessionState*> states(B);
        std::vector<float*> outs(B);
        for (size_t b = 0; b < B; ++b) {
          ids[b] = batch[b]->tokens[0];
          states[b] = batch[b]->state;
          outs[b] = batch[b]->logits;
        }
        model_.forward_batch(ids.data(), int64_t(B), states.data(), outs.data());
      }
    } catch (...) {
      err = std::current_exception();
    }
    lk.lock();
    if (decode) {
      ++stats_.steps;
      stats_.tokens += int64_t(batch.size());
      stats_.last_batch = int64_t(batch.size());
      stats_.max_batch = std::max<int64_t>(stats_.max_batch, int64_t(batch.size()));
    } else {
      ++stats_.prefill_chunks;
    }
    for (Job* j : batch) {
      j->error = err;
      j->done = true;
    }
    done_.notify_all();
  }
}

}  // namespace strata
