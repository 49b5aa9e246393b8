"""Replay one trace under several engines' caches: per call reused / read / reread, the unit that served it,
the cause of each miss, prefill seconds and hosted-API dollars; per engine a summary.

Calls from every session share one cache per replica, in arrival (`ts`) order (file order when a call has
no `ts`). Each engine gets fresh models; the session view (`Hint`) is computed once for all of them.

>>> import os, tempfile
>>> from strata_lab.dump.writer import Recorder
>>> path = os.path.join(tempfile.mkdtemp(), "d.jsonl")
>>> with Recorder(path) as rec:
...     rec.write_call(session="s", prompt_ids=list(range(40)), reused=0, gen_ids=[7, 8])
...     rec.write_call(session="s", prompt_ids=list(range(40)) + [7, 9], reused=40)
>>> rep = replay_engines(path, ["vllm", "sglang", "strata:kind=attention"])
>>> rep.frame()[["engine", "reused", "cause"]].values.tolist()
[['vllm', 0, 'new_session'], ['vllm', 32, 'block_rounding'], ['sglang', 0, 'new_session'], ['sglang', 41, 'diverged'], ['strata', 0, 'new_session'], ['strata', 41, 'diverged']]
"""
from __future__ import annotations

import json
import math
from collections import Counter

import numpy as np

from strata_lab.caches.base import Hint
from strata_lab.caches.calls import Call, calls_from_dump, lcp_call
from strata_lab.caches.fleet import Router
from strata_lab.caches.presets import parse_engine

__all__ = ["replay", "replay_engines", "EnginesReport"]

# cause vocabulary of the strata replay that names a divergence of the prompt from what the session held
_DIVERGENCE = {"retokenized_reply", "retokenized_prompt", "drained_dropped", "template_rewrite", "history_edit"}

# engine causes that a divergence explains better (a hybrid falling back to its last state because the
# prompt parted from what it held): the divergence cause wins over these, as in the strata replay
_FALLBACK = {"checkpoint", "no_state_checkpoint", "not_cached", None}

_DTYPES = {
    "engine": "category", "spec": "category", "replica": "int64", "index": "int64", "session": "string",
    "turn": "int64", "ts": "float64", "prompt_len": "int64", "held_before": "int64", "lcp": "int64",
    "exact": "int64", "reused": "int64", "read": "int64", "reread": "int64", "unit": "string", "source": "Int64",
    "cause": "category", "written": "int64", "prefill_s": "float64", "reread_s": "float64", "dollars": "float64",
    "reported": "Int64",
}


def _order(calls: list[Call]) -> list[int]:
    if all(c.ts is not None for c in calls):
        return sorted(range(len(calls)), key=lambda i: (calls[i].ts, i))
    return list(range(len(calls)))


def _hints(calls: list[Call], order: list[int]) -> dict[int, tuple]:
    """Per call: (Hint, turn in session). One LCP per call against what its session's last call left."""
    last: dict[str, Call] = {}
    turns: Counter = Counter()
    out = {}
    for i in order:
        c = calls[i]
        prev = last.get(c.session)
        if prev is None:
            h = Hint(None, 0, 0)
        else:
            n = lcp_call(c.prompt, prev)
            h = Hint(prev, n, min(n, max(c.prompt_len - 1, 0)))
        out[i] = (h, turns[c.session])
        turns[c.session] += 1
        last[c.session] = c
    return out


def _divergence_causes(dump, tokenizer) -> list[str] | None:
    """The strata replay's cause per call (attention model: only divergences), or None without a tokenizer."""
    if tokenizer is None or (isinstance(dump, (list, tuple)) and dump and isinstance(dump[0], Call)):
        return None
    from strata_lab.replayer import replay

    rep = replay(dump, model="attention", checkpoint_policy="turn", tokenizer=tokenizer)
    return [r["cause"] for r in rep.rows]


def _fit_cost(calls: list[Call]):
    from strata_lab.replayer.costs import CostModel

    # (read, start, ms) from each call the serving engine timed and reported its reuse for
    samples = [(c.prompt_len - c.reported, c.reported, c.prefill_ms) for c in calls
               if c.reported is not None and c.prefill_ms is not None]
    try:
        return CostModel.fit(samples)
    except ValueError:
        return None


