// `_Qwen3Render` of strata_lab._replay: the qwen3 chat template for the calls of a log, in C++.
//
// strata_lab/traces/fast_render.py's `FastRenderer` renders a call with it first: the messages are read as a
// log reader gives them (content null -> "", tool-call arguments parsed and written back as `tojson` writes
// them), checked as the template's input checks check them, and rendered whole (no per-session state: a call
// costs its messages, read in C). It takes the shapes agent logs hold: text or text-part content, reasoning,
// tool calls with JSON or empty arguments, tool results answering the last assistant message's calls, tool
// definitions (their text written by the Python renderer, once per definition list). For anything else it
// returns None and the Python renderer renders the call (and refuses what the template refuses): an assistant
// text holding "</think>" without reasoning_content, arguments the Python renderer has not seen yet (it parses
// them, notes what is not JSON, and remembers them for this renderer), a message the checks would refuse.
// Exactness: tests/test_fast_render.py checks it against the Jinja template by hypothesis, as the Python one.
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace py = pybind11;

namespace {

PyObject* intern(const char* s) {
  PyObject* o = PyUnicode_InternFromString(s);
  if (o == nullptr) throw py::error_already_set();
  return o;  // immortal for the module's life (never released)
}

struct Names {
  PyObject *role, *content, *tool_calls, *tool_call_id, *reasoning_content, *name, *function, *arguments, *type, *id,
      *text;
  PyObject *im_end_nl, *nl, *empty, *system_head, *assistant_head, *think_open, *think_close, *tr_open,
      *tr_close, *user_head, *user_turn, *call_tail, *args_empty, *gen, *gen_no_think, *tool_response_open,
      *tool_response_close, *think_tag;
  Names() {
    role = intern("role");
    content = intern("content");
    tool_calls = intern("tool_calls");
    tool_call_id = intern("tool_call_id");
    reasoning_content = intern("reasoning_content");
    name = intern("name");
    function = intern("function");
    arguments = intern("arguments");
    type = intern("type");
    id = intern("id");
    text = intern("text");
    im_end_nl = intern("<|im_end|>\n");
    nl = intern("\n");
    empty = intern("");
    system_head = intern("<|im_start|>system\n");
    assistant_head = intern("<|im_start|>assistant\n");
    think_open = intern("<|im_start|>assistant\n<think>\n");
    think_close = intern("\n</think>\n\n");
    tr_open = intern("\n<tool_response>\n");
    tr_close = intern("\n</tool_response>");
    user_head = intern("<|im_start|>user");
    user_turn = intern("<|im_start|>user\n");
    think_tag = intern("</think>");
    call_tail = intern("}\n</tool_call>");
    args_empty = intern("{}");
    gen = intern("<|im_start|>assistant\n");
    gen_no_think = intern("<|im_start|>assistant\n<think>\n\n</think>\n\n");
    tool_response_open = intern("<tool_response>");
    tool_response_close = intern("</tool_response>");
  }
};

const Names& names() {
  static const Names* n = new Names();
  return *n;
}

enum Role { SYSTEM, USER, ASSISTANT, TOOL };

// Owned references, released together.
struct Refs {
  std::vector<PyObject*> held;
  ~Refs() {
    for (PyObject* o : held) Py_DECREF(o);
  }
  PyObject* own(PyObject* o) {  // a new reference, kept until the render returns
    if (o == nullptr) throw py::error_already_set();
    held.push_back(o);
    return o;
  }
  PyObject* keep(PyObject* o) {  // a borrowed reference, kept alive until the render returns
    Py_INCREF(o);
    held.push_back(o);
    return o;
  }
};

struct Msg {
  Role role = USER;
  PyObject* text = nullptr;       // the content's text (borrowed from the message or owned by Refs)
  PyObject* reasoning = nullptr;  // reasoning_content or nullptr
  PyObject* tcid = nullptr;       // a tool result's tool_call_id
  size_t calls_begin = 0, calls_end = 0;  // its rendered tool calls: pieces in Render::call_pieces
  size_t ids_begin = 0, ids_end = 0;      // its tool calls' ids in Render::ids
  bool has_calls = false;
};

bool is_str(PyObject* o) { return PyUnicode_CheckExact(o); }

int role_of(PyObject* r) {
  if (r == nullptr || !is_str(r)) return -1;
  if (PyUnicode_CompareWithASCIIString(r, "user") == 0) return USER;
  if (PyUnicode_CompareWithASCIIString(r, "assistant") == 0) return ASSISTANT;
  if (PyUnicode_CompareWithASCIIString(r, "tool") == 0) return TOOL;
  if (PyUnicode_CompareWithASCIIString(r, "system") == 0) return SYSTEM;
  return -1;
}

PyObject* get(PyObject* d, PyObject* key) {  // borrowed, or nullptr when absent
  PyObject* v = PyDict_GetItemWithError(d, key);
  if (v == nullptr && PyErr_Occurred()) throw py::error_already_set();
  return v;
}

// Python's "".join(parts) of str objects, into one new str of the narrowest kind (as str.join builds it).
PyObject* join(const std::vector<PyObject*>& parts, Py_ssize_t total) {
  Py_UCS4 maxchar = 0;
  for (PyObject* p : parts) maxchar = std::max(maxchar, PyUnicode_MAX_CHAR_VALUE(p));
  PyObject* out = PyUnicode_New(total, maxchar);
  if (out == nullptr) throw py::error_already_set();
  const int kind = PyUnicode_KIND(out);
  char* data = static_cast<char*>(PyUnicode_DATA(out));
  Py_ssize_t at = 0;
  for (PyObject* p : parts) {
    const Py_ssize_t n = PyUnicode_GET_LENGTH(p);
    if (n == 0) continue;
    if (PyUnicode_KIND(p) == kind) {
      std::memcpy(data + at * kind, PyUnicode_DATA(p), static_cast<size_t>(n) * kind);
    } else if (PyUnicode_CopyCharacters(out, at, p, 0, n) < 0) {
      Py_DECREF(out);
      throw py::error_already_set();
    }
    at += n;
  }
  return out;
}

class Qwen3Render {
 public:
  // args: the Python renderer's {argument string: (rendered, parsed as JSON?)}; heads: {tool name: the rendered
  // call up to its arguments}; arguments(args, notes) / call_head(name) / tools_head(tools, system): the Python
  // renderer's own (None: refused), called for what those dicts do not hold yet.
  Qwen3Render(py::dict args, py::dict heads, py::object arguments, py::object call_head, py::object tools_head,
              py::ssize_t max_chars, py::str not_json)
      : args_(std::move(args)), heads_(std::move(heads)), arguments_(std::move(arguments)),
        call_head_(std::move(call_head)), tools_head_(std::move(tools_head)), max_chars_(max_chars),
        not_json_(std::move(not_json)) {}

