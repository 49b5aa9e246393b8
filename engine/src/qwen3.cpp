#include "qwen3.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "profile.h"
#include "strata/kernels.h"

namespace strata {

namespace k = kernels;

Qwen3Config Qwen3Config::read(ModelFolder& c) {
  Qwen3Config q;
  q.vocab = c.cfg_int("vocab_size");
  q.hidden = c.cfg_int("hidden_size");
  q.layers = c.cfg_int("num_hidden_layers");
  q.heads = c.cfg_int("num_attention_heads");
  q.kv_heads = c.cfg_int("num_key_value_heads", q.heads);
  q.head_dim = c.cfg_int("head_dim", 128);
  q.inter = c.cfg_int("intermediate_size");
  q.eps = float(c.cfg_float("rms_norm_eps", 1e-6));
  auto positive = [&](const char* name, int64_t v) {
    if (v <= 0) throw ModelFolderError("config.json: field '" + std::string(name) + "' must be positive, got " + std::to_string(v));
  };
  positive("vocab_size", q.vocab); positive("hidden_size", q.hidden); positive("num_hidden_layers", q.layers);
  positive("num_attention_heads", q.heads); positive("num_key_value_heads", q.kv_heads); positive("head_dim", q.head_dim);
  positive("intermediate_size", q.inter);
  if (q.heads % q.kv_heads != 0) throw ModelFolderError("config.json: num_attention_heads must be a multiple of num_key_value_heads");
  if (q.head_dim % 2 != 0 || q.head_dim > 1024) throw ModelFolderError("config.json: head_dim must be even and <= 1024");
  if (c.cfg_bool("attention_bias", false)) throw ModelFolderError("config.json: attention_bias=true is not supported");
  std::string act = c.cfg_str("hidden_act", "silu");
  if (act != "silu") throw ModelFolderError("config.json: hidden_act '" + act + "' is not supported (silu only)");
  q.rope_theta = 10000.0;
  if (const Json* rp = c.config().find("rope_parameters"); rp && rp->is_object()) {
    if (const Json* t = rp->find("rope_theta"); t && t->is_number()) q.rope_theta = t->number;
  } else {
    q.rope_theta = c.cfg_float("rope_theta", 10000.0);
  }
  if (const Json* rs = c.config().find("rope_scaling"); rs && rs->is_object()) {
    const Json* ty = rs->find("rope_type");
    if (!ty) ty = rs->find("type");
    if (ty && ty->is_string() && ty->string != "default")
      throw ModelFolderError("config.json: rope_scaling type '" + ty->string + "' is not supported");
  }
  return q;
}

Qwen3Model::Qwen3Model(std::unique_ptr<ModelFolder> ckpt, const LoadOptions& opts)
    : ckpt_(std::move(ckpt)), store_(opts.weights, copy_weights(*ckpt_, opts)) {
  ModelFolder& c = *ckpt_;
  const Qwen3Config cfg = Qwen3Config::read(c);
  const int64_t V = cfg.vocab, L = cfg.layers;
  D_ = cfg.hidden;
  H_ = cfg.heads;
  Hkv_ = cfg.kv_heads;
  hd_ = cfg.head_dim;
  I_ = cfg.inter;
  eps_ = cfg.eps;
  const double theta = cfg.rope_theta;
  inv_freq_ = k::rope_inv_freq(theta, int(hd_));

  DecoderIO io = load_decoder_io(c, "qwen3", V, D_, L, opts, info_);
  check_kv_cache(info_, hd_);
  lm_head_ = store_.prepare(io.lm_head);
  // tied: the lm_head's copy serves the embedding too; else the embedding is copied out on its own
  embed_ = io.embed.data == io.lm_head.data && lm_head_.dtype == io.embed.dtype && lm_head_.data != io.embed.data
               ? lm_head_ : store_.copy_out(io.embed);
  final_norm_ = std::move(io.final_norm);
  layers_.resize(size_t(L));
  for (int64_t i = 0; i < L; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    Layer& ly = layers_[size_t(i)];
    ly.input_norm = c.to_f32(p + "input_layernorm.weight", {D_});
    ly.post_norm = c.to_f32(p + "post_attention_layernorm.weight", {D_});
    ly.q_norm = c.to_f32(p + "self_attn.q_norm.weight", {hd_});
    ly.k_norm = c.to_f32(p + "self_attn.k_norm.weight", {hd_});
    ly.wq = store_.prepare(c.mat(p + "self_attn.q_proj.weight", {H_ * hd_, D_}));
    ly.wk = store_.prepare(c.mat(p + "self_attn.k_proj.weight", {Hkv_ * hd_, D_}));
    ly.wv = store_.prepare(c.mat(p + "self_attn.v_proj.weight", {Hkv_ * hd_, D_}));
    ly.wo = store_.prepare(c.mat(p + "self_attn.o_proj.weight", {D_, H_ * hd_}));
    ly.w_gate = store_.prepare(c.mat(p + "mlp.gate_proj.weight", {I_, D_}));
    ly.w_up = store_.prepare(c.mat(p + "mlp.up_proj.weight", {I_, D_}));
    ly.w_down = store_.prepare(c.mat(p + "mlp.down_proj.weight", {D_, I_}));
  }
  c.check_all_used({});
  int64_t wb = 0;
  for (const auto& name : c.names()) wb += int64_t(c.tensor_info(name).nbytes);
  info_.weight_bytes = wb;
  info_.weights = store_.name();
  info_.weights_memory = store_.memory(opts.use_mmap);
  info_.stream_bytes = store_.streamed();
  threads_ = opts.threads;
}

std::unique_ptr<SessionState> Qwen3Model::new_state() const {
  auto st = std::make_unique<SessionState>();
  const KVFormat fmt = kv_cache_format(info_);
  for (size_t i = 0; i < layers_.size(); ++i) st->layers.push_back(std::make_unique<AttentionKV>(int(Hkv_), int(hd_), fmt));
  return st;
}

void Qwen3Model::forward(const int32_t* tokens, int64_t n, SessionState& state, Logits mode, float* logits) {
  use_threads(threads_);
  const bool dec = n == 1;
  prof::count_forward(dec, n);
  const int64_t D = D_, qd = H_ * hd_, kvd = Hkv_ * hd_, pos0 = state.n_tokens;
  // Activations, row-major per token: h [n, D], xn [n, D], q [n, H*hd], att [n, H*hd], g/u [n, I].
  std::vector<float> h(size_t(n * D)), xn(size_t(n * D)), tmp(size_t(n * D));
  std::vector<float> q(size_t(n * qd)), att(size_t(n * qd));
  std::vector<float> g(size_t(n * I_)), u(size_t(n * I_));
  {
    prof::Scope ps(prof::Embed, dec);
    for (int64_t t = 0; t < n; ++t) k::row_f32(embed_, tokens[t], h.data() + t * D);
  }

  for (size_t li = 0; li < layers_.size(); ++li) {
    const Layer& ly = layers_[li];
    auto& kv = static_cast<AttentionKV&>(*state.layers[li]);
    {
      prof::Scope ps(prof::Norm, dec);
      for (int64_t t = 0; t < n; ++t) k::rmsnorm(h.data() + t * D, ly.input_norm.data(), D, eps_, xn.data() + t * D);
    }
    float *kc, *vc;
    kv.append(n, &kc, &vc);  // this chunk's rows of the cache: [n, Hkv, hd]
    {
      prof::Scope ps(prof::QKV, dec);
      const k::MatOut qkv[3] = {{&ly.wq, q.data()}, {&ly.wk, kc}, {&ly.wv, vc}};
      k::matmul_multi(qkv, 3, xn.data(), n);
    }
    {
      prof::Scope ps(prof::Rope, dec);
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t hh = 0; hh < H_; ++hh) {
          float* qh = q.data() + (t * H_ + hh) * hd_;
          k::rmsnorm(qh, ly.q_norm.data(), hd_, eps_, qh);
        }
        for (int64_t hh = 0; hh < Hkv_; ++hh) {
          float* kh = kc + (t * Hkv_ + hh) * hd_;
          k::rmsnorm(kh, ly.k_norm.data(), hd_, eps_, kh);
        }
        k::rope(q.data() + t * qd, int(H_), int(hd_), int(hd_), pos0 + t, inv_freq_.data());
        k::rope(kc + t * kvd, int(Hkv_), int(hd_), int(hd_), pos0 + t, inv_freq_.data());
      }
    }
    {
      prof::Scope ps(prof::Attention, dec);
      kv.commit();  // f16 / q8 cache: round this chunk's rows in (no-op for f32)
      kv.attend(q.data(), n, int(H_), att.data());
    }
    {
      prof::Scope ps(prof::OProj, dec);
      k::matmul(ly.wo, att.data(), n, tmp.data());
      k::add(h.data(), tmp.data(), n * D);
    }
    {
      prof::Scope ps(prof::GateUp, dec);
      for (int64_t t = 0; t < n; ++t) k::rmsnorm(h.data() + t * D, ly.post_norm.data(), D, eps_, xn.data() + t * D);
      const k::MatOut gu[2] = {{&ly.w_gate, g.data()}, {&ly.w_up, u.data()}};
      k::matmul_multi(gu, 2, xn.data(), n);
      k::silu_mul(g.data(), u.data(), n * I_);
    }
    {
      prof::Scope ps(prof::Down, dec);
      k::matmul(ly.w_down, g.data(), n, tmp.data());
      k::add(h.data(), tmp.data(), n * D);
    }
  }
  state.n_tokens = pos0 + n;

  if (mode == Logits::None) return;
  prof::Scope ps(prof::LMHead, dec);
  const int64_t first = mode == Logits::All ? 0 : n - 1, m = n - first;
  for (int64_t t = 0; t < m; ++t) k::rmsnorm(h.data() + (first + t) * D, final_norm_.data(), D, eps_, xn.data() + t * D);
  k::matmul(lm_head_, xn.data(), m, logits);
}