def replay_engines(dump, engines=("vllm", "sglang", "llama.cpp", "strata"), *, tokenizer=None, cost_model=None,
                   prices: dict | None = None, progress: bool = False) -> "EnginesReport":
    """Replay `dump` (a path, paths, `Dump`, or a list of `Call`) under each engine spec.

    `engines`: specs ("vllm", "vllm@0.33:block_size=32", "llama.cpp:slots=4") or presets.
    `tokenizer` (a Tokenizer or "qwen3"): name divergence causes as the strata replay does; None: "diverged".
    `cost_model`: prices reads in seconds (default: fitted to the dump's prefill_ms, else none).
    `prices`: per-engine price overrides, e.g. {"anthropic": {"input_usd_per_mtok": 15.0}}.
    """
    if isinstance(engines, str):
        engines = [engines]
    presets = [parse_engine(e) for e in engines]
    if not presets:
        raise ValueError("engines must name at least one engine")
    for name, kw in (prices or {}).items():
        if not isinstance(kw, dict):
            raise ValueError(f"prices[{name!r}] must be a dict of price fields")
        presets = [p.with_(**kw) if p.engine == name else p for p in presets]
    calls = calls_from_dump(dump)
    if isinstance(tokenizer, str):
        from strata_lab.text.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(tokenizer)
    divergence = _divergence_causes(dump, tokenizer)
    if cost_model is None:
        cost_model = _fit_cost(calls)
    order = _order(calls)
    hints = _hints(calls, order)
    cols: dict[str, list] = {k: [] for k in _DTYPES}
    evictions = {}
    for preset in presets:
        models = [preset.build() for _ in range(preset.replicas)]
        router = Router(preset)
        where: dict[str, int] = {}
        it = order
        if progress:
            from tqdm.auto import tqdm

            it = tqdm(order, desc=f"replay {preset.spec()}", unit="call")
        spec = preset.spec()
        for i in it:
            c = calls[i]
            hint, turn = hints[i]
            r = router.route(c)
            plan = models[r].step(c, hint)
            moved = where.get(c.session, r) != r
            where[c.session] = r
            reused = plan.reused
            diverged = hint.prev is not None and hint.lcp < hint.held and hint.lcp < c.prompt_len
            if plan.cause == "refused":   # turned away by the engine: no reuse, nothing cached
                cause = "refused"
            elif hint.prev is None:
                cause = "none" if reused else "new_session"
            elif reused < hint.exact and moved:
                cause = "routing"
            elif reused < hint.exact and (plan.cause not in _FALLBACK or not diverged):
                cause = plan.cause or "not_cached"
                if cause == "not_cached" and reused == hint.held - 1 == hint.exact - 1:
                    cause = "last_output_token"   # the last generated id is never fed back: no KV for it
            elif diverged:  # the loss starts where the prompt parts from what the session left
                d = divergence[i] if divergence is not None else "diverged"
                cause = d if d in _DIVERGENCE or d == "diverged" else "none"
            else:
                cause = "none"
            read = c.prompt_len - reused
            reread = max(hint.exact - reused, 0) if hint.prev is not None else 0
            dollars = preset.dollars(c.prompt_len, len(c.output), reused, plan.written) \
                if hasattr(preset, "dollars") else math.nan
            rep_ok = c.reported is not None and c.reported_by in (None, preset.engine)
            for k, v in (("engine", preset.engine), ("spec", spec), ("replica", r), ("index", c.index),
                         ("session", c.session), ("turn", turn), ("ts", c.ts if c.ts is not None else math.nan),
                         ("prompt_len", c.prompt_len), ("held_before", hint.held),
                         ("lcp", hint.lcp), ("exact", hint.exact), ("reused", reused), ("read", read),
                         ("reread", reread), ("unit", plan.unit), ("source", plan.source), ("cause", cause),
                         ("written", plan.written),
                         ("prefill_s", cost_model.seconds(read, reused) if cost_model else math.nan),
                         ("reread_s", cost_model.seconds(reread, reused) if cost_model else math.nan),
                         ("dollars", dollars), ("reported", c.reported if rep_ok else None)):
                cols[k].append(v)
        evictions[spec] = sum(m.evictions for m in models)
    return EnginesReport(cols, presets, evictions, cost_model)


def replay(dump, *, engine=None, **kwargs):
    """`strata_lab.replay`: our engine's weight-free replay (`strata_lab.replayer.replay`, a `Report`), or,
    with `engine="vllm"` (any spec), that engine's cache model (an `EnginesReport`): then `tokenizer`,
    `cost_model` and `progress` are the replay's and every other keyword overrides the preset.

    It sits here, above both, so that the replayer never imports the engine cache models that build on it.

    >>> import inspect
    >>> "engine" in inspect.signature(replay).parameters
    True
    """
    import inspect

    from strata_lab.replayer import replay as replay_ours

    if engine is None and not set(kwargs) - set(inspect.signature(replay_ours).parameters):
        return replay_ours(dump, **kwargs)
    own = {k: kwargs.pop(k) for k in ("tokenizer", "cost_model", "progress") if k in kwargs}
    if engine is None:
        raise ValueError(f"engine must name an engine to take {sorted(kwargs)}")
    return replay_engines(dump, [parse_engine(engine).with_(**kwargs) if kwargs else engine], **own)



