// `chain_messages` of strata_lab._replay: the message-level session chaining of logs without a session key
// (strata_lab/traces/log_calls.py, `SessionChain.session_of_messages`), in C. The same steps on the same
// Python objects: each message's key is hash((role, text, tool calls)) and a prefix's digest hash((previous
// digest, key)), computed by PyObject_Hash on the same tuples the Python code hashes (so the digests are the
// same ints), kept in the chain's own dict. A message whose key the common shapes do not cover (content parts,
// tool calls that are not dicts with a function dict, ...) is keyed by the Python function itself.
// Also `convert_messages`: the OpenAI reader's conversion of wire messages (strata_lab/traces/openai.py
// `_convert`) for the common shapes, the rest by the Python function.
#include <pybind11/pybind11.h>

namespace py = pybind11;

namespace {

PyObject* interned(const char* s) {
  PyObject* o = PyUnicode_InternFromString(s);
  if (o == nullptr) throw py::error_already_set();
  return o;
}

struct Keys {
  PyObject *role, *content, *tool_calls, *function, *name, *arguments, *empty, *system, *developer;
  Keys()
      : role(interned("role")), content(interned("content")), tool_calls(interned("tool_calls")),
        function(interned("function")), name(interned("name")), arguments(interned("arguments")),
        empty(interned("")), system(interned("system")), developer(interned("developer")) {}
};

const Keys& keys() {
  static const Keys* k = new Keys();
  return *k;
}

PyObject* get(PyObject* d, PyObject* key) {
  PyObject* v = PyDict_GetItemWithError(d, key);
  if (v == nullptr && PyErr_Occurred()) throw py::error_already_set();
  return v;
}

// hash((role, text, calls or ())) for the common shapes, or false: the Python function keys this message.
bool message_key(PyObject* m, Py_hash_t& out) {
  const Keys& k = keys();
  if (!PyDict_CheckExact(m)) return false;
  PyObject* content = get(m, k.content);
  if (content == nullptr || content == Py_None) {
    content = k.empty;
  } else if (!PyUnicode_CheckExact(content)) {
    return false;  // parts (joined by the Python function), or another type
  }
  PyObject* role = get(m, k.role);
  if (role == nullptr) role = Py_None;
  PyObject* calls = get(m, k.tool_calls);
  py::object keyed;
  if (calls != nullptr && calls != Py_None) {
    if (!PyList_CheckExact(calls)) return false;
    const Py_ssize_t n = PyList_GET_SIZE(calls);
    if (n == 0) {
      keyed = py::reinterpret_steal<py::object>(PyTuple_New(0));
    } else {
      keyed = py::reinterpret_steal<py::object>(PyTuple_New(n));
      if (!keyed) throw py::error_already_set();
      for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject* c = PyList_GET_ITEM(calls, i);
        if (!PyDict_CheckExact(c)) return false;
        PyObject* fn = get(c, k.function);
        if (fn == nullptr || !PyDict_CheckExact(fn)) return false;
        PyObject* name = get(fn, k.name);
        PyObject* args = get(fn, k.arguments);
        if (name == nullptr || !PyUnicode_CheckExact(name)) return false;
        PyObject* text;  // str(arguments)
        if (args == nullptr) {
          text = k.empty;
          Py_INCREF(text);
        } else if (PyUnicode_CheckExact(args)) {
          text = args;
          Py_INCREF(text);
        } else {
          text = PyObject_Str(args);
          if (text == nullptr) throw py::error_already_set();
        }
        PyObject* item = PyUnicode_Concat(name, text);
        Py_DECREF(text);
        if (item == nullptr) throw py::error_already_set();
        PyTuple_SET_ITEM(keyed.ptr(), i, item);
      }
    }
  } else {
    keyed = py::reinterpret_steal<py::object>(PyTuple_New(0));
  }
  py::object t = py::reinterpret_steal<py::object>(PyTuple_Pack(3, role, content, keyed.ptr()));
  if (!t) throw py::error_already_set();
  out = PyObject_Hash(t.ptr());
  if (out == -1 && PyErr_Occurred()) throw py::error_already_set();
  return true;
}

// hash((h, key)) as a new int
py::object chained(PyObject* h, PyObject* m, py::handle python_key) {
  Py_hash_t key;
  py::object key_obj;
  if (message_key(m, key)) {
    key_obj = py::reinterpret_steal<py::object>(PyLong_FromSsize_t(key));
  } else {
    key_obj = python_key(py::handle(m));
  }
  py::object t = py::reinterpret_steal<py::object>(PyTuple_Pack(2, h, key_obj.ptr()));
  if (!t) throw py::error_already_set();
  const Py_hash_t d = PyObject_Hash(t.ptr());
  if (d == -1 && PyErr_Occurred()) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(PyLong_FromSsize_t(d));
}

