"""Exact and fast `tokenizer.encode` for the prompts of a log: the same ids, a fraction of the time.

`SegmentEncoder.encode(text) == tokenizer.encode(text)` for byte-level BPE tokenizers configured as Qwen,
Llama-3 and GPT-2 are (normalizer none or NFC; pre-tokenizer one `Split` regex, isolated, then `ByteLevel`
without its own regex, or `ByteLevel` with the GPT-2 regex; BPE without dropout; added tokens matched on the raw
text, without lstrip / rstrip / single_word; no truncation or padding). `SegmentEncoder.of(tokenizer)` is None
for any other tokenizer, and callers use `tokenizer.encode`.

Why it is exact. The tokenizer cuts the text at its added tokens (leftmost-longest) and encodes every piece
between two of them on its own: normalize, split with the regex, map bytes to the byte-level alphabet, BPE per
pre-token. We cut at the same places (one regex of the added-token strings, longest first: leftmost-longest).
A piece that is printable ASCII (plus tab, newline and carriage return) is split by the tokenizer's regex
compiled for ASCII (``\\p{L}`` is ``[A-Za-z]``, ``\\p{N}`` ``[0-9]``, ``\\s`` ASCII whitespace: on these
characters the same classes as onig's), NFC leaves it unchanged, and each pre-token's ids come from the
tokenizer's own BPE model (``model.tokenize``, cached per pre-token); with the Qwen / Llama-3 / GPT-2 regexes,
a piece whose every space is followed by a letter is split at its spaces instead (each space starts a
pre-token there) and its words looked up whole. Any other piece is encoded by the tokenizer itself (it holds
no added token, so it is encoded as it is inside the text).

In C++ (`strata_lab._replay._ByteBpe`, engine/src/byte_bpe.cpp, built once per tokenizer from the vocabulary
and merges of its tokenizer.json and checked against its `encode` on a probe text before use): for the Qwen,
Llama-3 and GPT-2 regexes, the same steps on ASCII stretches (the regex followed alternative by alternative,
each pre-token's ids cached, the BPE merge loop for new ones, long stretches remembered), the added-token scan
of a text, and the session bookkeeping of `IncrementalEncoder` below; a stretch it does not take (a character
outside printable ASCII, tab, newline and carriage return, or a pre-token over 512 bytes) is encoded by
`piece_ids` as described above. Without the compiled extension everything runs in Python, with the same ids.

Why one module: the piece encoder, the incremental encoder and their use of the native encoder rest on one
exactness argument (the text cut at its added tokens, each stretch encoded on its own) and share its state
(the caches of one tokenizer); apart, each would restate it.

`IncrementalEncoder.encode(text, key)` equals the same ids and reuses those of the previous text encoded under
`key` (a session) for every piece before the first difference, encoding only the rest; `extend(key, text,
more_ids)` records that `text` (the prompt + the rendered reply) has the previous ids + `more_ids`, when an
added token starts where the reply starts (then the two encode independently), so the next prompt of the
session re-encodes neither. Both are checked against `tokenizer.encode` by hypothesis in tests/test_fast_render.py.
"""
from __future__ import annotations

import json
import re
from bisect import bisect_right
from collections import OrderedDict
from functools import lru_cache
from itertools import chain
from types import MappingProxyType

from strata_lab.traces.render import _common_prefix

__all__ = ["SegmentEncoder", "IncrementalEncoder"]

