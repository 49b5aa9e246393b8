"""The qwen3 chat template in plain Python, for rendering logs: the same text as the Jinja template, several
times faster (a log resends its whole history with every call, so the render is the bulk of an import).

`FastRenderer.of(template)` is a renderer only for our shipped ``qwen3`` template (its source, unchanged, with
no tool-use variant), else None. `render(messages, tools, kwargs, notes, reply)` takes the messages as a log
reader gives them and does what `render.vllm_messages` + `ChatTemplate.render` do: ``content: None`` -> "",
tool-call arguments parsed as JSON and written back with ``tojson`` (a note when they are not JSON), the input
checks of `validate_messages` / `validate_tools`. It returns None for anything it is not sure to render the same
way, a message the checks would refuse included: the caller then renders with the template (which raises the
same error it always did). It returns (prompt, full): the prompt with the generation prompt, and the text of the
messages + `reply` as a history turn (None without a reply), what `reply_ids` renders.

In C++ first: `strata_lab._replay._Qwen3Render` (engine/bindings/qwen3_render.cpp) renders the shapes agent logs
hold, reading the messages in C (`FastRenderer.native`), taking per session what a call shares with the
session's last call by the same rule as below; it shares this renderer's caches of tool-call arguments and call
heads and asks it for what they do not hold (and for the tool definitions' text). It returns None for anything
else (reasoning written inside an assistant's content, a message the checks would
refuse, ...), and this renderer renders the call. `render.render_call` goes one step further where the encoder
is the native one: `fast_encode.IncrementalEncoder.render_turn` renders and encodes a call in one native call.

With a session `key`, a call the Python renderer renders costs what it adds: what it shares with the session's previous call (checks,
and the text of turns that render the same) is taken from it (`render`). Exactness is checked by hypothesis
against the Jinja template on generated agent sessions, call after call (tool calls, reasoning, edits,
content null, tool results, tool definitions, odd inputs), the C++ renderer and the Python one each:
tests/test_fast_render.py.

Why one module: the renderer, its per-session reuse and its input checks are one reading of one template;
split apart, a change to how a turn renders and to when a previous call's text may be reused would land in
different files, and the hypothesis tests against Jinja check them only together.
"""
from __future__ import annotations

import json
from functools import lru_cache

__all__ = ["FastRenderer"]

_ROLES = frozenset(("system", "user", "assistant", "tool"))
_KEYS = frozenset(("role", "content", "tool_calls", "tool_call_id", "reasoning_content", "name"))
_NOT_JSON = "tool-call arguments not JSON: rendered as the string"
_TOOLS_HEAD = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided "
               "with function signatures within <tools></tools> XML tags:\n<tools>")
_TOOLS_TAIL = ("\n</tools>\n\nFor each function call, return a json object with function name and arguments "
               "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
               "<args-json-object>}\n</tool_call><|im_end|>\n")
_MAX_ARGS = 1 << 16  # argument strings whose rendering is remembered
_MAX_SESSIONS = 1024  # sessions whose last call's messages are remembered


@lru_cache(maxsize=1)
def _qwen3_source() -> str:
    from importlib import resources

    from strata_lab.text.template import TEMPLATE_PRESETS

    name = TEMPLATE_PRESETS["qwen3"][0]  # what ChatTemplate.from_name("qwen3") reads
    return resources.files("strata_lab.text").joinpath("templates").joinpath(name).read_text("utf-8")


def _dumps(x) -> str:
    return json.dumps(x, ensure_ascii=False)


def _text(content):
    """text_of(content) for valid content, or None (not a string or a list of text parts)."""
    if content.__class__ is str:
        return content
    if content.__class__ is list:
        out = []
        for p in content:
            if p.__class__ is not dict or p.get("type") != "text" or p.get("text").__class__ is not str:
                return None
            out.append(p["text"])
        return "".join(out)
    return None