void claim(PyObject* seen, PyObject* d, PyObject* session) {  // seen.pop(d, None); seen[d] = session
  if (PyDict_Contains(seen, d) == 1 && PyDict_DelItem(seen, d) < 0) throw py::error_already_set();
  if (PyDict_SetItem(seen, d, session) < 0) throw py::error_already_set();
}

// (session, the call's prefix digests): SessionChain.session_of_messages on its dict `seen`.
py::tuple chain_messages(py::dict seen, py::list messages, py::list known, py::object reply, py::object new_session,
                         Py_ssize_t max_entries, py::object python_key) {
  const Keys& k = keys();
  PyObject* ms = messages.ptr();
  const Py_ssize_t n = PyList_GET_SIZE(ms);
  const Py_ssize_t nk = PyList_GET_SIZE(known.ptr());
  if (nk > n) throw py::value_error("chain_messages: more known digests than messages");
  py::list digests = py::reinterpret_steal<py::list>(PyList_GetSlice(known.ptr(), 0, nk));
  py::object h = nk ? py::reinterpret_borrow<py::object>(PyList_GET_ITEM(known.ptr(), nk - 1))
                    : py::reinterpret_steal<py::object>(PyLong_FromLong(0));
  for (Py_ssize_t i = nk; i < n; ++i) {
    h = chained(h.ptr(), PyList_GET_ITEM(ms, i), python_key);
    if (PyList_Append(digests.ptr(), h.ptr()) < 0) throw py::error_already_set();
  }
  // the shared prefix must reach the first message after the leading system messages
  Py_ssize_t need = 0;
  for (; need < n; ++need) {
    PyObject* m = PyList_GET_ITEM(ms, need);
    PyObject* role = PyDict_Check(m) ? get(m, k.role) : nullptr;
    if (!PyDict_Check(m)) {  // m.get(...) on a non-dict: the Python code would raise; so does this
      throw py::type_error("chain_messages: a message is not a dict");
    }
    if (role == nullptr) break;
    const int a = PyObject_RichCompareBool(role, k.system, Py_EQ);
    const int b = a == 1 ? 1 : PyObject_RichCompareBool(role, k.developer, Py_EQ);
    if (a < 0 || b < 0) throw py::error_already_set();
    if (!a && !b) break;
  }
  PyObject* sd = seen.ptr();
  PyObject* session = nullptr;
  Py_ssize_t at = need - 1;
  for (Py_ssize_t i = n - 1; i >= need; --i) {
    session = get(sd, PyList_GET_ITEM(digests.ptr(), i));
    if (session != nullptr) {
      at = i;
      break;
    }
  }
  py::object s;
  if (session == nullptr) {
    s = new_session();
    at = need - 1;
  } else {
    s = py::reinterpret_borrow<py::object>(session);
  }
  for (Py_ssize_t i = at + 1; i < n; ++i) claim(sd, PyList_GET_ITEM(digests.ptr(), i), s.ptr());
  if (!reply.is_none()) {
    py::object d = chained(h.ptr(), reply.ptr(), python_key);
    claim(sd, d.ptr(), s.ptr());
  }
  while (PyDict_GET_SIZE(sd) > max_entries) {  // the oldest digests go first
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    if (!PyDict_Next(sd, &pos, &key, &value)) break;
    Py_INCREF(key);
    const int rc = PyDict_DelItem(sd, key);
    Py_DECREF(key);
    if (rc < 0) throw py::error_already_set();
  }
  return py::make_tuple(s, digests);
}

// --- the OpenAI reader's message conversion (strata_lab/traces/openai.py `_convert`) ---------------------

struct WireKeys {
  PyObject *role, *content, *tool_calls, *tool_call_id, *reasoning_content, *reasoning, *function, *name, *arguments,
      *id, *type, *user, *system, *tool, *assistant, *function_type;
  WireKeys()
      : role(interned("role")), content(interned("content")), tool_calls(interned("tool_calls")),
        tool_call_id(interned("tool_call_id")), reasoning_content(interned("reasoning_content")),
        reasoning(interned("reasoning")), function(interned("function")), name(interned("name")),
        arguments(interned("arguments")), id(interned("id")), type(interned("type")), user(interned("user")),
        system(interned("system")), tool(interned("tool")), assistant(interned("assistant")),
        function_type(interned("function")) {}
};