_UNSAFE = re.compile(r"[^\t\n\r\x20-\x7e]")  # outside: the tokenizer encodes the piece itself
_GPT2 = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_MAX_PIECES = 1 << 18  # pre-tokens cached (then the cache starts over)
_MIN_KEPT = 64  # stretches between added tokens this long are remembered with their ids ...
_MAX_KEPT_CHARS = 4 << 20  # ... up to this many characters (then they start over; ~10 bytes a character)
_OF: dict = {}  # id(hf tokenizer) -> (it, its SegmentEncoder or None)
# Split regexes in which a newline followed by a printable ASCII character other than space always ends a
# pre-token (a newline only ever sits in a run of whitespace or at the end of a match): Qwen2/3, Llama-3, GPT-2.
# There a stretch can be cut after its first such newline and each part encoded on its own; the part after
# it is remembered too (the same turn text after another header: Qwen3 drops a turn's think block once the
# next user query comes, so the reply's text recurs after "assistant\n" instead of "</think>\n\n").
_QWEN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA3 = _QWEN.replace(r"|\p{N}|", r"|\p{N}{1,3}|", 1)
_LINE_PATTERNS = frozenset((_QWEN, _LLAMA3, _GPT2))
_NATIVE_SPLIT = {_QWEN: 0, _LLAMA3: 1, _GPT2: 2}  # the split regexes strata_lab._replay._ByteBpe follows
# Checked once per tokenizer against its own encode before the native encoder is used (every rule of the
# split regexes on ASCII, merges of long words): a model file that does not match the tokenizer is not used.
_PROBE = ("Hello world, it's 12345 O'Neil'S 'll 'VE 'd 're  tokens!\n\n  def f(x):\n\treturn x  # ok \r\n"
          "  \n}\n\n\t\t{\"a\": [1, 22, 333]}   ...?! internationalization_of_a_long_identifier \n")
_LINE_START = re.compile(r"\n[!-~]")
# In these regexes a space followed by an ASCII letter always starts a pre-token (no alternative matches a
# space and then a letter except from that space on: ``[^\r\n\p{L}\p{N}]?\p{L}+``, `` ?\p{L}+``; the others
# hold only whitespace, or a space only first and then no letter), so an ASCII stretch whose every space is
# followed by a letter splits at its spaces into parts that encode on their own.
# _ODD finds the first character outside _UNSAFE's set, or the first space not followed by a letter.
_ODD = re.compile(r"[^\t\n\r\x20-\x7e]| (?![A-Za-z])")


def _byte_map() -> dict[int, str]:
    """GPT-2's bytes_to_unicode, for the ASCII bytes the fast path sees."""
    keep = list(range(ord("!"), ord("~") + 1))
    out, n = {}, 0
    for b in range(128):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return out


def _ascii_pattern(pattern: str) -> str | None:
    """The split regex for ASCII text (Python `re`), or None if it uses anything we do not translate."""
    out, i, in_class = [], 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            nxt = pattern[i + 1: i + 2]
            if pattern.startswith(("\\p{L}", "\\p{N}"), i):
                cls = "A-Za-z" if pattern[i + 3] == "L" else "0-9"
                out.append(cls if in_class else f"[{cls}]")
                i += 5
                continue
            if nxt in ("s", "S", "r", "n", "t") or (nxt and not nxt.isalnum()):
                out.append(pattern[i: i + 2])
                i += 2
                continue
            return None  # \p{Lu}, \d, \w, \x..: not translated
        if c == "[":
            if in_class:
                return None
            in_class = True
        elif c == "]" and in_class:
            in_class = False
        out.append(c)
        i += 1
    return "".join(out)


