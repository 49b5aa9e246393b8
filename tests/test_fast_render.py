"""The fast import path gives what the plain one gives: the Python qwen3 renderer the Jinja template's text (and
its refusals), the piece encoder `tokenizer.encode`'s ids, the incremental encoder the same ids as encoding
each prompt whole, and `Trace.render` the same `Rendered` with and without them, on generated agent sessions
(tool calls, reasoning, edits, content null, tool results, odd inputs)."""
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from strata_lab import ChatTemplate, load_tokenizer, load_trace
from strata_lab.text.messages import TemplateInputError
from strata_lab.traces.fast_encode import IncrementalEncoder, SegmentEncoder
from strata_lab.traces.fast_render import FastRenderer
from strata_lab.traces.render import vllm_messages

pytestmark = pytest.mark.filterwarnings("ignore::strata_lab.traces.source.TraceWarning")
TMPL = ChatTemplate.from_name("qwen3")
TOK = load_tokenizer("qwen3")
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))

PIECES = ["the", " cache", "Hello", "\n", "\n\n", " ", "  ", "\t", "\r\n", "'s", "'LL", "123", "4567", ".", "!!",
          "é", "中文", "🙂", "ſ", "\u00a0", "\x0b", "\x1c", "<think>", "</think>", "<|im_start|>", "<|im_end|>",
          "<tool_response>", "</tool_response>", "<tool_call>", "{\"a\": 1}", "\u0301", "K"]
text = st.lists(st.sampled_from(PIECES), max_size=12).map("".join)
args = st.one_of(st.none(), st.just(""), st.just("{}"), st.just('{"path": "a.py", "n": [1, 2]}'),
                 st.just('{"q": "ü \\u00e9"}'), st.just("not json"), st.just("[1, 2]"), st.just('"s"'),
                 st.just({"x": 1}), st.just({"x": 1.0}), st.just({"x": True}), st.just(3))
tool_call = st.builds(lambda i, name, a, typ: {k: v for k, v in (("id", i), ("type", typ), ("function", {
    "name": name, "arguments": a})) if v != "-"},
    st.sampled_from(["c1", "c2", None, "-", 7]), st.sampled_from(["read", "write_file", ""]), args,
    st.sampled_from(["function", None, "-", "other"]))


@st.composite
def message(draw):
    role = draw(st.sampled_from(["system", "user", "user", "assistant", "assistant", "tool", "tool", "developer"]))
    m = {"role": role}
    kind = draw(st.sampled_from(["str", "str", "none", "parts", "absent", "badparts"]))
    if kind == "str":
        m["content"] = draw(text)
    elif kind == "none":
        m["content"] = None
    elif kind == "parts":
        m["content"] = [{"type": "text", "text": draw(text)} for _ in range(draw(st.integers(0, 2)))]
    elif kind == "badparts":
        m["content"] = [{"type": "image_url", "image_url": "x"}]
    if role == "assistant":
        if draw(st.booleans()):
            m["tool_calls"] = draw(st.lists(tool_call, max_size=2))
        if draw(st.integers(0, 3)) == 0:
            m["reasoning_content"] = draw(st.one_of(text, st.none()))
    if role == "tool" and draw(st.integers(0, 5)):
        m["tool_call_id"] = draw(st.sampled_from(["c1", "c2", "zz", ""]))
    if draw(st.integers(0, 9)) == 0:
        m["name"] = draw(st.sampled_from(["bob", 3]))
    return m


def session_messages():
    return st.lists(message(), min_size=0, max_size=7)


tools = st.one_of(st.none(), st.just([]), st.just([{"type": "function", "function": {
    "name": "read", "description": "Read a file", "parameters": {"type": "object", "properties": {
        "path": {"type": "string"}}}}}]), st.just([{"type": "function", "function": {"name": ""}}]))
kwargs = st.sampled_from([{}, {"enable_thinking": True}, {"enable_thinking": False}, {"enable_thinking": None},
                          {"enable_thinking": 0}, {"other": 1}])
replies = st.one_of(st.none(), st.builds(
    lambda c, r, calls: {k: v for k, v in (("role", "assistant"), ("content", c), ("reasoning_content", r),
                                           ("tool_calls", calls)) if v is not None},
    st.one_of(text, st.just("")), st.one_of(st.none(), text), st.one_of(st.none(), st.lists(tool_call, max_size=2))))


