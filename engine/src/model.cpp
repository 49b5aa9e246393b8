#include "strata/model.h"

#ifdef STRATA_HAVE_OPENMP
#include <omp.h>
#endif
#include <thread>

#include "qwen3.h"
#include "qwen3_next.h"

namespace strata {

void use_threads(int threads) {
#ifdef STRATA_HAVE_OPENMP
  static const int default_threads = omp_get_num_procs();
  omp_set_num_threads(threads > 0 ? threads : default_threads);
#endif
}

std::unique_ptr<Model> load_model(const std::string& dir, const LoadOptions& opts) {
  if (opts.threads < 0) throw std::invalid_argument("threads must be >= 0, got " + std::to_string(opts.threads));
  if (opts.max_context < 0) throw std::invalid_argument("max_context must be >= 0, got " + std::to_string(opts.max_context));
  auto ckpt = std::make_unique<Checkpoint>(dir);
  const std::string type = ckpt->model_type();
  // One line per architecture.
  if (type == "qwen3") return std::make_unique<Qwen3Model>(std::move(ckpt), opts);
  if (type == "qwen3_next") return std::make_unique<Qwen3NextModel>(std::move(ckpt), opts);
  throw CheckpointError(dir + "/config.json: unknown model_type '" + type + "' (supported: qwen3, qwen3_next)");
}

}  // namespace strata