class FastRenderer:
    def __init__(self, template):
        self.template = template
        self._args: dict = {}  # argument JSON string -> (rendered text, parsed as JSON?)
        self._names: dict = {}  # tool name -> the rendered tool call up to its arguments
        self._prev: dict = {}  # session -> (its last call's messages, their checked parts), oldest first
        self._max_chars = _max_chars()
        self._heads: dict = {}  # (tool definitions' key, first system text) -> the system turn, or None: refused
        self.eos_ids: dict = {}  # tokenizer -> the id of this template's eos token (-1: none), for render_call
        self.native = _native(self)  # strata_lab._replay._Qwen3Render, or None without the compiled extension

    @classmethod
    def of(cls, template) -> "FastRenderer | None":
        if getattr(template, "source", None) != _qwen3_source() or template.tool_use is not None:
            return None
        if not all(k.endswith("_token") for k in template.special_tokens):
            return None  # a special-token variable that could shadow one the template reads
        return cls(template)

    def _arguments(self, args, notes: list):
        """(the rendered arguments of a tool call, as vLLM parses them and the template writes them; whether
        they were JSON), or None: not one this renderer handles (the template's checks decide)."""
        if not args:
            return "{}", True
        if args.__class__ is dict:
            return _dumps(args), True
        if args.__class__ is not str:
            return None
        got = self._args.get(args)
        if got is None:
            try:
                obj = json.loads(args)
            except ValueError:
                got = (args, False)
            else:
                if obj.__class__ is str:
                    got = (obj, True)
                elif obj.__class__ is dict:
                    got = (_dumps(obj), True)
                else:
                    return None  # parsed to a list / number: validation refuses it
            if len(self._args) > _MAX_ARGS:
                self._args.clear()
            self._args[args] = got
        if not got[1] and _NOT_JSON not in notes:
            notes.append(_NOT_JSON)
        return got

    def _call_head(self, fname: str) -> str:
        """A tool call's rendered text up to its arguments."""
        head = self._names.get(fname)
        if head is None:
            head = '<tool_call>\n{"name": ' + _dumps(fname) + ', "arguments": '
            if len(self._names) > _MAX_ARGS:
                self._names.clear()
            self._names[fname] = head
        return head

    def _system_turn(self, tools, first_system):
        """`_tools_head` for the native renderer, remembered per tool definitions (by their JSON) and system
        text; None: refused."""
        try:
            key = (_tools_key(tools), first_system)
        except TypeError:  # not JSON: the template decides
            return None
        try:
            return self._heads[key]
        except KeyError:
            pass
        except TypeError:  # an unhashable key (tools not a list): the Python renderer decides
            return None
        if len(self._heads) > 256:
            self._heads.clear()
        got = self._heads[key] = self._tools_head(tools, first_system)
        return got

    def _message(self, m, notes: list):
        """(role, text, reasoning or None, [rendered tool calls] or None, tool_call_id, call ids) or None."""
        if m.__class__ is not dict:
            return None
        n = len(m)
        if n <= 3:  # the common shapes, checked in full here: a user / system text, a tool result
            role, content = m.get("role"), m.get("content")
            if content.__class__ is str:
                if n == 2 and (role == "user" or role == "system"):
                    return role, content, None, None, None, None, True, False
                if n == 2 and role == "assistant":
                    return role, content, None, None, None, _NO_IDS, True, False
                if n == 3 and role == "tool":
                    tcid = m.get("tool_call_id")
                    if tcid.__class__ is str and tcid:
                        return role, content, None, None, tcid, None, True, False
        if not _KEYS.issuperset(m):
            return None
        role = m.get("role")
        if role not in _ROLES:
            return None
        content = m.get("content")
        if content is None:
            if role != "assistant" and "content" not in m:
                return None  # required: the template's checks say so
            text = ""
        else:
            text = _text(content)
            if text is None:
                return None
        name = m.get("name")
        if name is not None and name.__class__ is not str:
            return None
        reasoning = m.get("reasoning_content")
        if reasoning is not None and (role != "assistant" or reasoning.__class__ is not str):
            return None
        calls = m.get("tool_calls")
        rendered = None
        ids = None
        plain, noted = True, False  # plain: no object arguments (equal messages then render the same)
        if calls is not None:
            if role != "assistant" or calls.__class__ is not list:
                return None
            rendered, ids = [], set()
            for c in calls:
                if c.__class__ is not dict:
                    return None
                fn = c.get("function")
                if fn.__class__ is not dict or c.get("type", "function") not in ("function", None):
                    return None
                cid = c.get("id")
                if cid is not None:
                    if cid.__class__ is not str:
                        return None
                    ids.add(cid)
                fname = fn.get("name")
                if fname.__class__ is not str or not fname:
                    return None
                a = fn.get("arguments")
                if a and a.__class__ is not str:
                    plain = False  # 1 == 1.0 == True, but tojson writes them apart
                got = self._arguments(a, notes)
                if got is None:
                    return None
                args, json_ok = got
                noted = noted or not json_ok
                rendered.append(self._call_head(fname) + args + "}\n</tool_call>")
            if not rendered:
                rendered = None
        elif role == "assistant":
            ids = set()
        tcid = m.get("tool_call_id")
        if role == "tool":
            if tcid.__class__ is not str or not tcid:
                return None
        elif tcid is not None:
            return None
        return role, text, reasoning, rendered, tcid, ids, plain, noted

    @staticmethod
    def _assistant(text: str, reasoning, calls, after_query: bool) -> str:
        if reasoning is None and "</think>" in text:
            reasoning = text.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
            text = text.split("</think>")[-1].lstrip("\n")
        elif reasoning is None:
            reasoning = ""
        out = "<|im_start|>assistant\n<think>\n" + reasoning.strip("\n") + "\n</think>\n\n" + text.lstrip("\n") \
            if after_query else "<|im_start|>assistant\n" + text
        if calls:
            out += ("\n" if text else "") + "\n".join(calls)
        return out + "<|im_end|>\n"

    def _tools_head(self, tools, first_system) -> str | None:
        """The system turn's text: the first system message and the tool definitions (None: refused)."""
        if tools is not None:
            if tools.__class__ is not list:
                return None
            for t in tools:
                if t.__class__ is not dict or t.get("type") != "function":
                    return None
                fn = t.get("function")
                if fn.__class__ is not dict or fn.get("name").__class__ is not str or not fn.get("name"):
                    return None
                if fn.get("description") is not None and fn["description"].__class__ is not str:
                    return None
                if fn.get("parameters") is not None and fn["parameters"].__class__ is not dict:
                    return None
        if tools:
            out = ["<|im_start|>system\n"]
            if first_system is not None:
                out.append(first_system + "\n\n")
            out.append(_TOOLS_HEAD)
            for t in tools:
                out.append("\n" + _dumps(t))
            out.append(_TOOLS_TAIL)
            return "".join(out)
        return "<|im_start|>system\n" + first_system + "<|im_end|>\n" if first_system is not None else ""

    def render(self, messages, tools, kwargs: dict, notes: list, reply: dict | None = None, key=None):
        """(prompt, full) or None (see the module). `key` (a session): what the key's previous rendered call
        shares with this one is taken from it, so a call costs what it adds to the history, not its length:
        its leading messages equal to that call's (compared in C; a message with object arguments only when it
        is the same object: 1 == 1.0 == True, but tojson writes them apart) keep their checks, and the text of
        those that render the same (the same tool definitions, compared by their JSON; before the last user
        query of both calls, as the template drops the think block of turns before it) is reused."""
        if not messages or (kwargs and (set(kwargs) != {"enable_thinking"}
                                        or kwargs["enable_thinking"] not in (None, True, False))):
            return None
        thinking = kwargs.get("enable_thinking") if kwargs else None
        if thinking is not None and thinking.__class__ is not bool:
            return None
        if self.native is not None:  # the common shapes, rendered whole in C++; the rest here
            got = self.native.render(messages, tools, thinking, reply, notes, key)
            if got is not None:
                return got
        k = 0
        prev = self._prev.get(key) if key is not None else None
        if prev is not None:
            pm = prev.messages
            n = len(pm)
            if n <= len(messages) and n <= prev.plain and messages[:n] == pm:
                k = n
            else:
                lim, pparsed = min(len(messages), n), prev.parsed
                while k < lim and (messages[k] is pm[k] or (pparsed[k][6] and messages[k] == pm[k])):
                    k += 1
        parsed = prev.parsed[:k] if k else []
        if k and prev.noted < k and _NOT_JSON not in notes:
            notes.append(_NOT_JSON)
        # the previous call's reply, resent as the first new message, keeps its checked parts
        again = prev.reply if k and k == len(prev.messages) and prev.reply is not None else None
        for m in messages[k:] if k else messages:
            if again is not None:
                p = again[1] if _same_reply(m, again[0]) else self._message(m, notes)
                again = None
                if p is not None and p[7] and _NOT_JSON not in notes:
                    notes.append(_NOT_JSON)
            else:
                p = self._message(m, notes)
            if p is None:
                return None
            parsed.append(p)
        n = len(parsed)
        # the checks of the messages from k on (those before passed in the previous call): a tool result
        # answers a call of the last assistant message before it
        call_ids = _NO_IDS
        if k and k == len(prev.parsed):
            call_ids = prev.call_ids
        else:
            for i in range(k - 1, -1, -1):
                if parsed[i][0] == "assistant":
                    call_ids = parsed[i][5]
                    break
        for i in range(k, n):
            p = parsed[i]
            if p[0] == "assistant":
                call_ids = p[5]
            elif p[0] == "tool" and call_ids and p[4] not in call_ids:
                return None  # tool_call_id of no preceding tool call: refused by the checks
        last = None
        if reply is not None:
            last = self._message(reply, [])
            if last is None or last[0] != "assistant":
                return None
        try:
            tkey = _tools_key(tools) if tools is not None else None
        except TypeError:  # not JSON: the template decides
            return None
        # the last user query (not a tool response): assistant turns after it keep their think block
        last_query = -1
        for i in range(n - 1, k - 1, -1):
            role, text = parsed[i][0], parsed[i][1]
            if role == "user" and not (text.startswith("<tool_response>") and text.endswith("</tool_response>")):
                last_query = i
                break
        else:
            if k and prev.last_query < k:
                last_query = prev.last_query
            else:
                for i in range(k - 1, -1, -1):
                    role, text = parsed[i][0], parsed[i][1]
                    if role == "user" and not (text.startswith("<tool_response>")
                                               and text.endswith("</tool_response>")):
                        last_query = i
                        break
        # messages [0, r) render as in the previous call: the same message, the same next message's role
        # where that decides (a tool result is closed before a message that is not one), the same side of the
        # last user query, the same system turn
        r = 0
        if k and tkey == prev.tools_key:
            r = k if parsed[k - 1][0] != "tool" else k - 1
            if last_query != prev.last_query:
                r = min(r, min(last_query, prev.last_query) + 1)
        if r > 0 or (k and tkey == prev.tools_key):
            out = prev.parts[: r + 1]  # the system turn, then one part a message (strings shared, not copied)
        else:
            head = self._tools_head(tools, parsed[0][1] if parsed[0][0] == "system" else None)
            if head is None:
                return None
            out = [head]
        assistant = self._assistant
        for i in range(r, n):
            role, text, reasoning, calls = parsed[i][0], parsed[i][1], parsed[i][2], parsed[i][3]
            if role == "user" or (role == "system" and i):
                part = "<|im_start|>" + role + "\n" + text + "<|im_end|>\n"
            elif role == "assistant":
                part = assistant(text, reasoning, calls, i > last_query)
            elif role == "tool":
                part = "\n<tool_response>\n" + text + "\n</tool_response>"
                if not i or parsed[i - 1][0] != "tool":
                    part = "<|im_start|>user" + part
                # closed before a message that is not a tool result; the last is closed when the reply follows
                if i + 1 < n and parsed[i + 1][0] != "tool":
                    part += "<|im_end|>\n"
            else:  # the first system message: in the system turn
                part = ""
            out.append(part)
        # the prompt and the full text, each joined once from the parts
        tail = "<|im_end|>\n" if parsed[-1][0] == "tool" else ""
        gen = "<|im_start|>assistant\n<think>\n\n</think>\n\n" if kwargs.get("enable_thinking") is False else \
            "<|im_start|>assistant\n"
        parts = len(out)  # (out is this call's own list: the two ends are appended, joined, then dropped)
        out += (tail, gen)
        prompt = "".join(out)
        full = None
        if last is not None:
            out[-1] = assistant(last[1], last[2], last[3], True)
            full = "".join(out)
        del out[parts:]
        if len(prompt) > self._max_chars or (full is not None and len(full) > self._max_chars):
            return None
        if key is not None:
            plain = prev.plain if k and prev.plain < k else k
            while plain < n and parsed[plain][6]:
                plain += 1
            if k and prev.noted < k:
                noted = prev.noted
            else:
                noted = k
                while noted < n and not parsed[noted][7]:
                    noted += 1
                if noted == n:
                    noted = _NEVER
            self._prev.pop(key, None)
            self._prev[key] = _Last(messages, parsed, tkey, out, last_query, call_ids, plain, noted,
                                    (reply, last) if last is not None and last[6] else None)
            if len(self._prev) > _MAX_SESSIONS:
                del self._prev[next(iter(self._prev))]
        return prompt, full


