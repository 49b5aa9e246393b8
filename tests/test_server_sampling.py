"""Server tier, issue 31: every sampler field a route accepts has its effect, through the real server and SDKs.

Effects, not presence: a +100 bias makes the output that one id; -100 removes the greedy id; a frequency
penalty ends a biased run after a bounded number of repeats, a presence penalty does not; a repetition
penalty keeps an id of the prompt out; min_p 0.999 at T=1 is greedy; no seed is a fresh seed per request.
Also the other probes of the issue: /completion max_tokens, suffix / best_of refused, json_object schema,
batches of prompts, forced tool calls without a thought.
"""
import json

import anthropic
import httpx
import openai
import pytest

from _strata_server import ServerProcess, tiny_model

CTX = 1024
HELLO = 23811          # " hello": one plain ASCII id (qwen3)
USER = [{"role": "user", "content": "Complete the sequence: 1, 2, 3,"}]
T0 = {"temperature": 0}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = ServerProcess(tmp_path_factory.mktemp("sampling"), "--model", str(tiny_model()), "--ctx", str(CTX)).wait()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def oa(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def an(server):
    return anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)


def post(server, path, body):
    r = httpx.post(server.url + path, json=body, timeout=60)
    return r


def llama_ids(server, **body):
    r = post(server, "/completion", {"prompt": "Count: 1, 2, 3,", "temperature": 0, **body})
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


# --- logit_bias: all routes, both shapes ------------------------------------------------------------------
def test_plus_100_bias_makes_every_route_write_that_id(server, oa, an, qwen3):
    want = qwen3.decode([HELLO] * 5)
    bias = {str(HELLO): 100}
    chat = oa.chat.completions.create(model="m", messages=USER, max_tokens=5, logit_bias=bias, **T0)
    assert chat.choices[0].message.content == want
    comp = oa.completions.create(model="m", prompt="Count:", max_tokens=5, logit_bias=bias, **T0)
    assert comp.choices[0].text == want
    msg = an.messages.create(model="m", max_tokens=5, messages=USER, extra_body={"logit_bias": bias, **T0})
    assert msg.content[0].text == want
    resp = oa.responses.create(model="m", input="Count:", max_output_tokens=5, temperature=0,
                               extra_body={"logit_bias": bias})
    assert resp.output_text == want
    assert llama_ids(server, n_predict=5, logit_bias=[[HELLO, 100]]) == [HELLO] * 5   # llama.cpp's pair shape
    assert llama_ids(server, n_predict=5, logit_bias=[[" hello", 100]]) == [HELLO] * 5  # a text key


def test_minus_100_bias_removes_the_greedy_id(server, oa, qwen3):
    ids = llama_ids(server, n_predict=4)
    for shape in ({str(ids[0]): -100}, [[ids[0], -100]], [[ids[0], False]]):
        banned = llama_ids(server, n_predict=4, logit_bias=shape)
        assert ids[0] not in banned and banned != ids
    # chat: the greedy first id of the rendered prompt (read as ids through /completion) is gone with -100
    prompt = post(server, "/apply-template", {"messages": USER}).json()["ids"]
    first = post(server, "/completion", {"prompt": prompt, "n_predict": 1, "temperature": 0}).json()["tokens"][0]
    plain = oa.chat.completions.create(model="m", messages=USER, max_tokens=1, logprobs=True, **T0)
    assert bytes(plain.choices[0].logprobs.content[0].bytes) == qwen3.token_bytes(first)
    banned = oa.chat.completions.create(model="m", messages=USER, max_tokens=1, logprobs=True,
                                        logit_bias={str(first): -100}, **T0)
    assert bytes(banned.choices[0].logprobs.content[0].bytes) != qwen3.token_bytes(first)


@pytest.mark.parametrize("bias, field", [({"x": "big"}, "logit_bias.x"), ({"5": 101}, "logit_bias.5"),
                                         ([[5]], "logit_bias[0]"), ({"999999999": 1}, "logit_bias"),
                                         ("5", "logit_bias")])
def test_bad_logit_bias_is_a_400_naming_it(server, bias, field):
    before = len(server.lines())
    for path in ("/v1/chat/completions", "/completion"):
        r = post(server, path, {"messages": USER, "prompt": "x", "max_tokens": 1, "logit_bias": bias})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == field, r.text
    assert len(server.lines()) == before