def _slow(msgs, tools, kw, reply):
    notes = []
    vm = vllm_messages(msgs, notes)
    try:
        prompt = TMPL.render(vm, tools=tools, add_generation_prompt=True, **kw)
    except (ValueError, TypeError):
        return None, None, notes
    full = None
    if reply is not None:
        try:
            full = TMPL.render(vm + [vllm_messages([reply])[0]], tools=tools, add_generation_prompt=False, **kw)
        except (ValueError, TypeError):
            full = "refused"
    return prompt, full, notes


@SETTINGS
@given(session_messages(), tools, kwargs, replies, st.integers(0, 8), session_messages())
def test_fast_renderer_matches_the_jinja_template(msgs, tools, kw, reply, keep, other):
    fast = FastRenderer.of(TMPL)
    # the session's previous call: part of this one's history, then other messages (an edit)
    fast.render(msgs[:keep] + other, tools, dict(kw), [], None, key="s")
    notes: list = []
    got = fast.render(msgs, tools, dict(kw), notes, reply, key="s")
    prompt, full, slow_notes = _slow(msgs, tools, kw, reply)
    if got is None:
        return  # the caller renders with the template: nothing to compare
    assert prompt is not None, "the fast renderer rendered what the template refuses"
    assert got[0] == prompt and notes == slow_notes
    if reply is not None:
        assert full != "refused" and got[1] == full


def test_fast_renderer_takes_the_common_shapes():
    """What real logs hold renders on the fast path (not only by falling back)."""
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "read", "arguments": '{"p": 1}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "r"},
            {"role": "assistant", "content": "a", "reasoning_content": "why"},
            {"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}]}]
    fast = FastRenderer.of(TMPL)
    for kw in ({}, {"enable_thinking": False}):
        got = fast.render(msgs, None, kw, [], {"role": "assistant", "content": "ok"})
        assert got is not None and got[0] == _slow(msgs, None, kw, None)[0]
    assert FastRenderer.of(ChatTemplate(TMPL.source + " ", name="other")) is None


def test_equal_but_differently_typed_arguments_are_not_reused():
    """1 == 1.0 == True, but tojson writes them apart: a message is taken from the session's previous call only
    when it has no object arguments."""
    fast = FastRenderer.of(TMPL)
    for value in (1, 1.0, True):
        msgs = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"x": value}}}]}]
        got = fast.render(msgs, None, {}, [], None, key="s")
        assert got[0] == TMPL.render(vllm_messages(msgs)) and json.dumps(value) in got[0]


def test_a_refused_message_is_refused_the_same_way(tmp_path):
    """A message the template's checks refuse is refused (and the call skipped) with the template's error."""
    bad = [{"role": "assistant", "content": "a", "tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "f", "arguments": "{}"}}]}, {"role": "tool", "tool_call_id": "nope", "content": "r"}]
    assert FastRenderer.of(TMPL).render(bad, None, {}, [], None) is None
    with pytest.raises(TemplateInputError, match="does not match a tool call"):
        TMPL.render(vllm_messages(bad))
    path = tmp_path / "log.jsonl"
    path.write_text(json.dumps({"model": "m", "messages": bad}) + "\n")
    trace = load_trace(path)
    assert list(trace.render(TOK)) == [] and "does not match a tool call" in trace.render_skipped[0][1]


SEG_TEXT = st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=6)), max_size=25).map("".join)


@pytest.fixture(scope="module", params=["qwen3", "llama3"])
def family(request, tmp_path_factory):
    if request.param == "qwen3":
        return TOK
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from tokenizer_families import build

    return load_tokenizer(str(build(request.param, tmp_path_factory.mktemp(request.param))))


def test_segment_encoder_applies_to_byte_level_families_only(family, tmp_path):
    assert SegmentEncoder.of(family) is not None
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from tokenizer_families import build

    for other in ("deepseek_v3", "mistral", "gemma"):
        assert SegmentEncoder.of(load_tokenizer(str(build(other, tmp_path / other)))) is None


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_segment_encoder_matches_the_tokenizer(family, data):
    seg = SegmentEncoder.of(family)
    t = data.draw(SEG_TEXT)
    assert seg.encode(t) == family.hf.encode(t, add_special_tokens=False).ids


