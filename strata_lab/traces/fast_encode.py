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
each pre-token's ids cached, the BPE merge loop for new ones, long stretches remembered) and the added-token scan
of a text; a stretch it does not take (a character outside printable ASCII, tab, newline and carriage return,
or a pre-token over 512 bytes) is encoded by `piece_ids` as described above. Without the compiled extension
everything runs in Python, with the same ids.

This is a tokenizer, not a prefix-reusing encoder: `traces.render.PrefixEncoder` reuses a session's previous ids
and hands the rest to `FastTokenizer.encode`. Checked against `tokenizer.encode` by hypothesis in
tests/test_fast_render.py.
"""
from __future__ import annotations

import json
import re
from itertools import chain
from types import MappingProxyType

__all__ = ["SegmentEncoder", "FastTokenizer"]

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
    __slots__ = ("encode", "encode_into", "scans")

    def __init__(self, bpe, scans: bool):
        self.encode, self.encode_into, self.scans = bpe.encode, bpe.encode_into, scans


class FastTokenizer:
    """A tokenizer whose `encode` is a `SegmentEncoder`'s (the same ids); everything else is the tokenizer's."""

    def __init__(self, seg: SegmentEncoder):
        self.seg = seg
        self.encode = seg.encode
        self.encode_cuts = seg.encode_cuts  # (for traces.render.PrefixEncoder)
        self.added_tokens = MappingProxyType(dict(seg._added))  # (read per call: not a new copy each time)

    def __getattr__(self, name):
        return getattr(self.seg.tokenizer, name)
