"""What the engine reported against what strata's model predicts for the same engine spec, call by call.

`compare(rows, spec, engine)` takes the calls as they were served, `[(Request, output ids, reported)]`
(`reported` None: the engine refused the call), replays them through strata's model of `spec` in the same
order, and returns a `Comparison`: per call both numbers, and the totals the fidelity table shows:

- exact: calls where the model's reuse equals the engine's report (a refused call matches a model that
  refuses it);
- token-weighted error: sum over calls of |predicted - reported| / sum of prompt ids.

`write_dump` writes the calls as strata-dump/1 lines carrying both: `cached_tokens` + `cache_engine` (the
engine's report, as docs/DUMP_FORMAT.md defines them) and `predicted_tokens` + `predicted_spec` (strata's),
plus `refused` where the engine turned the call away.

>>> from strata_lab.validate.workloads import Request
>>> rows = [(Request("a", list(range(40)), 2), [7, 8], 0), (Request("a", list(range(40)) + [7, 9], 2), [1, 2], 32)]
>>> c = compare(rows, "vllm", "vllm"); (c.calls, c.exact, c.predicted)
(2, 2, [0, 32])
"""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Comparison", "compare", "write_dump", "to_calls", "explain", "explain_slot"]


def to_calls(rows, engine: str):
    from strata_lab.caches.call_ids import Call, as_ids

    return [Call(index=i, session=req.session, prompt=as_ids(req.prompt), output=as_ids(out),
                 reported=rep, reported_by=engine, cache_salt=req.salt, ts=req.sent, done_ts=req.done)
            for i, (req, out, rep) in enumerate(rows)]


@dataclass
class Comparison:
    spec: str
    engine: str
    rows: list
    predicted: list             # strata's reuse per call (None: the model refuses the call)
    causes: list
    calls: int = 0
    exact: int = 0
    prompt_tokens: int = 0
    abs_error: int = 0
    differ: list = field(default_factory=list)   # indices of the calls that differ
    evictions: int = 0          # units the model evicted (a bounded cache really was bounded)
    sources: list = field(default_factory=list)  # the call whose ids the model reused (None: nothing reused)

    @property
    def exact_rate(self) -> float:
        return self.exact / self.calls if self.calls else float("nan")

    @property
    def token_error(self) -> float:
        return self.abs_error / self.prompt_tokens if self.prompt_tokens else float("nan")

    def line(self) -> str:
        return (f"{self.spec}: {self.calls} calls, {self.exact_rate:.1%} exact, token-weighted error "
                f"{self.token_error:.3%}" + (f"; differ at {self.differ[:12]}" if self.differ else ""))


def compare(rows, spec: str, engine: str) -> Comparison:
    from strata_lab.caches.replay import replay_engines

    calls = to_calls(rows, engine)
    rep = replay_engines(calls, [spec])
    reused, causes = rep.cols["reused"], rep.cols["cause"]
    idx = rep.cols["index"]
    pred_by = {i: (None if cz == "refused" else r) for i, r, cz in zip(idx, reused, causes)}
    cause_by = dict(zip(idx, causes))
    source_by = dict(zip(idx, rep.cols["source"]))
    predicted = [pred_by[i] for i in range(len(calls))]
    c = Comparison(spec=rep.presets[0].spec(), engine=engine, rows=rows, predicted=predicted,
                   causes=[cause_by[i] for i in range(len(calls))], evictions=sum(rep.evictions.values()),
                   sources=[None if source_by[i] is None or source_by[i] != source_by[i] else int(source_by[i])
                            for i in range(len(calls))])
    for i, ((req, _out, reported), pred) in enumerate(zip(rows, predicted)):
        c.calls += 1
        c.prompt_tokens += len(req.prompt)
        if pred == reported:
            c.exact += 1
        else:
            c.differ.append(i)
            c.abs_error += abs((pred or 0) - (reported or 0)) if (pred is None) == (reported is None) \
                else len(req.prompt)
    return c


def explain(comp: Comparison, i: int) -> str:
    """Why call i differs, where the run says: the calls in flight at the same time (concurrent clients),
    those sharing a prefix with it first. The model replays one call at a time in send order; a server that
    runs them together computes, caches and frees blocks in another order. Where the engine said which slot
    ran each call (llama-server `id_slot`), the slot's previous call is named (`explain_slot`)."""
    from strata_lab.caches.call_ids import as_ids, lcp

    req = comp.rows[i][0]
    if req.sent is None:
        return "sequential run"
    if req.slot is not None:
        return explain_slot(comp, i)[1]
    mine = as_ids(req.prompt)
    overlap = [j for j, (r, _, _) in enumerate(comp.rows)
               if j != i and r.sent is not None and r.sent < req.done and r.done > req.sent]
    shared = [j for j in overlap if lcp(as_ids(comp.rows[j][0].prompt), mine) >= 16]
    if shared:
        return f"in flight with calls {shared[:6]} sharing its prefix (the engine ran them together)"
    if overlap:
        return f"in flight with calls {overlap[:6]} (no shared prefix: block pool order)"
    return "no call in flight: a model error"


