"""Client habits that break the prompt prefix, found on messages (so for any chat template): what a call sends
where its session's previous call held something else.

`history_change(prev, call)` compares a call's messages with its session's previous call's messages and reply
(as the model wrote it) and names the first message that differs and how (`HABITS`):

| habit | the message |
|---|---|
| `volatile_system` | a system message that differs only in its volatile parts (`mask_volatile`: a timestamp, a request id) |
| `reasoning_dropped` | the previous reply sent back without the reasoning the model wrote |
| `arguments_reserialised` | a reply's tool-call arguments, the same JSON written as other text (key order, spacing) |
| `tool_output_truncated` | an earlier tool output sent back shorter (cut, or cut with a marker) |
| `history_edit` | any other change of a message the session held (an edited user turn, a dropped message), or of the tool definitions (other tools, or the same JSON with its keys in another order) |

Import writes the result into each rendered call's dump line (`history_change`: the habit, the message index
(None for the tool definitions) and a short text; None when the call resends exactly what its session held), and lint and the replay's causes
read it from there: the habit, not the template's markers, names the change.

>>> prev = {"system": None, "messages": [{"role": "user", "content": "hi"}], "response_text": "hello",
...         "response_reasoning": "greet", "response_tool_calls": None}
>>> nxt = {"system": None, "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
...        {"role": "user", "content": "more"}]}
>>> history_change(prev, nxt)["habit"]
'reasoning_dropped'
"""
from __future__ import annotations

import json

from strata_lab.text.structure import mask_volatile

__all__ = ["HABITS", "history_change", "held_messages"]

HABITS = ("volatile_system", "reasoning_dropped", "arguments_reserialised", "tool_output_truncated", "history_edit")


def _text(content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return json.dumps(content, ensure_ascii=False, sort_keys=True)


def _args(call) -> tuple[str, str]:
    fn = call.get("function") if isinstance(call, dict) else None
    fn = fn if isinstance(fn, dict) else {}
    a = fn.get("arguments")
    return str(fn.get("name", "")), a if isinstance(a, str) else json.dumps(a if a is not None else {},
                                                                           ensure_ascii=False)


def _json(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return None


def held_messages(call: dict) -> list[dict]:
    """A call's messages (its system field first) and its reply as the model wrote it (reasoning kept)."""
    msgs = list(call.get("messages") or ())
    if call.get("system") and not (msgs and isinstance(msgs[0], dict) and msgs[0].get("role") == "system"):
        msgs.insert(0, {"role": "system", "content": call["system"]})
    if call.get("response_text") is not None or call.get("response_tool_calls") or call.get("response_reasoning"):
        reply = {"role": "assistant", "content": call.get("response_text") or ""}
        if call.get("response_reasoning"):
            reply["reasoning_content"] = call["response_reasoning"]
        if call.get("response_tool_calls"):
            reply["tool_calls"] = call["response_tool_calls"]
        msgs.append(reply)
    return msgs


def _changed_line(a: str, b: str) -> str:
    la, lb = a.split("\n"), b.split("\n")
    for x, y in zip(la, lb):
        if x != y:
            return y[:120]
    return b[:120]


def _compare(a: dict, b: dict) -> tuple[str, str] | None:
    """None when message `b` (sent now) is what `a` (held) was; else (habit, text)."""
    if a is b:
        return None
    role = a.get("role")
    if role != b.get("role"):
        return "history_edit", f"a {b.get('role')} message where the session held a {role} message"
    ta, tb = _text(a.get("content")), _text(b.get("content"))
    ca = [_args(c) for c in a.get("tool_calls") or ()]
    cb = [_args(c) for c in b.get("tool_calls") or ()]
    ra, rb = a.get("reasoning_content") or "", b.get("reasoning_content") or ""
    if ta == tb and ca == cb and (ra == rb or not ra):
        return None
    if role in ("system", "developer") and ta != tb and mask_volatile(ta) == mask_volatile(tb):
        return "volatile_system", _changed_line(ta, tb)
    if role == "assistant":
        if ra and not rb and ta.strip() == tb.strip() and [n for n, _ in ca] == [n for n, _ in cb]:
            if ca == cb:
                return "reasoning_dropped", ra[:80]
        if ta.strip() == tb.strip() and len(ca) == len(cb) and ca != cb and all(
                n1 == n2 and _json(x) is not None and _json(x) == _json(y) for (n1, x), (n2, y) in zip(ca, cb)):
            k = next(i for i, (x, y) in enumerate(zip(ca, cb)) if x != y)
            return "arguments_reserialised", f"{cb[k][0]}: {ca[k][1][:60]} -> {cb[k][1][:60]}"
        if ra and not rb and ta.strip() == tb.strip():
            return "reasoning_dropped", ra[:80]
    if role == "tool" and len(tb) < len(ta):
        head = 0
        while head < len(tb) and tb[head] == ta[head]:
            head += 1
        if head >= min(len(tb), 16) and head >= len(tb) // 2:
            return "tool_output_truncated", f"{len(ta)} -> {len(tb)} characters: ...{tb[head:head + 40]!r}"
    return "history_edit", f"{role}: {_changed_line(ta, tb)[:80]!r}"


def _tools_change(a, b) -> str | None:
    """None when the tool definitions `b` are `a` as sent (the same JSON text); else what differs."""
    a, b = a or None, b or None   # no tools, however a log writes it
    if json.dumps(a, ensure_ascii=False) == json.dumps(b, ensure_ascii=False):
        return None
    if a == b:
        return "tool definitions: the same JSON with its keys in another order"
    return "tool definitions changed"


def history_change(prev: dict | None, call: dict) -> dict | None:
    """The first change `call` makes to what its session's previous call `prev` held (`held_messages`, and
    the tool definitions): {"habit", "message" (its index in the call's messages, system first; None: the tool
    definitions), "text"}; None when the call
    resends all of it unchanged (or `prev` is None). A change the template makes (it drops reasoning it never
    renders, re-serialises arguments itself) is not one: the messages agree."""
    if prev is None:
        return None
    held, now = held_messages(prev), held_messages({**call, "response_text": None, "response_tool_calls": None,
                                                    "response_reasoning": None})
    tools = _tools_change(prev.get("tools"), call.get("tools"))
    for i, (a, b) in enumerate(zip(held, now)):
        if not isinstance(a, dict) or not isinstance(b, dict):
            continue
        if tools is not None and not (i == 0 and a.get("role") in ("system", "developer")):
            break   # templates write the tool definitions after the system message, before the rest
        got = _compare(a, b)
        if got is not None:
            return {"habit": got[0], "message": i, "text": got[1]}
    if tools is not None:
        return {"habit": "history_edit", "message": None, "text": tools}
    if len(now) < len(held):
        return {"habit": "history_edit", "message": len(now), "text": f"{len(held) - len(now)} held messages "
                                                                     "not sent"}
    return None