const WireKeys& wire() {
  static const WireKeys* k = new WireKeys();
  return *k;
}

bool is(PyObject* s, const char* what) {  // an exact str equal to `what`
  return s != nullptr && PyUnicode_CheckExact(s) && PyUnicode_CompareWithASCIIString(s, what) == 0;
}

// _no_numbers: only strings, nulls, lists and objects (no number or boolean)
bool no_numbers(PyObject* x, int depth = 0) {
  if (depth > 200) return false;  // (deeper than any message; counted as not plain, which only costs reuse)
  if (PyUnicode_CheckExact(x) || x == Py_None) return true;
  if (PyDict_CheckExact(x)) {
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(x, &pos, &k, &v))
      if (!no_numbers(v, depth + 1)) return false;
    return true;
  }
  if (PyList_CheckExact(x)) {
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(x); ++i)
      if (!no_numbers(PyList_GET_ITEM(x, i), depth + 1)) return false;
    return true;
  }
  return false;
}

void set(PyObject* d, PyObject* k, PyObject* v) {
  if (PyDict_SetItem(d, k, v) < 0) throw py::error_already_set();
}

struct ResponseKeys {
  PyObject *choices, *message, *finish_reason, *model, *id, *usage, *prompt_tokens, *completion_tokens, *details,
      *cached_tokens, *prompt_token_ids, *timings, *response_text, *response_reasoning, *response_tool_calls, *finish,
      *request_id, *tool;
  ResponseKeys()
      : choices(interned("choices")), message(interned("message")), finish_reason(interned("finish_reason")),
        model(interned("model")), id(interned("id")), usage(interned("usage")),
        prompt_tokens(interned("prompt_tokens")), completion_tokens(interned("completion_tokens")),
        details(interned("prompt_tokens_details")), cached_tokens(interned("cached_tokens")),
        prompt_token_ids(interned("prompt_token_ids")), timings(interned("timings")),
        response_text(interned("response_text")), response_reasoning(interned("response_reasoning")),
        response_tool_calls(interned("response_tool_calls")), finish(interned("finish")),
        request_id(interned("request_id")), tool(interned("tool")) {}
};

const ResponseKeys& response_keys() {
  static const ResponseKeys* k = new ResponseKeys();
  return *k;
}

int truthy(PyObject* o) {
  const int t = PyObject_IsTrue(o);
  if (t < 0) throw py::error_already_set();
  return t;
}

// `tool_call(c.get("id"), function.get("name"), function.get("arguments"))` for a dict c of the common shape
// (a new reference), or nullptr: the Python function writes it.
PyObject* tool_call(PyObject* c) {
  const WireKeys& w = wire();
  PyObject* fn = get(c, w.function);
  py::object empty;
  if (fn == nullptr || !truthy(fn)) {
    empty = py::reinterpret_steal<py::object>(PyDict_New());
    fn = empty.ptr();
  } else if (!PyDict_CheckExact(fn)) {
    return nullptr;
  }
  PyObject* name = get(fn, w.name);
  if (name == nullptr || !truthy(name)) {
    name = response_keys().tool;
  } else if (!PyUnicode_CheckExact(name)) {
    return nullptr;  // str() of another type
  }
  PyObject* args = get(fn, w.arguments);
  py::object a;
  if (args == nullptr || args == Py_None) {
    a = py::reinterpret_steal<py::object>(PyDict_New());
  } else if (PyUnicode_CheckExact(args) || PyDict_CheckExact(args)) {
    a = py::reinterpret_borrow<py::object>(args);
  } else {
    return nullptr;  // written as JSON
  }
  PyObject* cid = get(c, w.id);
  const bool with_id = cid != nullptr && truthy(cid);
  if (with_id && !PyUnicode_CheckExact(cid)) return nullptr;
  py::object f = py::reinterpret_steal<py::object>(PyDict_New());
  set(f.ptr(), w.name, name);
  set(f.ptr(), w.arguments, a.ptr());
  py::object out = py::reinterpret_steal<py::object>(PyDict_New());
  set(out.ptr(), w.type, w.function_type);
  set(out.ptr(), w.function, f.ptr());
  if (with_id) set(out.ptr(), w.id, cid);
  return out.release().ptr();
}

