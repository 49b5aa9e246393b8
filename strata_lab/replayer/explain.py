"""The one explainer: why a call re-read what its session held, computed once per call, then per engine.

Two questions, answered apart (docs/CONTRACTS.md, Contract 3):

1. **Divergence** (engine-independent, `explain`): where the prompt parted from what its session held (the
   previous call's prompt + reply + drained ids) and why: `retokenized_reply`, `retokenized_prompt`,
   `drained_dropped`, `template_rewrite`, `history_edit` (`diverged` when no tokenizer can name it); on an
   imported log, the client habit its messages show (`name_habit`: `volatile_system`,
   `arguments_reserialised`, `tool_output_truncated`, a dropped reasoning as `template_rewrite`), and
   how many held ids the prompt repeats *after* that point (`tail`: a history edit thousands of tokens
   before the end re-reads everything after it). `new_session`: the session held nothing.
2. **Engine shortfall** (`attribute`): why an engine served less than the ids allowed up to the divergence
   (`block_rounding`, `evicted`, `expired`, `below_minimum`, `slot_stolen`, `no_state_checkpoint`,
   `lookback`, `not_cached`, `last_output_token`, `routing`, `refused`).

`reread` = the engine's shortfall + the divergence's re-read ids, at most what the call read. The cause
reported is the one that cost more tokens. A shortfall the divergence itself makes (the block the prompt
parts in, a hybrid falling back to its last state snapshot because the prompt parted) is the divergence's:
a history edit is never called `block_rounding`.

>>> h = SessionHistory()
>>> e = explain(h, list(range(1, 21)))
>>> e.divergence, e.held
('new_session', 0)
>>> h.finish([100, 101], [])
>>> e = explain(h, [1, 2, 99] + list(range(4, 21)) + [100, 101, 7])   # an edit at position 2; 19 ids re-read
>>> e.divergence, e.lcp_ids, e.tail
('diverged', 2, 19)
>>> attribute(e, reused=0, engine_cause="evicted", exact=2)
('diverged', 21, 19, 2)
>>> attribute(e, reused=0, engine_cause="block_rounding", exact=2)   # the divergence made that block partial
('diverged', 21, 21, 0)
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from strata_lab.rules import DIVERGENCE_CAUSES, HABIT_CAUSES   # the cause vocabulary: strata_lab.rules.CAUSES

__all__ = ["SessionHistory", "Explanation", "explain",
           "attribute", "name_habit", "realigned_tail"]

# Engine causes that a divergence makes by itself (the block the prompt parts in; a hybrid's fallback to its
# last snapshot because the prompt parted): when the prompt diverged, their tokens are the divergence's.
_MADE_BY_DIVERGENCE = frozenset({"block_rounding", "no_state_checkpoint", "not_cached", None})
_GRAM = 8


class SessionHistory:
    """What one session held after its last call, and where each held id came from (the call's prompt, its
    generated ids, its drained ids). Engine-independent: ids the next prompt repeats keep their origin."""

    __slots__ = ("held", "segments", "calls")

    def __init__(self):
        self.held = ()                      # the ids held: a sequence (numpy array or list), replaced per call
        self.segments: list[tuple] = []     # (start, end, kind, call) with kind "prompt", "gen", "drained"
        self.calls = 0

    def start(self, prompt, lcp: int) -> None:
        """The call's prompt replaces held from `lcp` on (ids before it keep their origin)."""
        while self.segments and self.segments[-1][0] >= lcp:
            self.segments.pop()
        if self.segments and self.segments[-1][1] > lcp:
            s = self.segments[-1]
            self.segments[-1] = (s[0], lcp, s[2], s[3])
        self.held = prompt
        if len(prompt) > lcp:
            self.segments.append((lcp, len(prompt), "prompt", self.calls))
        self.calls += 1

    def finish(self, gen, drained, held=None) -> None:
        """The call's generated and drained ids join held (`held`: the whole sequence, when the caller has it)."""
        start = len(self.held)
        for ids, kind in ((gen, "gen"), (drained, "drained")):
            if len(ids):
                self.segments.append((start, start + len(ids), kind, self.calls - 1))
                start += len(ids)
        if held is None:
            parts = [np.asarray(x, dtype=np.int64) for x in (self.held, gen, drained) if len(x)]
            held = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        self.held = held


