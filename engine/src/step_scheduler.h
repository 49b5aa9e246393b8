// The model's step thread: every session read of a model runs here, one forward at a time, and the
// one-token reads (decode steps) of the sessions decoding at the same time run as one batched forward
// (Model::forward_batch: the weights are read once for all of them). Sessions keep their own threads
// and their own decode loops (sampling, STOP/drain, grammar masks, logprobs, snapshots): only the forward
// is shared. A step waits for the sessions in their decode loop (enter_decode/leave_decode) to submit,
// at most kGatherWait; a prefill chunk (at most Session's chunk of 512 tokens) takes turns with the
// decode steps, so a new request joins the batch after its prompt's chunks without stopping the others.
// Batching changes timing, never ids or logits: forward_batch gives each sequence the bits forward gives.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "strata/model.h"

namespace strata {

class StepScheduler {
 public:
  static constexpr int64_t kMaxBatch = 64;  // one-token reads per batched step
  static constexpr std::chrono::microseconds kGatherWait{3000};

  explicit StepScheduler(Model& model) : model_(model) {}
  ~StepScheduler();
  StepScheduler(const StepScheduler&) = delete;
  StepScheduler& operator=(const StepScheduler&) = delete;

  // Model::forward on the step thread; blocks until done (rethrows its failure).
  void run(const int32_t* tokens, int64_t n, SessionState& state, Logits mode, float* logits);
  void enter_decode();
  void leave_decode();
  StepStats stats() const;

 private:
  struct Job {
    const int32_t* tokens;
    int64_t n;
    SessionState* state;
    Logits mode;
    float* logits;
    bool done = false;
    std::exception_ptr error;
  };
  void loop();

  Model& model_;
  mutable std::mutex mu_;
  std::condition_variable work_, done_;
  std::deque<Job*> decodes_, others_;
  int decoding_ = 0;
  bool last_was_decode_ = false;
  bool stop_ = false;
  StepStats stats_;
  std::thread thread_;
};

}  // namespace strata
