"""Server tier, issue 31: a streamed response carries what the whole one does, field by field.

For every route and option (logprobs, echo, n, usage, stop, tools, thinking) the same request is sent
whole and streamed; the stream's frames are folded back into the whole body's shape and compared. Each
pair runs on the same slot state: a first copy of the request is sent before, so both find the same held
ids (cached tokens are part of the comparison). Ids (call ids, item ids) and timings are not compared.
Thinking runs without a budget here: where a budget's STOP lands depends on thread timing (the drained
ids; tests/test_server_http.py covers the budget), so two runs of one request may differ there.
"""
import json

import httpx
import pytest

from _strata_server import ServerProcess, tiny_model

CTX = 1024
USER = [{"role": "user", "content": "Complete the sequence: 1, 2, 3,"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
A_TOOLS = [{"name": "get_weather", "input_schema": TOOLS[0]["function"]["parameters"]}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = ServerProcess(tmp_path_factory.mktemp("parity"), "--model", str(tiny_model()), "--ctx", str(CTX)).wait()
    yield srv
    srv.stop()


def _post(server, path, body):
    r = httpx.post(server.url + path, json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _frames(server, path, body):
    """(event name or None, data) of each SSE frame."""
    out, event = [], None
    with httpx.stream("POST", server.url + path, json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and line != "data: [DONE]":
                out.append((event, json.loads(line[6:])))
                event = None
    return out


def _both(server, path, body):
    """(whole, frames) on the same slot state (stream_options goes with the stream only)."""
    plain = {k: v for k, v in body.items() if k != "stream_options"}
    _post(server, path, plain)
    whole = _post(server, path, plain)
    return whole, _frames(server, path, {**body, "stream": True})


# --- OpenAI chat --------------------------------------------------------------------------------------------
def _chat_whole(body):
    out = {"choices": {}, "usage": body.get("usage"), "seed": body.get("seed")}
    for c in body["choices"]:
        m = c["message"]
        out["choices"][c["index"]] = {
            "content": m.get("content") or "", "reasoning": m.get("reasoning_content") or "",
            "calls": [(t["function"]["name"], t["function"]["arguments"]) for t in m.get("tool_calls") or []],
            "finish": c["finish_reason"], "logprobs": (c.get("logprobs") or {}).get("content")}
    return out


def _chat_stream(frames, *, usage: bool):
    out = {"choices": {}, "usage": None, "seed": None}
    for _, f in frames:
        if f.get("usage") is not None:
            out["usage"] = f["usage"]
        if f.get("seed") is not None:
            out["seed"] = f["seed"]
        for c in f["choices"]:
            ch = out["choices"].setdefault(c["index"], {"content": "", "reasoning": "", "calls": [], "finish": None,
                                                        "logprobs": None})
            d = c["delta"]
            ch["content"] += d.get("content") or ""
            ch["reasoning"] += d.get("reasoning_content") or ""
            for t in d.get("tool_calls") or []:
                ch["calls"].append((t["function"]["name"], t["function"]["arguments"]))
            if c.get("finish_reason"):
                ch["finish"] = c["finish_reason"]
            if c.get("logprobs"):
                ch["logprobs"] = (ch["logprobs"] or []) + c["logprobs"]["content"]
    if not usage:
        assert out["usage"] is None
    return out


CHAT_CASES = {
    "plain": {},
    "logprobs": {"logprobs": True, "top_logprobs": 3},
    "n": {"n": 2, "temperature": 1.0},
    "n_logprobs": {"n": 3, "temperature": 1.0, "logprobs": True, "top_logprobs": 2},
    "n_usage": {"n": 2, "temperature": 1.0, "stream_options": {"include_usage": True}},
    "usage": {"stream_options": {"include_usage": True}},
    "stop": {"stop": [" "], "max_tokens": 40},
    "tools": {"tools": TOOLS, "tool_choice": "required", "max_tokens": 80},
    "thinking": {"assistant_prefix": "<think>\n", "enable_thinking": True, "max_tokens": 12},
    "sampler": {"temperature": 1.0, "min_p": 0.05, "frequency_penalty": 0.5, "logit_bias": {"11": 3}},
}


@pytest.mark.parametrize("case", sorted(CHAT_CASES))
def test_chat_stream_equals_whole(server, case):
    body = {"messages": USER, "max_tokens": 10, "temperature": 0, "seed": 5, **CHAT_CASES[case]}
    whole, frames = _both(server, "/v1/chat/completions", body)
    usage = "usage" in case
    got, want = _chat_stream(frames, usage=usage), _chat_whole(whole)
    if not usage:
        want["usage"] = None
    assert got == want
    assert len(want["choices"]) == body.get("n", 1)


# --- Anthropic ----------------------------------------------------------------------------------------------
def _anthropic_stream(frames):
    blocks, stop, usage, seed = [], None, None, None
    for event, f in frames:
        if event == "content_block_start":
            b = dict(f["content_block"])
            b.pop("id", None)
            if b["type"] == "tool_use":
                b["input"] = ""
            blocks.append(b)
        elif event == "content_block_delta":
            d, b = f["delta"], blocks[f["index"]]
            if d["type"] == "text_delta":
                b["text"] += d["text"]
            elif d["type"] == "thinking_delta":
                b["thinking"] += d["thinking"]
            elif d["type"] == "input_json_delta":
                b["input"] += d["partial_json"]
        elif event == "message_delta":
            stop, usage, seed = f["delta"], f["usage"], f.get("seed")
    for b in blocks:
        if b["type"] == "tool_use":
            b["input"] = json.loads(b["input"])
    return {"content": blocks, "stop": stop, "usage": usage, "seed": seed}


def _anthropic_whole(body):
    blocks = [{k: v for k, v in b.items() if k != "id"} for b in body["content"]]
    return {"content": blocks, "stop": {"stop_reason": body["stop_reason"], "stop_sequence": body["stop_sequence"]},
            "usage": body["usage"], "seed": body["seed"]}


ANTHROPIC_CASES = {
    "plain": {},
    "stop": {"stop_sequences": [" "], "max_tokens": 40},
    "tools": {"tools": A_TOOLS, "tool_choice": {"type": "any"}, "max_tokens": 80},
    "thinking": {"thinking": {"type": "enabled"}, "assistant_prefix": "<think>\n", "max_tokens": 12},
}


@pytest.mark.parametrize("case", sorted(ANTHROPIC_CASES))
def test_anthropic_stream_equals_whole(server, case):
    body = {"messages": USER, "max_tokens": 10, "temperature": 0, "seed": 5, **ANTHROPIC_CASES[case]}
    whole, frames = _both(server, "/v1/messages", body)
    assert _anthropic_stream(frames) == _anthropic_whole(whole)


# --- /v1/completions ----------------------------------------------------------------------------------------
def _completion_stream(frames):
    text, finish, usage, seed, lp = "", None, None, None, None
    for _, f in frames:
        usage = f.get("usage", usage)
        seed = f.get("seed", seed)
        for c in f["choices"]:
            text += c["text"]
            finish = c["finish_reason"] or finish
            if c["logprobs"]:
                lp = lp or {k: [] for k in c["logprobs"]}
                for k, v in c["logprobs"].items():
                    lp[k] += v
    return {"text": text, "finish": finish, "logprobs": lp, "usage": usage, "seed": seed}


def _completion_whole(body):
    c = body["choices"][0]
    return {"text": c["text"], "finish": c["finish_reason"], "logprobs": c["logprobs"], "usage": body["usage"],
            "seed": body["seed"]}


COMPLETION_CASES = {
    "plain": {},
    "logprobs": {"logprobs": 2},
    "echo": {"echo": True},
    "echo_logprobs": {"echo": True, "logprobs": 2},
    "usage": {"stream_options": {"include_usage": True}},
    "stop": {"stop": " ", "max_tokens": 40},
    "ids": {"prompt": [9707, 1879, 13], "logprobs": 1},
}


@pytest.mark.parametrize("case", sorted(COMPLETION_CASES))
def test_completions_stream_equals_whole(server, case):
    body = {"prompt": "Count: 1, 2, 3,", "max_tokens": 8, "temperature": 0, "seed": 5, **COMPLETION_CASES[case]}
    whole, frames = _both(server, "/v1/completions", body)
    got, want = _completion_stream(frames), _completion_whole(whole)
    if case != "usage":
        assert got["usage"] is None  # usage is streamed only when asked for (stream_options.include_usage)
        want["usage"] = None
    assert got == want


# --- llama.cpp /completion ----------------------------------------------------------------------------------
@pytest.mark.parametrize("extra", [{}, {"n_probs": 2}, {"stop": [" "], "n_predict": 40}],
                         ids=["plain", "n_probs", "stop"])
def test_llama_completion_stream_equals_whole(server, extra):
    body = {"prompt": "Count: 1, 2, 3,", "n_predict": 8, "temperature": 0, "seed": 5, **extra}
    whole, frames = _both(server, "/completion", body)
    final = frames[-1][1]
    assert final["stop"] is True and all(f["stop"] is False for _, f in frames[:-1])
    assert "".join(f["content"] for _, f in frames) == whole["content"]
    skip = {"content", "timings"}
    assert {k: v for k, v in final.items() if k not in skip} == {k: v for k, v in whole.items() if k not in skip}


# --- /v1/responses ------------------------------------------------------------------------------------------
def _response_items(body):
    items = []
    for item in body["output"]:
        item = {k: v for k, v in item.items() if k not in ("id", "call_id")}
        items.append(item)
    return items


@pytest.mark.parametrize("extra", [{}, {"tools": [{"type": "function", **TOOLS[0]["function"]}],
                                        "tool_choice": "required", "max_output_tokens": 80},
                                   {"enable_thinking": True, "max_output_tokens": 12}],
                         ids=["plain", "tools", "thinking"])
def test_responses_stream_equals_whole(server, extra):
    body = {"input": "Count: 1, 2, 3,", "max_output_tokens": 8, "temperature": 0, "seed": 5, **extra}
    whole, frames = _both(server, "/v1/responses", body)
    final = frames[-1][1]["response"]
    assert frames[-1][0] == "response.completed"
    skip = {"id", "created_at", "timings", "output"}
    assert {k: v for k, v in final.items() if k not in skip} == {k: v for k, v in whole.items() if k not in skip}
    assert _response_items(final) == _response_items(whole)
    done = [f["item"] for e, f in frames if e == "response.output_item.done"]
    assert done == final["output"]  # the items as streamed are the final ones, ids included


def test_completions_stream_through_the_openai_sdk(server):
    import openai

    oa = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    body = dict(model="m", prompt="Count: 1, 2,", max_tokens=6, temperature=0, seed=5, logprobs=2, echo=True)
    oa.completions.create(**body)
    whole = oa.completions.create(**body)
    chunks = list(oa.completions.create(**body, stream=True))
    assert all(c.usage is None for c in chunks)  # no stream_options.include_usage: no usage
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    tokens = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    assert tokens == whole.choices[0].logprobs.tokens and len(tokens) > 6  # the echoed prompt's too
    with_usage = list(oa.completions.create(**body, stream=True, stream_options={"include_usage": True}))
    assert with_usage[-1].choices == [] and with_usage[-1].usage.model_dump() == whole.usage.model_dump()
