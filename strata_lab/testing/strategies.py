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

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache

from hypothesis import strategies as st

__all__ = ["texts", "alternative_tokenizations", "conversations", "agent_sessions", "SessionTurn", "FRAGMENTS"]

# Boundary hazards, simplest first. Each group is one kind of trouble for BPE / the split regex / NFC.
_TEXT = (
    "a", "hello", " hello", " world", "x", "I", "'s", "'re", "'LL", "s",                      # words, contractions
    "ğ", " öğrenci", "ı", "ş", "İstanbul", "çğıöşü", "straße",                                # Turkish, German
    "你好", "世界", "日本語の", "한국어", "Ω",                                                   # CJK, Greek
    "e\u0301", "\u0301", "\u0338", "a\u0308\u0304", "\u1100\u1161",                              # combining, NFC
    "🙂", "👨\u200d👩\u200d👧", "🏳️\u200d🌈", "\u200d", "\ufe0f",                              # emoji, ZWJ
)
_QWEN_ADDED = ("<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>")  # added tokens
_QWEN_PARTS = ("<|im_", "_end|>", "</thi", "nk>")                                              # their fragments
_MARKUP = ("<", ">", "|", "<|", "|>")
_REST = (
    " ", "  ", "    ", "\n", "\n\n", " \n", "   \n", "\t", "\r\n", "\u00a0", "\u3000",          # whitespace
    "0", "7", "123", "2024", "3.14",                                                           # digits
    "def f(x):\n    return x", "{}", "();", "==", "[a-zçğıöşü]", r"\d+", "$", "#",               # code, regexes
)
# the default pool: Qwen's (ChatML) added tokens and their fragments; `texts(tokenizer=...)` puts another's there
FRAGMENTS = _TEXT + _QWEN_ADDED + _QWEN_PARTS + _MARKUP + _REST


def _specials(tokenizer) -> tuple:
    """The special strings `texts` mixes in: a tokenizer's added tokens in id order, or the strings given."""
    if hasattr(tokenizer, "added_tokens"):
        added = tokenizer.added_tokens
        return tuple(t for t in sorted(added, key=added.get) if t)
    if isinstance(tokenizer, (list, tuple)) and all(isinstance(t, str) and t for t in tokenizer):
        return tuple(dict.fromkeys(tokenizer))
    raise ValueError("tokenizer: must be a Tokenizer or a list of non-empty special-token strings, got "
                     f"{type(tokenizer).__name__}")


def _pool(tokenizer) -> tuple:
    """FRAGMENTS with the tokenizer's special strings (and each one's two halves) in place of Qwen's."""
    if tokenizer is None:
        return FRAGMENTS
    specials = _specials(tokenizer)
    halves = [h for t in specials if len(t) > 1 for h in (t[: len(t) // 2], t[len(t) // 2:])]
    return tuple(dict.fromkeys(_TEXT + specials + tuple(halves) + _MARKUP + ("[", "]", "｜") + _REST))


@lru_cache(maxsize=256)
def _texts(max_fragments: int, pool: tuple) -> st.SearchStrategy[str]:
    # one strategy object per pool and size: hypothesis validates each new one (costly inside a draw loop)
    piece = st.one_of(st.sampled_from(pool), st.characters(exclude_categories=("Cs",)))
    return st.lists(piece, max_size=max_fragments).map("".join)


def texts(max_fragments: int = 12, *, tokenizer=None) -> st.SearchStrategy[str]:
    """Text biased to tokenizer boundary hazards (see FRAGMENTS), mixed with arbitrary characters.

    Shrinks to the fewest, simplest fragments.

    Args:
        max_fragments: the most fragments (or characters) joined.
        tokenizer: a `strata_lab.Tokenizer` whose added tokens (special or not: ``<|eot_id|>``, ``[INST]``,
            ``<｜User｜>``, ``<think>``) and their halves replace Qwen's in the pool, or a list of such strings.
            None: FRAGMENTS (Qwen's ChatML tokens).

    >>> from hypothesis import find
    >>> find(texts(), lambda t: "<|im_end|>" in t)
    '<|im_end|>'
    >>> find(texts(tokenizer=["[INST]", "[/INST]"]), lambda t: "[/INST]" in t)
    '[/INST]'
    """
    if not isinstance(max_fragments, int) or isinstance(max_fragments, bool) or max_fragments < 0:
        raise ValueError(f"max_fragments must be a non-negative int, got {max_fragments!r}"
                         + (" (pass a tokenizer as tokenizer=)" if hasattr(max_fragments, "added_tokens") else ""))
    return _texts(max_fragments, _pool(tokenizer))


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
_ARGUMENTS = ("mapping", "string", "either")


@lru_cache(maxsize=64)
def _tool_call(arguments: str = "mapping", pool: tuple = FRAGMENTS) -> st.SearchStrategy[dict]:
    args = st.dictionaries(st.sampled_from(("path", "cmd", "query")), _texts(4, pool), max_size=2)
    if arguments != "mapping":   # the JSON string a client sends (as `vllm_messages(parse_arguments=False)`)
        as_string = args.map(lambda a: json.dumps(a, ensure_ascii=False))
        args = as_string if arguments == "string" else st.one_of(args, as_string)
    return st.builds(lambda name, a: {"type": "function", "function": {"name": name, "arguments": a}},
                     st.sampled_from(_NAMES), args)


TOOLS = [{"type": "function", "function": {"name": n, "description": f"{n} tool", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}, "cmd": {"type": "string"},
                                     "query": {"type": "string"}}}}} for n in _NAMES]

