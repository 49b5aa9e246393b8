// Bindings for the engine: Engine, Session, StreamJob and the option structs. Compute runs with the
// GIL released; ids cross as lists / numpy int arrays, logits as float32 numpy arrays.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "strata/model_folder.h"
#include "strata/engine.h"
#include "strata/kernels.h"
#include "strata/stream.h"
#include "checkpoint_policy_binding.h"
#include "../src/gdn.h"
#include "../src/profile.h"

namespace py = pybind11;
using namespace strata;

namespace {

std::vector<int32_t> to_ids(const std::vector<int64_t>& v, int64_t vocab, const char* field) {
  std::vector<int32_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] < 0 || v[i] >= vocab)
      throw std::invalid_argument(std::string(field) + "[" + std::to_string(i) + "] = " + std::to_string(v[i]) +
                                  " is out of range [0, " + std::to_string(vocab) + ")");
    out[i] = int32_t(v[i]);
  }
  return out;
}

// (id, logprob, [(alt_id, alt_logprob), ...]) -- the shape strata_lab.engine.TokenLogprob is built from
py::tuple logprob_tuple(const TokenLogprob& e) {
  py::list top;
  for (const auto& t : e.top) top.append(py::make_tuple(t.first, t.second));
  return py::make_tuple(e.id, e.logprob, top);
}

py::list logprob_list(const std::vector<TokenLogprob>& v) {
  py::list out;
  for (const auto& e : v) out.append(logprob_tuple(e));
  return out;
}

py::dict result_dict(const GenerateResult& r) {
  py::dict d;
  d["prompt_len"] = r.prompt_len;
  d["reused"] = r.reused;
  d["tokens_read"] = r.tokens_read;
  d["lcp"] = r.lcp;
  d["held_before"] = r.held_before;
  d["restored_checkpoint"] = r.restored_checkpoint < 0 ? py::object(py::none()) : py::object(py::int_(r.restored_checkpoint));
  d["used_saved_logits"] = r.used_saved_logits;
  d["gen_ids"] = r.gen_ids;
  d["drained_ids"] = r.drained_ids;
  d["finish"] = r.finish;
  d["prefill_ms"] = r.prefill_ms;
  d["decode_ms"] = r.decode_ms;
  d["checkpoints"] = r.checkpoints;
  d["logprobs"] = logprob_list(r.logprobs);
  return d;
}

}  // namespace

void register_options(py::module_& m) {
  py::class_<SamplingParams>(m, "SamplingParams")
      .def(py::init<>())
      .def_readwrite("temperature", &SamplingParams::temperature)
      .def_readwrite("top_k", &SamplingParams::top_k)
      .def_readwrite("top_p", &SamplingParams::top_p)
      .def_readwrite("min_p", &SamplingParams::min_p)
      .def_readwrite("seed", &SamplingParams::seed)
      .def_readwrite("logit_bias", &SamplingParams::logit_bias)
      .def_readwrite("repetition_penalty", &SamplingParams::repetition_penalty)
      .def_readwrite("penalty_last_n", &SamplingParams::penalty_last_n)
      .def_readwrite("frequency_penalty", &SamplingParams::frequency_penalty)
      .def_readwrite("presence_penalty", &SamplingParams::presence_penalty);
  strata_bindings::bind_checkpoint_policy(m);
  py::class_<GenerateOptions>(m, "GenerateOptions")
      .def(py::init<>())
      .def_readwrite("max_new_tokens", &GenerateOptions::max_new_tokens)
      .def_readwrite("sampling", &GenerateOptions::sampling)
      .def_readwrite("stop_ids", &GenerateOptions::stop_ids)
      .def_readwrite("has_force", &GenerateOptions::has_force)
      .def_readwrite("force_ids", &GenerateOptions::force_ids)
      .def_readwrite("stop_latency", &GenerateOptions::stop_latency)
      .def_readwrite("paced", &GenerateOptions::paced)
      .def_readwrite("logprobs", &GenerateOptions::logprobs)
      .def("set_token_mask", [](GenerateOptions& o, py::object fn) {
        if (fn.is_none()) { o.token_mask = nullptr; return; }
        // Called on the decode thread: fn(n_produced, last_id or -1, bits) with bits a writable uint32
        // numpy view of the mask (ceil(vocab / 32) words); returns True when it filled the mask.
        auto holder = std::make_shared<py::object>(fn);
        o.token_mask = [holder](const std::vector<int32_t>& produced, uint32_t* bits) -> bool {
          py::gil_scoped_acquire gil;
          py::ssize_t words = py::cast<py::ssize_t>(holder->attr("mask_words"));
          py::array_t<uint32_t> view({words}, {py::ssize_t(sizeof(uint32_t))}, bits, py::none());
          const int32_t last = produced.empty() ? -1 : produced.back();
          return py::cast<bool>((*holder)(py::int_(produced.size()), last, view));
        };
      }, py::arg("fn"), "fn(n_produced, last_id, bits) -> bool, with a mask_words attribute; None: no mask.");
}

