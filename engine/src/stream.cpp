#include "strata/stream.h"

#include <stdexcept>

namespace strata {

StreamJob::StreamJob(std::shared_ptr<Session> session, std::vector<int32_t> prompt, GenerateOptions opts)
    : session_(std::move(session)) {
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
      }, &stop_);
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
  if (thread_.joinable()) thread_.join();
}

bool StreamJob::next(int32_t* id) {
  TokenLogprob e;
  if (!next(&e)) return false;
  *id = e.id;
  return true;
}

bool StreamJob::next(TokenLogprob* entry) {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return !queue_.empty() || finished_; });
  if (!queue_.empty()) {
    *entry = std::move(queue_.front());
    queue_.pop_front();
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
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return finished_; });
  if (error_) std::rethrow_exception(error_);
  return result_;
}

}  // namespace strata