_PROBED: dict = {}  # (template source, special tokens) -> (takes a system message, splices argument strings)


def _template_takes(template) -> tuple[bool, bool]:
    """(whether `template` renders a system message, whether it splices tool-call arguments in as strings: it
    fails on a parsed mapping with a TypeError and renders the client's JSON string, the rule `render_call`
    follows), found by probe renders once per template."""
    key = (template.source, tuple(sorted(template.special_tokens.items())))
    if key not in _PROBED:
        from strata_lab.traces.render import vllm_messages

        def renders(messages) -> bool | Exception:
            try:
                template.render(messages, tools=TOOLS)
                return True
            except ValueError as exc:   # TemplateRenderError, TemplateInputError: the template refuses this
                return exc

        user = [{"role": "user", "content": "probe"}]
        call = {"id": "call00001", "type": "function", "function": {"name": "read_file", "arguments": {"path": "a"}}}
        calls = user + [{"role": "assistant", "content": "", "tool_calls": [call]},
                        {"role": "tool", "tool_call_id": "call00001", "name": "read_file", "content": "probe"}]
        got = renders(calls)
        strings = (got is not True and isinstance(got.__cause__, TypeError)
                   and renders(vllm_messages(calls, parse_arguments=False)) is True)
        _PROBED[key] = (renders([{"role": "system", "content": "probe"}] + user) is True, strings)
    return _PROBED[key]


