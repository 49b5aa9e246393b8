// GCC 12 warns about its own AVX-512 intrinsic headers (false positives on the masked forms).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "kernels_internal.h"

namespace strata {
namespace kernels {

// ---------------------------------------------------------------- dispatch
static Level detect() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
    return __builtin_cpu_supports("avx512bf16") ? Level::AVX512BF16 : Level::AVX512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
    return Level::AVX2;
#endif
  return Level::Scalar;
}

static Level initial_level() {
  Level best = detect();
  const char* env = std::getenv("STRATA_KERNEL");  // scalar | avx2 | avx512 | avx512bf16: cap for debugging
  if (env) {
    std::string s(env);
    Level want = s == "scalar" ? Level::Scalar : s == "avx2" ? Level::AVX2 : s == "avx512" ? Level::AVX512
                                                                                         : Level::AVX512BF16;
    if (int(want) < int(best)) return want;
  }
  return best;
}

static Level g_level = initial_level();

// The switches that stay (kernels.h documents each in one table); the defaults are the fast paths.
bool g_gdn_matrix = [] {
  const char* e = std::getenv("STRATA_GDN_SCALAR");
  return !(e && *e && std::string(e) != "0");
}();
bool g_attn_tiled = true;
bool g_int8_dot = true;
bool g_attn_decode = true;
bool g_kv_f16 = false;
bool g_moe_parallel = true;

namespace {
struct Switch {
  const char* name;
  bool* flag;
};
const Switch kTable[] = {{"int8_dot", &g_int8_dot},         {"attn_tiled", &g_attn_tiled},
                         {"attn_decode", &g_attn_decode},   {"gdn_matrix", &g_gdn_matrix},
                         {"moe_parallel", &g_moe_parallel}, {"kv_f16", &g_kv_f16}};
bool* find_switch(const std::string& name) {
  for (const Switch& s : kTable)
    if (name == s.name) return s.flag;
  std::string known;
  for (const Switch& s : kTable) known += std::string(known.empty() ? "" : ", ") + s.name;
  throw std::invalid_argument("unknown kernel option '" + name + "' (" + known + ")");
}
}  // namespace

void set_option(const std::string& name, bool on) { *find_switch(name) = on; }
bool option(const std::string& name) { return *find_switch(name); }

Level best_level() { return detect(); }
Level level() { return g_level; }
void set_level(Level l) { g_level = int(l) <= int(best_level()) ? l : best_level(); }

const char* level_name(Level l) {
  return l == Level::AVX512BF16 ? "avx512bf16" : l == Level::AVX512 ? "avx512" : l == Level::AVX2 ? "avx2" : "scalar";
}

}  // namespace kernels
}  // namespace strata
