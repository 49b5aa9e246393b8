"""Ids to text without splitting a character, and the one rule for which drained ids join a reply.

`TextStream` is what the server streams to clients and what the replay uses to know whether a reply ends
inside a UTF-8 character. `plain_drained` is the drained-ids rule the server applies after a thinking-budget
STOP (the leading plain-text run of the drained ids joins the reply); the replay's counterfactuals use the
same function, so a replayed server keeps exactly the ids the real one keeps.

>>> from strata_lab.text.tokenizer import load_tokenizer
>>> tok = load_tokenizer("qwen3")
>>> ts = TextStream(tok)
>>> ts.push(128), ts.push(253), ts.flush()   # 'ğ' as two byte ids
('', 'ğ', '')
>>> plain_drained(tok, tok.encode(" so the") + tok.encode("</think>") + [11], [151645], mid_character=False)
[773, 279]
"""
from __future__ import annotations

from typing import Sequence

__all__ = ["TextStream", "plain_drained", "ends_mid_character"]


class TextStream:
    """Incremental ids -> text that holds back an incomplete UTF-8 sequence until it completes.

    Ids the tokenizer does not know (a model's spare embedding rows) stand for no text.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._pending = b""

    def id_bytes(self, token_id: int) -> bytes:
        try:
            return self.tokenizer.token_bytes(token_id)
        except ValueError:
            return b""

    def push(self, token_id: int) -> str:
        data = self._pending + self.id_bytes(token_id)
        cut = _complete_prefix(data)
        self._pending = data[cut:]
        return data[:cut].decode("utf-8", errors="replace")

    def flush(self) -> str:
        data, self._pending = self._pending, b""
        return data.decode("utf-8", errors="replace")

    @property
    def mid_character(self) -> bool:
        return bool(self._pending)


def _complete_prefix(data: bytes) -> int:
    """Length of the longest prefix of `data` that does not end inside a UTF-8 character."""
    n = len(data)
    for back in range(1, min(4, n) + 1):
        b = data[n - back]
        if b & 0xC0 == 0x80:      # continuation byte: keep looking for the lead byte
            continue
        if b < 0x80:
            return n
        need = 2 if b & 0xE0 == 0xC0 else 3 if b & 0xF0 == 0xE0 else 4 if b & 0xF8 == 0xF0 else 1
        return n if back >= need else n - back
    return n  # only continuation bytes: invalid anyway, let the decoder replace them


def ends_mid_character(tokenizer, ids: Sequence[int], stop_ids: Sequence[int] = ()) -> bool:
    """Whether the text of `ids` (stop ids left out, as the server streams them) ends inside a character.

    >>> from strata_lab.text.tokenizer import load_tokenizer
    >>> ends_mid_character(load_tokenizer("qwen3"), [128])
    True
    """
    text = TextStream(tokenizer)
    for i in ids:
        if i not in stop_ids:
            text.push(i)
    return text.mid_character


def plain_drained(tokenizer, drained_ids: Sequence[int], stop_ids: Sequence[int], *, mid_character: bool) -> list[int]:
    """The leading drained ids that may join the reply: plain text only (the server's rule).

    A stop id, a special id, a piece holding `<`, or a piece that is not whole UTF-8 ends the run; so does
    a reply that already ends inside a character.
    """
    if mid_character:
        return []
    kept = []
    special = tokenizer.special_ids
    for i in drained_ids:
        if i in stop_ids or i in special:
            break
        try:
            piece = tokenizer.token_bytes(i)
            text = piece.decode("utf-8")
        except (ValueError, UnicodeDecodeError):
            break
        if not piece or "<" in text:
            break
        kept.append(int(i))
    return kept