# --- penalties ----------------------------------------------------------------------------------------------
def _run_length(ids, x):
    n = 0
    while n < len(ids) and ids[n] == x:
        n += 1
    return n


def test_frequency_penalty_ends_a_biased_run_presence_penalty_does_not(server, oa, qwen3):
    base = {"max_tokens": 40, "logit_bias": {str(HELLO): 50}, **T0}
    plain = oa.completions.create(model="m", prompt="Count:", **base).choices[0].text
    assert plain == qwen3.decode([HELLO] * 40)
    ids = llama_ids(server, n_predict=40, logit_bias={str(HELLO): 50}, frequency_penalty=2.0)
    # logit + 50 - 2 * count falls below the rest (raw logits of the tiny model lie within about +-5)
    assert 15 <= _run_length(ids, HELLO) <= 30 and ids != [HELLO] * 40
    chat = oa.chat.completions.create(model="m", messages=USER, frequency_penalty=2.0, **base)
    assert chat.choices[0].message.content != qwen3.decode([HELLO] * 40)
    assert llama_ids(server, n_predict=40, logit_bias={str(HELLO): 50}, presence_penalty=2.0) == [HELLO] * 40
    assert llama_ids(server, n_predict=40, logit_bias={str(HELLO): 50}, presence_penalty=-2.0) == [HELLO] * 40


def test_repetition_penalty_keeps_a_prompt_id_out(server, oa, qwen3):
    prompt = qwen3.encode("Count: hello 1, 2, 3,")
    assert HELLO in prompt
    body = {"prompt": prompt, "n_predict": 12, "logit_bias": [[HELLO, 20]], "temperature": 0}
    assert post(server, "/completion", body).json()["tokens"] == [HELLO] * 12
    for name in ("repeat_penalty", "repetition_penalty"):
        ids = post(server, "/completion", {**body, name: 10.0}).json()["tokens"]
        assert HELLO not in ids  # (logit + 20) / 10 loses
    off = post(server, "/completion", {**body, "repeat_penalty": 10.0, "repeat_last_n": 0}).json()["tokens"]
    assert off == [HELLO] * 12
    # through the OpenAI SDK (an extension field there, as in vLLM)
    r = oa.completions.create(model="m", prompt=prompt, max_tokens=12, logit_bias={str(HELLO): 20},
                              extra_body={"repetition_penalty": 10.0}, **T0)
    assert "hello" not in r.choices[0].text
    bad = post(server, "/completion", {**body, "repeat_penalty": 2.0, "repetition_penalty": 3.0})
    assert bad.status_code == 400 and bad.json()["error"]["message"].startswith("repeat_penalty")


def test_min_p_near_one_at_temperature_one_is_greedy(server, oa, an):
    greedy = oa.completions.create(model="m", prompt="Count:", max_tokens=12, **T0).choices[0].text
    hot = [oa.completions.create(model="m", prompt="Count:", max_tokens=12, temperature=1.0, seed=s,
                                 extra_body={"min_p": 0.999}).choices[0].text for s in (1, 2)]
    assert hot == [greedy, greedy]
    free = oa.completions.create(model="m", prompt="Count:", max_tokens=12, temperature=1.0, seed=1).choices[0].text
    assert free != greedy
    chat_greedy = oa.chat.completions.create(model="m", messages=USER, max_tokens=8, **T0).choices[0].message.content
    chat_hot = oa.chat.completions.create(model="m", messages=USER, max_tokens=8, temperature=1.0, seed=4,
                                          extra_body={"min_p": 0.999}).choices[0].message.content
    assert chat_hot == chat_greedy
    msg = an.messages.create(model="m", max_tokens=8, messages=USER,
                             extra_body={"min_p": 0.999, "seed": 9, "temperature": 1.0})
    assert msg.content[0].text == an.messages.create(model="m", max_tokens=8, messages=USER,
                                                     extra_body=T0).content[0].text


