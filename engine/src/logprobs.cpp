#include "strata/logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace strata {

TokenLogprob token_logprob(const float* logits, int64_t V, int32_t id, int64_t top_n) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < V; ++i) mx = std::max(mx, logits[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < V; ++i) sum += std::exp(double(logits[i]) - double(mx));
  const double lse = double(mx) + std::log(sum);
  TokenLogprob out;
  out.id = id;
  out.logprob = float(double(logits[id]) - lse);
  if (top_n > 0) {
    const int64_t n = std::min<int64_t>(top_n, V);
    std::vector<int32_t> idx(static_cast<size_t>(V));
    for (int64_t i = 0; i < V; ++i) idx[size_t(i)] = int32_t(i);
    auto better = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
    std::partial_sort(idx.begin(), idx.begin() + n, idx.end(), better);
    out.top.reserve(size_t(n));
    for (int64_t k = 0; k < n; ++k)
      out.top.emplace_back(idx[size_t(k)], float(double(logits[idx[size_t(k)]]) - lse));
  }
  return out;
}

bool apply_token_mask(float* logits, int64_t V, const uint32_t* bits) {
  bool any = false;
  for (int64_t w = 0; w < (V + 31) / 32 && !any; ++w) any = bits[w] != 0;
  if (!any) return false;
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < V; ++i)
    if (!((bits[i >> 5] >> (i & 31)) & 1u)) logits[i] = ninf;
  return true;
}

}  // namespace strata
