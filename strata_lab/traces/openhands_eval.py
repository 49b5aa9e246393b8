"""OpenHands evaluation output (``output.jsonl``): one JSON line per instance, as the benchmarks harness
(github OpenHands/benchmarks ``benchmarks/utils/models.py`` ``EvalOutput``) writes it: ``instance_id``,
``attempt``, ``instruction``, ``metadata`` (``llm.model``), ``history`` (the conversation's events) and
``metrics`` (the SDK's ``Metrics``: ``accumulated_token_usage`` and one ``token_usages`` entry per model call,
with ``response_id``, ``prompt_tokens``, ``completion_tokens``, ``cache_read_tokens``, ``cache_write_tokens``).
One session per instance (``<instance_id>`` or ``<instance_id>/attempt-N``).

V1 (agent SDK) events carry their class in ``kind`` (``openhands-sdk/openhands/sdk/event/``):
``SystemPromptEvent`` (``system_prompt``, ``dynamic_context``, ``tools``), ``MessageEvent`` (``llm_message``,
``llm_response_id`` for the agent's, ``extended_content``), ``ActionEvent`` (``thought``,
``reasoning_content``, ``tool_call`` ``{id, name, arguments}``, ``llm_response_id``), ``ObservationEvent``
(``observation.content``, ``tool_call_id``), ``UserRejectObservation``, ``AgentErrorEvent``, ``Condensation``
(``forgotten_event_ids``, ``summary``, ``summary_offset``). The prompt is the SDK's ``events_to_messages``:
actions of one response are one assistant message with all its tool calls (one call), an agent
``MessageEvent`` is a text reply (one call). Usage: the ``token_usages`` entry with the call's response id.
V0 evaluation output (the same line shape, ``history`` of V0 events) is read with `strata_lab.traces.openhands`.

Lost (noted): tool parameter schemas (``SystemPromptEvent`` keeps each tool's kind and description, not the
schema the model saw), the formatting the SDK gives tool output (``to_llm_content``: the observation's text
parts are taken as they are); ``token_usages`` entries of no event (condenser calls) are summed per file.
"""
from __future__ import annotations

from typing import Iterator

from strata_lab.traces import openhands
from strata_lab.traces.claude_code import parse_ts
from strata_lab.traces.log_calls import new_call, text_parts, tool_call
from strata_lab.traces.source import Source

NAME = "openhands-eval"
_TOOL_RESULTS = ("ObservationEvent", "UserRejectObservation", "AgentErrorEvent")
_SCHEMAS = "tool parameter schemas not in the file"


def detect(first: dict) -> bool:
    return isinstance(first.get("instance_id"), str) and isinstance(first.get("history"), list) \
        and ("metrics" in first or "test_result" in first)


def _parts(content, notes: list) -> list:
    parts = text_parts(content, notes)
    return [{"type": "text", "text": parts}] if isinstance(parts, str) else list(parts or ())


def _join(parts: list) -> str:
    return "".join(p["text"] for p in parts)


def _tools(raw, notes: list) -> list | None:
    out = []
    for t in raw or ():
        if not isinstance(t, dict):
            continue
        if isinstance(t.get("function"), dict):  # already an OpenAI tool (older SDK versions)
            out.append(t)
            continue
        name = t.get("title") or t.get("name") or str(t.get("kind") or "tool")
        out.append({"type": "function", "function": {"name": name, "description": t.get("description", "")}})
        if _SCHEMAS not in notes:
            notes.append(_SCHEMAS)
    return out or None


