"""PromptEncoder: exactness without replies, reply-id reuse, cuts, limits (real Qwen3 vocab)."""
import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strata_lab.text.encoder import PromptEncoder
from strata_lab.testing.strategies import agent_sessions, alternative_tokenizations, texts

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CHAT = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def nfc(t):
    return unicodedata.normalize("NFC", t)


@st.composite
def prompt_sequences(draw):
    """Prompts that grow, get cut back and continue, or restart: what a server sees."""
    prompts, t = [], ""
    for _ in range(draw(st.integers(1, 6))):
        how = draw(st.sampled_from(("extend", "edit", "restart")))
        if how == "edit":
            t = t[: draw(st.integers(0, len(t)))]
        elif how == "restart":
            t = ""
        t += draw(texts(8))
        prompts.append(t)
    return prompts


@SETTINGS
@given(prompt_sequences())
def test_without_replies_ids_equal_full_encode(qwen3, prompts):
    enc = PromptEncoder(qwen3)
    for t in prompts:
        ids = enc.encode(t)
        assert ids == qwen3.encode(nfc(t))
        assert qwen3.decode(ids) == nfc(t)


@SETTINGS
@given(st.data())
def test_sessions_with_replies_decode_to_the_prompt(qwen3, data):
    enc = PromptEncoder(qwen3)
    for turn in data.draw(agent_sessions(qwen3, max_turns=4)):
        ids = enc.encode(turn.prompt)
        # a reused reply spells the model's own bytes (not normalized); fresh text is NFC-normalized
        assert nfc(qwen3.decode(ids)) == nfc(turn.prompt)
        enc.remember_reply(ids, turn.reply_ids)


@SETTINGS
@given(st.data(), texts(6), texts(6))
def test_reply_ids_kept_up_to_the_difference(qwen3, data, reply_text, more):
    enc = PromptEncoder(qwen3)
    reply_text = nfc(reply_text)
    p = enc.encode(CHAT)
    gen = data.draw(alternative_tokenizations(qwen3, reply_text))
    assert enc.remember_reply(p, gen)
    ids = enc.encode(CHAT + reply_text + "<|im_end|>" + more)
    assert qwen3.decode(ids) == nfc(CHAT + reply_text + "<|im_end|>" + more)
    assert ids[: enc.last_stats.kept_ids] == (p + gen)[: enc.last_stats.kept_ids]
    # a non-empty reply without tag-like text is kept whole: its text matches up to '<|im_end|>'
    if gen and "<" not in reply_text and "\u0338" not in more and not reply_text.endswith(("<|im_end", "<", "<|")):
        assert enc.last_stats.kept_ids == len(p) + len(gen)


def test_turkish_reply_pieces_are_reused(qwen3):
    enc = PromptEncoder(qwen3)
    p = enc.encode(CHAT)
    gen = [130947, 5855, 220, 14990]  # ' öğren' 'ci' ' ' 'hello' (canonical: ' öğrenci' ' hello')
    assert enc.remember_reply(p, gen)
    ids = enc.encode(CHAT + " öğrenci hello there")
    assert ids[: len(p) + 4] == p + gen
    assert enc.last_stats.entry_kind == "reply" and enc.last_stats.kept_ids == len(p) + 4
    assert qwen3.encode(CHAT + " öğrenci hello there")[len(p):len(p) + 2] == [135992, 23811]


def test_reply_kept_only_to_where_texts_differ(qwen3):
    enc = PromptEncoder(qwen3)
    p = enc.encode(CHAT)
    gen = [130947, 5855, 220, 14990]
    enc.remember_reply(p, gen)
    ids = enc.encode(CHAT + " öğrenci help")  # differs inside 'hello'
    assert ids[: len(p) + 3] == p + gen[:3]
    assert enc.last_stats.kept_ids == len(p) + 3


def test_without_its_prompt_entry_nothing_is_kept(qwen3):
    enc = PromptEncoder(qwen3)
    assert enc.remember_reply(qwen3.encode(CHAT), [220, 14990]) is False
    assert enc.num_entries == 0
    ids = enc.encode(CHAT + " hello")
    assert ids == qwen3.encode(CHAT + " hello") and enc.last_stats.kept_ids == 0


