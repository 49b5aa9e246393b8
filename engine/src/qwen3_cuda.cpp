#include "qwen3_cuda.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "qwen3.h"
#include "strata/kernels.h"
#include "strata_cuda.h"

namespace strata {

namespace {

namespace k = kernels;

std::string backend_path() {
  if (const char* env = std::getenv("STRATA_CUDA_LIBRARY"); env && *env) return env;
  Dl_info self{};
  if (::dladdr(reinterpret_cast<void*>(&backend_path), &self) && self.dli_fname) {
    const std::string file = self.dli_fname;  // the extension this code is linked into
    const size_t slash = file.rfind('/');
    return (slash == std::string::npos ? std::string(".") : file.substr(0, slash)) + "/libstrata_cuda.so";
  }
  return "libstrata_cuda.so";
}

// The backend's table, loaded once per process (a failed load is tried again at the next CUDA load).
const StrataCudaApi& backend() {
  static std::mutex mu;
  static const StrataCudaApi* api = nullptr;
  std::lock_guard<std::mutex> g(mu);
  if (api) return *api;
  const std::string path = backend_path();
  void* lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* why = ::dlerror();
    throw std::runtime_error("device='cuda': this build of strata_lab has no CUDA backend (" +
                             std::string(why ? why : path) +
                             "); it is built when nvcc is on the PATH at build time (docs/ENGINE.md \"GPU\")");
  }
  using Entry = const StrataCudaApi* (*)(int);
  auto entry = reinterpret_cast<Entry>(::dlsym(lib, "strata_cuda_api"));
  const StrataCudaApi* table = entry ? entry(STRATA_CUDA_ABI) : nullptr;
  if (!table) {
    ::dlclose(lib);
    throw std::runtime_error("device='cuda': " + path + " is from another build of strata_lab (ABI " +
                             std::to_string(STRATA_CUDA_ABI) + " wanted); rebuild it");
  }
  api = table;
  return *api;
}

void check(int rc, const char* err) {
  if (rc != 0) throw std::runtime_error(std::string("device='cuda': ") + err);
}

// A matrix as bf16 rows: stored bf16 as it is, anything else rounded to nearest even from its f32 values.
std::vector<uint16_t> to_bf16(const Mat& w) {
  std::vector<uint16_t> out(static_cast<size_t>(w.rows * w.cols));
  if (w.dtype == DType::BF16 && !w.scale) {
    std::memcpy(out.data(), w.data, out.size() * sizeof(uint16_t));
    return out;
  }
  std::vector<float> row(static_cast<size_t>(w.cols));
  for (int64_t r = 0; r < w.rows; ++r) {
    k::row_f32(w, r, row.data());
    for (int64_t c = 0; c < w.cols; ++c) out[size_t(r * w.cols + c)] = k::f32_to_bf16(row[size_t(c)]);
  }
  return out;
}

// One session's KV cache on the device: every layer's, so a CUDA state has one LayerState.
class CudaKV final : public LayerState {
 public:
  CudaKV(const StrataCudaApi& api, StrataCudaCache* cache) : api_(api), cache_(cache) {}
  ~CudaKV() override { api_.cache_free(cache_); }
  StrataCudaCache* cache() const { return cache_; }
  int64_t bytes() const override { return api_.cache_bytes(cache_); }
  bool can_truncate() const override { return true; }
  void truncate(int64_t n) override { api_.cache_truncate(cache_, n); }
  std::unique_ptr<LayerSnapshot> snapshot() const override { return nullptr; }
  void restore(const LayerSnapshot&) override {}
  void reset() override { api_.cache_reset(cache_); }

 private:
  const StrataCudaApi& api_;
  StrataCudaCache* cache_;
};

class Qwen3CudaModel final : public Model {
 public:
  Qwen3CudaModel(std::unique_ptr<ModelFolder> ckpt, const LoadOptions& opts);
  ~Qwen3CudaModel() override {
    if (m_) api_.model_free(m_);
  }
  const ModelInfo& info() const override { return info_; }
  std::unique_ptr<SessionState> new_state() const override;
  void forward(const int32_t* tokens, int64_t n, SessionState& state, Logits mode, float* logits) override;
  void forward_batch(const int32_t* tokens, int64_t B, SessionState* const* states, float* const* logits) override;

 private:
  StrataCudaCache* cache_of(SessionState& st) const;
  void upload(int layer, int tensor, const Mat& w);
  void upload_norm(int layer, int tensor, const std::vector<float>& w);

