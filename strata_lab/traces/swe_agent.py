"""SWE-agent trajectories (``<instance_id>.traj``: one JSON object, written with ``json.dumps(indent=2)``).

Layouts (SWE-agent's ``sweagent/types.py`` ``TrajectoryStep`` / ``HistoryItem``, ``sweagent/agent/agents.py``
``get_trajectory_data``):

* 1.1 and later: ``{"trajectory": [step...], "history": [item...], "info", "replay_config", "environment"}``.
  Each step is one model query: ``query`` holds the messages sent (after the history processors: elided
  observations, ``cache_control`` marks), ``response`` the model's text. A call per step with a query; the
  reply's tool calls come from the history item that recorded it (a requeried reply, e.g. a format error, is
  only in the trajectory: its tool calls are not kept, noted). Steps written without a query (an
  autosubmission after an error) are no model calls.
* 1.0: steps hold ``messages`` (the history after the step, not the query): calls are rebuilt from
  ``history`` (one per assistant item that is not a demonstration; the prompt is the agent's items before it),
  so history processors' edits and requeries are not seen (noted).
* 0.x: ``{"environment", "trajectory", "history", "info"}``, history items ``{role, content, agent, thought,
  action}``: as 1.0; each ``agent`` (subroutines) is its own conversation.
* ``RetryAgent`` (``"attempts": [...]``): each attempt read as above, one session per attempt.

Sessions: the instance id (1.x ``replay_config.problem_statement.id``, else the file's stem, which SWE-agent
names after the instance), ``<stem>/attempt-N`` for retry attempts, ``<stem>/<agent>`` for
0.x subroutine agents. ``info.model_stats`` (``tokens_sent``, ``tokens_received``, ``api_calls``,
``instance_cost``) holds totals only: they are reported as facts of the file, not spread over calls.

>>> wire_message({"role": "tool", "content": "ok", "tool_call_ids": ["c1"], "agent": "main"})
{'role': 'tool', 'content': 'ok', 'tool_call_id': 'c1'}
"""
from __future__ import annotations

import bisect
import json
import re
from typing import Iterator

from strata_lab.traces.log_calls import new_call, tool_call
from strata_lab.traces.openai import convert_messages
from strata_lab.traces.source import Source

NAME = "swe-agent"
_FIRST_KEY = re.compile(rb'\A(?:\xef\xbb\xbf)?\s*\{\s*"(trajectory|history|environment|attempts)"\s*:\s*[\["]')
_STEP_KEYS = (b'"action"', b'"observation"', b'"thought"', b'"role"')
_WS = re.compile(r"[ \t\n\r]*")
_LINES = "lines"  # (tuple key in a loaded document: the line numbers of a located array's items)


def detect_head(head: bytes) -> bool:
    """A trajectory object: its first key is one SWE-agent writes first, and steps or history items follow."""
    return _FIRST_KEY.match(head) is not None and any(k in head for k in _STEP_KEYS) and not is_json_lines(head)


def is_json_lines(head: bytes) -> bool:
    """Whether a file that starts with an object holds more than one at the start of a line (JSON lines: a raw
    newline cannot be inside a JSON string, and an indented document starts no other line with ``{``)."""
    return b"\n{" in head.lstrip()


def load_document(src: Source, arrays: tuple[str, ...], nested: tuple[str, ...] = ()) -> dict | None:
    """The file as one JSON object; for each key in `arrays` (at the top level, and inside the objects of the
    arrays named in `nested`) the line number of every item is kept under ``(_LINES, key)``. None (skipped
    with a warning naming the line) when the file is not one JSON object."""
    with open(src.path, "r", encoding="utf-8", errors="replace") as f:
        text = f.read()
    newlines = [m.start() for m in re.finditer("\n", text)]
    decoder = json.JSONDecoder()

    def line_at(pos: int) -> int:
        return bisect.bisect_left(newlines, pos) + 1

    def ws(pos: int) -> int:
        return _WS.match(text, pos).end()

    def obj(pos: int) -> tuple[dict, int]:
        if text[pos] != "{":
            raise ValueError("expected an object")
        out: dict = {}
        pos = ws(pos + 1)
        if text[pos] == "}":
            return out, pos + 1
        while True:
            key, pos = decoder.raw_decode(text, pos)
            pos = ws(pos)
            if text[pos] != ":":
                raise ValueError("expected ':'")
            pos = ws(pos + 1)
            if isinstance(key, str) and (key in arrays or key in nested) and text[pos] == "[":
                items, lines = [], []
                pos = ws(pos + 1)
                if text[pos] == "]":
                    pos += 1
                else:
                    while True:
                        lines.append(line_at(pos))
                        if key in nested and text[pos] == "{":
                            item, pos = obj(pos)
                        else:
                            item, pos = decoder.raw_decode(text, pos)
                        items.append(item)
                        pos = ws(pos)
                        if text[pos] == ",":
                            pos = ws(pos + 1)
                            continue
                        if text[pos] != "]":
                            raise ValueError("expected ',' or ']'")
                        pos += 1
                        break
                out[key] = items
                out[(_LINES, key)] = lines
            else:
                out[key], pos = decoder.raw_decode(text, pos)
            pos = ws(pos)
            if text[pos] == ",":
                pos = ws(pos + 1)
                continue
            if text[pos] != "}":
                raise ValueError("expected ',' or '}'")
            return out, pos + 1

    start = ws(0)
    if text.startswith("\ufeff"):
        start = ws(1)
    try:
        doc, _ = obj(start)
    except json.JSONDecodeError as exc:
        src.skip(exc.lineno, f"not valid JSON ({exc.msg})")
        return None
    except (ValueError, IndexError, RecursionError) as exc:
        src.skip(None, f"not one JSON object ({exc if isinstance(exc, ValueError) else 'cut short or nested too deeply'})")
        return None
    return doc


