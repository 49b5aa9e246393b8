"""Which API dialect a logged request speaks (OpenAI chat or Anthropic Messages), and whether a logged response
is a refusal (HTTP >= 400, an error object) rather than a model call. Shared by every reader of request logs.

>>> looks_anthropic({"model": "claude-haiku-4-5", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]})
True
>>> looks_anthropic({"model": "gpt-4.1", "messages": [{"role": "system", "content": "s"}]})
False
>>> http_error({"status_code": 401, "body": {"error": {"message": "bad key"}}})
'answered HTTP 401'
"""
from __future__ import annotations

__all__ = ["looks_anthropic", "has_blocks", "http_error"]

_ANTHROPIC_KEYS = ("system", "anthropic_version", "anthropic_beta", "stop_sequences", "top_k", "thinking")
_OPENAI_KEYS = ("max_completion_tokens", "response_format", "frequency_penalty", "presence_penalty", "logprobs",
                "n", "seed", "stream_options", "parallel_tool_calls", "reasoning_effort")


def looks_anthropic(body: dict, response=None) -> bool:
    """Whether a request body (and its response) is Anthropic Messages rather than OpenAI chat: a body without
    ``system`` is told apart by its other fields, its content blocks, its tools and its response."""
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        return False
    if isinstance(response, dict) and isinstance(response.get("body"), dict):
        response = response["body"]
    if isinstance(response, dict):
        if response.get("type") == "message" or "stop_reason" in response or isinstance(response.get("content"),
                                                                                         list):
            return True
        if "choices" in response or "prompt_tokens" in (response.get("usage") or {}):
            return False
    if any(k in body for k in _ANTHROPIC_KEYS):
        return True
    if any(k in body for k in _OPENAI_KEYS):
        return False
    msgs = body["messages"]
    if any(isinstance(m, dict) and m.get("role") in ("system", "developer", "tool", "function") for m in msgs):
        return False
    if any(isinstance(t, dict) and "input_schema" in t for t in body.get("tools") or ()):
        return True
    if has_blocks(msgs):
        return True
    if isinstance(body.get("cache_control"), dict) or str(body.get("model", "")).startswith("claude"):
        return True
    return isinstance((body.get("metadata") or {}).get("user_id"), str)


def has_blocks(messages) -> bool:  # Anthropic content blocks (tool_use / tool_result) mean the other dialect
    for m in messages[:8]:
        c = m.get("content") if isinstance(m, dict) else None
        if isinstance(c, list) and any(isinstance(p, dict) and p.get("type") in ("tool_use", "tool_result")
                                       for p in c):
            return True
    return False


def http_error(response) -> str | None:
    """Why a logged response is an error (HTTP status >= 400 or an ``error`` object), else None: such a request
    was refused, it is not a model call."""
    if not isinstance(response, dict):
        return None
    status = response.get("status_code", response.get("status"))
    if isinstance(status, int) and not isinstance(status, bool) and status >= 400:
        return f"answered HTTP {status}"
    body = response.get("body") if isinstance(response.get("body"), dict) else response
    err = body.get("error")
    if isinstance(err, dict) or (isinstance(err, str) and err) or body.get("type") == "error":
        detail = err.get("message") or err.get("type") if isinstance(err, dict) else err
        return f"error response ({str(detail)[:80]})" if detail else "error response"
    return None
