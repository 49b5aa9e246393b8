"""Server tier: one real `strata-lab serve` process, real clients (openai, anthropic, httpx)."""
import json
import threading

import anthropic
import httpx
import openai
import pytest

from _strata_server import ServerProcess, tiny_model
from strata_lab.server.generation import WRAP_UP, plain_drained

CTX = 1024
USER = [{"role": "user", "content": "Complete the sequence: 1, 2, 3,"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
T0 = {"temperature": 0}  # the Anthropic SDK takes sampling settings as extra body fields
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = ServerProcess(tmp_path_factory.mktemp("srv"), "--model", str(tiny_model()), "--ctx", str(CTX),
                        "--stop-latency", "2", env={"STRATA_DEBUG": "1"}).wait()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def oa(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def an(server):
    return anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)


def post(server, path, body):
    return httpx.post(server.url + path, json=body, timeout=30)


def chat(server, **body):
    return post(server, "/v1/chat/completions", {"messages": USER, "temperature": 0, **body})


def sse(server, path, body):
    with httpx.stream("POST", server.url + path, json=body, timeout=30) as r:
        assert r.status_code == 200, r.read()
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ") and line != "data: [DONE]"], r


def new_lines(server, before):
    return server.lines()[before:]


def wait_for_lines(server, before, seconds: float = 10.0):
    """The dump lines written since `before`, once there are some (an ended call writes its line)."""
    import time

    deadline = time.monotonic() + seconds
    while not (lines := new_lines(server, before)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return lines


# --- endpoints ----------------------------------------------------------------------------------------
def test_info_endpoints(server, oa):
    assert httpx.get(server.url + "/health").json() == {"status": "ok", "dump_lost_lines": 0}
    assert [m.id for m in oa.models.list()] == [tiny_model().name]
    props = httpx.get(server.url + "/props").json()
    assert props["default_generation_settings"]["n_ctx"] == CTX and props["total_slots"] == 1


def test_tokenize_detokenize_apply_template(server, qwen3):
    ids = post(server, "/tokenize", {"content": "Hello world<|im_end|>"}).json()["tokens"]
    assert ids == qwen3.encode("Hello world<|im_end|>")
    assert post(server, "/detokenize", {"tokens": ids}).json()["content"] == "Hello world<|im_end|>"
    bad = post(server, "/detokenize", {"tokens": [1, 10**9]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens[1]"
    out = post(server, "/apply-template", {"messages": USER, "tools": TOOLS}).json()
    assert out["prompt"].endswith("<|im_start|>assistant\n") and "get_weather" in out["prompt"]
    assert out["ids"] == qwen3.encode(out["prompt"])


# --- both dialects, streaming and not -----------------------------------------------------------------
def test_openai_chat_and_stream_agree(server, oa):
    before = len(server.lines())
    r = oa.chat.completions.create(model="x", messages=USER, max_tokens=6, temperature=0)
    assert r.choices[0].finish_reason in ("length", "stop") and r.usage.completion_tokens <= 6
    assert r.usage.prompt_tokens_details.cached_tokens >= 0
    timings = r.model_extra["timings"]
    assert set(timings) >= {"prompt_n", "cache_n", "predicted_n", "prompt_ms", "predicted_ms"}
    assert timings["prompt_n"] + timings["cache_n"] == r.usage.prompt_tokens
    chunks = list(oa.chat.completions.create(model="x", messages=USER, max_tokens=6, temperature=0, stream=True,
                                             stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices == [] and all(c.usage is None for c in chunks[:-1])
    assert text == r.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    # cached_tokens is the engine's reuse, as recorded (Contract 1 decides how much that is)
    lines = new_lines(server, before)
    assert len(lines) == 2
    assert [r.usage.prompt_tokens_details.cached_tokens, chunks[-1].usage.prompt_tokens_details.cached_tokens] == \
        [line["reused"] for line in lines]


def _stop_case(oa):
    """A greedy answer and a stop sequence from its middle (the first place that text appears)."""
    full = oa.chat.completions.create(model="x", messages=USER, max_tokens=16, temperature=0).choices[0].message
    text = full.content
    assert len(text) >= 8, text
    for start in range(len(text) // 2, len(text) - 3):
        stop = text[start:start + 3]
        if stop.strip() and text.find(stop) == start:
            return text, stop, start
    pytest.skip("no unique 3-character stop sequence in the greedy answer")


def test_stop_sequences_cut_the_output_in_both_dialects(server, oa, an):
    text, stop, at = _stop_case(oa)
    before = len(server.lines())
    r = oa.chat.completions.create(model="x", messages=USER, max_tokens=16, temperature=0, stop=[stop, "\u2603never"])
    assert r.choices[0].message.content == text[:at] and r.choices[0].finish_reason == "stop"
    chunks = list(oa.chat.completions.create(model="x", messages=USER, max_tokens=16, temperature=0, stop=stop,
                                             stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text[:at]
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    lines = new_lines(server, before)
    assert [line["finish"] for line in lines] == ["stop", "stop"]  # the engine was stopped there
    m = an.messages.create(model="x", extra_body=T0, max_tokens=16, messages=USER, stop_sequences=[stop])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop
    assert "".join(b.text for b in m.content if b.type == "text") == text[:at]
    with an.messages.stream(model="x", extra_body=T0, max_tokens=16, messages=USER, stop_sequences=[stop]) as st:
        assert "".join(st.text_stream) == text[:at]
        assert st.get_final_message().stop_reason == "stop_sequence"


@pytest.mark.parametrize("body, field", [({"stop": 5}, "stop"), ({"stop": ["a", ""]}, "stop[1]"),
                                         ({"stop": ["a", "b", "c", "d", "e"]}, "stop")])
def test_bad_stop_is_a_400_naming_the_field(server, body, field):
    r = chat(server, max_tokens=1, **body)
    assert r.status_code == 400 and r.json()["error"]["param"] == field


def test_anthropic_messages_and_stream_agree(server, an):
    m = an.messages.create(model="x", extra_body=T0, max_tokens=6, messages=USER, system="Be brief.")
    assert m.role == "assistant" and m.stop_reason in ("max_tokens", "end_turn")
    text = "".join(b.text for b in m.content if b.type == "text")
    with an.messages.stream(model="x", extra_body=T0, max_tokens=6, messages=USER, system="Be brief.") as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    assert streamed == text and final.usage.output_tokens == m.usage.output_tokens
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == \
        m.usage.input_tokens + m.usage.cache_read_input_tokens
    assert final.usage.cache_read_input_tokens == server.lines()[-1]["reused"]


# --- n_predict (pr-3138) -------------------------------------------------------------------------------
def test_n_predict_zero_is_prompt_only(server):
    before = len(server.lines())
    r = chat(server, n_predict=0).json()
    assert r["choices"][0]["message"]["content"] == "" and r["choices"][0]["finish_reason"] == "length"
    assert r["usage"]["completion_tokens"] == 0
    (line,) = new_lines(server, before)
    assert line["gen_ids"] == [] and len(line["prompt_ids"]) == r["usage"]["prompt_tokens"]


def test_n_predict_zero_streaming(server):
    chunks, _ = sse(server, "/v1/chat/completions", {"messages": USER, "n_predict": 0, "stream": True,
                                                     "stream_options": {"include_usage": True}})
    assert len(chunks) == 3
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[1]["choices"][0]["finish_reason"] == "length" and chunks[2]["usage"]["completion_tokens"] == 0
    assert chunks[2]["choices"] == []
    assert not any(c["choices"][0]["delta"].get("content") for c in chunks[:2])


def test_n_predict_caps_and_loses_to_max_tokens(server):
    r = chat(server, n_predict=3).json()
    assert r["usage"]["completion_tokens"] == 3 and r["choices"][0]["finish_reason"] == "length"
    assert chat(server, max_tokens=2, n_predict=7).json()["usage"]["completion_tokens"] == 2
    assert chat(server, max_completion_tokens=1, n_predict=7).json()["usage"]["completion_tokens"] == 1


def test_n_predict_minus_one_runs_to_the_context(server):
    filler = [{"role": "user", "content": "word " * (CTX - 40)}]
    prompt = len(post(server, "/apply-template", {"messages": filler})["ids"] if False else
                 post(server, "/apply-template", {"messages": filler}).json()["ids"])
    r = post(server, "/v1/chat/completions", {"messages": filler, "n_predict": -1, "temperature": 0}).json()
    gen = r["usage"]["completion_tokens"]
    assert r["choices"][0]["finish_reason"] == "length" and gen == CTX - prompt or \
        r["choices"][0]["finish_reason"] == "stop" and gen <= CTX - prompt


@pytest.mark.parametrize("value", ["0", True, 1.5, [0]])
def test_non_integer_n_predict_never_reaches_the_engine(server, value):
    before = len(server.lines())
    r = chat(server, n_predict=value)
    assert r.status_code == 400 and r.json()["error"]["param"] == "n_predict"
    assert len(server.lines()) == before


# --- assistant prefix (pr-1189) --------------------------------------------------------------------------
def _last_prompt(server, qwen3):
    return qwen3.decode(server.lines()[-1]["prompt_ids"])


def test_no_prefix_none_and_empty_are_the_same(server):
    base = chat(server, max_tokens=4).json()
    for prefix in (None, ""):
        r = chat(server, max_tokens=4, assistant_prefix=prefix).json()
        assert r["usage"]["prompt_tokens"] == base["usage"]["prompt_tokens"]
        assert r["choices"][0]["message"]["content"] == base["choices"][0]["message"]["content"]


@pytest.mark.parametrize("prefix", ["The next number is", "  spaced\t\n", "öğrenci ünlü 日本 🙂", "x",
                                    "a literal </think> tag", "foo<|im_end|>bar", "done<|im_end|>\n",
                                    "long " * 200])
def test_prefix_is_prompt_and_never_echoed(server, qwen3, prefix):
    before = len(server.lines())
    r = chat(server, max_tokens=3, assistant_prefix=prefix).json()
    (line,) = new_lines(server, before)
    prompt = qwen3.decode(line["prompt_ids"])
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n" + prefix)
    assert line["prompt_ids"] == qwen3.encode(prompt)  # tokenized with the whole prompt
    msg = r["choices"][0]["message"]
    assert "reasoning_content" not in msg  # the continuation is content
    assert msg["content"] == qwen3.decode([i for i in line["gen_ids"] if i < qwen3.vocab_size
                                           and i != qwen3.im_end_id])


def test_prefix_streaming_only_new_deltas(server, oa):
    prefix = "The next number is"
    full = oa.chat.completions.create(model="x", messages=USER, max_tokens=5, temperature=0,
                                      extra_body={"assistant_prefix": prefix})
    chunks = list(oa.chat.completions.create(model="x", messages=USER, max_tokens=5, temperature=0, stream=True,
                                             extra_body={"assistant_prefix": prefix}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == full.choices[0].message.content


def test_ecosystem_prefix_spellings_render_the_same_prompt(server, an):
    prefix = "The next number is"
    before = len(server.lines())
    chat(server, max_tokens=1, assistant_prefix=prefix)
    chat(server, max_tokens=1, messages=USER + [{"role": "assistant", "content": prefix}], continue_final_message=True)
    an.messages.create(model="x", extra_body=T0, max_tokens=1, messages=USER + [{"role": "assistant", "content": prefix}])
    an.messages.create(model="x", max_tokens=1, messages=USER, extra_body={"assistant_prefix": prefix, "temperature": 0})
    prompts = [line["prompt_ids"] for line in new_lines(server, before)]
    assert len(prompts) == 4 and all(p == prompts[0] for p in prompts)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
def test_non_string_prefix_is_a_400_before_inference(server, path):
    before = len(server.lines())
    r = post(server, path, {"messages": USER, "max_tokens": 2, "assistant_prefix": 42})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err.get("param") == "assistant_prefix" and "assistant_prefix" in err["message"]
    if path == "/v1/messages":
        assert r.json()["type"] == "error" and err["type"] == "invalid_request_error"
    assert len(server.lines()) == before


def test_prefix_context_accounting_exact_fit_and_one_over(server):
    prefix = "The next number is"
    ids = post(server, "/apply-template", {"messages": USER, "assistant_prefix": prefix}).json()["ids"]
    room = CTX - len(ids)
    ok = chat(server, assistant_prefix=prefix, max_tokens=room)
    assert ok.status_code == 200 and ok.json()["usage"]["prompt_tokens"] == len(ids)
    before = len(server.lines())
    over = chat(server, assistant_prefix=prefix, max_tokens=room + 1)
    assert over.status_code == 400 and over.json()["error"]["code"] == "context_length_exceeded"
    long = chat(server, assistant_prefix="tok " * CTX, max_tokens=1)
    assert long.status_code == 400 and long.json()["error"]["code"] == "context_length_exceeded"
    assert len(server.lines()) == before


def test_debug_trace_counts_prefix_tokens_without_text(server, qwen3):
    prefix = "SECRET-ORBIT-7 identifier is"
    base = post(server, "/apply-template", {"messages": USER, "enable_thinking": False}).json()["ids"]
    r = chat(server, max_tokens=1, assistant_prefix=prefix).json()
    log = server.log_text()
    assert "SECRET" not in log and "Complete the sequence" not in log
    line = [l for l in log.splitlines() if l.startswith("[strata] assistant prefill:")][-1]
    import re

    n, x, z, z2 = map(int, re.match(r"\[strata\] assistant prefill: (\d+) tokens \(prompt (\d+) -> (\d+), "
                                    r"generation starts at position (\d+)\)", line).groups())
    assert z == z2 == x + n == r["usage"]["prompt_tokens"] and x == len(base)


def test_prefix_with_tools_keeps_one_open_assistant_turn(server):
    out = post(server, "/apply-template", {"messages": USER, "tools": TOOLS, "assistant_prefix": "Let me"}).json()
    head = out["prompt"].split("<|im_start|>assistant\n")
    assert len(head) == 2 and "<|im_end|>" not in head[1] and "<tools>" in head[0]


# --- tools ---------------------------------------------------------------------------------------------
def test_openai_tool_call_from_a_prefilled_call(server, oa):
    r = oa.chat.completions.create(model="x", messages=USER, tools=TOOLS, temperature=0,
                                   extra_body={"assistant_prefix": CALL, "n_predict": 0})
    call = r.choices[0].message.tool_calls[0]
    assert r.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    chunks = list(oa.chat.completions.create(model="x", messages=USER, tools=TOOLS, stream=True,
                                             extra_body={"assistant_prefix": CALL, "n_predict": 0}))
    deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert len(deltas) == 1 and deltas[0].function.name == "get_weather" and deltas[0].index == 0
    assert chunks[-1].choices[0].finish_reason == "tool_calls" and chunks[-1].usage is None


def test_anthropic_tool_use_from_a_prefilled_call(server, an):
    tools = [{"name": "get_weather", "input_schema": {"type": "object"}}]
    msgs = USER + [{"role": "assistant", "content": CALL}]
    m = an.messages.create(model="x", max_tokens=0, messages=msgs, tools=tools)
    assert m.stop_reason == "tool_use"
    (block,) = [b for b in m.content if b.type == "tool_use"]
    assert block.name == "get_weather" and block.input == {"city": "Paris"}
    with an.messages.stream(model="x", max_tokens=0, messages=msgs, tools=tools) as s:
        final = s.get_final_message()
    assert [b.type for b in final.content] == ["tool_use"] and final.content[0].input == {"city": "Paris"}


def test_malformed_tool_call_comes_back_as_text(server, an):
    prefix = '<tool_call>\n{"name": "get_weather", "arguments": {"city": '
    r = chat(server, tools=TOOLS, assistant_prefix=prefix, max_tokens=4)
    assert r.status_code == 200
    msg = r.json()["choices"][0]["message"]
    assert not msg.get("tool_calls") and prefix not in (msg["content"] or "")
    m = an.messages.create(model="x", extra_body=T0, max_tokens=4, messages=USER + [{"role": "assistant", "content": prefix}],
                           tools=[{"name": "get_weather", "input_schema": {"type": "object"}}])
    assert all(b.type == "text" for b in m.content)


# --- structured output -----------------------------------------------------------------------------------
SCHEMA = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {
    "type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}}}


def test_structured_output_instruction_and_validation(server, qwen3):
    out = post(server, "/apply-template", {"messages": USER, "response_format": SCHEMA}).json()
    assert "answer" in out["prompt"].split("<|im_start|>user")[0]  # before the turns
    bad = chat(server, response_format=SCHEMA, max_tokens=4)
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "structured_output_failed"
    good = chat(server, response_format=SCHEMA, assistant_prefix='{"answer": 4}', n_predict=0)
    assert good.status_code == 200 and good.json()["choices"][0]["message"]["content"] == ""
    bad2 = chat(server, response_format=SCHEMA, assistant_prefix='{"answer": "four"}', n_predict=0)
    assert bad2.json()["error"]["code"] == "structured_output_failed"


def test_structured_output_failure_in_streams(server, oa, an):
    with pytest.raises(openai.APIError) as info:
        list(oa.chat.completions.create(model="x", messages=USER, max_tokens=3, stream=True, response_format=SCHEMA))
    assert "structured_output_failed" in str(info.value.body) or "schema" in str(info.value)
    chunks, _ = sse(server, "/v1/messages", {"messages": USER, "max_tokens": 3, "stream": True, "response_format": SCHEMA})
    assert chunks[-1]["type"] == "error" and chunks[-1]["error"]["code"] == "structured_output_failed"


# --- reasoning and the thinking budget (pr-1536) --------------------------------------------------------
def _check_budget_lines(qwen3, lines, budget):
    first, second = lines
    assert first["request_id"] == second["request_id"] and (first["call"], second["call"]) == (0, 1)
    assert first["finish"] == "budget" and len(first["gen_ids"]) == budget
    # --stop-latency 2: the server's calls are paced, so the STOP lands two steps after the last id the
    # server read, however busy the machine (test_engine_session.test_paced_stop_counts_from_the_reader)
    assert len(first["drained_ids"]) == 2
    kept = plain_drained(qwen3, first["drained_ids"], [qwen3.im_end_id, qwen3.eos_id], mid_character=False)
    wrap = qwen3.encode(WRAP_UP)
    assert second["prompt_ids"] == first["prompt_ids"] + first["gen_ids"] + kept + wrap
    # the engine reuses everything it holds that the continuation repeats; a dropped drained id leaves
    # the held ids, and a hybrid model then falls back to its last checkpoint (the turn start)
    if kept == first["drained_ids"]:
        assert second["reused"] == len(first["prompt_ids"]) + len(first["gen_ids"]) + len(kept)
    else:
        assert second["reused"] <= len(first["prompt_ids"])
    return kept


def test_thinking_budget_openai(server, qwen3):
    before = len(server.lines())
    r = chat(server, thinking_budget=5, max_tokens=12).json()
    msg = r["choices"][0]["message"]
    assert "Considering the limited time" in msg["reasoning_content"]
    kept = _check_budget_lines(qwen3, new_lines(server, before), 5)
    lines = new_lines(server, before)
    assert r["usage"]["completion_tokens"] == 5 + len(kept) + len(lines[1]["gen_ids"])
    chunks, _ = sse(server, "/v1/chat/completions", {"messages": USER, "thinking_budget": 5, "max_tokens": 12,
                                                     "stream": True, "temperature": 0})
    reasoning = "".join(c["choices"][0]["delta"].get("reasoning_content") or "" for c in chunks)
    assert reasoning == msg["reasoning_content"]


def test_thinking_budget_anthropic(server, an, qwen3):
    before = len(server.lines())
    m = an.messages.create(model="x", extra_body=T0, max_tokens=12, messages=USER,
                           thinking={"type": "enabled", "budget_tokens": 4})
    assert m.content[0].type == "thinking" and "limited time" in m.content[0].thinking
    _check_budget_lines(qwen3, new_lines(server, before), 4)
    with an.messages.stream(model="x", extra_body=T0, max_tokens=12, messages=USER,
                            thinking={"type": "enabled", "budget_tokens": 4}) as s:
        final = s.get_final_message()
    assert final.content[0].type == "thinking" and final.content[0].thinking == m.content[0].thinking


# --- errors, limits ---------------------------------------------------------------------------------------
def test_bad_json_and_body_limit(server):
    json_type = {"Content-Type": "application/json"}
    r = httpx.post(server.url + "/v1/chat/completions", content=b"{not json", timeout=10, headers=json_type)
    assert r.status_code == 400 and r.json()["error"]["param"] == "body"
    r = httpx.post(server.url + "/v1/messages", content=b"x" * (5 * 1024 * 1024), timeout=30, headers=json_type)
    assert r.status_code == 413 and r.json()["type"] == "error"


def test_sdk_errors_name_the_field(oa, an):
    with pytest.raises(openai.BadRequestError) as info:
        oa.chat.completions.create(model="x", messages=USER, temperature=7)
    assert info.value.body["param"] == "temperature"
    with pytest.raises(anthropic.BadRequestError) as info:
        an.messages.create(model="x", max_tokens=5, messages=[{"role": "user", "content": [{"type": "image"}]}])
    assert "messages[0].content[0].type" in str(info.value)


# --- disconnect, concurrency --------------------------------------------------------------------------------
def test_disconnect_mid_stream_stops_and_keeps_drained(server):
    before = len(server.lines())
    with httpx.stream("POST", server.url + "/v1/chat/completions", timeout=30,
                      json={"messages": USER, "n_predict": -1, "stream": True}) as r:
        for n, _ in enumerate(r.iter_lines()):
            if n > 8:
                break
    (line,) = wait_for_lines(server, before)
    # a client leaves at any moment: two late steps after the last id the server read (paced calls)
    assert line["finish"] == "cancelled" and len(line["drained_ids"]) == 2
    assert len(line["gen_ids"]) < CTX - len(line["prompt_ids"])
    # the next request finds prompt + generated + drained ids in the session
    r = chat(server, max_tokens=1, messages=USER)
    assert r.status_code == 200


def test_disconnect_while_waiting_for_a_whole_answer_stops_it(server):
    before = len(server.lines())
    with pytest.raises(httpx.TimeoutException):  # the client gives up before the answer is done
        httpx.post(server.url + "/v1/chat/completions", timeout=0.5, json={"messages": USER, "n_predict": -1})
    (line,) = wait_for_lines(server, before)
    assert line["finish"] == "cancelled"
    assert len(line["gen_ids"]) < CTX - len(line["prompt_ids"])
    assert chat(server, max_tokens=1, messages=USER).status_code == 200


def _error_event(text: str, stream: bool) -> bool:
    """Whether a 200 answer carries an error: an `error` object in the body, or in any SSE data line (an
    Anthropic `event: error` included). Not a substring test: a random-weight model may generate "_strerror"."""
    if not stream:
        return "error" in json.loads(text)
    for line in text.splitlines():
        if line.startswith("event: error"):
            return True
        if line.startswith("data: ") and line != "data: [DONE]":
            event = json.loads(line[len("data: "):])
            if "error" in event or event.get("type") == "error":
                return True
    return False


def test_concurrent_clients_one_dump_line_per_engine_call(server):
    before = len(server.lines())
    errors = []

    def client(k):
        with httpx.Client(timeout=60) as c:
            for j in range(25):
                stream = j % 2 == 1
                if k % 2:
                    body = {"messages": [{"role": "user", "content": f"client {k} req {j}"}], "max_tokens": 2,
                            "stream": stream}
                    path = "/v1/messages"
                else:
                    body = {"messages": [{"role": "user", "content": f"client {k} req {j}"}], "max_tokens": 2,
                            "stream": stream}
                    path = "/v1/chat/completions"
                r = c.post(server.url + path, json=body)
                if r.status_code != 200 or _error_event(r.text, stream):
                    errors.append((k, j, r.status_code, r.text[-1500:]))

    threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    lines = new_lines(server, before)
    assert len(lines) == 200 and len({l["request_id"] for l in lines}) == 200
    assert all(l["finish"] in ("stop", "length") for l in lines)
