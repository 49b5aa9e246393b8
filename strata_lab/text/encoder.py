"""PromptEncoder: encode growing prompts incrementally, reusing a reply's own token ids.

An agent's prompt grows by a few thousand tokens a turn but is 100K+ tokens long; encoding it afresh every
turn costs time proportional to the whole prompt. The encoder keeps *entries* (text + ids + safe cuts) of
what it encoded and of prompt-plus-reply sequences the server told it about. For a new prompt it takes the
entry sharing the longest text prefix, keeps that entry's ids up to the last safe cut at or before the first
text difference `d`, and encodes the rest afresh.

Contract (all texts are NFC-normalized first, as the Qwen tokenizers do):
* `decode(encode(t)) == nfc(t)` always.
* Without reply entries, `encode(t) == tokenizer.encode(nfc(t))` exactly (== `tokenizer.encode(t)` for every
  text whose NFC form does not change an added token, i.e. all but pathological inputs like '<think>' + U+0338).
* Reply regions are the one place where ids may differ from full BPE: they are the model's own pieces.

Why a cut is exact. The tokenizer splits out added tokens (leftmost-longest), then runs the split regex
(QWEN_PATTERN) over each segment and BPE per pre-token. Ids of the text before a pre-token boundary `b`
are the same in the old and new text iff every regex match before `b` examined only common text. The regex
has no lookbehind, so the match at `q` depends only on text from `q` onward; from its alternatives, it
examines at most up to `max(q+3, run_end(q)+1, run_end(q+1)+1)`, where `run_end` is the end of the run of
letters / digits / whitespace / other starting there (an "other" run extended by the whitespace after it,
for `[\r\n]*`); a scan that reaches the segment end examined the added token that ends the segment up
to its end (or the end of text, at len+1). Classes are taken as supersets (unassigned code points join
every class), so this is an upper bound. Each cut stores `reach`, the prefix maximum of these windows. A cut
is safe iff `cut <= d' and reach <= d'`, where d' is d moved back to the start of any added-token text of
the new prompt that begins before d and ends after it, and no added-token text straddles the cut.

Long fresh text (>= 2 * `chunk_chars`) is encoded in up to 8 chunks with the tokenizer's `encode_batch`
(Rust threads, GIL released). Each split is proved exact by the same rule, read the other way: the chunk
before a split p, which runs a little past p, must have a pre-token start at p whose reach lies inside it;
otherwise the rest is encoded in one call (see `_encode_fresh`).

Why one module: the cut rule, the entry store and the chunked fresh encode share one invariant (a cut's
`reach`); split across files, a change to one would silently break the proof the others rely on.

>>> from strata_lab import load_tokenizer
>>> tok = load_tokenizer("qwen3")
>>> enc = PromptEncoder(tok)
>>> enc.encode("Hello world") == tok.encode("Hello world")
True
>>> ids = enc.encode("Hello world, and more")
>>> enc.last_stats.entry_kind, enc.last_stats.kept_ids
('prompt', 1)
"""
from __future__ import annotations

import itertools
import unicodedata
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Sequence

import numpy as np

__all__ = ["PromptEncoder", "EncodeStats"]

_NEVER = np.iinfo(np.int64).max // 4  # reach of a cut that may never be used

# Supersets of the regex classes of QWEN_PATTERN; unassigned code points (Cn) join every class so that a
# Unicode-version difference between `regex` and the tokenizer's onig can only lengthen a window.
_CLASS_RUNS = {
    "L": r"[\p{L}\p{Cn}]+",
    "N": r"[\p{N}\p{Cn}]+",
    "W": r"[\s\x1c-\x1f\x85\p{Cn}]+",
    "P": r"[^\p{L}\p{N}\t\n\x0b\x0c\r ]+",
}


@dataclass(frozen=True)
class EncodeStats:
    """What one `encode` reused: ids kept from an entry, that entry's kind, characters encoded afresh."""

    kept_ids: int
    entry_kind: str | None  # "prompt", "reply" or None (nothing kept)
    chars_encoded: int
    prompt_ids: int

    def as_dict(self) -> dict:
        """The `encoder` field of a dump line (Contract 2)."""
        return asdict(self)


