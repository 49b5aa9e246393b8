"""The Qwen3 tokenizer built from BPE ranks must match tiktoken on the same ranks exactly."""
import random
import unicodedata

import pytest
from hypothesis import given, settings, strategies as st

from strata_lab.text.tokenizer import QWEN_PATTERN, TOKENIZER_SPECS, _resource_path, read_tiktoken_ranks

tiktoken = pytest.importorskip("tiktoken")

FRAGMENTS = [
    "Hello", " world", "def f(x):\n    return x**2\n", "for (int i = 0; i < n; ++i) {", "[a-zçğıöşü]+",
    "çğıöşü", "ÇĞİÖŞÜ", " öğrenci", "İstanbul'da", "你好，世界", "日本語のテキスト", "한국어", "😀", "👩‍👩‍👧‍👦",
    "🏳️‍🌈", "e\u0301", "a\u0308\u0323", "\u0301", "   ", "\n\n\n", "\t\t", " \n ", "\r\n", "0123456789",
    "3.14159", "1,000,000", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>",
    "<tool_call>", "</tool_response>", "<|im_", "</thi", "<|", "|>", "'s", "'LL", "don't", "ﬁ", "Å", "Å",
    "\x00", "\u200b", "\ufeff", "€", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "ا", "עברית", "ñ", "...", "!!!", "```python", "https://x.y/z?q=1",
]


def _tiktoken_encoding():
    spec = TOKENIZER_SPECS["qwen3"]
    ranks = read_tiktoken_ranks(_resource_path(spec.resource))
    special = {s: spec.first_added_id + i for i, s in enumerate(spec.added_tokens)}
    return tiktoken.Encoding("qwen3-ref", pat_str=QWEN_PATTERN, mergeable_ranks=ranks, special_tokens=special)


@pytest.fixture(scope="module")
def reference():
    return _tiktoken_encoding()


def _generated_strings(n, seed=1234):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        parts = rng.choices(FRAGMENTS, k=rng.randint(1, 8))
        if rng.random() < 0.3:  # random code points, including combining marks and astral planes
            parts.append("".join(chr(rng.choice([rng.randint(32, 0x2FF), rng.randint(0x300, 0x36F),
                                                  rng.randint(0x4E00, 0x9FFF), rng.randint(0x1F300, 0x1FAFF)]))
                                 for _ in range(rng.randint(1, 6))))
        out.append("".join(parts))
    return out


def test_parity_with_tiktoken_on_generated_strings(qwen3, reference):
    texts = _generated_strings(3000)
    mismatches = []
    for text in texts:
        ours = qwen3.encode(text)
        ref = reference.encode(unicodedata.normalize("NFC", text), allowed_special="all")
        if ours != ref:
            mismatches.append((text, ours, ref))
    assert not mismatches, f"{len(mismatches)} mismatches, first: {mismatches[0]!r}"


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=60))
def test_parity_and_round_trip_on_arbitrary_text(qwen3, reference, text):
    ids = qwen3.encode(text)
    assert ids == reference.encode(unicodedata.normalize("NFC", text), allowed_special="all")
    assert qwen3.decode(ids) == unicodedata.normalize("NFC", text)
    assert qwen3.ids_bytes(ids) == unicodedata.normalize("NFC", text).encode("utf-8")


def test_known_ids(qwen3):
    assert qwen3.encode(" öğrenci") == [135992]
    assert qwen3.encode(" hello") == [23811]
    assert qwen3.decode([130947, 5855]) == " öğrenci"  # a model's own, non-canonical pieces
    assert qwen3.decode([220, 14990]) == " hello"
    assert qwen3.ids_bytes([128, 253]) == "ğ".encode()
    assert qwen3.decode([128]) == "\ufffd"


def test_added_tokens_in_order(qwen3):
    spec = TOKENIZER_SPECS["qwen3"]
    assert len(spec.added_tokens) == 26
    for i, name in enumerate(spec.added_tokens):
        assert qwen3.token_id(name) == 151643 + i
        assert qwen3.encode(name) == [151643 + i]
    assert qwen3.token_id("<think>") == 151667 and qwen3.token_id("</think>") == 151668
    special = {qwen3.token_id(n) for n in spec.added_tokens[:14]}
    assert qwen3.special_ids == special
    assert qwen3.vocab_size == 151669 and qwen3.embedding_rows == 151936
    assert qwen3.encode("foo<|im_end|>bar") == [7975, 151645, 2257]


def test_token_bytes_concatenate_to_text(qwen3):
    for text in _generated_strings(200, seed=7):
        norm = unicodedata.normalize("NFC", text)
        assert qwen3.ids_bytes(qwen3.encode(text)) == norm.encode("utf-8")


def test_spare_embedding_rows_have_no_text(qwen3):
    # 151669..151935 are rows of the model's embedding with no token: a random model can sample them
    assert qwen3.token_bytes(151700) == b""
    assert qwen3.decode([9707, 151700, 1879]) == "Hello world"
    with pytest.raises(ValueError, match="out of range"):
        qwen3.token_bytes(qwen3.embedding_rows)


def test_bad_ids_raise(qwen3):
    with pytest.raises(ValueError, match="out of range"):
        qwen3.decode([10**7])
    with pytest.raises(ValueError, match="out of range"):
        qwen3.token_bytes(-1)
    with pytest.raises(TypeError, match="str"):
        qwen3.encode(b"bytes")


def test_load_from_file_round_trips(qwen3, tmp_path):
    from strata_lab import load_tokenizer

    qwen3.save(tmp_path / "tokenizer.json")
    again = load_tokenizer(tmp_path)
    text = "Merhaba dünya <think>düşün</think>"
    assert again.encode(text) == qwen3.encode(text)
    with pytest.raises(FileNotFoundError, match="no tokenizer named"):
        load_tokenizer(tmp_path / "missing")


def test_qwen3_5_vocabulary():
    from strata_lab import load_tokenizer

    tok = load_tokenizer("qwen3.5")
    spec = TOKENIZER_SPECS["qwen3.5"]
    assert tok.token_id("<|endoftext|>") == 248044
    assert tok.token_id("<|audio_pad|>") == 248044 + len(spec.added_tokens) - 1
    ranks = read_tiktoken_ranks(_resource_path(spec.resource))
    ref = tiktoken.Encoding("q35", pat_str=spec.pattern, mergeable_ranks=ranks,
                            special_tokens={s: spec.first_added_id + i for i, s in enumerate(spec.added_tokens)})
    for text in _generated_strings(300, seed=99):
        assert tok.encode(text) == ref.encode(unicodedata.normalize("NFC", text), allowed_special="all"), text
