// The replay's session state model in C++: the per-call core of strata_lab's store replay.
//
// It applies the same rules as strata_lab/replayer/state.py `SessionState` (reuse target and snapshot restore:
// strata/reuse_rule.h, the rule the engine's Session uses too; cut, prompt/gen/drained segments, snapshot
// policy with LRU budget) to sessions keyed by an integer code,
// fed by a store's delta encoding (parent_call, shared_len, suffix_ids). `run` steps the calls of a batch
// and writes each row's attribution (`attribute_call`); a miss (the prompt leaves what the session holds) is
// explained here with the tokenizer's bytes (`set_vocab`; the walk, the cause, the realigned tail). It stops
// at the calls that need Python: a miss before the vocabulary is set, a line the columns do not describe
// alone, or a parent that does not check out. Python handles that call with `lcp_with` / `plan` / `advance`
// on the same state, then resumes `run`.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "strata/checkpoint_policy.h"
#include "strata/reuse_rule.h"

namespace strata {

struct ReplayRules {
  bool hybrid = true;          // a divergence restores a recurrent-state snapshot (else any cut works)
  FullHit full_hit = FullHit::held_logits;
  CheckpointPolicy policy;     // where snapshots are taken; its budget_mib is applied as `capacity`
  int64_t capacity = -1;       // most snapshots kept (LRU); -1: no budget
  int64_t bytes_per_snapshot = 0;
  bool recorded_checkpoints = false;  // after a call, hold the line's own snapshots
};

struct ReplaySegment {
  int64_t start, end;
  int32_t kind;  // 0 prompt, 1 gen, 2 drained
  int64_t call;
};

struct ReplaySession {
  std::vector<int32_t> held;
  std::vector<std::pair<int64_t, uint64_t>> ckpts;  // (position, last use): LRU = smallest stamp
  std::vector<ReplaySegment> segments;
  int64_t calls = 0;
  int64_t last_part = -1, last_row = -1, last_plen = 0;  // the session's previous call
};

struct ReplayPlan {
  int64_t target = 0, reused = 0, restored = -1;
};

// One call's results (what `run` writes per row and `advance` returns).
struct ReplayStep {
  int64_t held_before = 0, lcp = 0, reused = 0, target = 0, snapshots = 0, index = 0;
  int64_t restored = -1;  // the snapshot restored (-1: none; the state was already there, or nothing reused)
};

// A batch of store rows as flat arrays (Arrow list columns as offsets + values). Pointers stay owned by
// the caller; lists may be absent (null offsets pointer: every row's list is empty).
struct ReplayBatch {
  int64_t n = 0;
  const int64_t* code = nullptr;      // session code per row
  const uint8_t* slow = nullptr;      // 1: Python reads this row (raw line, extra fields, missing keys)
  const uint8_t* last = nullptr;      // 1: the session's last call (its state is freed after it)
  const int64_t* part = nullptr;      // partition index
  const int64_t* row = nullptr;       // row number in its partition
  const int64_t* parent = nullptr;    // parent_call (-1: none)
  const int64_t* shared = nullptr;    // shared_len
  const int64_t* prompt_len = nullptr;  // -1: the prompt is not delta-encoded
  const int32_t* suffix_off = nullptr; const int32_t* suffix = nullptr;  // Arrow list<int32> offsets, values
  const int32_t* gen_off = nullptr; const int32_t* gen = nullptr;
  const int32_t* drained_off = nullptr; const int32_t* drained = nullptr;
  const int32_t* ckpt_off = nullptr; const int32_t* ckpt = nullptr;
  const double* prefill_ms = nullptr;  // NaN: none recorded
  // row i's id lists are at list row perm[i] (a batch merged from several partitions keeps its lists in
  // place and orders only the scalars); nullptr: at row i
  const int64_t* perm = nullptr;
};

// Per-row outputs of `run` (arrays of n, written for the rows `run` steps).
struct ReplayOut {
  int64_t* prompt_len; int64_t* held_before; int64_t* lcp; int64_t* reused; int64_t* target;
  int64_t* reread; int64_t* snapshots; int64_t* index; int64_t* gen_len; int64_t* drained_len;
  int64_t* lcp_text;
  int64_t* restored;  // ReplayStep::restored
  int8_t* cause;  // a ReplayCause (Python reads it by name: _replay.Cause): the row's, by `attribute_call`
  int64_t* divergence;         // the divergence's ReplayCause when the prompt diverged, else -1 (none / new_session)
  int64_t* divergence_reread;  // the re-read's split (`attribute_call`)
  int64_t* engine_reread;
};

// Why a prompt left what a session held (strata_lab/replayer/divergence.py `find_divergence` + `classify`),
// and the engine causes a row of our engine may name (explain.attribute: `not_cached`, `last_output_token`).
// Exported to Python by name (`_replay.Cause`, `cause_name`): the names are strata_lab.rules.CAUSES'
// (tests/test_native_import.py checks it); the codes never leave C++ unnamed.
#define STRATA_REPLAY_CAUSES(X)                                                                              \
  X(none) X(new_session) X(retokenized_reply) X(retokenized_prompt) X(drained_dropped) X(template_rewrite)  \
  X(history_edit) X(no_state_checkpoint) X(not_cached) X(last_output_token)

enum class ReplayCause : int8_t {
#define STRATA_REPLAY_CAUSE(name) name,
  STRATA_REPLAY_CAUSES(STRATA_REPLAY_CAUSE)
#undef STRATA_REPLAY_CAUSE
};

// A divergence cause (strata_lab.rules.DIVERGENCE_CAUSES): the prompt's text parted from held.
inline bool is_divergence(ReplayCause c) {
  return c == ReplayCause::retokenized_reply || c == ReplayCause::retokenized_prompt ||
         c == ReplayCause::drained_dropped || c == ReplayCause::template_rewrite || c == ReplayCause::history_edit;
}

inline const char* cause_name(ReplayCause c) {
  switch (c) {
#define STRATA_REPLAY_CAUSE(name) \
  case ReplayCause::name:         \
    return #name;
    STRATA_REPLAY_CAUSES(STRATA_REPLAY_CAUSE)
#undef STRATA_REPLAY_CAUSE
  }
  return "?";
}

struct ReplayMiss {
  int64_t lcp_text = 0;       // held ids wholly before the first text divergence
  int64_t byte_in_token = 0;  // offset of the first differing byte inside held[lcp_text]
  int64_t prompt_read = 0;    // prompt ids the walk read (absolute position)
  std::string pbuf;           // prompt bytes read past the held text matched
  bool retokenized = false;
  ReplayCause cause = ReplayCause::none;
  // the context windows divergence.add_contexts shows, as bytes (Python decodes and quotes them)
  std::string id_before, id_held_after, id_prompt_after;
  bool has_text = false;  // the held text parts (lcp_text < held): the text windows below are set
  std::string text_before, text_held_after, text_prompt_after;
  std::vector<int32_t> held_at, prompt_at;  // a few ids at the id divergence
  int64_t tail = 0;  // a divergence's realigned tail: held ids past lcp_text the prompt repeats past lcp
  int64_t row = -1;                         // the batch row (`run`'s misses)
};

// How many ids of h[0:nh] the prompt p[0:np] repeats in order (runs of at least 8 ids, matched greedily left
// to right): strata_lab/replayer/explain.py `realigned_tail`, the same matches (the same 8-id hashes too).
int64_t realigned_tail(const int32_t* h, int64_t nh, const int32_t* p, int64_t np);

// One call's (cause, reread, divergence, divergence_reread, engine_reread): strata_lab/replayer/step.py
// `attribute_row` (explain.attribute, with state.shortfall_cause) for our engine. `cause`: the classified one
// (classify's), `tail`: the realigned tail when it is a divergence.
struct ReplayAttribution {
  ReplayCause cause = ReplayCause::none;
  ReplayCause divergence = ReplayCause::none;  // none / new_session, or the divergence cause
  int64_t reread = 0, divergence_reread = 0, engine_reread = 0;
};
ReplayAttribution attribute_call(bool hybrid, int64_t held_before, int64_t lcp, int64_t lcp_text, int64_t plen,
                                 int64_t reused, ReplayCause cause, int64_t tail);

// A tokenizer's bytes per id (id i is blob[off[i]:off[i+1]]) and the ids classify reads; built once per
// tokenizer and shared by every core.
struct ReplayVocab {
  std::string blob;
  std::vector<int64_t> off;
  int64_t im_start = -1, assistant = -1;  // -1: none
  ReplayVocab(std::string blob, std::vector<int64_t> off, int64_t im_start, int64_t assistant);
  int64_t size() const { return int64_t(off.size()) - 1; }
  std::string_view token(int64_t id) const;
};

class ReplayCore {
 public:
  explicit ReplayCore(ReplayRules rules);

