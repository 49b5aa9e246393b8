"""Server tier: hypothesis sends hostile strings and hostile JSON schemas to every route; nothing is a 5xx.

Strings include lone surrogates, NULs, control and private-use characters and special-token text; schemas
are random trees of JSON Schema keywords with `$ref`s to URLs, files, pointers and themselves. Streaming
responses must not carry an internal-error frame either. (The OpenAPI-driven schemathesis run is in
test_server_agent.py.)
"""
import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _strata_server import ServerProcess, tiny_model


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = ServerProcess(tmp_path_factory.mktemp("fuzz"), "--model", str(tiny_model()), "--ctx", "512",
                        "--max-tokens-default", "2").wait()
    yield srv
    srv.stop()


_chars = st.characters(blacklist_categories=())  # every code point, lone surrogates included
hostile_text = st.one_of(
    st.text(_chars, max_size=40),
    st.sampled_from(["\ud800", "\udfff", "a\udc80b", "\x00", "<|im_start|>", "<|im_end|>", "<think>", "</think>",
                     "<tool_call>", "{{ 7*7 }}", "{% raw %}", "\u202e", "\ufeff", "💥" * 3, "\\u0000", "%s%n"]),
)
_keywords = st.sampled_from(["type", "properties", "items", "allOf", "anyOf", "oneOf", "not", "$defs",
                             "definitions", "$ref", "$id", "$schema", "pattern", "format", "enum", "const",
                             "required", "additionalProperties", "minLength", "maxItems", "if", "then",
                             "$dynamicRef", "$anchor", "prefixItems", "dependentSchemas"])
_refs = st.sampled_from(["#", "#/", "#/$defs/a", "#/properties/x", "#/definitions/nope", "http://127.0.0.1:9/x",
                         "https://example.com/s.json", "file:///etc/passwd", "file:///nonexistent", "other.json",
                         "urn:x", "#a", "//evil/x", "\ud800", ":", "http://[::1"])
_leaf = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(allow_nan=False, allow_infinity=False),
                  hostile_text, _refs, st.sampled_from(["object", "string", "integer", "array", "null", "(", "[a-"]))
hostile_schema = st.recursive(
    _leaf, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.one_of(_keywords, hostile_text), inner,
                                                                        max_size=4),
    max_leaves=12).map(lambda s: s if isinstance(s, dict) else {"anyOf": [s] if not isinstance(s, list) else s})


def _messages(text):
    return st.sampled_from([
        [{"role": "user", "content": text}],
        [{"role": "system", "content": text}, {"role": "user", "content": "hi"}],
        [{"role": "user", "content": [{"type": "text", "text": text}]}],
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": text}],
    ])


@st.composite
def requests(draw):
    text = draw(hostile_text)
    route = draw(st.sampled_from(["/v1/chat/completions", "/v1/messages", "/tokenize", "/apply-template",
                                  "/detokenize"]))
    if route == "/tokenize":
        return route, {"content": text, "with_pieces": draw(st.booleans())}
    if route == "/detokenize":
        return route, {"tokens": draw(st.lists(st.integers(-3, 160000), max_size=5))}
    body = {"messages": draw(_messages(text)), "max_tokens": draw(st.integers(0, 2)), "temperature": 0,
            "stream": draw(st.booleans())}
    extra = draw(st.sampled_from(["schema", "prefix", "tool", "stop", "model", "none"]))
    if extra == "schema":
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "x", "schema": draw(hostile_schema)}}
    elif extra == "prefix":
        body["assistant_prefix"] = text
    elif extra == "tool":
        tool = {"name": text or "t", "description": text, "parameters": draw(hostile_schema)}
        body["tools"] = [{"type": "function", "function": tool}] if route != "/v1/messages" else \
            [{"name": text or "t", "input_schema": tool["parameters"]}]
    elif extra == "stop":
        body["stop" if route != "/v1/messages" else "stop_sequences"] = [text or "x"]
    elif extra == "model":
        body["model"] = text
    if route == "/apply-template":
        body.pop("stream")
    return route, body


def _check(server, route, body):
    raw = json.dumps(body)  # ensure_ascii: lone surrogates travel as \ud800 escapes, as a hostile client sends
    headers = {"Content-Type": "application/json"}
    with httpx.stream("POST", server.url + route, content=raw, headers=headers, timeout=60) as r:
        text = r.read().decode("utf-8", "replace")
    assert r.status_code < 500, (route, body, r.status_code, text[:500])
    assert "internal_error" not in text and "api_error" not in text, (route, body, text[:500])


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(req=requests())
def test_hostile_requests_never_get_a_5xx(server, req):
    _check(server, *req)


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(schema=hostile_schema, stream=st.booleans())
def test_hostile_schemas_never_get_a_5xx(server, schema, stream):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "stream": stream,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
    _check(server, "/v1/chat/completions", body)


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(raw=st.binary(max_size=200), ctype=st.sampled_from(["application/json", "text/plain", "application/x+json"]))
def test_hostile_bytes_never_get_a_5xx(server, raw, ctype):
    for route in ("/v1/chat/completions", "/v1/messages", "/tokenize"):
        r = httpx.post(server.url + route, content=raw, headers={"Content-Type": ctype}, timeout=30)
        assert r.status_code < 500, (route, raw, r.status_code, r.text[:300])