// The tool calls of a list, as `[tool_call(...) for c in calls if isinstance(c, dict)]` writes them, appended
// to out; false: one the Python function writes.
bool tool_calls(PyObject* calls, py::list& out) {
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(calls); ++i) {
    PyObject* c = PyList_GET_ITEM(calls, i);
    if (!PyDict_Check(c)) continue;  // (the Python function skips what is not an object)
    if (!PyDict_CheckExact(c)) return false;
    PyObject* one = tool_call(c);
    if (one == nullptr) return false;
    const int rc = PyList_Append(out.ptr(), one);
    Py_DECREF(one);
    if (rc < 0) throw py::error_already_set();
  }
  return true;
}

// An assistant message of the common shape as `_message` converts it (a new dict), or nullptr: the Python
// function converts it.
PyObject* assistant(PyObject* m) {
  const WireKeys& k = wire();
  PyObject* content = get(m, k.content);
  if (content != nullptr && content != Py_None && !PyUnicode_CheckExact(content)) return nullptr;  // parts
  PyObject* reasoning = get(m, k.reasoning_content);
  PyObject* reasoning2 = get(m, k.reasoning);
  if (reasoning2 != nullptr && reasoning2 != Py_None) return nullptr;  // `or` between the two: the Python one
  if (reasoning != nullptr && reasoning != Py_None && !PyUnicode_CheckExact(reasoning)) return nullptr;
  PyObject* calls = get(m, k.tool_calls);
  if (calls != nullptr && calls != Py_None && !PyList_CheckExact(calls)) return nullptr;
  py::list converted(0);  // the tool calls, as tool_call() writes them
  if (calls != nullptr && calls != Py_None && !tool_calls(calls, converted)) return nullptr;
  PyObject* msg = PyDict_New();
  if (msg == nullptr) throw py::error_already_set();
  py::object holder = py::reinterpret_steal<py::object>(msg);
  set(msg, k.role, k.assistant);
  if (content != nullptr && content != Py_None) set(msg, k.content, content);
  if (reasoning != nullptr && reasoning != Py_None && PyUnicode_GET_LENGTH(reasoning) > 0)
    set(msg, k.reasoning_content, reasoning);
  if (PyList_GET_SIZE(converted.ptr()) > 0) set(msg, k.tool_calls, converted.ptr());
  return holder.release().ptr();
}

// (the converted messages[start:], how many leading ones are plain): `_convert`; `python_one(m, notes)` gives
// (converted, plain) for the messages the common shapes do not cover.
py::tuple convert_messages(py::list messages, Py_ssize_t start, py::list notes, py::object python_one) {
  const WireKeys& k = wire();
  PyObject* ms = messages.ptr();
  const Py_ssize_t n = PyList_GET_SIZE(ms);
  if (start < 0 || start > n) throw py::value_error("convert_messages: start out of range");
  py::list out(0);
  Py_ssize_t plain = 0;
  for (Py_ssize_t i = start; i < n; ++i) {
    PyObject* m = PyList_GET_ITEM(ms, i);
    PyObject* msg = nullptr;
    bool is_plain = false;
    if (PyDict_CheckExact(m)) {
      const Py_ssize_t size = PyDict_GET_SIZE(m);
      PyObject* role = get(m, k.role);
      PyObject* content = get(m, k.content);
      if (content != nullptr && PyUnicode_CheckExact(content) && size <= 3) {
        if (size == 2 && (is(role, "user") || is(role, "system"))) {
          msg = PyDict_New();
          if (msg == nullptr) throw py::error_already_set();
          set(msg, k.role, role);
          set(msg, k.content, content);
          is_plain = true;
        } else if (size == 3 && is(role, "tool")) {
          PyObject* tcid = get(m, k.tool_call_id);
          if (tcid != nullptr && PyUnicode_CheckExact(tcid) && PyUnicode_GET_LENGTH(tcid) > 0) {
            msg = PyDict_New();
            if (msg == nullptr) throw py::error_already_set();
            set(msg, k.role, role);
            set(msg, k.content, content);
            set(msg, k.tool_call_id, tcid);
            is_plain = true;
          }
        }
      }
      if (msg == nullptr && is(role, "assistant")) {
        msg = assistant(m);
        if (msg != nullptr) is_plain = no_numbers(m);
      }
    }
    if (msg != nullptr) {
      const int rc = PyList_Append(out.ptr(), msg);
      Py_DECREF(msg);
      if (rc < 0) throw py::error_already_set();
    } else {
      py::tuple got = python_one(py::handle(m), notes);
      if (PyList_Append(out.ptr(), got[0].ptr()) < 0) throw py::error_already_set();
      is_plain = PyObject_IsTrue(got[1].ptr()) == 1;
    }
    if (is_plain && plain == PyList_GET_SIZE(out.ptr()) - 1) ++plain;
  }
  return py::make_tuple(out, plain);
}