  // Steps rows [start, n) until one needs Python; returns its index (n: the batch is done). Misses are
  // explained here once the vocabulary is set (else `run` stops at them), their windows kept in `misses`.
  int64_t run(const ReplayBatch& b, int64_t start, const ReplayOut& out);
  std::vector<ReplayMiss> take_misses() { return std::exchange(misses_, {}); }

  bool has(int64_t code) const { return sessions_.count(code) != 0; }
  void open(int64_t code);
  void close(int64_t code);
  const ReplaySession& session(int64_t code) const;

  // Common prefix of ids[0:n] with the session's held ids from `from` on.
  int64_t lcp_with(int64_t code, int64_t from, const int32_t* ids, int64_t n) const;
  ReplayPlan plan(int64_t code, int64_t prompt_len, int64_t lcp) const;
  // Makes the call: the prompt is held[:lcp] + tail; then the reply (gen, drained) joins held.
  // `ckpts` (recorded-checkpoint rules only) replaces the snapshots after the call.
  ReplayStep advance(int64_t code, int64_t prompt_len, int64_t lcp, const int32_t* tail, int64_t ntail,
                     const int32_t* gen, int64_t ngen, const int32_t* drained, int64_t ndrained,
                     const int32_t* ckpts, int64_t nckpts, int64_t part, int64_t row);
  void add_recorded_ms(double ms);