class _Instance:
    def __init__(self, src: Source, lineno: int, session: str, model, usages: dict):
        self.src, self.lineno, self.session, self.model, self.usages = src, lineno, session, model, usages
        self.history = openhands.History()
        self.tools = None
        self.notes: list = []
        self.has_system = False
        self.batch: list = []  # the ActionEvents of the response being read

    def call(self, rid, ts, reply: dict) -> dict:
        notes = list(self.notes)
        if not self.has_system:
            notes.append(openhands.NO_SYSTEM)
        call = new_call(format=NAME, fidelity="messages", session=self.session, source=self.src.where(self.lineno),
                        ts=parse_ts(ts), model=self.model, messages=self.history.messages(), tools=self.tools,
                        notes=notes, request_id=rid, response_text=reply.get("content") or "",
                        response_reasoning=reply.get("reasoning_content"),
                        response_tool_calls=reply.get("tool_calls"))
        tu = self.usages.pop(rid, None) if rid else None
        if tu is not None:
            openhands.apply_token_usage(call, tu)
        else:
            notes.append("no token_usages entry for this response")
        return call

    def flush(self) -> dict | None:
        """The call of the buffered ActionEvents (one response), its assistant message added to the history."""
        if not self.batch:
            return None
        first = self.batch[0]
        text = _join(_parts(first.get("thought"), self.notes))
        reply = {"role": "assistant", "content": text}
        if isinstance(first.get("reasoning_content"), str) and first["reasoning_content"]:
            reply["reasoning_content"] = first["reasoning_content"]
        calls = []
        for ev in self.batch:
            tc = ev.get("tool_call") if isinstance(ev.get("tool_call"), dict) else {}
            calls.append(tool_call(tc.get("id") or ev.get("tool_call_id"), tc.get("name") or ev.get("tool_name"),
                                   tc.get("arguments")))
        reply["tool_calls"] = calls
        call = self.call(first.get("llm_response_id"), first.get("timestamp"), reply)
        self.history.add(first.get("id"), reply)
        self.batch = []
        return call

    def event(self, ev: dict) -> list[dict]:
        """Read one V1 event; the calls it completes (the buffered response's, its own)."""
        kind = ev.get("kind")
        if kind == "ActionEvent":
            if self.batch and self.batch[0].get("llm_response_id") == ev.get("llm_response_id"):
                self.batch.append(ev)
                return []
            done = self.flush()
            self.batch.append(ev)
            return [done] if done is not None else []
        done = [self.flush(), self._read(kind, ev)]
        return [c for c in done if c is not None]

    def _read(self, kind, ev: dict) -> dict | None:
        eid = ev.get("id")
        if kind == "SystemPromptEvent":
            parts = _parts(ev.get("system_prompt"), self.notes)
            if isinstance(ev.get("dynamic_context"), dict):
                parts += _parts(ev["dynamic_context"], self.notes)
            self.history.add(eid, {"role": "system", "content": _join(parts)})
            self.tools = _tools(ev.get("tools"), self.notes)
            self.has_system = True
        elif kind == "MessageEvent":
            msg = ev.get("llm_message") if isinstance(ev.get("llm_message"), dict) else {}
            parts = _parts(msg.get("content"), self.notes) + _parts(ev.get("extended_content"), self.notes)
            if ev.get("source") == "agent":
                reply = {"role": "assistant", "content": _join(parts)}
                if isinstance(msg.get("reasoning_content"), str) and msg["reasoning_content"]:
                    reply["reasoning_content"] = msg["reasoning_content"]
                call = self.call(ev.get("llm_response_id"), ev.get("timestamp"), reply)
                self.history.add(eid, reply)
                return call
            self.history.add(eid, {"role": msg.get("role") if msg.get("role") in ("user", "system") else "user",
                                   "content": _join(parts)})
        elif kind in _TOOL_RESULTS:
            if kind == "ObservationEvent":
                obs = ev.get("observation") if isinstance(ev.get("observation"), dict) else {}
                text = _join(_parts(obs.get("content"), self.notes) + _parts(ev.get("extended_content"), self.notes))
            elif kind == "UserRejectObservation":
                text = f"Action rejected: {ev.get('rejection_reason', 'User rejected the action')}"
            else:
                text = str(ev.get("error", ""))
            self.history.add(eid, {"role": "tool", "tool_call_id": str(ev.get("tool_call_id") or "call"),
                                   "content": text})
        elif kind == "Condensation":
            self.history.condense(ev)
        return None


def read(src: Source) -> Iterator[dict]:
    unmatched = [0, 0]  # token_usages entries of no event: count, prompt tokens
    for lineno, rec in src.json_lines():
        if not detect(rec):
            src.skip(lineno, "not an evaluation output line (instance_id, history)")
            continue
        session = str(rec["instance_id"])
        if isinstance(rec.get("attempt"), int) and rec["attempt"] > 1:
            session += f"/attempt-{rec['attempt']}"
        history = rec["history"]
        metrics = rec.get("metrics") if isinstance(rec.get("metrics"), dict) else {}
        if history and isinstance(history[0], dict) and "kind" not in history[0] \
                and openhands.detect_event(history[0]):  # V0 evaluation output: V0 events
            for call in openhands.calls_from_events(((lineno, ev) for ev in history), src, session, fmt=NAME):
                yield call
            continue
        usages = {tu["response_id"]: tu for tu in metrics.get("token_usages") or ()
                  if isinstance(tu, dict) and tu.get("response_id")}
        llm = ((rec.get("metadata") or {}).get("llm") or {}) if isinstance(rec.get("metadata"), dict) else {}
        inst = _Instance(src, lineno, session, llm.get("model") if isinstance(llm, dict) else None, usages)
        for i, ev in enumerate(history):
            if not isinstance(ev, dict):
                src.skip(lineno, f"history[{i}]: not an event object")
                continue
            yield from inst.event(ev)
        done = inst.flush()
        if done is not None:
            yield done
        unmatched[0] += len(usages)
        unmatched[1] += sum(tu.get("prompt_tokens") or 0 for tu in usages.values())
    if unmatched[0]:
        src.facts.append(f"{unmatched[0]} token_usages entries match no event (condenser or other LLM calls): "
                         f"{unmatched[1]} prompt tokens not in any call")
