#include "qwen3_next.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "next_ops.h"

namespace strata::next {

namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}
std::string shape_str(const std::vector<int64_t>& s) {
  std::string o = "[";
  for (size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + std::to_string(s[i]);
  return o + "]";
}
}  // namespace

void NextConfig::validate() const {
  auto pos = [](int v, const char* n) {
    if (v <= 0) throw std::invalid_argument(std::string("qwen3_next config: ") + n + " must be positive");
  };
  pos(vocab, "vocab_size"); pos(D, "hidden_size"); pos(layers, "num_hidden_layers");
  pos(H, "num_attention_heads"); pos(Hkv, "num_key_value_heads"); pos(hd, "head_dim");
  pos(Hk, "linear_num_key_heads"); pos(Hv, "linear_num_value_heads"); pos(dk, "linear_key_head_dim");
  pos(dv, "linear_value_head_dim"); pos(K, "linear_conv_kernel_dim");
  if (H % Hkv) throw std::invalid_argument("qwen3_next config: num_key_value_heads must divide num_attention_heads");
  if (Hv % Hk) throw std::invalid_argument("qwen3_next config: linear_num_key_heads must divide linear_num_value_heads");
  if (rd <= 0 || rd > hd || rd % 2) throw std::invalid_argument("qwen3_next config: partial_rotary_factor gives a bad rotary dim");
  if ((int)attn_layers.size() != layers) throw std::invalid_argument("qwen3_next config: layer_types length != num_hidden_layers");
  if ((int)moe_layers.size() != layers) throw std::invalid_argument("qwen3_next config: moe layer list length != num_hidden_layers");
  if (E > 0 && (top_k <= 0 || top_k > E)) throw std::invalid_argument("qwen3_next config: num_experts_per_tok must be in 1..num_experts");
}

const float* NextModel::need(const std::string& name, std::vector<int64_t> shape) {
  auto it = t_.find(name);
  if (it == t_.end()) throw std::invalid_argument("qwen3_next checkpoint: missing tensor " + name);
  int64_t n = 1;
  for (auto s : shape) n *= s;
  if ((int64_t)it->second.size() != n)
    throw std::invalid_argument("qwen3_next checkpoint: tensor " + name + " should have shape " + shape_str(shape));
  return it->second.data();
}