class SegmentEncoder:
    """`encode(text)` == `tokenizer.encode(text)`, fast on ASCII; `scan(text, start)` iterates the added-token
    matches from `start` (a position where the tokenizer's own scan resumes)."""

    def __init__(self, tokenizer, split: re.Pattern, added: dict[str, int], lines: bool = False, native=None):
        self.tokenizer = tokenizer
        # in C++ (strata/byte_bpe.h): the ids of an ASCII stretch (None: not one it takes), and the scan of a text
        # for added tokens with its stretches encoded (those it does not take by piece_ids); None: not built
        self._native = native.encode if native is not None else None
        self._into = native.encode_into if native is not None and native.scans else None
        # a session's texts in C++ (IncrementalEncoder): (encode_session, encode_tail), or None
        self._sessions = (native.encode_session, native.encode_tail, native.encode_turn) \
            if self._into is not None else None
        self._bpe = native.bpe if self._into is not None else None  # (for strata_lab._replay.qwen3_turn)
        self._lines = lines  # the split regex is one of _LINE_PATTERNS
        self._hf = tokenizer.hf
        self._model = tokenizer.hf.model
        self._split = split.findall
        self._added = added
        self.max_added = max(map(len, added), default=0)
        self._scan = re.compile("|".join(map(re.escape, sorted(added, key=len, reverse=True)))) if added else None
        self._trans = str.maketrans({chr(b): s for b, s in _byte_map().items()})
        self._pieces: dict[str, list[int]] = {}
        self._words: dict[str, list[int]] = {}  # w -> ids of " " + w (a space followed by a letter)
        self._kept: dict[str, list[int]] = {}  # stretches of >= _MIN_KEPT characters
        self._kept_chars = 0

    @classmethod
    def of(cls, tokenizer) -> "SegmentEncoder | None":
        """The fast encoder for `tokenizer`, or None when its configuration is not one the fast path is exact for
        (one per tokenizer object: its piece cache serves every trace rendered with it)."""
        hf = getattr(tokenizer, "hf", None)
        if hf is None:
            return None
        got = _OF.get(id(hf))
        if got is not None and got[0] is hf:
            return got[1]
        seg = cls._of(tokenizer, hf)
        if len(_OF) > 16:
            _OF.clear()
        _OF[id(hf)] = (hf, seg)
        return seg

    @classmethod
    def _of(cls, tokenizer, hf) -> "SegmentEncoder | None":
        if hf is None or hf.truncation is not None or hf.padding is not None:
            return None
        try:  # the parts' own settings (the whole tokenizer.json would parse the vocabulary too)
            norm = json.loads(hf.normalizer.__getstate__()) if hf.normalizer is not None else None
            pre = json.loads(hf.pre_tokenizer.__getstate__()) if hf.pre_tokenizer is not None else {}
            model = {"type": type(hf.model).__name__, "dropout": getattr(hf.model, "dropout", None)}
        except Exception:  # pragma: no cover - a tokenizer part that cannot serialize itself
            return None
        if norm is not None and norm.get("type") != "NFC":
            return None
        if model.get("type") != "BPE" or model.get("dropout") not in (None, 0, 0.0):
            return None
        if pre.get("type") == "Sequence" and len(pre.get("pretokenizers") or ()) == 2:
            split, level = pre["pretokenizers"]
            if split.get("type") != "Split" or split.get("behavior") != "Isolated" or split.get("invert") \
                    or "Regex" not in (split.get("pattern") or {}):
                return None
            pattern = split["pattern"]["Regex"]
        elif pre.get("type") == "ByteLevel" and pre.get("use_regex", True):
            level, pattern = pre, _GPT2
        else:
            return None
        if level.get("type") != "ByteLevel" or level.get("add_prefix_space") or \
                (level is not pre and level.get("use_regex", True)):
            return None
        ascii_pattern = _ascii_pattern(pattern)
        if ascii_pattern is None:
            return None
        try:
            split_re = re.compile(ascii_pattern, re.ASCII)
        except re.error:
            return None
        added = {}
        for i, t in hf.get_added_tokens_decoder().items():
            if t.normalized or t.lstrip or t.rstrip or t.single_word:
                return None
            if t.content:
                added[t.content] = i
        return cls(tokenizer, split_re, added, pattern in _LINE_PATTERNS,
                   _native_encoder(tokenizer, hf, pattern, added))

    def piece_ids(self, piece: str) -> list[int]:
        """Ids of one stretch of text holding no added token (the tokenizer encodes each such stretch on its
        own, so the same stretch always has the same ids: long ones are remembered, e.g. a tool result that a
        re-rendered turn holds again, or a system prompt every session starts with). The list is shared: do
        not change it."""
        if len(piece) >= _MIN_KEPT:
            got = self._kept.get(piece)
            if got is None:
                m = _LINE_START.search(piece) if self._lines else None
                if m is not None:  # a pre-token starts there: the rest is remembered on its own as well
                    rest = piece[m.end() - 1:]
                    tail = self._kept.get(rest)
                    if tail is None:
                        tail = self._piece_ids(rest)
                        if len(rest) >= _MIN_KEPT:
                            self._kept[rest] = tail
                            self._kept_chars += len(rest)
                    got = self._piece_ids(piece[: m.end() - 1]) + tail
                else:
                    got = self._piece_ids(piece)
                self._kept_chars += len(piece)
                if self._kept_chars > _MAX_KEPT_CHARS:
                    self._kept.clear()
                    self._kept_chars = len(piece)
                self._kept[piece] = got
            return got
        return self._piece_ids(piece)

    def _piece_ids(self, piece: str) -> list[int]:
        if not piece:
            return []
        if self._native is not None:
            got = self._native(piece)
            if got is not None:
                return got
        odd = _ODD.search(piece)  # one pass: a character to leave to the tokenizer, or a space before no letter
        if odd is not None and (odd.group() != " " or _UNSAFE.search(piece, odd.end()) is not None):
            return self._hf.encode(piece, add_special_tokens=False).ids
        if self._lines and odd is None:
            # every space starts a pre-token (it is followed by a letter): the words, each with its space,
            # encode on their own (split in C, looked up by word)
            parts = piece.split(" ")
            ids = self._split_ids(parts[0]) if parts[0] else []
            head, words = len(ids), self._words
            try:
                ids.extend(chain.from_iterable(map(words.__getitem__, parts[1:])))
            except KeyError:  # a word not seen yet (extend stopped part way: the head's ids are kept)
                del ids[head:]
                if len(words) > _MAX_PIECES:
                    words.clear()
                for w in parts[1:]:
                    if w not in words:
                        words[w] = self._split_ids(" " + w)
                ids.extend(chain.from_iterable(map(words.__getitem__, parts[1:])))
            return ids
        return self._split_ids(piece)

    def _split_ids(self, piece: str) -> list[int]:
        pre = self._split(piece)
        cache = self._pieces
        try:
            return list(chain.from_iterable(map(cache.__getitem__, pre)))
        except KeyError:
            if len(cache) > _MAX_PIECES:
                cache.clear()
            tokenize, trans = self._model.tokenize, self._trans
            for p in pre:
                if p not in cache:
                    cache[p] = [t.id for t in tokenize(p.translate(trans))]
            return list(chain.from_iterable(map(cache.__getitem__, pre)))

    def scan(self, text: str, start: int = 0):
        """The added-token matches of `text` from `start`, as the tokenizer finds them."""
        return self._scan.finditer(text, start) if self._scan is not None else iter(())

    def encode(self, text: str) -> list[int]:
        return self.encode_cuts(text)[0]

    def encode_cuts(self, text: str) -> tuple[list[int], list[int], list[int]]:
        """(ids, ends of the added-token matches, ids up to and including each)."""
        ids: list[int] = []
        ends: list[int] = []
        counts: list[int] = []
        if self._into is not None:
            self._into(text, 0, ids, ends, counts, self.piece_ids)
            return ids, ends, counts
        pos, added = 0, self._added
        for m in self.scan(text):
            s = m.start()
            if s > pos:
                ids += self.piece_ids(text[pos:s])
            ids.append(added[m.group()])
            pos = m.end()
            ends.append(pos)
            counts.append(len(ids))
        if pos < len(text):
            ids += self.piece_ids(text[pos:])
        return ids, ends, counts


