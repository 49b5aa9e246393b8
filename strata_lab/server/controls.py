"""vLLM's and SGLang's token-level request fields (what their clients send in `extra_body`), parsed and applied.

`parse_controls(body)` reads `stop_token_ids`, `min_tokens`, `include_stop_str_in_output` (SGLang:
`no_stop_trim`), `allowed_token_ids`, `bad_words` and `truncate_prompt_tokens` into one `Controls`; a bad
value is a 400 naming the field. The semantics are vLLM's (vllm/sampling_params.py):

- `stop_token_ids`: generation stops at any of these ids as it does at the end of the turn; the id's text
  is left out of the output unless `include_stop_str_in_output`.
- `min_tokens`: the end-of-turn ids and `stop_token_ids` cannot be sampled before this many ids are out,
  and stop sequences are not looked for until then.
- `include_stop_str_in_output` / `no_stop_trim`: the stop sequence (or the stop id's text) that ended the
  output stays in it.
- `allowed_token_ids`: only these ids can be sampled (the end-of-turn ids too: list them to let the
  reply end before its cap, as in vLLM).
- `bad_words`: each word, encoded as is and with a leading space, is never completed: a one-id word is
  banned outright; a longer one's last id is banned where the reply's ids end with the others.
- `truncate_prompt_tokens`: k >= 1 keeps the prompt's last k ids (-1: the last context-many).

`TokenFilter` applies them in the engine's token mask, after the grammar's mask when there is one.

>>> c = parse_controls({"stop_token_ids": [7], "min_tokens": 2, "bad_words": ["x"]})
>>> c.stop_token_ids, c.min_tokens, c.bad_words, c.active
((7,), 2, ('x',), True)
>>> Controls().truncate([1, 2, 3], 8), Controls(truncate_prompt_tokens=2).truncate([1, 2, 3], 8)
([1, 2, 3], [2, 3])
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from strata_lab.server.errors import RequestError

__all__ = ["Controls", "parse_controls", "TokenFilter", "bad_word_ids", "MAX_IDS"]

MAX_IDS = 4096   # ids in stop_token_ids / allowed_token_ids, and words in bad_words


@dataclass(frozen=True)
class Controls:
    stop_token_ids: tuple[int, ...] = ()
    min_tokens: int = 0
    include_stop: bool = False            # include_stop_str_in_output / no_stop_trim
    allowed_token_ids: tuple[int, ...] | None = None
    bad_words: tuple[str, ...] = ()
    truncate_prompt_tokens: int | None = None

    @property
    def active(self) -> bool:
        """Whether the engine's token mask has work to do."""
        return bool(self.min_tokens or self.allowed_token_ids is not None or self.bad_words)

    def truncate(self, prompt_ids: list[int], context: int) -> list[int]:
        """The prompt's last `truncate_prompt_tokens` ids (-1: the last `context` ids)."""
        k = self.truncate_prompt_tokens
        if k is None:
            return prompt_ids
        k = context if k == -1 else k
        return prompt_ids[-k:] if len(prompt_ids) > k else prompt_ids

    def check_vocab(self, vocab_size: int) -> None:
        for name in ("stop_token_ids", "allowed_token_ids"):
            for i, t in enumerate(getattr(self, name) or ()):
                if t >= vocab_size:
                    raise RequestError(f"{name}[{i}]", f"token id {t} is out of range (0..{vocab_size - 1})")


def _ids(value: Any, name: str, *, nonempty: bool = False) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise RequestError(name, "must be an array of token ids")
    if nonempty and not value:
        raise RequestError(name, "must not be empty")
    if len(value) > MAX_IDS:
        raise RequestError(name, f"holds at most {MAX_IDS} ids, got {len(value)}")
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise RequestError(f"{name}[{i}]", "must be a token id (an integer >= 0)")
    return tuple(value)


def _flag(body: dict, name: str) -> bool:
    v = body.get(name)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise RequestError(name, "must be a boolean")
    return v


