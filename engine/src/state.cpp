#include "strata/state.h"

#include "strata/kernels.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

namespace strata {

// >= 2 MiB: a mapping of its own (fresh pages, 2 MiB-aligned, the length rounded up to whole pages only: no
// memory added), advised before the vector first touches it; smaller arrays 64-byte aligned from malloc.
constexpr size_t kKVHuge = size_t(2) << 20;
static size_t kv_page() {
  static const size_t page = [] {
    const long p = ::sysconf(_SC_PAGESIZE);
    return p > 0 ? size_t(p) : size_t(4096);
  }();
  return page;
}

void* kv_alloc(size_t bytes) {
  if (bytes < kKVHuge) {  // on a cache line: a thread's span of every row starts on one (16 lines, not 17)
    void* p = nullptr;
    if (::posix_memalign(&p, 64, bytes ? bytes : 1) != 0) throw std::bad_alloc();
    return p;
  }
  const size_t len = (bytes + kv_page() - 1) / kv_page() * kv_page();
  void* m = ::mmap(nullptr, len + kKVHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) throw std::bad_alloc();
  const uintptr_t lo = reinterpret_cast<uintptr_t>(m), a = (lo + kKVHuge - 1) / kKVHuge * kKVHuge;
  if (a > lo) ::munmap(m, a - lo);
  if (lo + len + kKVHuge > a + len) ::munmap(reinterpret_cast<void*>(a + len), lo + len + kKVHuge - (a + len));
#ifdef MADV_HUGEPAGE
  const char* env = std::getenv("STRATA_KV_HUGEPAGES");
  if (!(env && std::string(env) == "0")) ::madvise(reinterpret_cast<void*>(a), len, MADV_HUGEPAGE);  // advisory
#endif
  return reinterpret_cast<void*>(a);
}

void kv_free(void* p, size_t bytes) noexcept {
  if (!p) return;
  if (bytes < kKVHuge) std::free(p);
  else ::munmap(p, (bytes + kv_page() - 1) / kv_page() * kv_page());
}

AttentionKV::AttentionKV(int n_kv_heads, int head_dim, KVFormat format)
    : n_kv_heads_(n_kv_heads), head_dim_(head_dim), format_(format) {
  if (format == KVFormat::Q8 && head_dim % kQ8Block != 0)
    throw std::invalid_argument("kv_cache 'q8' needs head_dim a multiple of " + std::to_string(kQ8Block) +
                                ", got " + std::to_string(head_dim));
}

void AttentionKV::append(int64_t n, float** k_out, float** v_out) {
  if (format_ != KVFormat::F32) {  // f16 / q8: the cache grows, the chunk is staged in f32
    const size_t need = size_t((length_ + n) * row());
    if (format_ == KVFormat::F16 && need > k16_.size()) {
      size_t cap = std::max(need, k16_.size() * 3 / 2 + size_t(64 * row()));
      k16_.resize(cap);
      v16_.resize(cap);
    }
    const int64_t want = (length_ + n + kQ8Page - 1) / kQ8Page;  // q8: pages per kv head (state.h)
    if (format_ == KVFormat::Q8 && want > q8_cap_) {  // each kv head's pages held so far to their new place
      const int64_t cap = std::max(want, q8_cap_ * 3 / 2 + 1), rb = q8_run_bytes(head_dim_);
      const int64_t held = (length_ + kQ8Page - 1) / kQ8Page;
      KVVector<int8_t> grown(size_t(n_kv_heads_ * cap * rb));
      for (int g = 0; g < n_kv_heads_; ++g)
        if (held)
          std::memcpy(grown.data() + g * cap * rb, q8_.data() + g * q8_cap_ * rb, size_t(held * rb));
      q8_.swap(grown);
      q8_cap_ = cap;
    }
    if (k_.size() < size_t(n * row())) {
      k_.resize(size_t(n * row()));
      v_.resize(size_t(n * row()));
    }
    *k_out = k_.data();
    *v_out = v_.data();
    staged_ = n;
    length_ += n;
    return;
  }
  const size_t need = size_t((length_ + n) * row());
  if (need > k_.size()) {
    size_t cap = std::max(need, k_.size() * 3 / 2 + size_t(64 * row()));
    k_.resize(cap);
    v_.resize(cap);
  }
  *k_out = k_.data() + length_ * row();
  *v_out = v_.data() + length_ * row();
  length_ += n;
}

void AttentionKV::commit() {
  if (format_ == KVFormat::F32 || !staged_) return;
  const int64_t m = staged_ * row(), o = (length_ - staged_) * row();
  if (format_ == KVFormat::F16) {
    kernels::f32_to_f16_rows(k_.data(), k16_.data() + o, m);
    kernels::f32_to_f16_rows(v_.data(), v16_.data() + o, m);
  } else {  // each (position, kv head) row to its place in the pages (blocks quantised on their own: the same
            // values as quantising the chunk at once)
    const int64_t p0 = length_ - staged_;
    const int nb = head_dim_ / kQ8Block;
    std::vector<float> sc(static_cast<size_t>(nb));  // (a row's scales: f16 values, then held as f16)
    std::vector<uint16_t> sc16(static_cast<size_t>(nb));
    std::vector<int8_t> q(static_cast<size_t>(head_dim_));
    for (int64_t i = 0; i < staged_; ++i)
      for (int g = 0; g < n_kv_heads_; ++g) {
        const int64_t src = (i * n_kv_heads_ + g) * head_dim_, p = p0 + i;
        for (const bool keys : {true, false}) {
          kernels::quantize_q8_rows((keys ? k_ : v_).data() + src, q.data(), sc.data(), head_dim_);
          for (int b = 0; b < nb; ++b) sc16[size_t(b)] = kernels::f32_to_f16(sc[size_t(b)]);  // (exact)
          q8_put_row(q.data(), sc16.data(), p, g, q8_cap_, head_dim_, keys, q8_.data());
        }
      }
  }
  if (staged_ > 64) {  // a prefill chunk's staging (2 x its rows in f32) is not kept: decode stages 1 row
    k_.clear(); v_.clear(); k_.shrink_to_fit(); v_.shrink_to_fit();
  }
  staged_ = 0;
}

void AttentionKV::attend(const float* q, int64_t n, int H, float* out) const {
  const int64_t pos0 = length_ - n;
  switch (format_) {
    case KVFormat::F16:
      kernels::attention_f16(q, n, H, n_kv_heads_, head_dim_, k16(), v16(), pos0, out);
      break;
    case KVFormat::Q8:
      kernels::attention_q8(q, n, H, n_kv_heads_, head_dim_, q8(), q8_cap_, pos0, out);
      break;
    default:
      kernels::attention(q, n, H, n_kv_heads_, head_dim_, k(), v(), pos0, out);
  }
}

int64_t SessionState::bytes() const {
  int64_t b = 0;
  for (const auto& l : layers) b += l->bytes();
  return b;
}

bool SessionState::can_truncate() const {
  for (const auto& l : layers)
    if (!l->can_truncate()) return false;
  return true;
}

void SessionState::truncate(int64_t n) {
  for (auto& l : layers) l->truncate(n);
  n_tokens = std::min(n_tokens, n);
}

void SessionState::reset() {
  for (auto& l : layers) l->reset();
  n_tokens = 0;
}

int64_t StateSnapshot::bytes() const {
  int64_t b = int64_t(logits.size() * sizeof(float));
  for (const auto& l : layers)
    if (l) b += l->bytes();
  return b;
}

StateSnapshot StateSnapshot::take(const SessionState& st) {
  StateSnapshot s;
  s.pos = st.n_tokens;
  for (const auto& l : st.layers) s.layers.push_back(l->snapshot());
  return s;
}

void StateSnapshot::restore_into(SessionState& st) const {
  for (size_t i = 0; i < st.layers.size(); ++i) {
    if (layers[i]) st.layers[i]->restore(*layers[i]);
    st.layers[i]->truncate(pos);
  }
  st.n_tokens = pos;
}

}  // namespace strata