// --- the OpenAI reader's reply and usage (strata_lab/traces/openai.py `apply_response`) ----------------------


// apply_response(call, response) for the common shape of a chat.completion; false (nothing written): the
// Python function reads it.
bool apply_response(py::dict call_, py::handle response_) {
  const ResponseKeys& k = response_keys();
  const WireKeys& w = wire();
  PyObject* call = call_.ptr();
  PyObject* response = response_.ptr();
  if (!PyDict_CheckExact(response)) return false;
  if (get(response, k.prompt_token_ids) != nullptr || get(response, k.timings) != nullptr) return false;
  PyObject* choices = get(response, k.choices);
  if (choices == nullptr || !PyList_CheckExact(choices) || PyList_GET_SIZE(choices) == 0) return false;
  PyObject* choice = PyList_GET_ITEM(choices, 0);
  if (!PyDict_CheckExact(choice)) return false;
  PyObject* message = get(choice, k.message);
  if (message == nullptr || !PyDict_CheckExact(message)) return false;
  PyObject* usage = get(response, k.usage);
  if (usage != nullptr && truthy(usage) && !PyDict_CheckExact(usage)) return false;
  PyObject* details = usage != nullptr && PyDict_CheckExact(usage) ? get(usage, k.details) : nullptr;
  if (details != nullptr && truthy(details) && !PyDict_CheckExact(details)) return false;
  PyObject* calls = get(message, w.tool_calls);
  if (calls != nullptr && truthy(calls) && !PyList_CheckExact(calls)) return false;
  py::list converted(0);
  if (calls != nullptr && PyList_CheckExact(calls) && !tool_calls(calls, converted)) return false;
  PyObject* content = get(message, w.content);
  set(call, k.response_text, content != nullptr && PyUnicode_Check(content) ? content : Py_None);
  PyObject* reasoning = get(message, w.reasoning_content);
  if (reasoning == nullptr || !truthy(reasoning)) reasoning = get(message, w.reasoning);
  set(call, k.response_reasoning, reasoning != nullptr && PyUnicode_Check(reasoning) ? reasoning : Py_None);
  set(call, k.response_tool_calls, PyList_GET_SIZE(converted.ptr()) ? converted.ptr() : Py_None);
  PyObject* finish = get(choice, k.finish_reason);
  set(call, k.finish, finish != nullptr ? finish : Py_None);
  PyObject* model = get(response, k.model);
  if (model != nullptr && truthy(model)) set(call, k.model, model);
  else set(call, k.model, get(call, k.model) ? get(call, k.model) : Py_None);
  PyObject* rid = get(response, k.id);
  if (rid != nullptr && truthy(rid)) set(call, k.request_id, rid);
  else set(call, k.request_id, get(call, k.request_id) ? get(call, k.request_id) : Py_None);
  PyObject* pt = usage != nullptr && PyDict_CheckExact(usage) ? get(usage, k.prompt_tokens) : nullptr;
  PyObject* ct = usage != nullptr && PyDict_CheckExact(usage) ? get(usage, k.completion_tokens) : nullptr;
  set(call, k.prompt_tokens, pt != nullptr ? pt : Py_None);
  set(call, k.completion_tokens, ct != nullptr ? ct : Py_None);
  PyObject* cached = details != nullptr && PyDict_CheckExact(details) ? get(details, k.cached_tokens) : nullptr;
  set(call, k.cached_tokens, cached != nullptr ? cached : Py_None);
  return true;
}

}  // namespace

void bind_log_chain(py::module_& m) {
  m.def("apply_response", &apply_response, py::arg("call"), py::arg("response"),
        "strata_lab.traces.openai.apply_response for the common shape of a chat.completion (True), or False "
        "(nothing written): the Python function reads it.");
  m.def("convert_messages", &convert_messages, py::arg("messages"), py::arg("start"), py::arg("notes"),
        py::arg("python_one"),
        "(messages[start:] converted, how many leading ones are plain): strata_lab.traces.openai._convert for "
        "the common shapes; python_one(message, notes) -> (converted, plain) for the others.");
  m.def("chain_messages", &chain_messages, py::arg("seen"), py::arg("messages"), py::arg("known"), py::arg("reply"),
        py::arg("new_session"), py::arg("max_entries"), py::arg("python_key"),
        "(session, prefix digests): strata_lab.traces.log_calls.SessionChain.session_of_messages on its dict "
        "`seen`, the same digests; `python_key(message)` keys the messages the common shapes do not cover.");
}