_NEVER = 1 << 62
_NO_IDS = frozenset()  # the call ids a tool result may answer before any assistant message (read only)
_REPLY_KEYS = frozenset(("role", "content", "tool_calls", "reasoning_content"))


def _same_reply(m, reply: dict) -> bool:
    """Whether message `m` has the checked parts of `reply` (a reply as `render._raw_reply` gives it, without
    object arguments): an assistant message with no other keys, the same text (None is ""), reasoning and
    tool calls (strings or empty arguments: equal ones render the same)."""
    if m.__class__ is not dict or m.get("role") != "assistant" or not _REPLY_KEYS.issuperset(m):
        return False
    content = m.get("content")
    if content is None:
        content = ""
    elif content.__class__ is not str:
        return False
    return content == reply.get("content") and m.get("reasoning_content") == reply.get("reasoning_content") \
        and m.get("tool_calls") == reply.get("tool_calls")


def _tools_key(tools):
    """The tool definitions as the render sees them: their JSON (key order and number types included, as
    ``tojson`` writes them), so that equal keys render the same."""
    if tools is None or tools.__class__ is not list:
        return tools.__class__ if tools is not None else None
    if not tools:
        return b"[]"
    got = _orjson_dumps(tools)
    # orjson writes NaN and infinities as null: with a null in them, the keys are the template's own JSON
    return got if b"null" not in got else _dumps(tools)