@dataclass(slots=True)
class Explanation:
    """A call's divergence from what its session held (the same for every engine)."""

    held: int                     # ids the session held when the call arrived
    lcp_ids: int                  # common id prefix of prompt and held
    lcp_text: int                 # held ids whose text the prompt repeats (>= lcp_ids)
    divergence: str               # "new_session", "none" (the prompt extends held or is a prefix of it), or a
    #                               DIVERGENCE_CAUSES name
    tail: int = 0                 # held ids after lcp_text that the prompt repeats in order (re-read)
    div: object = None            # the `Divergence` (contexts), when a tokenizer walked it

    @property
    def diverged(self) -> bool:
        return self.divergence in DIVERGENCE_CAUSES

    @property
    def divergence_reread(self) -> int:
        """Held ids the prompt repeats past the id divergence: retokenized text plus the realigned tail."""
        return (self.lcp_text - self.lcp_ids) + self.tail if self.diverged else 0


def _lcp(a, b) -> int:
    n = min(len(a), len(b))
    if not n:
        return 0
    a = np.asarray(a[:n]) if not isinstance(a, np.ndarray) else a[:n]
    b = np.asarray(b[:n]) if not isinstance(b, np.ndarray) else b[:n]
    ne = a != b
    return int(ne.argmax()) if ne.any() else n


def _grams(a: np.ndarray) -> np.ndarray:
    """A hash of every `_GRAM` consecutive ids (uint64, wrapping)."""
    a = a.astype(np.uint64)
    n = len(a) - _GRAM + 1
    h = np.zeros(n, dtype=np.uint64)
    mul = np.uint64(1099511628211)
    for k in range(_GRAM):
        h = h * mul + a[k:k + n]
    return h


def realigned_tail(held, prompt, h0: int, p0: int) -> int:
    """How many ids of `held[h0:]` the prompt repeats, in order, in `prompt[p0:]` (runs of at least `_GRAM`
    ids, matched greedily left to right): what a call re-reads after its prompt parted from held.

    >>> realigned_tail([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [0, 0, 3, 4, 5, 6, 7, 8, 9, 10, 11, 99], 2, 0)
    9
    """
    H = np.asarray(held[h0:], dtype=np.int64)
    P = np.asarray(prompt[p0:], dtype=np.int64)
    if len(H) < _GRAM or len(P) < _GRAM:
        return 0
    gp, gh = _grams(P), _grams(H)
    order = np.argsort(gp, kind="stable")                 # equal grams keep prompt order: the first comes first
    sp = gp[order]
    head = np.ones(len(sp), dtype=bool)
    head[1:] = sp[1:] != sp[:-1]
    uniq, first_at = sp[head], order[head]                # each prompt gram, its first and last position
    last_at = order[np.append(head[1:], True)]
    at = np.minimum(np.searchsorted(uniq, gh), len(uniq) - 1)
    found = uniq[at] == gh
    cand_a = np.flatnonzero(found)                        # held positions whose gram the prompt has
    last_c = last_at[at][cand_a]                          # per candidate: its gram's last prompt position
    cand = cand_a.tolist()
    first = first_at[at].tolist()                         # (where found) per held position
    j, matched, k = 0, 0, 0
    while k < len(cand):
        i = cand[k]
        q = first[i]
        if q < j:   # the gram recurs: find it again at or after j
            if last_c[k] < j:   # it does not: skip to the next candidate whose gram still occurs past j
                nxt = np.flatnonzero(last_c[k:] >= j)
                if not len(nxt):
                    break
                k += int(nxt[0])
                continue
            q = j + int(np.flatnonzero(gp[j:] == gh[i])[0])
        if not np.array_equal(H[i:i + _GRAM], P[q:q + _GRAM]):
            k += 1
            continue
        m = _GRAM + _lcp(H[i + _GRAM:], P[q + _GRAM:])
        if q - j > m and k + 1 < len(cand):
            # a run matched past more prompt ids than it holds (a turn marker the prompt writes again near its
            # end) must not swallow what the next held ids find before it: skip it when they match earlier
            k2 = bisect.bisect_left(cand, i + m)
            if k2 < len(cand):
                g2 = gh[cand[k2]]
                at2 = np.flatnonzero(gp[j:q] == g2)
                if len(at2) and np.array_equal(H[cand[k2]:cand[k2] + _GRAM], P[j + int(at2[0]):j + int(at2[0]) + _GRAM]):
                    k += 1
                    continue
        matched += m
        j = q + m
        k = bisect.bisect_left(cand, i + m)
    return matched