namespace {

// A q8 cache given row by row (int8 values and f32 scales of K and V, [T, Hkv, hd] and [T, Hkv, hd / 32], as
// quantize_q8_rows gives them) in the cache's own layout (state.h), cap = ceil(T / kQ8Page) pages a kv head.
std::vector<int8_t> q8_rows_to_pages(const int8_t* k, const float* ks, const int8_t* v, const float* vs, int64_t T,
                                     int Hkv, int hd) {
  std::vector<int8_t> pages(size_t((T + kQ8Page - 1) / kQ8Page * Hkv * q8_run_bytes(hd)));
  kernels::q8_to_pages(k, ks, v, vs, T, Hkv, hd, pages.data());
  return pages;
}

// The refusals of the q8 bindings: queries [n, n_heads, hd] (hd a multiple of 32); rows of K and V as
// _quantize_q8 gives them, T positions of n_kv_heads kv heads.
void check_q8_query(const py::array& q, int n_heads, int n_kv_heads) {
  if (q.ndim() != 3 || q.shape(1) != n_heads || n_kv_heads <= 0 || n_heads % n_kv_heads != 0 ||
      q.shape(2) % kQ8Block != 0)
    throw std::invalid_argument("q must be [n, n_heads, hd] (hd a multiple of 32, n_heads of n_kv_heads)");
}
void check_q8_rows(const py::array& k, const py::array& ks, const py::array& v, const py::array& vs, int64_t T,
                   int64_t Hkv, int64_t hd) {
  for (const auto* a : {&k, &v})
    if (a->ndim() != 3 || a->shape(0) != T || a->shape(1) != Hkv || a->shape(2) != hd)
      throw std::invalid_argument("k and v must both be [T, n_kv_heads, hd] int8 (v k's shape)");
  for (const auto* a : {&ks, &vs})
    if (a->ndim() != 3 || a->shape(0) != T || a->shape(1) != Hkv || a->shape(2) != hd / kQ8Block)
      throw std::invalid_argument("ks and vs must both be [T, n_kv_heads, hd / 32] float32");
}

}  // namespace

