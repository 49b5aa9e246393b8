"""Chat templates: exact Qwen3-format strings, assistant prefill, HF parity, append-only lint."""
import doctest
import json

import pytest
from hypothesis import given, settings, strategies as st

import strata_lab.text.messages as messages_module
import strata_lab.text.template as template_module
from strata_lab import ChatTemplate
from strata_lab.text.template import TemplateInputError, TemplateRenderError

SYS = "<|im_start|>system\n"
USER = "<|im_start|>user\n"
ASSISTANT = "<|im_start|>assistant\n"
END = "<|im_end|>\n"
EMPTY_THINK = "<think>\n\n</think>\n\n"

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"type": "string"}}}}}]
TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    '{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city", '
    '"parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}\n</tools>\n\n'
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')
SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {
    "name": "answer", "schema": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}}
SCHEMA_INSTRUCTION = (
    "Respond with a single JSON object that conforms to the JSON schema 'answer' below, and nothing else.\n"
    '<schema>\n{"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}\n</schema>')
ORBIT = [{"role": "system", "content": "For this test, the internal project identifier is ORBIT-7."},
         {"role": "user", "content": "What is the internal project identifier?"}]
ORBIT_BASE = (SYS + "For this test, the internal project identifier is ORBIT-7." + END
              + USER + "What is the internal project identifier?" + END)


@pytest.fixture(scope="module")
def qwen():
    return ChatTemplate.from_name("qwen3")


def weather_call(args='{"city": "Paris"}', call_id="call_1"):
    return {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": args}}


# ---- exact strings ----------------------------------------------------------------------------------------

def test_system_user_assistant(qwen):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]
    assert qwen.render(msgs) == (SYS + "Be brief." + END + USER + "Hi" + END + ASSISTANT + "Hello!" + END
                                 + USER + "Bye" + END + ASSISTANT)
    assert qwen.render(msgs, add_generation_prompt=False) == (
        SYS + "Be brief." + END + USER + "Hi" + END + ASSISTANT + "Hello!" + END + USER + "Bye" + END)
    assert qwen.render(msgs[1:2], enable_thinking=False) == USER + "Hi" + END + ASSISTANT + EMPTY_THINK
    assert qwen.render(msgs[1:2], enable_thinking=True) == USER + "Hi" + END + ASSISTANT


def test_text_parts_join_without_separator(qwen):
    parts = [{"type": "text", "text": "Hello "}, {"type": "text", "text": "there"}]
    assert qwen.render([{"role": "user", "content": parts}]) == USER + "Hello there" + END + ASSISTANT


