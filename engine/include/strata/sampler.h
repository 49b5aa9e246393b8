// Seeded, reproducible sampling: greedy (temperature 0), temperature, top_k, top_p, min_p, and the logit
// modifiers applied first (to greedy too): logit_bias, repetition penalty, frequency / presence penalty.
#pragma once
#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

namespace strata {

struct SamplingParams {
  float temperature = 0.f;  // 0: greedy (argmax, lowest id on ties)
  int64_t top_k = 0;        // 0: off
  float top_p = 1.f;        // 1: off
  float min_p = 0.f;        // 0: off; keeps ids with p >= min_p * p_max
  uint64_t seed = 0;
  // Logit modifiers, in this order, on a copy of the raw logits (before temperature and the filters):
  std::vector<std::pair<int32_t, float>> logit_bias;  // added to the id's logit; <= -100 bans the id
  float repetition_penalty = 1.f;  // 1: off; ids in the window: logit > 0 ? logit / r : logit * r (HF, llama.cpp)
  int64_t penalty_last_n = 64;     // the repetition window: last n ids of prompt + output; -1: all; 0: off
  float frequency_penalty = 0.f;   // OpenAI: logit -= count * f, count = times the id was generated so far
  float presence_penalty = 0.f;    // OpenAI: logit -= p if the id was generated so far
  void validate() const;    // std::invalid_argument naming the field
  bool modifies() const {
    return !logit_bias.empty() || (repetition_penalty != 1.f && penalty_last_n != 0) || frequency_penalty != 0.f ||
           presence_penalty != 0.f;
  }
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  int32_t sample(const float* logits, int64_t vocab);
  void prime(const int32_t* prompt, int64_t n);  // the prompt: the repetition window's start
  void accept(int32_t id);                       // a generated id: window and generated counts

 private:
  const float* modified(const float* logits, int64_t vocab);
  double uniform();  // [0, 1), splitmix64: the same numbers on every platform
  SamplingParams p_;
  uint64_t state_;
  std::vector<std::pair<float, int32_t>> cand_;
  std::vector<float> work_;                     // the modified copy of the logits
  std::vector<int32_t> recent_;                 // prompt + generated ids (repetition window)
  std::unordered_map<int32_t, int64_t> counts_;  // generated ids -> times generated
};

}  // namespace strata
