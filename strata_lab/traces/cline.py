"""Cline and Roo Code task folders (``<global storage>/tasks/<task id>/``; layout from cline/cline
``src/core/storage/disk.ts`` (``GlobalFileNames``), ``src/shared/ExtensionMessage.ts`` (``ClineMessage``,
``ClineApiReqInfo``) and ``src/shared/messages/content.ts`` (``ClineStorageMessage``)):

- ``api_conversation_history.json``: a JSON array of Anthropic-shaped messages (``{role, content}``; Cline adds
  ``ts``, ``id``, ``modelInfo`` and, on newer replies, ``metrics.tokens`` {prompt, completion, cached}).
  Each assistant message is one call; its prompt is the messages before it (converted by
  `strata_lab.traces.anthropic.convert_messages`).
- ``ui_messages.json``: a JSON array of ``{ts, type: "say" | "ask", say, text, ...}``; each ``say:
  "api_req_started"`` holds, as JSON text, one request's ``tokensIn``, ``tokensOut``, ``cacheWrites``,
  ``cacheReads``, ``cost``.

Both files of one folder are read together (given both, or the folder): call i of the conversation gets the
usage of the i-th ``api_req_started``, and that message's ``conversationHistoryDeletedRange`` (the messages
Cline left out of the request to fit the context window, both ends included). Either file alone still reads:
the history gives calls without usage (unless ``metrics`` has it), ui_messages length-only calls with usage.

Usage: Cline's ``tokensIn``, ``cacheReads`` and ``cacheWrites`` are disjoint (Anthropic semantics), so the prompt
is their sum. Roo Code's records carry ``apiProtocol`` and write the whole input in ``tokensIn`` (its cost
helpers return ``totalInputTokens``); a Roo ``tokensIn`` smaller than its cache counts is an older Roo's
uncached count and is summed like Cline's (noted). Neither file holds the system prompt nor the tool
definitions (noted on every call).

Roo Code (github RooCodeInc/Roo-Code, ``src/core/condense/index.ts``) condenses and truncates without deleting:
it appends a summary (``isSummary``, ``condenseId``) and tags the earlier messages (``condenseParent``), or a
truncation marker (``isTruncationMarker``, ``truncationId``) and tags the hidden ones (``truncationParent``). A
request holds what its ``getEffectiveApiHistory`` gives: from the last summary on, without the results of tool
calls condensed away and without truncated messages (noted). Its stored encrypted reasoning items (``type:
"reasoning"``, no role) render nothing. The folder's other files (Cline's ``task_metadata.json``, Roo's
``history_item.json``) hold no calls and are passed over with one line.
"""
from __future__ import annotations

import json
import os
import re
from typing import Iterator

from strata_lab.traces.anthropic import convert_messages
from strata_lab.traces.log_calls import new_call
from strata_lab.traces.source import Source

NAME = "cline"
HISTORY = "api_conversation_history.json"
UI = "ui_messages.json"
NOT_LOGGED = "system prompt and tool definitions not in the log"
_EXTRA = {"task_metadata.json": "the files-in-context record", "history_item.json": "the task-list entry (totals)"}
_UI_HEAD = re.compile(rb'^\[\s*\{\s*"ts"\s*:\s*\d+\s*,\s*"type"\s*:\s*"(say|ask)"')
_HISTORY_HEAD = re.compile(rb'^\[\s*\{\s*"role"\s*:\s*"user"\s*,\s*"content"\s*:\s*(\[\s*\{\s*"type"|")')


def detect_head(path: str, head: bytes) -> bool:
    """A task folder's file, by its name or by its first bytes."""
    if os.path.basename(path) in (HISTORY, UI):
        return head.lstrip().startswith(b"[")
    start = head.lstrip()
    return bool(_UI_HEAD.match(start)) or (bool(_HISTORY_HEAD.match(start)) and b'"conversations"' not in start)


def is_ui(src: Source) -> bool:
    return os.path.basename(src.path) == UI or bool(_UI_HEAD.match(src.head(4096).lstrip()))


def companions(paths: list[str], detected: dict) -> dict[str, str]:
    """``{ui_messages path: api_conversation_history path}`` for the task folders among `paths` whose two files
    are both given: the history's reader reads its ui_messages too."""
    hist, ui = {}, {}
    for p in paths:
        if detected.get(p, (None,))[0] != NAME:
            continue
        name = os.path.basename(p)
        if name in (HISTORY, UI):
            (hist if name == HISTORY else ui)[os.path.dirname(os.path.abspath(p))] = p
    return {u: hist[d] for d, u in ui.items() if d in hist}


