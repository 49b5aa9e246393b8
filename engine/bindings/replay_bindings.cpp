// The Python module strata_lab._replay: the replay's per-call core (strata/replay_core.h), `_ReplayCore`,
// driven by strata_lab/replayer/native.py, with the enums it speaks by name (FullHit, Cause) and the
// CheckpointPolicy struct. Linked without OpenMP: a store replay loads no OpenMP runtime, so it cannot
// fix the engine's OpenMP settings before strata_lab._engine is loaded (strata_lab/_native.py imports
// both). Batches cross as numpy arrays (Arrow's flat buffers), checked here. Also `_ByteBpe`
// (strata/byte_bpe.h), the ASCII byte-level BPE encoder strata_lab/traces/fast_encode.py uses.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <cstdint>
#include <vector>
#include <string>

#include "strata/byte_bpe.h"
#include "strata/replay_core.h"
#include "checkpoint_policy_binding.h"

namespace py = pybind11;
using namespace strata;

namespace {

template <typename T>
using Arr = py::array_t<T, py::array::c_style>;

template <typename T>
const T* in_ptr(const py::tuple& t, size_t k, const char* name, py::ssize_t n) {
  py::handle h = t[k];  // borrowed from the tuple, which the caller keeps alive: no conversion, no copy
  if (!py::isinstance<Arr<T>>(h))
    throw py::value_error(std::string("replay batch field ") + name + ": expected a C-contiguous numpy array of " +
                          py::str(py::dtype::of<T>()).cast<std::string>());
  auto a = py::reinterpret_borrow<py::array>(h);
  if (a.ndim() != 1 || a.shape(0) < n)
    throw py::value_error(std::string("replay batch field ") + name + ": expected at least " + std::to_string(n) +
                          " values");
  return static_cast<const T*>(a.data());
}

template <typename T>
T* out_ptr(const py::tuple& t, size_t k, const char* name, py::ssize_t n) {
  py::handle h = t[k];
  if (!py::isinstance<Arr<T>>(h)) throw py::value_error(std::string("replay output ") + name + ": wrong dtype");
  auto a = py::reinterpret_borrow<py::array>(h);
  if ( !(a.flags() & py::array::c_style) || a.ndim() != 1 || a.shape(0) != n ||
      !a.writeable())
    throw py::value_error(std::string("replay output ") + name + ": expected a writable 1-d array of " +
                          std::to_string(n) + " values of the right dtype");
  return static_cast<T*>(a.mutable_data());
}

// ids as int32: a numpy int32 array passes without a copy; a list (or another dtype) is converted by numpy
py::array_t<int32_t, py::array::c_style | py::array::forcecast> ids_of(const py::handle& h) {
  auto a = py::array_t<int32_t, py::array::c_style | py::array::forcecast>::ensure(h);
  if (!a) throw py::type_error("expected a sequence of token ids");
  if (a.ndim() != 1) throw py::value_error("expected a 1-d sequence of token ids");
  return a;
}

// (row, lcp_text, byte_in_token, prompt ids read, retokenized, cause, id_before, id_held_after, id_prompt_after,
//  held_at, prompt_at, text windows (before, held_after, prompt_after) or None)
py::tuple miss_tuple(const ReplayMiss& m) {
  py::object text = m.has_text ? py::object(py::make_tuple(py::bytes(m.text_before), py::bytes(m.text_held_after),
                                                           py::bytes(m.text_prompt_after)))
                               : py::object(py::none());
  return py::make_tuple(m.row, m.lcp_text, m.byte_in_token, m.prompt_read, m.retokenized, cause_name(m.cause),
                        py::bytes(m.id_before), py::bytes(m.id_held_after), py::bytes(m.id_prompt_after),
                        py::tuple(py::cast(m.held_at)), py::tuple(py::cast(m.prompt_at)), text);
}

const char* kind_name(int32_t k) { return k == 0 ? "prompt" : k == 1 ? "gen" : "drained"; }


// The encoder fast_encode.py holds: the BPE (strata/byte_bpe.h), the added tokens it cuts the text at
// (leftmost, then longest: the tokenizer's scan), and one int object per id (a list of ids costs increfs).
struct BpeEncoder {
  ByteBpe bpe;
  std::vector<std::pair<std::string, int32_t>> tokens;  // longest first
  std::vector<int32_t> first[128];                      // first byte -> indices into tokens, longest first
  bool starts[256] = {};                                // a token starts with this byte
  unsigned char only = 0;                               // the one byte every token starts with, or 0
  std::vector<PyObject*> ints;
  std::vector<int32_t> buf;                   // the ids of one encode_into
  std::vector<int32_t> one;                   // the ids of one encode (other() may call it during encode_into)
  std::vector<size_t> cut_ends, cut_counts;   // its added tokens: ends, ids up to and including each
  std::string ascii;

