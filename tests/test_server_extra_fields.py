"""Server tier, issue 52: a server that ignores nothing.

vLLM's and SGLang's extra fields (what their clients send in `extra_body`) each have an effect: output
constraints (guided_*, structured_outputs, regex, ebnf), token controls (stop_token_ids, min_tokens,
include_stop_str_in_output / no_stop_trim, allowed_token_ids, bad_words, truncate_prompt_tokens), or a 400
naming them. No think block when thinking is off; llama.cpp's text-keyed logit_bias; batch prompts on
/completion; the server's --seed; /v1/embeddings says why it is not served. And every field the generated
table lists is sent with a good value (200) and every refused one with a refused value (a 400 naming it).

One in-process app on the embedded tiny model (no server process): the whole file runs in seconds.
"""
import json
import re

import jsonschema
import pytest
from starlette.testclient import TestClient

from _strata_server import tiny_model
from strata_lab.server.fields import FIELDS, ROUTES, refusals

pytest.importorskip("xgrammar")

USER = [{"role": "user", "content": "hi"}]
OFF = {"chat_template_kwargs": {"enable_thinking": False}}
BASE = {"C": {"messages": USER, "max_tokens": 1}, "M": {"messages": USER, "max_tokens": 1},
        "O": {"prompt": "x", "max_tokens": 1}, "L": {"prompt": "x", "n_predict": 1},
        "R": {"input": "x", "max_output_tokens": 1}, "T": {"content": "x"}, "D": {"tokens": [1]}}


@pytest.fixture(scope="module")
def app_state():
    from strata_lab.server.app import create_app, load_state
    from strata_lab.server.config import ServerConfig

    state = load_state(ServerConfig(model=str(tiny_model()), max_context=512, seed=11, threads=1, grammar_max_string=8,
                                   grammar_max_items=3))
    with TestClient(create_app(state), base_url="http://127.0.0.1:8080") as client:
        yield client, state


@pytest.fixture(scope="module")
def client(app_state):
    return app_state[0]


@pytest.fixture(scope="module")
def tok(app_state):
    return app_state[1].tokenizer


def _ok(client, path, body):
    r = client.post(path, json=body)
    assert r.status_code == 200, (path, body, r.text)
    return r.json()


def _bad(client, path, body, param):
    r = client.post(path, json=body)
    assert r.status_code == 400, (path, body, r.text)
    err = r.json()["error"]
    assert (err.get("param") or "").startswith(param), err
    return err


def _chat(client, extra, *, max_tokens=12, seed=1):
    body = {"messages": USER, "max_tokens": max_tokens, "temperature": 1.0, "seed": seed, **OFF, **extra}
    return _ok(client, "/v1/chat/completions", body)["choices"][0]["message"]


def _gen(client, extra, *, n=8, seed=1, prompt="Hello"):
    """/completion: (content, ids) of a raw completion."""
    r = _ok(client, "/completion", {"prompt": prompt, "n_predict": n, "seed": seed, "temperature": 1.0, **extra})
    return r["content"], r["tokens"]


# --- output constraints ----------------------------------------------------------------------------
@pytest.mark.parametrize("field", ["guided_choice", "structured_outputs"])
def test_choices_constrain_the_output(client, field):
    value = ["red", "green", "blue"]
    extra = {field: value if field == "guided_choice" else {"choice": value}}
    assert _chat(client, extra, max_tokens=4)["content"] in value
    assert _gen(client, extra, seed=2, n=4)[0] in value


@pytest.mark.parametrize("field", ["guided_regex", "regex"])
def test_regexes_constrain_the_output(client, field):
    assert re.fullmatch(r"[0-9]{3}-[a-c]{1,3}", _chat(client, {field: "[0-9]{3}-[a-c]{1,3}"}, max_tokens=10)["content"])
    assert re.fullmatch(r"[0-9]{2}", _gen(client, {field: "[0-9]{2}"}, seed=2, n=3)[0])


