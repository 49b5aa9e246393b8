// Gated DeltaNet forward. Steps follow docs/ENGINE.md "GDN layer" 1-8; comments carry shapes.
#include "gdn.h"

#include <algorithm>
#include <cmath>

#include "next_ops.h"
#include "strata/kernels.h"

namespace strata::next {

using kernels::dot;

namespace {
class GdnSnapshot final : public LayerSnapshot {
 public:
  explicit GdnSnapshot(const GdnState& s) : conv(s.conv), S(s.S) {}
  int64_t bytes() const override { return int64_t((conv.size() + S.size()) * sizeof(float)); }
  std::vector<float> conv, S;
};
}  // namespace

std::unique_ptr<LayerSnapshot> GdnState::snapshot() const { return std::make_unique<GdnSnapshot>(*this); }

void GdnState::restore(const LayerSnapshot& snap) {
  const auto& s = static_cast<const GdnSnapshot&>(snap);
  conv = s.conv;
  S = s.S;
}

void GdnState::reset() {
  std::fill(conv.begin(), conv.end(), 0.f);
  std::fill(S.begin(), S.end(), 0.f);
}

// The delta-rule loops are `omp simd` loops in a portable build (SSE2 only); compiled here also for
// AVX2+FMA and AVX-512, chosen at load (GCC function multiversioning), they run 2-4x wider. The clones
// name ISA levels, not CPU models: GCC dispatches "arch=haswell" with __builtin_cpu_is, so an AMD EPYC
// with AVX2+FMA got the SSE2 default; x86-64-v3 (AVX2, FMA, F16C, BMI) and v4 (AVX-512) test features.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#define STRATA_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define STRATA_CLONES
#endif

STRATA_CLONES void delta_recurrent(int64_t T, int64_t dk, int64_t dv, const float* q, int64_t ldq, const float* k, int64_t ldk,
                     const float* v, int64_t ldv, const float* beta, const float* g, int64_t ldbg, float* S,
                     float* o, int64_t ldo) {
  std::vector<float> kv(dv);
  for (int t = 0; t < T; ++t) {
    const float* qt = q + (size_t)t * ldq;
    const float* kt = k + (size_t)t * ldk;
    const float* vt = v + (size_t)t * ldv;
    const float decay = std::exp(g[(size_t)t * ldbg]), b = beta[(size_t)t * ldbg];
    // S <- exp(g) S ; kv = S^T k
    std::fill(kv.begin(), kv.end(), 0.f);
    for (int i = 0; i < dk; ++i) {
      float* Si = S + (size_t)i * dv;
      const float ki = kt[i];
#pragma omp simd
      for (int j = 0; j < dv; ++j) { Si[j] *= decay; kv[j] += Si[j] * ki; }
    }
    // delta = beta (v - S^T k) ; S += k delta^T ; o = S^T q
    for (int j = 0; j < dv; ++j) kv[j] = b * (vt[j] - kv[j]);
    float* ot = o + (size_t)t * ldo;
    std::fill(ot, ot + dv, 0.f);
    for (int i = 0; i < dk; ++i) {
      float* Si = S + (size_t)i * dv;
      const float ki = kt[i], qi = qt[i];
#pragma omp simd
      for (int j = 0; j < dv; ++j) { Si[j] += ki * kv[j]; ot[j] += Si[j] * qi; }
    }
  }
}

// The older chunked form, row by row (kept for A/B: kernel option "gdn_matrix" off, or STRATA_GDN_SCALAR=1).
STRATA_CLONES static void delta_chunked_rows(int64_t T, int64_t dk, int64_t dv, const float* q, int64_t ldq, const float* k, int64_t ldk,
                   const float* v, int64_t ldv, const float* beta, const float* g, int64_t ldbg, float* S,
                   float* o, int64_t ldo, int64_t chunk) {
  // Per chunk of n <= L tokens with start state S (the spec's closed form; a short last chunk equals
  // HF's zero padding because padded rows have k = v = beta = g = 0):
  //   gamma = cumsum(g); Dm_ij = exp(gamma_i - gamma_j) for i >= j (masked before exp)
  //   A = strictly_lower(diag(beta) K K^T * Dm); solve (I + A) U = diag(beta) V, (I + A) W = diag(beta e^gamma) K
  //   V' = U - W S;  O = (e^gamma Q) S + ((Q K^T) * Dm) V';  S <- e^{gamma_n} S + (e^{gamma_n - gamma} K)^T V'
  const int64_t L = chunk;
  std::vector<float> gam(L), A((size_t)L * L), U((size_t)L * dv), W((size_t)L * dk);
  for (int64_t c0 = 0; c0 < T; c0 += L) {
    const int64_t n = std::min(L, T - c0);
    auto Q = [&](int i) { return q + (size_t)(c0 + i) * ldq; };
    auto Kr = [&](int i) { return k + (size_t)(c0 + i) * ldk; };
    auto V = [&](int i) { return v + (size_t)(c0 + i) * ldv; };
    auto B = [&](int i) { return beta[(size_t)(c0 + i) * ldbg]; };
    float acc = 0.f;
    for (int i = 0; i < n; ++i) { acc += g[(size_t)(c0 + i) * ldbg]; gam[i] = acc; }
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < i; ++j) A[(size_t)i * L + j] = B(i) * dot(Kr(i), Kr(j), dk) * std::exp(gam[i] - gam[j]);
    // forward substitution, rows in order: X_i = B_i - sum_{j<i} A_ij X_j
    for (int i = 0; i < n; ++i) {
      float* Ui = U.data() + (size_t)i * dv;
      float* Wi = W.data() + (size_t)i * dk;
      const float bi = B(i), be = bi * std::exp(gam[i]);
      for (int j = 0; j < dv; ++j) Ui[j] = bi * V(i)[j];
      for (int j = 0; j < dk; ++j) Wi[j] = be * Kr(i)[j];
      for (int j = 0; j < i; ++j) {
        const float a = A[(size_t)i * L + j];
        const float* Uj = U.data() + (size_t)j * dv;
        const float* Wj = W.data() + (size_t)j * dk;
#pragma omp simd
        for (int m = 0; m < dv; ++m) Ui[m] -= a * Uj[m];
#pragma omp simd
        for (int m = 0; m < dk; ++m) Wi[m] -= a * Wj[m];
      }
    }
    // V' = U - W S  (stored back into U)
    for (int i = 0; i < n; ++i) {
      float* Ui = U.data() + (size_t)i * dv;
      const float* Wi = W.data() + (size_t)i * dk;
      for (int m = 0; m < dk; ++m) {
        const float wm = Wi[m];
        const float* Sm = S + (size_t)m * dv;
#pragma omp simd
        for (int j = 0; j < dv; ++j) Ui[j] -= wm * Sm[j];
      }
    }
    // O_i = e^{gamma_i} q_i^T S + sum_{j<=i} (q_i . k_j) e^{gamma_i - gamma_j} V'_j
    for (int i = 0; i < n; ++i) {
      float* oi = o + (size_t)(c0 + i) * ldo;
      std::fill(oi, oi + dv, 0.f);
      const float eg = std::exp(gam[i]);
      for (int m = 0; m < dk; ++m) {
        const float qm = Q(i)[m] * eg;
        const float* Sm = S + (size_t)m * dv;
#pragma omp simd
        for (int j = 0; j < dv; ++j) oi[j] += qm * Sm[j];
      }
      for (int j = 0; j <= i; ++j) {
        const float a = dot(Q(i), Kr(j), dk) * std::exp(gam[i] - gam[j]);
        const float* Uj = U.data() + (size_t)j * dv;
#pragma omp simd
        for (int m = 0; m < dv; ++m) oi[m] += a * Uj[m];
      }
    }
    // S <- e^{gamma_n} S + sum_j e^{gamma_n - gamma_j} k_j V'_j^T
    const float gl = gam[n - 1], egl = std::exp(gl);
    for (size_t m = 0; m < (size_t)dk * dv; ++m) S[m] *= egl;
    for (int j = 0; j < n; ++j) {
      const float e = std::exp(gl - gam[j]);
      const float* Uj = U.data() + (size_t)j * dv;
      for (int m = 0; m < dk; ++m) {
        const float km = Kr(j)[m] * e;
        float* Sm = S + (size_t)m * dv;
#pragma omp simd
        for (int c = 0; c < dv; ++c) Sm[c] += km * Uj[c];
      }
    }
  }
}

