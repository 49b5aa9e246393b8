#include "gated_attention.h"

#include <algorithm>

#include "next_ops.h"
#include "strata/kernels.h"

namespace strata::next {

namespace k = kernels;

void gated_attention_forward(const AttnDims& d, const AttnWeights& w, const float* inv_freq, const float* x,
                             int64_t T, AttentionKV& kv, float* out) {
  const int64_t H = d.H, Hkv = d.Hkv, hd = d.hd, pos0 = kv.length();
  std::vector<float> qg(size_t(T * 2 * H * hd)), q(size_t(T * H * hd)), o(size_t(T * H * hd));
  float *kc, *vc;
  kv.append(T, &kc, &vc);                      // this chunk's cache rows [T, Hkv, hd]
  k::matmul(w.q_proj, x, T, qg.data());        // [T, H, (q | gate)]
  k::matmul(w.k_proj, x, T, kc);
  k::matmul(w.v_proj, x, T, vc);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h)
      k::rmsnorm_1p(qg.data() + (t * H + h) * 2 * hd, w.q_norm.data(), hd, d.eps, q.data() + (t * H + h) * hd);
    for (int64_t h = 0; h < Hkv; ++h) {
      float* kh = kc + (t * Hkv + h) * hd;
      k::rmsnorm_1p(kh, w.k_norm.data(), hd, d.eps, kh);
    }
    k::rope(q.data() + t * H * hd, int(H), int(hd), int(d.rd), pos0 + t, inv_freq);
    k::rope(kc + t * Hkv * hd, int(Hkv), int(hd), int(d.rd), pos0 + t, inv_freq);
  }
  kv.commit();  // f16 / q8 cache: round this chunk's rows in (no-op for f32)
  kv.attend(q.data(), T, int(H), o.data());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const float* gate = qg.data() + (t * H + h) * 2 * hd + hd;  // second half of this head's rows
      float* oh = o.data() + (t * H + h) * hd;
      for (int64_t i = 0; i < hd; ++i) oh[i] *= sigmoidf(gate[i]);
    }
  k::matmul(w.o_proj, o.data(), T, out);
}

}  // namespace strata::next
