#include "strata/state.h"

#include <algorithm>

namespace strata {

void AttentionKV::append(int64_t n, float** k_out, float** v_out) {
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