# --- seeds --------------------------------------------------------------------------------------------------
def test_no_seed_is_a_fresh_seed_reported_and_replayable(server, oa):
    body = {"model": "m", "messages": USER, "max_tokens": 10, "temperature": 1.0}
    a, b = (oa.chat.completions.create(**body) for _ in range(2))
    assert a.seed != b.seed  # reported (llama.cpp reports its seed too)
    assert a.choices[0].message.content != b.choices[0].message.content
    again = oa.chat.completions.create(**body, seed=a.seed)
    assert again.choices[0].message.content == a.choices[0].message.content and again.seed == a.seed
    llama = post(server, "/completion", {"prompt": "x", "n_predict": 3, "temperature": 1.0}).json()
    assert llama["generation_settings"]["seed"] == llama["seed"]
    minus_one = post(server, "/completion", {"prompt": "x", "n_predict": 3, "seed": 2**32 - 1}).json()
    assert minus_one["seed"] != 2**32 - 1  # llama.cpp's "default seed" means: draw one


# --- the other probes ---------------------------------------------------------------------------------------
def test_llama_completion_takes_max_tokens(server):
    r = post(server, "/completion", {"prompt": "Count:", "max_tokens": 5, "temperature": 0}).json()
    assert r["tokens_predicted"] == 5 and r["stop_type"] == "limit"
    both = post(server, "/completion", {"prompt": "Count:", "max_tokens": 5, "n_predict": 2}).json()
    assert both["tokens_predicted"] == 2  # n_predict first, as llama.cpp


@pytest.mark.parametrize("extra, field", [({"suffix": "end"}, "suffix"), ({"best_of": 3}, "best_of")])
def test_suffix_and_best_of_are_refused(server, oa, extra, field):
    before = len(server.lines())
    with pytest.raises(openai.BadRequestError) as exc:
        oa.completions.create(model="m", prompt="x", max_tokens=2, **extra)
    assert exc.value.body["param"] == field and exc.value.body["code"] == "unsupported_parameter"
    assert oa.completions.create(model="m", prompt="x", max_tokens=1, best_of=1, suffix="").choices
    assert len(server.lines()) == before + 1