def test_tools_tool_calls_and_grouped_results(qwen):
    msgs = [{"role": "system", "content": "You help."}, {"role": "user", "content": "Weather in Paris and Rome?"},
            {"role": "assistant", "content": None, "tool_calls": [
                weather_call(), weather_call({"city": "Rome"}, "call_2")]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            {"role": "tool", "tool_call_id": "call_2", "content": "rain"}]
    assert qwen.render(msgs, tools=TOOLS) == (
        SYS + "You help.\n\n" + TOOLS_HEADER + END + USER + "Weather in Paris and Rome?" + END
        + ASSISTANT + EMPTY_THINK  # after the last query: the (empty) reasoning block stays
        + '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        + '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>' + END
        + "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\nrain\n</tool_response>"
        + END + ASSISTANT)


def test_tool_call_after_content_gets_newline(qwen):
    msgs = [{"role": "user", "content": "Paris?"},
            {"role": "assistant", "content": "Checking.", "tool_calls": [weather_call()]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            {"role": "assistant", "content": "Sunny."}, {"role": "user", "content": "Thanks"}]
    assert qwen.render(msgs) == (
        USER + "Paris?" + END + ASSISTANT + 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Paris"}}\n</tool_call>' + END + USER + "<tool_response>\nsunny\n</tool_response>" + END
        + ASSISTANT + "Sunny." + END + USER + "Thanks" + END + ASSISTANT)


def test_reasoning_kept_only_after_last_query(qwen):
    msgs = [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1", "reasoning_content": "R1"},
            {"role": "user", "content": "Q2"},
            {"role": "assistant", "content": "", "reasoning": "R2", "tool_calls": [weather_call()]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            {"role": "assistant", "content": "A2", "reasoning_content": "\nR3\n"}]
    assert qwen.render(msgs, add_generation_prompt=False) == (
        USER + "Q1" + END + ASSISTANT + "A1" + END + USER + "Q2" + END
        + ASSISTANT + '<think>\nR2\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Paris"}}\n</tool_call>' + END
        + USER + "<tool_response>\nsunny\n</tool_response>" + END
        + ASSISTANT + "<think>\nR3\n</think>\n\nA2" + END)


def test_inline_think_in_content_is_split(qwen):
    msgs = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nA"}]
    assert qwen.render(msgs, add_generation_prompt=False) == (
        USER + "Q" + END + ASSISTANT + "<think>\nhmm\n</think>\n\nA" + END)
    assert qwen.render(msgs + [{"role": "user", "content": "Q2"}]).count("hmm") == 0


def test_prefix_exact_strings(qwen):
    assert qwen.render(ORBIT, assistant_prefix="The internal project identifier is") == (
        ORBIT_BASE + ASSISTANT + EMPTY_THINK + "The internal project identifier is")
    msgs = [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1", "reasoning_content": "R1"},
            {"role": "user", "content": "Q2"}]
    assert qwen.render(msgs, assistant_prefix="So") == (
        USER + "Q1" + END + ASSISTANT + "A1" + END + USER + "Q2" + END + ASSISTANT + EMPTY_THINK + "So")


# ---- assistant prefill (the cases of the reference PR) --------------------------------------------------------

def test_prefill_no_prefix_regression(qwen):
    assert qwen.render(ORBIT) == ORBIT_BASE + ASSISTANT


@pytest.mark.parametrize("empty", [None, ""])
def test_prefill_none_and_empty_render_as_no_prefix(qwen, empty):
    for kwargs in ({}, {"enable_thinking": False}, {"tools": TOOLS}, {"response_format": SCHEMA_FORMAT}):
        assert qwen.render(ORBIT, assistant_prefix=empty, **kwargs) == qwen.render(ORBIT, **kwargs)


@pytest.mark.parametrize("bad", [5, ["x"], {"text": "x"}, b"bytes", True])
def test_prefill_non_string_is_a_clear_error(qwen, bad):
    with pytest.raises(TemplateInputError, match="assistant_prefix: must be a string"):
        qwen.render(ORBIT, assistant_prefix=bad)


def test_prefill_placement(qwen):
    out = qwen.render(ORBIT, assistant_prefix="The next number is")
    assert out.startswith(ORBIT_BASE)
    assert out.count("<|im_start|>assistant") == 1
    assert out.endswith(ASSISTANT + EMPTY_THINK + "The next number is")
    assert out[len(ORBIT_BASE):].count("<|im_end|>") == 0  # no premature terminator


@pytest.mark.parametrize("enable_thinking", [None, True, False])
def test_prefill_reasoning_routing(qwen, enable_thinking):
    # the prefix follows a completed (empty) reasoning block, so the continuation is content
    out = qwen.render(ORBIT, assistant_prefix="Answer:", enable_thinking=enable_thinking)
    assert out == ORBIT_BASE + ASSISTANT + "<think>\n\n</think>\n\nAnswer:"
    assert out.rindex("</think>") < out.rindex("Answer:")


def test_prefill_long_prefix(qwen):
    prefix = "".join(f"line {i}: {'x' * (i % 7)}\n" for i in range(2000))
    out = qwen.render(ORBIT, assistant_prefix=prefix)
    assert out == ORBIT_BASE + ASSISTANT + EMPTY_THINK + prefix


@pytest.mark.parametrize("prefix", ["öğrenci ğ şü", "日本語で答えます：", "🎉 naïve café", "Ω≈ç√∫"])
def test_prefill_unicode(qwen, qwen3, prefix):
    out = qwen.render(ORBIT, assistant_prefix=prefix)
    assert out == ORBIT_BASE + ASSISTANT + EMPTY_THINK + prefix
    assert qwen3.decode(qwen3.encode(out)) == out


@pytest.mark.parametrize("prefix", ["  The answer", "The answer  ", "\nThe answer\n", "\tx\t", " ", "\n",
                                    "\n\n \t \n", "a \n\t b"])
def test_prefill_whitespace_kept_exactly(qwen, prefix):
    assert qwen.render(ORBIT, assistant_prefix=prefix) == ORBIT_BASE + ASSISTANT + EMPTY_THINK + prefix


def test_prefill_literal_close_think(qwen):
    prefix = "I will not think</think> more"
    assert qwen.render(ORBIT, assistant_prefix=prefix) == ORBIT_BASE + ASSISTANT + EMPTY_THINK + prefix


@pytest.mark.parametrize("prefix", ["foo<|im_end|>bar", "done<|im_end|>", "done<|im_end|>\n", "<|im_end|>\n"])
def test_prefill_literal_im_end_never_truncated(qwen, qwen3, prefix):
    out = qwen.render(ORBIT, assistant_prefix=prefix)
    assert out == ORBIT_BASE + ASSISTANT + EMPTY_THINK + prefix
    # special-token text keeps special-token semantics once encoded, as elsewhere in the prompt
    assert qwen3.token_id("<|im_end|>") in qwen3.encode(out[len(ORBIT_BASE + ASSISTANT + EMPTY_THINK):])


def test_prefill_one_token_prefix_accounting(qwen, qwen3):
    base_ids = qwen3.encode(ORBIT_BASE + ASSISTANT + EMPTY_THINK)
    ids = qwen3.encode(qwen.render(ORBIT, assistant_prefix=" hello"))
    assert ids == base_ids + [23811]  # one more prompt token; decode starts one position later
    five = qwen3.encode(qwen.render(ORBIT, assistant_prefix="The internal project identifier is"))
    assert five[:len(base_ids)] == base_ids and len(five) == len(base_ids) + 5


def test_prefill_with_tools(qwen):
    msgs = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "tool_calls": [weather_call()], "reasoning_content": "need the tool"},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    plain = qwen.render(msgs, tools=TOOLS)
    out = qwen.render(msgs, tools=TOOLS, assistant_prefix="It is")
    assert out == plain + EMPTY_THINK + "It is"
    assert out.startswith(SYS + TOOLS_HEADER + END)
    assert "<think>\nneed the tool\n</think>" in out  # earlier tool step after the query keeps its reasoning
    assert out.count(ASSISTANT) == 2 and out.endswith(ASSISTANT + EMPTY_THINK + "It is")


@pytest.mark.parametrize("response_format,instruction", [
    (SCHEMA_FORMAT, SCHEMA_INSTRUCTION),
    ({"type": "json_object"}, "Respond with a single valid JSON object and nothing else.")])
def test_prefill_with_structured_output(qwen, response_format, instruction):
    plain = qwen.render(ORBIT, response_format=response_format)
    assert plain == (SYS + "For this test, the internal project identifier is ORBIT-7.\n\n" + instruction + END
                     + USER + "What is the internal project identifier?" + END + ASSISTANT)
    out = qwen.render(ORBIT, response_format=response_format, assistant_prefix='{"n": ')
    assert out == plain + EMPTY_THINK + '{"n": '
    # no system message: the instruction becomes one
    assert qwen.render(ORBIT[1:], response_format=response_format).startswith(SYS + instruction + END + USER)
    assert qwen.render(ORBIT, response_format={"type": "text"}) == qwen.render(ORBIT)


@pytest.mark.parametrize("prefix", ["The internal project identifier is", " x\t", "done<|im_end|>\n",
                                    "a</think>b", "öğ"])
def test_continue_final_message_equals_prefix(qwen, prefix):
    # HF / vLLM spelling; the server maps Anthropic's trailing assistant message to it as well
    msgs = ORBIT + [{"role": "assistant", "content": prefix}]
    assert qwen.render(msgs, continue_final_message=True) == qwen.render(ORBIT, assistant_prefix=prefix)
    parts = ORBIT + [{"role": "assistant", "content": [{"type": "text", "text": prefix}]}]
    assert qwen.render(parts, continue_final_message=True) == qwen.render(ORBIT, assistant_prefix=prefix)


def test_continue_final_message_edges(qwen):
    empty = ORBIT + [{"role": "assistant", "content": ""}]
    assert qwen.render(empty, continue_final_message=True) == qwen.render(ORBIT)
    with_reasoning = ORBIT + [{"role": "assistant", "content": "It", "reasoning_content": "hmm"}]
    assert qwen.render(with_reasoning, continue_final_message=True) == (
        ORBIT_BASE + ASSISTANT + "<think>\nhmm\n</think>\n\nIt")
    with pytest.raises(TemplateInputError, match=r"messages\[1\]\.role"):
        qwen.render(ORBIT, continue_final_message=True)
    with pytest.raises(TemplateInputError, match="cannot be combined"):
        qwen.render(empty, continue_final_message=True, assistant_prefix="x")


# ---- validation ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("messages,where", [
    ([], "messages: must not be empty"),
    ("hello", "messages: must be a list"),
    ([{"role": "user", "content": "a"}, "b"], r"messages\[1\]\.role"),
    ([{"role": "robot", "content": "a"}], r"messages\[0\]\.role: must be one of"),
    ([{"role": "user"}], r"messages\[0\]\.content: is required"),
    ([{"role": "user", "content": 3}], r"messages\[0\]\.content: must be a string or a list"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], r"messages\[0\]\.content\[0\]\.type"),
    ([{"role": "user", "content": [{"type": "text", "text": 1}]}], r"messages\[0\]\.content\[0\]\.text"),
    ([{"role": "user", "content": "a", "reasoning_content": "r"}], r"messages\[0\]\.reasoning_content"),
    ([{"role": "user", "content": "a"}, {"role": "assistant", "tool_calls": {"id": 1}}],
     r"messages\[1\]\.tool_calls: must be a list"),
    ([{"role": "user", "content": "a"}, {"role": "assistant", "tool_calls": [{"type": "function"}]}],
     r"messages\[1\]\.tool_calls\[0\]\.function"),
    ([{"role": "user", "content": "a"}, {"role": "assistant", "tool_calls": [
        {"type": "function", "function": {"name": "", "arguments": "{}"}}]}],
     r"messages\[1\]\.tool_calls\[0\]\.function\.name"),
    ([{"role": "user", "content": "a"}, {"role": "assistant", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": 3}}]}],
     r"messages\[1\]\.tool_calls\[0\]\.function\.arguments"),
    ([{"role": "user", "content": "a"}, {"role": "tool", "content": "r"}], r"messages\[1\]\.tool_call_id"),
    ([{"role": "user", "content": "a"}, {"role": "assistant", "tool_calls": [weather_call()]},
      {"role": "tool", "tool_call_id": "call_9", "content": "r"}], r"messages\[2\]\.tool_call_id: 'call_9'"),
    ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "reasoning": "x",
                                        "reasoning_content": "y"}], r"messages\[1\]\.reasoning"),
])
def test_validation_names_index_and_field(qwen, messages, where):
    with pytest.raises(TemplateInputError, match=where):
        qwen.render(messages)