def folder_extra(path: str) -> str | None:
    """Why a task folder's other file (Cline's ``task_metadata.json``, Roo Code's ``history_item.json``: no model
    calls, read beside the two task files) is passed over; None for any other file."""
    name = os.path.basename(path)
    if name in _EXTRA and os.path.exists(os.path.join(os.path.dirname(os.path.abspath(path)), HISTORY)):
        return f"{_EXTRA[name]} of a Cline / Roo Code task folder (no model calls; {HISTORY} holds them)"
    return None


def _usage(info: dict) -> dict | None:
    """One ``api_req_started`` text: prompt, cache read / write and completion tokens (None without counts)."""
    got = {k: info.get(k) if isinstance(info.get(k), int) and not isinstance(info.get(k), bool) else None
           for k in ("tokensIn", "tokensOut", "cacheWrites", "cacheReads")}
    if got["tokensIn"] is None and got["cacheReads"] is None:
        return None
    t_in, reads, writes = got["tokensIn"] or 0, got["cacheReads"] or 0, got["cacheWrites"] or 0
    note = None
    if "apiProtocol" in info and t_in >= reads + writes:
        prompt = t_in  # Roo Code: tokensIn is the whole input
    else:
        prompt = t_in + reads + writes
        if "apiProtocol" in info:
            note = "Roo Code tokensIn below its cache counts: read as the uncached part (older Roo)"
    return {"prompt_tokens": prompt, "cache_read_tokens": got["cacheReads"], "cached_tokens": got["cacheReads"],
            "cache_creation_tokens": got["cacheWrites"], "completion_tokens": got["tokensOut"], "note": note,
            "cost": info.get("cost"), "cancel": info.get("cancelReason")}


def _requests(src: Source, truncations: dict | None = None) -> Iterator[tuple[int, dict, dict]]:
    """(line, ui message, parsed api_req_started info) for each request in a ui_messages.json; Roo Code's
    ``sliding_window_truncation`` messages go to `truncations` ({truncationId: the request it was made for, the
    one whose api_req_started comes before it})."""
    n = 0
    for lineno, m in src.array_items():
        if not isinstance(m, dict):
            src.skip(lineno, "ui message is not an object")
            continue
        cut = m.get("contextTruncation")
        if truncations is not None and m.get("say") == "sliding_window_truncation" and isinstance(cut, dict):
            truncations[cut.get("truncationId")] = max(n - 1, 0)
        if m.get("type") != "say" or m.get("say") != "api_req_started":
            continue
        try:
            info = json.loads(m.get("text") or "{}")
        except ValueError:
            src.skip(lineno, "api_req_started text is not JSON")
            info = {}
        n += 1
        yield lineno, m, info if isinstance(info, dict) else {}


def _apply(call: dict, usage: dict | None) -> None:
    if usage is None:
        return
    for k in ("prompt_tokens", "cache_read_tokens", "cached_tokens", "cache_creation_tokens", "completion_tokens"):
        call[k] = usage[k]
    if usage["note"]:
        call["notes"].append(usage["note"])


def _read_ui(src: Source) -> Iterator[dict]:
    """ui_messages.json alone: one length-only call per request with usage."""
    task = os.path.basename(os.path.dirname(os.path.abspath(src.path))) or src.stem
    for lineno, m, info in _requests(src):
        usage = _usage(info)
        if usage is None or not usage["prompt_tokens"]:
            why = info.get("cancelReason")
            src.skip(lineno, "api_req_started without token counts" + (f" ({why})" if why else ""))
            continue
        call = new_call(format=NAME, fidelity="lengths", session=task, source=src.where(lineno), ts=_ts(m),
                        notes=[NOT_LOGGED, f"prompt not in the log (pass {HISTORY} too): lengths only"])
        _apply(call, usage)
        call["prompt_len"] = call["prompt_tokens"]
        yield call


_ROO_TAGS = ("condenseParent", "truncationParent", "isSummary", "isTruncationMarker")


def _effective(history: list, notes: list, call: int, truncations: dict) -> list[int]:
    """The indexes of the stored messages Roo Code sends for request `call` (its ``getEffectiveApiHistory``):
    Roo condenses and truncates without deleting; it tags the messages instead. From the last summary
    (``isSummary``) on, when there is one (a condense appends its summary: one present started the conversation
    over); messages whose ``truncationParent`` names a truncation marker in force are left out, and, before any
    summary, those whose ``condenseParent`` names a summary present. A marker is inserted among the messages it
    keeps, before later ones that earlier requests ended with: it is in force from the request its
    ``sliding_window_truncation`` ui message names (`truncations`), or, without ui_messages.json, from its
    position on (noted)."""
    summaries = {m.get("condenseId") for m in history if m.get("isSummary")}
    markers = set()
    for m in history:
        tid = m.get("truncationId") if m.get("isTruncationMarker") else None
        if tid is not None and truncations.get(tid, call) <= call:
            markers.add(tid)
            if tid not in truncations:
                notes.append("when a sliding-window truncation began is not known without ui_messages.json: "
                             "taken from its marker's position")
    start = max((i for i, m in enumerate(history) if m.get("isSummary")), default=0)
    keep = [i for i in range(start, len(history))
            if history[i].get("truncationParent") not in markers
            and not (history[i].get("isTruncationMarker") and history[i].get("truncationId") not in markers)
            and (start or history[i].get("condenseParent") not in summaries - {None})]
    if start:
        notes.append(f"messages 0..{start - 1} condensed into the summary at message {start} (not sent)")
    hidden = sum(1 for m in history[start:] if m.get("truncationParent") in markers)
    if hidden:
        notes.append(f"{hidden} messages hidden by a sliding-window truncation marker")
    return keep