NextModel::NextModel(NextConfig cfg, std::unordered_map<std::string, std::vector<float>> tensors,
                     std::unordered_map<std::string, std::vector<int64_t>> shapes)
    : cfg_(std::move(cfg)), t_(std::move(tensors)) {
  cfg_.validate();
  const NextConfig& c = cfg_;
  gd_ = GdnDims{c.D, c.Hk, c.Hv, c.dk, c.dv, c.K, c.eps};
  ad_ = AttnDims{c.D, c.H, c.Hkv, c.hd, c.rd, c.theta, c.eps};
  // exact shape check (the element count check in need() misses transposes)
  auto check = [&](const std::string& n, std::vector<int64_t> s) {
    const float* p = need(n, s);
    auto it = shapes.find(n);
    if (it != shapes.end() && it->second != s)
      throw std::invalid_argument("qwen3_next checkpoint: tensor " + n + " has shape " + shape_str(it->second) +
                                  ", expected " + shape_str(s));
    return p;
  };
  std::vector<std::string> used;
  auto use = [&](const std::string& n, std::vector<int64_t> s) { used.push_back(n); return check(n, s); };
  embed_ = use("model.embed_tokens.weight", {c.vocab, c.D});
  final_norm_ = use("model.norm.weight", {c.D});
  lm_head_ = c.tie ? embed_ : use("lm_head.weight", {c.vocab, c.D});
  auto mlp = [&](const std::string& p, int I) {
    MlpWeights w;
    w.I = I;
    w.gate = use(p + ".gate_proj.weight", {I, c.D});
    w.up = use(p + ".up_proj.weight", {I, c.D});
    w.down = use(p + ".down_proj.weight", {c.D, I});
    return w;
  };
  layers_.resize(c.layers);
  for (int i = 0; i < c.layers; ++i) {
    Layer& L = layers_[i];
    const std::string p = "model.layers." + std::to_string(i) + ".";
    L.attn = c.attn_layers[i] != 0;
    L.moe = c.moe_layers[i] != 0;
    L.in_norm = use(p + "input_layernorm.weight", {c.D});
    L.post_norm = use(p + "post_attention_layernorm.weight", {c.D});
    if (L.attn) {
      L.att.q_proj = use(p + "self_attn.q_proj.weight", {2 * c.H * c.hd, c.D});
      L.att.k_proj = use(p + "self_attn.k_proj.weight", {c.Hkv * c.hd, c.D});
      L.att.v_proj = use(p + "self_attn.v_proj.weight", {c.Hkv * c.hd, c.D});
      L.att.o_proj = use(p + "self_attn.o_proj.weight", {c.D, c.H * c.hd});
      L.att.q_norm = use(p + "self_attn.q_norm.weight", {c.hd});
      L.att.k_norm = use(p + "self_attn.k_norm.weight", {c.hd});
    } else {
      const std::string q = p + "linear_attn.";
      L.gdn.in_proj_qkvz = use(q + "in_proj_qkvz.weight", {gd_.qkvz_rows(), c.D});
      L.gdn.in_proj_ba = use(q + "in_proj_ba.weight", {2 * c.Hv, c.D});
      L.gdn.conv = use(q + "conv1d.weight", {gd_.conv_channels(), 1, c.K});
      L.gdn.A_log = use(q + "A_log", {c.Hv});
      L.gdn.dt_bias = use(q + "dt_bias", {c.Hv});
      L.gdn.norm = use(q + "norm.weight", {c.dv});
      L.gdn.out_proj = use(q + "out_proj.weight", {c.D, c.Hv * c.dv});
    }
    if (L.moe) {
      L.moe_w.router = use(p + "mlp.gate.weight", {c.E, c.D});
      for (int e = 0; e < c.E; ++e) L.moe_w.experts.push_back(mlp(p + "mlp.experts." + std::to_string(e), c.moe_I));
      L.moe_w.shared = mlp(p + "mlp.shared_expert", c.shared_I);
      L.moe_w.shared_gate = use(p + "mlp.shared_expert_gate.weight", {1, c.D});
      L.moe_w.top_k = c.top_k;
      L.moe_w.norm_topk_prob = c.norm_topk_prob;
    } else {
      L.mlp = mlp(p + "mlp", c.I);
    }
  }
  // anything else (except the multi-token-prediction head, which inference ignores) is an error
  std::sort(used.begin(), used.end());
  for (auto it = t_.begin(); it != t_.end();) {
    if (std::binary_search(used.begin(), used.end(), it->first)) { ++it; continue; }
    if (it->first.rfind("mtp.", 0) == 0) { it = t_.erase(it); continue; }
    throw std::invalid_argument("qwen3_next checkpoint: unexpected tensor " + it->first);
  }
}

size_t NextState::gdn_bytes() const {
  size_t b = 0;
  for (auto& g : gdn) b += g.bytes();
  return b;
}

NextState NextModel::new_state() const {
  NextState s;
  s.gdn.resize(cfg_.layers);
  s.kv.resize(cfg_.layers);
  for (int i = 0; i < cfg_.layers; ++i)
    if (!layers_[i].attn) s.gdn[i].reset(gd_);
  return s;
}

