// `_Qwen3Render` of strata_lab._replay: the qwen3 chat template for the calls of a log, in C++.
//
// strata_lab/traces/fast_render.py's `FastRenderer` renders a call with it first: the messages are read as a
// log reader gives them (content null -> "", tool-call arguments parsed and written back as `tojson` writes
// them), checked as the template's input checks check them, and rendered. It takes the shapes agent logs hold:
// text or text-part content, reasoning, tool calls, tool results answering the last assistant message's calls,
// tool definitions (their text written by the Python renderer, once per definition list). Arguments and tool
// names it has not seen yet are parsed and written by the Python renderer (which notes arguments that are not
// JSON and remembers both for this one). For anything else it returns None and the Python renderer renders the
// call (and refuses what the template refuses): an assistant text holding "</think>" without
// reasoning_content, a message the checks would refuse.
//
// Per session (a str key; `kMaxSessions` kept, the least recently rendered evicted) it keeps a record of the
// last call: its messages list (so the message objects stay alive), its text, where each message's part starts
// and the widest character before it. A call's leading messages that are that call's (the same objects) are
// not read again, and those that render the same (the Python renderer's rule: the same system turn, not the
// tool result the next message closes, the same side of the last user query) are copied from that text. The
// record also holds the session's encoder state for strata_lab._replay.qwen3_turn.
//
// Exactness: tests/test_fast_render.py checks it against the Jinja template by hypothesis, as the Python one,
// session after session.
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
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
  bool noted = false;  // tool-call arguments that are not JSON (the call notes it)
  py::object owned;    // the text when it was joined from content parts (kept with the session)
};

// A part of a rendered text: s[a:b].
struct Part {
  PyObject* s;
  Py_ssize_t a, b;
};

// A session's last rendered call (for the next call of the session: what it shares is not read or written again).
struct Session {
  py::object messages;               // its messages list (keeps the message objects it points into alive)
  py::object text;                   // its prompt
  py::object head;                   // its system turn's text
  std::vector<Msg> msgs;
  std::vector<Py_ssize_t> offsets;   // where message i's part starts in text (offsets[n]: where the parts end)
  std::vector<Py_UCS4> maxpre;       // the widest character bound of text[:offsets[i]]
  std::vector<PyObject*> ids;        // the tool-call ids Msg::ids_begin / ids_end index
  Py_ssize_t last_query = -1;
  bool with_tools = false;           // its system turn holds tool definitions
  uint64_t tick = 0;                 // when it was last rendered
  std::shared_ptr<void> encoded;     // the session's encoder state (strata_lab._replay.qwen3_turn's), or null
};

// Sessions remembered (the least recently rendered goes first): a session's record keeps its messages alive, so
// it is kept for the sessions a log interleaves, not for every session of the log.
constexpr size_t kMaxSessions = 256;

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

