"""Fields the OpenAI/Anthropic APIs define that this server does not implement (yet): one table.

A client that sets one gets a 400 naming it and saying it is unsupported, never a silent 200 that ignored
it. The request parsers (request.py) call `refuse_unsupported` first. When a feature lands, delete its row
here and parse the field (features.py parses n, logprobs, tool_choice, grammar and the other issue-17 fields).
"""
from __future__ import annotations

from strata_lab.server.errors import RequestError

__all__ = ["UNSUPPORTED", "refuse_unsupported"]

# One row per field: (dialect, field, unsupported(value, body) -> bool, what is not supported).
UNSUPPORTED: tuple = (
    ("completions", "suffix", lambda v, b: v not in (None, ""),
     "suffix (text after the insertion, fill-in-the-middle) is not supported: the models here have no FIM tokens"),
    ("completions", "best_of", lambda v, b: v not in (None, 1),
     "best_of > 1 (server-side candidates ranked by log probability) is not supported: ask for n choices"),
    ("openai", "add_generation_prompt", lambda v, b: v is not None and v is not (not b.get("continue_final_message")),
     "the assistant turn is always opened, except with continue_final_message, which continues it"),
)


def refuse_unsupported(body: dict, dialect: str) -> None:
    """RequestError for the first UNSUPPORTED field `body` sets.

    >>> refuse_unsupported({"add_generation_prompt": False}, "openai")
    Traceback (most recent call last):
    ...
    strata_lab.server.errors.RequestError: add_generation_prompt: is not supported by this server: the assistant turn is always opened, except with continue_final_message, which continues it
    """
    for row_dialect, name, unsupported, why in UNSUPPORTED:
        if row_dialect == dialect and name in body and unsupported(body[name], body):
            raise RequestError(name, f"is not supported by this server: {why}", code="unsupported_parameter")
