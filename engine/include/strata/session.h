// A session: the ids it holds, its model state, its checkpoints; generate() applies Contract 1
// (docs/CONTRACTS.md) and runs the decode loop with STOP and drain.
//
// Reuse rule (strata/reuse_rule.h `plan_reuse`, shared with the store replay; the Python replay models it):
//   lcp = longest common prefix of prompt and held.
//   If prompt == held (lcp == len(prompt) == len(held)): reuse = len(prompt); nothing is read, the
//   logits saved after the last held id are used (the session always keeps them).
//   Else if prompt is a prefix of held (lcp == len(prompt)) and a checkpoint sits exactly at
//   len(prompt): reuse = len(prompt); nothing is read, the engine restores that snapshot (KV cut to it)
//   and uses the logits the snapshot saved (used_saved_logits, restored_checkpoint = len(prompt)).
//   This serves a retry / regenerate of the same prompt after a reply on every model.
//   Otherwise l = min(lcp, len(prompt) - 1)  -- at least the last prompt token is read, for its logits --
//   attention-only model: reuse = l;
//   hybrid model: reuse = l if l == len(held), else the largest checkpoint c <= l (0 if none); the
//   engine restores that snapshot and cuts the KV caches to c.
// The checkpoint policy applies to every model: every snapshot holds the logits after its last id
// (vocab_size floats, counted in snapshot_bytes and the budget); an attention-only model's snapshot
// holds only those (its KV cache can be cut anywhere).
// before_last: a prompt read is split at p = the index of the last occurrence of that id in the prompt
// when reused < p (p < len(prompt) always), so the snapshot at p is exact and keeps the logits after p.
// Every generated id, drained ids included, is read into the state before the call returns, so held
// = prompt + gen_ids + drained_ids afterwards.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "strata/checkpoint_policy.h"
#include "strata/logprobs.h"
#include "strata/model.h"
#include "strata/sampler.h"

namespace strata {

struct GenerateOptions {
  int64_t max_new_tokens = 0;        // 0: prompt-only call
  SamplingParams sampling;
  std::vector<int32_t> stop_ids;     // finish "stop" after producing one of these (it is kept)
  bool has_force = false;
  std::vector<int32_t> force_ids;    // decode these instead of sampling (min(len, max_new_tokens) steps)
  int64_t stop_latency = 0;          // steps between a STOP request and the loop acting on it (models a late STOP)
  bool paced = false;                // a streamed call keeps at most one id ahead of its reader (StreamReader)
  int64_t logprobs = -1;             // -1: off; n >= 0: each produced id's logprob and its n best alternatives
  TokenMaskFn token_mask;            // grammar mask applied to a copy of the logits before each sampled step
};

struct GenerateResult {
  int64_t prompt_len = 0;
  int64_t reused = 0;                // prompt ids taken from the state
  int64_t tokens_read = 0;           // prompt ids read (prompt_len - reused)
  int64_t lcp = 0;                   // common prefix with the held ids before the call
  int64_t held_before = 0;
  int64_t restored_checkpoint = -1;  // position of the snapshot restored, -1 if none
  bool used_saved_logits = false;
  std::vector<int32_t> gen_ids, drained_ids;
  std::vector<TokenLogprob> logprobs;  // one per gen_ids entry when opts.logprobs >= 0
  std::string finish;                // "stop" | "length" | "cancelled"
  double prefill_ms = 0, decode_ms = 0;
  std::vector<int64_t> checkpoints;  // after the call
};

// The reader of a streamed call (StreamJob), as the decode loop sees it.
// stop_at(): how many ids the reader had taken when it asked to STOP, -1 while it has not.
// Unpaced (the default), a STOP counts from the step during which the loop first sees it, so ids the loop
// produced while the reader was behind are still generated ones. Paced (GenerateOptions::paced), the loop
// samples id i only once the reader took ids [0, i) or asked to STOP, and a STOP counts from the reader's
// position: the ids after it are drained, exactly stop_latency of them when stop_latency >= 1 (with 0, the
// id being sampled when the STOP came, or none). A paced stream must be read to its end (or released).
class StreamReader {
 public:
  virtual ~StreamReader() = default;
  virtual int64_t stop_at() const = 0;
  virtual bool has_taken(int64_t n) const = 0;
  virtual void wait_taken(int64_t n) = 0;  // returns once n ids were taken, a STOP was asked, or the reader let go
};

class Session {
 public:
  Session(std::shared_ptr<Model> model, std::string name, CheckpointPolicy policy);
  const std::string& name() const { return name_; }
  // Throws std::invalid_argument (bad ids, negative max_new_tokens, context overflow, ...) or
  // std::runtime_error (session busy) before any work.
  void validate(const std::vector<int32_t>& prompt, const GenerateOptions& opts) const;
  // The reuse Contract 1 gives for this prompt, without doing anything.
  struct ReusePlan { int64_t lcp = 0, reused = 0, restore = -1; bool saved_logits = false; };
  ReusePlan plan(const std::vector<int32_t>& prompt) const;
  // Runs one call. on_token gets each id that is not drained, as soon as it is produced, with its
  // logprob entry (null when opts.logprobs < 0). the reader (may be null) may
  // ask to STOP from another thread at any time (see StreamReader).
  using OnToken = std::function<void(int32_t, const TokenLogprob*)>;
  GenerateResult generate(const std::vector<int32_t>& prompt, const GenerateOptions& opts,
                          const OnToken& on_token, StreamReader* reader);

  std::vector<int32_t> held() const;
  // Logits after the last held id (empty when nothing is held).
  std::vector<float> last_logits() const;
  std::vector<int64_t> checkpoints() const;
  int64_t memory_bytes() const;      // state + snapshots + saved logits
  int64_t snapshot_bytes() const;
  const CheckpointPolicy& policy() const { return policy_; }
  void set_policy(const CheckpointPolicy& p);
  void reset();
  bool busy() const { return busy_.load(); }
  // Claimed by a running call; the StreamJob claims it before its thread starts.
  bool try_claim() { bool f = false; return busy_.compare_exchange_strong(f, true); }
  void release() { busy_.store(false); }

 private:
  void cut_to(int64_t pos, int64_t restore);
  void read(const int32_t* ids, int64_t n, bool want_logits);
  void maybe_checkpoint(bool prompt_end);
  void take_checkpoint();
  void enforce_budget();
  bool is_checkpoint_pos(int64_t pos) const;
  int64_t before_last_pos(const std::vector<int32_t>& prompt) const;

  std::shared_ptr<Model> model_;
  std::string name_;
  CheckpointPolicy policy_;
  std::unique_ptr<SessionState> state_;
  std::vector<int32_t> held_;
  std::vector<float> last_logits_;   // logits after held_.back(); valid when !held_.empty()
  struct Entry { StateSnapshot snap; uint64_t last_used = 0; };
  std::map<int64_t, Entry> snapshots_;
  uint64_t tick_ = 0;
  int64_t extra_pos_ = -1;           // the before_last position of the prompt being read (-1: none)
  mutable std::mutex mu_;            // guards held_/snapshots_ for readers while a call runs
  std::atomic<bool> busy_{false};
};

}  // namespace strata
