"""One replayed engine call: the state model's step and the typed row it returns.

`step(state, prompt, rec, ...)` predicts a call's reuse, explains a miss (divergence, cause), advances the
session's state by the call's reply, and returns a `CallRow`: what the notebook's store pager
(`strata_lab.replayer.pages`) shows per call and the Python reference of the C++ core steps (`fast`). The
replay's report, on every path, is `ReplayReport` (`strata_lab.replay`; its columns: docs/CONTRACTS.md).

>>> from strata_lab.text.tokenizer import load_tokenizer
>>> tok = load_tokenizer("qwen3")
>>> st = SessionState(model="attention")
>>> rec = {"session": "s", "prompt_ids": [9707, 11], "gen_ids": [0], "drained_ids": [], "checkpoints": [],
...        "timings": {}, "call": 0}
>>> row = step(st, rec["prompt_ids"], rec, tok=tok, first=True)
>>> row.cause, row.reused, row["read"]
('new_session', 0, 2)
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import ClassVar

from strata_lab.replayer.costs import CostModel
from strata_lab.replayer.divergence import classify, find_divergence
from strata_lab.replayer.explain import Explanation, attribute, realigned_tail
from strata_lab.rules import DIVERGENCE_CAUSES
from strata_lab.replayer.state import SessionState, lcp_len, shortfall_cause

__all__ = ["CallRow", "step", "attribute_row"]


@dataclass(slots=True)
class CallRow:
    """The replay of one engine call. Rows read like mappings too (`row["cause"]`)."""

    session: str
    turn: int                    # the call's position in its session (Contract 3)
    request_id: str | None
    call: int                    # engine call within its request (0: first)
    ts: float | None
    prompt_len: int
    held_before: int
    lcp_ids: int                 # first id divergence
    lcp_text: int                # held ids wholly before the first text divergence
    reused: int                  # predicted by the state model
    recorded_reused: int | None  # from the dump (None: unknown, or the policy changed the prompt)
    read: int
    reread: int                  # held ids the engine read again (`attribute_row`: Contract 3's one definition)
    cause: str
    checkpoint_gap: int
    snapshots: int
    snapshot_mib: float
    gen_len: int
    drained_len: int
    prefill_ms: float
    prefill_s: float
    reread_s: float
    id_context_held: str = ""
    id_context_prompt: str = ""
    text_context_held: str = ""
    text_context_prompt: str = ""
    held_ids_at: tuple = ()
    prompt_ids_at: tuple = ()

    DTYPES: ClassVar[dict] = {
        "session": "string", "turn": "int64", "request_id": "string", "call": "int64", "ts": "float64",
        "prompt_len": "int64", "held_before": "int64", "lcp_ids": "int64", "lcp_text": "int64",
        "reused": "int64", "recorded_reused": "Int64", "read": "int64", "reread": "int64", "cause": "category",
        "checkpoint_gap": "int64", "snapshots": "int64", "snapshot_mib": "float64", "gen_len": "int64",
        "drained_len": "int64", "prefill_ms": "float64", "prefill_s": "float64", "reread_s": "float64",
        "id_context_held": "string", "id_context_prompt": "string", "text_context_held": "string",
        "text_context_prompt": "string", "held_ids_at": "object", "prompt_ids_at": "object",
    }

    def __getitem__(self, key: str):
        try:
            return getattr(self, key)
        except AttributeError:
            raise KeyError(key) from None

    def get(self, key: str, default=None):
        return getattr(self, key, default)

    def keys(self):
        return list(self.DTYPES)

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.DTYPES}


COLUMNS = [f.name for f in fields(CallRow)]
assert COLUMNS == list(CallRow.DTYPES), "CallRow.DTYPES must list every field, in order"


def recorded_prefill_ms(rec) -> float | None:
    t = rec["timings"].get("prefill_ms") if isinstance(rec.get("timings"), dict) else None
    return float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else None


def step(state: SessionState, prompt, rec, *, tok, first: bool, recorded_checkpoints: bool = False,
         prompt_changed: bool = False, cost_model: CostModel | None = None, context_chars: int = 40,
         lcp: int | None = None) -> CallRow:
    """Replay one call: predict reuse for `prompt`, explain the miss, apply the call's reply to `state`.

    `rec` is the dump record (its reply, timings, recorded reuse); `prompt` the ids this call sends (the
    recorded ones, or a policy's). `recorded_checkpoints`: after the call, the session holds the
    snapshots the dump line reports instead of the policy's. `lcp`: the prompt's common prefix with what
    the session holds, when the caller knows it (the delta replay), so the prompt is not compared again.
    """
    held = state.held
    held_before = len(held)
    if lcp is None:
        lcp = lcp_len(prompt, held)
    # Only a prompt that leaves held (lcp < len(held)) diverges: the byte walk and the context strings are
    # paid on misses. A prompt that extends held keeps every held id's text: lcp_text = len(held).
    div = find_divergence(held, prompt, tok, lcp_ids=lcp, context_chars=context_chars) \
        if lcp < held_before else None
    pred = state.plan(prompt, lcp=lcp)  # the one reuse computation of this call
    target = pred.target
    cause = classify(held=held, prompt=prompt, segments=state.segments, div=div, reused=pred.reused,
                     target=target, tok=tok, first_call=first, lcp_ids=lcp)
    lcp_text = div.lcp_text if div is not None else held_before
    cause, reread, *_split = attribute_row(state.model, held, prompt, held_before=held_before, lcp=lcp,
                                           lcp_text=lcp_text, cause=cause, reused=pred.reused)
    state.apply(prompt, pred)
    gen, drained = rec["gen_ids"], rec["drained_ids"]
    state.finish(gen, drained)
    if recorded_checkpoints:  # both models: an attention-only snapshot's logits serve a full hit
        state.checkpoints.clear()
        state.checkpoints.update((int(c), None) for c in rec["checkpoints"] if 0 < int(c) <= len(state.held))

    read = len(prompt) - pred.reused
    t = recorded_prefill_ms(rec)
    rr = rec.get("reused")
    recorded_reused = rr if isinstance(rr, int) and not isinstance(rr, bool) and not prompt_changed else None
    return CallRow(
        session=str(rec["session"]), turn=state.calls - 1, request_id=rec.get("request_id"),
        call=rec.get("call", 0), ts=rec.get("ts"), prompt_len=len(prompt), held_before=held_before,
        lcp_ids=lcp, lcp_text=lcp_text, reused=pred.reused, recorded_reused=recorded_reused, read=read,
        reread=reread, cause=cause, checkpoint_gap=max(target - pred.reused, 0), snapshots=len(state.checkpoints),
        snapshot_mib=state.snapshot_bytes() / 2**20, gen_len=len(gen), drained_len=len(drained),
        prefill_ms=t if t is not None else math.nan,
        prefill_s=cost_model.seconds(read, pred.reused) if cost_model else math.nan,
        reread_s=cost_model.seconds(reread, pred.reused) if cost_model else math.nan,
        **(_div_context(div) if div is not None else {}))


def attribute_row(model: str, held, prompt, *, held_before: int, lcp: int, lcp_text: int, cause: str,
                  reused: int) -> tuple[str, int, str, int, int]:
    """(cause, reread, divergence, divergence_reread, engine_reread) of one state-model call by the one definition (`explain.attribute`, Contract 3): the
    engine's shortfall plus the divergence's re-read ids, the held ids past the text divergence that the
    prompt repeats (`explain.realigned_tail`) included. `cause`: `classify`'s; `held`, `prompt`: the ids
    before the call (sliced only on a divergence). Every path of the state model's replay (records, the
    store natively or on Dask) calls it, so each gives the one driver's row.

    >>> held, prompt = list(range(1, 21)), [1, 2, 99] + list(range(4, 21))   # an edit at position 2
    >>> attribute_row("hybrid", held, prompt, held_before=20, lcp=2, lcp_text=2, cause="history_edit", reused=0)
    ('history_edit', 19, 'history_edit', 19, 0)
    """
    plen = len(prompt)
    exact = min(lcp, max(plen - 1, 0))
    if cause in DIVERGENCE_CAUSES:
        e = Explanation(held_before, lcp, lcp_text, cause, tail=realigned_tail(held, prompt, lcp_text, lcp))
    else:
        e = Explanation(held_before, lcp, lcp_text, "new_session" if not held_before else "none")
    cause, reread, div_rr, eng_rr = attribute(e, reused=reused, engine_cause=shortfall_cause(model, reused, exact),
                                              exact=exact, prompt_len=plen)
    return cause, reread, e.divergence, div_rr, eng_rr


def _div_context(div) -> dict:
    return dict(id_context_held=div.id_context_held, id_context_prompt=div.id_context_prompt,
                text_context_held=div.text_context_held, text_context_prompt=div.text_context_prompt,
                held_ids_at=div.held_ids_at, prompt_ids_at=div.prompt_ids_at)
