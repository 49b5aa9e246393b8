// Per-op wall-clock timers for the forward pass, on when STRATA_PROFILE=1 (off: one branch per scope).
// Totals are kept separately for decode (n == 1) and prefill (n > 1) calls and printed to stderr at exit
// (and by report()), so `STRATA_PROFILE=1 python benchmarks/engine.py --skip hf,llama` shows where a
// token's time goes.
#pragma once
#include <chrono>
#include <cstdint>

namespace strata::prof {

enum Op : int { Embed, Norm, QKV, Rope, Attention, OProj, GateUp, Down, GDN, MoE, LMHead, Other, NumOps };

bool enabled();
void add(Op op, bool decode, double seconds);
void count_forward(bool decode, int64_t tokens);
void report();  // print the totals so far to stderr
// The totals so far: per phase (0 prefill, 1 decode) seconds per op, forward calls and tokens; reset zeroes them.
struct Totals {
  double sec[2][NumOps];
  int64_t calls[2], tokens[2];
};
Totals totals_snapshot(bool reset);
const char* op_name(int op);

// Times its own lifetime into `op` when profiling is on.
class Scope {
 public:
  Scope(Op op, bool decode) : op_(op), decode_(decode), on_(enabled()) {
    if (on_) t0_ = std::chrono::steady_clock::now();
  }
  ~Scope() {
    if (on_) add(op_, decode_, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count());
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  Op op_;
  bool decode_, on_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace strata::prof
