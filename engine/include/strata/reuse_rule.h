// Contract 1, rules 1-3 (docs/CONTRACTS.md): how many prompt ids a session reuses, and which snapshot it
// restores. This is the one statement of the rule in C++: the engine (session.cpp `Session::plan`) and the
// store replay (replay_core.cpp `ReplayCore::plan`) both call `plan_reuse`. strata_lab/replayer/state.py
// `SessionState` is its documented Python oracle; tests/test_engine_session.py (engine == oracle) and
// tests/test_replay_native.py (replay core == oracle) check all three agree.
// Header-only: the engine (OpenMP) and the replay extension (no OpenMP) both compile it.
#pragma once
#include <algorithm>
#include <cstdint>

namespace strata {

// What the engine does when the whole prompt is already held (reuse would equal len(prompt)).
// held_logits: the engine's rule (rules 1 and 2): saved logits when prompt == held, or when a checkpoint
//   sits at exactly len(prompt); last_held_only: only when prompt == held (the engine before snapshots kept
//   logits); reread_last: always re-read the last prompt id; saved_logits: never re-read it.
// Exported to Python by name (`_replay.FullHit`), matching strata_lab.replayer.state.FULL_HIT_RULES.
#define STRATA_FULL_HIT_RULES(X) X(held_logits) X(last_held_only) X(reread_last) X(saved_logits)

enum class FullHit : int8_t {
#define STRATA_FULL_HIT(name) name,
  STRATA_FULL_HIT_RULES(STRATA_FULL_HIT)
#undef STRATA_FULL_HIT
};

struct Reuse {
  int64_t target = 0;         // what the ids alone allow: the LCP, less the last prompt id when its logits
                              // must be computed
  int64_t reused = 0;         // what the state serves of it (prompt ids not read)
  int64_t restored = -1;      // the snapshot restored (its position); -1: none
  bool saved_logits = false;  // nothing is read: the logits saved after held[len(prompt) - 1] are used
};

// prompt_len, held_len: the call's prompt and the session's held ids; lcp: their common prefix.
// truncatable: every layer can be cut back anywhere (attention-only; hybrid models cannot).
// has_snapshot(pos): a checkpoint sits at pos; last_at_or_before(pos): the largest checkpoint <= pos (0: none).
template <class HasSnapshot, class LastAtOrBefore>
inline Reuse plan_reuse(int64_t prompt_len, int64_t held_len, int64_t lcp, bool truncatable, FullHit full_hit,
                        const HasSnapshot& has_snapshot, const LastAtOrBefore& last_at_or_before) {
  Reuse r;
  // rules 1 and 2 (a full hit keeps the last prompt id) else rule 3's cap (its logits are computed)
  if (lcp < prompt_len || full_hit == FullHit::saved_logits)
    r.target = lcp;
  else if ((full_hit == FullHit::held_logits || full_hit == FullHit::last_held_only) && prompt_len == held_len)
    r.target = lcp;  // rule 1: prompt == held
  else if (full_hit == FullHit::held_logits && prompt_len > 0 && has_snapshot(prompt_len))
    r.target = lcp;  // rule 2: a proper prefix of held ending on a checkpoint
  else
    r.target = std::max<int64_t>(prompt_len - 1, 0);
  // rule 3: attention cuts anywhere; a hybrid state off its end needs a snapshot at or before the target
  r.reused = truncatable || r.target == held_len ? r.target : last_at_or_before(r.target);
  // a snapshot is restored when the state moves to it: on a hybrid model for any cut, on attention only for
  // its logits (a full hit on a checkpoint)
  if (r.reused != held_len && has_snapshot(r.reused) && (!truncatable || r.reused == prompt_len))
    r.restored = r.reused;
  r.saved_logits = prompt_len > 0 && r.reused == prompt_len;
  return r;
}

}  // namespace strata