@pytest.mark.parametrize("extra", [{"guided_json": {"type": "object", "properties": {"a": {"type": "integer"}},
                                                    "required": ["a"]}},
                                   {"guided_json": '{"type": "object", "properties": {"a": {"type": "integer"}},'
                                                   ' "required": ["a"]}'},
                                   {"json_schema": '{"type": "object", "properties": {"a": {"type": "integer"}},'
                                                   ' "required": ["a"]}'},
                                   {"structured_outputs": {"json": {"type": "object", "properties":
                                                                    {"a": {"type": "integer"}}, "required": ["a"]}}}],
                         ids=["guided_json", "guided_json-text", "sglang-json_schema-text", "structured_outputs"])
def test_schemas_constrain_the_output(client, extra):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    text = _chat(client, extra, max_tokens=60)["content"]
    jsonschema.validate(json.loads(text), schema)


@pytest.mark.parametrize("field", ["ebnf", "guided_grammar"])
def test_ebnf_grammars_constrain_the_output(client, field):
    text = _gen(client, {field: 'root ::= ("yes" | "no") "!"'}, n=8)[0]
    assert text in ("yes!", "no!")


def test_structured_outputs_json_object_and_its_refusals(client):
    json.loads(_chat(client, {"structured_outputs": {"json_object": True}}, max_tokens=80)["content"])
    _bad(client, "/v1/chat/completions", {**BASE["C"], "structured_outputs": {"structural_tag": "x"}},
         "structured_outputs.structural_tag")
    _bad(client, "/v1/chat/completions", {**BASE["C"], "structured_outputs": {"regex": "a", "choice": ["b"]}},
         "structured_outputs")
    _bad(client, "/v1/completions", {**BASE["O"], "guided_regex": "a", "guided_choice": ["b"]}, "guided_choice")
    _bad(client, "/v1/chat/completions", {**BASE["C"], "regex": "(unclosed"}, "regex")


# --- no think block when thinking is off -----------------------------------------------------------
def _accepts(state, req, rendered, text):
    import xgrammar as xgr

    compiled = state.runner.grammars.compiled(req, rendered)
    return xgr.GrammarMatcher(compiled._compiled).accept_string(text)


@pytest.mark.parametrize("dialect, body", [
    ("openai", {"messages": USER, "response_format": {"type": "json_object"}}),
    ("openai", {"messages": USER, "json_schema": {"type": "object"}}),
    ("openai", {"messages": USER, "guided_regex": "[a-z]+"}),
    ("anthropic", {"messages": USER, "max_tokens": 4, "response_format": {"type": "json_object"}})])
def test_the_grammar_admits_a_think_block_only_when_thinking_is_not_off(app_state, dialect, body):
    from strata_lab.server.prompt import render_prompt
    from strata_lab.server.request import parse_anthropic, parse_openai

    _, state = app_state
    parse = parse_openai if dialect == "openai" else parse_anthropic
    off = {"enable_thinking": False} if dialect == "openai" else {"thinking": {"type": "disabled"}}
    think = "<think>\n\n</think>\n\n"
    for extra, admitted in (({}, True), (off, False)):
        req = parse({**body, **extra})
        rendered = render_prompt(state.template, req)
        assert _accepts(state, req, rendered, think) is admitted, extra
        assert _accepts(state, req, rendered, "{" if "regex" not in json.dumps(body) else "a")


def test_thinking_off_reply_is_the_json_alone(client):
    for seed in range(2):
        msg = _chat(client, {"response_format": {"type": "json_object"}}, max_tokens=40, seed=seed)
        assert not msg.get("reasoning_content") and msg["content"].startswith("{"), msg
        json.loads(msg["content"])