void register_checkpoint(py::module_& m) {
  static py::exception<ModelFolderError> exc(m, "ModelFolderError", PyExc_ValueError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ModelFolderError& e) {
      py::set_error(exc, e.what());
    }
  });
  m.def("parse_safetensors_header", [](py::bytes header, uint64_t data_size) {
    std::string h = header;
    py::list out;
    for (const auto& t : SafetensorsFile::parse_header(h, data_size)) {
      py::dict d;
      d["name"] = t.name;
      d["dtype"] = t.dtype_str;
      d["shape"] = t.shape;
      d["begin"] = reinterpret_cast<uintptr_t>(t.data);
      d["nbytes"] = t.nbytes;
      out.append(d);
    }
    return out;
  }, py::arg("header"), py::arg("data_size"),
     "Parse and check a safetensors JSON header against a data area of data_size bytes (raises ModelFolderError).");
  m.def("read_bandwidth", [](int64_t bytes, int threads, int reps) {
    if (bytes <= 0) throw std::invalid_argument("bytes must be positive");
    py::gil_scoped_release release;
    ReleaseTeam team;
    use_threads(threads);
    return kernels::read_bandwidth(bytes, reps);
  }, py::arg("bytes"), py::arg("threads") = 0, py::arg("reps") = 3,
     "Best GB/s of `reps` read passes over a buffer of `bytes` with `threads` OpenMP threads (0: all cores); the buffer on huge pages as the weights are, one untimed pass first.");
  m.def("_set_kernel_option", [](const std::string& name, bool on) { kernels::set_option(name, on); },
        py::arg("name"), py::arg("on"), "Kernel switch (the table in engine/include/strata/kernels.h): 'int8_dot', 'attn_tiled', 'attn_decode', 'gdn_matrix', 'moe_parallel' (default on) or 'kv_f16' (default off); unknown names raise ValueError.");
  m.def("_kernel_option", [](const std::string& name) { return kernels::option(name); }, py::arg("name"),
        "Current value of a _set_kernel_option switch (the table in engine/include/strata/kernels.h).");
  m.def("_gdn_delta", [](py::array_t<float, py::array::c_style | py::array::forcecast> q,
                         py::array_t<float, py::array::c_style | py::array::forcecast> k,
                         py::array_t<float, py::array::c_style | py::array::forcecast> v,
                         py::array_t<float, py::array::c_style | py::array::forcecast> beta,
                         py::array_t<float, py::array::c_style | py::array::forcecast> g,
                         py::array_t<float, py::array::c_style | py::array::forcecast> state,
                         const std::string& mode, int64_t chunk) {
    if (q.ndim() != 2 || k.ndim() != 2 || v.ndim() != 2 || beta.ndim() != 1 || g.ndim() != 1 || state.ndim() != 2)
      throw std::invalid_argument("q, k [T, dk], v [T, dv], beta, g [T], state [dk, dv]");
    const int64_t T = q.shape(0), dk = q.shape(1), dv = v.shape(1);
    if (k.shape(0) != T || k.shape(1) != dk || v.shape(0) != T || beta.shape(0) != T || g.shape(0) != T ||
        state.shape(0) != dk || state.shape(1) != dv || T < 1)
      throw std::invalid_argument("q, k [T, dk], v [T, dv], beta, g [T], state [dk, dv] with T >= 1");
    if (chunk < 1) throw std::invalid_argument("chunk must be >= 1");
    if (mode != "matrix" && mode != "rows" && mode != "recurrent")
      throw std::invalid_argument("mode must be 'matrix', 'rows' or 'recurrent', got '" + mode + "'");
    py::array_t<float> o({T, dv});
    py::array_t<float> S({dk, dv});
    std::copy(state.data(), state.data() + dk * dv, S.mutable_data());
    const float *qp = q.data(), *kp = k.data(), *vp = v.data(), *bp = beta.data(), *gp = g.data();
    float *Sp = S.mutable_data(), *op = o.mutable_data();
    {
      py::gil_scoped_release release;
      if (mode == "recurrent") {
        next::delta_recurrent(T, dk, dv, qp, dk, kp, dk, vp, dv, bp, gp, 1, Sp, op, dv);
      } else {
        const bool was = kernels::option("gdn_matrix");
        kernels::set_option("gdn_matrix", mode == "matrix");
        next::delta_chunked(T, dk, dv, qp, dk, kp, dk, vp, dv, bp, gp, 1, Sp, op, dv, chunk);
        kernels::set_option("gdn_matrix", was);
      }
    }
    return py::make_tuple(o, S);
  }, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("beta"), py::arg("g"), py::arg("state"),
     py::arg("mode") = "matrix", py::arg("chunk") = 64,
     "The Gated DeltaNet delta rule alone, one head, fp32 (tests and benchmarks): returns (o [T, dv], final "
     "state [dk, dv]) from start state `state`; mode 'matrix' (chunked, matrix form), 'rows' (chunked, row "
     "form) or 'recurrent' (token by token).");
  m.def("_attention", [](py::array_t<float, py::array::c_style | py::array::forcecast> q, py::array k_in,
                         py::array v_in, int n_heads, int n_kv_heads, int threads, bool kv_f16, bool kv_q8) {
    // q [n, H, hd]; k, v [T, Hkv, hd] with T >= n: the last n cache rows are the queries' own positions.
    // float16 k and v are an f16 cache as it is (no rounding, nothing copied); anything else is cast to f32.
    const auto f16 = py::dtype("float16");
    const bool half = k_in.dtype().is(f16) || v_in.dtype().is(f16);
    if (half && !(k_in.dtype().is(f16) && v_in.dtype().is(f16)))
      throw std::invalid_argument("k and v must both be float16 or neither");
    if (half && (kv_f16 || kv_q8))
      throw std::invalid_argument("kv_f16/kv_q8=True round an f32 cache; k and v are float16 already");
    if (kv_f16 && kv_q8) throw std::invalid_argument("kv_f16 and kv_q8 are two caches: set at most one");
    using F32 = py::array_t<float, py::array::c_style | py::array::forcecast>;
    py::array k = half ? py::array(k_in) : py::array(F32::ensure(k_in)), v = half ? py::array(v_in) : py::array(F32::ensure(v_in));
    if (!k || !v) throw std::invalid_argument("k and v must be float arrays");
    if (half && (!(k.flags() & py::array::c_style) || !(v.flags() & py::array::c_style)))
      throw std::invalid_argument("float16 k and v must be C-contiguous");
    if (q.ndim() != 3 || k.ndim() != 3 || v.ndim() != 3) throw std::invalid_argument("q, k, v must be 3-d");
    const int64_t n = q.shape(0), T = k.shape(0), hd = q.shape(2);
    if (q.shape(1) != n_heads || k.shape(1) != n_kv_heads || n_kv_heads <= 0 || n_heads % n_kv_heads != 0)
      throw std::invalid_argument("q must be [n, n_heads, hd] and k [T, n_kv_heads, hd], n_heads a multiple of n_kv_heads");
    if (k.shape(2) != hd || v.shape(0) != T || v.shape(1) != n_kv_heads || v.shape(2) != hd || n < 1 || T < n)
      throw std::invalid_argument("k and v must both be [T, n_kv_heads, hd] with T >= n >= 1");
    py::array_t<float> out({n, int64_t(n_heads), hd});
    const float* qp = q.data();
    float* op = out.mutable_data();
    {
      py::gil_scoped_release release;
      use_threads(threads);
      if (half) {
        kernels::attention_f16(qp, n, n_heads, n_kv_heads, int(hd), static_cast<const uint16_t*>(k.data()),
                               static_cast<const uint16_t*>(v.data()), T - n, op);
      } else if (kv_f16) {  // the cache rounded to f16 as AttentionKV::commit() rounds it, then the f16 kernel
        const int64_t m = T * n_kv_heads * hd;
        std::vector<uint16_t> k16(static_cast<size_t>(m)), v16(static_cast<size_t>(m));
        kernels::f32_to_f16_rows(static_cast<const float*>(k.data()), k16.data(), m);
        kernels::f32_to_f16_rows(static_cast<const float*>(v.data()), v16.data(), m);
        kernels::attention_f16(qp, n, n_heads, n_kv_heads, int(hd), k16.data(), v16.data(), T - n, op);
      } else if (kv_q8) {  // the cache quantised as AttentionKV::commit() quantises it, then the q8 kernel
        const int64_t m = T * n_kv_heads * hd;
        if (hd % kQ8Block != 0) throw std::invalid_argument("kv_q8 needs hd a multiple of 32");
        std::vector<int8_t> k8(static_cast<size_t>(m)), v8(static_cast<size_t>(m));
        std::vector<float> ks(static_cast<size_t>(m / kQ8Block)), vs(static_cast<size_t>(m / kQ8Block));
        kernels::quantize_q8_rows(static_cast<const float*>(k.data()), k8.data(), ks.data(), m);
        kernels::quantize_q8_rows(static_cast<const float*>(v.data()), v8.data(), vs.data(), m);
        const auto pages = q8_rows_to_pages(k8.data(), ks.data(), v8.data(), vs.data(), T, n_kv_heads, int(hd));
        kernels::attention_q8(qp, n, n_heads, n_kv_heads, int(hd), pages.data(), (T + kQ8Page - 1) / kQ8Page, T - n, op);
      } else {
        kernels::attention(qp, n, n_heads, n_kv_heads, int(hd), static_cast<const float*>(k.data()),
                           static_cast<const float*>(v.data()), T - n, op);
      }
    }
    return out;
  }, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("n_heads"), py::arg("n_kv_heads"), py::arg("threads") = 0,
     py::arg("kv_f16") = false, py::arg("kv_q8") = false,
     "The engine's causal GQA attention kernel on its own (tests, A/B timings): queries at positions T-n..T-1. "
     "kv_f16: k and v rounded to an f16 cache first (the kv_f16 kernel option's cache); float16 k and v: an f16 "
     "cache as given. kv_q8: k and v quantised to a q8 cache first (kv_cache='q8': int8 blocks of 32 along hd, "
     "an f16 scale each, llama.cpp's q8_0), then its kernel.");
  m.def("_attention_q8", [](py::array_t<float, py::array::c_style | py::array::forcecast> q,
                            py::array_t<int8_t, py::array::c_style> k, py::array_t<float, py::array::c_style> ks,
                            py::array_t<int8_t, py::array::c_style> v, py::array_t<float, py::array::c_style> vs,
                            int n_heads, int n_kv_heads, int threads) {
    // A q8 cache as _quantize_q8 gives it, row by row: copied into the cache's pages (q8_to_pages), then the kernel.
    check_q8_query(q, n_heads, n_kv_heads);
    const int64_t n = q.shape(0), hd = q.shape(2), T = k.ndim() == 3 ? k.shape(0) : -1;
    check_q8_rows(k, ks, v, vs, T, n_kv_heads, hd);
    if (n < 1 || T < n) throw std::invalid_argument("the cache must hold T >= n >= 1 positions");
    py::array_t<float> out({n, int64_t(n_heads), hd});
    const float* qp = q.data();
    float* op = out.mutable_data();
    {
      py::gil_scoped_release release;
      const auto pages = q8_rows_to_pages(k.data(), ks.data(), v.data(), vs.data(), T, n_kv_heads, int(hd));
      use_threads(threads);
      kernels::attention_q8(qp, n, n_heads, n_kv_heads, int(hd), pages.data(), (T + kQ8Page - 1) / kQ8Page, T - n, op);
    }
    return out;
  }, py::arg("q"), py::arg("k"), py::arg("ks"), py::arg("v"), py::arg("vs"), py::arg("n_heads"),
     py::arg("n_kv_heads"), py::arg("threads") = 0,
     "The attention kernel over a q8 cache given row by row: k, v int8 [T, Hkv, hd] and ks, vs float32 [T, Hkv, "
     "hd / 32] (as _quantize_q8 returns them), copied into the cache's pages per call (the scales held in f16): "
     "queries at positions T-n..T-1.");
  m.def("_attention_q8_pages", [](py::array_t<float, py::array::c_style | py::array::forcecast> q,
                                  py::array_t<int8_t, py::array::c_style> pages, int n_heads, int n_kv_heads,
                                  int64_t length, int threads) {
    // The kernel over _q8_pages' array, read in place (nothing copied or quantised per call: timings).
    check_q8_query(q, n_heads, n_kv_heads);
    const int64_t n = q.shape(0), hd = q.shape(2);
    if (n < 1 || length < n) throw std::invalid_argument("the cache must hold length >= n >= 1 positions");
    const int64_t head = n_kv_heads * q8_run_bytes(int(hd));  // bytes of a page of every kv head
    if (pages.ndim() != 1 || pages.shape(0) % head != 0 || pages.shape(0) / head < (length + kQ8Page - 1) / kQ8Page)
      throw std::invalid_argument("pages must be _q8_pages' array of at least length positions (this hd, n_kv_heads)");
    const int64_t cap = pages.shape(0) / head;
    py::array_t<float> out({n, int64_t(n_heads), hd});
    const float* qp = q.data();
    float* op = out.mutable_data();
    {
      py::gil_scoped_release release;
      use_threads(threads);
      kernels::attention_q8(qp, n, n_heads, n_kv_heads, int(hd), pages.data(), cap, length - n, op);
    }
    return out;
  }, py::arg("q"), py::arg("pages"), py::arg("n_heads"), py::arg("n_kv_heads"), py::arg("length"),
     py::arg("threads") = 0,
     "The attention kernel over a q8 cache in its own layout (_q8_pages' array, read in place): queries at "
     "positions length-n..length-1.");
  m.def("_q8_pages", [](py::array_t<int8_t, py::array::c_style> k, py::array_t<float, py::array::c_style> ks,
                        py::array_t<int8_t, py::array::c_style> v, py::array_t<float, py::array::c_style> vs) {
    // rows (+ scales) -> the q8 cache's pages (one 1-d int8 array)
    if (k.ndim() != 3 || k.shape(2) % kQ8Block != 0)
      throw std::invalid_argument("k must be [T, n_kv_heads, hd] int8 (hd a multiple of 32)");
    const int64_t T = k.shape(0), Hkv = k.shape(1), hd = k.shape(2);
    check_q8_rows(k, ks, v, vs, T, Hkv, hd);
    py::array_t<int8_t> out((T + kQ8Page - 1) / kQ8Page * Hkv * q8_run_bytes(int(hd)));
    kernels::q8_to_pages(k.data(), ks.data(), v.data(), vs.data(), T, int(Hkv), int(hd), out.mutable_data());
    return out;
  }, py::arg("k"), py::arg("ks"), py::arg("v"), py::arg("vs"),
     "A q8 cache's rows (_quantize_q8's values and scales, [T, Hkv, hd], for K and for V) in the cache's own "
     "layout (state.h): one int8 array, kv head by kv head, each kv head's ceil(T / 64) pages of 64 positions one "
     "run [K: hd / 4, 64, 4 | V: 32, hd, 2 | K's scales: hd / 32, 64 (f16) | V's scales: 64, hd / 32 (f16)].");
  m.def("_quantize_q8", [](py::array_t<float, py::array::c_style | py::array::forcecast> x) {
    // x [..., n] with n % 32 == 0 -> (int8 values of x's shape, scales [..., n / 32] as float32: the f16 values a
    // q8 cache holds), as a q8 cache holds x.
    if (x.ndim() < 1 || x.shape(x.ndim() - 1) % kQ8Block != 0)
      throw std::invalid_argument("x's last axis must be a multiple of 32");
    std::vector<py::ssize_t> shape(x.shape(), x.shape() + x.ndim()), sshape = shape;
    sshape.back() /= kQ8Block;
    py::array_t<int8_t> q(shape);
    py::array_t<float> sc(sshape);
    kernels::quantize_q8_rows(x.data(), q.mutable_data(), sc.mutable_data(), x.size());
    return py::make_tuple(q, sc);
  }, py::arg("x"), "The q8 KV cache's quantisation (AttentionKV::commit()) of x alone: (values, scales).");
  m.def("_int8_matmul", [](py::array_t<int8_t, py::array::c_style | py::array::forcecast> w,
                           py::array_t<float, py::array::c_style | py::array::forcecast> scale,
                           py::array_t<float, py::array::c_style | py::array::forcecast> x, int threads) {
    // y [n, rows] = x [n, K] @ (scale[:, None] * w [rows, K])^T through kernels::matmul (int8 weights).
    if (w.ndim() != 2 || x.ndim() != 2 || scale.ndim() != 1 || scale.shape(0) != w.shape(0) || x.shape(1) != w.shape(1) ||
        x.shape(0) < 1 || w.shape(0) < 1 || w.shape(1) < 1)
      throw std::invalid_argument("w must be [rows, K] int8, scale [rows], x [n, K] with n, rows, K >= 1");
    Mat m;
    m.dtype = DType::I8;
    m.rows = w.shape(0);
    m.cols = w.shape(1);
    m.data = w.data();
    m.scale = scale.data();
    const int64_t n = x.shape(0);
    py::array_t<float> out({n, m.rows});
    const float* xp = x.data();
    float* op = out.mutable_data();
    {
      py::gil_scoped_release release;
      use_threads(threads);
      kernels::matmul(m, xp, n, op);
    }
    return out;
  }, py::arg("w"), py::arg("scale"), py::arg("x"), py::arg("threads") = 0,
     "The engine's int8-weight matmul on its own (tests, A/B timings): x @ (scale * w)^T, rows scaled by scale.");
  m.def("_bf16_matmul", [](std::vector<py::array_t<uint16_t, py::array::c_style | py::array::forcecast>> ws,
                           py::array_t<float, py::array::c_style | py::array::forcecast> x, int threads) {
    // ys[i] [n, rows_i] = x [n, K] @ ws[i]^T, bf16 weights given as their uint16 bits, all outputs in one
    // kernels::matmul_multi call (the prefill of q/k/v and gate/up).
    if (ws.empty() || ws.size() > 8 || x.ndim() != 2 || x.shape(0) < 1 || x.shape(1) < 1)
      throw std::invalid_argument("ws must be 1..8 [rows, K] uint16 (bf16 bits) arrays, x [n, K] with n, K >= 1");
    const int64_t n = x.shape(0), K = x.shape(1);
    std::vector<Mat> mats(ws.size());
    std::vector<py::array_t<float>> outs;
    std::vector<kernels::MatOut> mo(ws.size());
    for (size_t i = 0; i < ws.size(); ++i) {
      if (ws[i].ndim() != 2 || ws[i].shape(1) != K || ws[i].shape(0) < 1)
        throw std::invalid_argument("ws[" + std::to_string(i) + "] must be [rows, K] with K = x.shape[1], rows >= 1");
      mats[i].dtype = DType::BF16;
      mats[i].rows = ws[i].shape(0);
      mats[i].cols = K;
      mats[i].data = ws[i].data();
      outs.emplace_back(std::vector<py::ssize_t>{n, mats[i].rows});
      mo[i] = kernels::MatOut{&mats[i], outs.back().mutable_data()};
    }
    const float* xp = x.data();
    {
      py::gil_scoped_release release;
      use_threads(threads);
      kernels::matmul_multi(mo.data(), int(mo.size()), xp, n);
    }
    return outs;
  }, py::arg("ws"), py::arg("x"), py::arg("threads") = 0,
     "The engine's bf16-weight matmul on its own (tests, A/B timings): [x @ w.T for w in ws] in one matmul_multi "
     "call; ws hold bf16 bits as uint16.");
  m.def("_profile", [](bool reset) {
    // STRATA_PROFILE=1 per-op timers (set before the module loads): totals so far per phase, seconds per op.
    const prof::Totals t = prof::totals_snapshot(reset);
    py::dict out;
    out["enabled"] = prof::enabled();
    for (int d = 0; d < 2; ++d) {
      py::dict ops;
      for (int i = 0; i < prof::NumOps; ++i)
        if (t.sec[d][i] > 0.0) ops[prof::op_name(i)] = t.sec[d][i];
      py::dict ph;
      ph["calls"] = t.calls[d];
      ph["tokens"] = t.tokens[d];
      ph["seconds"] = ops;
      out[d ? "decode" : "prefill"] = ph;
    }
    return out;
  }, py::arg("reset") = true, "Per-op profile totals (STRATA_PROFILE=1) per phase; reset zeroes them.");
  m.def("kernel_level", [] { return std::string(kernels::level_name(kernels::level())); });
  m.def("set_kernel_level", [](const std::string& name) {
    kernels::Level l = name == "scalar" ? kernels::Level::Scalar : name == "avx2" ? kernels::Level::AVX2
                     : name == "avx512" ? kernels::Level::AVX512 : name == "avx512bf16" ? kernels::Level::AVX512BF16
                     : throw std::invalid_argument("kernel level must be 'scalar', 'avx2', 'avx512' or 'avx512bf16', got '" + name + "'");
    kernels::set_level(l);
    return std::string(kernels::level_name(kernels::level()));
  }, py::arg("name"), "Use at most this vector level (scalar|avx2|avx512|avx512bf16); returns the level in use.");
}

