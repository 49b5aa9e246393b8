// Log-probabilities from the engine's logits, and the token mask a grammar applies before sampling.
//
// Logprobs are the log-softmax of the model's raw logits: before temperature, top-k/top-p/min-p and any
// grammar mask (what vLLM and OpenAI report), computed in double so f32 logits of a 151K vocabulary keep
// ~1e-6 accuracy. `top` holds the n largest, sorted by logprob descending (lowest id first on ties).
#pragma once
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

namespace strata {

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0.f;
  std::vector<std::pair<int32_t, float>> top;  // (id, logprob), best first
};

// log-softmax(logits)[id] and the top_n alternatives (top_n 0: none).
TokenLogprob token_logprob(const float* logits, int64_t vocab, int32_t id, int64_t top_n);

// A grammar's per-step mask: called before each sampled step with the ids produced so far in this call;
// fills `bits` (ceil(vocab / 32) words, bit i of word i / 32 set = id i allowed) and returns true, or
// returns false for "no constraint this step". Forced ids (force_ids) skip it.
using TokenMaskFn = std::function<bool(const std::vector<int32_t>& produced, uint32_t* bits)>;

// Sets logits of disallowed ids to -inf. If nothing is allowed, leaves the logits alone (returns false).
bool apply_token_mask(float* logits, int64_t vocab, const uint32_t* bits);

}  // namespace strata
