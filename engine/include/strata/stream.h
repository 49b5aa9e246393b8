// One generate call running on its own thread; ids are queued as produced so a caller (the Python
// Stream iterator) can block on next() without holding any lock the decode loop needs.
#pragma once
#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>

#include "strata/session.h"

namespace strata {

class StreamJob {
 public:
  // Validates (throws before any work), claims the session, then starts the decode thread.
  StreamJob(std::shared_ptr<Session> session, std::vector<int32_t> prompt, GenerateOptions opts);
  ~StreamJob();  // waits for the thread
  StreamJob(const StreamJob&) = delete;
  StreamJob& operator=(const StreamJob&) = delete;

  // Next non-drained id; false once the call has finished and the queue is empty. Rethrows a
  // failure of the decode thread.
  bool next(int32_t* id);
  // The same, with the id's logprob entry (empty top and logprob 0 when logprobs are off).
  bool next(TokenLogprob* entry);
  void stop() { stop_.store(true); }
  bool done() const;
  // Waits for the end of the call.
  GenerateResult result();

 private:
  std::shared_ptr<Session> session_;
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<TokenLogprob> queue_;
  bool finished_ = false;
  std::exception_ptr error_;
  GenerateResult result_;
  std::thread thread_;
};

}  // namespace strata