// The chunked form as matrix products (the WY / UT-transform form of the reference chunk_gated_delta_rule).
// Per chunk of n <= L tokens, with gamma = cumsum(g), Dm_ij = e^{gamma_i - gamma_j} (j <= i):
//   G = K K^T, P = (Q K^T) * Dm (lower, diagonal included)             [n, n]: two GEMMs over dk
//   T = (I + A)^{-1}, A = strictly_lower(diag(beta) G * Dm)             [n, n]: forward substitution, once
//   V' = T (diag(beta) V - diag(beta e^gamma) K S)                      [n, dv]: GEMM over dk, lower GEMM
//   O = diag(e^gamma) Q S + P V'                                        [n, dv]: GEMM over dk, lower GEMM
//   S <- e^{gamma_n} S + (diag(e^{gamma_n - gamma}) K)^T V'             [dk, dv]: GEMM over n
// (V' equals U - W S of the row form: T diag(beta) V = U, T diag(beta e^gamma) K = W.) The GEMMs run on
// kernels::gemm_f32 (AVX2+FMA register tiles, chosen at run time); callers parallelise over heads.
STRATA_CLONES static void delta_chunked_matrix(int64_t T, int64_t dk, int64_t dv, const float* q, int64_t ldq,
                                               const float* k, int64_t ldk, const float* v, int64_t ldv,
                                               const float* beta, const float* g, int64_t ldbg, float* S, float* o,
                                               int64_t ldo, int64_t chunk) {
  using kernels::gemm_f32;
  const int64_t L = chunk;
  std::vector<float> gam(L), eg(L), bt(L), arow(L), Kt((size_t)dk * L), G((size_t)L * L), P((size_t)L * L),
      Tm((size_t)L * L), Qe((size_t)L * dk), Kb((size_t)L * dk), R((size_t)L * dv), U((size_t)L * dv);
  for (int64_t c0 = 0; c0 < T; c0 += L) {
    const int64_t n = std::min(L, T - c0);
    const float* Q0 = q + (size_t)c0 * ldq;
    const float* K0 = k + (size_t)c0 * ldk;
    const float* V0 = v + (size_t)c0 * ldv;
    float* O0 = o + (size_t)c0 * ldo;
    float acc = 0.f;
    for (int64_t i = 0; i < n; ++i) {
      acc += g[(size_t)(c0 + i) * ldbg];
      gam[i] = acc;
      eg[i] = std::exp(acc);
      bt[i] = beta[(size_t)(c0 + i) * ldbg];
    }
    // Kt [dk, n] (ld L) = K^T
    for (int64_t m = 0; m < dk; ++m)
      for (int64_t j = 0; j < n; ++j) Kt[(size_t)m * L + j] = K0[(size_t)j * ldk + m];
    // G = K K^T, P = Q K^T: only the lower triangles are used, so blocks of 16 rows stop at their diagonal
    for (int64_t i0 = 0; i0 < n; i0 += 16) {
      const int64_t rows = std::min<int64_t>(16, n - i0), cols = std::min<int64_t>(n, i0 + 16);
      gemm_f32(rows, cols, dk, K0 + (size_t)i0 * ldk, ldk, 1, Kt.data(), L, G.data() + (size_t)i0 * L, L);
      gemm_f32(rows, cols, dk, Q0 + (size_t)i0 * ldq, ldq, 1, Kt.data(), L, P.data() + (size_t)i0 * L, L);
    }
    // masks and decays; T row by row: T_i = e_i - sum_{j<i} A_ij T_j (T_j is zero past column j)
    for (int64_t i = 0; i < n; ++i) {
      float* Pi = P.data() + (size_t)i * L;
      float* Ti = Tm.data() + (size_t)i * L;
      const float* Gi = G.data() + (size_t)i * L;
      for (int64_t j = 0; j <= i; ++j) {
        const float e = std::exp(gam[i] - gam[j]);
        Pi[j] *= e;
        arow[j] = bt[i] * Gi[j] * e;
      }
      std::fill(Pi + i + 1, Pi + n, 0.f);
      // T_i[0:i] = -arow[0:i] T[0:i, 0:i] (a one-row GEMM; T is zero above its diagonal)
      for (int64_t j = 0; j < i; ++j) arow[j] = -arow[j];
      gemm_f32(1, i, i, arow.data(), L, 1, Tm.data(), L, Ti, L);
      std::fill(Ti + i, Ti + n, 0.f);
      Ti[i] = 1.f;
    }
    // R = diag(beta) V - diag(beta e^gamma) K S ; Qe = diag(e^gamma) Q
    for (int64_t i = 0; i < n; ++i) {
      const float* Vi = V0 + (size_t)i * ldv;
      const float* Ki = K0 + (size_t)i * ldk;
      const float* Qi = Q0 + (size_t)i * ldq;
      float* Ri = R.data() + (size_t)i * dv;
      float* Kbi = Kb.data() + (size_t)i * dk;
      float* Qei = Qe.data() + (size_t)i * dk;
      const float b = bt[i], nbe = -bt[i] * eg[i], e = eg[i];
#pragma omp simd
      for (int64_t j = 0; j < dv; ++j) Ri[j] = b * Vi[j];
#pragma omp simd
      for (int64_t m = 0; m < dk; ++m) { Kbi[m] = nbe * Ki[m]; Qei[m] = e * Qi[m]; }
    }
    gemm_f32(n, dv, dk, Kb.data(), dk, 1, S, dv, R.data(), dv, /*accumulate=*/true);
    gemm_f32(n, dv, n, Tm.data(), L, 1, R.data(), dv, U.data(), dv, false, /*lower=*/true);  // V' = T R
    gemm_f32(n, dv, dk, Qe.data(), dk, 1, S, dv, O0, ldo);                                 // O = Qe S
    gemm_f32(n, dv, n, P.data(), L, 1, U.data(), dv, O0, ldo, true, /*lower=*/true);       // O += P V'
    // S <- e^{gamma_n} S + Kd^T V', Kd^T = Kt with column j scaled by e^{gamma_n - gamma_j}
    const float gl = gam[n - 1], egl = eg[n - 1];
    for (int64_t j = 0; j < n; ++j) arow[j] = std::exp(gl - gam[j]);
    for (int64_t m = 0; m < dk; ++m) {
      float* Ktm = Kt.data() + (size_t)m * L;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) Ktm[j] *= arow[j];
    }
#pragma omp simd
    for (int64_t m = 0; m < dk * dv; ++m) S[m] *= egl;
    gemm_f32(dk, dv, n, Kt.data(), L, 1, U.data(), dv, S, dv, /*accumulate=*/true);
  }
}

