// Bindings for the Qwen3-Next model and its checkpointing session (register_next only).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "../src/qwen3_next.h"

namespace py = pybind11;
using namespace strata::next;

namespace {
py::dict report_dict(const CallReport& r) {
  py::dict d;
  d["prompt_len"] = r.prompt_len; d["lcp"] = r.lcp; d["reused"] = r.reused; d["read"] = r.read;
  d["restored"] = r.restored < 0 ? py::object(py::none()) : py::object(py::int_(r.restored));
  d["logits_saved"] = r.logits_saved; d["gen_ids"] = r.gen_ids; d["evicted"] = r.evicted;
  d["prefill_ms"] = r.prefill_ms; d["decode_ms"] = r.decode_ms; d["snapshot_ms"] = r.snapshot_ms;
  d["snapshots_taken"] = r.snapshots_taken;
  return d;
}
}  // namespace

void register_next(py::module_& m) {
  py::class_<NextConfig>(m, "NextConfig")
      .def(py::init<>())
      .def_readwrite("vocab", &NextConfig::vocab).def_readwrite("D", &NextConfig::D)
      .def_readwrite("layers", &NextConfig::layers).def_readwrite("H", &NextConfig::H)
      .def_readwrite("Hkv", &NextConfig::Hkv).def_readwrite("hd", &NextConfig::hd)
      .def_readwrite("I", &NextConfig::I).def_readwrite("Hk", &NextConfig::Hk)
      .def_readwrite("Hv", &NextConfig::Hv).def_readwrite("dk", &NextConfig::dk)
      .def_readwrite("dv", &NextConfig::dv).def_readwrite("K", &NextConfig::K)
      .def_readwrite("rd", &NextConfig::rd).def_readwrite("theta", &NextConfig::theta)
      .def_readwrite("eps", &NextConfig::eps).def_readwrite("E", &NextConfig::E)
      .def_readwrite("top_k", &NextConfig::top_k).def_readwrite("moe_I", &NextConfig::moe_I)
      .def_readwrite("shared_I", &NextConfig::shared_I)
      .def_readwrite("norm_topk_prob", &NextConfig::norm_topk_prob).def_readwrite("tie", &NextConfig::tie)
      .def_readwrite("attn_layers", &NextConfig::attn_layers).def_readwrite("moe_layers", &NextConfig::moe_layers);

  py::class_<CheckpointPolicy>(m, "NextCheckpointPolicy")
      .def(py::init<>())
      .def_readwrite("at_prompt_end", &CheckpointPolicy::at_prompt_end)
      .def_readwrite("every", &CheckpointPolicy::every)
      .def_readwrite("positions", &CheckpointPolicy::positions)
      .def_readwrite("budget_mib", &CheckpointPolicy::budget_mib);

  py::class_<NextModel, std::shared_ptr<NextModel>>(m, "NextModel")
      .def(py::init([](NextConfig cfg, py::dict tensors) {
             std::unordered_map<std::string, std::vector<float>> t;
             std::unordered_map<std::string, std::vector<int64_t>> s;
             for (auto kv : tensors) {
               auto name = kv.first.cast<std::string>();
               auto a = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(kv.second);
               if (!a) throw std::invalid_argument("tensor " + name + " is not a float array");
               t[name].assign(a.data(), a.data() + a.size());
               s[name] = std::vector<int64_t>(a.shape(), a.shape() + a.ndim());
             }
             py::gil_scoped_release rel;
             return std::make_shared<NextModel>(std::move(cfg), std::move(t), std::move(s));
           }),
           py::arg("config"), py::arg("tensors"))
      .def("forward", [](const NextModel& self, std::vector<int> ids, std::string mode) {
             if (ids.empty()) throw std::invalid_argument("ids must not be empty");
             DeltaMode dm = mode == "chunked" ? DeltaMode::Chunked : mode == "recurrent" ? DeltaMode::Recurrent : DeltaMode::Auto;
             if (mode != "auto" && mode != "chunked" && mode != "recurrent")
               throw std::invalid_argument("mode must be 'auto', 'chunked' or 'recurrent'");
             const int V = self.config().vocab, T = (int)ids.size();
             py::array_t<float> out({T, V});
             float* p = out.mutable_data();
             {
               py::gil_scoped_release rel;
               NextState st = self.new_state();
               self.forward(st, ids.data(), T, p, true, dm);
             }
             return out;
           }, py::arg("ids"), py::arg("mode") = "auto",
           "Logits [T, V] of a fresh sequence. mode: GDN prefill as 'chunked', 'recurrent' or 'auto'.")
      .def("decode_steps", [](const NextModel& self, std::vector<int> ids) {
             // token-by-token from a fresh state: logits [T, V] (checks prefill == decode)
             const int V = self.config().vocab, T = (int)ids.size();
             py::array_t<float> out({T, V});
             float* p = out.mutable_data();
             py::gil_scoped_release rel;
             NextState st = self.new_state();
             for (int t = 0; t < T; ++t) self.forward(st, &ids[t], 1, p + (size_t)t * V, false);
             return out;
           }, py::arg("ids"))
      .def("mixer_seconds", [](const NextModel& self) {
             return py::make_tuple(self.gdn_seconds, self.attn_seconds);
           })
      .def("reset_timers", [](const NextModel& self) { self.gdn_seconds = self.attn_seconds = 0; });

  py::class_<NextSession>(m, "NextSession")
      .def(py::init([](std::shared_ptr<NextModel> model, CheckpointPolicy p) {
             return new NextSession(*model, std::move(p));
           }),
           py::arg("model"), py::arg("policy"), py::keep_alive<1, 2>())
      .def("generate", [](NextSession& s, std::vector<int> prompt, int max_new_tokens, std::vector<int> stop_ids,
                          std::vector<int> force_ids) {
             CallReport r;
             {
               py::gil_scoped_release rel;
               r = s.generate(prompt, max_new_tokens, stop_ids, force_ids);
             }
             return report_dict(r);
           }, py::arg("prompt_ids"), py::arg("max_new_tokens") = 0, py::arg("stop_ids") = std::vector<int>{},
           py::arg("force_ids") = std::vector<int>{})
      .def_property_readonly("held_ids", &NextSession::held)
      .def_property_readonly("checkpoints", &NextSession::checkpoints)
      .def_property_readonly("snapshot_bytes", &NextSession::snapshot_bytes)
      .def_property_readonly("state_bytes", &NextSession::state_bytes)
      .def_property_readonly("last_logits", [](const NextSession& s) {
             auto& l = s.last_logits();
             return py::array_t<float>((py::ssize_t)l.size(), l.data());
           })
      .def("reset", &NextSession::reset);
}