try:
    from orjson import dumps as _orjson_dumps
except ImportError:  # pragma: no cover - orjson is a core dependency
    def _orjson_dumps(x):
        return json.dumps(x, ensure_ascii=False).encode()


def _native(renderer: FastRenderer):
    """The C++ renderer of the common shapes (strata_lab._replay._Qwen3Render), sharing `renderer`'s caches of
    arguments and call heads and calling its own methods for what they do not hold; None without the compiled
    extension."""
    from strata_lab._native import replay

    try:
        cls = replay()._Qwen3Render
    except (ImportError, AttributeError):
        return None
    return cls(renderer._args, renderer._names, renderer._arguments, renderer._call_head, renderer._system_turn,
               renderer._max_chars, _NOT_JSON)


@lru_cache(maxsize=1)
def _max_chars() -> int:
    from strata_lab.text.jinja import RENDER_MAX_CHARS

    return RENDER_MAX_CHARS


class _Last:
    """A session's last rendered call: its messages and their checked parts, its tool definitions' key, its
    history text in parts (the system turn, then each message's), its last user query,
    the call ids a tool result after it may answer, its leading plain messages, its first noted message."""

    __slots__ = ("messages", "parsed", "tools_key", "parts", "last_query", "call_ids", "plain", "noted", "reply")

    def __init__(self, messages, parsed, tools_key, parts, last_query, call_ids, plain, noted, reply):
        self.messages, self.parsed, self.tools_key, self.parts = messages, parsed, tools_key, parts
        self.last_query, self.call_ids, self.plain, self.noted = last_query, call_ids, plain, noted
        self.reply = reply  # (the reply as given, its checked parts) when it has no object arguments, or None
