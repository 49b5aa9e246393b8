"""Constrained decoding: a random-weight model produces valid JSON and tool calls every time.

Engine tier: hypothesis-generated schemas through `TokenGrammar` and the engine's token mask. Server tier:
the clients people use for structured output (openai `.parse()`, langchain-openai
`with_structured_output`, anthropic tools with tool_choice any) against `strata-lab serve` on the
embedded random model.
"""
import json

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("xgrammar")

from _strata_server import ServerProcess, tiny_model  # noqa: E402

PROMPT = "<|im_start|>user\nanswer in JSON<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def grammar_env(qwen3):
    from strata_lab.tiny import embedded_model
    from strata_lab.engine import Engine
    from strata_lab.grammar import TokenGrammar

    engine = Engine.load(embedded_model("hybrid"), threads=2)
    return engine, TokenGrammar(qwen3, engine.vocab_size, max_string=8, max_items=3)


_scalar = st.sampled_from([{"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"},
                           {"type": "null"}, {"enum": ["red", "green", 3]}, {"type": "integer", "minimum": 5},
                           {"type": "string", "minLength": 2}])
_names = st.text(alphabet="abcdefgh_", min_size=1, max_size=6)


def _object(children):
    return st.dictionaries(_names, children, min_size=1, max_size=3).flatmap(
        lambda props: st.lists(st.sampled_from(sorted(props)), unique=True).map(
            lambda req: {"type": "object", "properties": props, "required": req}))


schemas = st.recursive(_scalar, lambda c: st.one_of(_object(c), st.builds(lambda i: {"type": "array", "items": i}, c)),
                       max_leaves=6)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=schemas, seed=st.integers(0, 2**32))
def test_random_model_output_matches_hypothesis_schemas(grammar_env, qwen3, schema, seed):
    from strata_lab.engine import Sampling

    engine, grammar = grammar_env
    mask = grammar.json_schema(schema).mask()
    s = engine.session("grammar")
    stops = [qwen3.im_end_id, qwen3.eos_id]  # the server's stop ids; the grammar ends on either
    stream = s.generate(qwen3.encode(PROMPT), max_new_tokens=400, token_mask=mask, stop_ids=stops,
                        sampling=Sampling(temperature=1.0, seed=seed))
    ids = list(stream)
    assert stream.result.finish == "stop" and ids[-1] in stops, (schema, qwen3.decode(ids))
    text = qwen3.decode(ids[:-1])
    text = text.split("</think>\n\n", 1)[-1]  # the grammar allows Qwen3's empty think block first
    jsonschema.validate(json.loads(text), schema)
    assert mask.rejected == 0


def test_bounded_strings_keep_to_json_characters():
    """bound_schema gives every free string a maxLength, and xgrammar spells a bounded string's characters as
    [^"\\\r\n]: a raw tab (a random model's sampled token) passed, and json.loads refused the text. The
    grammar keeps them to JSON's characters, in objects, arrays and tool arguments alike."""
    import xgrammar as xgr

    from strata_lab.grammar.xgr import bound_schema, json_schema_grammar

    schema = bound_schema({"type": "array", "items": {"type": "object", "properties": {"a": {"type": "string"}},
                                                      "required": ["a"]}}, 8, 3)
    g = json_schema_grammar(json.dumps(schema))
    for ok in ('[{"a": "x y"}]', '[{"a": ""}, {"a": "\u00e9t\u00e9"}]'):
        assert xgr.testing._is_grammar_accept_string(g, json.dumps(json.loads(ok), ensure_ascii=False)), ok
    for bad in ('[{"a": "x\ty"}]', '[{"a": "x\u0001"}]'):
        assert not xgr.testing._is_grammar_accept_string(g, bad.encode().decode("unicode_escape")), bad