def test_tag_across_a_cut_is_encoded_whole(qwen3):
    enc = PromptEncoder(qwen3)
    p = enc.encode(CHAT)
    # the model wrote '<|im_' as plain pieces and stopped; the next prompt has the whole tag
    gen = qwen3.encode("ok <|") + qwen3.encode("im_")
    enc.remember_reply(p, gen)
    ids = enc.encode(CHAT + "ok <|im_end|>\n")
    assert qwen3.im_end_id in ids
    assert qwen3.decode(ids) == CHAT + "ok <|im_end|>\n"
    assert ids[-2:] == [qwen3.im_end_id, 198]


def test_tag_written_in_pieces_is_not_kept(qwen3):
    enc = PromptEncoder(qwen3)
    p = enc.encode(CHAT)
    gen = qwen3.encode("hi <") + qwen3.encode("think>") + qwen3.encode(" more")
    enc.remember_reply(p, gen)
    ids = enc.encode(CHAT + "hi <think> more")
    assert qwen3.token_id("<think>") in ids
    assert enc.last_stats.kept_ids <= len(p) + len(qwen3.encode("hi <")) - 1


def test_split_character_is_never_a_cut(qwen3):
    enc = PromptEncoder(qwen3)
    p = enc.encode(CHAT)
    gen = [64, 128, 253, 64]  # 'a', 'ğ' as two byte ids, 'a'
    enc.remember_reply(p, gen)
    ids = enc.encode(CHAT + "ağb")  # differs after 'ğ'
    assert ids[: len(p) + 3] == p + [64, 128, 253]
    ids = enc.encode(CHAT + "ağ")  # the same up to the end of 'ğ': never keeps 128 alone
    assert qwen3.decode(ids) == CHAT + "ağ"
    assert 128 not in ids or ids[ids.index(128) + 1] == 253


def test_reply_with_invalid_utf8_tail_keeps_the_valid_part(qwen3):
    enc = PromptEncoder(qwen3)
    p = enc.encode(CHAT)
    enc.remember_reply(p, [64, 128])  # stopped inside 'ğ'
    ids = enc.encode(CHAT + "ağ")
    assert qwen3.decode(ids) == CHAT + "ağ" and 128 not in ids[len(p):len(p) + 1]


def test_reply_kept_up_to_a_spare_embedding_row(qwen3):
    # a random model can sample rows past the vocabulary (151669..151935): they have no text
    enc = PromptEncoder(qwen3)
    p = enc.encode(CHAT)
    assert enc.remember_reply(p, [130947, 5855, 151800, 220, 14990])
    ids = enc.encode(CHAT + " öğrenci hello")
    assert ids[: len(p) + 2] == p + [130947, 5855] and 151800 not in ids
    assert qwen3.decode(ids) == CHAT + " öğrenci hello"
    with pytest.raises(ValueError, match="gen_ids"):
        enc.remember_reply(p, [qwen3.embedding_rows])


def test_growing_prompt_encodes_only_the_new_text(qwen3):
    enc = PromptEncoder(qwen3)
    base = "word " * 2000
    enc.encode(base)
    ids = enc.encode(base + "and more")
    assert ids == qwen3.encode(base + "and more")
    assert enc.last_stats.chars_encoded < 20 and enc.last_stats.entry_kind == "prompt"
    assert enc.num_entries == 1  # the wholly matched entry was superseded


def test_eviction_at_the_limits(qwen3):
    enc = PromptEncoder(qwen3, max_chars=100, max_tokens=1000)
    enc.encode("a" * 60)
    enc.encode("b" * 30)
    assert enc.num_entries == 2
    enc.encode("c" * 30)  # 120 chars: the oldest goes
    assert enc.num_entries == 2 and enc.total_chars == 60
    long = "x " * 200
    assert enc.encode(long) == qwen3.encode(long)  # too long to cache, still exact
    assert enc.num_entries == 2
    enc = PromptEncoder(qwen3, max_tokens=10)
    enc.encode("one two three four five six")
    enc.encode("seven eight nine ten eleven")
    assert enc.total_tokens <= 10