void delta_chunked(int64_t T, int64_t dk, int64_t dv, const float* q, int64_t ldq, const float* k, int64_t ldk,
                   const float* v, int64_t ldv, const float* beta, const float* g, int64_t ldbg, float* S,
                   float* o, int64_t ldo, int64_t chunk) {
  if (kernels::option("gdn_matrix"))
    delta_chunked_matrix(T, dk, dv, q, ldq, k, ldk, v, ldv, beta, g, ldbg, S, o, ldo, chunk);
  else
    delta_chunked_rows(T, dk, dv, q, ldq, k, ldk, v, ldv, beta, g, ldbg, S, o, ldo, chunk);
}

void gdn_forward(const GdnDims& d, const GdnWeights& w, const float* x, int64_t T, GdnState& st, float* out,
                 int64_t chunk) {
  const int64_t Hk = d.Hk, Hv = d.Hv, dk = d.dk, dv = d.dv, K = d.K, r = Hv / Hk;
  const int64_t C = d.conv_channels(), P = d.qkvz_rows(), group = 2 * dk + 2 * r * dv;
  // 1-2. projections: P [T, Hk, (q dk | k dk | v r*dv | z r*dv)], BA [T, Hk, (b r | a r)]
  std::vector<float> proj((size_t)T * P), ba((size_t)T * 2 * Hv);
  const kernels::MatOut in[2] = {{&w.in_proj_qkvz, proj.data()}, {&w.in_proj_ba, ba.data()}};
  kernels::matmul_multi(in, 2, x, T);
  // 3. conv input rows ext [K-1 + T, C]: the saved window, then m_t = [Q_all | K_all | V_all]
  std::vector<float> ext((size_t)(K - 1 + T) * C), z((size_t)T * Hv * dv), b((size_t)T * Hv), a((size_t)T * Hv);
  std::copy(st.conv.begin(), st.conv.end(), ext.begin());
  for (int t = 0; t < T; ++t) {
    float* m = ext.data() + (size_t)(K - 1 + t) * C;
    const float* pt = proj.data() + (size_t)t * P;
    for (int gk = 0; gk < Hk; ++gk) {
      const float* grp = pt + (size_t)gk * group;
      std::copy(grp, grp + dk, m + gk * dk);
      std::copy(grp + dk, grp + 2 * dk, m + Hk * dk + gk * dk);
      std::copy(grp + 2 * dk, grp + 2 * dk + r * dv, m + 2 * Hk * dk + gk * r * dv);
      std::copy(grp + 2 * dk + r * dv, grp + group, z.data() + (size_t)t * Hv * dv + gk * r * dv);
      const float* bat = ba.data() + (size_t)t * 2 * Hv + gk * 2 * r;
      for (int j = 0; j < r; ++j) {
        b[(size_t)t * Hv + gk * r + j] = bat[j];
        a[(size_t)t * Hv + gk * r + j] = bat[r + j];
      }
    }
  }
  // 4. depthwise causal conv + SiLU: c_t[ch] = silu(sum_j W[ch, j] * ext[t + j][ch])
  // Channels innermost (contiguous, vectorised) with the taps [K, C]: each channel still sums its taps
  // j = 0..K-1 from 0 in order, so the bits are the per-channel loop's.
  std::vector<float> cv((size_t)T * C), taps((size_t)K * C);
  for (int ch = 0; ch < C; ++ch)
    for (int j = 0; j < K; ++j) taps[(size_t)j * C + ch] = w.conv[(size_t)ch * K + j];
#pragma omp parallel for schedule(static) if (T * C > 16384)
  for (int t = 0; t < T; ++t) {
    float* s = cv.data() + (size_t)t * C;
    std::fill(s, s + C, 0.f);
    for (int j = 0; j < K; ++j) {
      const float* e = ext.data() + (size_t)(t + j) * C;
      const float* tj = taps.data() + (size_t)j * C;
      for (int ch = 0; ch < C; ++ch) s[ch] += tj[ch] * e[ch];
    }
    for (int ch = 0; ch < C; ++ch) s[ch] = siluf(s[ch]);
  }
  std::copy(ext.end() - (size_t)(K - 1) * C, ext.end(), st.conv.begin());  // new window: last K-1 rows
  // 5-6. beta, g (fp32), l2-norm q/k (eps added to the sum of squares), q scaled by dk^-0.5
  std::vector<float> beta((size_t)T * Hv), g((size_t)T * Hv);
  const float qscale = 1.f / std::sqrt((float)dk);
  for (int t = 0; t < T; ++t) {
    for (int h = 0; h < Hv; ++h) {
      const size_t i = (size_t)t * Hv + h;
      beta[i] = sigmoidf(b[i]);
      g[i] = -std::exp(w.A_log[h]) * softplusf(a[i] + w.dt_bias[h]);
    }
    float* ct = cv.data() + (size_t)t * C;
    for (int hk = 0; hk < 2 * Hk; ++hk) {  // q heads then k heads, contiguous
      float* vec = ct + (size_t)hk * dk;
      const float inv = 1.f / std::sqrt(dot(vec, vec, dk) + 1e-6f) * (hk < Hk ? qscale : 1.f);
      for (int i = 0; i < dk; ++i) vec[i] *= inv;
    }
  }
  // 7. delta rule per value head h (key head h / r), state S[h] fp32
  std::vector<float> o((size_t)T * Hv * dv);
  const bool chunked = T > 1;
#pragma omp parallel for schedule(dynamic) if (Hv > 1 && T * dk * dv > 4096)
  for (int h = 0; h < Hv; ++h) {
    const int kh = h / r;
    const float* qh = cv.data() + (size_t)kh * dk;
    const float* kh_ = cv.data() + (size_t)(Hk + kh) * dk;
    const float* vh = cv.data() + (size_t)2 * Hk * dk + (size_t)h * dv;
    float* Sh = st.S.data() + (size_t)h * dk * dv;
    if (chunked)
      delta_chunked(T, dk, dv, qh, C, kh_, C, vh, C, beta.data() + h, g.data() + h, Hv, Sh,
                    o.data() + (size_t)h * dv, Hv * dv, chunk);
    else
      delta_recurrent(T, dk, dv, qh, C, kh_, C, vh, C, beta.data() + h, g.data() + h, Hv, Sh,
                      o.data() + (size_t)h * dv, Hv * dv);
  }
  // 8. gated RMSNorm per value head (plain w): o * rsqrt(mean(o^2)+eps) * w * silu(z); then out_proj
  for (size_t row = 0; row < (size_t)T * Hv; ++row) {
    float* oh = o.data() + row * dv;
    const float* zh = z.data() + row * dv;
    const float rs = 1.f / std::sqrt(dot(oh, oh, dv) / dv + d.eps);
    for (int j = 0; j < dv; ++j) oh[j] = w.norm[j] * (oh[j] * rs) * siluf(zh[j]);
  }
  kernels::matmul(w.out_proj, o.data(), T, out);
}

}  // namespace strata::next