def conversations(max_turns: int = 4, *, arguments: str | None = None, template=None) -> st.SearchStrategy[dict]:
    """An OpenAI-style chat: {"messages": [...], "tools": [...]}.

    Messages: an optional system message, then turns of user -> assistant (optional `reasoning_content`,
    optional `tool_calls` with ids, each followed by its `tool` message naming that id in `tool_call_id`).
    Contents come from `texts()`, so they carry tag strings and other hazards; the last message is a user
    or tool message. Every drawn conversation passes `ChatTemplate.render`'s checks and renders under the qwen3
    template (with its `tools`); with `template=`, its tool-call arguments are in the form that template takes.

    Args:
        max_turns: the most user turns (at least 1).
        arguments: how tool-call ``arguments`` are given: "mapping" (parsed, as vLLM hands them to a template;
            the default), "string" (the JSON string the client sent) or "either" (drawn per call).
        template: a `ChatTemplate`: the arguments are what a server hands this template (`render_call`'s
            rule): the client's JSON strings where it splices strings (DeepSeek V3 / R1 / V3.1 as shipped:
            ``'<｜tool▁sep｜>' + arguments``, which fails on a mapping), else mappings. Not with `arguments`.
            What else a template refuses it still refuses (Llama 3.1: one tool call per message).

    >>> from hypothesis import find
    >>> find(conversations(), lambda c: True)["messages"]
    [{'role': 'user', 'content': ''}]
    """
    if not isinstance(max_turns, int) or max_turns < 1:
        raise ValueError(f"max_turns must be a positive int, got {max_turns!r}")
    if arguments is not None and arguments not in _ARGUMENTS:
        raise ValueError(f"arguments: must be one of {', '.join(_ARGUMENTS)}, got {arguments!r}")
    if template is not None:
        if arguments is not None:
            raise ValueError("arguments: give arguments= or template= (which decides them), not both")
        if not hasattr(template, "render") or not hasattr(template, "special_tokens"):
            raise ValueError(f"template: must be a ChatTemplate, got {type(template).__name__}")
        arguments = "string" if _template_takes(template)[1] else "mapping"
    return _conversations(max_turns, arguments or "mapping")


@st.composite
def _conversations(draw, max_turns: int, arguments: str) -> dict:
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
        calls = [{"id": f"call{turn:03d}{j:02d}", **call}   # nine letters and digits, as Mistral's templates want
                 for j, call in enumerate(draw(st.lists(_tool_call(arguments), max_size=2)))]
        if calls:
            reply["tool_calls"] = calls
        messages.append(reply)
        for call in calls:
            messages.append({"role": "tool", "tool_call_id": call["id"], "name": call["function"]["name"],
                             "content": draw(texts(6))})
    return {"messages": messages, "tools": TOOLS if draw(st.booleans()) else []}


@dataclass
class SessionTurn:
    """One engine call of an agent session: the prompt text and the ids the model replied with, and the
    messages (and tools) the prompt is the chat template's render of."""

    prompt: str
    reply_ids: list[int] = field(default_factory=list)
    messages: list[dict] = field(default_factory=list)
    tools: list | None = None


def _default_template(tokenizer):
    """The chat template that goes with `tokenizer`: the qwen3 preset for a named Qwen vocabulary, else the
    one in the model folder its tokenizer.json was loaded from (`resolve`'s rule)."""
    from strata_lab.text.template import ChatTemplate
    from strata_lab.text.tokenizer import TOKENIZER_SPECS

    if getattr(tokenizer, "name", None) in TOKENIZER_SPECS:
        return ChatTemplate.from_name("qwen3")
    file = getattr(tokenizer, "_file", None)
    if file is not None:
        from strata_lab.traces.trace import resolve

        try:
            return resolve(str(file[0].parent), None)[1]
        except FileNotFoundError:
            pass
    raise ValueError(f"template: no chat template goes with tokenizer {getattr(tokenizer, 'name', tokenizer)!r} "
                     "(none in its folder); pass template=ChatTemplate.from_file(...)")