  void set_vocab(std::shared_ptr<const ReplayVocab> vocab) { vocab_ = std::move(vocab); }
  bool has_vocab() const { return vocab_ != nullptr; }
  // The divergence of prompt = held[:lcp] + ptail from the session's held ids (lcp < held), and its cause
  // given the call's plan (reused, target). Changes nothing.
  ReplayMiss explain(int64_t code, int64_t lcp, const int32_t* ptail, int64_t nptail, int64_t reused,
                     int64_t target) const;

  double recorded_ms() const { return recorded_ms_; }
  bool has_recorded_ms() const { return has_recorded_; }
  int64_t peak_bytes() const;
  int64_t live_sessions() const { return int64_t(sessions_.size()); }
  const ReplayRules& rules() const { return rules_; }

 private:
  ReplaySession& get(int64_t code);
  void cut(ReplaySession& s, int64_t n, int64_t origins);  // snapshots past n, segment origins past `origins`
  void touch(ReplaySession& s, int64_t pos);
  void snapshot_span(ReplaySession& s, int64_t start, int64_t end, bool prompt_end);
  void note_peak(int64_t code, const ReplaySession& s);

  std::string_view token(int64_t id) const { return vocab_->token(id); }

  ReplayRules rules_;
  std::shared_ptr<const ReplayVocab> vocab_;
  std::vector<ReplayMiss> misses_;
  std::unordered_map<int64_t, std::unique_ptr<ReplaySession>> sessions_;
  std::unordered_map<int64_t, int64_t> peak_;  // code -> most snapshot bytes it held (kept after close)
  uint64_t tick_ = 0;
  double recorded_ms_ = 0.0;
  bool has_recorded_ = false;
};

}  // namespace strata
