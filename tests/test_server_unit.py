"""Fast tier for the server: request parsing, output parsing, drained-id rule, dialect shapes (no engine)."""
import json

import pytest

from strata_lab.server.config import ServerConfig
from strata_lab.server.dialects import AnthropicStream, OpenAIStream
from strata_lab.server.errors import RequestError, anthropic_error, openai_error
from strata_lab.server.generation import WRAP_UP, plain_drained
from strata_lab.server.output import Event, OutputParser, TextStream, ToolCall, collect
from strata_lab.server.request import parse_anthropic, parse_openai

USER = [{"role": "user", "content": "hi"}]


def _field(fn, body):
    with pytest.raises(RequestError) as info:
        fn(body)
    assert info.value.status == 400
    return info.value.field


# --- request parsing ---------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["0", True, 1.5, [0], {"n": 0}, -2])
def test_n_predict_must_be_an_integer(value):
    assert _field(parse_openai, {"messages": USER, "n_predict": value}) == "n_predict"


@pytest.mark.parametrize("body,expected", [
    ({"n_predict": 0}, 0), ({"n_predict": 3}, 3), ({"n_predict": -1}, None), ({}, None),
    ({"max_tokens": 2, "n_predict": 7}, 2), ({"max_completion_tokens": 4, "max_tokens": 9, "n_predict": 0}, 4),
])
def test_n_predict_table(body, expected):
    assert parse_openai({"messages": USER, **body}).max_tokens == expected


@pytest.mark.parametrize("prefix", [None, ""])
def test_empty_prefix_is_no_prefix(prefix):
    assert parse_openai({"messages": USER, "assistant_prefix": prefix}).assistant_prefix is None
    assert parse_anthropic({"messages": USER, "max_tokens": 1, "assistant_prefix": prefix}).assistant_prefix is None


@pytest.mark.parametrize("prefix", [1, ["a"], {"a": 1}, True])
def test_non_string_prefix_is_a_400(prefix):
    assert _field(parse_openai, {"messages": USER, "assistant_prefix": prefix}) == "assistant_prefix"
    assert _field(parse_anthropic, {"messages": USER, "max_tokens": 1, "assistant_prefix": prefix}) == "assistant_prefix"


def test_prefix_whitespace_is_kept():
    assert parse_openai({"messages": USER, "assistant_prefix": " \tx\n"}).assistant_prefix == " \tx\n"


def test_ecosystem_spellings_become_the_prefix():
    msgs = USER + [{"role": "assistant", "content": "The answer is"}]
    a = parse_openai({"messages": msgs, "continue_final_message": True})
    b = parse_anthropic({"messages": msgs, "max_tokens": 3})
    assert a.assistant_prefix == b.assistant_prefix == "The answer is"
    assert a.messages == b.messages == USER
    assert _field(parse_openai, {"messages": USER, "continue_final_message": True}) == "continue_final_message"


