// GCC 12 warns about its own AVX-512 intrinsic headers (false positives on the masked forms).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "kernels_internal.h"

namespace strata {
namespace kernels {

// ---------------------------------------------------------------- small ops
static void rmsnorm_impl(const float* x, const float* w, int64_t d, float eps, float* y, float offset) {
  double ss = 0.0;
  for (int64_t i = 0; i < d; ++i) ss += double(x[i]) * double(x[i]);
  const float inv = 1.0f / std::sqrt(float(ss / double(d)) + eps);
  for (int64_t i = 0; i < d; ++i) {
    float wi = w ? w[i] + offset : 1.0f;
    y[i] = wi * (x[i] * inv);
  }
}

void rmsnorm(const float* x, const float* w, int64_t d, float eps, float* y) { rmsnorm_impl(x, w, d, eps, y, 0.f); }
void rmsnorm_1p(const float* x, const float* w, int64_t d, float eps, float* y) { rmsnorm_impl(x, w, d, eps, y, 1.f); }

std::vector<float> rope_inv_freq(double theta, int rd) {
  std::vector<float> f(size_t(rd / 2));
  for (int j = 0; j < rd / 2; ++j) {
    float expo = float(2 * j) / float(rd);
    f[j] = 1.0f / float(std::pow(theta, double(expo)));
  }
  return f;
}

void rope(float* x, int n_heads, int hd, int rd, int64_t pos, const float* inv_freq) {
  const int half = rd / 2;
  float c[512], s[512];
  for (int j = 0; j < half; ++j) {
    float a = float(pos) * inv_freq[j];
    c[j] = std::cos(a);
    s[j] = std::sin(a);
  }
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + int64_t(h) * hd;
    for (int j = 0; j < half; ++j) {
      float x1 = v[j], x2 = v[j + half];
      v[j] = x1 * c[j] - x2 * s[j];
      v[j + half] = x2 * c[j] + x1 * s[j];
    }
  }
}

void silu_mul(float* g, const float* u, int64_t n) {
  // Prefill-sized calls (n tokens x I) split over the threads (a scalar exp per element: the largest serial
  // step of a prefill layer); each element's arithmetic is the same whichever thread runs it. Decode-sized
  // calls, and calls from inside a parallel region (MoE experts), stay on this thread.
#ifdef STRATA_HAVE_OPENMP
#pragma omp parallel for schedule(static) if (n >= 65536 && !omp_in_parallel())
#endif
  for (int64_t i = 0; i < n; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

void add(float* y, const float* x, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

}  // namespace kernels
}  // namespace strata
