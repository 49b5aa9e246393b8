"""ShareGPT-style conversations (``[{"id", "conversations": [{"from": "human"|"gpt"|"system", "value"}]}]``, a
JSON array streamed item by item, or one conversation per line), expanded into one cumulative request per
assistant turn: the prompt is every turn before it, the reply the turn itself.
"""
from __future__ import annotations

from typing import Iterator

from strata_lab.traces.calls import new_call
from strata_lab.traces.source import Source

NAME = "sharegpt"
_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
          "bing": "assistant", "bard": "assistant", "model": "assistant", "system": "system"}


def detect(first: dict) -> bool:
    return isinstance(first.get("conversations"), list)


def expand(conv: dict, src: Source, lineno: int) -> Iterator[dict]:
    turns = conv.get("conversations") if isinstance(conv, dict) else None
    if not isinstance(turns, list):
        src.skip(lineno, "conversation without a 'conversations' list")
        return
    sid = str(conv.get("id") or f"{src.path}:{lineno}")
    messages = []
    for i, t in enumerate(turns):
        role = _ROLES.get(str(t.get("from", t.get("role", ""))).lower()) if isinstance(t, dict) else None
        text = t.get("value", t.get("content")) if isinstance(t, dict) else None
        if role is None or not isinstance(text, str):
            src.skip(lineno, f"conversation {sid!r} turn {i}: unknown speaker or no text")
            return
        if role == "assistant" and messages:
            yield new_call(format=NAME, fidelity="messages", session=sid, source=src.where(lineno),
                           model=conv.get("model"), messages=list(messages), response_text=text)
        messages.append({"role": role, "content": text})


def read(src: Source) -> Iterator[dict]:
    if src.head(4096).lstrip().startswith(b"["):
        items = src.array_items()
    else:
        items = src.json_lines()
    for lineno, conv in items:
        try:
            yield from expand(conv, src, lineno)
        except RecursionError:  # a conversation nested past the stack: skipped, named
            src.skip(lineno, "nested too deeply")
