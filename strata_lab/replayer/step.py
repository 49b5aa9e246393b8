"""The state model's per-call rules the C++ replay core (`native`) defers to Python for: `attribute_row`, a
call's re-read by the one definition (Contract 3), and `recorded_prefill_ms`, a dump line's recorded prefill
time. The replay's rows are `ReplayReport`'s (`strata_lab.replay`; its columns: docs/CONTRACTS.md).
"""
from __future__ import annotations

from strata_lab.replayer.explain import Explanation, attribute, realigned_tail
from strata_lab.rules import DIVERGENCE_CAUSES
from strata_lab.replayer.state import shortfall_cause

__all__ = ["attribute_row", "recorded_prefill_ms"]


def recorded_prefill_ms(rec) -> float | None:
    t = rec["timings"].get("prefill_ms") if isinstance(rec.get("timings"), dict) else None
    return float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else None


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
