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

import os
from dataclasses import dataclass, field

__all__ = ["Comparison", "compare", "write_dump", "to_calls", "explain"]


def to_calls(rows, engine: str):
    from strata_lab.caches.calls import Call, as_ids

    return [Call(index=i, session=req.session, prompt=as_ids(req.prompt), output=as_ids(out),
                 reported=rep, reported_by=engine, cache_salt=req.salt)
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
    predicted = [pred_by[i] for i in range(len(calls))]
    c = Comparison(spec=rep.presets[0].spec(), engine=engine, rows=rows, predicted=predicted,
                   causes=[cause_by[i] for i in range(len(calls))], evictions=sum(rep.evictions.values()))
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
    runs them together computes, caches and frees blocks in another order."""
    from strata_lab.caches.calls import as_ids, lcp

    req = comp.rows[i][0]
    if req.sent is None:
        return "sequential run"
    mine = as_ids(req.prompt)
    overlap = [j for j, (r, _, _) in enumerate(comp.rows)
               if j != i and r.sent is not None and r.sent < req.done and r.done > req.sent]
    shared = [j for j in overlap if lcp(as_ids(comp.rows[j][0].prompt), mine) >= 16]
    if shared:
        return f"in flight with calls {shared[:6]} sharing its prefix (the engine ran them together)"
    if overlap:
        return f"in flight with calls {overlap[:6]} (no shared prefix: block pool order)"
    return "no call in flight: a model error"


def write_dump(path, comp: Comparison) -> None:
    """The served calls with both numbers (mode 0600: dumps hold token ids)."""
    import orjson

    fd = os.open(os.fspath(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
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
            f.write(orjson.dumps(rec) + b"\n")
