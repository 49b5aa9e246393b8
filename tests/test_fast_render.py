"""The fast import path gives what the plain one gives: the piece encoder `tokenizer.encode`'s ids, the
prefix-reusing encoder the same ids as encoding each prompt whole, and `Trace.render` the same `Rendered` with
and without them, on generated agent sessions (tool calls, reasoning, edits, content null, tool results, odd
inputs), with the qwen3 template and with real non-Qwen ones (DeepSeek V3.1, Llama 3.1). Every template is
rendered by `ChatTemplate` (Jinja) on both paths."""
import functools
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from strata_lab import ChatTemplate, load_tokenizer, load_trace
from strata_lab.text.messages import TemplateInputError
from strata_lab.traces.fast_encode import FastTokenizer, SegmentEncoder
from strata_lab.traces.render import PrefixEncoder, vllm_messages

pytestmark = pytest.mark.filterwarnings("ignore::strata_lab.traces.source.TraceWarning")
TMPL = ChatTemplate.from_name("qwen3")
TOK = load_tokenizer("qwen3")
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))

PIECES = ["the", " cache", "Hello", "\n", "\n\n", " ", "  ", "\t", "\r\n", "'s", "'LL", "123", "4567", ".", "!!",
          "é", "中文", "🙂", "ſ", "\u00a0", "\x0b", "\x1c", "<think>", "</think>", "<|im_start|>", "<|im_end|>",
          "<tool_response>", "</tool_response>", "<tool_call>", "{\"a\": 1}", "\u0301", "K"]
