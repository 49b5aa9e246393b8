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
class AttentionKV final : public LayerState {
 public:
  AttentionKV(int n_kv_heads, int head_dim) : n_kv_heads_(n_kv_heads), head_dim_(head_dim) {}
  int64_t length() const { return length_; }
  int64_t row() const { return int64_t(n_kv_heads_) * head_dim_; }
  // Makes room for n more tokens; returns pointers to rows [length, length + n) and advances length.
  void append(int64_t n, float** k_out, float** v_out);
  const float* k() const { return k_.data(); }
  const float* v() const { return v_.data(); }

  int64_t bytes() const override { return int64_t((k_.capacity() + v_.capacity()) * sizeof(float)); }
  bool can_truncate() const override { return true; }
  void truncate(int64_t n) override { if (n < length_) length_ = n; }
  std::unique_ptr<LayerSnapshot> snapshot() const override { return nullptr; }
  void restore(const LayerSnapshot&) override {}
  void reset() override { length_ = 0; k_.clear(); v_.clear(); k_.shrink_to_fit(); v_.shrink_to_fit(); }

 private:
  int n_kv_heads_, head_dim_;
  int64_t length_ = 0;
  std::vector<float> k_, v_;
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
