// Per-session model state: one LayerState per layer plus the position counter.
// Attention layers can be cut back to any prefix for free; recurrent layers (Gated DeltaNet) cannot and
// need snapshots (checkpoints) taken at exact positions. The Session (session.h) applies Contract 1 on top.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

namespace strata {

// A saved copy of the part of a layer's state that cannot roll back.
class LayerSnapshot {
 public:
  virtual ~LayerSnapshot() = default;
  virtual int64_t bytes() const = 0;
};

class LayerState {
 public:
  virtual ~LayerState() = default;
  // Bytes of memory held (KV cache, recurrent state).
  virtual int64_t bytes() const = 0;
  // True when truncate() can cut the state back to any earlier length (attention KV).
  virtual bool can_truncate() const = 0;
  // Cut back to the first n tokens. Only called with n <= the current length; for layers that cannot
  // truncate it is only called after restore() of a snapshot taken at n (or with n == the current length).
  virtual void truncate(int64_t n) = 0;
  // Copy of the non-rollback part of the state, or nullptr when there is none (attention).
  virtual std::unique_ptr<LayerSnapshot> snapshot() const = 0;
  virtual void restore(const LayerSnapshot& snap) = 0;
  virtual void reset() = 0;
};

// KV cache of one attention layer. k, v: [capacity, n_kv_heads, head_dim]; K is stored after k_norm
// and RoPE. Used by Qwen3 attention and by Qwen3-Next gated attention.
// half(): the cache holds K and V in f16 (the kv_f16 kernel option, read when the cache is created; off by
// default: f16 rounding breaks parity with transformers f32). append() then returns f32 staging rows for the
// chunk; commit() (after K's norm and RoPE) rounds them into the cache, which attention then reads -- prefill
// and decode alike, so decode still equals the full forward.
class AttentionKV final : public LayerState {
 public:
  AttentionKV(int n_kv_heads, int head_dim, bool half);  // half: an f16 cache (commit() rounds)
  int64_t length() const { return length_; }
  int64_t row() const { return int64_t(n_kv_heads_) * head_dim_; }
  // Makes room for n more tokens; returns pointers to rows [length, length + n) and advances length.
  void append(int64_t n, float** k_out, float** v_out);
  void commit();  // half: round the rows append() returned into the cache (no-op otherwise)
  bool half() const { return half_; }
  const float* k() const { return k_.data(); }
  const float* v() const { return v_.data(); }
  const uint16_t* k16() const { return k16_.data(); }
  const uint16_t* v16() const { return v16_.data(); }

  int64_t bytes() const override {
    return int64_t((k_.capacity() + v_.capacity()) * sizeof(float) + (k16_.capacity() + v16_.capacity()) * 2);
  }
  bool can_truncate() const override { return true; }
  void truncate(int64_t n) override { if (n < length_) length_ = n; }
  std::unique_ptr<LayerSnapshot> snapshot() const override { return nullptr; }
  void restore(const LayerSnapshot&) override {}
  void reset() override {
    length_ = staged_ = 0;
    k_.clear(); v_.clear(); k_.shrink_to_fit(); v_.shrink_to_fit();
    k16_.clear(); v16_.clear(); k16_.shrink_to_fit(); v16_.shrink_to_fit();
  }

 private:
  int n_kv_heads_, head_dim_;
  bool half_;
  int64_t length_ = 0, staged_ = 0;
  std::vector<float> k_, v_;         // the cache (f32), or the staged chunk (half)
  std::vector<uint16_t> k16_, v16_;  // the cache (half)
};

// Everything a model needs to continue a sequence: per-layer states and the number of tokens read
// (the next RoPE position).
struct SessionState {
  std::vector<std::unique_ptr<LayerState>> layers;
  int64_t n_tokens = 0;

  int64_t bytes() const;
  bool can_truncate() const;  // every layer can truncate (attention-only model)
  void truncate(int64_t n);   // all layers; see LayerState::truncate
  void reset();
};

// Snapshot of a whole SessionState at position `pos` (entries are nullptr for truncatable layers), plus
// the logits after the token at pos - 1 (set by the Session), so a prompt ending exactly at pos needs no
// re-read. An attention-only model's snapshot is just pos + logits.
struct StateSnapshot {
  int64_t pos = 0;
  std::vector<std::unique_ptr<LayerSnapshot>> layers;
  std::vector<float> logits;  // vocab_size floats; counted in bytes()
  int64_t bytes() const;
  static StateSnapshot take(const SessionState& st);
  // Restores recurrent layers and cuts truncatable layers to pos.
  void restore_into(SessionState& st) const;
};

}  // namespace strata