def lines_of(doc: dict, key: str) -> list[int]:
    return doc.get((_LINES, key)) or [None] * len(doc.get(key) or ())


def wire_message(item: dict) -> dict:
    """A history item (or query message) as SWE-agent's model sends it (``_history_to_messages``): role and
    content; a tool result's first ``tool_call_ids``; an assistant's ``tool_calls`` and thinking blocks."""
    role = item.get("role")
    if role == "tool":
        ids = item.get("tool_call_ids") or [None]
        return {"role": "tool", "content": item.get("content"), "tool_call_id": ids[0]}
    msg = {"role": role, "content": item.get("content")}
    if item.get("tool_calls") is not None:
        msg["tool_calls"] = item["tool_calls"]
    thinking = item.get("thinking_blocks")
    if role == "assistant" and isinstance(thinking, list):
        text = "".join(b.get("thinking", "") for b in thinking if isinstance(b, dict))
        if text:
            msg["reasoning_content"] = text
    return msg


def _has_cache_marks(messages: list) -> bool:
    for m in messages:
        if m.get("cache_control"):
            return True
        content = m.get("content")
        if isinstance(content, list) and any(isinstance(p, dict) and p.get("cache_control") for p in content):
            return True
    return False


def _calls_of(item: dict | None) -> list | None:
    if item is None:
        return None
    calls = [tool_call(c.get("id"), (c.get("function") or {}).get("name"), (c.get("function") or {}).get("arguments"))
             for c in item.get("tool_calls") or () if isinstance(c, dict)]
    return calls or None


def _reasoning_of(item: dict | None) -> str | None:
    if item is None:
        return None
    return wire_message(item).get("reasoning_content")


def _replay_config(attempt: dict) -> dict:
    """1.x's ``replay_config`` (the run's configuration, as JSON text): the model and the instance id."""
    config = attempt.get("replay_config")
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except ValueError:
            return {}
    return config if isinstance(config, dict) else {}


def _model_of(attempt: dict) -> str | None:
    agent = _replay_config(attempt).get("agent")
    model = agent.get("model") if isinstance(agent, dict) else None
    name = model.get("name") if isinstance(model, dict) else None
    return name if isinstance(name, str) else None


def _instance_of(attempt: dict) -> str | None:
    problem = _replay_config(attempt).get("problem_statement")
    iid = problem.get("id") if isinstance(problem, dict) else None
    return iid if isinstance(iid, str) and iid else None


def _is_query(query) -> bool:
    return isinstance(query, list) and any(isinstance(m, dict) and m.get("role") for m in query)


def _from_queries(src: Source, attempt: dict, session: str, model: str | None) -> Iterator[dict]:
    """1.1+: one call per trajectory step with a query."""
    history = [h for h in attempt.get("history") or () if isinstance(h, dict)]
    replies = [h for h in history if h.get("role") == "assistant" and not h.get("is_demo")]
    at = 0
    for lineno, step in zip(lines_of(attempt, "trajectory"), attempt.get("trajectory") or ()):
        if not isinstance(step, dict):
            src.skip(lineno, "trajectory step is not an object")
            continue
        query = step.get("query")
        if not _is_query(query):
            continue  # an autosubmission or an exit written as a step: no model call
        notes: list = []
        response = step.get("response") if isinstance(step.get("response"), str) else ""
        item = None
        for k in range(at, len(replies)):  # the history item that kept this reply (requeries have none)
            if replies[k].get("content") == response and replies[k].get("thought", step.get("thought")) == \
                    step.get("thought"):
                item, at = replies[k], k + 1
                break
        try:
            messages = convert_messages([wire_message(m) for m in query if isinstance(m, dict) and m.get("role")],
                                        notes)
        except ValueError as exc:
            src.skip(lineno, f"query: {exc}")
            continue
        if item is None:
            notes.append("requeried reply: its tool calls are not in the trajectory")
        if any(m.get("tool_calls") for m in messages) or (item is not None and item.get("tool_calls")):
            notes.append("tool definitions not in the trajectory")
        if _has_cache_marks(query):
            notes.append("cache_control marks in the query (not modelled)")
        notes.append("usage per call not in the trajectory (info.model_stats has totals)")
        yield new_call(format=NAME, fidelity="messages", session=session, source=src.where(lineno), model=model,
                       messages=messages, response_text=response, response_tool_calls=_calls_of(item),
                       response_reasoning=_reasoning_of(item), notes=notes)