void NextModel::forward(NextState& st, const int* ids, int T, float* logits, bool all_logits,
                        DeltaMode mode) const {
  const int D = cfg_.D;
  for (int t = 0; t < T; ++t)
    if (ids[t] < 0 || ids[t] >= cfg_.vocab)
      throw std::out_of_range("token id " + std::to_string(ids[t]) + " out of range [0, " +
                              std::to_string(cfg_.vocab) + ")");
  std::vector<float> h((size_t)T * D), xn((size_t)T * D), y((size_t)T * D);
  for (int t = 0; t < T; ++t) std::copy(embed_ + (size_t)ids[t] * D, embed_ + (size_t)(ids[t] + 1) * D, h.begin() + (size_t)t * D);
  for (int i = 0; i < cfg_.layers; ++i) {
    const Layer& L = layers_[i];
    // h += Mixer(RMSNorm(h)); h += MLP(RMSNorm(h))
    for (int t = 0; t < T; ++t) rmsnorm_1p(&h[(size_t)t * D], L.in_norm, D, cfg_.eps, &xn[(size_t)t * D]);
    auto t0 = Clock::now();
    if (L.attn) {
      gated_attention_forward(ad_, L.att, xn.data(), T, st.kv[i], y.data());
      attn_seconds += ms_since(t0) / 1e3;
    } else {
      gdn_forward(gd_, L.gdn, xn.data(), T, st.gdn[i], y.data(), mode);
      gdn_seconds += ms_since(t0) / 1e3;
    }
    for (size_t j = 0; j < h.size(); ++j) h[j] += y[j];
    for (int t = 0; t < T; ++t) rmsnorm_1p(&h[(size_t)t * D], L.post_norm, D, cfg_.eps, &xn[(size_t)t * D]);
    if (L.moe) moe_forward(D, L.moe_w, xn.data(), T, y.data());
    else mlp_forward(D, L.mlp, xn.data(), T, y.data());
    for (size_t j = 0; j < h.size(); ++j) h[j] += y[j];
  }
  st.pos += T;
  const int first = all_logits ? 0 : T - 1;
  for (int t = first; t < T; ++t) rmsnorm_1p(&h[(size_t)t * D], final_norm_, D, cfg_.eps, &xn[(size_t)t * D]);
  matmul_t(xn.data() + (size_t)first * D, T - first, D, lm_head_, cfg_.vocab, logits);
}

// ---------------------------------------------------------------- session

NextSession::NextSession(const NextModel& m, CheckpointPolicy p) : policy(std::move(p)), m_(m) {
  if (policy.every < 0) throw std::invalid_argument("checkpoint policy: every must be >= 0");
  if (policy.budget_mib < 0) throw std::invalid_argument("checkpoint policy: budget_mib must be >= 0");
  for (int q : policy.positions)
    if (q <= 0) throw std::invalid_argument("checkpoint policy: positions must be > 0");
  reset();
}

void NextSession::reset() {
  st_ = m_.new_state();
  held_.clear();
  logits_.clear();
  ckpt_.clear();
}

std::vector<int> NextSession::checkpoints() const {
  std::vector<int> v;
  for (auto& kv : ckpt_) v.push_back(kv.first);
  return v;
}

size_t NextSession::snapshot_bytes() const {
  size_t b = 0;
  for (auto& kv : ckpt_) b += kv.second.bytes;
  return b;
}

size_t NextSession::state_bytes() const {
  size_t b = st_.gdn_bytes();
  for (auto& k : st_.kv) b += k.bytes();
  return b;
}

bool NextSession::wants_snapshot(int pos, int prompt_len) const {
  if (pos <= 0) return false;
  if (policy.at_prompt_end && pos == prompt_len) return true;
  if (policy.every > 0 && pos % policy.every == 0) return true;
  return std::find(policy.positions.begin(), policy.positions.end(), pos) != policy.positions.end();
}

void NextSession::take_snapshot(CallReport& r) {
  auto t0 = Clock::now();
  Snapshot s;
  s.gdn = st_.gdn;  // conv windows + fp32 S of every GDN layer (attention layers hold empty states)
  s.logits = logits_;
  s.used = ++tick_;
  s.bytes = st_.gdn_bytes() + s.logits.size() * sizeof(float);
  ckpt_[(int)held_.size()] = std::move(s);
  r.snapshot_ms += ms_since(t0);
  r.snapshots_taken++;
  enforce_budget(r);
}

