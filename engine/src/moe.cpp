#include "moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "next_ops.h"

namespace strata::next {

void mlp_forward(int D, const MlpWeights& w, const float* x, int T, float* out) {
  std::vector<float> g((size_t)T * w.I), u((size_t)T * w.I);
  matmul_t(x, T, D, w.gate, w.I, g.data());
  matmul_t(x, T, D, w.up, w.I, u.data());
  for (size_t i = 0; i < g.size(); ++i) g[i] = siluf(g[i]) * u[i];
  matmul_t(g.data(), T, w.I, w.down, D, out);
}

void moe_forward(int D, const MoeWeights& w, const float* x, int T, float* out, std::vector<int>* picked) {
  const int E = (int)w.experts.size(), k = w.top_k;
  // router: p = softmax_fp32(x Wr^T); top-k by probability (ties: lower index first, like torch.topk)
  std::vector<float> logits((size_t)T * E);
  matmul_t(x, T, D, w.router, E, logits.data());
  std::vector<std::vector<std::pair<int, float>>> by_expert(E);  // expert -> (token, weight)
  if (picked) picked->assign((size_t)T * k, -1);
  std::vector<int> idx(E);
  for (int t = 0; t < T; ++t) {
    float* l = logits.data() + (size_t)t * E;
    const float mx = *std::max_element(l, l + E);
    float sum = 0.f;
    for (int e = 0; e < E; ++e) { l[e] = std::exp(l[e] - mx); sum += l[e]; }
    for (int e = 0; e < E; ++e) l[e] /= sum;
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                      [&](int a, int b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    float norm = 0.f;
    for (int j = 0; j < k; ++j) norm += l[idx[j]];
    for (int j = 0; j < k; ++j) {
      const float p = w.norm_topk_prob ? l[idx[j]] / norm : l[idx[j]];
      by_expert[idx[j]].push_back({t, p});
      if (picked) (*picked)[(size_t)t * k + j] = idx[j];
    }
  }
  // shared expert, gated per token by sigmoid(x . w_sg)
  mlp_forward(D, w.shared, x, T, out);
  for (int t = 0; t < T; ++t) {
    const float s = sigmoidf(dot(x + (size_t)t * D, w.shared_gate, D));
    for (int i = 0; i < D; ++i) out[(size_t)t * D + i] *= s;
  }
  // routed experts: gather each expert's tokens, run its MLP once, scatter-add weighted rows
  std::vector<float> xs, ys;
  for (int e = 0; e < E; ++e) {
    const auto& rows = by_expert[e];
    if (rows.empty()) continue;
    const int n = (int)rows.size();
    xs.resize((size_t)n * D);
    ys.resize((size_t)n * D);
    for (int i = 0; i < n; ++i) std::copy(x + (size_t)rows[i].first * D, x + (size_t)(rows[i].first + 1) * D,
                                          xs.begin() + (size_t)i * D);
    mlp_forward(D, w.experts[e], xs.data(), n, ys.data());
    for (int i = 0; i < n; ++i) {
      float* o = out + (size_t)rows[i].first * D;
      const float p = rows[i].second;
      const float* y = ys.data() + (size_t)i * D;
      for (int j = 0; j < D; ++j) o[j] += p * y[j];
    }
  }
}

}  // namespace strata::next