@pytest.mark.parametrize("kwargs,where", [
    ({"tools": {"a": 1}}, "tools: must be a list"),
    ({"tools": [{"type": "function", "function": {"description": "x"}}]}, r"tools\[0\]\.function\.name"),
    ({"tools": [{"type": "retrieval"}]}, r"tools\[0\]\.type"),
    ({"response_format": {"type": "yaml"}}, r"response_format\.type"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
     r"response_format\.json_schema\.name"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": "x"}}},
     r"response_format\.json_schema\.schema"),
    ({"enable_thinking": "yes"}, "enable_thinking"),
])
def test_validation_of_request_fields(qwen, kwargs, where):
    with pytest.raises(TemplateInputError, match=where):
        qwen.render([{"role": "user", "content": "a"}], **kwargs)
    assert issubclass(TemplateInputError, ValueError)


def test_caller_messages_are_not_modified(qwen):
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b", "reasoning": "r"}]
    snapshot = json.dumps(msgs)
    qwen.render(msgs, response_format=SCHEMA_FORMAT, continue_final_message=True)
    assert json.dumps(msgs) == snapshot


# ---- loading, errors, HF environment --------------------------------------------------------------------------

def test_from_file_jinja_and_tokenizer_config(tmp_path, qwen):
    (tmp_path / "mine.jinja").write_text(qwen.source)
    assert ChatTemplate.from_file(tmp_path / "mine.jinja").source == qwen.source
    cfg = tmp_path / "model" / "tokenizer_config.json"
    cfg.parent.mkdir()
    cfg.write_text(json.dumps({"chat_template": [{"name": "default", "template": qwen.source},
                                                 {"name": "tool_use", "template": "{{ 'T' }}"}],
                               "eos_token": {"content": "<|im_end|>", "special": True}}))
    loaded = ChatTemplate.from_file(cfg)
    assert loaded.source == qwen.source and loaded.special_tokens == {"eos_token": "<|im_end|>"}
    assert loaded.name == "model:default"
    assert ChatTemplate.from_file(cfg.parent, variant="tool_use").render([{"role": "user", "content": "a"}]) == "T"
    with pytest.raises(ValueError, match="variant: .* no chat template named 'rag'"):
        ChatTemplate.from_file(cfg, variant="rag")
    with pytest.raises(ValueError, match="name: unknown chat template"):
        ChatTemplate.from_name("llama9")


