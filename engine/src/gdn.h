// Gated DeltaNet (the "linear_attention" layers of Qwen3-Next), fp32, per ENGINE_SPEC.md.
//
// Weights are plain pointers into the model's fp32 storage so this layer plugs into any weight class.
// State per layer (what a checkpoint snapshots): the conv window of the last K-1 pre-conv columns and
// the recurrent state S [Hv, dk, dv] in fp32. Neither can be rolled back.
#pragma once
#include <cstddef>
#include <vector>

namespace strata::next {

struct GdnDims {
  int D = 0;          // hidden size
  int Hk = 0, Hv = 0; // key heads, value heads (Hv = r * Hk)
  int dk = 0, dv = 0; // key / value head dims
  int K = 4;          // conv kernel size
  float eps = 1e-6f;  // rms_norm_eps for the gated norm
  int conv_channels() const { return 2 * Hk * dk + Hv * dv; }
  int qkvz_rows() const { return 2 * Hk * dk + 2 * Hv * dv; }
};

struct GdnWeights {
  const float* in_proj_qkvz = nullptr;  // [2*Hk*dk + 2*Hv*dv, D], grouped per key head
  const float* in_proj_ba = nullptr;    // [2*Hv, D], grouped per key head
  const float* conv = nullptr;          // [C, K] (HF [C, 1, K]); column K-1 multiplies the current token
  const float* A_log = nullptr;         // [Hv]
  const float* dt_bias = nullptr;       // [Hv]
  const float* norm = nullptr;          // [dv] plain-w gated RMSNorm
  const float* out_proj = nullptr;      // [D, Hv*dv]
};

struct GdnState {
  std::vector<float> conv;  // [K-1, C] time-major: row K-2 is the most recent token
  std::vector<float> S;     // [Hv, dk, dv]
  void reset(const GdnDims& d) {
    conv.assign((size_t)(d.K - 1) * d.conv_channels(), 0.f);
    S.assign((size_t)d.Hv * d.dk * d.dv, 0.f);
  }
  size_t bytes() const { return (conv.size() + S.size()) * sizeof(float); }
};

enum class DeltaMode { Auto, Chunked, Recurrent };

// out[T, D] = GDN(x[T, D]) continuing from `st` (updated in place). Auto: chunked when T > 1.
void gdn_forward(const GdnDims& d, const GdnWeights& w, const float* x, int T, GdnState& st, float* out,
                 DeltaMode mode = DeltaMode::Auto, int chunk = 64);

// The delta rule alone, for one value head, on prepared inputs (exposed for tests/benchmarks):
// q,k [T, dk] (l2-normed, q scaled), v [T, dv], beta,g [T]; S [dk, dv] in/out; o [T, dv].
// Strides let callers pass views into interleaved buffers.
void delta_recurrent(int T, int dk, int dv, const float* q, int ldq, const float* k, int ldk, const float* v,
                     int ldv, const float* beta, const float* g, int ldbg, float* S, float* o, int ldo);
void delta_chunked(int T, int dk, int dv, const float* q, int ldq, const float* k, int ldk, const float* v,
                   int ldv, const float* beta, const float* g, int ldbg, float* S, float* o, int ldo,
                   int chunk);

}  // namespace strata::next