# --- token controls --------------------------------------------------------------------------------
def test_stop_token_ids_end_the_output_and_leave_their_text_out(client, tok):
    text, ids = _gen(client, {"temperature": 0}, n=6)
    stop = ids[3]
    cut_text, cut = _gen(client, {"temperature": 0, "stop_token_ids": [stop]}, n=6)
    assert cut == ids[:ids.index(stop) + 1]
    assert cut_text == tok.decode(ids[:ids.index(stop)])
    kept, _ = _gen(client, {"temperature": 0, "stop_token_ids": [stop], "include_stop_str_in_output": True}, n=6)
    assert kept == tok.decode(ids[:ids.index(stop) + 1])
    _bad(client, "/completion", {**BASE["L"], "stop_token_ids": [10**9]}, "stop_token_ids[0]")


@pytest.mark.parametrize("field", ["include_stop_str_in_output", "no_stop_trim"])
def test_stop_sequences_stay_with_include_stop_str(client, field):
    text, _ = _gen(client, {"temperature": 0}, n=8)
    stop = text[len(text) // 2:len(text) // 2 + 2]
    assert stop.strip() and text.index(stop) > 0
    cut = _ok(client, "/v1/completions", {"prompt": "Hello", "max_tokens": 8, "temperature": 0, "stop": [stop]})
    kept = _ok(client, "/v1/completions", {"prompt": "Hello", "max_tokens": 8, "temperature": 0, "stop": [stop],
                                           field: True})
    assert cut["choices"][0]["text"] == text[:text.index(stop)]
    assert kept["choices"][0]["text"] == text[:text.index(stop) + len(stop)]


@pytest.mark.parametrize("field", ["min_tokens", "min_new_tokens"])
def test_allowed_token_ids_and_min_tokens(client, tok, field):
    end = tok.im_end_id
    a = tok.encode("a")[0]
    # the end of turn is the only likely id: without min_tokens the reply ends at once
    bias = {"logit_bias": {str(end): 50}, "temperature": 0, "allowed_token_ids": [end, a]}
    r = _ok(client, "/v1/chat/completions", {"messages": USER, "max_tokens": 10, **OFF, **bias})
    assert r["choices"][0]["message"]["content"] == "" and r["choices"][0]["finish_reason"] == "stop"
    r = _ok(client, "/v1/chat/completions", {"messages": USER, "max_tokens": 10, **OFF, **bias, field: 3})
    assert r["choices"][0]["message"]["content"] == "aaa" and r["choices"][0]["finish_reason"] == "stop"
    # allowed_token_ids alone: only those ids
    _, ids = _gen(client, {"allowed_token_ids": [a, tok.encode("b")[0]]}, n=12)
    assert set(ids) <= {a, tok.encode("b")[0]}


def test_min_tokens_holds_back_stop_sequences(client):
    text, _ = _gen(client, {"temperature": 0}, n=8)
    stop = text[:2]
    cut = _ok(client, "/v1/completions", {"prompt": "Hello", "max_tokens": 8, "temperature": 0, "stop": [stop]})
    assert cut["choices"][0]["text"] == ""
    held = _ok(client, "/v1/completions", {"prompt": "Hello", "max_tokens": 8, "temperature": 0, "stop": [stop],
                                           "min_tokens": 8})
    assert held["choices"][0]["text"] == text


def test_bad_words_are_never_completed(client, tok):
    x, q = tok.encode("x")[0], tok.encode("q")[0]
    assert tok.encode("xq") == [x, q]
    # sampled over {x, q}: this seed's free reply holds "xq"; with the word banned, no seed's does
    free = _gen(client, {"allowed_token_ids": [x, q]}, n=12)[0]
    assert "xq" in free, free
    banned = _gen(client, {"allowed_token_ids": [x, q], "bad_words": ["xq"]}, n=12)[0]
    assert "xq" not in banned and len(banned) == 12
    # a one-id word is banned outright
    assert set(_gen(client, {"allowed_token_ids": [x, q], "bad_words": ["q"]}, n=4)[0]) == {"x"}


def test_truncate_prompt_tokens_keeps_the_last_ids(client):
    ids = list(range(1000, 1020))
    r = _ok(client, "/v1/completions", {"prompt": ids, "max_tokens": 1, "truncate_prompt_tokens": 5, "echo": True})
    assert r["usage"]["prompt_tokens"] == 5
    r = _ok(client, "/v1/chat/completions", {"messages": USER, "max_tokens": 1, "truncate_prompt_tokens": 3})
    assert r["usage"]["prompt_tokens"] == 3
    _bad(client, "/v1/completions", {**BASE["O"], "truncate_prompt_tokens": 0}, "truncate_prompt_tokens")


def test_separate_reasoning_and_responses_n(client):
    _ok(client, "/v1/chat/completions", {**BASE["C"], "separate_reasoning": True})
    err = _bad(client, "/v1/chat/completions", {**BASE["C"], "separate_reasoning": False}, "separate_reasoning")
    assert err["code"] == "unsupported_parameter"
    _ok(client, "/v1/responses", {**BASE["R"], "n": 1})
    assert _bad(client, "/v1/responses", {**BASE["R"], "n": 2}, "n")["code"] == "unsupported_parameter"


def test_responses_read_the_extra_fields(client):
    r = _ok(client, "/v1/responses", {"input": "x", "max_output_tokens": 8, "guided_choice": ["yes", "no"],
                                      "enable_thinking": False})
    texts = [c["text"] for item in r["output"] if item["type"] == "message" for c in item["content"]]
    assert "".join(texts) in ("yes", "no")


# --- llama.cpp: logit_bias by text, batch prompts; --seed; embeddings ---------------------------------
def test_logit_bias_text_keys(client, tok):
    hello = tok.encode(" Hello")[0]
    for bias in ({" Hello": 100}, [[" Hello", 100]]):
        _, ids = _gen(client, {"logit_bias": bias, "temperature": 0}, n=3)
        assert ids == [hello] * 3, bias
    _, ids = _gen(client, {"logit_bias": {" Hello": False, str(hello + 1): 100}, "temperature": 0}, n=2)
    assert ids == [hello + 1] * 2


def test_completion_batch_is_a_list_of_results(client):
    one = _ok(client, "/completion", {"prompt": "Hello", "n_predict": 3, "temperature": 0})
    many = _ok(client, "/completion", {"prompt": ["Hello", [9707, 1879]], "n_predict": 3, "temperature": 0})
    assert isinstance(many, list) and [m["index"] for m in many] == [0, 1]
    assert many[0]["content"] == one["content"] and many[1]["tokens_evaluated"] == 2
    _bad(client, "/completion", {"prompt": ["a", "b"], "stream": True}, "prompt")


def test_server_seed_is_the_default(client):
    a = _ok(client, "/v1/completions", {"prompt": "Hello", "max_tokens": 6})
    b = _ok(client, "/v1/completions", {"prompt": "Hello", "max_tokens": 6})
    assert a["seed"] == b["seed"] == 11 and a["choices"][0]["text"] == b["choices"][0]["text"]
    assert _ok(client, "/v1/completions", {"prompt": "Hello", "max_tokens": 1, "seed": 4})["seed"] == 4


def test_seed_option_is_checked():
    from strata_lab.server.config import ServerConfig

    with pytest.raises(ValueError, match="seed"):
        ServerConfig(seed=-3)


@pytest.mark.parametrize("path", ["/v1/embeddings", "/embeddings", "/embedding"])
def test_embeddings_say_why_they_are_not_served(client, path):
    r = client.post(path, json={"input": "hello"})
    assert r.status_code == 501 and "hidden states" in r.json()["error"]["message"]


# --- every field of the generated table -------------------------------------------------------------
_CONST = {"type": "json_schema", "json_schema": {"name": "one", "schema": {"const": 1}}}
_TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
GOOD = {
    "messages": {"messages": USER}, "system": {"system": "be brief"}, "prompt": {"prompt": ["x", "y"]},
    "input": {"input": "x"}, "instructions": {"instructions": "be brief"}, "assistant_prefix": {"assistant_prefix": "S"},
    "continue_final_message": {"messages": USER + [{"role": "assistant", "content": "S"}],
                               "continue_final_message": True},
    "add_generation_prompt": {"add_generation_prompt": True}, "chat_template_kwargs": OFF,
    "enable_thinking": {"enable_thinking": False}, "thinking": {"thinking": {"type": "disabled"}},
    "thinking_budget": {"thinking_budget": 4}, "reasoning": {"reasoning": {"effort": "none"}}, "model": {"model": "m"},
    "max_tokens": {"max_tokens": 1}, "max_completion_tokens": {"max_completion_tokens": 1},
    "max_output_tokens": {"max_output_tokens": 1}, "n_predict": {"n_predict": 1}, "stop": {"stop": ["zz"]},
    "stop_sequences": {"stop_sequences": ["zz"]}, "temperature": {"temperature": 0.5}, "top_p": {"top_p": 0.9},
    "top_k": {"top_k": 5}, "min_p": {"min_p": 0.1}, "seed": {"seed": 3}, "logit_bias": {"logit_bias": {"15": 1}},
    "frequency_penalty": {"frequency_penalty": 0.5}, "presence_penalty": {"presence_penalty": 0.5},
    "repetition_penalty": {"repetition_penalty": 1.1}, "repeat_penalty": {"repeat_penalty": 1.1},
    "repeat_last_n": {"repeat_last_n": 16}, "ignore_eos": {"ignore_eos": True},
    "n": {"C": {"n": 2}, "O": {"n": 2}, "M": {"n": 1}, "L": {"n": 1}},
    "logprobs": {"C": {"logprobs": True}, "M": {"logprobs": False}, "O": {"logprobs": 2}, "L": {"logprobs": 2}},
    "top_logprobs": {"C": {"logprobs": True, "top_logprobs": 2}},
    "n_probs": {"C": {"n_probs": 2}, "M": {"n_probs": 0}, "O": {"n_probs": 2}, "L": {"n_probs": 2}},
    "prompt_logprobs": {"C": {"prompt_logprobs": 1}},
    "return_tokens": {"L": {"return_tokens": False}}, "echo": {"O": {"echo": True}},
    "return_token_ids": {"C": {"return_token_ids": True}, "O": {"return_token_ids": True}},
    "tools": {"C": {"tools": [_TOOL]}, "R": {"tools": [{"type": "function", "name": "f", "parameters": {}}]},
              "M": {"tools": [{"name": "f", "input_schema": {"type": "object"}}]}},
    "parallel_tool_calls": {"parallel_tool_calls": False},
    "tool_choice": {"C": {"tool_choice": "auto"}, "R": {"tool_choice": "auto"}, "M": {"tool_choice": {"type": "auto"}},
                    "O": {"tool_choice": "auto"}, "L": {"tool_choice": "auto"}},
    "response_format": {"C": {"response_format": _CONST, **OFF, "max_tokens": 2},
                        "M": {"response_format": _CONST, "thinking": {"type": "disabled"}, "max_tokens": 2}}, "text": {"text": {"format": {"type": "text"}}},
    "grammar": {"grammar": 'root ::= "a"'}, "json_schema": {"json_schema": {"type": "object"}},
    "guided_json": {"guided_json": {"type": "object"}}, "guided_regex": {"guided_regex": "[ab]"},
    "guided_choice": {"guided_choice": ["a", "b"]}, "guided_grammar": {"guided_grammar": 'root ::= "a"'},
    "regex": {"regex": "[ab]"}, "ebnf": {"ebnf": 'root ::= "a"'}, "structured_outputs": {"structured_outputs":
                                                                                         {"choice": ["a"]}},
    "stop_token_ids": {"stop_token_ids": [15]}, "min_tokens": {"min_tokens": 1},
    "min_new_tokens": {"min_new_tokens": 1}, "include_stop_str_in_output": {"include_stop_str_in_output": True},
    "no_stop_trim": {"no_stop_trim": True}, "allowed_token_ids": {"allowed_token_ids": [15, 16]},
    "bad_words": {"bad_words": ["zz"]}, "truncate_prompt_tokens": {"truncate_prompt_tokens": 4},
    "separate_reasoning": {"separate_reasoning": True}, "stream": {"stream": True},
    "stream_options": {"stream": True, "stream_options": {"include_usage": True}}, "id_slot": {"id_slot": 0},
    "cache_prompt": {"cache_prompt": False}, "user": {"user": "u"},
    "metadata": {"M": {"metadata": {"user_id": "u"}}, "R": {"metadata": {"k": "v"}}}, "store": {"store": False},
    "content": {"content": "x"}, "add_special": {"add_special": True}, "with_pieces": {"with_pieces": True},
    "tokens": {"tokens": [1]},
}
# the (route, field) pairs the table says the route refuses whatever the value (`does` says so)
REFUSED_HERE = {("M", "top_logprobs"), ("O", "top_logprobs"), ("L", "top_logprobs"), ("M", "prompt_logprobs"),
                ("O", "prompt_logprobs"), ("L", "prompt_logprobs"), ("O", "return_tokens"), ("L", "echo"),
                ("L", "return_token_ids")}


# the base bodies ask for no output (max_tokens 0: the prompt is read, the fields checked and applied)
QUIET = {**BASE, "C": {**BASE["C"], "max_tokens": 0}, "M": {**BASE["M"], "max_tokens": 0},
         "O": {**BASE["O"], "max_tokens": 0}, "L": {**BASE["L"], "n_predict": 0}}


def _good(route, name):
    g = GOOD[name]
    return g.get(route) if set(g) <= set(ROUTES) else g


def test_every_listed_field_has_a_good_value_here():
    missing = [(r, f.name) for f in FIELDS for r in f.routes if f.name != "previous_response_id"
               and (f.name not in GOOD or (_good(r, f.name) is None and (r, f.name) not in REFUSED_HERE))]
    does = {f.name: f.does for f in FIELDS}
    assert not missing and all("refuse" in does[n] for _, n in REFUSED_HERE if n in does)


def test_every_listed_field_is_accepted_with_a_good_value(client):
    held = _ok(client, "/v1/responses", BASE["R"])["id"]  # for previous_response_id
    failed = []
    for f in FIELDS:
        for route in f.routes:
            if f.name == "previous_response_id":
                extra = {"previous_response_id": held}
            elif (route, f.name) in REFUSED_HERE:
                r = client.post(ROUTES[route], json={**BASE[route], f.name: 1})
                if r.status_code != 400 or not r.json()["error"]["param"].startswith(f.name):
                    failed.append((route, f.name, r.status_code))
                continue
            else:
                extra = _good(route, f.name)
            r = client.post(ROUTES[route], json={**QUIET[route], **extra})
            if r.status_code != 200:
                failed.append((route, f.name, r.text[:200]))
    assert not failed, failed


def _refused_value(test, body):
    return next(v for v in (2, True, "x") if test(v, body))


def test_every_refused_field_is_a_400_naming_it(client):
    from strata_lab.server.responses import RESPONSES_REFUSED
    from strata_lab.server.unsupported import UNSUPPORTED

    tests = {name: t for _, name, t, _ in UNSUPPORTED}
    tests.update({name: (lambda t: lambda v, b: t(v))(t) for name, t, _ in RESPONSES_REFUSED})
    sent, failed = 0, []
    for routes, name, _ in refusals():
        if name not in tests:  # the inline rows (conditions, several fields): tests/test_server_fields.py REFUSED
            continue
        for route in routes:
            test = tests[name]
            body = {**BASE[route], name: _refused_value(test, {})}
            r = client.post(ROUTES[route], json=body)
            sent += 1
            err = r.json().get("error", {}) if r.status_code == 400 else {}
            if r.status_code != 400 or not (err.get("param") or "").startswith(name) \
                    or err.get("code") != "unsupported_parameter":
                failed.append((route, name, r.status_code, err))
    assert sent > 100 and not failed, failed
