// The model interface every architecture implements (Qwen3 dense now, Qwen3-Next hybrid next), and
// load_model(), which reads config.json's model_type and builds the matching implementation.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "strata/model_folder.h"
#include "strata/state.h"

namespace strata {

struct ModelInfo {
  std::string model_type;
  int64_t vocab_size = 0;     // logits width (= embedding rows)
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  int64_t max_context = 0;    // tokens a session may hold
  int64_t weight_bytes = 0;   // bytes of weights as stored
  std::string weights = "stored";  // how matrices are computed with: "stored" dtype or "int8"
  std::string kv_cache = "f32";    // what new sessions' attention KV caches hold: "f32", "f16" or "q8"
  bool kv_cache_auto = true;       // kv_cache chosen from the weights (LoadOptions::kv_cache Auto)
  int64_t stream_bytes = 0;   // bytes of matrices one decode step reads (every layer's + lm_head)
  // where the matrices live: "mapped" (the file mapping), "hugepages" (copied out of it, copy_weights()),
  // "read" (use_mmap=false: a huge-page buffer read at load) or "int8" (quantised at load, huge pages)
  std::string weights_memory = "mapped";
  std::string device = "cpu";  // where the forward runs: "cpu" or "cuda" (docs/ENGINE.md "GPU")
};

enum class WeightFormat { Stored, Int8 };
// The attention KV cache: Auto is f16 for bf16/f16 weights (the embedding's stored dtype) and int8
// weights, f32 for f32 weights (parity with transformers f32); F32 / F16 / Q8 whatever the weights (Q8: int8
// values in blocks of 32 along head_dim with an f16 scale each, llama.cpp's q8_0: AttentionKV's KVFormat::Q8).
enum class KVCache { Auto, F32, F16, Q8 };
// Where the forward runs. Cuda: dense Qwen3 only, bf16 weights and KV cache on the first GPU, through the CUDA
// backend library loaded at the first such load (engine/src/qwen3_cuda.h); logits come back to the host.
enum class Device { Cpu, Cuda };

struct LoadOptions {
  int threads = 0;            // 0: all cores (OpenMP default)
  int64_t max_context = 0;    // 0: config max_position_embeddings
  bool use_mmap = true;       // false: read the weights into memory (immune to the file changing later)
  bool check_finite = false;  // refuse weights holding NaN or infinity (costs one pass over them)
  WeightFormat weights = WeightFormat::Stored;  // Int8: projection matrices and lm_head quantised at load
  KVCache kv_cache = KVCache::Auto;
  Device device = Device::Cpu;
};

// Matrices as a model computes with them: the model folder's view unchanged, or (LoadOptions::weights ==
// Int8) int8 rows with a per-row scale, quantised at load and owned here. Counts the bytes a decode step
// streams (ModelInfo::stream_bytes).
class WeightStore {
 public:
  explicit WeightStore(WeightFormat f = WeightFormat::Stored) : format_(f) {}
  // copy: float matrices are copied out of the file mapping into huge-page arenas (see copy_weights()).
  WeightStore(WeightFormat f, bool copy) : format_(f), copy_(copy) {}
  Mat prepare(const Mat& w);      // a per-token matrix (counted in streamed())
  Mat prepare_once(const Mat& w); // the same, not counted (e.g. experts of which only some run)
  // a matrix read row by row (the embedding): copied out of the mapping like the others when copying
  // (any format), so that "hugepages"/"int8" leave no tensor on the file mapping; else unchanged
  Mat copy_out(const Mat& w);
  int64_t streamed() const { return streamed_; }
  const char* name() const { return format_ == WeightFormat::Int8 ? "int8" : "stored"; }
  // ModelInfo::weights_memory: "int8", "hugepages" (copied), else "mapped" or "read" (use_mmap=false)
  const char* memory(bool use_mmap) const {
    return format_ == WeightFormat::Int8 ? "int8" : copy_ ? "hugepages" : use_mmap ? "mapped" : "read";
  }