class _Entry:
    """One remembered sequence. cut_* are parallel int64 arrays, ascending, starting with the cut at 0.

    They are views of the first `n_cuts` columns of `cuts` ([3, capacity]), so that an entry superseding
    this one can append its new cuts in place (amortized O(new cuts), not O(prompt) a turn)."""

    __slots__ = ("kind", "text", "ids", "cuts", "n_cuts", "prompt_len", "prompt_chars")

    def __init__(self, kind, text, ids, cuts, n_cuts, prompt_len, prompt_chars):
        self.kind = kind
        self.text = text
        self.ids = ids                # list[int]: what encode returned / prompt + reply ids
        self.cuts = cuts              # rows: char offset of each cut, ids before it, its reach
        self.n_cuts = n_cuts          # (a cut is usable iff reach <= first text difference; non-decreasing)
        self.prompt_len = prompt_len  # ids of the prompt part (== len(ids) for prompt entries)
        self.prompt_chars = prompt_chars  # characters of the prompt part

    @property
    def cut_chars(self) -> np.ndarray:
        return self.cuts[0, :self.n_cuts]

    @property
    def cut_tokens(self) -> np.ndarray:
        return self.cuts[1, :self.n_cuts]

    @property
    def cut_reach(self) -> np.ndarray:
        return self.cuts[2, :self.n_cuts]