def test_template_errors_name_template_and_line(tmp_path):
    bad = tmp_path / "broken.jinja"
    bad.write_text("line one\n{% if %}\n")
    with pytest.raises(TemplateRenderError, match=r"'broken', line 2"):
        ChatTemplate.from_file(bad)
    raising = ChatTemplate("a\n{% if messages | length > 1 %}\n{{ raise_exception('one message only') }}\n"
                           "{% endif %}", name="strict")
    assert raising.render([{"role": "user", "content": "x"}]) == "a\n"
    with pytest.raises(TemplateRenderError, match=r"'strict', line 3: one message only"):
        raising.render([{"role": "user", "content": "x"}, {"role": "user", "content": "y"}])


# A template that uses the HF environment's extras: loop controls, namespace, dict, tojson options,
# {% generation %}, strftime_now and special tokens passed as variables.
HF_FEATURES = """{{ bos_token or '' }}{%- set ns = namespace(n=0) -%}
{%- for m in messages -%}
  {%- if loop.index0 >= limit | default(99) %}{% break %}{% endif -%}
  {%- if m.role == 'system' %}{% continue %}{% endif -%}
  {%- set ns.n = ns.n + 1 -%}
  [{{ m.role }}]{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}{{ eos_token }}
{% endfor -%}
{{ dict(count=ns.n) | tojson(indent=1) }}|{{ "<é>" | tojson }}|{{ strftime_now("%Y") | length }}
{%- if add_generation_prompt %}[assistant]{% endif %}"""


