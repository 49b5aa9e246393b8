"""Where a prompt leaves what a session holds: the first id divergence, the first text divergence,
the region they fall in, and the cause of the miss (Contract 3).

The ids of `held` and `prompt` agree up to `lcp_ids`. Their *texts* may agree further: a reply the model
wrote as [130947, 5855] (' öğ' 'renci') comes back BPE-encoded as [135992] (' öğrenci'). `lcp_text` counts
the held ids whose bytes lie wholly before the first byte where the texts differ.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

__all__ = ["Divergence", "find_divergence", "add_contexts", "set_id_contexts", "set_text_contexts", "context_pair", "classify"]

_CTX_TOKENS = 24


@dataclass
class Divergence:
    lcp_ids: int
    lcp_text: int                 # held ids wholly before the first text divergence
    byte_in_token: int            # offset of the first differing byte inside held[lcp_text]
    id_context_held: str = ""
    id_context_prompt: str = ""
    text_context_held: str = ""
    text_context_prompt: str = ""
    held_ids_at: tuple = ()       # a few ids at the id divergence, held side
    prompt_ids_at: tuple = ()
    # True when the ids part on the same text and realign (a token boundary both sides share) before the
    # texts part, or the held text never parts: a genuine retokenization. False when lcp_text > lcp_ids only
    # because a prompt token merged across the text divergence (e.g. held '\n' + '<think>' vs prompt
    # '\n\n\n': the ids part one token early because the text after them changed).
    retokenized: bool = False


def _show(before: bytes, after: bytes, width: int) -> str:
    b = before.decode("utf-8", errors="replace")[-width:]
    a = after.decode("utf-8", errors="replace")[:width]
    return f"{b!r} || {a!r}"


class _TokenBytes(dict):
    """id -> bytes, filled from the tokenizer on first use (a dict lookup instead of a checked call)."""

    def __init__(self, tok):
        super().__init__()
        self.tok = tok

    def __missing__(self, token_id):
        value = self[token_id] = self.tok.token_bytes(token_id)
        return value

    def ids_bytes(self, ids) -> bytes:
        return b"".join(map(self.__getitem__, ids))


_TOKEN_BYTES: dict = {}


def _token_bytes(tok) -> _TokenBytes:
    cache = _TOKEN_BYTES.get(id(tok))
    if cache is None or cache.tok is not tok:
        cache = _TOKEN_BYTES[id(tok)] = _TokenBytes(tok)
    return cache


def find_divergence(held, prompt, tok, *, lcp_ids: int, context_chars: int = 40) -> Divergence:
    """Walk both id sequences from `lcp_ids` byte by byte until their texts part.

    >>> from strata_lab import load_tokenizer
    >>> tok = load_tokenizer("qwen3")
    >>> held = tok.encode("Hi") + [130947, 5855] + tok.encode(" is here")
    >>> prompt = tok.encode("Hi öğrenci is there")
    >>> d = find_divergence(held, prompt, tok, lcp_ids=1)
    >>> d.lcp_ids, d.lcp_text, d.text_context_held
    (1, 4, "held: 'Hi öğrenci is ' || 'here'")
    """
    cache = _token_bytes(tok)
    tb, ids_bytes = cache.__getitem__, cache.ids_bytes
    nh, np_ = len(held), len(prompt)
    ptail = prompt[lcp_ids:]  # one slice (a list) instead of an index per id: prompt may be a DeltaPrompt
    hi, pi = lcp_ids, lcp_ids
    pbuf = b""
    k = 0
    # Windows of held ids first: a window whose bytes the prompt's bytes start with is consumed whole
    # (bytes joined and compared in C). The state after it is the one the id-by-id walk below reaches (the
    # prompt is read just far enough to cover the window). A window that parts is halved and tried again;
    # below 16 ids it is walked id by id from its start, so the result is the id-by-id walk's.
    w = 64
    while hi < nh:
        hbytes = ids_bytes(held[hi:hi + w])
        buf, j = pbuf, pi
        if len(buf) < len(hbytes) and j < np_:
            parts = [buf]
            have = len(buf)
            while have < len(hbytes) and j < np_:
                b = tb(ptail[j - lcp_ids])
                parts.append(b)
                have += len(b)
                j += 1
            buf = b"".join(parts)
        if not buf.startswith(hbytes):
            if w <= 16:
                break
            w //= 2  # the texts part inside this window: narrow it down before walking id by id
            continue
        pbuf, pi = buf[len(hbytes):], j
        hi = min(hi + w, nh)
        w = min(w * 2, 4096)
    while hi < nh:
        hb = tb(held[hi])
        while len(pbuf) < len(hb) and pi < np_:
            pbuf += tb(ptail[pi - lcp_ids])
            pi += 1
        if pbuf.startswith(hb):
            pbuf = pbuf[len(hb):]
            hi += 1
            continue
        k = 0
        m = min(len(hb), len(pbuf))
        while k < m and hb[k] == pbuf[k]:
            k += 1
        break
    d = Divergence(lcp_ids=lcp_ids, lcp_text=hi, byte_in_token=k,
                   retokenized=_realigned(held, ptail, tb, lcp_ids, hi))
    add_contexts(d, held, prompt, ptail, pi, pbuf, tok, context_chars)
    return d


def add_contexts(d: Divergence, held, prompt, ptail, pi: int, pbuf: bytes, tok, context_chars: int) -> None:
    """Fill `d`'s context strings and ids from the walk's end: `pi` prompt ids read, `pbuf` the prompt bytes
    read past the held text's end (`ptail`: the prompt's ids from `d.lcp_ids` on)."""
    cache = _token_bytes(tok)
    tb, ids_bytes = cache.__getitem__, cache.ids_bytes
    lcp_ids, hi, k = d.lcp_ids, d.lcp_text, d.byte_in_token
    nh, np_ = len(held), len(prompt)
    if lcp_ids < nh or lcp_ids < np_:
        before = ids_bytes(held[max(0, lcp_ids - _CTX_TOKENS):lcp_ids])
        set_id_contexts(d, before, ids_bytes(held[lcp_ids:lcp_ids + _CTX_TOKENS]),
                        ids_bytes(prompt[lcp_ids:lcp_ids + _CTX_TOKENS]), context_chars)
        d.held_ids_at = tuple(held[lcp_ids:lcp_ids + 4])
        d.prompt_ids_at = tuple(prompt[lcp_ids:lcp_ids + 4])
    if hi < nh:
        hb = tb(held[hi])
        set_text_contexts(d, ids_bytes(held[max(0, hi - _CTX_TOKENS):hi]) + hb[:k],
                          hb[k:] + ids_bytes(held[hi + 1:hi + _CTX_TOKENS]),
                          pbuf[k:] + ids_bytes(ptail[pi - lcp_ids:pi - lcp_ids + _CTX_TOKENS]), context_chars)


def context_pair(before: bytes, held_after: bytes, prompt_after: bytes, width: int) -> tuple[str, str]:
    """(held, prompt) context strings of a divergence from its byte windows (`_CTX_TOKENS` ids either side).

    >>> context_pair(b"say hi", b" there", b"!", 4)
    ("held: 'y hi' || ' the'", "prompt: 'y hi' || '!'")
    """
    return "held: " + _show(before, held_after, width), "prompt: " + _show(before, prompt_after, width)


def set_id_contexts(d: Divergence, before: bytes, held_after: bytes, prompt_after: bytes, width: int) -> None:
    """The id divergence's context strings from its byte windows."""
    d.id_context_held, d.id_context_prompt = context_pair(before, held_after, prompt_after, width)