// Python's "".join of the parts, into one new str of the narrowest kind (as str.join builds it); `maxchar`: the
// widest character bound of the parts (each part's own bound where it is a whole canonical str; a slice's taken
// from the session's record, see Session::maxpre).
PyObject* join(const std::vector<Part>& parts, Py_ssize_t total, Py_UCS4 maxchar) {
  PyObject* out = PyUnicode_New(total, maxchar);
  if (out == nullptr) throw py::error_already_set();
  const int kind = PyUnicode_KIND(out);
  char* data = static_cast<char*>(PyUnicode_DATA(out));
  Py_ssize_t at = 0;
  for (const Part& p : parts) {
    const Py_ssize_t n = p.b - p.a;
    if (n == 0) continue;
    const int pk = PyUnicode_KIND(p.s);
    if (pk == kind) {
      std::memcpy(data + at * kind, static_cast<const char*>(PyUnicode_DATA(p.s)) + p.a * kind,
                  static_cast<size_t>(n) * kind);
    } else if (PyUnicode_CopyCharacters(out, at, p.s, p.a, n) < 0) {
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
  // key: the call's session (a str) or None; the session's last call gives what this one shares with it.
  py::object render(py::handle messages, py::handle tools, py::handle enable_thinking, py::handle reply,
                    py::handle notes, py::handle key) {
    const Names& k = names();
    PyObject* ms = messages.ptr();
    if (!PyList_CheckExact(ms) || PyList_GET_SIZE(ms) == 0 || !PyList_CheckExact(notes.ptr())) return py::none();
    Refs refs;
    const Py_ssize_t n = PyList_GET_SIZE(ms);
    // the session's last call: its leading messages that are this call's (the same objects) are not read again
    Session* prev = nullptr;
    std::string skey;
    if (PyUnicode_CheckExact(key.ptr())) {
      Py_ssize_t len = 0;
      const char* u = PyUnicode_AsUTF8AndSize(key.ptr(), &len);
      if (u == nullptr) throw py::error_already_set();
      skey.assign(u, static_cast<size_t>(len));
      auto it = sessions_.find(skey);
      if (it != sessions_.end()) prev = &it->second;
    }
    Py_ssize_t same = 0;
    if (prev != nullptr) {
      const Py_ssize_t lim = std::min(n, static_cast<Py_ssize_t>(prev->msgs.size()));
      PyObject* pm = prev->messages.ptr();
      while (same < lim && PyList_GET_ITEM(ms, same) == PyList_GET_ITEM(pm, same)) ++same;
    }
    msgs_.clear();
    call_pieces_.clear();
    ids_.clear();
    msgs_.reserve(static_cast<size_t>(n) + 1);
    bool noted = false;
    if (same > 0) {
      msgs_.assign(prev->msgs.begin(), prev->msgs.begin() + same);
      ids_ = prev->ids;
      for (const Msg& m : msgs_) noted = noted || m.noted;
      if (noted) note(notes.ptr());
      // (the reply's ids, read after the messages, were not kept: the reused messages' ranges lie before them)
    }
    for (Py_ssize_t i = same; i < n; ++i) {
      Msg m;
      if (!read(PyList_GET_ITEM(ms, i), m, notes.ptr(), refs)) return py::none();
      msgs_.push_back(std::move(m));
    }
    // a tool result answers a call of the last assistant message before it (when that message names its calls);
    // the messages before `same` passed this check in the session's last call
    size_t ib = 0, ie = 0;
    for (Py_ssize_t i = 0; i < n; ++i) {
      const Msg& m = msgs_[static_cast<size_t>(i)];
      if (m.role == ASSISTANT) {
        ib = m.ids_begin;
        ie = m.ids_end;
      } else if (m.role == TOOL && ie > ib && i >= same) {
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
    const size_t ids_kept = ids_.size();  // (the reply's are not the session's)
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
    const bool with_tools = t != Py_None && PyList_GET_SIZE(t) > 0;
    if (with_tools) {
      head = refs.own(PyObject_CallFunctionObjArgs(tools_head_.ptr(), t, first_system ? first_system : Py_None,
                                                   nullptr));
      if (!is_str(head)) return py::none();
    } else if (same > 0 && !prev->with_tools) {
      head = prev->head.ptr();  // the same first message, no tool definitions: the same system turn
    } else if (first_system != nullptr) {
      PyObject* h = refs.own(PyUnicode_Concat(k.system_head, first_system));
      head = refs.own(PyUnicode_Concat(h, k.im_end_nl));
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
    // messages [0, r) render as in the session's last call: the same message, the same next message where that
    // decides (a tool result is closed before a message that is not one), the same side of the last user query,
    // the same system turn; their text is taken from that call's
    Py_ssize_t r = 0;
    bool head_same = false;
    if (same > 0) {
      const int eq = head == prev->head.ptr() ? 1 : PyObject_RichCompareBool(head, prev->head.ptr(), Py_EQ);
      if (eq < 0) throw py::error_already_set();
      head_same = eq == 1;
      if (head_same) {
        r = same;
        if (msgs_[static_cast<size_t>(r - 1)].role == TOOL) --r;
        if (last_query != prev->last_query) r = std::min(r, std::min(last_query, prev->last_query) + 1);
        r = std::max<Py_ssize_t>(r, 0);
      }
    }
    parts_.clear();
    offsets_.assign(static_cast<size_t>(n) + 1, 0);
    maxpre_.assign(static_cast<size_t>(n) + 1, 0);
    Py_ssize_t total = 0;
    Py_UCS4 maxchar = 0;
    auto push = [&](PyObject* s) {
      const Py_ssize_t len = PyUnicode_GET_LENGTH(s);
      if (len == 0) return;
      parts_.push_back({s, 0, len});
      total += len;
      maxchar = std::max(maxchar, PyUnicode_MAX_CHAR_VALUE(s));
    };
    bool reused = false;
    if (head_same) {
      reused = true;
      const Py_ssize_t end = prev->offsets[static_cast<size_t>(r)];
      if (end > 0) parts_.push_back({prev->text.ptr(), 0, end});
      total = end;
      maxchar = prev->maxpre[static_cast<size_t>(r)];
      for (Py_ssize_t i = 0; i <= r; ++i) {
        offsets_[static_cast<size_t>(i)] = prev->offsets[static_cast<size_t>(i)];
        maxpre_[static_cast<size_t>(i)] = prev->maxpre[static_cast<size_t>(i)];
      }
    }
    if (!reused) {
      r = 0;
      push(head);
    }
    for (Py_ssize_t i = r; i < n; ++i) {
      offsets_[static_cast<size_t>(i)] = total;
      maxpre_[static_cast<size_t>(i)] = maxchar;
      if (i < same) {  // taken from the last call, rendered again here: read again for its tool calls' text
        Msg m;
        if (!read(PyList_GET_ITEM(ms, i), m, notes.ptr(), refs)) return py::none();
        m.ids_begin = msgs_[static_cast<size_t>(i)].ids_begin;  // (the ids the checks above used)
        m.ids_end = msgs_[static_cast<size_t>(i)].ids_end;
        msgs_[static_cast<size_t>(i)] = std::move(m);
      }
      const Msg& m = msgs_[static_cast<size_t>(i)];
      if (m.role == USER || (m.role == SYSTEM && i > 0)) {
        push(m.role == USER ? k.user_turn : k.system_head);
        push(m.text);
        push(k.im_end_nl);
      } else if (m.role == ASSISTANT) {
        if (!assistant(m, i > last_query, refs, push)) return py::none();
      } else if (m.role == TOOL) {
        if (i == 0 || msgs_[static_cast<size_t>(i - 1)].role != TOOL) push(k.user_head);
        push(k.tr_open);
        push(m.text);
        push(k.tr_close);
        if (i + 1 < n && msgs_[static_cast<size_t>(i + 1)].role != TOOL) push(k.im_end_nl);
      }
    }
    offsets_[static_cast<size_t>(n)] = total;
    maxpre_[static_cast<size_t>(n)] = maxchar;
    if (msgs_.back().role == TOOL) push(k.im_end_nl);
    const size_t base = parts_.size();
    const Py_ssize_t base_total = total;
    const Py_UCS4 base_max = maxchar;
    push(enable_thinking.ptr() == Py_False ? k.gen_no_think : k.gen);
    if (total > max_chars_) return py::none();
    PyObject* prompt = refs.own(join(parts_, total, maxchar));
    PyObject* full = Py_None;
    if (with_reply) {
      parts_.resize(base);
      total = base_total;
      maxchar = base_max;
      if (!assistant(last, true, refs, push)) return py::none();
      if (total > max_chars_) return py::none();
      full = refs.own(join(parts_, total, maxchar));
    }
    if (PyUnicode_CheckExact(key.ptr())) {
      if (prev == nullptr && sessions_.size() >= kMaxSessions) {  // the least recently rendered goes
        auto oldest = sessions_.begin();
        for (auto it = sessions_.begin(); it != sessions_.end(); ++it)
          if (it->second.tick < oldest->second.tick) oldest = it;
        sessions_.erase(oldest);
      }
      Session& st = sessions_[skey];
      st.tick = ++tick_;
      st.messages = py::reinterpret_borrow<py::object>(messages);
      st.text = py::reinterpret_borrow<py::object>(prompt);
      st.head = py::reinterpret_borrow<py::object>(head);
      st.msgs = msgs_;
      for (Msg& m : st.msgs) m.calls_begin = m.calls_end = 0;  // (this call's pieces are not kept)
      st.offsets = offsets_;
      st.maxpre = maxpre_;
      st.ids.assign(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(std::min(ids_kept, ids_.size())));
      st.last_query = last_query;
      st.with_tools = with_tools;
    }
    return py::make_tuple(py::reinterpret_borrow<py::object>(prompt), py::reinterpret_borrow<py::object>(full));
  }

  size_t sessions() const { return sessions_.size(); }  // sessions remembered
  // The encoder state kept with a session (qwen3_turn's), or null.
  std::shared_ptr<void> encoded(py::handle key) {
    Session* s = find(key);
    return s != nullptr ? s->encoded : nullptr;
  }
  void set_encoded(py::handle key, std::shared_ptr<void> state) {
    Session* s = find(key);
    if (s != nullptr) s->encoded = std::move(state);
  }
  Session* find(py::handle key) {
    if (!PyUnicode_CheckExact(key.ptr())) return nullptr;
    Py_ssize_t len = 0;
    const char* u = PyUnicode_AsUTF8AndSize(key.ptr(), &len);
    if (u == nullptr) throw py::error_already_set();
    auto it = sessions_.find(std::string(u, static_cast<size_t>(len)));
    return it != sessions_.end() ? &it->second : nullptr;
  }

 private:
  // One message as the checks read it (FastRenderer._message); false: not taken here.
  bool read(PyObject* m, Msg& out, PyObject* notes, Refs& refs) {
    const Names& k = names();
    if (!PyDict_CheckExact(m)) return false;
    noted_ = false;
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
      if (texts.empty()) {
        out.text = k.empty;
      } else {
        std::vector<Part> ps;
        Py_UCS4 mx = 0;
        for (PyObject* x : texts) {
          ps.push_back({x, 0, PyUnicode_GET_LENGTH(x)});
          mx = std::max(mx, PyUnicode_MAX_CHAR_VALUE(x));
        }
        out.owned = py::reinterpret_steal<py::object>(join(ps, total, mx));  // (kept with the session)
        out.text = out.owned.ptr();
      }
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
    out.noted = noted_;
    return true;
  }

  void note(PyObject* notes) {  // the note of arguments that are not JSON, once
    const int has = PySequence_Contains(notes, not_json_.ptr());
    if (has < 0) throw py::error_already_set();
    if (!has && PyList_Append(notes, not_json_.ptr()) < 0) throw py::error_already_set();
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
        noted_ = true;
        note(notes);
      }
      return PyTuple_GET_ITEM(got, 0);
    }
    got = refs.own(PyObject_CallFunctionObjArgs(arguments_.ptr(), args, notes, nullptr));
    if (!PyTuple_CheckExact(got) || PyTuple_GET_SIZE(got) != 2 || !is_str(PyTuple_GET_ITEM(got, 0))) return nullptr;
    if (PyTuple_GET_ITEM(got, 1) != Py_True) noted_ = true;
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
  template <typename Push>
  bool assistant(const Msg& m, bool after_query, Refs& refs, Push&& push) {
    const Names& k = names();
    PyObject* reasoning = m.reasoning;
    if (reasoning == nullptr) {
      const Py_ssize_t at = PyUnicode_Find(m.text, k.think_tag, 0, PY_SSIZE_T_MAX, 1);
      if (at == -2) throw py::error_already_set();
      if (at >= 0) return false;  // reasoning written inside the content: the Python renderer splits it
      reasoning = k.empty;
    }
    if (after_query) {
      push(k.think_open);
      push(strip_nl(reasoning, false, refs));
      push(k.think_close);
      push(strip_nl(m.text, true, refs));
    } else {
      push(k.assistant_head);
      push(m.text);
    }
    if (m.has_calls) {
      if (PyUnicode_GET_LENGTH(m.text) > 0) push(k.nl);
      for (size_t j = m.calls_begin; j < m.calls_end; ++j) push(call_pieces_[j]);
    }
    push(k.im_end_nl);
    return true;
  }

  py::dict args_, heads_;
  py::object arguments_, call_head_, tools_head_;
  py::ssize_t max_chars_;
  py::str not_json_;
  std::vector<Msg> msgs_;
  std::vector<PyObject*> call_pieces_, ids_;
  std::vector<Part> parts_;
  std::vector<Py_ssize_t> offsets_;
  std::vector<Py_UCS4> maxpre_;
  std::unordered_map<std::string, Session> sessions_;
  bool noted_ = false;
  uint64_t tick_ = 0;
};

}  // namespace

py::object qwen3_render_call(py::handle renderer, py::handle messages, py::handle tools, py::handle enable_thinking,
                             py::handle reply, py::handle notes, py::handle key) {
  return renderer.cast<Qwen3Render&>().render(messages, tools, enable_thinking, reply, notes, key);
}

std::shared_ptr<void> qwen3_encoded(py::handle renderer, py::handle key) {
  return renderer.cast<Qwen3Render&>().encoded(key);
}

void qwen3_set_encoded(py::handle renderer, py::handle key, std::shared_ptr<void> state) {
  renderer.cast<Qwen3Render&>().set_encoded(key, std::move(state));
}

void bind_qwen3_render(py::module_& m) {
  py::class_<Qwen3Render>(m, "_Qwen3Render",
                          "The qwen3 chat template for a log's calls, in C++ (strata_lab.traces.fast_render).")
      .def(py::init<py::dict, py::dict, py::object, py::object, py::object, py::ssize_t, py::str>(),
           py::arg("args"), py::arg("heads"), py::arg("arguments"), py::arg("call_head"), py::arg("tools_head"),
           py::arg("max_chars"), py::arg("not_json"))
      .def("render", &Qwen3Render::render, py::arg("messages"), py::arg("tools"), py::arg("enable_thinking"),
           py::arg("reply"), py::arg("notes"), py::arg("key") = py::none(),
           "(prompt, full or None) as the qwen3 template renders the messages (and the reply as a history turn), "
           "or None: a shape this renderer leaves to the Python one. key: the call's session (a str): what its "
           "leading messages (the same objects as the session's last call's) render the same is taken from "
           "that call's text.")
      .def_property_readonly("sessions", [](const Qwen3Render& r) { return r.sessions(); });
}