@pytest.fixture(scope="module")
def hf_tokenizer(qwen3):
    from transformers import PreTrainedTokenizerFast

    made = {}

    def make(template: ChatTemplate):
        if template.source not in made:
            tok = PreTrainedTokenizerFast(tokenizer_object=qwen3.hf, **template.special_tokens)
            tok.chat_template = template.source
            made[template.source] = tok
        return made[template.source]
    return make


def hf_render(tok, messages, **kwargs):
    return tok.apply_chat_template(messages, tokenize=False, **kwargs)


def test_hf_environment_features_match(hf_tokenizer):
    tmpl = ChatTemplate(HF_FEATURES, name="features", special_tokens={"eos_token": "</s>", "bos_token": "<s>"})
    tok = hf_tokenizer(tmpl)
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
            {"role": "assistant", "content": "a"}, {"role": "user", "content": "v"}]
    for kwargs in ({}, {"limit": 2}, {"add_generation_prompt": True}):
        want = hf_render(tok, msgs, **kwargs)
        assert tmpl.render(msgs, add_generation_prompt=kwargs.pop("add_generation_prompt", False), **kwargs) == want
    assert '"<é>"' in want and want.startswith("<s>[user]u</s>")


def test_tokenizer_config_loads_in_transformers(tmp_path, qwen, qwen3):
    from transformers import AutoTokenizer

    qwen3.hf.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(qwen.to_tokenizer_config()))
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    msgs = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "tool_calls": [weather_call()]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    assert hf_render(tok, msgs, tools=TOOLS, add_generation_prompt=True) == qwen.render(msgs, tools=TOOLS)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert ChatTemplate.from_file(tmp_path).source == qwen.source