def set_text_contexts(d: Divergence, before: bytes, held_after: bytes, prompt_after: bytes, width: int) -> None:
    """The text divergence's context strings from its byte windows."""
    d.text_context_held, d.text_context_prompt = context_pair(before, held_after, prompt_after, width)


def _realigned(held, ptail, tb, lcp_ids: int, lcp_text: int) -> bool:
    """Whether the id divergence at `lcp_ids` is a retokenization of text both sides share (`ptail`: the
    prompt's ids from `lcp_ids` on): the held text
    never parts (`lcp_text == len(held)`), or held and prompt tokens share a boundary after `lcp_ids` and no
    later than the text divergence. Without one, the prompt's token at `lcp_ids` spans the text divergence:
    BPE merged across text that changed, and the miss is the text change's.
    """
    if lcp_text <= lcp_ids:
        return False
    if lcp_text >= len(held):
        return True
    ends = set(accumulate(map(len, map(tb, held[lcp_ids:lcp_text]))))
    last = max(ends)  # the held ids before the text divergence end here; the divergence is at or after it
    for off in accumulate(map(len, map(tb, ptail))):
        if off in ends:
            return True
        if off > last:
            return False
    return False


def _in_segment(segments, pos: int, kinds) -> bool:
    for start, end, kind, _call in segments:
        if start <= pos < end and kind in kinds:
            return True
    return False


def _in_assistant_turn(held, pos: int, tok) -> bool:
    """True when the chat turn holding position `pos` is an assistant turn (`<|im_start|>assistant`)."""
    im_start = tok.im_start_id
    if im_start is None:
        return False
    assistant = _assistant_id(tok)
    for j in range(min(pos, len(held) - 1), -1, -1):
        if held[j] == im_start:
            return j + 1 < len(held) and held[j + 1] == assistant
    return False


_ASSISTANT_IDS: dict = {}


def _assistant_id(tok):
    key = id(tok)
    if key not in _ASSISTANT_IDS:
        ids = tok.encode("assistant")
        _ASSISTANT_IDS[key] = ids[0] if len(ids) == 1 else None
    return _ASSISTANT_IDS[key]


def classify(*, held, prompt, segments, div: Divergence | None, reused: int, target: int, tok,
             first_call: bool, lcp_ids: int | None = None) -> str:
    """The cause of a call's miss, from the divergence and where it lies.

    - new_session: the session held nothing;
    - none / no_state_checkpoint: the prompt extends held or is a prefix of it; `no_state_checkpoint` when the state
      model still could not reuse `target` (a hybrid model without a snapshot there);
    - retokenized_reply / retokenized_prompt: the ids part while the text goes on (lcp_text > lcp_ids)
      and realign before the text parts (`div.retokenized`); `reply` when the id divergence lies in
      generated or drained ids. A prompt token that merges across the text divergence (Qwen3's template
      drops a reply's `<think>` block and the '\n' after 'assistant' joins the reply's leading newlines)
      is not a retokenization: the text change decides the cause below;
    - drained_dropped: the text parts where held has drained ids;
    - template_rewrite: the text parts inside a reply (generated ids, or an assistant turn);
    - history_edit: the text parts before that (system, user, tool turns).
    """
    if not held:
        return "new_session"
    lcp = div.lcp_ids if div is not None else (lcp_ids if lcp_ids is not None else 0)
    if lcp >= len(held) or lcp >= len(prompt):
        return "none" if reused >= target else "no_state_checkpoint"
    if div.lcp_text > div.lcp_ids and div.retokenized:
        return "retokenized_reply" if _in_segment(segments, div.lcp_ids, ("gen", "drained")) else "retokenized_prompt"
    pos = div.lcp_text
    if _in_segment(segments, pos, ("drained",)):
        return "drained_dropped"
    if _in_segment(segments, pos, ("gen",)) or _in_assistant_turn(held, pos, tok):
        return "template_rewrite"
    return "history_edit"