  const StrataCudaApi& api_;
  StrataCudaModel* m_ = nullptr;
  ModelInfo info_;
  std::mutex mu_;  // the device's activation buffers: one forward at a time (the step thread, Engine.forward)
};

Qwen3CudaModel::Qwen3CudaModel(std::unique_ptr<ModelFolder> ckpt, const LoadOptions& opts) : api_(backend()) {
  char err[512] = {0};
  char name[256] = {0};
  int64_t total = 0;
  check(api_.probe(name, sizeof name, &total, err, sizeof err), err);
  ModelFolder& c = *ckpt;
  const Qwen3Config cfg = Qwen3Config::read(c);
  const int64_t V = cfg.vocab, D = cfg.hidden, L = cfg.layers, H = cfg.heads, Hkv = cfg.kv_heads, hd = cfg.head_dim,
                I = cfg.inter;
  DecoderIO io = load_decoder_io(c, "qwen3", V, D, L, opts, info_);
  const StrataCudaShape shape{V, D, L, H, Hkv, hd, I, cfg.eps};
  const std::vector<float> inv_freq = k::rope_inv_freq(cfg.rope_theta, int(hd));
  check(api_.model_create(&shape, inv_freq.data(), &m_, err, sizeof err), err);
  upload(-1, STRATA_CUDA_EMBED, io.embed);
  if (io.lm_head.data == io.embed.data) check(api_.model_upload(m_, -1, STRATA_CUDA_LM_HEAD, nullptr, V, D, err, sizeof err), err);
  else upload(-1, STRATA_CUDA_LM_HEAD, io.lm_head);
  upload_norm(-1, STRATA_CUDA_FINAL_NORM, io.final_norm);
  for (int64_t i = 0; i < L; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    const int li = int(i);
    upload_norm(li, STRATA_CUDA_INPUT_NORM, c.to_f32(p + "input_layernorm.weight", {D}));
    upload_norm(li, STRATA_CUDA_POST_NORM, c.to_f32(p + "post_attention_layernorm.weight", {D}));
    upload_norm(li, STRATA_CUDA_Q_NORM, c.to_f32(p + "self_attn.q_norm.weight", {hd}));
    upload_norm(li, STRATA_CUDA_K_NORM, c.to_f32(p + "self_attn.k_norm.weight", {hd}));
    upload(li, STRATA_CUDA_WQ, c.mat(p + "self_attn.q_proj.weight", {H * hd, D}));
    upload(li, STRATA_CUDA_WK, c.mat(p + "self_attn.k_proj.weight", {Hkv * hd, D}));
    upload(li, STRATA_CUDA_WV, c.mat(p + "self_attn.v_proj.weight", {Hkv * hd, D}));
    upload(li, STRATA_CUDA_WO, c.mat(p + "self_attn.o_proj.weight", {D, H * hd}));
    upload(li, STRATA_CUDA_W_GATE, c.mat(p + "mlp.gate_proj.weight", {I, D}));
    upload(li, STRATA_CUDA_W_UP, c.mat(p + "mlp.up_proj.weight", {I, D}));
    upload(li, STRATA_CUDA_W_DOWN, c.mat(p + "mlp.down_proj.weight", {D, I}));
  }
  c.check_all_used({});
  int64_t wb = 0;
  for (const auto& n : c.names()) wb += int64_t(c.tensor_info(n).nbytes);
  info_.weight_bytes = wb;
  info_.weights = "bf16";
  info_.weights_memory = "cuda";
  info_.kv_cache = "bf16";
  info_.kv_cache_auto = true;
  info_.device = "cuda";
  // a decode step streams every layer's matrices and the lm_head once, in bf16
  info_.stream_bytes = 2 * (L * ((H + 2 * Hkv) * hd * D + D * H * hd + 3 * I * D) + V * D);
  threads_ = opts.threads;
}

void Qwen3CudaModel::upload(int layer, int tensor, const Mat& w) {
  char err[512] = {0};
  const std::vector<uint16_t> b = to_bf16(w);
  check(api_.model_upload(m_, layer, tensor, b.data(), w.rows, w.cols, err, sizeof err), err);
}

void Qwen3CudaModel::upload_norm(int layer, int tensor, const std::vector<float>& w) {
  char err[512] = {0};
  check(api_.model_upload(m_, layer, tensor, w.data(), int64_t(w.size()), 1, err, sizeof err), err);
}

std::unique_ptr<SessionState> Qwen3CudaModel::new_state() const {
  char err[512] = {0};
  StrataCudaCache* cache = nullptr;
  check(api_.cache_create(m_, &cache, err, sizeof err), err);
  auto st = std::make_unique<SessionState>();
  st->layers.push_back(std::make_unique<CudaKV>(api_, cache));
  return st;
}

StrataCudaCache* Qwen3CudaModel::cache_of(SessionState& st) const {
  StrataCudaCache* c = static_cast<CudaKV&>(*st.layers.at(0)).cache();
  if (api_.cache_length(c) != st.n_tokens)  // the cache's positions are the state's (truncate keeps them equal)
    throw std::logic_error("device='cuda': KV cache length " + std::to_string(api_.cache_length(c)) +
                           " != state position " + std::to_string(st.n_tokens));
  return c;
}

void Qwen3CudaModel::forward(const int32_t* tokens, int64_t n, SessionState& state, Logits mode, float* logits) {
  std::lock_guard<std::mutex> g(mu_);
  char err[512] = {0};
  const int lm = mode == Logits::None ? STRATA_CUDA_LOGITS_NONE
                 : mode == Logits::Last ? STRATA_CUDA_LOGITS_LAST : STRATA_CUDA_LOGITS_ALL;
  check(api_.forward(m_, cache_of(state), tokens, n, lm, logits, err, sizeof err), err);
  state.n_tokens += n;
}

void Qwen3CudaModel::forward_batch(const int32_t* tokens, int64_t B, SessionState* const* states,
                                   float* const* logits) {
  std::lock_guard<std::mutex> g(mu_);
  char err[512] = {0};
  std::vector<StrataCudaCache*> caches(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) caches[size_t(b)] = cache_of(*states[b]);
  for (int64_t b0 = 0; b0 < B; b0 += 64) {  // the backend takes up to 64 rows a step
    const int64_t nb = std::min<int64_t>(64, B - b0);
    check(api_.forward_batch(m_, caches.data() + b0, tokens + b0, nb, logits + b0, err, sizeof err), err);
  }
  for (int64_t b = 0; b < B; ++b) states[b]->n_tokens += 1;
}

}  // namespace

std::unique_ptr<Model> load_qwen3_cuda(std::unique_ptr<ModelFolder> ckpt, const LoadOptions& opts) {
  return std::make_unique<Qwen3CudaModel>(std::move(ckpt), opts);
}

}  // namespace strata