 private:
  WeightFormat format_;
  bool copy_ = false;
  int64_t streamed_ = 0;
  struct FreeDeleter {
    void operator()(void* p) const;
  };
  struct Arena {  // int8 rows or copied float rows (huge-page backed where available)
    std::unique_ptr<int8_t[], FreeDeleter> mem;
    size_t used = 0, cap = 0;
  };
  int8_t* alloc_arena(size_t bytes);
  std::vector<Arena> arenas_;
  std::vector<std::unique_ptr<float[]>> scale_;
};

// Whether a model's float matrices are copied out of the file mapping into huge-page arenas: decode streams
// every row once per token, and the mapping's 4 KiB pages (a TLB miss and a hardware-prefetch stop per page)
// cost bf16 decode ~x1.1. Done when the weights are mapped (use_mmap), the mapped shards take at most half of
// the memory available at load (a model larger than that keeps streaming from the mapping) and
// STRATA_WEIGHTS_HUGEPAGES is not "0"; "1" copies whatever the size.
bool copy_weights(const ModelFolder& c, const LoadOptions& opts);

enum class Logits { None, Last, All };

// The step thread's counts (Model::step_stats): batched decode steps run, tokens they decoded, the
// largest and the latest batch, prefill chunks run; sessions in their decode loop now, reads waiting now.
struct StepStats {
  int64_t steps = 0, tokens = 0, max_batch = 0, last_batch = 0, prefill_chunks = 0;
  int64_t decoding = 0, waiting = 0;
};

class StepScheduler;

class Model {
 public:
  Model();
  virtual ~Model();
  virtual const ModelInfo& info() const = 0;
  // Fresh, empty per-session state (one LayerState per layer).
  virtual std::unique_ptr<SessionState> new_state() const = 0;
  // Reads tokens[0..n) at positions state.n_tokens .. state.n_tokens + n - 1, updating state in place
  // (state.n_tokens += n). Writes logits [n, V] (All), [1, V] for the last token (Last), or nothing.
  // Ids are checked by the caller (0 <= id < vocab_size); n >= 1.
  virtual void forward(const int32_t* tokens, int64_t n, SessionState& state, Logits mode, float* logits) = 0;
  // Batched decode: one token, tokens[b], for each of B distinct states, each at its own position
  // (states[b]->n_tokens += 1); logits[b] gets the V logits after it. Each sequence gets exactly the bits
  // forward(tokens + b, 1, *states[b], Logits::Last, logits[b]) gives it, whatever the batch (fixed
  // reduction order per row). The default runs those forwards one after another.
  virtual void forward_batch(const int32_t* tokens, int64_t B, SessionState* const* states, float* const* logits);
  int threads() const { return threads_; }
  void set_threads(int t) { threads_ = t; }

  // Sessions' reads: forward() on the model's step thread, where the one-token reads of sessions decoding
  // at the same time run as one forward_batch (continuous batching; step_scheduler.h).
  void forward_shared(const int32_t* tokens, int64_t n, SessionState& state, Logits mode, float* logits);
  void enter_decode();  // a session enters its decode loop: steps wait (briefly) for its reads
  void leave_decode();
  StepStats step_stats() const;

 protected:
  int threads_ = 0;

 private:
  std::unique_ptr<StepScheduler> steps_;
};

// What every decoder-only model shares: the embedding, the final norm and the lm_head (tied to the
// embedding or separate; a tied model folder that still carries lm_head.weight is tolerated, unused). Also
// fills info's model_type, vocab_size, hidden_size, num_layers and max_context (opts, else the config).
struct DecoderIO {
  Mat embed, lm_head;
  std::vector<float> final_norm;
};
DecoderIO load_decoder_io(ModelFolder& c, const std::string& model_type, int64_t V, int64_t D, int64_t L,
                          const LoadOptions& opts, ModelInfo& info);

// The format of a new session's attention caches: info.kv_cache ("q8", "f16", "f32"), or f16 for an Auto cache
// while the kernel option kv_f16 is on (the older process-wide switch, kept as an override).
KVFormat kv_cache_format(const ModelInfo& info);
// A q8 cache needs head_dim a multiple of kQ8Block: ModelFolderError naming kv_cache and head_dim otherwise.
void check_kv_cache(const ModelInfo& info, int64_t head_dim);

// Dispatches on config.json model_type; throws ModelFolderError for unknown types or bad files.
std::unique_ptr<Model> load_model(const std::string& dir, const LoadOptions& opts);

// Sets the OpenMP thread count of the calling thread (0 = default). Models call it at forward start.
void use_threads(int threads);

// Ends the calling thread's OpenMP team: its worker threads exit now instead of waiting, asleep, for the
// thread's next parallel region. libgomp keeps a thread's workers until that thread exits, and once it
// manages more threads than there are cores it stops spinning at barriers, whatever GOMP_SPINCOUNT says:
// one idle team left on Python's thread (by a load) made every decode step of a generate (run on its own
// thread) sleep and wake at each of its ~150 parallel regions (int8 decode x1.34 slower on 2 cores).
// The bindings call it after the parallel work they run on the caller's thread (ReleaseTeam, below): load,
// forward, prompt_logprobs, read_bandwidth, self_test. The kernel hooks (_attention, _int8_matmul,
// _gdn_delta) keep their team, so that a timing loop over them does not start threads on every call.
void release_threads();
struct ReleaseTeam {
  ReleaseTeam() = default;
  ReleaseTeam(const ReleaseTeam&) = delete;
  ReleaseTeam& operator=(const ReleaseTeam&) = delete;
  ~ReleaseTeam() { release_threads(); }
};

}  // namespace strata
