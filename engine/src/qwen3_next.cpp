#include "qwen3_next.h"

#include <algorithm>
#include <string>

#include "profile.h"
#include "strata/kernels.h"

namespace strata {

namespace k = kernels;

namespace {

// A config field that is an array of ints (mlp_only_layers) or absent.
std::vector<int64_t> int_list(const ModelFolder& c, const std::string& key) {
  std::vector<int64_t> out;
  const Json* j = c.config().find(key);
  if (!j || j->is_null()) return out;
  if (!j->is_array()) throw ModelFolderError("config.json: field '" + key + "' must be a list of ints");
  for (const Json& v : j->array) {
    if (!v.is_number() || !v.integral) throw ModelFolderError("config.json: field '" + key + "' must be a list of ints");
    out.push_back(v.integer);
  }
  return out;
}

// Per layer: true for full attention. `layer_types` wins; else `full_attention_interval` (default 4).
std::vector<bool> attention_layers(const ModelFolder& c, int64_t L) {
  std::vector<bool> out(static_cast<size_t>(L));
  const Json* lt = c.config().find("layer_types");
  if (lt && !lt->is_null()) {
    if (!lt->is_array() || int64_t(lt->array.size()) != L)
      throw ModelFolderError("config.json: field 'layer_types' must be a list of num_hidden_layers = " +
                            std::to_string(L) + " strings");
    for (int64_t i = 0; i < L; ++i) {
      const Json& v = lt->array[size_t(i)];
      if (v.is_string() && v.string == "full_attention") out[size_t(i)] = true;
      else if (v.is_string() && v.string == "linear_attention") out[size_t(i)] = false;
      else throw ModelFolderError("config.json: field 'layer_types' entry " + std::to_string(i) +
                                 " must be 'full_attention' or 'linear_attention'");
    }
    return out;
  }
  const int64_t interval = c.cfg_int("full_attention_interval", 4);
  if (interval <= 0) throw ModelFolderError("config.json: field 'full_attention_interval' must be positive");
  for (int64_t i = 0; i < L; ++i) out[size_t(i)] = (i + 1) % interval == 0;
  return out;
}

}  // namespace

Qwen3NextModel::Qwen3NextModel(std::unique_ptr<ModelFolder> ckpt, const LoadOptions& opts)
    : ckpt_(std::move(ckpt)), store_(opts.weights, copy_weights(*ckpt_, opts)) {
  ModelFolder& c = *ckpt_;
  const int64_t V = c.cfg_int("vocab_size");
  D_ = c.cfg_int("hidden_size");
  const int64_t L = c.cfg_int("num_hidden_layers");
  const int64_t H = c.cfg_int("num_attention_heads");
  const int64_t Hkv = c.cfg_int("num_key_value_heads", H);
  const int64_t hd = c.cfg_int("head_dim", 256);
  const int64_t I = c.cfg_int("intermediate_size");
  eps_ = float(c.cfg_float("rms_norm_eps", 1e-6));
  gd_ = next::GdnDims{D_, c.cfg_int("linear_num_key_heads", 16), c.cfg_int("linear_num_value_heads", 32),
                      c.cfg_int("linear_key_head_dim", 128), c.cfg_int("linear_value_head_dim", 128),
                      c.cfg_int("linear_conv_kernel_dim", 4), eps_};
  const int64_t E = c.cfg_int("num_experts", 512), top_k = c.cfg_int("num_experts_per_tok", 10);
  const int64_t moe_I = c.cfg_int("moe_intermediate_size", 512);
  const int64_t shared_I = c.cfg_int("shared_expert_intermediate_size", 512);
  const int64_t sparse_step = c.cfg_int("decoder_sparse_step", 1);
  const bool norm_topk = c.cfg_bool("norm_topk_prob", true);
  auto positive = [&](const char* name, int64_t v) {
    if (v <= 0) throw ModelFolderError("config.json: field '" + std::string(name) + "' must be positive, got " + std::to_string(v));
  };
  positive("vocab_size", V); positive("hidden_size", D_); positive("num_hidden_layers", L);
  positive("num_attention_heads", H); positive("num_key_value_heads", Hkv); positive("head_dim", hd);
  positive("intermediate_size", I); positive("linear_num_key_heads", gd_.Hk);
  positive("linear_num_value_heads", gd_.Hv); positive("linear_key_head_dim", gd_.dk);
  positive("linear_value_head_dim", gd_.dv); positive("linear_conv_kernel_dim", gd_.K);
  positive("decoder_sparse_step", sparse_step);
  if (H % Hkv) throw ModelFolderError("config.json: num_attention_heads must be a multiple of num_key_value_heads");
  if (gd_.Hv % gd_.Hk)
    throw ModelFolderError("config.json: linear_num_value_heads must be a multiple of linear_num_key_heads");
  if (E < 0) throw ModelFolderError("config.json: field 'num_experts' must be >= 0");
  if (E > 0 && (top_k <= 0 || top_k > E))
    throw ModelFolderError("config.json: field 'num_experts_per_tok' must be in 1..num_experts");
  if (c.cfg_bool("attention_bias", false)) throw ModelFolderError("config.json: attention_bias=true is not supported");
  const std::string act = c.cfg_str("hidden_act", "silu");
  if (act != "silu") throw ModelFolderError("config.json: hidden_act '" + act + "' is not supported (silu only)");

  // RoPE: theta and partial_rotary_factor at top level (Hub files) or in rope_parameters (v5).
  double theta = c.cfg_float("rope_theta", 10000.0), factor = c.cfg_float("partial_rotary_factor", 0.25);
  if (const Json* rp = c.config().find("rope_parameters"); rp && rp->is_object()) {
    if (const Json* t = rp->find("rope_theta"); t && t->is_number()) theta = t->number;
    if (const Json* f = rp->find("partial_rotary_factor"); f && f->is_number()) factor = f->number;
    if (const Json* ty = rp->find("rope_type"); ty && ty->is_string() && ty->string != "default")
      throw ModelFolderError("config.json: rope_parameters.rope_type '" + ty->string + "' is not supported");
  }
  if (const Json* rs = c.config().find("rope_scaling"); rs && rs->is_object()) {
    const Json* ty = rs->find("rope_type");
    if (!ty) ty = rs->find("type");
    if (ty && ty->is_string() && ty->string != "default")
      throw ModelFolderError("config.json: rope_scaling type '" + ty->string + "' is not supported");
  }
  const int64_t rd = int64_t(double(hd) * factor);
  if (rd <= 0 || rd > hd || rd % 2 || rd > 1024)
    throw ModelFolderError("config.json: partial_rotary_factor " + std::to_string(factor) + " gives rotary dim " +
                          std::to_string(rd) + " (must be even, in 1..head_dim)");
  inv_freq_ = k::rope_inv_freq(theta, int(rd));
  ad_ = next::AttnDims{D_, H, Hkv, hd, rd, eps_};

  DecoderIO io = load_decoder_io(c, "qwen3_next", V, D_, L, opts, info_);
  check_kv_cache(info_, hd);
  lm_head_ = store_.prepare(io.lm_head);
  // tied: the lm_head's copy serves the embedding too; else the embedding is copied out on its own
  embed_ = io.embed.data == io.lm_head.data && lm_head_.dtype == io.embed.dtype && lm_head_.data != io.embed.data
               ? lm_head_ : store_.copy_out(io.embed);
  final_norm_ = std::move(io.final_norm);

  const std::vector<bool> attn = attention_layers(c, L);
  const std::vector<int64_t> mlp_only = int_list(c, "mlp_only_layers");
  auto mlp = [&](const std::string& p, int64_t inner, bool every_token) {
    next::MlpWeights w;
    w.I = inner;
    auto prep = [&](const Mat& m) { return every_token ? store_.prepare(m) : store_.prepare_once(m); };
    w.gate = prep(c.mat(p + ".gate_proj.weight", {inner, D_}));
    w.up = prep(c.mat(p + ".up_proj.weight", {inner, D_}));
    w.down = prep(c.mat(p + ".down_proj.weight", {D_, inner}));
    return w;
  };
  layers_.resize(size_t(L));
  for (int64_t i = 0; i < L; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    Layer& ly = layers_[size_t(i)];
    ly.attn = attn[size_t(i)];
    ly.moe = E > 0 && (i + 1) % sparse_step == 0 &&
             std::find(mlp_only.begin(), mlp_only.end(), i) == mlp_only.end();
    ly.input_norm = c.to_f32(p + "input_layernorm.weight", {D_});
    ly.post_norm = c.to_f32(p + "post_attention_layernorm.weight", {D_});
    if (ly.attn) {
      const std::string a = p + "self_attn.";
      ly.att.q_proj = store_.prepare(c.mat(a + "q_proj.weight", {2 * H * hd, D_}));
      ly.att.k_proj = store_.prepare(c.mat(a + "k_proj.weight", {Hkv * hd, D_}));
      ly.att.v_proj = store_.prepare(c.mat(a + "v_proj.weight", {Hkv * hd, D_}));
      ly.att.o_proj = store_.prepare(c.mat(a + "o_proj.weight", {D_, H * hd}));
      ly.att.q_norm = c.to_f32(a + "q_norm.weight", {hd});
      ly.att.k_norm = c.to_f32(a + "k_norm.weight", {hd});
    } else {
      const std::string g = p + "linear_attn.";
      ly.gdn.in_proj_qkvz = store_.prepare(c.mat(g + "in_proj_qkvz.weight", {gd_.qkvz_rows(), D_}));
      ly.gdn.in_proj_ba = store_.prepare(c.mat(g + "in_proj_ba.weight", {2 * gd_.Hv, D_}));
      ly.gdn.out_proj = store_.prepare(c.mat(g + "out_proj.weight", {D_, gd_.Hv * gd_.dv}));
      ly.gdn.conv = c.to_f32(g + "conv1d.weight", {gd_.conv_channels(), 1, gd_.K});
      ly.gdn.A_log = c.to_f32(g + "A_log", {gd_.Hv});
      ly.gdn.dt_bias = c.to_f32(g + "dt_bias", {gd_.Hv});
      ly.gdn.norm = c.to_f32(g + "norm.weight", {gd_.dv});
    }
    if (ly.moe) {
      ly.moe_w.router = store_.prepare(c.mat(p + "mlp.gate.weight", {E, D_}));
      for (int64_t e = 0; e < E; ++e) ly.moe_w.experts.push_back(mlp(p + "mlp.experts." + std::to_string(e), moe_I, false));
      ly.moe_w.shared = mlp(p + "mlp.shared_expert", shared_I, true);
      ly.moe_w.shared_gate = c.to_f32(p + "mlp.shared_expert_gate.weight", {1, D_});
      ly.moe_w.top_k = top_k;
      ly.moe_w.norm_topk_prob = norm_topk;
    } else {
      ly.mlp = mlp(p + "mlp", I, true);
    }
  }
  c.check_all_used({"mtp."});
  int64_t wb = 0;
  for (const auto& name : c.names())
    if (name.rfind("mtp.", 0) != 0) wb += int64_t(c.tensor_info(name).nbytes);
  info_.weight_bytes = wb;
  info_.weights = store_.name();
  info_.weights_memory = store_.memory(opts.use_mmap);
  info_.stream_bytes = store_.streamed();  // routed experts not counted (top-k of them run per token)
  threads_ = opts.threads;
}

std::unique_ptr<SessionState> Qwen3NextModel::new_state() const {
  auto st = std::make_unique<SessionState>();
  const KVFormat fmt = kv_cache_format(info_);
  for (const Layer& ly : layers_) {
    if (ly.attn) st->layers.push_back(std::make_unique<AttentionKV>(int(ad_.Hkv), int(ad_.hd), fmt));
    else st->layers.push_back(std::make_unique<next::GdnState>(gd_));
  }
  return st;
}

void Qwen3NextModel::forward(const int32_t* tokens, int64_t n, SessionState& state, Logits mode, float* logits) {
  use_threads(threads_);
  const bool dec = n == 1;
  prof::count_forward(dec, n);
  const int64_t D = D_;
  std::vector<float> h(size_t(n * D)), xn(size_t(n * D)), y(size_t(n * D));
  for (int64_t t = 0; t < n; ++t) k::row_f32(embed_, tokens[t], h.data() + t * D);
  for (size_t li = 0; li < layers_.size(); ++li) {
    const Layer& ly = layers_[li];
    // h += Mixer(RMSNorm(h)); h += MLP(RMSNorm(h))
    for (int64_t t = 0; t < n; ++t) k::rmsnorm_1p(h.data() + t * D, ly.input_norm.data(), D, eps_, xn.data() + t * D);
    if (ly.attn) {
      prof::Scope ps(prof::Attention, dec);
      next::gated_attention_forward(ad_, ly.att, inv_freq_.data(), xn.data(), n,
                                    static_cast<AttentionKV&>(*state.layers[li]), y.data());
    } else {
      prof::Scope ps(prof::GDN, dec);
      next::gdn_forward(gd_, ly.gdn, xn.data(), n, static_cast<next::GdnState&>(*state.layers[li]), y.data());
    }
    k::add(h.data(), y.data(), n * D);
    for (int64_t t = 0; t < n; ++t) k::rmsnorm_1p(h.data() + t * D, ly.post_norm.data(), D, eps_, xn.data() + t * D);
    {
      prof::Scope ps(prof::MoE, dec);
      if (ly.moe) next::moe_forward(D, ly.moe_w, xn.data(), n, y.data());
      else next::mlp_forward(D, ly.mlp, xn.data(), n, y.data());
    }
    k::add(h.data(), y.data(), n * D);
  }
  state.n_tokens += n;

  if (mode == Logits::None) return;
  prof::Scope ps(prof::LMHead, dec);
  const int64_t first = mode == Logits::All ? 0 : n - 1, m = n - first;
  for (int64_t t = 0; t < m; ++t) k::rmsnorm_1p(h.data() + (first + t) * D, final_norm_.data(), D, eps_, xn.data() + t * D);
  k::matmul(lm_head_, xn.data(), m, logits);
}

// B sessions' decode steps in one pass: the mixers (gated attention, Gated DeltaNet: their projections
// included) run per sequence over its own state; the MLP / MoE and the lm_head take the [B, D] rows together
// (a token's routing, expert sums and matmul rows are its own). Every op sees the values forward(n = 1)
// gives it, in the same order: each sequence's logits are the bits of its own forward.
void Qwen3NextModel::forward_batch(const int32_t* tokens, int64_t B, SessionState* const* states,
                                   float* const* logits) {
  if (B == 1) return forward(tokens, 1, *states[0], Logits::Last, logits[0]);
  use_threads(threads_);
  prof::count_forward(true, B);
  const int64_t n = B, D = D_;
  std::vector<float> h(size_t(n * D)), xn(size_t(n * D)), y(size_t(n * D));
  for (int64_t t = 0; t < n; ++t) k::row_f32(embed_, tokens[t], h.data() + t * D);
  for (size_t li = 0; li < layers_.size(); ++li) {
    const Layer& ly = layers_[li];
    for (int64_t t = 0; t < n; ++t) k::rmsnorm_1p(h.data() + t * D, ly.input_norm.data(), D, eps_, xn.data() + t * D);
    for (int64_t t = 0; t < n; ++t) {
      if (ly.attn) {
        prof::Scope ps(prof::Attention, true);
        next::gated_attention_forward(ad_, ly.att, inv_freq_.data(), xn.data() + t * D, 1,
                                      static_cast<AttentionKV&>(*states[t]->layers[li]), y.data() + t * D);
      } else {
        prof::Scope ps(prof::GDN, true);
        next::gdn_forward(gd_, ly.gdn, xn.data() + t * D, 1, static_cast<next::GdnState&>(*states[t]->layers[li]),
                          y.data() + t * D);
      }
    }
    k::add(h.data(), y.data(), n * D);
    for (int64_t t = 0; t < n; ++t) k::rmsnorm_1p(h.data() + t * D, ly.post_norm.data(), D, eps_, xn.data() + t * D);
    {
      prof::Scope ps(prof::MoE, true);
      if (ly.moe) next::moe_forward(D, ly.moe_w, xn.data(), n, y.data());
      else next::mlp_forward(D, ly.mlp, xn.data(), n, y.data());
    }
    k::add(h.data(), y.data(), n * D);
  }
  for (int64_t t = 0; t < n; ++t) states[t]->n_tokens += 1;
  prof::Scope ps(prof::LMHead, true);
  const int64_t V = info_.vocab_size;
  for (int64_t t = 0; t < n; ++t) k::rmsnorm_1p(h.data() + t * D, final_norm_.data(), D, eps_, xn.data() + t * D);
  std::vector<float> lg(size_t(n * V));
  k::matmul(lm_head_, xn.data(), n, lg.data());
  for (int64_t t = 0; t < n; ++t) std::copy(lg.data() + t * V, lg.data() + (t + 1) * V, logits[t]);
}

}  // namespace strata
