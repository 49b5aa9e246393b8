#include "moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "next_ops.h"
#include "strata/kernels.h"

namespace strata::next {

namespace k = kernels;

void mlp_forward(int64_t D, const MlpWeights& w, const float* x, int64_t T, float* out) {
  std::vector<float> g(size_t(T * w.I)), u(size_t(T * w.I));
  const k::MatOut gu[2] = {{&w.gate, g.data()}, {&w.up, u.data()}};
  k::matmul_multi(gu, 2, x, T);
  k::silu_mul(g.data(), u.data(), T * w.I);
  k::matmul(w.down, g.data(), T, out);
}

void moe_forward(int64_t D, const MoeWeights& w, const float* x, int64_t T, float* out) {
  const int64_t E = int64_t(w.experts.size()), kk = w.top_k;
  // router: p = softmax_fp32(x Wr^T); top-k by probability (ties: lower index first, like torch.topk)
  std::vector<float> logits(size_t(T * E));
  k::matmul(w.router, x, T, logits.data());
  std::vector<std::vector<std::pair<int64_t, float>>> by_expert{size_t(E)};  // expert -> (token, weight)
  std::vector<int64_t> idx(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    float* l = logits.data() + t * E;
    const float mx = *std::max_element(l, l + E);
    float sum = 0.f;
    for (int64_t e = 0; e < E; ++e) { l[e] = std::exp(l[e] - mx); sum += l[e]; }
    for (int64_t e = 0; e < E; ++e) l[e] /= sum;
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + kk, idx.end(),
                      [&](int64_t a, int64_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    float norm = 0.f;
    for (int64_t j = 0; j < kk; ++j) norm += l[idx[j]];
    for (int64_t j = 0; j < kk; ++j)
      by_expert[size_t(idx[j])].push_back({t, w.norm_topk_prob ? l[idx[j]] / norm : l[idx[j]]});
  }
  // The routed experts (each on its own tokens, gathered) run side by side, one MLP per thread, the largest
  // first: an expert's few rows (moe_intermediate_size) and tokens split poorly across threads, and one
  // parallel loop replaces three per MLP. A token's row does not depend on the thread or on the other tokens; the shared rows are gated and the
  // weighted routed rows added in expert order afterwards, so the sums are the sequential loop's bits.
  std::vector<int64_t> active;
  for (int64_t e = 0; e < E; ++e)
    if (!by_expert[size_t(e)].empty()) active.push_back(e);
  std::stable_sort(active.begin(), active.end(), [&](int64_t a, int64_t b) {
    return by_expert[size_t(a)].size() > by_expert[size_t(b)].size();
  });
  // A prefill's shared expert (all T tokens: a third of the work at top-4 of 16) runs on all threads first, so
  // it does not hold the loop up at more threads; a decode step's is one more task.
  auto shared = [&] {
    mlp_forward(D, w.shared, x, T, out);
    for (int64_t t = 0; t < T; ++t) {
      const float s = sigmoidf(k::dot(x + t * D, w.shared_gate.data(), D));
      for (int64_t c = 0; c < D; ++c) out[t * D + c] *= s;
    }
  };
  if (T > 8) shared();
  else active.insert(active.begin(), -1);
  std::vector<std::vector<float>> ys(static_cast<size_t>(E));
  const int64_t na = int64_t(active.size());
  const bool side_by_side = k::option("moe_parallel");
#pragma omp parallel for schedule(dynamic, 1) if (side_by_side)
  for (int64_t i = 0; i < na; ++i) {
    const int64_t e = active[size_t(i)];
    if (e < 0) {  // the shared expert, gated per token by sigmoid(x . w_sg)
      shared();
      continue;
    }
    const auto& rows = by_expert[size_t(e)];
    const int64_t n = int64_t(rows.size());
    std::vector<float> xs(size_t(n * D));
    for (int64_t r = 0; r < n; ++r) std::copy(x + rows[r].first * D, x + (rows[r].first + 1) * D, xs.begin() + r * D);
    ys[size_t(e)].resize(size_t(n * D));
    mlp_forward(D, w.experts[size_t(e)], xs.data(), n, ys[size_t(e)].data());
  }
  for (int64_t e = 0; e < E; ++e) {
    const auto& rows = by_expert[size_t(e)];
    for (size_t r = 0; r < rows.size(); ++r)
      k::axpy(rows[r].second, ys[size_t(e)].data() + r * D, out + rows[r].first * D, D);
  }
}

}  // namespace strata::next