# ---- parity with transformers over generated conversations ------------------------------------------------------

_pieces = st.sampled_from(list("ab xyz\n\t.,:{}\"'öğ日🎉<>/") + ["</think>", "<think>", "\n\n", "Hi"])
_text = st.one_of(
    st.lists(_pieces, max_size=10).map("".join),
    st.sampled_from(["", "Hello", "<tool_response>\nx\n</tool_response>"]))
_parts = st.lists(st.builds(lambda t: {"type": "text", "text": t}, _text), min_size=1, max_size=3)
_content = st.one_of(_text, _text, _parts)
_args = st.one_of(st.dictionaries(st.sampled_from(["city", "n", "q"]),
                                  st.one_of(st.integers(-5, 99), _text, st.booleans()), max_size=2),
                  st.sampled_from(['{"city": "Paris"}', '{"n":1}', "{}"]))


@st.composite
def conversations(draw):
    msgs = []
    if draw(st.booleans()):
        msgs.append({"role": "system", "content": draw(_content)})
    for _ in range(draw(st.integers(1, 3))):
        msgs.append({"role": "user", "content": draw(_content)})
        for step in range(draw(st.integers(0, 2))):
            reply = {"role": "assistant", "content": draw(st.one_of(st.none(), _content))}
            if draw(st.booleans()):
                reply[draw(st.sampled_from(["reasoning_content", "reasoning"]))] = draw(_text)
            calls = draw(st.integers(0, 2))
            if calls:
                reply["tool_calls"] = [{"id": f"c{len(msgs)}_{k}", "type": "function",
                                        "function": {"name": draw(st.sampled_from(["get_weather", "search"])),
                                                     "arguments": draw(_args)}} for k in range(calls)]
            msgs.append(reply)
            for k in range(calls):
                msgs.append({"role": "tool", "tool_call_id": f"c{len(msgs) - 1 - k}_{k}", "content": draw(_content)})
            if not calls:
                break
    return msgs


@settings(max_examples=60, deadline=None)
@given(messages=conversations(), with_tools=st.booleans(), add_generation_prompt=st.booleans(),
       enable_thinking=st.sampled_from([None, True, False]))
def test_parity_with_transformers(qwen, hf_tokenizer, messages, with_tools, add_generation_prompt, enable_thinking):
    tok = hf_tokenizer(qwen)
    extra = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    tools = TOOLS if with_tools else None
    ours = qwen.render(messages, tools=tools, add_generation_prompt=add_generation_prompt, **extra)
    theirs = hf_render(tok, messages, tools=tools, add_generation_prompt=add_generation_prompt, **extra)
    assert ours == theirs


@settings(max_examples=30, deadline=None)
@given(messages=conversations(), prefix=st.lists(st.sampled_from(list("abc .,:öğ日") + ["Hi"]),
                                                min_size=1, max_size=10).map("".join).filter(lambda s: s.strip() == s))
def test_continue_final_message_parity_with_transformers(qwen, hf_tokenizer, messages, prefix):
    # for text the template passes through unchanged, HF's continue_final_message gives the prefill prompt
    msgs = messages + [{"role": "assistant", "content": prefix}]
    theirs = hf_render(hf_tokenizer(qwen), msgs, continue_final_message=True)
    assert qwen.render(msgs, continue_final_message=True) == theirs == qwen.render(messages, assistant_prefix=prefix)


# ---- append-only lint -------------------------------------------------------------------------------------------