def test_tool_call_grammar_spells_the_template_syntax(grammar_env, qwen3):
    from strata_lab.engine import Sampling
    from strata_lab.server.output import OutputParser, collect

    engine, grammar = grammar_env
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"]}}}, {"type": "function", "function": {"name": "noop"}}]
    for seed in range(3):
        stream = engine.session("tools").generate(
            qwen3.encode(PROMPT), max_new_tokens=300, token_mask=grammar.tool_call(tools).mask(),
            stop_ids=[qwen3.im_end_id, qwen3.eos_id], sampling=Sampling(temperature=1.0, seed=seed))
        text = qwen3.decode(list(stream)[:-1])
        parser = OutputParser()
        _, _, calls = collect(parser.feed(text) + parser.finish())
        assert len(calls) == 1 and calls[0].name in ("get_weather", "noop"), text


# --- server tier --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = ServerProcess(tmp_path_factory.mktemp("grammar"), "--model", str(tiny_model()), "--ctx", "2048",
                        "--grammar-max-string", "10", "--grammar-max-items", "3").wait()
    yield srv
    srv.stop()


def test_openai_parse_with_a_pydantic_model(server):
    import openai
    from pydantic import BaseModel

    class Weather(BaseModel):
        city: str
        celsius: int
        rain: bool
        tags: list[str]

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    for seed in range(3):
        r = client.chat.completions.parse(model="m", messages=[{"role": "user", "content": "weather?"}],
                                          response_format=Weather, temperature=1.0, seed=seed, max_tokens=300)
        assert isinstance(r.choices[0].message.parsed, Weather)


def test_langchain_with_structured_output(server):
    langchain_openai = pytest.importorskip("langchain_openai")
    from pydantic import BaseModel

    class Person(BaseModel):
        name: str
        age: int

    llm = langchain_openai.ChatOpenAI(base_url=server.url + "/v1", api_key="none", model="m", temperature=1.0,
                                      max_tokens=300, max_retries=0)
    out = llm.with_structured_output(Person).invoke("Who?")
    assert isinstance(out, Person)


def test_anthropic_tools_with_tool_choice_any(server):
    import anthropic

    client = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)
    tools = [{"name": "get_weather", "description": "Weather in a city",
              "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
             {"name": "get_time", "input_schema": {"type": "object", "properties": {"tz": {"type": "string"}}}}]
    for seed in range(3):
        r = client.messages.create(model="m", max_tokens=300, tools=tools, tool_choice={"type": "any"},
                                   messages=[{"role": "user", "content": "hi"}], extra_body={"seed": seed})
        assert r.stop_reason == "tool_use"
        uses = [b for b in r.content if b.type == "tool_use"]
        assert len(uses) == 1 and uses[0].name in ("get_weather", "get_time")
        if uses[0].name == "get_weather":
            assert isinstance(uses[0].input["city"], str)
    r = client.messages.create(model="m", max_tokens=300, tools=tools, tool_choice={"type": "tool", "name": "get_time"},
                               messages=[{"role": "user", "content": "hi"}])
    assert [b.name for b in r.content if b.type == "tool_use"] == ["get_time"]


def test_openai_tool_choice_required_and_llama_grammar_fields(server):
    import httpx

    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}]
    r = httpx.post(server.url + "/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "call"}], "tools": tools, "tool_choice": "required",
        "max_tokens": 200, "temperature": 1.0}, timeout=60).json()
    call = r["choices"][0]["message"]["tool_calls"][0]["function"]
    assert r["choices"][0]["finish_reason"] == "tool_calls" and isinstance(json.loads(call["arguments"])["x"], int)
    g = httpx.post(server.url + "/completion", json={"prompt": "Answer:", "grammar": 'root ::= "yes" | "no"',
                                                     "n_predict": 20, "temperature": 1.0}, timeout=60).json()
    assert g["content"] in ("yes", "no") and g["stop_type"] == "eos"
    js = httpx.post(server.url + "/completion", json={"prompt": "JSON:", "n_predict": 200, "temperature": 1.0,
                                                      "json_schema": {"type": "array", "items": {"type": "integer"}}},
                    timeout=60).json()
    assert all(isinstance(v, int) for v in json.loads(js["content"]))
