"""Hypothesis strategies for property-testing tokenizer boundaries.

Every strategy builds its values from `sampled_from` fragments and short lists, so failures shrink to a
few readable fragments (the first fragment of each pool is the simplest, which is where shrinking goes).

>>> from hypothesis import given, settings
>>> @settings(max_examples=5, deadline=None)
... @given(texts())
... def check(t):
...     assert isinstance(t, str)
>>> check()
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from hypothesis import strategies as st

__all__ = ["texts", "alternative_tokenizations", "conversations", "agent_sessions", "SessionTurn", "FRAGMENTS"]

# Boundary hazards, simplest first. Each group is one kind of trouble for BPE / the split regex / NFC.
FRAGMENTS = (
    "a", "hello", " hello", " world", "x", "I", "'s", "'re", "'LL", "s",                      # words, contractions
    "ğ", " öğrenci", "ı", "ş", "İstanbul", "çğıöşü", "straße",                                # Turkish, German
    "你好", "世界", "日本語の", "한국어", "Ω",                                                   # CJK, Greek
    "e\u0301", "\u0301", "\u0338", "a\u0308\u0304", "\u1100\u1161",                              # combining, NFC
    "🙂", "👨\u200d👩\u200d👧", "🏳️\u200d🌈", "\u200d", "\ufe0f",                              # emoji, ZWJ
    "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>",         # added tokens
    "<|im_", "_end|>", "</thi", "nk>", "<", ">", "|", "<|", "|>",                              # their fragments
    " ", "  ", "    ", "\n", "\n\n", " \n", "   \n", "\t", "\r\n", "\u00a0", "\u3000",          # whitespace
    "0", "7", "123", "2024", "3.14",                                                           # digits
    "def f(x):\n    return x", "{}", "();", "==", "[a-zçğıöşü]", r"\d+", "$", "#",               # code, regexes
)


def texts(max_fragments: int = 12) -> st.SearchStrategy[str]:
    """Text biased to tokenizer boundary hazards (see FRAGMENTS), mixed with arbitrary characters.

    Shrinks to the fewest, simplest fragments.

    >>> from hypothesis import find
    >>> find(texts(), lambda t: "<|im_end|>" in t)
    '<|im_end|>'
    """
    if not isinstance(max_fragments, int) or max_fragments < 0:
        raise ValueError(f"max_fragments must be a non-negative int, got {max_fragments!r}")
    piece = st.one_of(st.sampled_from(FRAGMENTS), st.characters(exclude_categories=("Cs",)))
    return st.lists(piece, max_size=max_fragments).map("".join)


_PIECES: dict = {}  # tokenizer id -> {bytes: id}


def _piece_ids(tokenizer) -> dict:
    key = id(tokenizer)
    if key not in _PIECES:
        table = {}
        added = frozenset(tokenizer.added_tokens.values())
        for i in range(tokenizer.vocab_size):
            if i not in added:
                table.setdefault(tokenizer.token_bytes(i), i)
        _PIECES[key] = (table, added)
    return _PIECES[key]


@st.composite
def _split(draw, tokenizer, token_id: int, pieces: dict, added: frozenset, depth: int = 0) -> list[int]:
    raw = tokenizer.token_bytes(token_id)
    if len(raw) < 2 or token_id in added:
        return [token_id]
    how = draw(st.sampled_from(("keep", "split", "bytes")))  # "keep" first: shrinks to canonical
    if how == "keep":
        return [token_id]
    # byte pieces: a byte-level vocabulary has all 256, SentencePiece ones with byte fallback their <0xNN>;
    # a vocabulary without them (Unigram without byte fallback) keeps the token
    as_bytes = [pieces.get(bytes([b])) for b in raw]
    if how == "bytes":
        return as_bytes if None not in as_bytes else [token_id]
    cuts = [i for i in range(1, len(raw)) if raw[:i] in pieces and raw[i:] in pieces]
    if not cuts:
        return as_bytes if None not in as_bytes else [token_id]
    i = draw(st.sampled_from(cuts))
    if depth >= 3:
        return [pieces[raw[:i]], pieces[raw[i:]]]
    return (draw(_split(tokenizer, pieces[raw[:i]], pieces, added, depth + 1))
            + draw(_split(tokenizer, pieces[raw[i:]], pieces, added, depth + 1)))


@st.composite
def alternative_tokenizations(draw, tokenizer, text: str) -> list[int]:
    """Valid id sequences whose bytes are exactly `text.encode("utf-8")`, as a model might emit them.

    Starts from `tokenizer.encode(text)` and splits some tokens into two vocabulary pieces (recursively) or
    into raw byte tokens (which can cut a UTF-8 character in two). Added tokens stay whole. May return the
    canonical ids (that is what it shrinks to).

    The tokenizer normalizes (NFC) before it splits, so for a text that is not in NFC (``"a\u0308\u0304"``)
    its ids spell another text (``"ǟ"``). A model can emit the unnormalized bytes, and this strategy spells
    the text given: where the encoding of a stretch between added tokens does not give that stretch's
    bytes, the stretch starts from the longest vocabulary pieces that do.

    Args:
        tokenizer: a `strata_lab.Tokenizer` (byte-level BPE).
        text: the text every drawn id sequence spells.

    >>> from strata_lab import load_tokenizer
    >>> tok = load_tokenizer("qwen3")
    >>> from hypothesis import find
    >>> find(alternative_tokenizations(tok, "ğ"), lambda ids: len(ids) > 1)
    [128, 253]
    """
    if not isinstance(text, str):
        raise ValueError(f"text must be a str, got {type(text).__name__}")
    pieces, added = _piece_ids(tokenizer)
    out: list[int] = []
    for token_id in _spelling_ids(tokenizer, text, pieces):
        out.extend(draw(_split(tokenizer, token_id, pieces, added)))
    return out


def _spelling_ids(tokenizer, text: str, pieces: dict) -> list[int]:
    """`tokenizer.encode(text)` when its bytes are the text's; else the same with every stretch between
    added tokens that normalization changed spelled by greedy longest vocabulary pieces."""
    ids = tokenizer.encode(text)
    # a SentencePiece tokenizer spells a leading space ('\u2581') that its decode drops: that is still this text
    if tokenizer.ids_bytes(ids) == text.encode("utf-8") or tokenizer.decode(ids) == text:
        return ids
    names = sorted(tokenizer.added_tokens, key=len, reverse=True)
    parts = re.split("(" + "|".join(map(re.escape, names)) + ")", text) if names else [text]
    out: list[int] = []
    for k, part in enumerate(parts):
        if k % 2:                      # an added token, matched whole
            out.append(tokenizer.added_tokens[part])
            continue
        seg = tokenizer.encode(part)
        raw = part.encode("utf-8")
        if tokenizer.ids_bytes(seg) == raw or tokenizer.decode(seg) == part:
            out.extend(seg)
            continue
        i = 0
        while i < len(raw):            # greedy longest match; single bytes are always pieces
            j = min(len(raw), i + 64)
            while raw[i:j] not in pieces:
                j -= 1
            out.append(pieces[raw[i:j]])
            i = j
    return out


_NAMES = ("read_file", "run", "search")


def _tool_call() -> st.SearchStrategy[dict]:
    args = st.dictionaries(st.sampled_from(("path", "cmd", "query")), texts(4), max_size=2)
    return st.builds(lambda name, a: {"type": "function", "function": {"name": name, "arguments": a}},
                     st.sampled_from(_NAMES), args)


TOOLS = [{"type": "function", "function": {"name": n, "description": f"{n} tool", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}, "cmd": {"type": "string"},
                                     "query": {"type": "string"}}}}} for n in _NAMES]


@st.composite
def conversations(draw, max_turns: int = 4) -> dict:
    """An OpenAI-style chat: {"messages": [...], "tools": [...]}.

    Messages: an optional system message, then turns of user -> assistant (optional `reasoning_content`,
    optional `tool_calls` with ids, each followed by its `tool` message naming that id in `tool_call_id`).
    Contents come from `texts()`, so they carry tag strings and other hazards; the last message is a user
    or tool message. Every drawn conversation is one `ChatTemplate.render` accepts (with its `tools`).

    Args:
        max_turns: the most user turns (at least 1).

    >>> from hypothesis import find
    >>> find(conversations(), lambda c: True)["messages"]
    [{'role': 'user', 'content': ''}]
    """
    if not isinstance(max_turns, int) or max_turns < 1:
        raise ValueError(f"max_turns must be a positive int, got {max_turns!r}")
    messages = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(texts(6))})
    n = draw(st.integers(1, max_turns))
    for turn in range(n):
        messages.append({"role": "user", "content": draw(texts(6))})
        if turn == n - 1:
            break
        reply = {"role": "assistant", "content": draw(texts(6))}
        if draw(st.booleans()):
            reply["reasoning_content"] = draw(texts(6))
        calls = [{"id": f"call_{turn}_{j}", **call}
                 for j, call in enumerate(draw(st.lists(_tool_call(), max_size=2)))]
        if calls:
            reply["tool_calls"] = calls
        messages.append(reply)
        for call in calls:
            messages.append({"role": "tool", "tool_call_id": call["id"], "name": call["function"]["name"],
                             "content": draw(texts(6))})
    return {"messages": messages, "tools": TOOLS if draw(st.booleans()) else []}


@dataclass
class SessionTurn:
    """One engine call of an agent session: the prompt text and the ids the model replied with."""

    prompt: str
    reply_ids: list[int] = field(default_factory=list)


@st.composite
def agent_sessions(draw, tokenizer, max_turns: int = 5) -> list[SessionTurn]:
    """Multi-turn agent sessions in ChatML: each prompt renders the history, each reply is model ids.

    A reply is `<think>...</think>` reasoning (sometimes) plus content, given as an alternative
    tokenization and ended by `<|im_end|>`. The next prompt renders the reply's text again, then a tool or
    user turn; sometimes the history drops the reasoning (as templates do), sometimes a turn is edited, so
    the prompt and the remembered reply part ways inside it.

    >>> from strata_lab import load_tokenizer
    >>> from hypothesis import find
    >>> s = find(agent_sessions(load_tokenizer("qwen3")), lambda s: True)
    >>> s[0].prompt.endswith("<|im_start|>assistant\\n"), s[0].reply_ids[-1]
    (True, 151645)
    """
    if not isinstance(max_turns, int) or max_turns < 1:
        raise ValueError(f"max_turns must be a positive int, got {max_turns!r}")
    end = tokenizer.im_end_id
    history = f"<|im_start|>system\n{draw(texts(6))}<|im_end|>\n<|im_start|>user\n{draw(texts(6))}<|im_end|>\n"
    turns: list[SessionTurn] = []
    for _ in range(draw(st.integers(1, max_turns))):
        prompt = history + "<|im_start|>assistant\n"
        thinking = draw(texts(6)) if draw(st.booleans()) else None
        content = draw(texts(8))
        reply_text = (f"<think>\n{thinking}\n</think>\n\n" if thinking is not None else "") + content
        reply_ids = draw(alternative_tokenizations(tokenizer, reply_text)) + [end]
        turns.append(SessionTurn(prompt, reply_ids))
        how = draw(st.sampled_from(("verbatim", "drop_thinking", "edit")))
        shown = content if how == "drop_thinking" else reply_text
        if how == "edit":
            shown = shown[: draw(st.integers(0, len(shown)))] + draw(texts(3))
        role = draw(st.sampled_from(("user", "tool")))
        body = draw(texts(6))
        if role == "tool":
            body = f"<tool_response>\n{body}\n</tool_response>"
        history = prompt + shown + f"<|im_end|>\n<|im_start|>user\n{body}<|im_end|>\n"
    return turns
