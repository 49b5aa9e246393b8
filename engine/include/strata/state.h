// Per-session model state: one LayerState per layer plus the position counter.
// Attention layers can be cut back to any prefix for free; recurrent layers (Gated DeltaNet) cannot and
// need snapshots (checkpoints) taken at exact positions. The Session (session.h) applies Contract 1 on top.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

namespace strata {

// Storage of the f32 and f16 KV cache arrays. An array of >= 2 MiB starts on a 2 MiB boundary and is advised
// as transparent huge pages (THP "madvise" mode) before anything touches it, as the weights are (model.cpp):
// decode attention streams every layer's cache with software prefetch, and on 4 KiB pages each thread's rows
// (a 1 KiB piece of each 2 KiB row at the 0.6B shape, 2 threads) meet a new page every two rows (the kernel at
// 1,024 keys, one thread: 1.03-1.27x on huge pages; benchmarks/results/kv_hugepages.md).
// Every array starts on a cache line (malloc aligns to 16 bytes only: 17 lines per 1 KiB span, not 16).
// STRATA_KV_HUGEPAGES=0 (read at each allocation): plain pages (A/B). The same values either way.
void* kv_alloc(size_t bytes);
void kv_free(void* p, size_t bytes) noexcept;  // bytes: as allocated
template <class T>
struct KVAlloc {
  using value_type = T;
  KVAlloc() = default;
  template <class U>
  KVAlloc(const KVAlloc<U>&) noexcept {}
  T* allocate(size_t n) { return static_cast<T*>(kv_alloc(n * sizeof(T))); }
  void deallocate(T* p, size_t n) noexcept { kv_free(p, n * sizeof(T)); }
  template <class U>
  bool operator==(const KVAlloc<U>&) const noexcept { return true; }
  template <class U>
  bool operator!=(const KVAlloc<U>&) const noexcept { return false; }
};
template <class T>
using KVVector = std::vector<T, KVAlloc<T>>;

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
// format() F16: the cache holds K and V in f16 (kv_cache "f16", or the kv_f16 kernel option for an "auto"
// cache, read when the cache is created). append() then returns f32 staging rows for the chunk; commit() (after
// K's norm and RoPE) rounds them into the cache, which attention then reads -- prefill and decode alike, so
// decode still equals the full forward.
// format() Q8: the cache holds K and V as int8 in blocks of 32 values along head_dim, one f16 scale per block
// (absmax / 127: llama.cpp's q8_0, kernels::quantize_q8_rows): commit() quantises the staged rows that way.
enum class KVFormat { F32, F16, Q8 };
constexpr int kQ8Block = 32;  // values per q8 scale (head_dim must be a multiple)
// The q8 cache is one byte array of pages of kQ8Page positions (a key tile of the attention kernel,
// kernels_attention.cpp ATT_KT), kv head by kv head: [n_kv_heads][capacity pages][run], a kv head's part of a page
// one run of q8_run_bytes(head_dim) bytes holding its K, V and their scales:
//   K [head_dim / 4][kQ8Page][4] int8: the 4 values d .. d + 3 of 16 consecutive keys one 64-byte line, so a
//     VNNI dot against 4 query bytes gives 16 keys' partial dots in their own lanes (no reduction across lanes);
//   V [kQ8Page / 2][head_dim][2] int8: the positions in pairs, interleaved value by value, so widening 16 bytes
//     to int16 gives the (key 2i, key 2i + 1) pairs that pmaddwd / vpdpwssd weigh by (w_2i, w_2i + 1);
//   K's scales [head_dim / 32][kQ8Page] f16, block-major (a block's scales of 16 keys one load);
//   V's scales [kQ8Page][head_dim / 32] f16, key by key (the P V weights take them per key).
// Decode splits the kv heads over the threads and each thread reads its heads one after the other, so all it
// reads is one contiguous stream (read alone: 32.2-34.9 GB/s, against 27.0-30.6 for a run of kv heads per page and
// 21.1-30.6 with K, V and the scales in four arrays; benchmarks/kernels/q8_read_pattern.cpp, s8). The capacity
// grows by half as the cache does (each kv head's pages copied to its new place, as a vector's grow would copy
// them). Every part starts on a 64-byte line.
constexpr int kQ8Page = 64;
// Bytes of one kv head's run of a page: K and V (kQ8Page * head_dim each) and their f16 scales.
inline int64_t q8_run_bytes(int head_dim) {
  return int64_t(kQ8Page) * (2 * head_dim + 2 * 2 * (head_dim / kQ8Block));
}
// Offset of the run of position pos's page and kv head g (its K) in a cache of cap pages per kv head, and of
// its V and scales within the run.
inline int64_t q8_run_offset(int64_t pos, int g, int64_t cap, int head_dim) {
  return (g * cap + pos / kQ8Page) * q8_run_bytes(head_dim);
}
inline int64_t q8_run_v(int head_dim) { return int64_t(kQ8Page) * head_dim; }
inline int64_t q8_run_kscales(int head_dim) { return int64_t(2) * kQ8Page * head_dim; }
inline int64_t q8_run_vscales(int head_dim) { return q8_run_kscales(head_dim) + 2 * kQ8Page * (head_dim / kQ8Block); }
// Byte offset of value d of position pos, kv head g: K's, V's.
inline int64_t q8_k_offset(int64_t pos, int g, int d, int64_t cap, int head_dim) {
  return q8_run_offset(pos, g, cap, head_dim) + (d / 4) * (4 * kQ8Page) + (pos % kQ8Page) * 4 + d % 4;
}
inline int64_t q8_v_offset(int64_t pos, int g, int d, int64_t cap, int head_dim) {
  return q8_run_offset(pos, g, cap, head_dim) + q8_run_v(head_dim) + (pos % kQ8Page / 2) * (2 * head_dim) +
         2 * d + pos % 2;
}
// Byte offset of the f16 scale of block b (values 32 b .. 32 b + 31) of position pos, kv head g: K's, V's.
inline int64_t q8_kscale_offset(int64_t pos, int g, int b, int64_t cap, int head_dim) {
  return q8_run_offset(pos, g, cap, head_dim) + q8_run_kscales(head_dim) + 2 * (b * kQ8Page + pos % kQ8Page);
}
inline int64_t q8_vscale_offset(int64_t pos, int g, int b, int64_t cap, int head_dim) {
  return q8_run_offset(pos, g, cap, head_dim) + q8_run_vscales(head_dim) +
         2 * ((pos % kQ8Page) * (head_dim / kQ8Block) + b);
}
// A row of a q8 cache (head_dim values of position pos, kv head g, and their head_dim / 32 f16 scales) to its
// places in the cache: K's (keys) or V's.
inline void q8_put_row(const int8_t* row, const uint16_t* scales, int64_t pos, int g, int64_t cap, int head_dim,
                       bool keys, int8_t* cache) {
  if (keys) {
    int8_t* dst = cache + q8_k_offset(pos, g, 0, cap, head_dim);
    for (int d = 0; d < head_dim; d += 4)
      for (int e = 0; e < 4; ++e) dst[d * kQ8Page + e] = row[d + e];
  } else {
    int8_t* dst = cache + q8_v_offset(pos, g, 0, cap, head_dim);
    for (int d = 0; d < head_dim; ++d) dst[2 * d] = row[d];
  }
  for (int b = 0; b < head_dim / kQ8Block; ++b) {
    const int64_t o = keys ? q8_kscale_offset(pos, g, b, cap, head_dim)
                           : q8_vscale_offset(pos, g, b, cap, head_dim);
    std::memcpy(cache + o, &scales[b], 2);
  }
}

class AttentionKV final : public LayerState {
 public:
  AttentionKV(int n_kv_heads, int head_dim, KVFormat format);  // Q8: head_dim a multiple of kQ8Block
  int64_t length() const { return length_; }
  int64_t row() const { return int64_t(n_kv_heads_) * head_dim_; }
  // Makes room for n more tokens; returns pointers to rows [length, length + n) and advances length.
  void append(int64_t n, float** k_out, float** v_out);
  void commit();  // f16 / q8: round the rows append() returned into the cache (no-op for f32)
  KVFormat format() const { return format_; }
  const float* k() const { return k_.data(); }
  const float* v() const { return v_.data(); }
  const uint16_t* k16() const { return k16_.data(); }
  const uint16_t* v16() const { return v16_.data(); }
  const int8_t* q8() const { return q8_.data(); }  // q8: the pages (above)
  int64_t q8_capacity() const { return q8_cap_; }   // q8: pages per kv head
  // Attention of n queries q [n, H, hd] at positions length() - n .. length() - 1 over this cache (after
  // commit()), into out [n, H, hd]: the kernel of the cache's format.
  void attend(const float* q, int64_t n, int H, float* out) const;