class EnginesReport:
    """Per-call rows of every engine (`frame()`), per-engine totals (`summary()`), text (`format()`), and a
    deterministic JSON report (`to_json()`)."""

    def __init__(self, cols: dict, presets: list, evictions: dict, cost_model):
        self.cols = cols
        self.presets = presets
        self.evictions = evictions
        self.cost_model = cost_model

    def frame(self):
        """One row per (engine, call), typed columns."""
        import pandas as pd

        return pd.DataFrame({k: pd.Series(v, dtype=_DTYPES[k]) for k, v in self.cols.items()})

    to_frame = frame

    def summary(self):
        """One row per engine: calls, prompt tokens, reused, read, reread, hit rate, seconds, dollars,
        evictions, the reported hit rate, how many calls differ from the report, and the causes."""
        import pandas as pd

        df = self.frame()
        rows = []
        for p in self.presets:
            spec = p.spec()
            g = df[df["spec"] == spec]
            rep = g[g["reported"].notna()]
            prompt = int(g["prompt_len"].sum())
            rows.append({
                "engine": p.engine, "spec": spec, "calls": len(g), "prompt_tokens": prompt,
                "reused": int(g["reused"].sum()), "read": int(g["read"].sum()), "reread": int(g["reread"].sum()),
                "hit_rate": g["reused"].sum() / prompt if prompt else math.nan,
                "prefill_s": float(g["prefill_s"].sum(min_count=1)), "reread_s": float(g["reread_s"].sum(min_count=1)),
                "dollars": float(g["dollars"].sum(min_count=1)), "evictions": self.evictions.get(spec, 0),
                "reported_calls": len(rep),
                "simulated_rate": rep["reused"].sum() / rep["prompt_len"].sum() if len(rep) else math.nan,
                "reported_rate": rep["reported"].sum() / rep["prompt_len"].sum() if len(rep) else math.nan,
                "calls_differ": int((rep["reused"] != rep["reported"]).sum()) if len(rep) else 0,
                "causes": ", ".join(f"{k} {v}" for k, v in sorted(Counter(g["cause"].astype(str)).items(),
                                                                   key=lambda kv: (-kv[1], kv[0]))),
            })
        return pd.DataFrame(rows)

    def lines(self) -> list[str]:
        out = []
        for r in self.summary().to_dict("records"):
            s = (f"{r['spec']}: hit rate {r['hit_rate']:.1%} ({r['reused']} of {r['prompt_tokens']} prompt tokens "
                 f"reused), {r['reread']} re-read")
            if r["reread_s"] == r["reread_s"]:
                s += f" ({r['reread_s']:.3g} s)"
            if r["dollars"] == r["dollars"]:
                s += f", ${r['dollars']:.4f}"
            if r["reported_calls"]:
                s += (f"; simulated {r['simulated_rate']:.1%}, reported {r['reported_rate']:.1%}, "
                      f"{r['calls_differ']} calls differ")
            out.append(s)
            out.append(f"    causes: {r['causes']}")
        return out

    def format(self) -> str:
        df = self.frame()
        show = ["engine", "index", "session", "prompt_len", "reused", "read", "reread", "unit", "cause"]
        head = df[show].to_string(index=False, max_rows=60)
        return head + "\n\n" + "\n".join(self.lines())

    def to_json(self) -> str:
        """The report as JSON: same input, identical bytes (sorted keys, NaN as null, shortest float repr)."""
        def clean(v):
            if v is None or (isinstance(v, float) and not math.isfinite(v)):
                return None
            if isinstance(v, (np.integer,)):
                return int(v)
            if isinstance(v, (np.floating,)):
                return clean(float(v))
            return v

        summary = [{k: clean(v) for k, v in r.items()} for r in self.summary().to_dict("records")]
        calls = [{k: clean(self.cols[k][i]) for k in self.cols} for i in range(len(self.cols["index"]))]
        doc = {"schema": "strata-engines/1", "engines": summary, "calls": calls,
               "cost_model": self.cost_model.describe() if self.cost_model else None}
        return json.dumps(doc, sort_keys=True, allow_nan=False, separators=(",", ":")) + "\n"

    def __repr__(self):
        return f"EnginesReport({[p.spec() for p in self.presets]}, calls={len(self.cols['index'])})"