def explain(history: SessionHistory, prompt, tok=None, *, context_chars: int = 40,
            lcp_ids: int | None = None) -> Explanation:
    """The call's divergence from what `history` holds; then `history` takes the prompt (call `finish` with
    the reply after). `tok` (a Tokenizer) names the cause and finds retokenizations; None: `diverged`."""
    held = history.held
    nh = len(held)
    n = lcp_ids if lcp_ids is not None else _lcp(held, prompt)
    if not nh:
        e = Explanation(0, n, n, "new_session")
    elif n >= nh or n >= len(prompt):
        e = Explanation(nh, n, n if n < nh else nh, "none")
    elif tok is None:
        e = Explanation(nh, n, n, "diverged", tail=realigned_tail(held, prompt, n, n))
    else:
        from strata_lab.replayer.divergence import classify, find_divergence

        plist = prompt.tolist() if isinstance(prompt, np.ndarray) else list(prompt)
        held = held.tolist() if isinstance(held, np.ndarray) else list(held)
        d = find_divergence(held, plist, tok, lcp_ids=n, context_chars=context_chars)
        # the one classification (divergence.classify): where the text parts, and what held there
        cause = classify(held=held, prompt=plist, segments=history.segments, div=d, reused=0, target=0, tok=tok,
                         first_call=False, lcp_ids=n)
        # the held ids past the text divergence, looked for in order in the prompt past the id divergence
        e = Explanation(nh, n, d.lcp_text, cause, tail=realigned_tail(held, plist, d.lcp_text, n), div=d)
    history.start(prompt, n)
    return e


def name_habit(e: Explanation, record) -> None:
    """Name `e`'s divergence by what the call's messages say (a dump line of an imported log carries
    `history_change`): the client's habit, or `template_rewrite` when the messages resend what the session
    held and the ids still part. The template's markers play no part, so the name is the same under any
    template. Retokenizations and dropped drained ids keep their names (the ids say those)."""
    if not e.diverged or record is None or e.divergence in ("retokenized_reply", "retokenized_prompt",
                                                            "drained_dropped"):
        return
    try:
        change = record["history_change"]
    except KeyError:
        return
    if change is None:
        e.divergence = "template_rewrite"
    elif isinstance(change, dict) and change.get("habit") in HABIT_CAUSES:
        e.divergence = HABIT_CAUSES[change["habit"]]


def attribute(e: Explanation, *, reused: int, engine_cause: str | None, exact: int, prompt_len: int | None = None,
              moved: bool = False, refused: bool = False) -> tuple[str, int, int, int]:
    """(cause, reread, divergence_reread, engine_reread) of one engine on one call.

    `reused`: what the engine served; `engine_cause`: the engine's own reason for serving less than `exact`
    (min(lcp_ids, prompt_len - 1): what a token-exact cache could reuse); `moved`: the session was routed to
    another replica; `refused`: the engine turned the call away.
    """
    if e.held == 0:
        cause = "refused" if refused else ("none" if reused else "new_session")
        return cause, 0, 0, 0
    short = max(min(exact, e.lcp_ids) - reused, 0)
    ecause = None
    if short:
        ecause = "routing" if moved else (engine_cause or "not_cached")
        if ecause == "not_cached" and reused == e.held - 1 == exact - 1:
            ecause = "last_output_token"   # the last generated id is never fed back: no KV for it
    if refused:
        ecause = "refused"
    div_rr = e.divergence_reread
    eng_rr = short
    if e.diverged and not refused and not moved and engine_cause in _MADE_BY_DIVERGENCE:
        div_rr, eng_rr = div_rr + short, 0
    total = div_rr + eng_rr
    if prompt_len is not None:
        total = min(total, max(prompt_len - reused, 0))
    if refused:
        cause = "refused"
    elif e.diverged and div_rr >= eng_rr:
        cause = e.divergence
    elif eng_rr:
        cause = ecause
    else:
        cause = "none"
    return cause, total, min(div_rr, total), min(eng_rr, total - min(div_rr, total))