def parse_controls(body: dict) -> Controls:
    """The token-level fields of a request body (see the module doc); a RequestError names a bad one."""
    kw: dict = {}
    if body.get("stop_token_ids") is not None:
        kw["stop_token_ids"] = _ids(body["stop_token_ids"], "stop_token_ids")
    for name in ("min_tokens", "min_new_tokens"):  # min_new_tokens: SGLang's name
        v = body.get(name)
        if v is not None:
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 1 << 20:
                raise RequestError(name, "must be an integer >= 0")
            if "min_tokens" in kw and kw["min_tokens"] != v:
                raise RequestError(name, "is SGLang's name for min_tokens: give one of them")
            kw["min_tokens"] = v
    kw["include_stop"] = _flag(body, "include_stop_str_in_output") | _flag(body, "no_stop_trim")
    if body.get("allowed_token_ids") is not None:
        kw["allowed_token_ids"] = _ids(body["allowed_token_ids"], "allowed_token_ids", nonempty=True)
    if body.get("bad_words") is not None:
        words = body["bad_words"]
        if not isinstance(words, list) or len(words) > MAX_IDS:
            raise RequestError("bad_words", f"must be an array of at most {MAX_IDS} strings")
        for i, w in enumerate(words):
            if not isinstance(w, str) or not w.strip():
                raise RequestError(f"bad_words[{i}]", "must be a non-empty string")
        kw["bad_words"] = tuple(words)
    k = body.get("truncate_prompt_tokens")
    if k is not None:
        if isinstance(k, bool) or not isinstance(k, int) or not (k == -1 or k >= 1):
            raise RequestError("truncate_prompt_tokens", "must be an integer >= 1 (or -1: the context)")
        kw["truncate_prompt_tokens"] = k
    return Controls(**kw)


def bad_word_ids(tokenizer, words: Sequence[str]) -> list[tuple[int, ...]]:
    """Each word's ids, as vLLM forms them: the word (leading spaces stripped) encoded as is, and with one
    leading space when that starts with another id and has as many ids (a word-start variant)."""
    out: list[tuple[int, ...]] = []
    for word in words:
        plain = tuple(tokenizer.encode(word.lstrip()))
        spaced = tuple(tokenizer.encode(" " + word.lstrip()))
        out.append(plain)
        if spaced and spaced[0] != plain[0] and len(spaced) == len(plain):
            out.append(spaced)
    return out


class TokenFilter:
    """The engine's token mask for one call: the grammar's mask (when there is one), then `Controls`.

    `done`: the reply's ids before this call (a thinking-budget wrap-up is a second call); `end_ids`: the
    ids min_tokens holds back (the end-of-turn ids and stop_token_ids); `words`: bad_word_ids.
    """

    def __init__(self, inner, vocab_size: int, controls: Controls, *, end_ids: Sequence[int] = (),
                 words: Sequence[tuple[int, ...]] = (), done: Sequence[int] = ()):
        self.inner = inner
        self.mask_words = (vocab_size + 31) // 32
        self.controls = controls
        self.end_ids = tuple(end_ids)
        self.words = [w for w in words if w]
        self.history = list(done)
        self._allowed = None
        if controls.allowed_token_ids is not None:
            allowed = np.zeros(self.mask_words, dtype=np.uint32)
            for i in controls.allowed_token_ids:
                if i < vocab_size:
                    allowed[i >> 5] |= np.uint32(1 << (i & 31))
            self._allowed = allowed

    @staticmethod
    def _clear(bits: np.ndarray, i: int) -> None:
        bits[i >> 5] &= np.uint32(~(1 << (i & 31)) & 0xFFFFFFFF)

    def __call__(self, n_produced: int, last_id: int, bits: np.ndarray) -> bool:
        if n_produced > 0:
            self.history.append(int(last_id))
        filled = bool(self.inner(n_produced, last_id, bits)) if self.inner is not None else False
        if not filled:
            bits[:] = np.uint32(0xFFFFFFFF)
        if self._allowed is not None:
            np.bitwise_and(bits, self._allowed, out=bits)
        if len(self.history) < self.controls.min_tokens:
            for i in self.end_ids:
                self._clear(bits, i)
        for word in self.words:
            head = word[:-1]
            if not head or tuple(self.history[-len(head):]) == head:
                self._clear(bits, word[-1])
        return True

    @property
    def rejected(self) -> int:
        return getattr(self.inner, "rejected", 0)
