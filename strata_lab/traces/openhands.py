"""OpenHands V0 trajectories: the JSON array of events that ``save_trajectory_path`` and the GUI's trajectory
export write (the evaluation harness's ``history``: `strata_lab.traces.openhands_eval`), each event as
``openhands/events/serialization/event.py`` ``event_to_trajectory`` dumps it: ``id``, ``timestamp``, ``source``
(user / agent / environment), ``action`` or ``observation``, ``message``, ``args`` (actions) or ``content`` and
``extras`` (observations), ``tool_call_metadata`` (``openhands/events/tool.py`` ``ToolCallMetadata``:
``function_name``, ``tool_call_id``, ``model_response``: the litellm response, ``total_calls_in_response``) and
``llm_metrics`` (``openhands/llm/metrics.py`` ``Metrics.get()``: ``accumulated_token_usage`` and per-call
``token_usages`` with ``prompt_tokens``, ``completion_tokens``, ``cache_read_tokens``, ``cache_write_tokens``,
``response_id``).

One model call per LLM response: the agent actions sharing a ``model_response.id`` are one call (its reply is
that response's message: text, reasoning, tool calls), and an agent ``message`` action without tool call
metadata is one call (a text-only reply). Its prompt is the conversation so far as OpenHands'
``ConversationMemory`` builds it, in OpenAI chat messages: the ``system`` action (system prompt and tool
definitions), user messages, each response's assistant message, observations with tool call metadata as
``tool`` messages, other observations as user messages, the ``finish`` action as assistant text; a
``condensation`` action drops the events it forgets and puts its summary in their place. Usage per call: the
response's ``usage`` (``prompt_tokens``, ``completion_tokens``, ``prompt_tokens_details.cached_tokens``,
``cache_creation_input_tokens``), else the ``token_usages`` entry with its response id, else the change in
``accumulated_token_usage`` since the previous agent event (noted). Lost (noted per call where it applies): the
system prompt and tools when the file has no ``system`` event; the text OpenHands' templates build for recall
observations (workspace context, microagent knowledge) and the metadata lines it appends to command output.

>>> h = History()
>>> h.add(1, {"role": "user", "content": "a"}); h.add(2, {"role": "user", "content": "b"})
>>> h.condense({"forgotten_event_ids": [1], "summary": "s", "summary_offset": 0}); h.messages()
[{'role': 'user', 'content': 's'}, {'role': 'user', 'content': 'b'}]
"""
from __future__ import annotations

from typing import Iterable, Iterator

from strata_lab.traces.claude_code import parse_ts
from strata_lab.traces.log_calls import image_placeholder, new_call, text_parts, tool_call
from strata_lab.traces.source import Source

NAME = "openhands"
# observations that never reach the model (agent state, no-ops) and actions that are not conversation turns
_NOT_IN_PROMPT = {"agent_state_changed", "null", "recall"}
NO_SYSTEM = "system prompt and tool definitions not in the file (no system event)"


def detect_event(ev) -> bool:
    """A V0 event: ``source`` with an ``action`` or ``observation`` (and an ``id`` or ``timestamp``)."""
    return isinstance(ev, dict) and ev.get("source") in ("user", "agent", "environment") \
        and ("action" in ev or "observation" in ev) and ("id" in ev or "timestamp" in ev)


class History:
    """The conversation as OpenHands keeps it: messages by the event that made them, so that a condensation
    can forget events."""

    def __init__(self):
        self.entries: list[tuple] = []  # (event id, message)

    def add(self, event_id, message: dict) -> None:
        self.entries.append((event_id, message))

    def messages(self) -> list[dict]:
        return [m for _, m in self.entries]

    def condense(self, args: dict) -> None:
        """Forget ``forgotten_event_ids`` (or ``forgotten_events_start_id`` .. ``end_id``); the ``summary``
        goes at ``summary_offset`` (counted in kept messages) as a user message."""
        gone = set(args.get("forgotten_event_ids") or ())
        lo, hi = args.get("forgotten_events_start_id"), args.get("forgotten_events_end_id")
        keep = []
        for eid, m in self.entries:
            in_range = isinstance(lo, int) and isinstance(hi, int) and isinstance(eid, int) and lo <= eid <= hi
            if eid in gone or in_range:
                continue
            keep.append((eid, m))
        summary = args.get("summary")
        if isinstance(summary, str) and summary:
            at = args.get("summary_offset")
            at = at if isinstance(at, int) and 0 <= at <= len(keep) else len(keep)
            keep.insert(at, (None, {"role": "user", "content": summary}))
        self.entries = keep


