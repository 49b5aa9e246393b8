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

class StreamJob : private StreamReader {
 public:
  // Validates (throws before any work), claims the session, then starts the decode thread.
  StreamJob(std::shared_ptr<Session> session, std::vector<int32_t> prompt, GenerateOptions opts);
  ~StreamJob();  // lets go of a paced call (see StreamReader), then waits for the thread
  StreamJob(const StreamJob&) = delete;
  StreamJob& operator=(const StreamJob&) = delete;

  // Next non-drained id; false once the call has finished and the queue is empty. Rethrows a
  // failure of the decode thread. Once a paced call was asked to STOP, waits for its end: the ids
  // after the reader's position are drained, unless the call ended by itself first.
  bool next(int32_t* id);
  // The same, with the id's logprob entry (empty top and logprob 0 when logprobs are off).
  bool next(TokenLogprob* entry);
  // Asks the loop to STOP; a paced call counts from the ids taken so far (see StreamReader).
  void stop();
  bool done() const;
  // Waits for the end of the call; a paced call stops waiting for its reader.
  GenerateResult result();

 private:
  int64_t stop_at() const override;
  bool has_taken(int64_t n) const override;
  void wait_taken(int64_t n) override;
  void let_go();

  std::shared_ptr<Session> session_;
  bool paced_ = false;
  int64_t taken_ = 0;       // ids handed to the reader (mu_)
  int64_t stop_at_ = -1;    // taken_ when the STOP was asked (mu_)
  bool let_go_ = false;     // the reader will not read on: a paced loop stops waiting for it (mu_)
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<TokenLogprob> queue_;
  bool finished_ = false;
  std::exception_ptr error_;
  GenerateResult result_;
  std::thread thread_;
};

}  // namespace strata
