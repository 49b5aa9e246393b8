// Decode-step parallelism without a join barrier. A decode step runs ~150 short parallel loops; with
// OpenMP each ends in a barrier that waits for every team thread, so on shared or oversubscribed cores a
// step costs as much as the slowest thread's wake-up latency per loop. Here the calling thread and up to
// threads-1 helpers take chunks from one atomic counter; the caller waits only for chunks a helper has
// actually claimed, so a helper that is not running simply takes no part. Results do not depend on which
// thread ran a chunk. Helpers spin briefly for the next loop, then sleep.
#pragma once
#include <cstdint>
#include <type_traits>

namespace strata::pool {

using Fn = void (*)(void* ctx, int64_t begin, int64_t end);

// fn(ctx, b, e) over [0, n) in chunks of `grain` items, on the caller plus up to threads-1 helpers
// (threads <= 0: the OpenMP default). Called from inside a running loop, it runs serially.
void run(int threads, int64_t n, int64_t grain, Fn fn, void* ctx);

template <class F>
void parallel_for(int threads, int64_t n, int64_t grain, F&& f) {
  using G = std::remove_reference_t<F>;
  run(threads, n, grain, [](void* c, int64_t b, int64_t e) { (*static_cast<G*>(c))(b, e); },
      const_cast<void*>(static_cast<const void*>(&f)));
}

// Threads a loop may use now: the OpenMP thread count of the calling thread (set by use_threads).
int current_threads();

}  // namespace strata::pool