@pytest.mark.parametrize("body,field", [
    ({}, "messages"), ({"messages": []}, "messages"), ({"messages": [{"role": "bot", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
    ({"messages": USER, "temperature": "hot"}, "temperature"), ({"messages": USER, "top_p": 0}, "top_p"),
    ({"messages": USER, "max_tokens": -1}, "max_tokens"), ({"messages": USER, "stream": "yes"}, "stream"),
    ({"messages": USER, "thinking_budget": 0}, "thinking_budget"), ({"messages": USER, "seed": -1}, "seed"),
    ({"messages": USER, "tools": [{"type": "function", "function": {}}]}, "tools[0].function.name"),
    ({"messages": USER, "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": 5}}}},
     "response_format.json_schema.schema"),
    ([1, 2], "body"),
])
def test_openai_bad_fields_are_named(body, field):
    assert _field(parse_openai, body) == field


@pytest.mark.parametrize("body,field", [
    ({"messages": USER}, "max_tokens"), ({"messages": USER, "max_tokens": "5"}, "max_tokens"),
    ({"messages": USER, "max_tokens": 5, "thinking": {"type": "enabled", "budget_tokens": "x"}}, "thinking.budget_tokens"),
    ({"messages": USER, "max_tokens": 5, "thinking": {"type": "sometimes"}}, "thinking.type"),
    ({"messages": [{"role": "user", "content": [{"type": "image"}]}], "max_tokens": 5}, "messages[0].content[0].type"),
    ({"messages": USER, "max_tokens": 5, "system": 7}, "system"),
])
def test_anthropic_bad_fields_are_named(body, field):
    assert _field(parse_anthropic, body) == field


def test_unknown_fields_are_ignored():
    assert parse_openai({"messages": USER, "frobnicate": 1, "logit_bias": {}}).messages == USER


def test_anthropic_blocks_become_openai_messages():
    body = {"max_tokens": 5, "system": [{"type": "text", "text": "sys"}], "messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": ""},
                                          {"type": "tool_use", "id": "t1", "name": "w", "input": {"c": "P"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"}]}],
        "tools": [{"name": "w", "input_schema": {"type": "object"}}],
        "thinking": {"type": "enabled", "budget_tokens": 16}}
    req = parse_anthropic(body)
    assert [m["role"] for m in req.messages] == ["system", "user", "assistant", "tool"]
    assert req.messages[2]["tool_calls"][0]["function"] == {"name": "w", "arguments": {"c": "P"}}
    assert req.messages[2]["reasoning_content"] == "hmm"
    assert req.messages[3] == {"role": "tool", "tool_call_id": "t1", "content": "sunny"}
    assert req.tools[0]["function"]["name"] == "w" and req.thinking_budget == 16 and req.enable_thinking


def test_error_shapes_name_the_field():
    err = RequestError("n_predict", "must be an integer")
    assert openai_error(err)["error"]["param"] == "n_predict"
    assert "n_predict" in anthropic_error(err)["error"]["message"]


def test_config_binds_localhost_by_default():
    from strata_lab.cli import build_parser

    assert ServerConfig().host == "127.0.0.1"
    assert build_parser().parse_args(["serve"]).host == "127.0.0.1"
    with pytest.raises(ValueError, match="max_context"):
        ServerConfig(max_context=1)


# --- output parsing ----------------------------------------------------------------------------------
def _run(pieces, prime=""):
    p = OutputParser()
    p.prime(prime)
    events = []
    for piece in pieces:
        events += p.feed(piece)
    return collect(events + p.finish())


def test_reasoning_and_content_split_even_when_tags_come_in_pieces():
    assert _run(["<th", "ink>a", "b</", "think>", "c"]) == ("ab", "c", [])
    assert _run(["x < y <thinker>"]) == ("", "x < y <thinker>", [])


def test_template_opened_reasoning():
    assert _run(["deep", "</think>\n\nok"], prime="<think>\n") == ("deep", "\n\nok", [])


def test_tool_calls_parse_and_malformed_json_stays_text():
    good = '<tool_call>\n{"name": "f", "arguments": {"a": [1, "ü"]}}\n</tool_call>'
    assert _run(["pre ", good])[2] == [ToolCall("f", {"a": [1, "ü"]})]
    bad = '<tool_call>\n{"name": "f", "arguments": {"a": </tool_call>'
    assert _run([bad]) == ("", bad, [])
    assert _run(['<tool_call>{"arguments": {}}</tool_call>'])[1] == '<tool_call>{"arguments": {}}</tool_call>'


def test_prefix_primes_but_is_never_emitted():
    # a call opened in the prefix and closed by the continuation is reported whole
    assert _run(['"x"}}</tool_call>'], prime='<tool_call>{"name": "f", "arguments": {"a": ')[2] == \
        [ToolCall("f", {"a": "x"})]
    # malformed: only the continuation's text comes back
    assert _run(["zz</tool_call>"], prime='<tool_call>{"name": ') == ("", "zz</tool_call>", [])
    # a call wholly inside the prefix is the client's own
    assert _run(["tail"], prime='<tool_call>{"name": "f", "arguments": {}}</tool_call>') == ("", "tail", [])
    # an unclosed call whose JSON is complete when generation ends is a call
    assert _run([], prime='<tool_call>\n{"name": "f", "arguments": {}}')[2] == [ToolCall("f", {})]


def test_text_stream_never_splits_characters(qwen3):
    ts = TextStream(qwen3)
    word = " öğrenci"
    ids = [130947, 5855]
    out = "".join(ts.push(i) for i in ids) + ts.flush()
    assert out == word
    assert qwen3.ids_bytes(ids).decode() == word
    assert ts.push(151900) == ""  # a spare embedding row has no text


def test_plain_drained_rule(qwen3):
    stop = [qwen3.im_end_id]
    plain = qwen3.encode(" and so")
    assert plain_drained(qwen3, plain, stop, mid_character=False) == plain
    assert plain_drained(qwen3, plain + qwen3.encode("</think>"), stop, mid_character=False) == plain
    assert plain_drained(qwen3, qwen3.encode(" a<b"), stop, mid_character=False) == qwen3.encode(" a")
    assert plain_drained(qwen3, [stop[0]] + plain, stop, mid_character=False) == []
    assert plain_drained(qwen3, [128] + plain, stop, mid_character=False) == []  # half of 'ğ'
    assert plain_drained(qwen3, plain, stop, mid_character=True) == []
    assert WRAP_UP.rstrip().endswith("</think>")


# --- dialect shapes ----------------------------------------------------------------------------------
def _frames(frames):
    return [json.loads(f.split("data: ", 1)[1]) for f in frames if "[DONE]" not in f]


def test_stream_shapes_for_tool_calls():
    call = Event("tool_call", call=ToolCall("f", {"x": 1}))
    oa = _frames(OpenAIStream("id", "m", 3).event(call))
    tc = oa[0]["choices"][0]["delta"]["tool_calls"][0]
    assert tc["index"] == 0 and tc["function"] == {"name": "f", "arguments": '{"x": 1}'} and tc["id"]
    an = _frames(AnthropicStream("id", "m", 3).event(call))
    assert [f["type"] for f in an] == ["content_block_start", "content_block_delta", "content_block_stop"]
    assert an[0]["content_block"]["type"] == "tool_use" and json.loads(an[1]["delta"]["partial_json"]) == {"x": 1}


@pytest.mark.parametrize("argv,on", [([], True), (["--no-header-checkpoint"], False)])
def test_header_checkpoint_option_reaches_the_engine_session(argv, on):
    """Default on: the server's session also checkpoints before each prompt's last <|im_start|>."""
    pytest.importorskip("strata_lab._engine")
    from strata_lab.cli import build_parser
    from strata_lab.server.app import load_state

    args = build_parser().parse_args(["serve", *argv])
    assert args.no_header_checkpoint is not on and ServerConfig().header_checkpoint
    st = load_state(ServerConfig(port=0, header_checkpoint=not args.no_header_checkpoint))
    session = st.runner.pool.slots[0].session
    ids = st.tokenizer.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    r = session.generate(ids, max_new_tokens=0).result
    head = max(i for i, t in enumerate(ids) if t == st.tokenizer.token_id("<|im_start|>"))
    assert r.checkpoints == ([head, len(ids)] if on else [len(ids)])


def test_kv_cache_option_is_checked_before_any_work(capsys):
    """--kv-cache takes Engine.load's kv_cache values (default auto); any other is a clear error naming the
    field and the values, from ServerConfig and so from `strata-lab serve` before it loads anything."""
    from strata_lab.cli import build_parser, main
    from strata_lab.engine import KV_CACHES

    assert build_parser().parse_args(["serve"]).kv_cache == "auto" == ServerConfig().kv_cache
    assert build_parser().parse_args(["serve", "--kv-cache", "q8"]).kv_cache == "q8"
    for kv in KV_CACHES:
        assert ServerConfig(kv_cache=kv).kv_cache == kv
    for bad in ("q4", "Q8", "", None, 8):
        with pytest.raises(ValueError, match=r"kv_cache must be one of auto, f32, f16, q8, got "):
            ServerConfig(kv_cache=bad)
    assert main(["serve", "--kv-cache", "q4", "--port", "0"]) == 2
    assert "serve: error: kv_cache must be one of auto, f32, f16, q8, got 'q4'" in capsys.readouterr().err


@pytest.mark.parametrize("kv", ["q8", "f32"])
def test_kv_cache_option_reaches_the_engine(tmp_path, kv):
    """The server's engine holds the cache --kv-cache names (a dense tiny model, head_dim 64: q8 needs a
    multiple of 32), and its session reads a prompt and decodes with it."""
    pytest.importorskip("strata_lab._engine")
    from strata_lab.cli import build_parser
    from strata_lab.server.app import load_state
    from strata_lab.tiny import make_tiny

    path = make_tiny(tmp_path / "dense", dtype="bfloat16", seed=5, overrides={"head_dim": 64})
    args = build_parser().parse_args(["serve", "--model", str(path), "--kv-cache", kv, "--ctx", "256"])
    st = load_state(ServerConfig(model=args.model, port=0, max_context=args.ctx, kv_cache=args.kv_cache))
    assert st.runner.engine.info["kv_cache"] == kv
    r = st.runner.pool.slots[0].session.generate(list(range(100, 140)), max_new_tokens=3).result
    assert len(r.gen_ids) == 3


def test_stop_sequences_parse_in_both_dialects():
    msgs = [{"role": "user", "content": "x"}]
    assert parse_openai({"messages": msgs, "stop": "END"}).stop == ("END",)
    assert parse_openai({"messages": msgs, "stop": ["a", "b"]}).stop == ("a", "b")
    assert parse_openai({"messages": msgs}).stop == ()
    assert parse_anthropic({"messages": msgs, "max_tokens": 1, "stop_sequences": ["\n\nHuman:"]}).stop == ("\n\nHuman:",)
    with pytest.raises(RequestError) as err:
        parse_anthropic({"messages": msgs, "max_tokens": 1, "stop_sequences": "END"})  # Anthropic takes a list
    assert err.value.field == "stop_sequences"


def test_stop_matcher_holds_back_a_possible_start_and_cuts_at_the_first_hit():
    from strata_lab.server.output import StopMatcher

    m = StopMatcher(["</answer>", "STOP"])
    out = [m.push(piece) for piece in ["The ans", "wer is 4", "2</ans", "wer> and more"]]
    assert "".join(out) == "The answer is 42" and m.hit == "</answer>"
    assert m.push("ignored") == "" and m.flush() == ""
    m = StopMatcher(["STOP"])
    assert m.push("no ST") == "no " and m.flush() == "ST" and m.hit is None
    m = StopMatcher(["bb", "abc"])  # the earliest hit in the text wins
    assert m.push("xabcbb") == "x" and m.hit == "abc"
    assert StopMatcher([]).push("anything") == "anything"