text = st.lists(st.sampled_from(PIECES), max_size=12).map("".join)
def test_a_refused_message_is_refused_the_same_way(tmp_path):
    """A message the template's checks refuse is refused (and the call skipped) with the template's error."""
    bad = [{"role": "assistant", "content": "a", "tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "f", "arguments": "{}"}}]}, {"role": "tool", "tool_call_id": "nope", "content": "r"}]
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
    if family is TOK:  # and without the compiled extension
        assert _python_only().encode(t) == TOK.hf.encode(t, add_special_tokens=False).ids


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


@functools.lru_cache(maxsize=1)
def _python_only():
    """A SegmentEncoder that does everything in Python (as without the compiled extension)."""
    seg = SegmentEncoder._of(TOK, TOK.hf)
    seg._native = seg._into = None
    return seg


@SETTINGS
@given(st.lists(st.tuples(st.integers(0, 3), SEG_TEXT, SEG_TEXT), min_size=1, max_size=6), st.booleans())
def test_prefix_encoder_matches_whole_encodes(steps, native):
    """A session's prompts grow, get edited (cut back and continued) and replies are appended: every prompt's
    ids are those of encoding it whole, with the piece encoder (in C++ and in Python) below it."""
    enc = PrefixEncoder(FastTokenizer(SegmentEncoder.of(TOK) if native else _python_only()))
    text = "<|im_start|>system\nYou are terse.<|im_end|>\n"
    for cut, more, reply in steps:
        if cut and text:
            text = text[: len(text) * cut // 4]  # an edit: back to a point, then on
        text += more + "<|im_start|>assistant\n"
        assert enc.encode(text, "s") == TOK.encode(text)
        text = text + reply + "<|im_end|>\n" if cut % 2 else text + reply


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


TEMPLATES = Path(__file__).parent / "fixtures" / "templates"
# real templates as their models ship them (tests/fixtures/templates/README.md): one non-Qwen template of each
# shape (DeepSeek V3.1 splices tool-call arguments in as strings; Llama 3.1 puts tools in the first user turn)
REAL = {"qwen3": None, "deepseek-v3.1": TEMPLATES / "deepseek-ai-DeepSeek-V3.1.jinja",
        "llama-3.1": TEMPLATES / "llama.cpp" / "meta-llama-Llama-3.1-8B-Instruct.jinja"}


@functools.lru_cache(maxsize=None)
def _template(name: str) -> ChatTemplate:
    if REAL[name] is None:
        return TMPL
    return ChatTemplate(REAL[name].read_text(encoding="utf-8"), name=name,
                        special_tokens={"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"})


@pytest.mark.parametrize("template", sorted(REAL))
@pytest.mark.parametrize("seed", range(4))
def test_trace_render_fast_path_equals_the_plain_one(tmp_path, seed, template):
    """The calls of agent sessions (tool calls, reasoning, edits, thinking switched off): the same `Rendered`
    on the fast path as with every prompt encoded whole, and the same text as the template renders each
    call alone, for qwen3 and real non-Qwen templates."""
    path = tmp_path / "log.jsonl"
    _agent_log(path, seed)
    tmpl = _template(template)
    fast = [(c, r) for c, r in load_trace(path).render(TOK, tmpl)]
    plain = [(c["source"], r) for c, r in load_trace(path).render(TOK, tmpl, fast=False)]
    assert len(fast) == len(plain) == 18 and [(c["source"], r) for c, r in fast] == plain
    for call, r in fast:  # the prompt is the template's rendering of the call, whatever came before it
        msgs = vllm_messages(([{"role": "system", "content": call["system"]}] if call["system"] else [])
                             + call["messages"], parse_arguments=template != "deepseek-v3.1")
        kw = (call["extra"] or {}).get("chat_template_kwargs") or {}
        assert r.prompt_ids == TOK.encode(tmpl.render(msgs, tools=call["tools"], **kw))


FIX = Path(__file__).parent / "fixtures" / "traces"


@pytest.mark.parametrize("name", sorted(p.name for p in FIX.iterdir() if p.suffix != ".md"))
def test_every_fixture_renders_the_same_on_both_paths(name):
    """The hand-written logs of every format (odd cases included): the same calls skipped, the same ids."""
    fast, plain = load_trace(FIX / name), load_trace(FIX / name)
    a = [(c["source"], r) for c, r in fast.render(TOK)]
    b = [(c["source"], r) for c, r in plain.render(TOK, fast=False)]
    assert a == b and fast.render_skipped == plain.render_skipped


# --- a call costs what it adds: word-split encoding, lines parsed after their shared prefix, messages
# converted and chained incrementally

WORD = st.lists(st.sampled_from(["the", "Cache", "x", "it's", "a1", "b.", "(c)", "d\n\ne", "f\tg", "12", "é", "'LL",
                                 "h,", "I!", "j\n", "<|im_end|>k", "", "  ", "\r\n"]), min_size=1, max_size=4).map("".join)
WORDS = st.lists(WORD, max_size=30).map(" ".join)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_text_split_at_its_spaces_encodes_as_the_tokenizer_does(family, data):
    """Text whose every space is followed by a letter is encoded word by word (split at the spaces); other
    text by the split regex: both as the tokenizer encodes it, in both families."""
    seg = SegmentEncoder.of(family)
    t = data.draw(WORDS)
    for text in (t, " " + t, t + " ", "x " + t):
        assert seg.encode(text) == family.hf.encode(text, add_special_tokens=False).ids, text


def _agent_lines(rng, sessions=3, turns=5, odd=True):
    """Request lines of agent sessions as clients write them (each resends the history), in the shapes the
    OpenAI reader takes, with what could fool a reader that skips a shared prefix."""
    lines, live = [], []
    for s in range(sessions):
        live.append([{"role": "system", "content": f"sys {s % 2}"}])
    for t in range(sessions * turns):
        s = rng.randrange(sessions)
        msgs = live[s]
        r = rng.random()
        if r < 0.15 and len(msgs) > 2:
            msgs = msgs[: rng.randrange(1, len(msgs))]  # an edit
        new = rng.choice([{"role": "user", "content": rng.choice(["hi", "a \"messages\": [1]", "é"])},
                          {"role": "tool", "tool_call_id": rng.choice(["c1", 1, 1.0, True]), "content": "r"},
                          {"role": "user", "content": [{"type": "text", "text": "p"}, {"type": "image_url"}]},
                          {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
                           "function": {"name": "f", "arguments": rng.choice(['{"a": 1}', {"a": 1}, {"a": 1.0}])}}]}])
        msgs = msgs + [new]
        reply = {"role": "assistant", "content": f"ok {t}"}
        shape = rng.randrange(6) if odd else 0
        if shape == 0:
            rec = {"request": {"model": "m", "messages": msgs}, "response": {"choices": [{"message": reply}]}}
        elif shape == 1:
            rec = {"model": "m", "session_id": f"s{s}", "messages": msgs}
        elif shape == 2:  # a "messages" array elsewhere first: the marker must not land there
            rec = {"metadata": {"messages": msgs}, "request": {"model": "m", "messages": msgs}}
        elif shape == 3:
            rec = {"custom_id": f"q{t}", "method": "POST", "url": "/v1/chat/completions",
                   "body": {"model": "m", "messages": msgs}}
        elif shape == 4:
            rec = {"model": "m", "messages": []}
        else:
            rec = {"model": "m", "messages": msgs}
        text = json.dumps(rec, indent=rng.choice([None, None, 1]))
        if shape == 0 and rng.random() < 0.1:
            text = text.replace('"messages": [', '"messages":[ ', 1)
        if not odd or rng.random() < 0.9:
            lines.append(text.replace("\n", " ") if "\n" in text else text)
        else:
            lines.append(rng.choice(["not json", "[1, 2]", text[: len(text) // 2]]))
        live[s] = msgs + [reply]
    return lines


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
@pytest.mark.parametrize("seed", range(12))
def test_lines_parsed_after_their_shared_prefix_are_the_lines(tmp_path, seed, native):
    """Records read by parsing only what a line adds to a recent one are the records `json_lines` reads (the
    same values, number types included, and the same lines skipped), on sessions with edits, other shapes,
    a decoy array, spacing, invalid lines; and prefixes are in fact taken."""
    import random
    import warnings

    from strata_lab.traces.openai import SharedPrefixLines
    from strata_lab.traces.source import Source

    path = tmp_path / "log.jsonl"
    path.write_text("\n".join(_agent_lines(random.Random(seed), sessions=1 + seed % 4, turns=8)) + "\n")
    reader = SharedPrefixLines()
    if native:
        assert reader._array_end is not None  # the compiled extension is built here
    else:  # the json module's scanner finds where the arrays end (no compiled extension)
        reader._array_end = None
    with warnings.catch_warnings(record=True) as got_w:
        warnings.simplefilter("always")
        got = list(reader.records(Source(path)))
    with warnings.catch_warnings(record=True) as want_w:
        warnings.simplefilter("always")
        want = list(Source(path).json_lines())
    assert got == want and [str(w.message) for w in got_w] == [str(w.message) for w in want_w]
    for (_, a), (_, b) in zip(got, want):  # equal and also the same types (1 == 1.0 == True)
        assert json.dumps(a) == json.dumps(b)
    clean = tmp_path / "clean.jsonl"
    clean.write_text("\n".join(_agent_lines(random.Random(seed), sessions=2, turns=6, odd=False)) + "\n")
    reader = SharedPrefixLines()
    if not native:
        reader._array_end = None
    assert list(reader.records(Source(clean))) == list(Source(clean).json_lines()) and reader.shared > 0


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
    | st.text(alphabet=st.sampled_from(list('ab"\\[]{},: \n\t') + ["\u00e9", "\u2028", "\U0001f600"])),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=12)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(head=st.lists(_JSON_VALUES, max_size=3), tail=st.lists(_JSON_VALUES, max_size=4),
       ws=st.sampled_from(["", " ", "\n  ", "\t\r\n"]), ascii_only=st.booleans(), whole=st.booleans())
def test_native_array_end_is_the_json_scanners(head, tail, ws, ascii_only, whole):
    """`_replay.json_array_end` (where a line's messages array ends, found in C++) says what the json module's
    scanner says, for arrays of any JSON values (strings with quotes, backslashes, brackets, non-ASCII), any
    spacing, continuing after a first part of the array (after its comma) or from its start, and a truncated
    line (None)."""
    from strata_lab.traces.openai import SharedPrefixLines

    reader = SharedPrefixLines()
    assert reader._array_end is not None
    items = [json.dumps(v, ensure_ascii=ascii_only) for v in head + tail]
    sep = ws + "," + ws
    start = '{"model": "m", "messages":' + ws + "["
    if head and tail:  # resumed after the elements an earlier line held, as the reader does
        start += ws + sep.join(items[: len(head)]) + ws + ","
        items = items[len(head):]
    text = start + ws + sep.join(items) + ws + "]" + ws + ', "x": [1, "]"]}'
    line = (text if whole else text[: len(start) + (len(text) - len(start)) * 2 // 3]).encode()
    rest = len(start.encode())
    got = reader._array_end(line, rest)
    end, n = reader._scan_tail(line, rest)
    assert (None if end is None else (rest + end, n)) == got
    if whole and items:  # the array is whole: its end is found, with its element count
        assert got is not None and got[1] == len(items) and line[got[0]:].lstrip().startswith(b"]")
    if not items:
        assert got is None


@pytest.mark.parametrize("seed", range(12))
def test_calls_converted_and_chained_incrementally_are_those_read_whole(tmp_path, seed):
    """The OpenAI reader converts and chains only what a request adds to a recent one: every call (messages,
    notes, session, all fields) equals what converting each request whole and chaining it gives."""
    import random

    from strata_lab.traces.log_calls import SessionChain
    from strata_lab.traces.openai import from_request, reply_message
    from strata_lab.traces.source import Source

    path = tmp_path / "agent.jsonl"
    path.write_text("\n".join(_agent_lines(random.Random(seed), sessions=1 + seed % 3, turns=8)) + "\n")
    got = load_trace(path, format="openai").calls()
    chain, want = SessionChain("agent"), []
    for lineno, rec in Source(path).json_lines():
        body = rec["body"] if "custom_id" in rec else rec.get("request", rec)
        try:
            call = from_request(body, rec.get("response"))
        except ValueError:
            continue
        sid = rec.get("session_id")
        call["session"] = str(sid) if sid else chain.session_of_messages(call["messages"], reply_message(call))
        want.append(call)
    assert len(got) == len(want) > 0
    for g, w in zip(got, want):
        assert json.dumps(g["messages"]) == json.dumps(w["messages"])
        assert (g["session"], g["notes"], g["tools"]) == (w["session"], w["notes"], w["tools"])


@pytest.mark.parametrize("template", sorted(REAL))
@pytest.mark.parametrize("seed", range(3))
def test_agent_logs_render_the_same_on_both_paths(tmp_path, seed, template):
    """The whole fast path (lines, conversion, chaining, render, encode) on agent logs with edits and odd
    shapes: the same Rendered, call by call, as the Jinja template and `tokenizer.encode`."""
    import random

    path = tmp_path / "agent.jsonl"
    path.write_text("\n".join(_agent_lines(random.Random(seed), sessions=2, turns=8)) + "\n")
    tmpl = _template(template)
    a, b = load_trace(path, format="openai"), load_trace(path, format="openai")
    fast = [(c["source"], r) for c, r in a.render(TOK, tmpl)]
    plain = [(c["source"], r) for c, r in b.render(TOK, tmpl, fast=False)]
    # (the non-Qwen templates refuse more of the odd shapes: a tool result without its call, ...)
    assert len(fast) > (5 if template == "qwen3" else 0) and fast == plain
    assert a.render_skipped == b.render_skipped


# --- the native byte-level BPE (strata/byte_bpe.h): ASCII stretches encoded in C++, exactly


def _gpt2_style(folder: Path) -> Path:
    """A small GPT-2-style tokenizer (ByteLevel with its own regex, merges applied to every word)."""
    import sys

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    sys.path.insert(0, str(Path(__file__).parent))
    from tokenizer_families import CORPUS

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=600, show_progress=False,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return folder


@pytest.fixture(scope="module", params=["qwen3", "llama3", "gpt2"])
def native_family(request, tmp_path_factory):
    if request.param == "qwen3":
        tok = TOK
    elif request.param == "gpt2":
        tok = load_tokenizer(str(_gpt2_style(tmp_path_factory.mktemp("gpt2"))))
    else:
        import sys

        sys.path.insert(0, str(Path(__file__).parent))
        from tokenizer_families import build

        tok = load_tokenizer(str(build(request.param, tmp_path_factory.mktemp(request.param))))
    seg = SegmentEncoder.of(tok)
    assert seg is not None and seg._native is not None, "the native encoder is built (scripts/dev_build.sh)"
    return tok, seg._native


ASCII_PIECES = ["'s", "'S", "'t", "'T", "'re", "'Re", "'ve", "'VE", "'m", "'M", "'ll", "'lL", "'d", "'D", "'r", "'v",
                "'l", "'", "''", " '", "a", "Hello", "world", " the", "  ", "   ", " ", "\t", "\t\t", "\n", "\n\n",
                "\r", "\r\n", " \n", "\n ", "\t\n", " \r\n ", "0", "7", "12", "123", "4567", "1.5", " 9", ".", "...",
                "!?", " !", "(", "{", "}", "\"", "#", "_", "-", "~", "\\", "x" * 40,
                "internationalization", "supercalifragilistic", "Qu", "AbC", "dEf", "<think>", "</think>", "<|im_end|>",
                "<|im_start|>", "<|eot_id|>", "<|start_header_id|>", "<", "<|", "|>"]
ASCII_TEXT = st.lists(st.one_of(st.sampled_from(ASCII_PIECES),
                                st.text(alphabet=[chr(c) for c in range(0x20, 0x7f)] + ["\t", "\n", "\r"],
                                        max_size=8)), max_size=30).map("".join)


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_native_encoder_matches_the_tokenizer(native_family, data):
    """Printable ASCII with tabs, newlines and carriage returns (contractions in both cases, digit runs,
    punctuation runs, whitespace runs before words, digits, punctuation and line ends, long words, added
    tokens): the C++ pre-tokenizer and merge loop give the tokenizer's own ids, for a stretch (`encode`) and
    for a text cut at its added tokens (`encode_into`, from any position)."""
    tok, native = native_family
    seg = SegmentEncoder.of(tok)
    t = data.draw(ASCII_TEXT)
    want = tok.hf.encode(t, add_special_tokens=False).ids
    if not any(a in t for a in tok.added_tokens):
        got = native(t)
        assert got == want or (got is None and len(t) > 512), t
    pos = data.draw(st.integers(0, len(t)))
    head = seg.encode(t[:pos])
    ids, ends, counts = list(head), [], []
    seg._into(t, pos, ids, ends, counts, seg.piece_ids)
    assert ids[len(head):] == tok.hf.encode(t[pos:], add_special_tokens=False).ids, (t, pos)
    assert all(t[:e].endswith(tuple(tok.added_tokens)) and ids[c - 1] in tok.added_tokens.values()
               for e, c in zip(ends, counts))


@pytest.mark.parametrize("text", ["x" * 600, "é", "a\x0bb", "a\x0cb", "a\x1cb", "\x7f", "ab" + "-" * 513])
def test_native_encoder_leaves_what_it_does_not_take(native_family, text):
    """Characters outside printable ASCII + tab / newline / carriage return, and pre-tokens over 512 bytes, are
    not encoded natively (None: fast_encode encodes them the other way), and the text still encodes exactly."""
    tok, native = native_family
    assert native(text) is None
    seg = SegmentEncoder.of(tok)
    assert seg.encode(text) == tok.hf.encode(text, add_special_tokens=False).ids


def test_native_encoder_refuses_a_model_it_cannot_read():
    from strata_lab._native import replay

    with pytest.raises(ValueError, match="BPE"):
        replay()._ByteBpe(b'{"model": {"type": "Unigram", "vocab": [["a", 0.0]]}}', 0, {})
    with pytest.raises(ValueError, match="tokenizer JSON"):
        replay()._ByteBpe(b'{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [', 0, {})
    with pytest.raises(ValueError, match="split"):
        replay()._ByteBpe(TOK.model_json(), 7, {})


def test_a_tokenizer_whose_file_changed_is_read_from_its_model(tmp_path):
    """The model's JSON comes from the tokenizer.json while that file is unchanged, else from the tokenizer
    itself: the native tables always describe the loaded tokenizer."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from tokenizer_families import build

    tok = load_tokenizer(str(build("llama3", tmp_path / "l")))
    assert tok.model_json() == (tmp_path / "l" / "tokenizer.json").read_bytes()
    (tmp_path / "l" / "tokenizer.json").write_text("{}")
    got = json.loads(tok.model_json())
    assert got["type"] == "BPE" and len(got["vocab"]) == tok.hf.get_vocab_size(with_added_tokens=False)
