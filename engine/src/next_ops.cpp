#include "next_ops.h"

namespace strata::next {

void matmul_t(const float* x, int T, int Din, int ldx, const float* W, int N, float* y, int ldy) {
  // Parallel over output features: each W row (Din floats) stays in cache while the T input rows
  // stream past it. Blocks of 4 rows x 4 tokens give the compiler independent accumulators.
  const int nb = (N + 3) / 4;
#pragma omp parallel for schedule(static) if ((long)N * Din * T > 32768)
  for (int b = 0; b < nb; ++b) {
    const int n0 = b * 4, n1 = n0 + 4 < N ? n0 + 4 : N;
    if (n1 - n0 == 4) {
      const float *w0 = W + (size_t)n0 * Din, *w1 = w0 + Din, *w2 = w1 + Din, *w3 = w2 + Din;
      for (int t = 0; t < T; ++t) {
        const float* xt = x + (size_t)t * ldx;
        float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
        for (int i = 0; i < Din; ++i) {
          const float v = xt[i];
          s0 += v * w0[i]; s1 += v * w1[i]; s2 += v * w2[i]; s3 += v * w3[i];
        }
        float* yt = y + (size_t)t * ldy + n0;
        yt[0] = s0; yt[1] = s1; yt[2] = s2; yt[3] = s3;
      }
    } else {
      for (int n = n0; n < n1; ++n)
        for (int t = 0; t < T; ++t) y[(size_t)t * ldy + n] = dot(x + (size_t)t * ldx, W + (size_t)n * Din, Din);
    }
  }
}

void rmsnorm_1p(const float* x, const float* w, int n, float eps, float* y) {
  const float r = 1.f / std::sqrt(dot(x, x, n) / n + eps);
  for (int i = 0; i < n; ++i) y[i] = x[i] * r * (1.f + w[i]);
}

void rope_partial(float* x, int rd, int pos, float theta) {
  const int half = rd / 2;
  for (int j = 0; j < half; ++j) {
    // inv_freq[j] = 1 / theta^(2j/rd), computed in fp32 like HF; angle in fp32 as well.
    const float inv = 1.f / std::pow(theta, (float)(2 * j) / (float)rd);
    const float ang = (float)pos * inv;
    const float c = std::cos(ang), s = std::sin(ang);
    const float x1 = x[j], x2 = x[j + half];
    x[j] = x1 * c - x2 * s;
    x[j + half] = x2 * c + x1 * s;
  }
}

}  // namespace strata::next
