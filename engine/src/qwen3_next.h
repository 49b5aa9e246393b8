// Qwen3-Next model (model_type "qwen3_next") and its session with recurrent-state checkpoints.
//
// Weights are fp32 tensors handed over by name (HF names); the model validates names and shapes.
// A NextSession implements Contract 1 for hybrid models (DESIGN.md):
//   lcp = common prefix of prompt and held; reuse = lcp if lcp == len(held), else the largest checkpoint
//   c <= lcp (0 if none), whose GDN snapshot is restored while the attention KV is cut to c.
// Snapshots hold every GDN layer's conv window + fp32 S and the logits at that position, so a prompt
// that ends exactly at a checkpoint needs no re-read ("saved" logits).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "gated_attention.h"
#include "gdn.h"
#include "moe.h"

namespace strata::next {

struct NextConfig {
  int vocab = 0, D = 0, layers = 0;
  int H = 0, Hkv = 0, hd = 0, I = 0;
  int Hk = 0, Hv = 0, dk = 0, dv = 0, K = 4;
  int rd = 0;
  float theta = 10000.f, eps = 1e-6f;
  int E = 0, top_k = 1, moe_I = 0, shared_I = 0;
  bool norm_topk_prob = true, tie = false;
  std::vector<int> attn_layers;  // 1 = full attention, 0 = GDN, per layer
  std::vector<int> moe_layers;   // 1 = MoE MLP, 0 = dense MLP, per layer
  void validate() const;         // throws std::invalid_argument naming the field
};

struct NextState {
  std::vector<GdnState> gdn;  // indexed by layer (empty for attention layers)
  std::vector<KvCache> kv;    // indexed by layer (empty for GDN layers)
  int pos = 0;
  size_t gdn_bytes() const;
};

class NextModel {
 public:
  NextModel(NextConfig cfg, std::unordered_map<std::string, std::vector<float>> tensors,
            std::unordered_map<std::string, std::vector<int64_t>> shapes);
  const NextConfig& config() const { return cfg_; }
  NextState new_state() const;
  // Run ids through the model from `st` (advancing it). If all_logits, writes [T, V] to logits;
  // otherwise only the last row [V].
  void forward(NextState& st, const int* ids, int T, float* logits, bool all_logits,
               DeltaMode mode = DeltaMode::Auto) const;
  // Per-layer-kind timing hook for benchmarks: seconds spent in GDN / attention mixers so far.
  mutable double gdn_seconds = 0, attn_seconds = 0;

 private:
  struct Layer {
    bool attn = false, moe = false;
    const float *in_norm = nullptr, *post_norm = nullptr;
    GdnWeights gdn;
    AttnWeights att;
    MlpWeights mlp;
    MoeWeights moe_w;
  };
  const float* need(const std::string& name, std::vector<int64_t> shape);
  NextConfig cfg_;
  GdnDims gd_;
  AttnDims ad_;
  std::unordered_map<std::string, std::vector<float>> t_;
  std::vector<Layer> layers_;
  const float *embed_ = nullptr, *final_norm_ = nullptr, *lm_head_ = nullptr;
};

struct CheckpointPolicy {
  bool at_prompt_end = true;   // snapshot at the end of each prompt (the turn start)
  int every = 0;               // also at every multiple of N tokens, inside replies too (0 = off)
  std::vector<int> positions;  // also at these absolute positions
  double budget_mib = 0;       // LRU-evict snapshots beyond this many MiB (0 = unlimited)
};

struct CallReport {
  int prompt_len = 0, lcp = 0, reused = 0, read = 0;
  int restored = -1;            // checkpoint position restored, -1 when the live state was extended
  bool logits_saved = false;    // reuse == prompt_len answered from saved logits
  std::vector<int> gen_ids;
  std::vector<int> evicted;     // checkpoints dropped by the budget during this call
  double prefill_ms = 0, decode_ms = 0, snapshot_ms = 0;
  int snapshots_taken = 0;
};

class NextSession {
 public:
  NextSession(const NextModel& m, CheckpointPolicy p);
  // Greedy generation (or teacher forcing with force_ids). max_new_tokens = 0: prompt-only call.
  CallReport generate(const std::vector<int>& prompt, int max_new_tokens, const std::vector<int>& stop_ids,
                      const std::vector<int>& force_ids);
  const std::vector<int>& held() const { return held_; }
  std::vector<int> checkpoints() const;
  size_t snapshot_bytes() const;
  size_t state_bytes() const;  // live GDN state + KV cache
  const std::vector<float>& last_logits() const { return logits_; }
  void reset();
  CheckpointPolicy policy;

 private:
  struct Snapshot {
    std::vector<GdnState> gdn;
    std::vector<float> logits;
    uint64_t used = 0;
    size_t bytes = 0;
  };
  bool wants_snapshot(int pos, int prompt_len) const;
  void take_snapshot(CallReport& r);
  void enforce_budget(CallReport& r);
  void step(const int* ids, int T);  // advance state and logits_
  const NextModel& m_;
  NextState st_;
  std::vector<int> held_;
  std::vector<float> logits_;
  std::map<int, Snapshot> ckpt_;
  uint64_t tick_ = 0;
};

}  // namespace strata::next
