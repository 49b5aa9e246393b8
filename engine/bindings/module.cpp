// The Python module strata_lab._engine (the inference engine, linked with OpenMP): bindings only; one
// register_* per area. The replay core is the separate strata_lab._replay (replay_bindings.cpp), without
// OpenMP; strata_lab/_native.py is the one importer of both.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "strata/build_info.h"
#include "strata/model.h"

namespace py = pybind11;

// engine_bindings.cpp
void register_options(py::module_& m);
void register_checkpoint(py::module_& m);
void register_engine(py::module_& m);
void register_session(py::module_& m);
void register_stream(py::module_& m);

static void register_build_info(py::module_& m) {
  m.def("build_info", [] {
    strata::BuildInfo b = strata::build_info();
    py::dict d;
    d["version"] = b.version;
    d["compiler"] = b.compiler;
    d["build_type"] = b.build_type;
    d["openmp"] = b.openmp;
    d["cuda"] = b.cuda;
    d["native"] = b.native;
    d["max_threads"] = b.max_threads;
    d["cpu_features"] = b.cpu_features;
    return d;
  }, "Compiler, flags and CPU features of this build.");
  m.def("self_test", [] {
    std::string err;
    {
      py::gil_scoped_release release;
      strata::ReleaseTeam team;
      err = strata::self_test();
    }
    if (!err.empty()) throw std::runtime_error("strata engine self-test failed: " + err);
    return true;
  }, "Run the kernel self-test; raises RuntimeError on failure.");
  m.attr("__version__") = strata::build_info().version;
}

PYBIND11_MODULE(_engine, m) {
  m.doc() = "strata_lab's C++ inference engine";
  register_build_info(m);
  register_checkpoint(m);
  register_options(m);
  register_engine(m);
  register_session(m);
  register_stream(m);
}
