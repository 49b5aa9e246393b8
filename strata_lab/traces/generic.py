"""The fallback reader: a JSON or JSON-lines file that holds chat message lists somewhere in its records, in
OpenAI's shape (``role`` / ``content`` / ``tool_calls``), Anthropic's (content blocks: ``tool_use``,
``tool_result``, ``thinking``) or Gemini's (``contents``: ``role`` user/model with ``parts``). Tried last in
detection. The records are the file's lines (JSON lines), the items of a top-level array, or the one object
of a single document; in each, the message lists are found by walking it (`find_lists`), and the path that
holds the most messages in the first records is used for the whole file, or the one `--messages-path` names
(``data.messages``, ``turns[*].messages``; ``[*]`` is every item of an array). Every call is noted with the
path from the file's top: ``messages from lines[*].data.messages (openai)`` (each line of JSON lines),
``[*].messages`` (each item of a top-level array), ``runs[*].chat.messages`` (one document).

A list that ends in an assistant turn is a whole conversation: one call per assistant turn (the prompt is
every message before it, the reply the turn), in a session of its own. A list that ends elsewhere is one
request's prompt: one call, chained into sessions by prefix (`CHAINING_RULE`); usage next to it in the record
(``usage`` / ``usageMetadata``: prompt / input token counts, cached tokens) is kept.

>>> find_lists({"data": {"messages": [{"role": "user", "content": "hi"}]}})
[('data.messages', 'openai', 1)]
>>> find_lists({"turns": [{"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}]})
[('turns[*].contents', 'gemini', 1)]
"""
from __future__ import annotations

import json
from typing import Any, Iterator

from strata_lab.traces.log_calls import SessionChain, new_call
from strata_lab.traces.source import Source

NAME = "generic"
SESSION_KEY = True
MAX_DEPTH = 8        # how deep records are walked for message lists
MAX_FIRST = 20       # records looked at to choose the path
_ROLES = ("system", "developer", "user", "assistant", "tool", "function", "model")
_ANTHROPIC_BLOCKS = ("tool_use", "tool_result", "thinking", "redacted_thinking")


def dialect(value: Any) -> str | None:
    """'openai', 'anthropic' or 'gemini' when `value` is a non-empty list of chat messages in that shape."""
    if not isinstance(value, list) or not value or not all(isinstance(m, dict) for m in value):
        return None
    if all("parts" in m and isinstance(m["parts"], list) and m.get("role", "user") in ("user", "model", "function")
           for m in value):
        return "gemini"
    if not all(m.get("role") in _ROLES and ("content" in m or "tool_calls" in m) for m in value):
        return None
    for m in value:
        content = m.get("content")
        if isinstance(content, list) and any(isinstance(b, dict) and b.get("type") in _ANTHROPIC_BLOCKS
                                             for b in content):
            return "anthropic"
    return "openai"


def find_lists(rec: Any, path: str = "", depth: int = 0) -> list[tuple[str, str, int]]:
    """(path, dialect, messages) for every message list in `rec` (the first item of an array stands for
    all: its path says ``[*]``)."""
    out: list = []
    if depth > MAX_DEPTH:
        return out
    if isinstance(rec, dict):
        for k, v in rec.items():
            sub = f"{path}.{k}" if path else str(k)
            d = dialect(v)
            if d is not None:
                out.append((sub, d, len(v)))
            elif isinstance(v, (dict, list)):
                out.extend(find_lists(v, sub, depth + 1))
    elif isinstance(rec, list):
        for item in rec[:1] if rec and isinstance(rec[0], dict) else ():
            out.extend(find_lists(item, f"{path}[*]", depth + 1))
    return out


def parse_path(path: str | None) -> list[str] | None:
    """A `--messages-path` value as steps (names and ``*``); a clear error for a malformed one.

    >>> parse_path("lines[*].data.messages"), parse_path("turns[*].messages")
    (['data', 'messages'], ['turns', '*', 'messages'])
    """
    if path is None:
        return None
    if not isinstance(path, str) or not path.strip():
        raise ValueError(f"messages_path: {path!r} is not a path like data.messages or turns[*].messages")
    text = path.strip()
    for lead in ("lines[*]", "[*]"):  # how the notes name a JSON-lines file's lines, a top-level array's items
        if text.startswith(lead):
            text = text[len(lead):].lstrip(".")
            break
    steps: list[str] = []
    for part in text.split("."):
        name, star = (part[:-3], True) if part.endswith("[*]") else (part, False)
        if not name and not (star and not steps):
            raise ValueError(f"messages_path: {path!r} is not a path like data.messages or turns[*].messages")
        if name:
            steps.append(name)
        if star:
            steps.append("*")
    if not steps or steps[-1] == "*":
        raise ValueError(f"messages_path: {path!r} must end at the message list's key")
    return steps


def at_path(rec: Any, steps: list[str]) -> Iterator[Any]:
    """Every value at `steps` in `rec` (``*`` walks each item of an array)."""
    if not steps:
        yield rec
        return
    head, rest = steps[0], steps[1:]
    if head == "*":
        for item in rec if isinstance(rec, list) else ():
            yield from at_path(item, rest)
    elif isinstance(rec, dict) and head in rec:
        yield from at_path(rec[head], rest)


def convert(messages: list, kind: str, notes: list) -> list[dict]:
    """A message list of `kind` in the internal (OpenAI) shape, by the reader that owns the dialect."""
    if kind == "gemini":
        from strata_lab.traces.gemini import convert_contents

        return convert_contents(messages, notes)
    if kind == "anthropic":
        from strata_lab.traces.anthropic import convert_messages

        system = [m for m in messages if m.get("role") == "system"]
        return [{"role": "system", "content": m.get("content") if isinstance(m.get("content"), str)
                 else "".join(b.get("text", "") for b in m.get("content") or () if isinstance(b, dict))}
                for m in system] + convert_messages([m for m in messages if m.get("role") != "system"], notes)
    from strata_lab.traces.openai import convert_messages

    return convert_messages([dict(m, role="assistant") if m.get("role") == "model" else m for m in messages], notes)