void register_engine(py::module_& m) {
  py::class_<Engine, std::shared_ptr<Engine>>(m, "Engine")
      .def(py::init([](const std::string& path, int threads, int64_t max_context, bool mmap, bool check_finite,
                       const std::string& weights, const std::string& kv_cache, const std::string& device) {
             LoadOptions o;
             o.threads = threads;
             o.max_context = max_context;
             o.use_mmap = mmap;
             o.check_finite = check_finite;
             if (weights == "int8") o.weights = WeightFormat::Int8;
             else if (weights != "stored") throw std::invalid_argument("weights must be 'stored' or 'int8', got '" + weights + "'");
             if (kv_cache == "f32") o.kv_cache = KVCache::F32;
             else if (kv_cache == "f16") o.kv_cache = KVCache::F16;
             else if (kv_cache == "q8") o.kv_cache = KVCache::Q8;
             else if (kv_cache != "auto")
               throw std::invalid_argument("kv_cache must be 'auto', 'f32', 'f16' or 'q8', got '" + kv_cache + "'");
             if (device == "cuda") o.device = Device::Cuda;
             else if (device != "cpu") throw std::invalid_argument("device must be 'cpu' or 'cuda', got '" + device + "'");
             py::gil_scoped_release release;
             ReleaseTeam team;
             return std::make_shared<Engine>(path, o);
           }),
           py::arg("path"), py::arg("threads") = 0, py::arg("max_context") = 0, py::arg("mmap") = true,
           py::arg("check_finite") = false, py::arg("weights") = "stored", py::arg("kv_cache") = "auto",
           py::arg("device") = "cpu")
      .def("info", [](const Engine& e) {
        const ModelInfo& i = e.info();
        py::dict d;
        d["model_type"] = i.model_type;
        d["vocab_size"] = i.vocab_size;
        d["hidden_size"] = i.hidden_size;
        d["num_layers"] = i.num_layers;
        d["max_context"] = i.max_context;
        d["weight_bytes"] = i.weight_bytes;
        d["weights"] = i.weights;
        d["kv_cache"] = i.kv_cache;
        d["stream_bytes"] = i.stream_bytes;
        d["weights_memory"] = i.weights_memory;
        d["device"] = i.device;
        return d;
      })
      .def("forward", [](Engine& e, const std::vector<int64_t>& ids) {
        std::vector<int32_t> v = to_ids(ids, e.info().vocab_size, "ids");
        std::vector<float> logits;
        {
          py::gil_scoped_release release;
          ReleaseTeam team;
          logits = e.forward(v);
        }
        const int64_t V = e.info().vocab_size, T = int64_t(v.size());
        py::array_t<float> out({T, V});
        std::memcpy(out.mutable_data(), logits.data(), logits.size() * sizeof(float));
        return out;
      }, py::arg("ids"))
      .def("prompt_logprobs", [](Engine& e, const std::vector<int64_t>& ids, int64_t top_n) {
        std::vector<int32_t> v = to_ids(ids, e.info().vocab_size, "ids");
        std::vector<TokenLogprob> out;
        {
          py::gil_scoped_release release;
          ReleaseTeam team;
          out = e.prompt_logprobs(v, top_n);
        }
        return logprob_list(out);
      }, py::arg("ids"), py::arg("top_n") = 0)
      .def("session", [](Engine& e, const std::string& name, std::optional<CheckpointPolicy> p) {
        return e.session(name, p ? &*p : nullptr);
      }, py::arg("name"), py::arg("policy") = py::none())
      .def("_decode_fresh", [](Engine& e, const std::vector<std::vector<int64_t>>& seqs, bool batched) {
        std::vector<std::vector<int32_t>> v;
        for (const auto& s : seqs) v.push_back(to_ids(s, e.info().vocab_size, "seqs"));
        std::vector<float> logits;
        {
          py::gil_scoped_release release;
          ReleaseTeam team;
          logits = e.decode_fresh(v, batched);
        }
        const int64_t V = e.info().vocab_size, B = int64_t(v.size());
        py::array_t<float> out({B, V});
        std::memcpy(out.mutable_data(), logits.data(), logits.size() * sizeof(float));
        return out;
      }, py::arg("seqs"), py::arg("batched"),
         "Test hook: each sequence's ids but the last read into a fresh state, then all last ids decoded in one "
         "batched forward (batched=True) or one forward each: logits [B, V].")
      .def("step_stats", [](const Engine& e) {
        const StepStats s = e.step_stats();
        py::dict d;
        d["steps"] = s.steps;
        d["tokens"] = s.tokens;
        d["max_batch"] = s.max_batch;
        d["last_batch"] = s.last_batch;
        d["prefill_chunks"] = s.prefill_chunks;
        d["decoding"] = s.decoding;
        d["waiting"] = s.waiting;
        return d;
      }, "The step thread's counts: batched decode steps run (steps), tokens they decoded, the largest and the "
         "latest batch, prefill chunks run; sessions in their decode loop and reads waiting now.")
      .def("session_names", &Engine::session_names)
      .def("drop_session", &Engine::drop_session, py::arg("name"));
}