def apply_token_usage(call: dict, tu: dict) -> None:
    """Usage from an OpenHands ``TokenUsage`` record (V0 ``openhands/llm/metrics.py``, V1
    ``openhands/sdk/llm/utils/metrics.py``: the same field names)."""
    call["prompt_tokens"] = tu.get("prompt_tokens")
    call["completion_tokens"] = tu.get("completion_tokens")
    call["cached_tokens"] = call["cache_read_tokens"] = tu.get("cache_read_tokens")
    call["cache_creation_tokens"] = tu.get("cache_write_tokens")


def _apply_litellm_usage(call: dict, usage: dict) -> None:
    call["prompt_tokens"] = usage.get("prompt_tokens")
    call["completion_tokens"] = usage.get("completion_tokens")
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if cached is None:
        cached = usage.get("cache_read_input_tokens")
    call["cached_tokens"] = call["cache_read_tokens"] = cached
    write = usage.get("cache_creation_input_tokens")
    if write is None:
        write = (usage.get("model_extra") or {}).get("cache_creation_input_tokens")
    call["cache_creation_tokens"] = write


_USAGE_KEYS = ("prompt_tokens", "completion_tokens", "cache_read_tokens", "cache_write_tokens")


def _usage_diff(now: dict, before: dict | None) -> dict:
    before = before or {}
    return {k: now.get(k, 0) - before.get(k, 0) for k in _USAGE_KEYS if isinstance(now.get(k), int)}


def _text(content, notes: list) -> str:
    parts = text_parts(content, notes)
    return parts if isinstance(parts, str) else "".join(p["text"] for p in parts or ())


def _assistant(message: dict, notes: list) -> dict:
    """A litellm response message as an OpenAI chat assistant message."""
    out = {"role": "assistant", "content": _text(message.get("content"), notes) or ""}
    reasoning = message.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:
        out["reasoning_content"] = reasoning
    calls = [tool_call(c.get("id"), (c.get("function") or {}).get("name"), (c.get("function") or {}).get("arguments"))
             for c in message.get("tool_calls") or () if isinstance(c, dict)]
    if calls:
        out["tool_calls"] = calls
    return out


def _user_content(args: dict, notes: list):
    content = args.get("content") or ""
    images = [u for u in args.get("image_urls") or () if u]
    if not images:
        return content
    return [{"type": "text", "text": content}] + [image_placeholder(notes) for _ in images]