class PromptEncoder:
    """Incremental prompt encoder over a `strata_lab.Tokenizer` (see module docstring for the contract).

    >>> from strata_lab import load_tokenizer
    >>> tok = load_tokenizer("qwen3")
    >>> enc = PromptEncoder(tok)
    >>> p = enc.encode("<|im_start|>user\\nSay hi<|im_end|>\\n<|im_start|>assistant\\n")
    >>> enc.remember_reply(p, [220, 14990, tok.im_end_id])   # ' hello' as the model wrote it: ' ' + 'hello'
    True
    >>> ids = enc.encode("<|im_start|>user\\nSay hi<|im_end|>\\n<|im_start|>assistant\\n hello<|im_end|>\\n")
    >>> ids[len(p):len(p) + 3] == [220, 14990, tok.im_end_id]
    True
    """

    def __init__(self, tokenizer, max_chars: int = 1_000_000, max_tokens: int = 262_144,
                 chunk_chars: int = 4096):
        for name, value in (("max_chars", max_chars), ("max_tokens", max_tokens), ("chunk_chars", chunk_chars)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.tokenizer = tokenizer
        self.max_chars = max_chars
        self.max_tokens = max_tokens
        self.chunk_chars = chunk_chars  # new text of >= 2 * chunk_chars is encoded in chunks, in parallel
        self.last_stats: EncodeStats | None = None
        self._entries: list[_Entry] = []  # oldest first
        self._chunks_used = 0
        self._tags = {t: i for t, i in tokenizer.added_tokens.items()}
        self._tag_ids = frozenset(self._tags.values())
        self._max_tag = max((len(t) for t in self._tags), default=0)
        # a tag that is a proper prefix of another could still grow into it: its window covers that
        self._tag_len = {i: max(len(u) for u in self._tags if u.startswith(t)) for t, i in self._tags.items()}
        self._nbytes = _byte_lengths(tokenizer)  # bytes of each id
        self._is_tag = np.zeros(len(self._nbytes), dtype=bool)
        self._win_len = np.zeros(len(self._nbytes), dtype=np.int64)
        for i, length in self._tag_len.items():
            self._is_tag[i] = True
            self._win_len[i] = length

    # --- public ---------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Ids of `nfc(text)`, reusing the best entry's ids up to a safe cut; sets `last_stats`."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        # entry texts are NFC, so only the text after the common prefix needs the NFC check (see _nfc_split)
        matches = [(entry, _common_prefix_len(entry.text, text)) for entry in reversed(self._entries)]
        b = _nfc_split(text, max((d for _, d in matches), default=0))
        if not unicodedata.is_normalized("NFC", text[b:]):
            text = text[:b] + unicodedata.normalize("NFC", text[b:])
            matches = [(entry, _common_prefix_len(entry.text, text)) for entry, _ in matches]
        best, best_j, best_c, best_d = None, 0, 0, 0
        for entry, d in matches:  # newest first wins ties
            if d == 0:
                continue
            j, c = self._cut(entry, d, text)
            if best is None or entry.cut_tokens[j] > best.cut_tokens[best_j]:
                best, best_j, best_c, best_d = entry, j, c, d
        kept = int(best.cut_tokens[best_j]) if best is not None else 0
        start_reach = int(best.cut_reach[best_j]) if best is not None else 0
        fresh_ids, q, tok_idx, window = self._encode_fresh(text[best_c:])
        f_chars, f_tokens, f_reach = _cuts(q, tok_idx, window, best_c, kept, start_reach)
        supersede = best is not None and kept and best_d == len(best.text)  # text starts with best.text
        if supersede:  # wholly matched: the new entry takes over its id list (no copy of a long prompt)
            ids = best.ids
            del ids[kept:]
            ids.extend(fresh_ids)
        elif best is not None:
            ids = best.ids[:kept] + fresh_ids
        else:
            ids = fresh_ids
        n_cuts = best_j + len(f_chars)
        if supersede and n_cuts <= best.cuts.shape[1]:
            cuts = best.cuts  # append in place: the superseded entry goes
        else:
            cuts = np.empty((3, n_cuts + n_cuts // 2 if supersede else n_cuts), np.int64)
            if best_j:
                cuts[:, :best_j] = best.cuts[:, :best_j]
        cuts[0, best_j:n_cuts] = f_chars
        cuts[1, best_j:n_cuts] = f_tokens
        cuts[2, best_j:n_cuts] = f_reach
        self.last_stats = EncodeStats(kept_ids=kept, entry_kind=best.kind if kept else None,
                                      chars_encoded=len(text) - best_c, prompt_ids=len(ids))
        entry = _Entry("prompt", text, ids, cuts, n_cuts, len(ids), len(text))
        if supersede:
            self._entries.remove(best)
        self._add(entry)
        return list(ids)  # the entry keeps its own list

    def remember_reply(self, prompt_ids: Sequence[int], gen_ids: Sequence[int]) -> bool:
        """Keep `prompt_ids + gen_ids` as one entry whose cuts in the reply are its token boundaries.

        The prompt part must be an entry this encoder produced; otherwise nothing is kept and False is
        returned. Cuts fall only on whole UTF-8 characters; the reply is kept up to its first invalid
        UTF-8 byte; a tag written in pieces (e.g. '<', 'think', '>') ends the usable cuts before it. A
        spare embedding row past the vocabulary (a random model samples them) has no text, so no later
        prompt can hold it: the reply is kept up to the first one.
        """
        prompt = _check_ids(prompt_ids, "prompt_ids", self.tokenizer.vocab_size)
        gen = _check_ids(gen_ids, "gen_ids", self.tokenizer.embedding_rows)
        spare = np.nonzero(gen >= self.tokenizer.vocab_size)[0]
        if spare.size:
            gen = gen[:int(spare[0])]
        base = self._find_prompt(prompt)
        if base is None:
            return False
        ptext = base.text[:base.prompt_chars]
        n = len(ptext)
        raw = [self.tokenizer.token_bytes(int(i)) for i in gen]
        blob = b"".join(raw)
        try:
            valid = len(blob)
            rtext = blob.decode("utf-8")
        except UnicodeDecodeError as exc:
            valid = exc.start
            rtext = blob[:valid].decode("utf-8")
        ends = np.cumsum([len(b) for b in raw], dtype=np.int64) if raw else np.zeros(0, np.int64)
        arr = np.frombuffer(blob[:valid], dtype=np.uint8)
        starts = np.concatenate([[0], np.cumsum((arr & 0xC0) != 0x80, dtype=np.int64)])  # chars before byte b
        whole = np.frombuffer(blob, dtype=np.uint8)
        next_byte = whole[np.minimum(ends, max(len(blob) - 1, 0))] if len(blob) else np.zeros(0, np.uint8)
        k = np.nonzero((ends <= valid) & ((ends == valid) | ((next_byte & 0xC0) != 0x80)))[0]
        r_chars = n + starts[ends[k]]
        r_tokens = base.prompt_len + k + 1
        # the cut between prompt and reply, then one per whole-character reply token boundary
        r_chars = np.concatenate([[n], r_chars])
        r_tokens = np.concatenate([[base.prompt_len], r_tokens])
        prompt_reach = n + 1  # the prompt's last pre-token examined the end of the text
        r_reach = np.maximum(r_chars, prompt_reach)
        text = ptext + rtext
        # a tag written in pieces reads as a tag in the next prompt: no cut after its start is usable
        single = {n + int(starts[ends[i] - len(raw[i])]) for i in range(len(gen)) if int(gen[i]) in self._tag_ids
                  and ends[i] <= valid}
        lo = max(0, n - self._max_tag + 1)
        for tag in self._tags:
            s = text.find(tag, lo)
            while s != -1:
                if (s >= n and s not in single) or (s < n < s + len(tag)):
                    r_reach[r_chars > s] = _NEVER
                s = text.find(tag, s + 1)
        j = int(np.searchsorted(base.cut_chars, n, "left"))  # prompt cuts strictly before the reply
        cuts = np.stack([np.concatenate([base.cut_chars[:j], r_chars]),
                         np.concatenate([base.cut_tokens[:j], r_tokens]),
                         np.maximum.accumulate(np.concatenate([base.cut_reach[:j], r_reach]))])
        entry = _Entry("reply", text, base.ids[:base.prompt_len] + gen.tolist(), cuts, cuts.shape[1],
                       base.prompt_len, n)
        self._add(entry)
        return True

    def clear(self) -> None:
        """Forget every entry."""
        self._entries.clear()

    @property
    def num_entries(self) -> int:
        return len(self._entries)

    @property
    def total_chars(self) -> int:
        return sum(len(e.text) for e in self._entries)

    @property
    def total_tokens(self) -> int:
        return sum(len(e.ids) for e in self._entries)

    # --- internals ------------------------------------------------------------------------------
    def _add(self, entry: _Entry) -> None:
        if len(entry.text) > self.max_chars or len(entry.ids) > self.max_tokens:
            return  # too long to cache: it was still encoded correctly
        self._entries.append(entry)
        chars, tokens = self.total_chars, self.total_tokens
        while chars > self.max_chars or tokens > self.max_tokens:
            old = self._entries.pop(0)  # oldest first
            chars -= len(old.text)
            tokens -= len(old.ids)

    def _find_prompt(self, prompt: np.ndarray):
        for entry in reversed(self._entries):
            if entry.prompt_len == len(prompt) and entry.ids[:entry.prompt_len] == prompt.tolist():
                return entry
        return None

    def _cut(self, entry: _Entry, d: int, text: str) -> tuple[int, int]:
        """Index and char offset of the last usable cut of `entry` for a prompt first differing at `d`."""
        # a tag in the new prompt that starts before d but ends after it is not in the entry: the text from
        # its start reads differently (even a window that only examined its first character)
        s = self._tag_across(text, d)
        if s is not None:
            d = s
        limit = d
        while True:
            j = min(int(np.searchsorted(entry.cut_chars, limit, "right")),
                    int(np.searchsorted(entry.cut_reach, d, "right"))) - 1
            c = int(entry.cut_chars[j])
            s = self._tag_across(text, c)
            if s is None:
                return j, c
            limit = s  # a tag across the cut is encoded whole after an earlier cut

    def _tag_across(self, text: str, c: int) -> int | None:
        """Smallest start of an added-token text in `text` that begins before `c` and ends after it."""
        lo = max(0, c - self._max_tag + 1)
        s = text.find("<", lo, c)  # every Qwen tag starts with '<'; others are checked generically below
        while s != -1:
            for tag in self._tags:
                if s + len(tag) > c and text.startswith(tag, s):
                    return s
            s = text.find("<", s + 1, c)
        if any(not t.startswith("<") for t in self._tags):
            for s in range(lo, c):
                if any(s + len(t) > c and text.startswith(t, s) for t in self._tags):
                    return s
        return None

    def _encode_fresh(self, sub: str):
        """Ids of `sub` and its pre-tokens (starts, first token index, window), relative to `sub`.

        Long text is split at a few pre-token starts p into chunks sub[p_i:p_{i+1} + overlap] encoded with
        `encode_batch` (Rust threads). A split p is used only where the chunk before it proves it exact,
        by the same rule as an entry's cuts: p is a pre-token start of the chunk with reach inside the
        chunk (so the chunk's ids before p are those of the whole), and no added token straddles p (so
        sub[p:] encodes as the whole does after p: the regex has no lookbehind). A split that fails the
        check falls back to encoding the rest in one call. Chunk ends sit before ASCII characters, so
        each chunk of the NFC text is NFC itself.
        """
        hf = self.tokenizer.hf
        splits = self._splits(sub)
        self._chunks_used = 1  # how many chunks the last fresh text was encoded in (for tests)
        if not splits:
            fresh = _hf_encode(hf, sub)
            return (fresh.ids,) + self._pretokens(sub, fresh, fresh.ids)
        starts = [0] + [p for p, _ in splits]
        ends = [e for _, e in splits] + [len(sub)]
        chunks = [sub[a:b] for a, b in zip(starts, ends)]
        encs = hf.encode_batch(chunks, add_special_tokens=False)
        ids: list = []
        parts = []
        for i, (chunk, fresh) in enumerate(zip(chunks, encs)):
            a = starts[i]
            chunk_ids = fresh.ids
            q, tok_idx, window = self._pretokens(chunk, fresh, chunk_ids)
            if i + 1 < len(chunks):
                m = self._split_ok(sub, a, starts[i + 1], ends[i], q, window)
                if m is None:  # not provably exact: encode the rest in one call
                    rest = sub[a:]
                    fresh = _hf_encode(hf, rest)
                    chunk_ids = fresh.ids
                    q, tok_idx, window = self._pretokens(rest, fresh, chunk_ids)
                    m = len(q)
                    ends = None
            else:
                m = len(q)
            n_tok = int(tok_idx[m]) if m < len(q) else len(chunk_ids)
            parts.append((q[:m] + a, tok_idx[:m] + len(ids), window[:m] + a))
            ids.extend(chunk_ids[:n_tok] if n_tok < len(chunk_ids) else chunk_ids)
            if ends is None:
                break
        self._chunks_used = len(parts)
        q, tok_idx, window = (np.concatenate([p[k] for p in parts]) for k in range(3))
        return ids, q, tok_idx, window

    def _splits(self, sub: str) -> list:
        """(p, e) pairs: chunk starts p (after a newline, before ASCII non-space) and the end e of the
        chunk before each (p + overlap, moved to the next ASCII character)."""
        n = len(sub)
        k = min(n // self.chunk_chars, 8)
        if k < 2:
            return []
        out = []
        overlap = min(256, self.chunk_chars)  # text past the split the chunk before it sees
        prev = 0
        for i in range(1, k):
            t = max(i * n // k, prev + 1)
            p = sub.find("\n", t, min(n, t + n // (2 * k)))
            while p != -1 and not ("!" <= sub[p + 1: p + 2] <= "~"):
                p = sub.find("\n", p + 1, min(n, t + n // (2 * k)))
            if p == -1:
                continue
            p += 1
            e = p + overlap
            while e < n and sub[e] >= "\x80":
                e += 1
            if e >= n:
                break
            out.append((p, e))
            prev = p
        return out

    def _split_ok(self, sub: str, a: int, p: int, e: int, q: np.ndarray, window: np.ndarray):
        """Index of the pre-token starting at `p` in the chunk sub[a:e] if the split at p is exact."""
        m = int(np.searchsorted(q, p - a, "left"))
        if m >= len(q) or int(q[m]) != p - a or self._tag_across(sub, p) is not None:
            return None
        s = self._tag_across(sub, e)
        d = (e if s is None else s) - a  # the chunk and sub[a:] differ from d on
        if p - a > d or (m and int(window[:m].max()) > d):
            return None
        return m

    def _pretokens(self, sub: str, fresh, fresh_ids: list):
        """Pre-token starts of `sub` (as encoded in `fresh`), their first token index and window."""
        n_tok = len(fresh_ids)
        if n_tok == 0:
            empty = np.zeros(0, np.int64)
            return empty, empty, empty
        words = np.array(fresh.word_ids, dtype=np.float64)  # None (added tokens) -> nan, never equal
        first = np.ones(n_tok, dtype=bool)
        first[1:] = words[1:] != words[:-1]
        tok_idx = np.flatnonzero(first)
        all_ids = np.array(fresh_ids, dtype=np.int64)
        q = self._token_starts(sub, fresh, all_ids)[tok_idx]  # pre-token starts, relative to sub
        ids = all_ids[tok_idx]
        is_tag = self._is_tag[ids]
        n = len(sub)
        # segment sentinel of each pre-token: the window of the tag (or end of text) that ends its segment
        tag_q = q[is_tag]
        tag_win = np.append(tag_q + self._win_len[ids[is_tag]], n + 1)
        nxt = np.searchsorted(tag_q, q, "left")  # first tag at or after q (len(tag_q): none)
        seg_end = np.append(tag_q, n)[nxt]
        sentinel = tag_win[nxt]
        run_end = _run_ends(sub)
        window = np.maximum(np.maximum(q + 3, run_end[q] + 1), run_end[q + 1] + 1)
        # a scan that reaches the segment end examined the tag (or end of text) that ends the segment
        window = np.where((window > seg_end) | is_tag, sentinel, window)
        return q, tok_idx.astype(np.int64), window

    def _token_starts(self, sub: str, fresh, ids: np.ndarray) -> np.ndarray:
        """Character offset in `sub` of each token's first byte, from the tokens' byte lengths."""
        nb = self._nbytes[ids]
        ends = np.cumsum(nb)
        starts = ends - nb
        if len(sub) == int(ends[-1]):  # ASCII: bytes are characters
            return starts
        raw = np.frombuffer(sub.encode("utf-8"), dtype=np.uint8)
        if len(raw) != int(ends[-1]):  # the tokenizer changed the text: trust its offsets
            return np.fromiter(itertools.chain.from_iterable(fresh.offsets), np.int64, 2 * len(ids))[::2].copy()
        chars_before = np.zeros(len(raw) + 1, np.int64)
        np.cumsum((raw & 0xC0) != 0x80, out=chars_before[1:])
        return chars_before[starts]


def _cuts(q: np.ndarray, tok_idx: np.ndarray, window: np.ndarray, c: int, kept: int, start_reach: int):
    """Cuts at the pre-token starts of text[c:] with their reach (cut i covers pre-tokens before it)."""
    if len(q) == 0:
        return (np.asarray([c], np.int64), np.asarray([kept], np.int64), np.asarray([start_reach], np.int64))
    reach = np.empty(len(q), np.int64)
    reach[0] = start_reach
    np.maximum.accumulate(np.maximum(window[:-1] + c, start_reach), out=reach[1:])
    return q + c, tok_idx + kept, reach


_BYTE_LENGTHS: dict = {}  # id(tokenizer) -> (tokenizer, lengths)


def _hf_encode(hf, text: str):
    """`hf.encode(text)` without special tokens; a long text through `encode_batch`, which releases the GIL
    (`encode` holds it for the whole call: seconds for megabytes, during which a server's event loop, in
    another thread of the process, could not answer even /health)."""
    if len(text) > 65536:
        return hf.encode_batch([text], add_special_tokens=False)[0]
    return hf.encode(text, add_special_tokens=False)


def _byte_lengths(tokenizer) -> np.ndarray:
    """Byte length of every id of `tokenizer` (cached per tokenizer object)."""
    hit = _BYTE_LENGTHS.get(id(tokenizer))
    if hit is None or hit[0] is not tokenizer:
        if hasattr(tokenizer, "vocab_bytes"):  # one pass over the table (start-up: issue 31)
            offsets = np.asarray(tokenizer.vocab_bytes()[1], dtype=np.int64)
            lengths = np.diff(offsets)[:tokenizer.vocab_size].copy()
        else:
            lengths = np.fromiter((len(tokenizer.token_bytes(i)) for i in range(tokenizer.vocab_size)), np.int64,
                                  tokenizer.vocab_size)
        hit = _BYTE_LENGTHS[id(tokenizer)] = (tokenizer, lengths)
    return hit[1]


def _nfc_split(text: str, d: int) -> int:
    """A b <= d with text[b] ASCII (or 0): then nfc(text) == text[:b] + nfc(text[b:]) when text[:d] is NFC.

    No canonical composition has an ASCII second character, and an ASCII character is a starter, so
    nothing composes or reorders across it; text[:b] is a prefix of an NFC entry text ending before such a
    starter, hence NFC itself. The check of the whole prompt thus shrinks to its new tail.
    """
    i = min(d, len(text) - 1)
    stop = max(-1, i - 64)
    while i > stop:
        if text[i] < "\x80":
            return i
        i -= 1
    return 0


def _run_ends(sub: str) -> np.ndarray:
    """[n + 1]: for each position, the farthest end of a class run starting there (itself if none).

    Other-runs take the whitespace run after them (for `[\\r\\n]*`)."""
    cps = np.frombuffer(sub.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    bits = _class_bits(cps)
    n = len(bits)
    pos = np.arange(n + 1, dtype=np.int64)
    ends = {}
    for k, bit in _BITS.items():
        member = np.append((bits & bit) != 0, False)
        # the first non-member at or after each position
        ends[k] = np.minimum.accumulate(np.where(member, n, pos)[::-1])[::-1]
    best = np.maximum(np.maximum(ends["L"], ends["N"]), ends["W"])
    return np.maximum(best, ends["W"][ends["P"]])


_BITS = {"L": 1, "N": 2, "W": 4, "P": 8}


@lru_cache(maxsize=1)
def _bmp_table() -> np.ndarray:
    import regex  # the tokenizer's classes (\p{L}, \p{N}); imported on first use

    table = np.zeros(0x10000, dtype=np.uint8)
    allbmp = "".join(chr(c) if not 0xD800 <= c < 0xE000 else " " for c in range(0x10000))
    for k, bit in _BITS.items():
        for m in regex.finditer(_CLASS_RUNS[k], allbmp):
            table[m.start():m.end()] |= bit
    table[0xD800:0xE000] = 0xF  # lone surrogates: unknown, join every class
    return table


@lru_cache(maxsize=1)
def _class_patterns() -> dict:
    import regex

    return {k: regex.compile(p) for k, p in _CLASS_RUNS.items()}


def _class_bits(cps: np.ndarray) -> np.ndarray:
    """Class bits of each code point; a table for the BMP, `regex` for the rare astral ones."""
    bits = _bmp_table()[np.minimum(cps, 0xFFFF)]
    astral = np.flatnonzero(cps > 0xFFFF)
    if len(astral):
        pats = _class_patterns()
        memo = {}
        for i in astral:
            c = int(cps[i])
            if c not in memo:
                memo[c] = sum(bit for k, bit in _BITS.items() if pats[k].fullmatch(chr(c)))
            bits[i] = memo[c]
    return bits


def _common_prefix_len(a: str, b: str) -> int:
    """Length of the common prefix of two strings; O(prefix) slice compares (galloping, then bisecting)."""
    if b.startswith(a):
        return len(a)
    if a.startswith(b):
        return len(b)
    n = min(len(a), len(b))
    lo, step = 0, 4096
    while lo + step <= n and a[lo:lo + step] == b[lo:lo + step]:  # a[:lo] == b[:lo] holds
        lo += step
        step *= 2
    hi = min(n, lo + step)
    while hi - lo > 1:  # a[:lo] == b[:lo], and a[:hi] != b[:hi]
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _check_ids(ids, field: str, vocab_size: int) -> np.ndarray:
    try:
        arr = np.asarray(list(ids), dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{field} must be a sequence of token ids") from None
    if arr.ndim != 1 or (arr.size and (arr.min() < 0 or arr.max() >= vocab_size)):
        raise ValueError(f"{field} holds ids outside 0..{vocab_size - 1}")
    return arr