void register_session(py::module_& m) {
  py::class_<Session, std::shared_ptr<Session>>(m, "Session")
      .def_property_readonly("name", &Session::name)
      .def("held_ids", &Session::held)
      .def("checkpoints", &Session::checkpoints)
      .def("last_logits", [](const Session& s) {
        std::vector<float> l = s.last_logits();
        py::array_t<float> out(py::ssize_t(l.size()));
        if (!l.empty()) std::memcpy(out.mutable_data(), l.data(), l.size() * sizeof(float));
        return out;
      })
      .def("memory_bytes", &Session::memory_bytes)
      .def("snapshot_bytes", &Session::snapshot_bytes)
      .def("policy", &Session::policy)
      .def("busy", &Session::busy)
      .def("reset", &Session::reset)
      .def("plan", [](const Session& s, const std::vector<int64_t>& prompt) {
        std::vector<int32_t> p(prompt.begin(), prompt.end());
        Session::ReusePlan pl = s.plan(p);
        py::dict d;
        d["lcp"] = pl.lcp;
        d["reused"] = pl.reused;
        d["restore"] = pl.restore < 0 ? py::object(py::none()) : py::object(py::int_(pl.restore));
        d["saved_logits"] = pl.saved_logits;
        return d;
      }, py::arg("prompt_ids"));
}

