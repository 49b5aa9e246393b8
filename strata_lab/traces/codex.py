"""Codex CLI rollout JSONL (``~/.codex/sessions/YYYY/MM/DD/rollout-<ts>-<uuid>.jsonl``): ``RolloutLine{timestamp,
type, payload}`` with types ``session_meta``, ``turn_context``, ``response_item``, ``event_msg``, ``compacted``.
A model call's prompt is every item before its outputs (assistant messages, reasoning, tool calls); the
``token_count`` event's ``last_token_usage`` carries ``input_tokens`` and ``cached_input_tokens`` (hosted cache
ground truth; rollouts with only ``total_token_usage`` give the difference from the previous count). Older
rollouts write ``token_count`` after the outputs it measures; newer ones write it when the response completes,
before its output items: a ``token_count`` that arrives with no outputs waiting is held for the outputs that
follow (and a repeated identical one is ignored), so usage, timestamp (the ``token_count``'s) and request id
(the first output item's ``id``) stay with their call. Encrypted reasoning is noted; the tool definitions are
never in a rollout, and the base instructions only in newer ones (both noted per call).
"""
from __future__ import annotations

import json
from typing import Iterator

from strata_lab.traces.log_calls import new_call, text_parts, tool_call
from strata_lab.traces.claude_code import parse_ts
from strata_lab.traces.source import Source

NAME = "codex"
_TYPES = ("session_meta", "response_item", "event_msg", "turn_context", "compacted")
_OUTPUTS = ("reasoning", "function_call", "custom_tool_call", "local_shell_call", "web_search_call")


def detect(first: dict) -> bool:
    return first.get("type") in _TYPES and isinstance(first.get("payload"), dict)


def _text(content, notes) -> str:
    parts = text_parts(content, notes)
    return parts if isinstance(parts, str) else "".join(p["text"] for p in parts or ())


class _Rollout:
    def __init__(self):
        self.session = None
        self.system = None
        self.model = None
        self.history: list[dict] = []
        self.outputs: list[dict] = []  # output items since the last call
        self.first_line = None
        self.first_id = None
        self.notes: list = []
        self.held = None      # (info, ts, line) of a token_count that came before its outputs
        self.before = None    # True once token_count is seen to precede its outputs
        self.last_info = None  # the last token_count's info (duplicates are ignored)

    def add_output(self, item: dict) -> None:
        kind = item.get("type")
        last = self.outputs[-1] if self.outputs else None
        if kind == "message":
            msg = {"role": "assistant", "content": _text(item.get("content"), self.notes)}
            if last is not None and "content" not in last:  # reasoning or tool calls waiting for text
                last.update(msg)
                return
            self.outputs.append(msg)
            return
        if last is None or (last.get("content") and kind == "reasoning") or "tool_calls" in last and kind == "reasoning":
            last = {"role": "assistant"}
            self.outputs.append(last)
        if kind == "reasoning":
            summary = "".join(s.get("text", "") for s in item.get("summary") or () if isinstance(s, dict))
            if summary:
                last["reasoning_content"] = last.get("reasoning_content", "") + summary
            elif item.get("encrypted_content") and "encrypted reasoning" not in self.notes:
                self.notes.append("encrypted reasoning")
        else:
            args = item.get("arguments") if kind == "function_call" else item.get("input") \
                if kind == "custom_tool_call" else item.get("action")
            last.setdefault("tool_calls", []).append(tool_call(item.get("call_id") or item.get("id"),
                                                               item.get("name") or kind, args))


    def reply(self) -> tuple[str, str | None, list | None]:
        """(text, reasoning or None, tool calls or None) of the output items waiting."""
        content = "".join(m.get("content") or "" for m in self.outputs)
        reasoning = "".join(m.get("reasoning_content", "") for m in self.outputs) or None
        calls = [c for m in self.outputs for c in m.get("tool_calls", ())] or None
        return content, reasoning, calls

    def close_outputs(self) -> None:
        """The waiting output items become one assistant message of the history."""
        if not self.outputs:
            return
        content, reasoning, calls = self.reply()
        merged = {"role": "assistant", "content": content}
        if reasoning:
            merged["reasoning_content"] = reasoning
        if calls:
            merged["tool_calls"] = calls
        self.history.append(merged)
        self.outputs = []

    def add_input(self, item: dict) -> None:
        """An item the model reads (a message, a tool call's output) appended to the history."""
        kind = item.get("type")
        if kind == "message":
            role = {"developer": "system"}.get(item.get("role"), item.get("role"))
            self.history.append({"role": role if role in ("system", "user") else "user",
                                 "content": _text(item.get("content"), self.notes)})
        elif kind in ("function_call_output", "custom_tool_call_output", "local_shell_call_output"):
            out = item.get("output")
            if isinstance(out, dict):
                out = out.get("content", json.dumps(out))
            elif isinstance(out, list):  # content parts (input_text, input_image)
                out = _text(out, self.notes)
            self.history.append({"role": "tool", "tool_call_id": str(item.get("call_id") or "call"),
                                 "content": out if isinstance(out, str) else json.dumps(out)})


