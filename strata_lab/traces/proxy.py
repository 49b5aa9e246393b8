"""Proxy captures: one ``{"request": {"url", "method", "headers", "body"}, "response": {"status_code", "headers",
"body" | "body_raw"}}`` per line, as claude-trace (``.claude-trace/log-*.jsonl``) and LLM logging proxies write
them. The dialect comes from the URL (``…/chat/completions``: OpenAI; ``…/messages``: Anthropic), else from the
body. ``body`` may be the JSON object or its text; ``body_raw`` is a server-sent-event stream, assembled (usage
only if the stream carried it). Other endpoints (``count_tokens``, ``models``, telemetry) are not model calls and
are passed over; HTTP >= 400 responses are skipped with a warning.
"""
from __future__ import annotations

import json
from typing import Iterator

from strata_lab.traces import anthropic, openai
from strata_lab.traces.log_calls import SessionChain
from strata_lab.traces.claude_code import parse_ts
from strata_lab.traces.dialect import http_error, looks_anthropic
from strata_lab.traces.har import assemble_anthropic, assemble_openai
from strata_lab.traces.openai import reply_message
from strata_lab.traces.source import Source

NAME = "proxy"
SESSION_KEY = True


def detect(first: dict) -> bool:
    req = first.get("request")
    return isinstance(req, dict) and isinstance(req.get("url"), str) and ("body" in req or "body_raw" in req) \
        and isinstance(first.get("response", {}), (dict, type(None)))


def _json_body(value):
    if isinstance(value, (bytes, bytearray)):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        text = value.strip()
        if not text.startswith("{"):
            return value  # an event stream, or text
        return json.loads(text)
    return value


def _dialect(url: str, body: dict):
    path = url.split("?")[0].rstrip("/")
    if path.endswith("/chat/completions"):
        return openai
    if path.endswith("/messages"):
        return anthropic
    if path.endswith(("/count_tokens", "/models", "/responses", "/completions", "/embeddings")) or "/v1/" in path \
            and not isinstance(body, dict):
        return None
    if isinstance(body, dict) and isinstance(body.get("messages"), list):
        return anthropic if looks_anthropic(body) else openai
    return None


def read(src: Source) -> Iterator[dict]:
    chain = SessionChain(src.stem)
    chains: dict = {}
    passed = 0
    for lineno, rec in src.json_lines():
        req, resp = rec.get("request"), rec.get("response")
        if not isinstance(req, dict):
            src.skip(lineno, "line without a request object")
            continue
        url = str(req.get("url", ""))
        try:
            body = _json_body(req.get("body", req.get("body_raw")))
        except json.JSONDecodeError as exc:
            src.skip(lineno, f"{url}: request body is not JSON ({exc.msg})")
            continue
        dialect = _dialect(url, body)
        if dialect is None or not isinstance(body, dict):
            passed += 1
            continue  # other traffic through the proxy
        resp = resp if isinstance(resp, dict) else {}
        status = resp.get("status_code", resp.get("status"))
        if isinstance(status, int) and status >= 400:
            src.skip(lineno, f"{url} answered HTTP {status}: not a model call")
            continue
        streamed = False
        try:
            raw = resp.get("body_raw")
            payload = resp.get("body")
            if isinstance(raw, str) and raw.strip() and not raw.lstrip().startswith("{"):
                streamed = True
                response = assemble_openai(raw) if dialect is openai else assemble_anthropic(raw)
            else:
                response = _json_body(payload if payload is not None else raw)
                if isinstance(response, str):  # an event stream under "body"
                    streamed = True
                    response = assemble_openai(response) if dialect is openai else assemble_anthropic(response)
            refused = http_error(response)
            if refused is not None:
                src.skip(lineno, f"{url}: {refused}: not a model call")
                continue
            call = dialect.from_request(body, response if isinstance(response, dict) else None, fmt=NAME)
        except (json.JSONDecodeError, ValueError, AttributeError, TypeError) as exc:
            src.skip(lineno, f"{url}: {exc}")
            continue
        if streamed:
            call["notes"].append("streamed response")
        if not resp:
            call["notes"].append("no response logged")
        call["source"] = src.where(lineno)
        call["ts"] = parse_ts(req.get("timestamp") or rec.get("timestamp") or rec.get("logged_at"))
        sid = src.session_of(rec) if src.session_key else None
        if sid:
            call["session"] = sid
        elif dialect is anthropic:
            call["session"] = anthropic.session_of(body, rec) or anthropic.chain_session(
                chains, f"{src.stem}-anthropic", call, body)
        else:
            sid = rec.get("session") or rec.get("session_id") or (body.get("metadata") or {}).get("session_id")
            call["session"] = str(sid) if sid else chain.session_of_messages(call["messages"], reply_message(call))
        yield call
    if passed:
        src.facts.append(f"{passed} other requests through the proxy (not chat calls) passed over")