def test_lint_finds_qwen3_reasoning_strip(qwen):
    conv = [{"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4", "reasoning_content": "Add them."},
            {"role": "user", "content": "And 3+3?"},
            {"role": "assistant", "content": "6", "reasoning_content": "Again."},
            {"role": "user", "content": "Thanks"}]
    findings = qwen.check_append_only(conv)
    assert [(f.turn, f.message_index, f.kind) for f in findings] == [(0, 1, "rewrite"), (1, 3, "rewrite")]
    first = findings[0]
    held_prompt = USER + "What is 2+2?" + END + ASSISTANT
    assert first.offset == len(held_prompt)
    assert first.expected.endswith("<|im_start|>assistant\n||<think>\nAdd them.\n</think>\n\n4<|im_end|>\n")
    assert first.actual.split("||")[1].startswith("4<|im_end|>\n<|im_start|>user\nAnd 3+3?")
    assert "turn 0" in str(first)


def test_lint_tool_loop_within_one_query_is_append_only(qwen):
    conv = [{"role": "system", "content": "S"}, {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": "", "tool_calls": [weather_call()]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            {"role": "assistant", "content": "", "reasoning_content": "again", "tool_calls": [
                weather_call('{"city": "Rome"}', "call_2")]},
            {"role": "tool", "tool_call_id": "call_2", "content": "rain"},
            {"role": "assistant", "content": "Sunny and rain."}]
    assert qwen.check_append_only(conv, tools=TOOLS) == []
    no_reasoning = [{k: v for k, v in m.items() if k != "reasoning_content"} for m in conv]
    assert qwen.check_append_only(no_reasoning, tools=TOOLS, enable_thinking=False) == []
    # reasoning the prompt said not to do: the generation prompt's empty block is not what the reply shows
    (finding,) = qwen.check_append_only(conv, tools=TOOLS, enable_thinking=False)
    assert (finding.kind, finding.message_index) == ("generation_prompt", 4)
    # a new user query strips the final answer's (empty) reasoning block: one finding, at that turn
    (finding,) = qwen.check_append_only(conv + [{"role": "user", "content": "Thanks"}], tools=TOOLS)
    assert (finding.turn, finding.message_index) == (2, 6)
    # the first difference is the earliest tool step's block, which the new query strips too
    assert "ther?<|im_end|>\n<|im_start|>assistant\n<t||hink>\n\n</think>\n\n<tool_call>" in finding.expected
    assert "ther?<|im_end|>\n<|im_start|>assistant\n<t||ool_call>\n" in finding.actual


def test_lint_plain_chat_without_reasoning_template_is_clean():
    chatml = ChatTemplate("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
                          name="chatml")
    conv = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}, {"role": "user", "content": "e"}]
    assert chatml.check_append_only(conv) == []


def test_lint_finds_moved_system_text():
    # a template that puts the system text into the latest user turn rewrites earlier turns
    moving = ChatTemplate(
        "{% for m in messages if m.role != 'system' %}<{{ m.role }}>{{ m.content }}"
        "{% if loop.last and m.role == 'user' %} ({{ messages[0].content }}){% endif %}</{{ m.role }}>"
        "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}", name="moving")
    conv = [{"role": "system", "content": "today is Monday"}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"}, {"role": "user", "content": "bye"}]
    (finding,) = moving.check_append_only(conv)
    assert finding.kind == "generation_prompt" and finding.offset == len("<user>hi")
    assert finding.expected == "<user>hi|| (today is Monday)</user><assistant>"
    assert finding.message_index == 2


def test_doctests():
    assert doctest.testmod(template_module).failed == 0
    assert doctest.testmod(messages_module).failed == 0


def test_cli_render_and_lint(tmp_path, capsys):
    from strata_lab.cli import main

    conv = tmp_path / "conv.json"
    conv.write_text(json.dumps({"messages": [{"role": "user", "content": "2+2?"},
                                             {"role": "assistant", "content": "4", "reasoning_content": "add"},
                                             {"role": "user", "content": "3+3?"}]}))
    assert main(["template", str(conv), "--prefix", "It is"]) == 0
    assert capsys.readouterr().out.endswith("3+3?" + END + ASSISTANT + EMPTY_THINK + "It is")
    assert main(["template", str(conv), "--lint"]) == 1
    assert "1 finding(s)" in capsys.readouterr().out
    conv.write_text(json.dumps([{"role": "user", "content": 5}]))
    assert main(["template", str(conv)]) == 2
    assert r"messages[0].content: must be a string" in capsys.readouterr().err
