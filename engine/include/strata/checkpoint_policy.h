// Where a session saves state snapshots (checkpoints): Contract 1 rule 5 (docs/CONTRACTS.md).
//
// The fields are listed once, in STRATA_CHECKPOINT_POLICY_FIELDS: the struct below, both extensions'
// bindings (engine/bindings/checkpoint_policy_binding.h, which also exports the names as
// `CheckpointPolicy._fields`) and the replay's rules (ReplayRules::policy) are generated from or hold this
// one struct; strata_lab.CheckpointPolicy (engine.py) converts field by field through `_fields`, and
// tests/test_native_import.py checks that its fields and defaults are these.
// Header-only: the engine (OpenMP) and the replay extension (no OpenMP) both compile it.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace strata {

// X(type, name, default, doc)
#define STRATA_CHECKPOINT_POLICY_FIELDS(X)                                                                   \
  X(bool, at_prompt_end, true, "one snapshot at len(prompt) after each prefill (the turn start)")            \
  X(int64_t, every, 0, "also every N tokens (0: off)")                                                       \
  X(std::vector<int64_t>, positions, {}, "also at these positions (each > 0)")                               \
  X(double, budget_mib, 0.0,                                                                                 \
    "keep snapshots within this many MiB, evicting the least recently used (0: no limit); the replay "      \
    "counts it in snapshots of bytes_per_snapshot (ReplayRules::capacity)")                                  \
  X(int32_t, before_last, -1,                                                                                \
    "also, after each prompt read, at the position just before the LAST occurrence of this id in the "      \
    "prompt (-1: off); with <|im_start|>: the generation prompt's header")

struct CheckpointPolicy {
#define STRATA_POLICY_FIELD(type, name, init, doc) type name = init;
  STRATA_CHECKPOINT_POLICY_FIELDS(STRATA_POLICY_FIELD)
#undef STRATA_POLICY_FIELD

  // Throws std::invalid_argument naming the field.
  void validate() const {
    if (every < 0) throw std::invalid_argument("checkpoints.every must be >= 0, got " + std::to_string(every));
    for (int64_t p : positions)
      if (p <= 0) throw std::invalid_argument("checkpoints.positions must be > 0, got " + std::to_string(p));
    if (!(budget_mib >= 0.0)) throw std::invalid_argument("checkpoints.budget_mib must be >= 0");
    if (before_last < -1)
      throw std::invalid_argument("checkpoints.before_last must be a token id or -1 (off), got " +
                                  std::to_string(before_last));
  }
};

}  // namespace strata
