// Seeded, reproducible sampling: greedy (temperature 0), temperature, top_k, top_p, min_p.
#pragma once
#include <cstdint>
#include <vector>

namespace strata {

struct SamplingParams {
  float temperature = 0.f;  // 0: greedy (argmax, lowest id on ties)
  int64_t top_k = 0;        // 0: off
  float top_p = 1.f;        // 1: off
  float min_p = 0.f;        // 0: off; keeps ids with p >= min_p * p_max
  uint64_t seed = 0;
  void validate() const;    // std::invalid_argument naming the field
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  int32_t sample(const float* logits, int64_t vocab);

 private:
  double uniform();  // [0, 1), splitmix64: the same numbers on every platform
  SamplingParams p_;
  uint64_t state_;
  std::vector<std::pair<float, int32_t>> cand_;
};

}  // namespace strata
