#include "pool.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>
#ifdef STRATA_HAVE_OPENMP
#include <omp.h>
#endif
#if defined(__x86_64__)
#include <immintrin.h>
#define STRATA_PAUSE() _mm_pause()
#else
#define STRATA_PAUSE() ((void)0)
#endif

namespace strata::pool {

namespace {
bool& t_in_loop_flag() {
  thread_local bool f = false;
  return f;
}

// ctr = epoch (24 bits) | chunks (20 bits) | next chunk (20 bits): a claim is one CAS that also checks
// the loop is still the one the claimer saw, so a late helper never takes a chunk of a newer loop.
constexpr int kEpochShift = 40, kTotalShift = 20;
constexpr uint64_t kMask20 = (1u << 20) - 1, kMask24 = (1u << 24) - 1;
constexpr int kSpin = 20000;  // ~50-100 us of pause before a helper sleeps

struct Pool {
  std::atomic<uint64_t> ctr{0};
  std::atomic<int64_t> done{0};
  Fn fn = nullptr;
  void* ctx = nullptr;
  int64_t n = 0, grain = 1;
  std::atomic<int> helpers_wanted{0};
  uint64_t epoch = 0;
  std::mutex run_mu;  // one loop at a time
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<int> sleepers{0};
  int nthreads = 0;

  bool claim(uint64_t e, int64_t& idx) {
    uint64_t v = ctr.load(std::memory_order_acquire);
    for (;;) {
      if ((v >> kEpochShift) != e) return false;
      const uint64_t total = (v >> kTotalShift) & kMask20, next = v & kMask20;
      if (next >= total) return false;
      if (ctr.compare_exchange_weak(v, v + 1, std::memory_order_acq_rel, std::memory_order_acquire)) {
        idx = int64_t(next);
        return true;
      }
    }
  }

  void chunk(int64_t idx) {
    const int64_t b = idx * grain, e = std::min(n, b + grain);
    fn(ctx, b, e);
    done.fetch_add(1, std::memory_order_release);
  }

  void helper(int id) {
    t_in_loop_flag() = true;  // a chunk that starts a loop runs it serially (no nested waits)
    uint64_t seen = ctr.load() >> kEpochShift;
    for (;;) {
      uint64_t v = 0;
      int spins = 0;
      while (((v = ctr.load(std::memory_order_acquire)) >> kEpochShift) == seen) {
        if (++spins < kSpin) {
          STRATA_PAUSE();
          continue;
        }
        std::unique_lock<std::mutex> lk(mu);
        sleepers.fetch_add(1);
        cv.wait(lk, [&] { return (ctr.load() >> kEpochShift) != seen; });
        sleepers.fetch_sub(1);
        spins = 0;
      }
      seen = v >> kEpochShift;
      if (id >= helpers_wanted_of(seen)) continue;
      int64_t idx;
      while (claim(seen, idx)) chunk(idx);
    }
  }

  // helpers_wanted is written before ctr is published; a helper reads it after seeing the new epoch.
  int helpers_wanted_of(uint64_t) const { return helpers_wanted.load(std::memory_order_acquire); }

  void ensure(int helpers) {
    while (nthreads < helpers) {
      const int id = nthreads++;
      std::thread([this, id] { helper(id); }).detach();
    }
  }
};

Pool& pool() {
  static Pool* p = new Pool();  // never destroyed: detached helpers may outlive static destructors
  return *p;
}

}  // namespace

int current_threads() {
#ifdef STRATA_HAVE_OPENMP
  return omp_get_max_threads();
#else
  return int(std::max(1u, std::thread::hardware_concurrency()));
#endif
}

void run(int threads, int64_t n, int64_t grain, Fn fn, void* ctx) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  if (threads <= 0) threads = current_threads();
  int64_t chunks = (n + grain - 1) / grain;
  if (chunks > int64_t(kMask20)) {  // keep the count in 20 bits
    grain = (n + int64_t(kMask20) - 1) / int64_t(kMask20);
    chunks = (n + grain - 1) / grain;
  }
  if (threads <= 1 || chunks <= 1 || t_in_loop_flag()) {
    fn(ctx, 0, n);
    return;
  }
  Pool& p = pool();
  std::lock_guard<std::mutex> g(p.run_mu);
  t_in_loop_flag() = true;
  p.ensure(threads - 1);
  p.fn = fn;
  p.ctx = ctx;
  p.n = n;
  p.grain = grain;
  p.helpers_wanted.store(threads - 1, std::memory_order_relaxed);
  p.done.store(0, std::memory_order_relaxed);
  p.epoch = (p.epoch + 1) & kMask24;
  if (p.epoch == 0) p.epoch = 1;
  p.ctr.store(p.epoch << kEpochShift | uint64_t(chunks) << kTotalShift);  // seq_cst: see sleepers below
  if (p.sleepers.load() > 0) {
    std::lock_guard<std::mutex> lk(p.mu);
    p.cv.notify_all();
  }
  int64_t idx;
  while (p.claim(p.epoch, idx)) p.chunk(idx);
  // only chunks a helper claimed can still be running
  for (int spins = 0; p.done.load(std::memory_order_acquire) < chunks; ++spins) {
    if (spins < 4096) STRATA_PAUSE();
    else std::this_thread::yield();
  }
  t_in_loop_flag() = false;
}

}  // namespace strata::pool
