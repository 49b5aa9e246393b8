// Gated DeltaNet (the "linear_attention" layers of Qwen3-Next), per docs/ENGINE.md.
//
// Projection weights are zero-copy views into the mmapped model folder (Mat, any computable dtype); the
// small per-channel tensors are float32 copies. The per-session state (GdnState, a LayerState) is the
// conv window of the last K-1 pre-conv columns plus the fp32 recurrent state S [Hv, dk, dv]. It cannot
// roll back: reusing an earlier prefix needs a snapshot taken at exactly that position.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "strata/model_folder.h"
#include "strata/state.h"

namespace strata::next {

struct GdnDims {
  int64_t D = 0;            // hidden size
  int64_t Hk = 0, Hv = 0;   // key heads, value heads (Hv = r * Hk)
  int64_t dk = 0, dv = 0;   // key / value head dims
  int64_t K = 4;            // conv kernel size
  float eps = 1e-6f;        // rms_norm_eps for the gated norm
  int64_t conv_channels() const { return 2 * Hk * dk + Hv * dv; }
  int64_t qkvz_rows() const { return 2 * Hk * dk + 2 * Hv * dv; }
};

struct GdnWeights {
  Mat in_proj_qkvz;                 // [2*Hk*dk + 2*Hv*dv, D], grouped per key head
  Mat in_proj_ba;                   // [2*Hv, D], grouped per key head
  Mat out_proj;                     // [D, Hv*dv]
  std::vector<float> conv;          // [C, K] (HF [C, 1, K]); column K-1 multiplies the current token
  std::vector<float> A_log, dt_bias;  // [Hv]
  std::vector<float> norm;          // [dv], plain-w gated RMSNorm
};

// One GDN layer's session state. truncate() is a no-op: the Session only calls it with the current
// length or right after restore() of a snapshot taken at that length.
class GdnState final : public LayerState {
 public:
  explicit GdnState(const GdnDims& d)
      : conv(size_t((d.K - 1) * d.conv_channels()), 0.f), S(size_t(d.Hv * d.dk * d.dv), 0.f) {}
  std::vector<float> conv;  // [K-1, C] time-major: row K-2 is the most recent token
  std::vector<float> S;     // [Hv, dk, dv], fp32

  int64_t bytes() const override { return int64_t((conv.size() + S.size()) * sizeof(float)); }
  bool can_truncate() const override { return false; }
  void truncate(int64_t) override {}
  std::unique_ptr<LayerSnapshot> snapshot() const override;
  void restore(const LayerSnapshot& snap) override;
  void reset() override;
};

// out[T, D] = GDN(x[T, D]) continuing from `st` (updated in place). T > 1 runs the chunked form
// (chunk tokens per block, HF uses 64), T == 1 the recurrent step; both give the same result.
void gdn_forward(const GdnDims& d, const GdnWeights& w, const float* x, int64_t T, GdnState& st, float* out,
                 int64_t chunk = 64);

// The delta rule alone, for one value head, on prepared inputs:
// q,k [T, dk] (l2-normed, q scaled), v [T, dv], beta,g [T]; S [dk, dv] in/out; o [T, dv].
// Strides let callers pass views into interleaved buffers.
void delta_recurrent(int64_t T, int64_t dk, int64_t dv, const float* q, int64_t ldq, const float* k, int64_t ldk,
                     const float* v, int64_t ldv, const float* beta, const float* g, int64_t ldbg, float* S,
                     float* o, int64_t ldo);
void delta_chunked(int64_t T, int64_t dk, int64_t dv, const float* q, int64_t ldq, const float* k, int64_t ldk,
                   const float* v, int64_t ldv, const float* beta, const float* g, int64_t ldbg, float* S,
                   float* o, int64_t ldo, int64_t chunk);

}  // namespace strata::next
