#include "strata/build_info.h"

#include <cmath>
#include <sstream>
#include <thread>
#include <vector>
#ifdef STRATA_HAVE_OPENMP
#include <omp.h>
#endif

namespace strata {

static const char* kVersion = "0.1.0";

BuildInfo build_info() {
  BuildInfo info;
  info.version = kVersion;
  info.compiler = STRATA_COMPILER;
  info.build_type = STRATA_BUILD_TYPE;
#ifdef STRATA_HAVE_OPENMP
  info.openmp = true;
  info.max_threads = omp_get_max_threads();
#else
  info.max_threads = static_cast<int>(std::thread::hardware_concurrency());
#endif
#ifdef STRATA_HAVE_CUDA
  info.cuda = true;
#endif
#ifdef STRATA_NATIVE
  info.native = true;
#endif
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  const char* names[] = {"sse4.2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl"};
  for (const char* n : names) {
    bool has = false;
    std::string s(n);
    if (s == "sse4.2") has = __builtin_cpu_supports("sse4.2");
    else if (s == "avx") has = __builtin_cpu_supports("avx");
    else if (s == "avx2") has = __builtin_cpu_supports("avx2");
    else if (s == "fma") has = __builtin_cpu_supports("fma");
    else if (s == "f16c") has = __builtin_cpu_supports("f16c");
    else if (s == "avx512f") has = __builtin_cpu_supports("avx512f");
    else if (s == "avx512bw") has = __builtin_cpu_supports("avx512bw");
    else if (s == "avx512vl") has = __builtin_cpu_supports("avx512vl");
    if (has) info.cpu_features.push_back(s);
  }
#endif
  return info;
}

std::string self_test() {
  // A small matrix-vector product against a double-precision reference.
  const int rows = 37, cols = 129;
  std::vector<float> w(rows * cols), x(cols), y(rows, 0.f);
  for (int i = 0; i < rows * cols; ++i) w[i] = std::sin(0.37f * i);
  for (int j = 0; j < cols; ++j) x[j] = std::cos(0.11f * j);
#ifdef STRATA_HAVE_OPENMP
#pragma omp parallel for
#endif
  for (int r = 0; r < rows; ++r) {
    float acc = 0.f;
    for (int c = 0; c < cols; ++c) acc += w[r * cols + c] * x[c];
    y[r] = acc;
  }
  for (int r = 0; r < rows; ++r) {
    double ref = 0.0;
    for (int c = 0; c < cols; ++c) ref += double(w[r * cols + c]) * double(x[c]);
    if (std::fabs(ref - y[r]) > 1e-3) {
      std::ostringstream msg;
      msg << "matvec row " << r << ": got " << y[r] << ", expected " << ref;
      return msg.str();
    }
  }
  return "";
}

}  // namespace strata