  // (prompt, full or None), or None: the Python renderer renders this call. enable_thinking: None, True, False.
  py::object render(py::handle messages, py::handle tools, py::handle enable_thinking, py::handle reply,
                    py::handle notes) {
    const Names& k = names();
    PyObject* ms = messages.ptr();
    if (!PyList_CheckExact(ms) || PyList_GET_SIZE(ms) == 0 || !PyList_CheckExact(notes.ptr())) return py::none();
    Refs refs;
    msgs_.clear();
    call_pieces_.clear();
    ids_.clear();
    const Py_ssize_t n = PyList_GET_SIZE(ms);
    msgs_.reserve(static_cast<size_t>(n) + 1);
    for (Py_ssize_t i = 0; i < n; ++i) {
      Msg m;
      if (!read(PyList_GET_ITEM(ms, i), m, notes.ptr(), refs)) return py::none();
      msgs_.push_back(m);
    }
    // a tool result answers a call of the last assistant message before it (when that message names its calls)
    size_t ib = 0, ie = 0;
    for (const Msg& m : msgs_) {
      if (m.role == ASSISTANT) {
        ib = m.ids_begin;
        ie = m.ids_end;
      } else if (m.role == TOOL && ie > ib) {
        bool found = false;
        for (size_t j = ib; j < ie && !found; ++j) {
          const int eq = PyObject_RichCompareBool(m.tcid, ids_[j], Py_EQ);
          if (eq < 0) throw py::error_already_set();
          found = eq == 1;
        }
        if (!found) return py::none();
      }
    }
    Msg last;
    const bool with_reply = !reply.is_none();
    if (with_reply) {
      PyObject* scratch = refs.own(PyList_New(0));  // the reply's notes are not the prompt's
      if (!read(reply.ptr(), last, scratch, refs) || last.role != ASSISTANT) return py::none();
    }
    // the system turn: the first system message and the tool definitions
    PyObject* first_system = msgs_[0].role == SYSTEM ? msgs_[0].text : nullptr;
    PyObject* head;
    PyObject* t = tools.ptr();
    if (t != Py_None && !PyList_CheckExact(t)) return py::none();
    if (t != Py_None && PyList_GET_SIZE(t) > 0) {
      PyObject* h = refs.own(PyObject_CallFunctionObjArgs(tools_head_.ptr(), t,
                                                          first_system ? first_system : Py_None, nullptr));
      if (!is_str(h)) return py::none();
      head = h;
    } else if (first_system != nullptr) {
      head = nullptr;  // written below: "<|im_start|>system\n" + text + "<|im_end|>\n"
    } else {
      head = k.empty;
    }
    // the last user query (not a tool response): assistant turns after it keep their think block
    Py_ssize_t last_query = -1;
    for (Py_ssize_t i = n - 1; i >= 0; --i) {
      const Msg& m = msgs_[static_cast<size_t>(i)];
      if (m.role == USER && !(PyUnicode_Tailmatch(m.text, k.tool_response_open, 0, PY_SSIZE_T_MAX, -1) == 1 &&
                              PyUnicode_Tailmatch(m.text, k.tool_response_close, 0, PY_SSIZE_T_MAX, 1) == 1)) {
        last_query = i;
        break;
      }
    }
    parts_.clear();
    if (head != nullptr) {
      parts_.push_back(head);
    } else {
      parts_.push_back(k.system_head);
      parts_.push_back(first_system);
      parts_.push_back(k.im_end_nl);
    }
    for (Py_ssize_t i = 0; i < n; ++i) {
      const Msg& m = msgs_[static_cast<size_t>(i)];
      if (m.role == USER || (m.role == SYSTEM && i > 0)) {
        parts_.push_back(m.role == USER ? k.user_turn : k.system_head);
        parts_.push_back(m.text);
        parts_.push_back(k.im_end_nl);
      } else if (m.role == ASSISTANT) {
        if (!assistant(m, i > last_query, refs)) return py::none();
      } else if (m.role == TOOL) {
        if (i == 0 || msgs_[static_cast<size_t>(i - 1)].role != TOOL) parts_.push_back(k.user_head);
        parts_.push_back(k.tr_open);
        parts_.push_back(m.text);
        parts_.push_back(k.tr_close);
        if (i + 1 < n && msgs_[static_cast<size_t>(i + 1)].role != TOOL) parts_.push_back(k.im_end_nl);
      }
    }
    if (msgs_.back().role == TOOL) parts_.push_back(k.im_end_nl);
    const size_t base = parts_.size();
    Py_ssize_t total = 0;
    for (PyObject* p : parts_) total += PyUnicode_GET_LENGTH(p);
    parts_.push_back(enable_thinking.ptr() == Py_False ? k.gen_no_think : k.gen);
    const Py_ssize_t prompt_len = total + PyUnicode_GET_LENGTH(parts_.back());
    if (prompt_len > max_chars_) return py::none();
    PyObject* prompt = refs.own(join(parts_, prompt_len));
    PyObject* full = Py_None;
    if (with_reply) {
      parts_.resize(base);
      if (!assistant(last, true, refs)) return py::none();
      Py_ssize_t full_len = total;
      for (size_t j = base; j < parts_.size(); ++j) full_len += PyUnicode_GET_LENGTH(parts_[j]);
      if (full_len > max_chars_) return py::none();
      full = refs.own(join(parts_, full_len));
    }
    return py::make_tuple(py::reinterpret_borrow<py::object>(prompt), py::reinterpret_borrow<py::object>(full));
  }

