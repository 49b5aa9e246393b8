// Build and runtime facts about the compiled engine.
#pragma once
#include <string>
#include <vector>

namespace strata {

struct BuildInfo {
  std::string version;
  std::string compiler;
  std::string build_type;
  bool openmp = false;
  bool cuda = false;
  bool native = false;
  int max_threads = 1;
  std::vector<std::string> cpu_features;  // detected at run time (avx2, fma, avx512f, ...)
};

BuildInfo build_info();

// Checks that the compiled kernels run and agree with a scalar reference.
// Returns an empty string on success, else a message naming the failed check.
std::string self_test();

}  // namespace strata