def layout(src: Source) -> str:
    """How the file's records are laid out, as the notes' paths begin: ``lines[*].`` (JSON lines), ``[*].``
    (a top-level array) or nothing (one JSON document)."""
    head = src.head(4096).lstrip()
    if head.startswith(b"["):
        return "[*]."
    try:
        json.loads(head.split(b"\n", 1)[0].strip())
        return "lines[*]."
    except ValueError:
        return ""


def _records(src: Source) -> Iterator[tuple[int, Any]]:
    head = src.head(4096).lstrip()
    if head.startswith(b"["):
        yield from src.array_items()
        return
    first = head.split(b"\n", 1)[0].strip()
    try:
        json.loads(first)
        lines = True
    except ValueError:
        lines = False
    if lines:
        yield from src.json_lines()
        return
    with open(src.path, "rb") as f:
        try:
            doc = json.loads(f.read())
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"{src.path}: not JSON lines, and not one JSON document ({exc})") from None
    yield 1, doc


def choose(src: Source) -> tuple[list[str], str]:
    """(steps, path as shown) of the message lists the file is read by: `--messages-path`, or the path with
    the most messages over the first records."""
    if getattr(src, "messages_path", None):
        steps = parse_path(src.messages_path)
        return steps, ".".join(s if s != "*" else "[*]" for s in steps).replace(".[*]", "[*]")
    score: dict[str, int] = {}
    for n, (_, rec) in enumerate(_records(src)):
        for path, _, count in find_lists(rec):
            score[path] = score.get(path, 0) + count
        if n + 1 >= MAX_FIRST:
            break
    if not score:
        raise ValueError(f"{src.path}: no OpenAI-, Anthropic- or Gemini-shaped message list in its first "
                         f"{MAX_FIRST} records; `strata-lab import --inspect {src.path}` shows what is in it")
    best = max(score, key=lambda p: (score[p], -len(p)))
    return parse_path(best), best


def _usage(rec: Any) -> dict:
    """Usage next to the message list: the first ``usage`` / ``usageMetadata`` object in the record."""
    if not isinstance(rec, dict):
        return {}
    for key in ("usage", "usageMetadata", "usage_metadata"):
        if isinstance(rec.get(key), dict):
            return rec[key]
    for v in rec.values():
        if isinstance(v, dict):
            got = _usage(v)
            if got:
                return got
    return {}


def _apply_usage(call: dict, u: dict) -> None:
    def num(*keys):
        for k in keys:
            v = u.get(k)
            if isinstance(v, int) and not isinstance(v, bool):
                return v
        return None
    details = u.get("prompt_tokens_details") or u.get("input_tokens_details") or {}
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    read = num("cache_read_input_tokens")
    write = num("cache_creation_input_tokens")
    prompt = num("prompt_tokens", "promptTokenCount")
    if prompt is None and num("input_tokens") is not None:
        # Anthropic counts only what follows the last breakpoint in input_tokens; OpenAI's Responses the whole
        prompt = num("input_tokens") + (read or 0) + (write or 0)
    call["prompt_tokens"] = prompt
    call["completion_tokens"] = num("completion_tokens", "output_tokens", "candidatesTokenCount")
    call["cached_tokens"] = cached if isinstance(cached, int) else read if read is not None else num(
        "cachedContentTokenCount")
    call["cache_read_tokens"] = read
    call["cache_creation_tokens"] = write


def detect(first: dict) -> bool:
    return bool(find_lists(first))


def read(src: Source) -> Iterator[dict]:
    steps, shown = choose(src)
    where_note = f"messages from {layout(src)}{shown}"
    chain = SessionChain(src.stem)
    convs = 0
    for lineno, rec in _records(src):
        lists = [v for v in at_path(rec, steps) if dialect(v) is not None]
        if not lists:
            if any(True for _ in at_path(rec, steps)):
                src.skip(lineno, f"{shown}: not a list of chat messages")
            continue
        for raw in lists:
            kind = dialect(raw)
            notes = [f"{where_note} ({kind})"]
            try:
                msgs = convert(raw, kind, notes)
            except (ValueError, TypeError, AttributeError) as exc:
                src.skip(lineno, f"{shown}: {exc}")
                continue
            if not msgs:
                continue
            key = src.session_of(rec) if src.session_key else None
            if msgs[-1].get("role") == "assistant":  # a whole conversation: one call per assistant turn
                convs += 1
                sid = key or f"{src.stem}-conv-{convs}"
                for i, m in enumerate(msgs):
                    if m.get("role") != "assistant" or not any(x.get("role") not in ("system", "developer")
                                                               for x in msgs[:i]):
                        continue
                    content = m.get("content")
                    yield new_call(format=NAME, fidelity="messages", session=sid, source=src.where(lineno),
                                   messages=msgs[:i], notes=list(notes),
                                   response_text=content if isinstance(content, str) else "".join(
                                       p.get("text", "") for p in content or () if isinstance(p, dict)),
                                   response_reasoning=m.get("reasoning_content"),
                                   response_tool_calls=m.get("tool_calls"))
                continue
            call = new_call(format=NAME, fidelity="messages", source=src.where(lineno), messages=msgs,
                            notes=notes + ["one request's prompt (the list does not end in a reply)"])
            if len(lists) == 1:
                _apply_usage(call, _usage(rec))
            call["session"] = key or chain.session_of_messages(msgs)
            yield call