def calls_from_events(events: Iterable[tuple[int, object]], src: Source, session: str, *,
                      fmt: str = NAME) -> Iterator[dict]:
    """The calls of one V0 event list: (line number, event) pairs, in order."""
    history = History()
    seen: set = set()     # response ids already read
    tools = None
    has_system = False
    last_acc = None       # accumulated_token_usage at the previous event that carried it
    notes: list = []      # losses seen so far (every later call shares them)
    for lineno, ev in events:
        if not detect_event(ev):
            src.skip(lineno, "not an OpenHands event (source with action or observation)")
            continue
        action, obs, who = ev.get("action"), ev.get("observation"), ev.get("source")
        args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
        meta = ev.get("tool_call_metadata") if isinstance(ev.get("tool_call_metadata"), dict) else None
        metrics = ev.get("llm_metrics") if isinstance(ev.get("llm_metrics"), dict) else {}
        acc = metrics.get("accumulated_token_usage") if isinstance(metrics.get("accumulated_token_usage"),
                                                                  dict) else None
        response = meta.get("model_response") if meta is not None else None
        response = response if isinstance(response, dict) else None
        rid = response.get("id") if response is not None else None
        call = None
        if action == "system":
            history.add(ev.get("id"), {"role": "system", "content": str(args.get("content") or "")})
            tools = [t for t in args.get("tools") or () if isinstance(t, dict)] or None
            has_system = True
        elif action is not None and who == "agent" and response is not None:
            if rid in seen:  # a further action of a response already read (parallel tool calls)
                pass
            else:
                seen.add(rid)
                choices = response.get("choices") or [{}]
                choice = choices[0] if isinstance(choices[0], dict) else {}
                call = _new(ev, lineno, src, session, fmt, history, tools, has_system, notes)
                reply = _assistant(choice.get("message") or {}, call["notes"])
                call.update(response_text=reply["content"], response_reasoning=reply.get("reasoning_content"),
                            response_tool_calls=reply.get("tool_calls"), finish=choice.get("finish_reason"),
                            request_id=rid, model=response.get("model") or call["model"])
                if isinstance(response.get("usage"), dict):
                    _apply_litellm_usage(call, response["usage"])
                else:
                    _usage_elsewhere(call, rid, metrics, acc, last_acc)
                if action == "finish":  # ConversationMemory turns the finish call into assistant text
                    thought = str(args.get("thought") or "")
                    text = reply["content"]
                    if thought and thought != text:
                        text = thought + "\n" + text if text else thought
                    reply = {"role": "assistant", "content": text}
                history.add(ev.get("id"), reply)
        elif action == "message" and who == "agent":  # a text-only reply
            call = _new(ev, lineno, src, session, fmt, history, tools, has_system, notes)
            text = str(args.get("content") or "")
            call["response_text"] = text
            _usage_elsewhere(call, None, metrics, acc, last_acc)
            history.add(ev.get("id"), {"role": "assistant", "content": text})
        elif action == "message":
            history.add(ev.get("id"), {"role": "user", "content": _user_content(args, notes)})
        elif action == "run" and who == "user":
            history.add(ev.get("id"), {"role": "user", "content": f"User executed the command:\n{args.get('command', '')}"})
        elif action == "condensation":
            history.condense(args)
        elif obs is not None and obs not in _NOT_IN_PROMPT:
            text = ev.get("content") if isinstance(ev.get("content"), str) else ""
            if obs == "error":
                text += "\n[Error occurred in processing last action]"
            elif obs == "run" and meta is None:
                text = f"\nObserved result of command executed by user:\n{text}"
            if obs in ("run", "run_ipython") and "command metadata lines not reproduced" not in notes:
                notes.append("command metadata lines not reproduced")
            if meta is not None and meta.get("tool_call_id"):
                history.add(ev.get("id"), {"role": "tool", "tool_call_id": str(meta["tool_call_id"]),
                                           "content": text})
            elif text:
                history.add(ev.get("id"), {"role": "user", "content": text})
        elif obs == "recall" and "recall observations (workspace context, microagents) not rendered" not in notes:
            notes.append("recall observations (workspace context, microagents) not rendered")
        if acc is not None:
            last_acc = acc
        if call is not None:
            yield call


def _new(ev: dict, lineno: int, src: Source, session: str, fmt: str, history: History, tools, has_system: bool,
         notes: list) -> dict:
    call_notes = list(notes)
    if not has_system:
        call_notes.append(NO_SYSTEM)
    model = ((ev.get("llm_metrics") or {}).get("accumulated_token_usage") or {}).get("model")
    model = model if model and model != "default" else None  # (the frontend's metrics copy names no model)
    return new_call(format=fmt, fidelity="messages", session=session, source=src.where(lineno),
                    ts=parse_ts(ev.get("timestamp")), model=model, messages=history.messages(), tools=tools,
                    notes=call_notes)


def _usage_elsewhere(call: dict, rid, metrics: dict, acc: dict | None, last_acc: dict | None) -> None:
    """Usage when the response carries none: its ``token_usages`` entry, else the accumulated difference."""
    for tu in metrics.get("token_usages") or ():
        if isinstance(tu, dict) and rid is not None and tu.get("response_id") == rid:
            apply_token_usage(call, tu)
            return
    if acc is not None:
        apply_token_usage(call, _usage_diff(acc, last_acc))
        call["notes"].append("usage from the change in accumulated_token_usage")
    else:
        call["notes"].append("no usage for this call")


def read(src: Source) -> Iterator[dict]:
    yield from calls_from_events(src.array_items(), src, src.stem)