@lru_cache(maxsize=1)
def _qwen3_turn():
    from strata_lab._native import replay

    return replay().qwen3_turn


def _native_encoder(tokenizer, hf, pattern: str, added: dict[str, int]):
    """`strata_lab._replay._ByteBpe` for the tokenizer's model, or None: a split regex it does not follow, no
    compiled extension, a model it cannot read, or one whose ids differ from the tokenizer's. Its `scans`:
    whether it also cuts texts at the added tokens (they are ASCII)."""
    split = _NATIVE_SPLIT.get(pattern)
    if split is None or not hasattr(tokenizer, "model_json"):
        return None
    from strata_lab._native import replay

    try:
        make = replay()._ByteBpe
    except (ImportError, AttributeError):  # a source checkout without a build, or an older one
        return None
    scans = all(t.isascii() for t in added)
    try:
        bpe = make(tokenizer.model_json(), split, added if scans else {})
    except ValueError:
        return None
    if bpe.vocab_size != hf.get_vocab_size(with_added_tokens=False) or \
            bpe.encode(_PROBE) != hf.encode(_PROBE, add_special_tokens=False).ids:
        return None
    return _Native(bpe, scans)


class _Native:
    __slots__ = ("bpe", "encode", "encode_into", "encode_session", "encode_tail", "encode_turn", "scans")

    def __init__(self, bpe, scans: bool):
        self.bpe = bpe
        self.encode, self.encode_into, self.scans = bpe.encode, bpe.encode_into, scans
        self.encode_session, self.encode_tail, self.encode_turn = bpe.encode_session, bpe.encode_tail, \
            bpe.encode_turn


