"""Request bodies: JSON only, and only text that is text.

JSON may spell a lone UTF-16 surrogate (`"\\ud800"`); Python decodes it into a `str` that no encoder
(tokenizer, template, dump) accepts. Rather than let each of them fail deep inside, every string of every
body (keys too) is checked once at the edge, and the first bad one is a 400 naming its field.

>>> first_bad_string({"messages": [{"role": "user", "content": "ok"}, {"content": "x\\ud800"}]})
'messages[1].content'
>>> first_bad_string({"a": ["fine", {"b": 1}]}) is None
True
>>> check_text({"x\\udc80": 1})
Traceback (most recent call last):
...
strata_lab.server.errors.RequestError: body.x\\udc80: is not valid Unicode text (a lone surrogate); keys must be text too
"""
from __future__ import annotations

import json
from typing import Any

from strata_lab.server.errors import RequestError

__all__ = ["json_body", "json_object", "first_bad_string", "check_text"]


def _bad(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def first_bad_string(value: Any, root: str = "") -> str | None:
    """The path of the first string (or key) in `value` that is not valid Unicode, or None."""
    stack = [(value, root)]
    while stack:  # iterative: nesting depth is the client's choice
        node, path = stack.pop()
        if isinstance(node, str):
            if _bad(node):
                return path or "body"
        elif isinstance(node, dict):
            children = []
            for key, child in node.items():
                sub = f"{path}.{key}" if path else key
                if _bad(key):
                    return "body." + sub if not path else sub
                children.append((child, sub))
            stack.extend(reversed(children))
        elif isinstance(node, list):
            stack.extend(reversed([(child, f"{path}[{i}]") for i, child in enumerate(node)]))
    return None


def check_text(value: Any) -> Any:
    """`value` unchanged, or a RequestError naming the first string that is not valid Unicode."""
    path = first_bad_string(value)
    if path is not None:
        key = path.startswith("body.")
        raise RequestError(path, "is not valid Unicode text (a lone surrogate)" + ("; keys must be text too" if key else ""))
    return value


async def json_body(request) -> Any:
    """The request's JSON value, checked for lone surrogates; a RequestError(body) when it is not JSON."""
    raw = await request.body()
    if not raw:
        raise RequestError("body", "a JSON body is required")
    request.state.body_bytes = len(raw)
    if len(raw) <= 64 * 1024:
        return _parse(raw)
    from starlette.concurrency import run_in_threadpool

    return await run_in_threadpool(_parse, raw)  # a 4 MB body is parsed and checked off the event loop


def _parse(raw: bytes) -> Any:
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise RequestError("body", f"is not valid JSON: {exc}") from None
    return check_text(value)


async def json_object(request) -> dict:
    body = await json_body(request)
    if not isinstance(body, dict):
        raise RequestError("body", "must be a JSON object")
    return body
