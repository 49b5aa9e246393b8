#include "strata/stream.h"

#include <stdexcept>

namespace strata {

StreamJob::StreamJob(std::shared_ptr<Session> session, std::vector<int32_t> prompt, GenerateOptions opts)
    : session_(std::move(session)), paced_(opts.paced) {
  session_->validate(prompt, opts);
  if (!session_->try_claim())
    throw std::runtime_error("session '" + session_->name() + "' is busy: a generate call is running");
  thread_ = std::thread([this, prompt = std::move(prompt), opts = std::move(opts)] {
    GenerateResult r;
    std::exception_ptr err;
    try {
      r = session_->generate(prompt, opts, [this](int32_t id, const TokenLogprob* lp) {
        TokenLogprob e = lp ? *lp : TokenLogprob{};
        e.id = id;
        { std::lock_guard<std::mutex> g(mu_); queue_.push_back(std::move(e)); }
        cv_.notify_all();
      }, this);
    } catch (...) {
      err = std::current_exception();
    }
    session_->release();
    {
      std::lock_guard<std::mutex> g(mu_);
      result_ = std::move(r);
      error_ = err;
      finished_ = true;
    }
    cv_.notify_all();
  });
}

StreamJob::~StreamJob() {
  let_go();
  if (thread_.joinable()) thread_.join();
}

void StreamJob::let_go() {
  { std::lock_guard<std::mutex> g(mu_); let_go_ = true; }
  cv_.notify_all();
}

void StreamJob::stop() {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (stop_at_ < 0) stop_at_ = taken_;
  }
  cv_.notify_all();
}

int64_t StreamJob::stop_at() const {
  std::lock_guard<std::mutex> g(mu_);
  return stop_at_;
}

bool StreamJob::has_taken(int64_t n) const {
  std::lock_guard<std::mutex> g(mu_);
  return taken_ >= n || stop_at_ >= 0 || let_go_;
}

void StreamJob::wait_taken(int64_t n) {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return taken_ >= n || stop_at_ >= 0 || let_go_; });
}

bool StreamJob::next(int32_t* id) {
  TokenLogprob e;
  if (!next(&e)) return false;
  *id = e.id;
  return true;
}

bool StreamJob::next(TokenLogprob* entry) {
  std::unique_lock<std::mutex> lk(mu_);
  // a paced call asked to STOP: which queued ids are generated ones is known at its end
  const auto settled = [&] { return finished_ || (paced_ && stop_at_ >= 0); };
  cv_.wait(lk, [&] { return finished_ || (!queue_.empty() && !settled()); });
  const bool more = !queue_.empty() && (!finished_ || error_ || taken_ < int64_t(result_.gen_ids.size()));
  if (more) {
    *entry = std::move(queue_.front());
    queue_.pop_front();
    ++taken_;
    lk.unlock();
    cv_.notify_all();  // a paced loop waiting for the reader
    return true;
  }
  if (error_) std::rethrow_exception(error_);
  return false;
}

bool StreamJob::done() const {
  std::lock_guard<std::mutex> g(mu_);
  return finished_;
}

GenerateResult StreamJob::result() {
  let_go();
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return finished_; });
  if (error_) std::rethrow_exception(error_);
  return result_;
}

}  // namespace strata