  BpeEncoder(const std::string& json, int split) : bpe(json, split) {}
  ~BpeEncoder() {
    for (PyObject* o : ints) Py_XDECREF(o);
  }
  void add_token(const std::string& t, int32_t id) {
    if (!t.empty()) tokens.emplace_back(t, id);
  }
  void sort_tokens() {
    std::stable_sort(tokens.begin(), tokens.end(),
                     [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
    for (size_t k = 0; k < tokens.size(); ++k)
      first[static_cast<unsigned char>(tokens[k].first[0])].push_back(static_cast<int32_t>(k));
    int count = 0;
    for (int c = 0; c < 128; ++c) {
      starts[c] = !first[c].empty();
      if (starts[c]) {
        only = static_cast<unsigned char>(c);
        ++count;
      }
    }
    if (count != 1) only = 0;
  }
  // The first position >= i (< n) where an added token may start, or n.
  template <typename C>
  size_t next_start(const C* s, size_t i, size_t n) const {
    if constexpr (sizeof(C) == 1) {
      if (only != 0) {  // every added token starts with the same byte (Qwen's '<'): memchr
        const void* q = i < n ? std::memchr(s + i, only, n - i) : nullptr;
        return q == nullptr ? n : static_cast<size_t>(static_cast<const C*>(q) - s);
      }
    }
    while (i < n && (s[i] >= 128 || !starts[s[i]])) ++i;
    return i;
  }
  PyObject* integer(int32_t id) {  // a new reference
    if (id >= 0 && id < (1 << 22)) {
      if (static_cast<size_t>(id) >= ints.size())  // (grown geometrically: not once per larger id)
        ints.resize(std::min<size_t>(std::max<size_t>(static_cast<size_t>(id) + 1, ints.size() * 2), size_t(1) << 22),
                    nullptr);
      PyObject*& o = ints[static_cast<size_t>(id)];
      if (o == nullptr && (o = PyLong_FromLong(id)) == nullptr) throw py::error_already_set();
      Py_INCREF(o);
      return o;
    }
    PyObject* o = PyLong_FromLong(id);
    if (o == nullptr) throw py::error_already_set();
    return o;
  }
  py::object encode(py::handle text) {
    PyObject* t = text.ptr();
    if (!PyUnicode_Check(t)) throw py::type_error("_ByteBpe.encode: expected a str");
    if (!PyUnicode_IS_ASCII(t)) return py::none();
    one.clear();
    if (!bpe.encode(static_cast<const char*>(PyUnicode_DATA(t)), static_cast<size_t>(PyUnicode_GET_LENGTH(t)), one))
      return py::none();
    PyObject* list = PyList_New(static_cast<Py_ssize_t>(one.size()));
    if (list == nullptr) throw py::error_already_set();
    for (size_t i = 0; i < one.size(); ++i) PyList_SET_ITEM(list, static_cast<Py_ssize_t>(i), integer(one[i]));
    return py::reinterpret_steal<py::object>(list);
  }
  // An added token matching at i (the longest), or -1.
  template <typename C>
  int32_t match_at(const C* s, size_t i, size_t n) const {
    const uint32_t c = s[i];
    if (c >= 128) return -1;
    for (int32_t k : first[c]) {
      const std::string& t = tokens[static_cast<size_t>(k)].first;
      if (t.size() > n - i) continue;
      size_t q = 1;
      while (q < t.size() && static_cast<uint32_t>(s[i + q]) == static_cast<unsigned char>(t[q])) ++q;
      if (q == t.size()) return k;
    }
    return -1;
  }
  // Appends the ids of text[a:b) (no added token in it) to buf.
  template <typename C>
  void piece(PyObject* text, const C* s, size_t a, size_t b, py::handle other) {
    if (a >= b) return;
    bool ok = true;
    if constexpr (sizeof(C) == 1) {
      ok = bpe.encode(reinterpret_cast<const char*>(s + a), b - a, buf);  // (refuses bytes >= 0x80 itself)
    } else {
      ascii.resize(b - a);
      for (size_t i = a; i < b && ok; ++i) {
        const uint32_t c = s[i];
        ok = c < 128;
        ascii[i - a] = static_cast<char>(c);
      }
      ok = ok && bpe.encode(ascii.data(), ascii.size(), buf);
    }
    if (ok) return;
    py::object sub = py::reinterpret_steal<py::object>(
        PyUnicode_Substring(text, static_cast<Py_ssize_t>(a), static_cast<Py_ssize_t>(b)));
    if (!sub) throw py::error_already_set();
    py::object got = other(sub);
    if (!PyList_Check(got.ptr())) throw py::type_error("_ByteBpe.encode_into: other() must return a list");
    const Py_ssize_t k = PyList_GET_SIZE(got.ptr());
    for (Py_ssize_t q = 0; q < k; ++q) {
      long v = PyLong_AsLong(PyList_GET_ITEM(got.ptr(), q));
      if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
      buf.push_back(static_cast<int32_t>(v));
    }
  }
  template <typename C>
  void run(PyObject* text, const C* s, size_t pos, size_t n, py::handle other) {
    size_t start = pos;
    for (size_t i = pos; i < n;) {
      i = next_start(s, i, n);
      if (i >= n) break;
      const int32_t k = match_at(s, i, n);
      if (k < 0) {
        ++i;
        continue;
      }
      piece(text, s, start, i, other);
      buf.push_back(tokens[static_cast<size_t>(k)].second);
      i += tokens[static_cast<size_t>(k)].first.size();
      start = i;
      cut_ends.push_back(i);
      cut_counts.push_back(buf.size());
    }
    piece(text, s, start, n, other);
  }
  static void put(PyObject* list, PyObject* o) {
    if (o == nullptr) throw py::error_already_set();
    const int rc = PyList_Append(list, o);
    Py_DECREF(o);
    if (rc != 0) throw py::error_already_set();
  }

  void encode_into(py::handle text, Py_ssize_t pos, py::list ids, py::list ends, py::list counts, py::handle other) {
    PyObject* t = text.ptr();
    if (!PyUnicode_Check(t)) throw py::type_error("_ByteBpe.encode_into: expected a str");
    const size_t n = static_cast<size_t>(PyUnicode_GET_LENGTH(t));
    if (pos < 0 || static_cast<size_t>(pos) > n) throw py::value_error("_ByteBpe.encode_into: pos out of range");
    const void* d = PyUnicode_DATA(t);
    buf.clear();
    cut_ends.clear();
    cut_counts.clear();
    switch (PyUnicode_KIND(t)) {
      case PyUnicode_1BYTE_KIND: run(t, static_cast<const Py_UCS1*>(d), static_cast<size_t>(pos), n, other); break;
      case PyUnicode_2BYTE_KIND: run(t, static_cast<const Py_UCS2*>(d), static_cast<size_t>(pos), n, other); break;
      default: run(t, static_cast<const Py_UCS4*>(d), static_cast<size_t>(pos), n, other);
    }
    // one list of the new ids, joined to `ids` at once
    const Py_ssize_t base = PyList_GET_SIZE(ids.ptr());
    PyObject* add = PyList_New(static_cast<Py_ssize_t>(buf.size()));
    if (add == nullptr) throw py::error_already_set();
    for (size_t i = 0; i < buf.size(); ++i) PyList_SET_ITEM(add, static_cast<Py_ssize_t>(i), integer(buf[i]));
    const int rc = PyList_SetSlice(ids.ptr(), base, base, add);
    Py_DECREF(add);
    if (rc != 0) throw py::error_already_set();
    for (size_t k = 0; k < cut_ends.size(); ++k) {
      put(ends.ptr(), PyLong_FromSize_t(cut_ends[k]));
      put(counts.ptr(), PyLong_FromSsize_t(base + static_cast<Py_ssize_t>(cut_counts[k])));
    }
  }
};

// Where the elements of a JSON array that continue at `pos` end: (the end of its last element, how many
// elements from pos), or None when pos is not followed by one or more elements and the array's "]". For text
// that a JSON parser read already (strata_lab.traces.openai.SharedPrefixLines): strings, objects and arrays
// are skipped by their quotes and brackets, not checked.
py::object json_array_end(py::bytes data, Py_ssize_t pos) {
  char* p = nullptr;
  Py_ssize_t len = 0;
  if (PyBytes_AsStringAndSize(data.ptr(), &p, &len) != 0) throw py::error_already_set();
  if (pos < 0 || pos > len) throw py::value_error("json_array_end: pos out of range");
  const auto* s = reinterpret_cast<const unsigned char*>(p);
  const size_t n = static_cast<size_t>(len);
  size_t i = static_cast<size_t>(pos), count = 0;
  auto ws = [&]() {
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) ++i;
  };
  auto string_end = [&]() -> bool {  // i at the opening quote: i after the closing one
    ++i;
    while (i < n) {
      const void* q = std::memchr(s + i, '"', n - i);
      if (q == nullptr) return false;
      size_t k = static_cast<size_t>(static_cast<const unsigned char*>(q) - s);
      size_t b = k;
      while (b > i && s[b - 1] == '\\') --b;
      i = k + 1;
      if (((k - b) & 1) == 0) return true;  // an even run of backslashes: the quote closes the string
    }
    return false;
  };
  while (true) {
    ws();
    if (i >= n) return py::none();
    const unsigned char c = s[i];
    if (c == '"') {
      if (!string_end()) return py::none();
    } else if (c == '{' || c == '[') {
      size_t depth = 0;
      while (i < n) {
        const unsigned char d = s[i];
        if (d == '"') {
          if (!string_end()) return py::none();
          continue;
        }
        ++i;
        if (d == '{' || d == '[') {
          ++depth;
        } else if (d == '}' || d == ']') {
          if (--depth == 0) break;
        }
      }
      if (depth != 0) return py::none();
    } else if (c == ']' || c == ',' || c == '}' || c == ':') {
      return py::none();  // no element here
    } else {  // a number, true, false or null
      while (i < n && s[i] != ',' && s[i] != ']' && s[i] != '}' && s[i] != ' ' && s[i] != '\t' && s[i] != '\n' &&
             s[i] != '\r')
        ++i;
    }
    ++count;
    const size_t end = i;
    ws();
    if (i >= n) return py::none();
    if (s[i] == ']') return py::make_tuple(end, count);
    if (s[i] != ',') return py::none();
    ++i;
  }
}

}  // namespace

PYBIND11_MODULE(_replay, m) {
  m.doc() = "strata_lab's store replay core (no OpenMP; import it through strata_lab._native)";
  strata_bindings::bind_checkpoint_policy(m);
  py::enum_<FullHit> full_hit(m, "FullHit", "What the engine does when the whole prompt is held "
                                            "(strata/reuse_rule.h; strata_lab.replayer.state.FULL_HIT_RULES).");
#define STRATA_FULL_HIT(name) full_hit.value(#name, FullHit::name);
  STRATA_FULL_HIT_RULES(STRATA_FULL_HIT)
#undef STRATA_FULL_HIT
  py::enum_<ReplayCause> cause(m, "Cause", "Why a prompt left what its session held (the `cause` output codes; "
                                           "strata_lab.replayer.divergence.CAUSES names).");
#define STRATA_REPLAY_CAUSE(name) cause.value(#name, ReplayCause::name);
  STRATA_REPLAY_CAUSES(STRATA_REPLAY_CAUSE)
#undef STRATA_REPLAY_CAUSE
  m.def("realigned_tail", [](py::handle held, py::handle prompt) {
          const auto h = ids_of(held), p = ids_of(prompt);
          return realigned_tail(h.data(), int64_t(h.size()), p.data(), int64_t(p.size()));
        }, py::arg("held"), py::arg("prompt"),
        "How many ids of `held` `prompt` repeats in order (runs of at least 8 ids): the core's "
        "strata_lab.replayer.explain.realigned_tail(held, prompt, 0, 0).");
  m.def("json_array_end", &json_array_end, py::arg("data"), py::arg("pos"),
        "(end of the last element, elements) of the JSON array whose elements continue at data[pos:] up to its "
        "']', or None; for text a JSON parser read already (brackets and quotes followed, not checked).");
  py::class_<BpeEncoder>(m, "_ByteBpe",
                         "Byte-level BPE of ASCII text for the Qwen / Llama-3 / GPT-2 split regexes "
                         "(strata/byte_bpe.h), with the added-token scan (strata_lab.traces.fast_encode uses it).")
      .def(py::init([](py::bytes json, int split, py::dict added) {
             auto* e = new BpeEncoder(std::string(json), split);
             for (auto kv : added) {
               std::string k = py::cast<std::string>(kv.first);
               for (unsigned char c : k)
                 if (c >= 0x80) {
                   delete e;
                   throw py::value_error("_ByteBpe: an added token that is not ASCII");
                 }
               e->add_token(k, py::cast<int32_t>(kv.second));
             }
             e->sort_tokens();
             return e;
           }),
           py::arg("json"), py::arg("split"), py::arg("added"),
           "json: a tokenizer.json document or its BPE model's JSON; split: 0 Qwen2/3, 1 Llama-3, 2 GPT-2; "
           "added: the added tokens matched on the raw text (ASCII strings -> ids).")
      .def("encode", &BpeEncoder::encode, py::arg("text"),
           "The ids of `text` (a stretch holding no added token, normalized), or None when it holds a character "
           "other than printable ASCII, tab, newline and carriage return, or a pre-token over 512 bytes.")
      .def("encode_into", &BpeEncoder::encode_into, py::arg("text"), py::arg("pos"), py::arg("ids"),
           py::arg("ends"), py::arg("counts"), py::arg("other"),
           "Encodes text[pos:] as the tokenizer does from there (pos: where its scan for added tokens resumes): "
           "appends the ids to `ids`, and for each added token its end (a position in `text`) to `ends` and "
           "len(ids) after it to `counts`. A stretch between added tokens that `encode` does not take is "
           "encoded by other(stretch) (a list of ids).")
      .def_property_readonly("vocab_size", [](const BpeEncoder& e) { return e.bpe.vocab_size(); })
      .def_property_readonly("ascii_tokens", [](const BpeEncoder& e) { return e.bpe.ascii_tokens(); })
      .def_property_readonly("merges", [](const BpeEncoder& e) { return e.bpe.merges(); })
      .def_property_readonly("cached", [](const BpeEncoder& e) { return e.bpe.cached(); });

  py::class_<ReplayVocab, std::shared_ptr<ReplayVocab>>(m, "_ReplayVocab",
                                                        "A tokenizer's bytes per id, for the replay core's byte walk.")
      .def(py::init([](py::bytes blob, py::array_t<int64_t, py::array::c_style | py::array::forcecast> offsets,
                       int64_t im_start, int64_t assistant) {
             std::vector<int64_t> off(offsets.data(), offsets.data() + offsets.size());
             return std::make_shared<ReplayVocab>(std::string(blob), std::move(off), im_start, assistant);
           }),
           py::arg("blob"), py::arg("offsets"), py::arg("im_start"), py::arg("assistant"))
      .def_property_readonly("size", &ReplayVocab::size);

  py::class_<ReplayCore>(m, "_ReplayCore",
                         "The replay's session state model in C++ (strata_lab.replayer.native drives it).")
      .def(py::init([](bool hybrid, FullHit full_hit, const CheckpointPolicy& policy, int64_t capacity,
                       int64_t bytes_per_snapshot, bool recorded_checkpoints) {
             ReplayRules r;
             r.hybrid = hybrid;
             r.full_hit = full_hit;
             r.policy = policy;
             r.capacity = capacity;
             r.bytes_per_snapshot = bytes_per_snapshot;
             r.recorded_checkpoints = recorded_checkpoints;
             return new ReplayCore(std::move(r));
           }),
           py::arg("hybrid"), py::arg("full_hit"), py::arg("policy"), py::arg("capacity"),
           py::arg("bytes_per_snapshot"), py::arg("recorded_checkpoints"),
           "policy: where snapshots are taken (its budget_mib is applied as capacity, the most snapshots of "
           "bytes_per_snapshot kept; -1: none).")
      .def("run",
           [](ReplayCore& c, int64_t start, py::tuple ins, py::tuple outs) {
             if (ins.size() != 18) throw py::value_error("run: ins must hold 18 arrays");
             if (outs.size() != 16) throw py::value_error("run: outs must hold 16 arrays");
             ReplayBatch b;
             const py::ssize_t n = py::cast<py::array>(ins[0]).shape(0);
             b.n = n;
             if (start < 0 || start > n) throw py::value_error("run: start out of range");
             b.code = in_ptr<int64_t>(ins, 0, "code", n);
             b.slow = in_ptr<uint8_t>(ins, 1, "slow", n);
             b.last = in_ptr<uint8_t>(ins, 2, "last", n);
             b.part = in_ptr<int64_t>(ins, 3, "part", n);
             b.row = in_ptr<int64_t>(ins, 4, "row", n);
             b.parent = in_ptr<int64_t>(ins, 5, "parent", n);
             b.shared = in_ptr<int64_t>(ins, 6, "shared", n);
             b.prompt_len = in_ptr<int64_t>(ins, 7, "prompt_len", n);
             b.suffix_off = in_ptr<int32_t>(ins, 8, "suffix_off", n + 1);  // (a perm's lists: as many rows)
             b.suffix = in_ptr<int32_t>(ins, 9, "suffix", 0);
             b.gen_off = in_ptr<int32_t>(ins, 10, "gen_off", n + 1);
             b.gen = in_ptr<int32_t>(ins, 11, "gen", 0);
             b.drained_off = in_ptr<int32_t>(ins, 12, "drained_off", n + 1);
             b.drained = in_ptr<int32_t>(ins, 13, "drained", 0);
             b.ckpt_off = in_ptr<int32_t>(ins, 14, "ckpt_off", n + 1);
             b.ckpt = in_ptr<int32_t>(ins, 15, "ckpt", 0);
             b.prefill_ms = in_ptr<double>(ins, 16, "prefill_ms", n);
             const py::ssize_t np_ = py::cast<py::array>(ins[17]).shape(0);
             if (np_ != 0 && np_ != n) throw py::value_error("replay batch field perm: expected 0 or n values");
             b.perm = np_ ? in_ptr<int64_t>(ins, 17, "perm", n) : nullptr;
             py::ssize_t list_rows = n;  // rows of the list columns (the perm's range)
             // the offsets must index inside their values
             const struct { const int32_t* off; const char* name; size_t k; } lists[] = {
                 {b.suffix_off, "suffix", 9}, {b.gen_off, "gen", 11}, {b.drained_off, "drained", 13},
                 {b.ckpt_off, "ckpt", 15}};
             for (const auto& l : lists) {
               const py::ssize_t nv = py::cast<py::array>(ins[l.k]).shape(0);
               if (py::cast<py::array>(ins[l.k - 1]).shape(0) != list_rows + 1)
                 throw py::value_error(std::string("run: ") + l.name + " offsets must hold n + 1 values");
               for (py::ssize_t i = 0; i < list_rows; ++i)
                 if (l.off[i] < 0 || l.off[i + 1] < l.off[i] || l.off[i + 1] > nv)
                   throw py::value_error(std::string("run: ") + l.name + " offsets out of range at row " +
                                         std::to_string(i));
             }
             if (b.perm)
               for (py::ssize_t i = 0; i < n; ++i)
                 if (b.perm[i] < 0 || b.perm[i] >= list_rows)
                   throw py::value_error("run: perm out of range at row " + std::to_string(i));
             ReplayOut o;
             o.prompt_len = out_ptr<int64_t>(outs, 0, "prompt_len", n);
             o.held_before = out_ptr<int64_t>(outs, 1, "held_before", n);
             o.lcp = out_ptr<int64_t>(outs, 2, "lcp", n);
             o.reused = out_ptr<int64_t>(outs, 3, "reused", n);
             o.target = out_ptr<int64_t>(outs, 4, "target", n);
             o.reread = out_ptr<int64_t>(outs, 5, "reread", n);
             o.snapshots = out_ptr<int64_t>(outs, 6, "snapshots", n);
             o.index = out_ptr<int64_t>(outs, 7, "index", n);
             o.gen_len = out_ptr<int64_t>(outs, 8, "gen_len", n);
             o.drained_len = out_ptr<int64_t>(outs, 9, "drained_len", n);
             o.lcp_text = out_ptr<int64_t>(outs, 10, "lcp_text", n);
             o.restored = out_ptr<int64_t>(outs, 11, "restored", n);
             o.cause = out_ptr<int8_t>(outs, 12, "cause", n);
             o.divergence = out_ptr<int64_t>(outs, 13, "divergence", n);
             o.divergence_reread = out_ptr<int64_t>(outs, 14, "divergence_reread", n);
             o.engine_reread = out_ptr<int64_t>(outs, 15, "engine_reread", n);
             py::gil_scoped_release release;
             return c.run(b, start, o);
           },
           py::arg("start"), py::arg("ins"), py::arg("outs"),
           "Step rows [start, n) of a batch until one needs Python; return its index (n: done). outs: the 12 "
           "int64 columns, cause (int8), divergence (cause code or -1), divergence_reread, engine_reread.")
      .def("has", &ReplayCore::has, py::arg("code"))
      .def("open", &ReplayCore::open, py::arg("code"))
      .def("close", &ReplayCore::close, py::arg("code"))
      .def("held_len", [](const ReplayCore& c, int64_t code) { return int64_t(c.session(code).held.size()); },
           py::arg("code"))
      .def("held", [](const ReplayCore& c, int64_t code) {
             const auto& h = c.session(code).held;
             Arr<int32_t> a(py::ssize_t(h.size()));
             std::copy(h.begin(), h.end(), a.mutable_data());
             return a;
           }, py::arg("code"), "A copy of the session's held ids (int32).")
      .def("segments", [](const ReplayCore& c, int64_t code) {
             py::list out;
             for (const auto& s : c.session(code).segments)
               out.append(py::make_tuple(s.start, s.end, kind_name(s.kind), s.call));
             return out;
           }, py::arg("code"), "(start, end, kind, call) of the held ids' origins.")
      .def("checkpoints", [](const ReplayCore& c, int64_t code) {
             auto v = c.session(code).ckpts;
             std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
             std::vector<int64_t> out;
             for (const auto& p : v) out.push_back(p.first);
             return out;
           }, py::arg("code"), "Snapshot positions, least recently used first.")
      .def("calls", [](const ReplayCore& c, int64_t code) { return c.session(code).calls; }, py::arg("code"))
      .def("last", [](const ReplayCore& c, int64_t code) {
             const auto& s = c.session(code);
             return py::make_tuple(s.last_part, s.last_row, s.last_plen);
           }, py::arg("code"), "(partition, row, prompt_len) of the session's previous call.")
      .def("lcp_with", [](const ReplayCore& c, int64_t code, int64_t from, py::handle ids) {
             const auto v = ids_of(ids);
             return c.lcp_with(code, from, v.data(), int64_t(v.size()));
           }, py::arg("code"), py::arg("start"), py::arg("ids"),
           "Common prefix of `ids` with the held ids from `start` on.")
      .def("plan", [](const ReplayCore& c, int64_t code, int64_t prompt_len, int64_t lcp) {
             const ReplayPlan p = c.plan(code, prompt_len, lcp);
             return py::make_tuple(p.target, p.reused, p.restored < 0 ? py::object(py::none()) : py::int_(p.restored));
           }, py::arg("code"), py::arg("prompt_len"), py::arg("lcp"), "(target, reused, restored checkpoint or None).")
      .def("advance",
           [](ReplayCore& c, int64_t code, int64_t prompt_len, int64_t lcp, py::handle tail, py::handle gen,
              py::handle drained, py::handle ckpts, int64_t part, int64_t row) {
             const auto t = ids_of(tail), g = ids_of(gen), d = ids_of(drained);
             const auto k = ids_of(ckpts.is_none() ? py::handle(py::list()) : ckpts);
             const ReplayStep r = c.advance(code, prompt_len, lcp, t.data(), int64_t(t.size()), g.data(),
                                            int64_t(g.size()), d.data(), int64_t(d.size()), k.data(),
                                            int64_t(k.size()), part, row);
             return py::make_tuple(r.held_before, r.lcp, r.reused, r.target, r.snapshots, r.index,
                                   r.restored < 0 ? py::object(py::none()) : py::int_(r.restored));
           },
           py::arg("code"), py::arg("prompt_len"), py::arg("lcp"), py::arg("tail"), py::arg("gen"),
           py::arg("drained"), py::arg("checkpoints"), py::arg("part"), py::arg("row"),
           "Make one call (prompt = held[:lcp] + tail, then the reply joins held); return (held_before, lcp, "
           "reused, target, snapshots, index, restored snapshot or None).")
      .def("held_slice", [](const ReplayCore& c, int64_t code, int64_t start, int64_t stop) {
             const auto& h = c.session(code).held;
             const int64_t n = int64_t(h.size());
             start = std::clamp<int64_t>(start, 0, n);
             stop = std::clamp<int64_t>(stop, start, n);
             py::list out(size_t(stop - start));
             for (int64_t i = start; i < stop; ++i) out[size_t(i - start)] = py::int_(h[size_t(i)]);
             return out;
           }, py::arg("code"), py::arg("start"), py::arg("stop"), "held[start:stop] as a list (no negative indices).")
      .def("set_vocab", &ReplayCore::set_vocab, py::arg("vocab"), "Share a tokenizer's _ReplayVocab.")
      .def("explain", [](const ReplayCore& c, int64_t code, int64_t lcp, py::handle ptail, int64_t reused,
                         int64_t target) {
             const auto t = ids_of(ptail);
             ReplayMiss m;
             {
               py::gil_scoped_release release;
               m = c.explain(code, lcp, t.data(), int64_t(t.size()), reused, target);
             }
             return miss_tuple(m);
           }, py::arg("code"), py::arg("lcp"), py::arg("ptail"), py::arg("reused"), py::arg("target"),
           "The divergence of a prompt held[:lcp] + ptail that leaves held: (row (-1), lcp_text, byte_in_token, "
           "prompt ids read, retokenized, cause name, id context windows (3 bytes), held ids at, prompt ids at, "
           "text context windows or None).")
      .def("take_misses", [](ReplayCore& c) {
             py::list out;
             for (const auto& m : c.take_misses()) out.append(miss_tuple(m));
             return out;
           }, "The misses `run` explained since the last call, as `explain` gives them (row set).")
      .def_property_readonly("has_vocab", &ReplayCore::has_vocab)
      .def("add_recorded_ms", &ReplayCore::add_recorded_ms, py::arg("ms"))
      .def_property_readonly("recorded_ms", [](const ReplayCore& c) {
             return c.has_recorded_ms() ? py::object(py::float_(c.recorded_ms())) : py::object(py::none());
           })
      .def_property_readonly("peak_bytes", &ReplayCore::peak_bytes)
      .def_property_readonly("live_sessions", &ReplayCore::live_sessions);
}