def _ts(m: dict) -> float | None:
    ts = m.get("ts")  # milliseconds
    return ts / 1000.0 if isinstance(ts, (int, float)) and not isinstance(ts, bool) else None


def read(src: Source) -> Iterator[dict]:
    if is_ui(src):
        yield from _read_ui(src)
        return
    task = os.path.basename(os.path.dirname(os.path.abspath(src.path))) or src.stem
    requests = []
    truncations: dict = {}
    for ui in src.companions:
        ui_src = Source(ui)
        requests = [(ui_src.where(n), m, info) for n, m, info in _requests(ui_src, truncations)]
        src.skipped += ui_src.skipped
    history: list = []   # the raw messages so far (the deleted range indexes these)
    converted: list = []  # their conversions, one list per raw message
    tagged = False  # Roo Code's condense / truncation tags seen: the request is the effective history
    calls = 0
    for lineno, m in src.array_items():
        if isinstance(m, dict) and m.get("type") == "reasoning" and "role" not in m:
            continue  # Roo Code's stored encrypted reasoning item (OpenAI native): nothing to render
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            src.skip(lineno, f"messages[{len(history)}].role: must be user or assistant")
            continue
        tagged = tagged or any(k in m for k in _ROO_TAGS)
        notes: list = [NOT_LOGGED]
        if m["role"] == "assistant":
            prompt_idx = _effective(history, notes, calls, truncations) if tagged else range(len(history))
            req = requests[calls] if calls < len(requests) else None
            if req is not None:
                cut = req[1].get("conversationHistoryDeletedRange")
                if isinstance(cut, list) and len(cut) == 2 and all(isinstance(x, int) for x in cut):
                    prompt_idx = [i for i in prompt_idx if not cut[0] <= i <= cut[1]]
                    notes.append(f"messages {cut[0]}..{cut[1]} left out of the request (context window)")
                notes.append(f"usage from {req[0]}")
            prompt = [x for i in prompt_idx for x in converted[i][0]]
            if tagged and any(history[i].get("isSummary") for i in prompt_idx):
                # after a condense, results of tool calls that were condensed away are not sent
                ids = {t.get("id") for x in prompt if x["role"] == "assistant" for t in x.get("tool_calls") or ()}
                prompt = [x for x in prompt if x["role"] != "tool" or x.get("tool_call_id") in ids]
            for i in prompt_idx:
                notes.extend(n for n in converted[i][1] if n not in notes)
            reply = convert_messages([m], notes)[0]
            info = m.get("modelInfo") if isinstance(m.get("modelInfo"), dict) else {}
            call = new_call(format=NAME, fidelity="messages", session=task, source=src.where(lineno),
                            ts=_ts(m),
                            model=info.get("modelId"), request_id=m.get("id"), messages=prompt, notes=notes,
                            response_text=reply["content"] if isinstance(reply["content"], str)
                            else "".join(p["text"] for p in reply["content"]),
                            response_reasoning=reply.get("reasoning_content"),
                            response_tool_calls=reply.get("tool_calls"))
            tokens = (m.get("metrics") or {}).get("tokens") if isinstance(m.get("metrics"), dict) else None
            if req is not None:
                _apply(call, _usage(req[2]))
            elif isinstance(tokens, dict) and isinstance(tokens.get("prompt"), int):
                call.update(prompt_tokens=tokens["prompt"], cached_tokens=tokens.get("cached"),
                            cache_read_tokens=tokens.get("cached"), completion_tokens=tokens.get("completion"))
            calls += 1
            if prompt:
                yield call
            else:
                src.skip(lineno, "assistant message with no conversation before it")
        seen: list = []
        converted.append((convert_messages([m], seen), seen))
        history.append(m)
    if requests and len(requests) != calls:
        src.facts.append(f"{len(requests)} api_req_started in {UI} for {calls} assistant messages: usage paired "
                         "by order")