def test_json_object_schema_is_applied(server, oa):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    r = oa.chat.completions.create(model="m", messages=USER, max_tokens=60, temperature=1.0, seed=3,
                                   response_format={"type": "json_object", "schema": schema})
    value = json.loads(r.choices[0].message.content)
    assert set(value) == {"n"} and isinstance(value["n"], int)
    bad = post(server, "/v1/chat/completions", {"messages": USER, "response_format": {"type": "json_object",
                                                                                      "schema": {"type": 7}}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "response_format.schema"


def test_batches_of_prompts_on_v1_completions(server, oa, qwen3):
    texts = ["Count: 1, 2,", "Hello there"]
    one = [oa.completions.create(model="m", prompt=t, max_tokens=4, **T0).choices[0].text for t in texts]
    r = oa.completions.create(model="m", prompt=texts, max_tokens=4, **T0)
    assert [c.index for c in r.choices] == [0, 1] and [c.text for c in r.choices] == one
    ids = [qwen3.encode(t) for t in texts]
    r = oa.completions.create(model="m", prompt=ids, max_tokens=4, n=2, **T0)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert [c.text for c in r.choices] == [one[0], one[0], one[1], one[1]]
    assert r.usage.prompt_tokens == sum(map(len, ids)) and r.usage.completion_tokens == 16
    bad = post(server, "/v1/completions", {"prompt": ["a", [1, 2]], "stream": True})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt"
    mixed = post(server, "/v1/completions", {"prompt": ["a", 5]})
    assert mixed.status_code == 400 and mixed.json()["error"]["param"] == "prompt"


TOOLS = [{"name": "get_weather", "description": "Weather in a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]


def test_forced_tool_call_without_thinking_is_only_the_call(server, oa, an):
    for choice in ({"type": "any"}, {"type": "tool", "name": "get_weather"}):
        r = an.messages.create(model="m", max_tokens=200, tools=TOOLS, tool_choice=choice, messages=USER,
                               extra_body=T0)
        assert [b.type for b in r.content] == ["tool_use"] and r.stop_reason == "tool_use"
    oa_tools = [{"type": "function", "function": {"name": t["name"], "parameters": t["input_schema"]}} for t in TOOLS]
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        r = oa.chat.completions.create(model="m", messages=USER, tools=oa_tools, tool_choice=choice, max_tokens=200,
                                       **T0)
        msg = r.choices[0].message
        assert msg.content is None and not getattr(msg, "reasoning_content", None) and len(msg.tool_calls) == 1


def test_forced_tool_call_with_thinking_thinks_first(server, an):
    r = an.messages.create(model="m", max_tokens=30, tools=TOOLS, tool_choice={"type": "any"}, messages=USER,
                           thinking={"type": "enabled", "budget_tokens": 1024}, extra_body=T0)
    assert r.content[0].type == "thinking"  # the grammar opens the thought the template expects


def test_forced_tool_call_grammar_by_thinking_mode():
    pytest.importorskip("xgrammar")
    from strata_lab import load_tokenizer
    from strata_lab.grammar import TokenGrammar

    tok = load_tokenizer("qwen3")
    tg = TokenGrammar(tok, tok.vocab_size)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    call = '<tool_call>\n{"arguments": {}, "name": "f"}\n</tool_call>'  # keys sorted, as compiled

    def accepts(mode, text):  # the whole text, and then the end of the output
        import xgrammar as xgr

        compiled = tg.tool_call(tools, thinking=mode)
        matcher = xgr.GrammarMatcher(compiled._compiled)
        return matcher.accept_string(text) and matcher.accept_token(tok.im_end_id)

    assert accepts("off", call) and not accepts("off", "<think>\n\n</think>\n\n" + call)
    assert accepts("open", "<think>\nso I call f</think>\n\n" + call) and not accepts("open", call)
    assert accepts("inside", "so I call f</think>\n\n" + call)



def test_ignore_eos_and_return_tokens(server, qwen3):
    end = qwen3.im_end_id
    stop_now = post(server, "/completion", {"prompt": "x", "n_predict": 6, "logit_bias": [[end, 50]]}).json()
    assert stop_now["tokens_predicted"] <= 1 and stop_now["stop_type"] == "eos"
    kept = post(server, "/completion", {"prompt": "x", "n_predict": 6, "logit_bias": [[end, 50]],
                                        "ignore_eos": True, "temperature": 0}).json()
    assert kept["tokens_predicted"] == 6 and end not in kept["tokens"] and kept["stop_type"] == "limit"
    assert "tokens" not in post(server, "/completion", {"prompt": "x", "n_predict": 2, "return_tokens": False}).json()


def test_parallel_tool_calls_false_ends_the_reply_after_one_call(server, oa):
    two = ('root ::= "<tool_call>\\n{\\"name\\": \\"get_weather\\", \\"arguments\\": {\\"city\\": \\"A\\"}}'
           '\\n</tool_call>\\n<tool_call>\\n{\\"name\\": \\"get_weather\\", \\"arguments\\": {\\"city\\": '
           '\\"B\\"}}\\n</tool_call>"')
    tools = [{"type": "function", "function": {"name": t["name"], "parameters": t["input_schema"]}} for t in TOOLS]
    body = dict(model="m", messages=USER, tools=tools, max_tokens=200, temperature=0, extra_body={"grammar": two})
    both = oa.chat.completions.create(**body)
    assert [json.loads(c.function.arguments)["city"] for c in both.choices[0].message.tool_calls] == ["A", "B"]
    one = oa.chat.completions.create(**body, parallel_tool_calls=False)
    assert [json.loads(c.function.arguments)["city"] for c in one.choices[0].message.tool_calls] == ["A"]
    assert one.choices[0].finish_reason == "tool_calls" and one.usage.completion_tokens < both.usage.completion_tokens
    r = oa.responses.create(model="m", input="x", tools=[{"type": "function", **tools[0]["function"]}],
                            max_output_tokens=200, temperature=0, parallel_tool_calls=False, tool_choice="required")
    assert [o.type for o in r.output] == ["function_call"] and r.parallel_tool_calls is False


# --- top_k / top_p: llama.cpp's suite sends them on /v1/messages and /completion and asserts only a 200, so
# their effect is checked here: at T=1 with different seeds, top_k 1 and a tiny top_p are the greedy output.
@pytest.mark.parametrize("cut", [{"top_k": 1}, {"top_p": 1e-6}])
def test_top_k_one_and_tiny_top_p_at_temperature_one_are_greedy(server, oa, an, cut):
    greedy = llama_ids(server, n_predict=10)
    hot = [llama_ids(server, n_predict=10, temperature=1.0, seed=s, **cut) for s in (1, 2)]
    assert hot == [greedy, greedy]
    assert llama_ids(server, n_predict=10, temperature=1.0, seed=1) != greedy  # the cut is what makes it greedy
    msg_greedy = an.messages.create(model="m", max_tokens=8, messages=USER, extra_body=T0).content[0].text
    msg_hot = [an.messages.create(model="m", max_tokens=8, messages=USER,
                                  extra_body={"temperature": 1.0, "seed": s, **cut}).content[0].text for s in (3, 4)]
    assert msg_hot == [msg_greedy, msg_greedy]
    free = an.messages.create(model="m", max_tokens=8, messages=USER, extra_body={"temperature": 1.0, "seed": 3})
    assert free.content[0].text != msg_greedy  # /v1/messages temperature has its effect without the cut
    chat_greedy = oa.chat.completions.create(model="m", messages=USER, max_tokens=8, **T0).choices[0].message.content
    chat_hot = oa.chat.completions.create(model="m", messages=USER, max_tokens=8, temperature=1.0, seed=5,
                                          extra_body=cut).choices[0].message.content
    assert chat_hot == chat_greedy


# --- metadata.user_id: llama.cpp's suite sends it on /v1/messages and asserts only a 200; its effect is the slot
# key: a key's requests stay on its slot even when another slot holds the prompt (the similarity rule would move it).
def test_anthropic_metadata_user_id_keeps_a_key_on_its_slot(tmp_path):
    srv = ServerProcess(tmp_path, "--model", str(tiny_model()), "--ctx", str(CTX), "--slots", "2").wait()
    try:
        def cached(user, text):
            r = post(srv, "/v1/messages", {"model": "m", "max_tokens": 2, "temperature": 0,
                                           "metadata": {"user_id": user},
                                           "messages": [{"role": "user", "content": text}]})
            assert r.status_code == 200, r.text
            return r.json()["usage"]["cache_read_input_tokens"]
        fox = "The quick brown fox jumps over the lazy dog again and again"
        rivers = "Completely different words about rivers mountains and weather today"
        cached("a", fox)
        cached("b", rivers)
        assert cached("b", fox) == 0      # b's slot holds the rivers prompt: nothing of the fox prompt is reused
        assert cached("c", fox) > 10      # a new key goes by similarity to a slot holding the fox prompt
    finally:
        srv.stop()


# --- issue 52: sampler values at the edges of float32 are defined or refused, never a 500 ---------------------
def test_a_temperature_under_the_epsilon_is_greedy(server):
    from strata_lab.server.request import GREEDY_BELOW

    body = {"messages": USER, "max_tokens": 8}
    greedy = post(server, "/v1/chat/completions", {**body, "temperature": 0}).json()["choices"][0]["message"]
    for t, seed in ((1e-40, 1), (1e-40, 2), (GREEDY_BELOW / 2, 3)):
        r = post(server, "/v1/chat/completions", {**body, "temperature": t, "seed": seed})
        assert r.status_code == 200 and r.json()["choices"][0]["message"] == greedy, (t, r.text[:300])


@pytest.mark.parametrize("extra", [{"top_p": 1e-50}, {"top_p": 5e-324}, {"min_p": 1e-50}, {"temperature": 5e-324},
                                   {"frequency_penalty": 1e-50}, {"logit_bias": {"15": 1e-50}}])
def test_tiny_sampler_values_are_served(server, extra):
    r = post(server, "/v1/chat/completions", {"messages": USER, "max_tokens": 2, "temperature": 1, "seed": 1, **extra})
    assert r.status_code == 200, r.text[:300]


@pytest.mark.parametrize("field, value", [("repetition_penalty", 1e-50), ("repeat_penalty", 0.001),
                                          ("repetition_penalty", 0), ("top_p", 0), ("temperature", -1e-50)])
def test_sampler_values_out_of_range_are_a_400_naming_them(server, field, value):
    for route, body in (("/v1/chat/completions", {"messages": USER}), ("/completion", {"prompt": "1, 2, 3,"}),
                        ("/v1/messages", {"messages": USER})):
        r = post(server, route, {**body, "max_tokens": 2, field: value})
        assert r.status_code == 400 and r.json()["error"]["param"] == field, (route, r.text[:300])
