#include "gated_attention.h"

#include <algorithm>
#include <cmath>

#include "next_ops.h"

namespace strata::next {

void gated_attention_forward(const AttnDims& d, const AttnWeights& w, const float* x, int T, KvCache& cache,
                             float* out) {
  const int H = d.H, Hkv = d.Hkv, hd = d.hd, grp = H / Hkv;
  const int pos0 = cache.len(d), total = pos0 + T;
  std::vector<float> qg((size_t)T * 2 * H * hd), kn((size_t)T * Hkv * hd), vn((size_t)T * Hkv * hd);
  matmul_t(x, T, d.D, w.q_proj, 2 * H * hd, qg.data());  // [T, H, (q | gate)]
  matmul_t(x, T, d.D, w.k_proj, Hkv * hd, kn.data());    // [T, Hkv, hd]
  matmul_t(x, T, d.D, w.v_proj, Hkv * hd, vn.data());
  std::vector<float> tmp(hd);
  for (int t = 0; t < T; ++t) {
    for (int h = 0; h < H; ++h) {
      float* qh = qg.data() + ((size_t)t * H + h) * 2 * hd;
      rmsnorm_1p(qh, w.q_norm, hd, d.eps, tmp.data());
      std::copy(tmp.begin(), tmp.end(), qh);
      rope_partial(qh, d.rd, pos0 + t, d.theta);
    }
    for (int h = 0; h < Hkv; ++h) {
      float* kh = kn.data() + ((size_t)t * Hkv + h) * hd;
      rmsnorm_1p(kh, w.k_norm, hd, d.eps, tmp.data());
      std::copy(tmp.begin(), tmp.end(), kh);
      rope_partial(kh, d.rd, pos0 + t, d.theta);
    }
  }
  cache.k.insert(cache.k.end(), kn.begin(), kn.end());
  cache.v.insert(cache.v.end(), vn.begin(), vn.end());
  const float* K = cache.k.data();
  const float* V = cache.v.data();
  const float scale = 1.f / std::sqrt((float)hd);
  std::vector<float> o((size_t)T * H * hd);
#pragma omp parallel for collapse(2) schedule(dynamic) if ((long)T * H * total > 4096)
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) {
      const int kvh = h / grp, n = pos0 + t + 1;  // causal: keys 0 .. pos0+t
      const float* qh = qg.data() + ((size_t)t * H + h) * 2 * hd;
      std::vector<float> s(n);
      float mx = -INFINITY;
      for (int j = 0; j < n; ++j) {
        s[j] = dot(qh, K + ((size_t)j * Hkv + kvh) * hd, hd) * scale;
        mx = std::max(mx, s[j]);
      }
      float sum = 0.f;
      for (int j = 0; j < n; ++j) { s[j] = std::exp(s[j] - mx); sum += s[j]; }
      float* oh = o.data() + ((size_t)t * H + h) * hd;
      std::fill(oh, oh + hd, 0.f);
      for (int j = 0; j < n; ++j) {
        const float p = s[j] / sum;
        const float* vj = V + ((size_t)j * Hkv + kvh) * hd;
#pragma omp simd
        for (int i = 0; i < hd; ++i) oh[i] += p * vj[i];
      }
      const float* gate = qh + hd;  // second half of this head's q_proj rows
      for (int i = 0; i < hd; ++i) oh[i] *= sigmoidf(gate[i]);
    }
  matmul_t(o.data(), T, H * hd, w.o_proj, d.D, out);
}

}  // namespace strata::next
