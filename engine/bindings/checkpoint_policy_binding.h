// The one binding of strata::CheckpointPolicy, generated from STRATA_CHECKPOINT_POLICY_FIELDS and used by
// both extensions (module-local: each extension has its own Python class for the one C++ struct, so
// neither needs the other loaded). `CheckpointPolicy._fields` names the fields in declaration order;
// strata_lab.CheckpointPolicy converts through it.
#pragma once
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "strata/checkpoint_policy.h"

namespace strata_bindings {

inline void bind_checkpoint_policy(pybind11::module_& m) {
  namespace py = pybind11;
  using strata::CheckpointPolicy;
  py::class_<CheckpointPolicy> cls(m, "CheckpointPolicy", py::module_local(),
                                   "Where a session saves state snapshots (strata/checkpoint_policy.h).");
  cls.def(py::init<>());
  py::list names;
#define STRATA_POLICY_BIND(type, name, init, doc)                    \
  cls.def_readwrite(#name, &CheckpointPolicy::name, doc); \
  names.append(#name);
  STRATA_CHECKPOINT_POLICY_FIELDS(STRATA_POLICY_BIND)
#undef STRATA_POLICY_BIND
  cls.attr("_fields") = py::tuple(names);
  cls.def("validate", &CheckpointPolicy::validate, "Raise ValueError naming a bad field.");
}

}  // namespace strata_bindings