void NextSession::enforce_budget(CallReport& r) {
  if (policy.budget_mib <= 0) return;
  const size_t budget = (size_t)(policy.budget_mib * 1024.0 * 1024.0);
  while (!ckpt_.empty() && snapshot_bytes() > budget) {
    auto lru = ckpt_.begin();
    for (auto it = ckpt_.begin(); it != ckpt_.end(); ++it)
      if (it->second.used < lru->second.used) lru = it;
    r.evicted.push_back(lru->first);
    ckpt_.erase(lru);
  }
}

void NextSession::step(const int* ids, int T) {
  logits_.resize(m_.config().vocab);
  m_.forward(st_, ids, T, logits_.data(), false);
}

CallReport NextSession::generate(const std::vector<int>& prompt, int max_new_tokens,
                                 const std::vector<int>& stop_ids, const std::vector<int>& force_ids) {
  if (max_new_tokens < 0) throw std::invalid_argument("max_new_tokens must be >= 0");
  if (prompt.empty()) throw std::invalid_argument("prompt_ids must not be empty");
  for (int id : prompt)
    if (id < 0 || id >= m_.config().vocab)
      throw std::out_of_range("prompt_ids: token id " + std::to_string(id) + " out of range");
  CallReport r;
  r.prompt_len = (int)prompt.size();
  auto t0 = Clock::now();
  // Contract 1: reuse = lcp if lcp == len(held), else the largest checkpoint <= lcp.
  int lcp = 0;
  while (lcp < (int)held_.size() && lcp < r.prompt_len && held_[lcp] == prompt[lcp]) ++lcp;
  r.lcp = lcp;
  int reuse = lcp;
  if (lcp != (int)held_.size()) {
    auto it = ckpt_.upper_bound(lcp);  // first checkpoint > lcp
    ckpt_.erase(it, ckpt_.end());      // snapshots past the divergence describe other ids
    if (ckpt_.empty()) {
      reuse = 0;
      st_ = m_.new_state();
      logits_.clear();
    } else {
      auto& [c, snap] = *ckpt_.rbegin();
      reuse = c;
      st_.gdn = snap.gdn;
      logits_ = snap.logits;
      snap.used = ++tick_;
      r.restored = c;
    }
    for (auto& kv : st_.kv) kv.truncate(AttnDims{0, 0, m_.config().Hkv, m_.config().hd}, reuse);
    st_.pos = reuse;
    held_.resize(reuse);
  }
  r.reused = reuse;
  // read prompt[reuse:], cut into segments that end where the policy wants a snapshot
  int p = reuse;
  while (p < r.prompt_len) {
    int e = p + 1;
    while (e < r.prompt_len && !wants_snapshot(e, r.prompt_len)) ++e;
    step(prompt.data() + p, e - p);
    held_.insert(held_.end(), prompt.begin() + p, prompt.begin() + e);
    p = e;
    if (wants_snapshot(p, r.prompt_len) && !ckpt_.count(p)) take_snapshot(r);
  }
  r.read = r.prompt_len - reuse;
  r.logits_saved = r.read == 0;
  if (r.logits_saved && policy.at_prompt_end && !ckpt_.count(r.prompt_len)) take_snapshot(r);
  r.prefill_ms = ms_since(t0);
  // decode: each produced id is fed back so held == the ids whose effect is in the state
  auto t1 = Clock::now();
  const int n_new = force_ids.empty() ? max_new_tokens : std::min<int>(max_new_tokens, (int)force_ids.size());
  for (int i = 0; i < n_new; ++i) {
    int id;
    if (!force_ids.empty()) id = force_ids[i];
    else id = (int)(std::max_element(logits_.begin(), logits_.end()) - logits_.begin());
    r.gen_ids.push_back(id);
    step(&id, 1);
    held_.push_back(id);
    if (wants_snapshot((int)held_.size(), -1) && !ckpt_.count((int)held_.size())) take_snapshot(r);
    if (std::find(stop_ids.begin(), stop_ids.end(), id) != stop_ids.end()) break;
  }
  r.decode_ms = ms_since(t1);
  return r;
}

}  // namespace strata::next