def agent_sessions(tokenizer, max_turns: int = 5, *, template=None) -> st.SearchStrategy[list[SessionTurn]]:
    """Multi-turn agent sessions under a chat template: each prompt is the template's render of the history,
    each reply is model ids.

    A reply is content, with reasoning (sometimes, where the template has reasoning markers) and a tool call
    (when a tool output comes next), as the template writes the turn (`reply_ids`, the rule trace rendering
    follows), given as an alternative tokenization and ended by the template's end-of-turn marker
    (`TemplateStructure.turn_end`: one id where the tokenizer has it as an added token). The next prompt renders
    the reply again, then a tool output or a user turn; sometimes the history drops the reasoning, sometimes the
    reply's content is edited, so the prompt and the remembered reply part ways inside it. Contents come from
    `texts(tokenizer=tokenizer)`: they carry the tokenizer's own special strings.

    Args:
        tokenizer: a `strata_lab.Tokenizer`.
        max_turns: the most engine calls (at least 1).
        template: a `ChatTemplate`; None: the one that goes with the tokenizer (the qwen3 preset for the named
            Qwen vocabularies, else its model folder's). A template that ends a reply's turn with no marker
            (e.g. ``eos_token`` not set) is a ValueError naming it.

    >>> from strata_lab import load_tokenizer
    >>> from hypothesis import find
    >>> s = find(agent_sessions(load_tokenizer("qwen3")), lambda s: True)
    >>> s[0].prompt.endswith("<|im_start|>assistant\\n"), s[0].reply_ids[-1]
    (True, 151645)
    """
    from strata_lab.text.structure import TemplateStructure

    if not isinstance(max_turns, int) or max_turns < 1:
        raise ValueError(f"max_turns must be a positive int, got {max_turns!r}")
    if not hasattr(tokenizer, "added_tokens") or not hasattr(tokenizer, "encode"):
        raise ValueError(f"tokenizer: must be a Tokenizer, got {type(tokenizer).__name__}")
    if template is None:
        template = _default_template(tokenizer)
    elif not hasattr(template, "render") or not hasattr(template, "special_tokens"):
        raise ValueError(f"template: must be a ChatTemplate, got {type(template).__name__}")
    structure = TemplateStructure.of(template)
    if structure.turn_end is None:
        raise ValueError(f"template: {template.name!r} writes no end-of-turn marker after a reply, so a reply has "
                         "no end-of-turn id (is its eos_token set? ChatTemplate.with_special_tokens_from(folder))")
    mark = structure.turn_end
    end = [tokenizer.added_tokens[mark]] if mark in tokenizer.added_tokens else tokenizer.encode(mark)
    system, strings = _template_takes(template)
    return _sessions(tokenizer, template, end, structure.think is not None, system, "string" if strings else "mapping",
                     max_turns)


def _before_end(ids: list[int], end: list[int]) -> list[int]:
    """`ids` up to the last occurrence of the end-of-turn ids (all of them when it is not there)."""
    return ids[:next((i for i in range(len(ids) - len(end), -1, -1) if ids[i:i + len(end)] == end), len(ids))]


@st.composite
def _sessions(draw, tokenizer, template, end: list[int], thinks: bool, system: bool, arguments: str,
              max_turns: int) -> list[SessionTurn]:
    from strata_lab.traces.render import reply_ids

    pool = _pool(tokenizer)
    text = lambda n: _texts(n, pool)  # noqa: E731
    messages = [{"role": "system", "content": draw(text(6))}] if system else []
    messages.append({"role": "user", "content": draw(text(6))})
    tools = TOOLS if draw(st.booleans()) else None
    turns: list[SessionTurn] = []
    for k in range(draw(st.integers(1, max_turns))):
        prompt = template.render(messages, tools=tools)
        reply = {"role": "assistant", "content": draw(text(8))}
        if thinks and draw(st.booleans()):
            reply["reasoning_content"] = draw(text(6))
        after = draw(st.sampled_from(("user", "tool")))
        if after == "tool":   # ids of nine letters and digits: Mistral's templates insist on that shape
            reply["tool_calls"] = [{"id": f"call{k:05d}", **draw(_tool_call(arguments, pool))}]
        body = _before_end(reply_ids(tokenizer, template, messages, reply, prompt, tools, []), end)
        ids = draw(alternative_tokenizations(tokenizer, tokenizer.decode(body))) + end
        turns.append(SessionTurn(prompt, ids, list(messages), tools))
        how = draw(st.sampled_from(("verbatim", "drop_thinking", "edit")))
        shown = dict(reply)
        if how == "drop_thinking":
            shown.pop("reasoning_content", None)
        elif how == "edit":
            content = shown["content"]
            shown["content"] = content[: draw(st.integers(0, len(content)))] + draw(text(3))
        messages.append(shown)
        if after == "tool":
            call = reply["tool_calls"][0]
            messages.append({"role": "tool", "tool_call_id": call["id"], "name": call["function"]["name"],
                             "content": draw(text(6))})
        else:
            messages.append({"role": "user", "content": draw(text(6))})
    return turns
