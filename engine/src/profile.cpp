#include "profile.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace strata::prof {

namespace {
const char* const kNames[NumOps] = {"embed", "norm", "qkv", "rope", "attention", "o_proj",
                                    "gate_up", "down", "gdn", "moe", "lm_head", "other"};
struct Locked {
  std::mutex mu;
  double sec[2][NumOps] = {};
  int64_t calls[2] = {}, tokens[2] = {};
};
Locked& totals() {
  static Locked t;
  return t;
}
bool read_env() {
  const char* e = std::getenv("STRATA_PROFILE");
  const bool on = e && *e && std::strcmp(e, "0") != 0;
  if (on) std::atexit(report);
  return on;
}
}  // namespace

bool enabled() {
  static const bool on = read_env();
  return on;
}

void add(Op op, bool decode, double seconds) {
  Locked& t = totals();
  std::lock_guard<std::mutex> g(t.mu);
  t.sec[decode ? 1 : 0][op] += seconds;
}

void count_forward(bool decode, int64_t tokens) {
  if (!enabled()) return;
  Locked& t = totals();
  std::lock_guard<std::mutex> g(t.mu);
  t.calls[decode ? 1 : 0] += 1;
  t.tokens[decode ? 1 : 0] += tokens;
}

void report() {
  Locked& t = totals();
  std::lock_guard<std::mutex> g(t.mu);
  for (int d = 1; d >= 0; --d) {
    double all = 0.0;
    for (int i = 0; i < NumOps; ++i) all += t.sec[d][i];
    if (t.calls[d] == 0 || all <= 0.0) continue;
    std::fprintf(stderr, "strata profile, %s: %lld calls, %lld tokens, %.1f ms timed (%.3f ms/token)\n",
                 d ? "decode" : "prefill", (long long)t.calls[d], (long long)t.tokens[d], all * 1e3,
                 all * 1e3 / double(t.tokens[d]));
    for (int i = 0; i < NumOps; ++i)
      if (t.sec[d][i] > 0.0)
        std::fprintf(stderr, "  %-10s %9.1f ms  %5.1f%%  %.3f ms/token\n", kNames[i], t.sec[d][i] * 1e3,
                     100.0 * t.sec[d][i] / all, t.sec[d][i] * 1e3 / double(t.tokens[d]));
  }
}

Totals totals_snapshot(bool reset) {
  Locked& t = totals();
  std::lock_guard<std::mutex> g(t.mu);
  Totals s;
  std::memcpy(s.sec, t.sec, sizeof s.sec);
  std::memcpy(s.calls, t.calls, sizeof s.calls);
  std::memcpy(s.tokens, t.tokens, sizeof s.tokens);
  if (reset) {
    std::memset(t.sec, 0, sizeof t.sec);
    std::memset(t.calls, 0, sizeof t.calls);
    std::memset(t.tokens, 0, sizeof t.tokens);
  }
  return s;
}

const char* op_name(int op) { return op >= 0 && op < NumOps ? kNames[op] : "?"; }

}  // namespace strata::prof