def is_output(item: dict) -> bool:
    """Whether a Responses item is the model's output (reasoning, assistant text, a tool call)."""
    kind = item.get("type")
    return kind in _OUTPUTS or (kind == "message" and item.get("role") == "assistant")


def convert_items(items: list, notes: list) -> list[dict]:
    """Responses API items (a request's ``input``, a response's ``output``, a rollout's response items) as
    OpenAI chat messages, the conversion `read` applies: consecutive output items merge into one assistant
    message. Items written without ``type`` (``{"role", "content"}``) are messages.

    >>> convert_items([{"role": "user", "content": "hi"},
    ...                {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{}"},
    ...                {"type": "function_call_output", "call_id": "c1", "output": "a.txt"}], [])[1:]
    [{'role': 'assistant', 'content': '', 'tool_calls': [{'type': 'function', 'function': {'name': 'ls', \
'arguments': '{}'}, 'id': 'c1'}]}, {'role': 'tool', 'tool_call_id': 'c1', 'content': 'a.txt'}]
    """
    r = _Rollout()
    r.notes = notes
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise ValueError(f"input[{i}]: must be an object, got {type(item).__name__}")
        if "type" not in item and "role" in item:
            item = dict(item, type="message")
        if is_output(item):
            r.add_output(item)
        else:
            r.close_outputs()
            r.add_input(item)
    r.close_outputs()
    return r.history


def _flush(r: _Rollout, src: Source, lineno: int | None, info: dict | None, ts: float | None = None) -> dict | None:
    if not r.outputs:
        return None
    if info is None and r.held is not None:
        info, ts, _ = r.held
        r.held = None
    notes = list(r.notes)
    if r.system is None:
        notes.append("base instructions (system prompt) not in the log")
    notes.append("tool definitions not in the log")
    content, reasoning, calls = r.reply()
    call = new_call(format=NAME, fidelity="messages", session=r.session, source=src.where(r.first_line),
                    model=r.model, system=r.system, messages=list(r.history), notes=notes, ts=ts,
                    request_id=r.first_id, response_text=content, response_reasoning=reasoning,
                    response_tool_calls=calls)
    if info is None:
        notes.append("no token_count for this call")
    else:
        usage = info.get("last_token_usage") or info.get("_last_from_total") or {}
        call["prompt_tokens"] = usage.get("input_tokens")
        call["cached_tokens"] = usage.get("cached_input_tokens")
        call["completion_tokens"] = usage.get("output_tokens")
    r.close_outputs()
    r.first_line = None
    r.first_id = None
    return call


def read(src: Source) -> Iterator[dict]:
    r = _Rollout()
    for lineno, rec in src.json_lines():
        kind, p = rec.get("type"), rec.get("payload")
        if not isinstance(p, dict):
            src.skip(lineno, "line without a payload object")
            continue
        if kind == "session_meta":
            meta = p.get("meta", p)
            r.session = str(meta.get("id") or r.session or "codex")
            base = meta.get("base_instructions")
            text = base.get("text") if isinstance(base, dict) else base or meta.get("instructions")
            r.system = text if isinstance(text, str) and text else None
        elif kind == "turn_context":
            r.model = p.get("model") or r.model
        elif kind == "compacted":
            done = _flush(r, src, lineno, None)
            if done is not None:
                yield done
            r.history = [{"role": "user", "content": str(p.get("message", ""))}]
        elif kind == "response_item":
            if is_output(p):
                r.first_line = r.first_line or lineno
                r.first_id = r.first_id or (p.get("id") if isinstance(p.get("id"), str) else None)
                r.add_output(p)
                continue
            done = _flush(r, src, lineno, None)
            if done is not None:
                yield done
            r.add_input(p)
        elif kind == "event_msg" and p.get("type") == "token_count" and isinstance(p.get("info"), dict):
            info = p["info"]
            if info == r.last_info:
                continue  # the same count repeated (a turn's end re-sends it)
            prev_total = (r.last_info or {}).get("total_token_usage") or {}
            r.last_info = info
            total = info.get("total_token_usage")
            if not info.get("last_token_usage") and isinstance(total, dict):  # older rollouts: totals only
                info = dict(info, _last_from_total={k: v - prev_total.get(k, 0) for k, v in total.items()
                                                    if isinstance(v, int)})
            ts = parse_ts(rec.get("timestamp"))
            if not r.outputs:  # before the outputs it measures (newer rollouts): hold it for them
                if r.held is not None:  # two counts in a row, no outputs between: the first measured nothing seen
                    src.note(r.held[2], "token_count with no output items after it: its usage is dropped")
                r.held = (info, ts, lineno)
                r.before = True if r.history else r.before
                continue
            if r.before:  # these outputs were measured by the held count; this one is for the next call
                done = _flush(r, src, lineno, None)
                r.held = (info, ts, lineno)
            else:
                done = _flush(r, src, lineno, info, ts)
            if done is not None:
                yield done
    done = _flush(r, src, None, None)
    if done is not None:
        yield done
    if r.held is not None:
        src.note(r.held[2], "token_count with no output items after it: its usage is dropped")