 private:
  // One message as the checks read it (FastRenderer._message); false: not taken here.
  bool read(PyObject* m, Msg& out, PyObject* notes, Refs& refs) {
    const Names& k = names();
    if (!PyDict_CheckExact(m)) return false;
    const Py_ssize_t size = PyDict_GET_SIZE(m);
    PyObject* role = get(m, k.role);
    PyObject* content = get(m, k.content);
    PyObject* calls = get(m, k.tool_calls);
    PyObject* tcid = get(m, k.tool_call_id);
    PyObject* reasoning = get(m, k.reasoning_content);
    PyObject* name = get(m, k.name);
    const Py_ssize_t known = (role != nullptr) + (content != nullptr) + (calls != nullptr) + (tcid != nullptr) +
                             (reasoning != nullptr) + (name != nullptr);
    if (known != size) return false;  // another key: the checks refuse it
    const int r = role_of(role);
    if (r < 0) return false;
    out.role = static_cast<Role>(r);
    if (content == nullptr || content == Py_None) {
      if (out.role != ASSISTANT && content == nullptr) return false;  // required
      out.text = k.empty;
    } else if (is_str(content)) {
      out.text = content;
    } else if (PyList_CheckExact(content)) {  // text parts, joined
      const Py_ssize_t np = PyList_GET_SIZE(content);
      std::vector<PyObject*> texts;
      Py_ssize_t total = 0;
      for (Py_ssize_t j = 0; j < np; ++j) {
        PyObject* p = PyList_GET_ITEM(content, j);
        if (!PyDict_CheckExact(p)) return false;
        PyObject* typ = get(p, k.type);
        PyObject* txt = get(p, k.text);
        if (typ == nullptr || !is_str(typ) || PyUnicode_CompareWithASCIIString(typ, "text") != 0 || txt == nullptr ||
            !is_str(txt))
          return false;
        texts.push_back(txt);
        total += PyUnicode_GET_LENGTH(txt);
      }
      out.text = texts.empty() ? k.empty : refs.own(join(texts, total));
    } else {
      return false;
    }
    if (name != nullptr && name != Py_None && !is_str(name)) return false;
    if (reasoning == Py_None) reasoning = nullptr;
    if (reasoning != nullptr && (out.role != ASSISTANT || !is_str(reasoning))) return false;
    out.reasoning = reasoning;
    if (tcid == Py_None) tcid = nullptr;
    if (out.role == TOOL) {
      if (tcid == nullptr || !is_str(tcid) || PyUnicode_GET_LENGTH(tcid) == 0) return false;
      out.tcid = tcid;
    } else if (tcid != nullptr) {
      return false;
    }
    out.ids_begin = out.ids_end = ids_.size();
    out.calls_begin = out.calls_end = call_pieces_.size();
    if (calls != nullptr && calls != Py_None) {
      if (out.role != ASSISTANT || !PyList_CheckExact(calls)) return false;
      const Py_ssize_t nc = PyList_GET_SIZE(calls);
      for (Py_ssize_t j = 0; j < nc; ++j) {
        PyObject* c = PyList_GET_ITEM(calls, j);
        if (!PyDict_CheckExact(c)) return false;
        PyObject* fn = get(c, k.function);
        if (fn == nullptr || !PyDict_CheckExact(fn)) return false;
        PyObject* typ = get(c, k.type);
        if (typ != nullptr && typ != Py_None &&
            !(is_str(typ) && PyUnicode_CompareWithASCIIString(typ, "function") == 0))
          return false;
        PyObject* cid = get(c, k.id);
        if (cid != nullptr && cid != Py_None) {
          if (!is_str(cid)) return false;
          ids_.push_back(cid);
        }
        PyObject* fname = get(fn, k.name);
        if (fname == nullptr || !is_str(fname) || PyUnicode_GET_LENGTH(fname) == 0) return false;
        PyObject* args = get(fn, k.arguments);
        PyObject* rendered = arguments(args, notes, refs);
        if (rendered == nullptr) return false;
        PyObject* head = get(heads_.ptr(), fname);
        if (head == nullptr) {
          head = refs.own(PyObject_CallFunctionObjArgs(call_head_.ptr(), fname, nullptr));
        } else {
          refs.keep(head);  // (a later call into Python may clear the dict)
        }
        if (!is_str(head)) return false;
        if (j > 0) call_pieces_.push_back(k.nl);
        call_pieces_.push_back(head);
        call_pieces_.push_back(rendered);
        call_pieces_.push_back(k.call_tail);
      }
      out.has_calls = nc > 0;
      out.ids_end = ids_.size();
      out.calls_end = call_pieces_.size();
    }
    return true;
  }