class FastTokenizer:
    """A tokenizer whose `encode` is a `SegmentEncoder`'s (the same ids); everything else is the tokenizer's."""

    def __init__(self, seg: SegmentEncoder):
        self.seg = seg
        self.encode = seg.encode
        self.added_tokens = MappingProxyType(dict(seg._added))  # (read per call: not a new copy each time)

    def __getattr__(self, name):
        return getattr(self.seg.tokenizer, name)


def _take(ids, a: int, b: int) -> list[int]:
    """ids[a:b] of a list, or of a (prompt ids, reply ids) pair as if joined."""
    if ids.__class__ is list:
        return ids[a:b]
    head, tail = ids
    n = len(head)
    if b <= n:
        return head[a:b]
    if a >= n:
        return tail[a - n: b - n]
    return (head[a:] if a else head) + tail[: b - n]  # one copy


class IncrementalEncoder:
    """`encode(text, key)` == `tokenizer.encode(text)`, reusing the ids of the previous text of `key` up to the
    first added token whose match (or the piece before it) differs. At most `max_keys` keys are remembered."""

    def __init__(self, seg: SegmentEncoder, max_keys: int = 1024):
        self.seg = seg
        self.max_keys = max_keys
        self.reused = 0
        # key -> (text, ids, ends of the added-token matches, ids up to and including each)
        self._last: OrderedDict = OrderedDict()

    def encode(self, text: str, key=None) -> list[int]:
        seg = self.seg
        if seg._sessions is not None:  # the same steps in C++ (its state: strata_lab._replay._IdsState)
            prev = self._last.pop(key, None) if key is not None else None
            ids, state, self.reused = seg._sessions[0](text, prev, seg.piece_ids)
            if key is not None:
                self._remember(key, state)
            return ids
        added = seg._added
        prev = self._last.pop(key, None) if key is not None else None
        ids: list[int] = []
        ends: list[int] = []
        counts: list[int] = []
        start, j, d, pends, pcounts, pids = 0, 0, -1, (), (), ()
        if prev is not None:
            ptext, pids, pends, pcounts = prev
            d = _common_prefix(text, ptext)
            # matches ending this far before the first difference are the same in both texts: resume after them
            j = bisect_right(pends, d - seg.max_added)
            if j:
                start = pends[j - 1]
                ids = _take(pids, 0, pcounts[j - 1])
                ends, counts = pends[:j], pcounts[:j]
        reused = len(ids)
        pos = start
        for m in seg.scan(text, start):
            s, e = m.span()
            if j < len(pends) and e <= d and pends[j] == e:
                # the same match after the same piece: the previous text's ids for both
                ids += _take(pids, pcounts[j - 1] if j else 0, pcounts[j])
                j += 1
                reused = len(ids)
            else:
                j = len(pends)  # the texts part here: encode from now on
                if s > pos:
                    ids += seg.piece_ids(text[pos:s])
                ids.append(added[m.group()])
            pos = e
            ends.append(e)
            counts.append(len(ids))
        if pos < len(text):
            ids += seg.piece_ids(text[pos:])
        self.reused = reused
        if key is not None:
            self._remember(key, (text, ids, ends, counts))
        return ids

    def encode_turn(self, key, prompt: str, full: str) -> tuple[list[int], list[int]]:
        """(`encode(prompt, key)`, `encode_tail(key, full, len(prompt))`): a call's prompt and its reply after
        it (`full` starts with `prompt`), in one native call where there is one."""
        seg = self.seg
        if seg._sessions is not None:
            prev = self._last.pop(key, None) if key is not None else None
            ids, tail, state, self.reused = seg._sessions[2](prompt, full, prev, seg.piece_ids)
            if key is not None:
                self._remember(key, state)
            return ids, tail
        return self.encode(prompt, key), self.encode_tail(key, full, len(prompt))

    def render_turn(self, renderer, messages, tools, thinking, reply, notes: list, key, eos: int):
        """A call rendered by `renderer` (the C++ qwen3 renderer, `FastRenderer.native`) and encoded as
        `encode_turn(key, prompt, full)` in one native step (strata_lab._replay.qwen3_turn): (prompt ids, the
        reply's ids through its last `eos` id, [] without a reply), or None: not a call that step takes (the
        caller renders it the general way)."""
        bpe = self.seg._bpe
        if bpe is None or renderer is None:
            return None
        prev = self._last.get(key) if key is not None else None
        got = _qwen3_turn()(renderer, bpe, messages, tools, thinking, reply, notes, prev, self.seg.piece_ids, eos,
                            key)
        if got is None:
            return None
        ids, tail, state, self.reused = got
        if state is not None and key is not None:  # (with a str key the state stays with the renderer's record)
            self._last.pop(key, None)
            self._remember(key, state)
        return ids, tail

    def encode_tail(self, key, text: str, n: int) -> list[int]:
        """`tokenizer.encode(text[n:])` (a reply after its prompt `text[:n]`, the key's last text). When an
        added token of `text`'s own scan starts at `n` (no match crosses it), `text` encodes as the prompt's ids
        + these, and is recorded as the key's last text: the next prompt reuses the reply's ids too."""
        seg = self.seg
        if seg._sessions is not None:
            tail, state = seg._sessions[1](self._last.get(key) if key is not None else None, text, n, seg.piece_ids)
            if state is not None:
                self._remember(key, state)
            return tail
        tail, tends, tcounts = seg.encode_cuts(text[n:])
        tends = [n + e for e in tends]
        prev = self._last.get(key) if key is not None else None
        if prev is None or len(prev[0]) != n or not text.startswith(prev[0]):
            return tail
        ptext, pids, pends, pcounts = prev
        if pids.__class__ is tuple:  # recorded by an encode_tail already
            pids = pids[0] + pids[1]
        j = bisect_right(pends, n - seg.max_added)
        k = j
        for m in seg.scan(text, pends[j - 1] if j else 0):
            s, e = m.span()
            if s >= n:
                if s != n or k != len(pends):
                    return tail
                break
            if e > n or k >= len(pends) or pends[k] != e:
                return tail  # the longer text's scan differs before n
            k += 1
        else:
            return tail
        base = len(pids)
        # the prompt's ids and the reply's, joined only as far as the next prompt takes them (one copy, not two)
        self._remember(key, (text, (pids, tail), list(pends) + tends,
                             list(pcounts) + [base + c for c in tcounts]))
        return tail

    def _remember(self, key, state) -> None:
        self._last[key] = state
        if len(self._last) > self.max_keys:
            self._last.popitem(last=False)
