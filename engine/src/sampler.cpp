#include "strata/sampler.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace strata {

void SamplingParams::validate() const {
  if (!(temperature >= 0.f) || !std::isfinite(temperature))
    throw std::invalid_argument("sampling.temperature must be a finite number >= 0, got " + std::to_string(temperature));
  if (top_k < 0) throw std::invalid_argument("sampling.top_k must be >= 0, got " + std::to_string(top_k));
  if (!(top_p > 0.f && top_p <= 1.f)) throw std::invalid_argument("sampling.top_p must be in (0, 1], got " + std::to_string(top_p));
  if (!(min_p >= 0.f && min_p <= 1.f)) throw std::invalid_argument("sampling.min_p must be in [0, 1], got " + std::to_string(min_p));
  for (const auto& b : logit_bias)
    if (std::isnan(b.second)) throw std::invalid_argument("sampling.logit_bias[" + std::to_string(b.first) + "] is NaN");
  if (!(repetition_penalty > 0.f) || !std::isfinite(repetition_penalty))
    throw std::invalid_argument("sampling.repetition_penalty must be a finite number > 0, got " +
                                std::to_string(repetition_penalty));
  if (penalty_last_n < -1)
    throw std::invalid_argument("sampling.penalty_last_n must be >= -1, got " + std::to_string(penalty_last_n));
  if (!std::isfinite(frequency_penalty))
    throw std::invalid_argument("sampling.frequency_penalty must be finite, got " + std::to_string(frequency_penalty));
  if (!std::isfinite(presence_penalty))
    throw std::invalid_argument("sampling.presence_penalty must be finite, got " + std::to_string(presence_penalty));
}

void Sampler::prime(const int32_t* prompt, int64_t n) {
  if (!(p_.repetition_penalty != 1.f && p_.penalty_last_n != 0)) return;
  const int64_t keep = p_.penalty_last_n < 0 ? n : std::min(n, p_.penalty_last_n);
  recent_.assign(prompt + (n - keep), prompt + n);
}

void Sampler::accept(int32_t id) {
  if (p_.frequency_penalty != 0.f || p_.presence_penalty != 0.f) ++counts_[id];
  if (p_.repetition_penalty != 1.f && p_.penalty_last_n != 0) {
    recent_.push_back(id);
    if (p_.penalty_last_n > 0 && int64_t(recent_.size()) > 2 * p_.penalty_last_n)  // trim now and then
      recent_.erase(recent_.begin(), recent_.end() - p_.penalty_last_n);
  }
}

const float* Sampler::modified(const float* logits, int64_t V) {
  if (!p_.modifies()) return logits;
  work_.assign(logits, logits + V);
  for (const auto& b : p_.logit_bias) {
    if (b.first < 0 || b.first >= V) continue;  // checked against the vocabulary before the call
    work_[size_t(b.first)] = b.second <= -100.f ? -INFINITY : work_[size_t(b.first)] + b.second;
  }
  if (p_.repetition_penalty != 1.f && p_.penalty_last_n != 0) {
    const size_t n = p_.penalty_last_n < 0 ? recent_.size() : std::min(recent_.size(), size_t(p_.penalty_last_n));
    std::vector<int32_t> seen(recent_.end() - n, recent_.end());
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    for (int32_t id : seen) {
      if (id < 0 || id >= V) continue;
      float& l = work_[size_t(id)];
      l = l > 0.f ? l / p_.repetition_penalty : l * p_.repetition_penalty;  // once per id, whatever its count
    }
  }
  for (const auto& kv : counts_) {
    if (kv.first < 0 || kv.first >= V) continue;
    work_[size_t(kv.first)] -= float(kv.second) * p_.frequency_penalty + (kv.second > 0 ? p_.presence_penalty : 0.f);
  }
  return work_.data();
}

Sampler::Sampler(const SamplingParams& p) : p_(p), state_(p.seed) {}

double Sampler::uniform() {
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return double(z >> 11) * (1.0 / 9007199254740992.0);
}

int32_t Sampler::sample(const float* raw, int64_t V) {
  const float* logits = modified(raw, V);
  if (p_.temperature == 0.f) {
    int64_t best = 0;
    for (int64_t i = 1; i < V; ++i)
      if (logits[i] > logits[best]) best = i;
    return int32_t(best);
  }
  auto desc = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  cand_.resize(size_t(V));
  for (int64_t i = 0; i < V; ++i) cand_[size_t(i)] = {logits[i] / p_.temperature, int32_t(i)};
  if (p_.top_k > 0 && p_.top_k < V) {
    std::nth_element(cand_.begin(), cand_.begin() + p_.top_k, cand_.end(), desc);
    cand_.resize(size_t(p_.top_k));
  }
  float mx = -INFINITY;
  for (auto& c : cand_) mx = std::max(mx, c.first);
  if (mx == -INFINITY) return cand_.front().second;  // every id banned: nothing left to weigh
  double sum = 0.0;
  for (auto& c : cand_) { c.first = std::exp(c.first - mx); sum += c.first; }
  for (auto& c : cand_) c.first = float(c.first / sum);  // probabilities; p_max = exp(0)/sum
  if (p_.top_p < 1.f) {
    // Sorted prefix only as long as needed: most mass sits in the first few dozen ids.
    size_t m = std::min<size_t>(64, cand_.size());
    while (true) {
      std::partial_sort(cand_.begin(), cand_.begin() + m, cand_.end(), desc);
      double cum = 0.0;
      size_t keep = 0;
      while (keep < m && cum < p_.top_p) cum += cand_[keep++].first;
      if (cum >= p_.top_p || m == cand_.size()) { cand_.resize(std::max<size_t>(keep, 1)); break; }
      m = std::min(cand_.size(), m * 4);
    }
  }
  if (p_.min_p > 0.f) {
    float pmax = 0.f;
    for (auto& c : cand_) pmax = std::max(pmax, c.first);
    const float thr = p_.min_p * pmax;
    cand_.erase(std::remove_if(cand_.begin(), cand_.end(), [&](const auto& c) { return c.first < thr; }), cand_.end());
  }
  std::sort(cand_.begin(), cand_.end(), desc);  // fixed order: the draw does not depend on the filters' internals
  double total = 0.0;
  for (auto& c : cand_) total += c.first;
  double u = uniform() * total, acc = 0.0;
  for (auto& c : cand_) {
    acc += c.first;
    if (u < acc) return c.second;
  }
  return cand_.back().second;
}

}  // namespace strata