LONG = st.lists(st.sampled_from(PIECES[:16] + ["\n!", "\nx", "x\n", " \n", "\n\n", "def f():\n    return 1\n", "é\n"]),
                min_size=10, max_size=60).map("".join)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_long_stretches_are_remembered_exactly(family, data):
    """Long stretches (and what follows their first line break) are remembered with their ids: the same text
    after other headers, or again, still encodes as the tokenizer does."""
    seg = SegmentEncoder.of(family)
    body = data.draw(LONG)
    for head in ("", "\n\n", "assistant\n", "x", " ", "\n", "</think>\n\n", "é"):
        for text in (head + body, head + body + "<|im_end|>" + body):
            assert seg.encode(text) == family.hf.encode(text, add_special_tokens=False).ids, (head, body)


@SETTINGS
@given(st.lists(st.tuples(st.integers(0, 3), SEG_TEXT, SEG_TEXT), min_size=1, max_size=6))
def test_incremental_encoder_matches_whole_encodes(steps):
    """A session's prompts grow, get edited (cut back and continued) and replies are appended: every prompt's
    ids and every reply's ids are those of encoding it whole."""
    enc = IncrementalEncoder(SegmentEncoder.of(TOK))
    text = "<|im_start|>system\nYou are terse.<|im_end|>\n"
    for cut, more, reply in steps:
        if cut and text:
            text = text[: len(text) * cut // 4]  # an edit: back to a point, then on
        text += more + "<|im_start|>assistant\n"
        assert enc.encode(text, "s") == TOK.encode(text)
        full = text + reply + "<|im_end|>\n"
        assert enc.encode_tail("s", full, len(text)) == TOK.encode(full[len(text):])
        text = full if cut % 2 else text + reply


def _agent_log(path, seed):
    import random

    rng = random.Random(seed)
    words = "the cache prefix tool read é 中文 <think> x\n".split(" ")
    lines = []
    for s in range(3):
        msgs = [{"role": "system", "content": " ".join(rng.choices(words, k=20))}]
        for turn in range(6):
            r = rng.random()
            if r < 0.2 and len(msgs) > 2:  # the client edits its history
                msgs = msgs[: rng.randrange(1, len(msgs))]
            if msgs[-1]["role"] == "assistant" and msgs[-1].get("tool_calls"):
                msgs.append({"role": "tool", "tool_call_id": msgs[-1]["tool_calls"][0]["id"],
                             "content": " ".join(rng.choices(words, k=15))})
            else:
                msgs.append({"role": "user", "content": " ".join(rng.choices(words, k=10))})
            reply = {"role": "assistant", "content": None, "tool_calls": [{"id": f"c{s}{turn}", "type": "function",
                     "function": {"name": "read", "arguments": json.dumps({"p": f"f{turn}.py"})}}]} \
                if rng.random() < 0.5 else {"role": "assistant", "content": " ".join(rng.choices(words, k=8)),
                                            "reasoning_content": "think " * rng.randrange(0, 3) or None}
            body = {"model": "m", "messages": msgs}
            if rng.random() < 0.3:
                body["chat_template_kwargs"] = {"enable_thinking": False}
            lines.append(json.dumps({"request": body, "response": {"choices": [{"message": reply}]}}))
            msgs = msgs + [{k: v for k, v in reply.items() if k != "reasoning_content"}]
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("seed", range(4))
def test_trace_render_fast_path_equals_the_plain_one(tmp_path, seed):
    path = tmp_path / "log.jsonl"
    _agent_log(path, seed)
    fast = [(c["source"], r) for c, r in load_trace(path).render(TOK)]
    plain = [(c["source"], r) for c, r in load_trace(path).render(TOK, fast=False)]
    assert len(fast) == len(plain) == 18 and fast == plain


FIX = Path(__file__).parent / "fixtures" / "traces"


@pytest.mark.parametrize("name", sorted(p.name for p in FIX.iterdir() if p.suffix != ".md"))
def test_every_fixture_renders_the_same_on_both_paths(name):
    """The hand-written logs of every format (odd cases included): the same calls skipped, the same ids."""
    fast, plain = load_trace(FIX / name), load_trace(FIX / name)
    a = [(c["source"], r) for c, r in fast.render(TOK)]
    b = [(c["source"], r) for c, r in plain.render(TOK, fast=False)]
    assert a == b and fast.render_skipped == plain.render_skipped
