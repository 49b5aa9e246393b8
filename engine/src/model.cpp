#include "strata/model.h"

#ifdef STRATA_HAVE_OPENMP
#include <omp.h>
#endif
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <thread>

#include "qwen3.h"
#include "qwen3_cuda.h"
#include "step_scheduler.h"
#include "strata/kernels.h"
#include "qwen3_next.h"

namespace strata {

Model::Model() : steps_(std::make_unique<StepScheduler>(*this)) {}
Model::~Model() = default;  // stops the step thread (none runs a forward of a dying model: sessions hold it)

void Model::forward_batch(const int32_t* tokens, int64_t B, SessionState* const* states, float* const* logits) {
  for (int64_t b = 0; b < B; ++b) forward(tokens + b, 1, *states[b], Logits::Last, logits[b]);
}

void Model::forward_shared(const int32_t* tokens, int64_t n, SessionState& state, Logits mode, float* logits) {
  steps_->run(tokens, n, state, mode, logits);
}
void Model::enter_decode() { steps_->enter_decode(); }
void Model::leave_decode() { steps_->leave_decode(); }
StepStats Model::step_stats() const { return steps_->stats(); }

void use_threads(int threads) {
#ifdef STRATA_HAVE_OPENMP
  static const int default_threads = omp_get_num_procs();
  omp_set_num_threads(threads > 0 ? threads : default_threads);
#endif
}

void release_threads() {
#ifdef STRATA_HAVE_OPENMP
  if (!omp_in_parallel()) omp_pause_resource_all(omp_pause_soft);  // libgomp: frees this thread's pool
#endif
}

void WeightStore::FreeDeleter::operator()(void* p) const { std::free(p); }

// int8 rows live in arenas of >= 64 MiB, 2 MiB-aligned and advised as transparent huge pages (THP
// "madvise" mode): decode streams them with software prefetch, which 4 KiB pages (a TLB miss and a
// prefetch stop per page) hold back (int8 decode x1.1-1.3 on the shared 2-core VM). A matrix goes into the
// first arena with room (64-byte aligned), else a new one; small matrices (MoE experts) share arenas.
int8_t* WeightStore::alloc_arena(size_t bytes) {
  constexpr size_t kHuge = size_t(2) << 20, kArena = size_t(64) << 20;
  bytes = (bytes + 63) / 64 * 64;
  for (Arena& a : arenas_)
    if (a.cap - a.used >= bytes) {
      int8_t* p = a.mem.get() + a.used;
      a.used += bytes;
      return p;
    }
  const size_t cap = std::max(kArena, (bytes + kHuge - 1) / kHuge * kHuge);
  void* mem = std::aligned_alloc(kHuge, cap);
  if (!mem) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
  const char* env = std::getenv("STRATA_INT8_HUGEPAGES");  // "0": plain pages (A/B, int8 and copied rows)
  if (!(env && std::string(env) == "0")) ::madvise(mem, cap, MADV_HUGEPAGE);  // advisory: ignored where THP is off
#endif
  arenas_.push_back(Arena{std::unique_ptr<int8_t[], FreeDeleter>(static_cast<int8_t*>(mem)), bytes, cap});
  return arenas_.back().mem.get();
}

bool copy_weights(const ModelFolder& c, const LoadOptions& opts) {
  const char* env = std::getenv("STRATA_WEIGHTS_HUGEPAGES");
  const std::string e = env ? env : "";
  if (e == "0" || !opts.use_mmap) return false;  // read into memory: already a huge-page buffer
  if (e == "1") return true;
  const long pages = ::sysconf(_SC_AVPHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return false;
  return double(c.mapped_bytes()) <= 0.5 * double(pages) * double(page);
}

Mat WeightStore::copy_out(const Mat& w) {
  if (!copy_ || w.dtype == DType::I8) return w;
  // a copy of the same bytes in a huge-page arena; the mapping's pages of it are dropped from this process
  // (a private read-only mapping: they are refetched from the page cache if anything reads them again)
  const size_t bytes = size_t(w.rows * w.cols) * dtype_size(w.dtype);
  int8_t* dst = alloc_arena(bytes);
  std::memcpy(dst, w.data, bytes);
  const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  const uintptr_t lo = (reinterpret_cast<uintptr_t>(w.data) + page - 1) / page * page,
                  hi = (reinterpret_cast<uintptr_t>(w.data) + bytes) / page * page;
  if (hi > lo) ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
  Mat m = w;
  m.data = dst;
  return m;
}

Mat WeightStore::prepare_once(const Mat& w) {
  if (format_ != WeightFormat::Int8 && copy_ && w.dtype != DType::I8) return copy_out(w);
  if (format_ != WeightFormat::Int8 || w.dtype == DType::I8) return w;
  int8_t* q = alloc_arena(size_t(w.rows * w.cols));
  auto s = std::make_unique<float[]>(size_t(w.rows));
  kernels::quantize_rows_int8(w, q, s.get());
  Mat m = w;
  m.dtype = DType::I8;
  m.data = q;
  m.scale = s.get();
  scale_.push_back(std::move(s));
  return m;
}

Mat WeightStore::prepare(const Mat& w) {
  Mat m = prepare_once(w);
  streamed_ += m.rows * m.cols * int64_t(dtype_size(m.dtype)) + (m.scale ? m.rows * 4 : 0);
  return m;
}

DecoderIO load_decoder_io(ModelFolder& c, const std::string& model_type, int64_t V, int64_t D, int64_t L,
                          const LoadOptions& opts, ModelInfo& info) {
  info.model_type = model_type;
  info.vocab_size = V;
  info.hidden_size = D;
  info.num_layers = L;
  const int64_t cfg_ctx = c.cfg_int("max_position_embeddings", 32768);
  info.max_context = opts.max_context > 0 ? opts.max_context : cfg_ctx;

  DecoderIO io;
  const bool tied = c.cfg_bool("tie_word_embeddings", false);
  io.embed = c.mat("model.embed_tokens.weight", {V, D});
  io.final_norm = c.to_f32("model.norm.weight", {D});
  io.lm_head = tied ? io.embed : c.mat("lm_head.weight", {V, D});
  if (tied && c.has("lm_head.weight")) c.mat("lm_head.weight", {V, D});  // tolerated duplicate; unused
  const bool half_weights = io.embed.dtype == DType::BF16 || io.embed.dtype == DType::F16 ||
                            opts.weights == WeightFormat::Int8;
  info.kv_cache_auto = opts.kv_cache == KVCache::Auto;
  info.kv_cache = opts.kv_cache == KVCache::Q8 ? "q8"
                  : opts.kv_cache == KVCache::F16 || (info.kv_cache_auto && half_weights) ? "f16" : "f32";
  return io;
}

KVFormat kv_cache_format(const ModelInfo& info) {
  if (info.kv_cache == "q8") return KVFormat::Q8;
  return info.kv_cache == "f16" || (info.kv_cache_auto && kernels::option("kv_f16")) ? KVFormat::F16 : KVFormat::F32;
}

void check_kv_cache(const ModelInfo& info, int64_t head_dim) {
  if (info.kv_cache == "q8" && head_dim % kQ8Block != 0)
    throw ModelFolderError("kv_cache 'q8' needs head_dim a multiple of " + std::to_string(kQ8Block) +
                           " (config.json head_dim " + std::to_string(head_dim) + ")");
}

std::unique_ptr<Model> load_model(const std::string& dir, const LoadOptions& opts) {
  if (opts.threads < 0) throw std::invalid_argument("threads must be >= 0, got " + std::to_string(opts.threads));
  if (opts.max_context < 0) throw std::invalid_argument("max_context must be >= 0, got " + std::to_string(opts.max_context));
  const bool cuda = opts.device == Device::Cuda;
  if (cuda && opts.weights == WeightFormat::Int8)
    throw std::invalid_argument("weights='int8' runs on the CPU only (device='cuda' computes with bf16 weights)");
  if (cuda && opts.kv_cache != KVCache::Auto)
    throw std::invalid_argument("kv_cache: device='cuda' keeps a bf16 KV cache; pass kv_cache='auto'");
  auto ckpt = std::make_unique<ModelFolder>(dir, opts.use_mmap);
  if (opts.check_finite) ckpt->check_finite();
  const std::string type = ckpt->model_type();
  if (cuda && type == "qwen3") return load_qwen3_cuda(std::move(ckpt), opts);
  if (cuda && type == "qwen3_next")
    throw std::invalid_argument("device='cuda': model_type 'qwen3_next' has Gated DeltaNet (hybrid) layers, and "
                                "hybrid layers run on the CPU only; load it with device='cpu'");
  // One line per architecture.
  if (type == "qwen3") return std::make_unique<Qwen3Model>(std::move(ckpt), opts);
  if (type == "qwen3_next") return std::make_unique<Qwen3NextModel>(std::move(ckpt), opts);
  throw ModelFolderError(dir + "/config.json: unknown model_type '" + type + "' (supported: qwen3, qwen3_next)");
}

}  // namespace strata