void register_stream(py::module_& m) {
  py::class_<StreamJob, std::shared_ptr<StreamJob>>(m, "StreamJob")
      .def(py::init([](std::shared_ptr<Session> s, const std::vector<int64_t>& prompt, GenerateOptions opts,
                       int64_t vocab) {
             std::vector<int32_t> p = to_ids(prompt, vocab, "prompt_ids");
             return std::make_shared<StreamJob>(std::move(s), std::move(p), std::move(opts));
           }),
           py::arg("session"), py::arg("prompt_ids"), py::arg("options"), py::arg("vocab_size"))
      .def("next", [](StreamJob& j) -> py::object {
        int32_t id;
        bool ok;
        {
          py::gil_scoped_release release;
          ok = j.next(&id);
        }
        if (!ok) return py::none();
        return py::int_(id);
      }, "Next generated id, blocking; None at the end.")
      .def("next_entry", [](StreamJob& j) -> py::object {
        TokenLogprob e;
        bool ok;
        {
          py::gil_scoped_release release;
          ok = j.next(&e);
        }
        if (!ok) return py::none();
        return logprob_tuple(e);
      }, "Next generated id with its logprob entry (id, logprob, top), blocking; None at the end.")
      .def("stop", &StreamJob::stop)
      .def("done", &StreamJob::done)
      .def("result", [](StreamJob& j) {
        GenerateResult r;
        {
          py::gil_scoped_release release;
          r = j.result();
        }
        return result_dict(r);
      });
}