  // The rendered arguments of a tool call (a new or kept reference in refs), or nullptr: not taken here.
  PyObject* arguments(PyObject* args, PyObject* notes, Refs& refs) {
    const Names& k = names();
    if (args == nullptr) return k.args_empty;
    const int falsy = PyObject_Not(args);
    if (falsy < 0) throw py::error_already_set();
    if (falsy) return k.args_empty;
    PyObject* got = is_str(args) ? get(args_.ptr(), args) : nullptr;
    if (got != nullptr) {
      refs.keep(got);
      if (!PyTuple_CheckExact(got) || PyTuple_GET_SIZE(got) != 2 || !is_str(PyTuple_GET_ITEM(got, 0))) return nullptr;
      if (PyTuple_GET_ITEM(got, 1) != Py_True) {  // not JSON: rendered as the string, noted once
        const int has = PySequence_Contains(notes, not_json_.ptr());
        if (has < 0) throw py::error_already_set();
        if (!has && PyList_Append(notes, not_json_.ptr()) < 0) throw py::error_already_set();
      }
      return PyTuple_GET_ITEM(got, 0);
    }
    got = refs.own(PyObject_CallFunctionObjArgs(arguments_.ptr(), args, notes, nullptr));
    if (!PyTuple_CheckExact(got) || PyTuple_GET_SIZE(got) != 2 || !is_str(PyTuple_GET_ITEM(got, 0))) return nullptr;
    return PyTuple_GET_ITEM(got, 0);
  }