def test_stats_as_dump_field(qwen3):
    enc = PromptEncoder(qwen3)
    enc.encode("hello world")
    assert enc.last_stats.as_dict() == {"kept_ids": 0, "entry_kind": None, "chars_encoded": 11, "prompt_ids": 2}


def test_bad_input_raises(qwen3):
    with pytest.raises(ValueError, match="max_chars"):
        PromptEncoder(qwen3, max_chars=0)
    with pytest.raises(ValueError, match="max_tokens"):
        PromptEncoder(qwen3, max_tokens=-1)
    enc = PromptEncoder(qwen3)
    with pytest.raises(TypeError, match="text"):
        enc.encode(b"bytes")
    with pytest.raises(ValueError, match="gen_ids"):
        enc.remember_reply([1], [10**9])
    with pytest.raises(ValueError, match="prompt_ids"):
        enc.remember_reply(["x"], [1])


@pytest.mark.parametrize("old,new", [
    ("x  \r\n  <think\u226f<|im_end|>", "x  \r\n  <think><|im_start|>"),  # a tag that begins at a kept cut
    ("a!!<think>nk>123", "a!!<th"),                                      # a window that reached a tag
    ("ab <|im_", "ab <|im_end|>\n"),                                     # a tag completed by new text
    ("   \n\n  x", "   \n\n  \n"),                                       # whitespace-run lookahead
])
def test_regressions_stay_exact(qwen3, old, new):
    enc = PromptEncoder(qwen3)
    enc.encode(old)
    assert enc.encode(new) == qwen3.encode(nfc(new))


@pytest.mark.parametrize("old,new", [
    ("x e", "x e\u0301 and more"),        # a combining mark composes with the entry's last character
    ("a>", "a>\u0338<|im_end|>"),         # '>' + U+0338 -> U+226F, next to a tag
    ("\uac00", "\uac00\u11a8"),           # Hangul LV + T -> LVT, no ASCII to anchor on
    ("ok " + "\u00e9" * 100, "ok " + "\u00e9" * 100 + "\u0301"),  # anchor further back than the scan
])
def test_nfc_across_the_junction(qwen3, old, new):
    enc = PromptEncoder(qwen3)
    enc.encode(old)
    ids = enc.encode(new)
    assert ids == qwen3.encode(nfc(new)) and qwen3.decode(ids) == nfc(new)


@st.composite
def chunky_texts(draw):
    """Texts with many newline-then-ASCII split candidates between hazard fragments."""
    parts = draw(st.lists(st.tuples(texts(4), st.sampled_from(("\n", "\n\n", " \n", ".\n", "\r\n"))),
                          min_size=2, max_size=10))
    lead = st.sampled_from(("a", "x = 1", "<|im_end|>", "<think>", "'s", "1", "  b", "#", "é"))
    return "".join(t + nl + draw(lead) for t, nl in parts)


@SETTINGS
@given(st.lists(chunky_texts(), min_size=1, max_size=3), st.integers(1, 12))
def test_chunked_fresh_encoding_is_exact(qwen3, pieces, chunk_chars):
    """A lowered chunk threshold forces encode_batch splits (and their fallbacks) on small texts."""
    enc = PromptEncoder(qwen3, chunk_chars=chunk_chars)
    t = ""
    for piece in pieces:
        t += piece
        assert enc.encode(t) == qwen3.encode(nfc(t))


def test_long_new_text_is_encoded_in_chunks(qwen3):
    text = "".join(f"line {i}: öğrenci {i * 7} 这个函数 <think>x</think>\n" for i in range(400))
    enc = PromptEncoder(qwen3, chunk_chars=2048)
    assert enc.encode(text) == qwen3.encode(text)
    assert enc._chunks_used >= 4
    more = text + "".join(f"at {i}:\t🙂 ok\n" for i in range(700))
    assert enc.encode(more) == qwen3.encode(more)
    assert enc._chunks_used >= 2 and enc.last_stats.kept_ids > 0