def _held(row):
    """The ids a llama.cpp slot holds after a call: its prompt and output but the last id."""
    from strata_lab.caches.call_ids import as_ids
    import numpy as np

    req, out, _rep = row
    return np.concatenate([as_ids(req.prompt), as_ids(out[:-1])]) if len(out) > 1 else as_ids(req.prompt)


def _slot_prev(comp: Comparison, i: int):
    """The call that ran last in call i's engine slot before it (sent before it), or None."""
    req = comp.rows[i][0]
    prev = [j for j, (r, _, _) in enumerate(comp.rows)
            if j != i and r.slot == req.slot and r.sent is not None and r.sent < req.sent]
    return max(prev, key=lambda k: comp.rows[k][0].sent) if prev else None


def _early_release(comp: Comparison, i: int):
    """(j, ms) when call i ran in the slot of call j whose reply reached its client after i was sent."""
    j = _slot_prev(comp, i)
    if j is None:
        return None
    rj, ri = comp.rows[j][0], comp.rows[i][0]
    if rj.done is not None and rj.done > ri.sent:
        return j, (rj.done - ri.sent) * 1000
    return None


def explain_slot(comp: Comparison, i: int) -> tuple:
    """(cause, text) for a differing call of a concurrent llama-server run whose calls carry the engine's
    `id_slot`. The engine's reuse is checked against what its slot held: the slot's previous call (the latest
    call sent before this one to the same slot), `LCP(its prompt + output, this prompt)`, less the one id
    always re-read; else an earlier call whose held ids share exactly the reported number (the host prompt
    cache, `--cache-ram`, loaded it).

    The model keeps a slot busy from a call's `ts` to its `done_ts` (`if (slot.is_processing()) continue;`),
    but the server releases a slot at the end of a decode step, before the reply reaches the client, and
    launches the tasks that arrived during that step after the releases. Causes:
    - `slot released before its reply`: the engine ran the call in the slot of a call whose reply arrived
      after this call was sent; the model held that slot busy and placed the call elsewhere;
    - `slots diverged after an early release`: the engine's slot (or host prompt cache) held other ids than
      the model's, since an earlier call was placed by such an early release (named);
    - `unexplained`: neither holds (a model error)."""
    from strata_lab.caches.call_ids import as_ids, lcp

    req, _out, rep = comp.rows[i]
    mine = as_ids(req.prompt)

    def shared(j):
        n = lcp(_held(comp.rows[j]), mine)
        return n - 1 if n >= len(mine) and n else n

    j = _slot_prev(comp, i)
    n = 0 if j is None else shared(j)
    src = comp.sources[i] if i < len(comp.sources) else None
    model = f"the model reused {comp.predicted[i]} ids" + (f" of call {src}" if src is not None else "")
    if n == rep:
        held = f"engine slot {req.slot} held call {j} ({rep} ids shared)" if j is not None \
            else f"engine slot {req.slot} was empty"
    else:
        ram = [k for k in range(i) if comp.rows[k][0].done is not None and comp.rows[k][0].done <= req.sent
               and shared(k) == rep]
        if not ram:
            return ("unexplained", f"engine slot {req.slot}: reported {rep}, its previous call {j} shares {n} "
                                   f"ids and no earlier call shares {rep}; {model}")
        held = f"engine slot {req.slot} loaded call {ram[-1]} from the host prompt cache ({rep} ids shared)"
    early = _early_release(comp, i)
    if early is not None:
        return ("slot released before its reply",
                f"{held}, whose reply arrived {early[1]:.0f} ms after this call was sent; {model}")
    before = [k for k in range(i) if comp.rows[k][0].slot is not None and _early_release(comp, k) is not None]
    if before:
        k = before[-1]
        jk, ms = _early_release(comp, k)
        return ("slots diverged after an early release",
                f"{held}; {model}; the slots differ since call {k} ran in call {jk}'s slot {ms:.0f} ms "
                f"before that reply arrived")
    return ("unexplained", f"{held}; {model}")


def write_dump(path, comp: Comparison) -> None:
    """The served calls with both numbers (mode 0600: dumps hold token ids)."""
    from strata_lab.dump.writer import write_records

    def records():
        for i, ((req, out, reported), pred) in enumerate(zip(comp.rows, comp.predicted)):
            rec = {"schema": "strata-dump/1", "session": req.session, "call": i, "prompt_ids": req.prompt,
                   "gen_ids": out, "cache_engine": comp.engine, "predicted_spec": comp.spec}
            if reported is None:
                rec["refused"] = True
            else:
                rec["cached_tokens"] = reported
            if pred is not None:
                rec["predicted_tokens"] = pred
            if req.salt is not None:
                rec["cache_salt"] = req.salt
            if req.sent is not None:   # concurrent clients: when each call was sent and answered
                rec["ts"], rec["done_ts"] = req.sent, req.done
            if req.slot is not None:
                rec["engine_slot"] = req.slot
            yield rec

    write_records(records(), path)  # the one dump writer: 0600, no symbolic link