  static PyObject* strip_nl(PyObject* s, bool left_only, Refs& refs) {
    const Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    const int kind = PyUnicode_KIND(s);
    const void* d = PyUnicode_DATA(s);
    Py_ssize_t a = 0, b = n;
    while (a < b && PyUnicode_READ(kind, d, a) == '\n') ++a;
    while (!left_only && b > a && PyUnicode_READ(kind, d, b - 1) == '\n') --b;
    if (a == 0 && b == n) return s;
    return refs.own(PyUnicode_Substring(s, a, b));
  }

  // An assistant turn (FastRenderer._assistant) appended to parts_; false: not taken here.
  bool assistant(const Msg& m, bool after_query, Refs& refs) {
    const Names& k = names();
    PyObject* reasoning = m.reasoning;
    if (reasoning == nullptr) {
      const Py_ssize_t at = PyUnicode_Find(m.text, k.think_tag, 0, PY_SSIZE_T_MAX, 1);
      if (at == -2) throw py::error_already_set();
      if (at >= 0) return false;  // reasoning written inside the content: the Python renderer splits it
      reasoning = k.empty;
    }
    if (after_query) {
      parts_.push_back(k.think_open);
      parts_.push_back(strip_nl(reasoning, false, refs));
      parts_.push_back(k.think_close);
      parts_.push_back(strip_nl(m.text, true, refs));
    } else {
      parts_.push_back(k.assistant_head);
      parts_.push_back(m.text);
    }
    if (m.has_calls) {
      if (PyUnicode_GET_LENGTH(m.text) > 0) parts_.push_back(k.nl);
      for (size_t j = m.calls_begin; j < m.calls_end; ++j) parts_.push_back(call_pieces_[j]);
    }
    parts_.push_back(k.im_end_nl);
    return true;
  }

  py::dict args_, heads_;
  py::object arguments_, call_head_, tools_head_;
  py::ssize_t max_chars_;
  py::str not_json_;
  std::vector<Msg> msgs_;
  std::vector<PyObject*> call_pieces_, ids_, parts_;
};

}  // namespace

py::object qwen3_render_call(py::handle renderer, py::handle messages, py::handle tools, py::handle enable_thinking,
                             py::handle reply, py::handle notes) {
  return renderer.cast<Qwen3Render&>().render(messages, tools, enable_thinking, reply, notes);
}

void bind_qwen3_render(py::module_& m) {
  py::class_<Qwen3Render>(m, "_Qwen3Render",
                          "The qwen3 chat template for a log's calls, in C++ (strata_lab.traces.fast_render).")
      .def(py::init<py::dict, py::dict, py::object, py::object, py::object, py::ssize_t, py::str>(),
           py::arg("args"), py::arg("heads"), py::arg("arguments"), py::arg("call_head"), py::arg("tools_head"),
           py::arg("max_chars"), py::arg("not_json"))
      .def("render", &Qwen3Render::render, py::arg("messages"), py::arg("tools"), py::arg("enable_thinking"),
           py::arg("reply"), py::arg("notes"),
           "(prompt, full or None) as the qwen3 template renders the messages (and the reply as a history turn), "
           "or None: a shape this renderer leaves to the Python one.");
}