def _from_history(src: Source, attempt: dict, session: str, model: str | None, why: str) -> Iterator[dict]:
    """1.0 and 0.x: one call per assistant history item; the prompt is the same agent's items before it."""
    items = attempt.get("history") or []
    lines = lines_of(attempt, "history")
    main = None
    seen: dict[str, list] = {}  # agent -> its wire messages so far
    for lineno, item in zip(lines, items):
        if not isinstance(item, dict) or not isinstance(item.get("role"), str):
            src.skip(lineno, "history item without a role")
            continue
        agent = str(item.get("agent") or "main")
        main = main or agent
        before = seen.setdefault(agent, [])
        if item["role"] == "assistant" and not item.get("is_demo"):
            notes = [why, "usage per call not in the trajectory (info.model_stats has totals)"]
            try:
                messages = convert_messages(before, notes)
            except ValueError as exc:
                src.skip(lineno, f"history: {exc}")
                before.append(wire_message(item))
                continue
            if item.get("tool_calls") or any(m.get("tool_calls") for m in messages):
                notes.append("tool definitions not in the trajectory")
            content = item.get("content")
            yield new_call(format=NAME, fidelity="messages", source=src.where(lineno), model=model,
                           session=session if agent == main else f"{session}/{agent}", messages=messages,
                           response_text=content if isinstance(content, str) else "",
                           response_tool_calls=_calls_of(item), response_reasoning=_reasoning_of(item),
                           notes=notes)
        before.append(wire_message(item))


def _read_attempt(src: Source, attempt: dict, session: str) -> Iterator[dict]:
    model = _model_of(attempt)
    steps = [s for s in attempt.get("trajectory") or () if isinstance(s, dict)]
    if any("query" in s for s in steps):
        yield from _from_queries(src, attempt, session, model)
    else:
        why = "prompts rebuilt from history (1.0 writes no query: history processors' edits and requeries " \
              "not seen)" if any("messages" in s for s in steps) or any(
                  isinstance(h, dict) and "message_type" in h for h in attempt.get("history") or ()) \
            else "prompts rebuilt from history (0.x: history processors' edits and requeries not seen)"
        yield from _from_history(src, attempt, session, model, why)


def stats_fact(stats, calls: int, what: str) -> str | None:
    """One line for `Source.facts`: the file's own totals beside the calls read."""
    if not isinstance(stats, dict):
        return None
    parts = []
    for key in ("api_calls", "tokens_sent", "tokens_received", "instance_cost"):
        value = stats.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            parts.append(f"{key} {value:,.4f}" if isinstance(value, float) else f"{key} {value:,}")
    if not parts:
        return None
    text = f"{what}: {', '.join(parts)}; {calls} calls in the file"
    if isinstance(stats.get("api_calls"), int) and stats["api_calls"] != calls:
        text += " (API calls without a recorded reply, such as retries, are not in it)"
    return text


def read(src: Source) -> Iterator[dict]:
    doc = load_document(src, ("trajectory", "history"), nested=("attempts",))
    if doc is None:
        return
    attempts = doc.get("attempts")
    parts = [doc] + ([a for a in attempts if isinstance(a, dict)] if isinstance(attempts, list) else [])
    session = next((iid for iid in map(_instance_of, parts) if iid), None) or src.stem
    count = 0
    if isinstance(attempts, list) and attempts:
        for i, attempt in enumerate(attempts):
            if not isinstance(attempt, dict):
                src.skip(lines_of(doc, "attempts")[i], "attempt is not an object")
                continue
            for call in _read_attempt(src, attempt, f"{session}/attempt-{i}"):
                count += 1
                yield call
    else:
        for call in _read_attempt(src, doc, session):
            count += 1
            yield call
    info = doc.get("info") if isinstance(doc.get("info"), dict) else {}
    fact = stats_fact(info.get("model_stats"), count, "info.model_stats (totals)")
    if fact:
        src.facts.append(fact)
    if not count:
        src.why_none = "a SWE-agent trajectory with no model call (no step with a query, no assistant history item)"