// B sessions' decode steps in one pass: the matmuls take the [B, D] rows together (each weight row read
// once; a row's sums are its own, kernels::matmul), norms and RoPE per row at each sequence's position,
// attention per sequence over its own cache -- every op of forward(n = 1) on the same values, in the same
// order, so each sequence's logits are the bits of its own forward.
void Qwen3Model::forward_batch(const int32_t* tokens, int64_t B, SessionState* const* states,
                               float* const* logits) {
  if (B == 1) return forward(tokens, 1, *states[0], Logits::Last, logits[0]);
  use_threads(threads_);
  prof::count_forward(true, B);
  const int64_t n = B, D = D_, qd = H_ * hd_, kvd = Hkv_ * hd_;
  std::vector<int64_t> pos(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) pos[size_t(b)] = states[b]->n_tokens;
  std::vector<float> h(size_t(n * D)), xn(size_t(n * D)), tmp(size_t(n * D));
  std::vector<float> q(size_t(n * qd)), att(size_t(n * qd)), kb(size_t(n * kvd)), vb(size_t(n * kvd));
  std::vector<float> g(size_t(n * I_)), u(size_t(n * I_));
  {
    prof::Scope ps(prof::Embed, true);
    for (int64_t t = 0; t < n; ++t) k::row_f32(embed_, tokens[t], h.data() + t * D);
  }
  for (size_t li = 0; li < layers_.size(); ++li) {
    const Layer& ly = layers_[li];
    {
      prof::Scope ps(prof::Norm, true);
      for (int64_t t = 0; t < n; ++t) k::rmsnorm(h.data() + t * D, ly.input_norm.data(), D, eps_, xn.data() + t * D);
    }
    {
      prof::Scope ps(prof::QKV, true);
      const k::MatOut qkv[3] = {{&ly.wq, q.data()}, {&ly.wk, kb.data()}, {&ly.wv, vb.data()}};
      k::matmul_multi(qkv, 3, xn.data(), n);
    }
    {
      prof::Scope ps(prof::Rope, true);
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t hh = 0; hh < H_; ++hh) {
          float* qh = q.data() + (t * H_ + hh) * hd_;
          k::rmsnorm(qh, ly.q_norm.data(), hd_, eps_, qh);
        }
        for (int64_t hh = 0; hh < Hkv_; ++hh) {
          float* kh = kb.data() + (t * Hkv_ + hh) * hd_;
          k::rmsnorm(kh, ly.k_norm.data(), hd_, eps_, kh);
        }
        k::rope(q.data() + t * qd, int(H_), int(hd_), int(hd_), pos[size_t(t)], inv_freq_.data());
        k::rope(kb.data() + t * kvd, int(Hkv_), int(hd_), int(hd_), pos[size_t(t)], inv_freq_.data());
      }
    }
    {
      prof::Scope ps(prof::Attention, true);
      for (int64_t t = 0; t < n; ++t) {
        auto& kv = static_cast<AttentionKV&>(*states[t]->layers[li]);
        float *kc, *vc;
        kv.append(1, &kc, &vc);
        std::copy(kb.data() + t * kvd, kb.data() + (t + 1) * kvd, kc);
        std::copy(vb.data() + t * kvd, vb.data() + (t + 1) * kvd, vc);
        kv.commit();
        float* out = att.data() + t * qd;
        kv.attend(q.data() + t * qd, 1, int(H_), out);
      }
    }
    {
      prof::Scope ps(prof::OProj, true);
      k::matmul(ly.wo, att.data(), n, tmp.data());
      k::add(h.data(), tmp.data(), n * D);
    }
    {
      prof::Scope ps(prof::GateUp, true);
      for (int64_t t = 0; t < n; ++t) k::rmsnorm(h.data() + t * D, ly.post_norm.data(), D, eps_, xn.data() + t * D);
      const k::MatOut gu[2] = {{&ly.w_gate, g.data()}, {&ly.w_up, u.data()}};
      k::matmul_multi(gu, 2, xn.data(), n);
      k::silu_mul(g.data(), u.data(), n * I_);
    }
    {
      prof::Scope ps(prof::Down, true);
      k::matmul(ly.w_down, g.data(), n, tmp.data());
      k::add(h.data(), tmp.data(), n * D);
    }
  }
  for (int64_t t = 0; t < n; ++t) states[t]->n_tokens = pos[size_t(t)] + 1;
  prof::Scope ps(prof::LMHead, true);
  const int64_t V = info_.vocab_size;
  for (int64_t t = 0; t < n; ++t) k::rmsnorm(h.data() + t * D, final_norm_.data(), D, eps_, xn.data() + t * D);
  std::vector<float> lg(size_t(n * V));
  k::matmul(lm_head_, xn.data(), n, lg.data());
  for (int64_t t = 0; t < n; ++t) std::copy(lg.data() + t * V, lg.data() + (t + 1) * V, logits[t]);
}

}  // namespace strata