  int64_t bytes() const override {
    return int64_t((k_.capacity() + v_.capacity()) * sizeof(float) + (k16_.capacity() + v16_.capacity()) * 2 +
                   q8_.capacity());
  }
  bool can_truncate() const override { return true; }
  void truncate(int64_t n) override { if (n < length_) length_ = n; }
  std::unique_ptr<LayerSnapshot> snapshot() const override { return nullptr; }
  void restore(const LayerSnapshot&) override {}
  void reset() override {
    length_ = staged_ = 0;
    k_.clear(); v_.clear(); k_.shrink_to_fit(); v_.shrink_to_fit();
    k16_.clear(); v16_.clear(); k16_.shrink_to_fit(); v16_.shrink_to_fit();
    q8_.clear(); q8_.shrink_to_fit();
    q8_cap_ = 0;
  }

 private:
  int n_kv_heads_, head_dim_;
  KVFormat format_;
  int64_t length_ = 0, staged_ = 0;
  KVVector<float> k_, v_;            // the cache (f32), or the staged chunk (f16, q8)
  KVVector<uint16_t> k16_, v16_;     // the cache (f16)
  KVVector<int8_t> q8_;              // the cache (q8): pages of K, V and their scales
  int64_t q8_cap_ = 0;               // (q8) pages per kv head
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
