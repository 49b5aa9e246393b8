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

import heapq
import json
import math
from collections import Counter

import numpy as np

from strata_lab.caches.base import Hint
from strata_lab.caches.call_ids import Call, calls_from_dump, lcp_call
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
    "reported": "Int64", "reported_by": "string", "reported_diff": "Int64", "reported_diff_pct": "float64",
    "reported_write": "Int64",
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


def _divergence_causes(dump, tokenizer, calls=()) -> list[str] | None:
    """The strata replay's cause per call (attention model: only divergences), or None without a tokenizer
    (or for hash traces: synthetic ids have no text)."""
    if tokenizer is None or (isinstance(dump, (list, tuple)) and dump and isinstance(dump[0], Call)) or \
            (calls and calls[0].blocks is not None):
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


def _speeds(tokens_per_s):
    if tokens_per_s is None:
        return None
    pair = tuple(tokens_per_s) if isinstance(tokens_per_s, (tuple, list)) else (tokens_per_s, tokens_per_s)
    if len(pair) != 2 or any(isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 for v in pair):
        raise ValueError(f"tokens_per_s must be a positive number or (prefill, decode) numbers, got {tokens_per_s!r}")
    return float(pair[0]), float(pair[1])


def _duration(c: Call, reused: int, speeds, cost_model) -> float:
    """Seconds call `c` stays in flight: prefill of what it reads plus decode of its output."""
    read = c.prompt_len - reused
    if speeds is not None:
        return read / speeds[0] + len(c.output) / speeds[1]
    rec = c.record or {}
    t = rec.get("timings") if isinstance(rec.get("timings"), dict) else {}
    dec = t.get("decode_ms")
    dec = float(dec) / 1000.0 if isinstance(dec, (int, float)) and not isinstance(dec, bool) else 0.0
    return cost_model.seconds(read, reused) + dec


def replay_engines(dump, engines=("vllm", "sglang", "llama.cpp", "strata"), *, tokenizer=None, cost_model=None,
                   prices: dict | None = None, progress: bool = False, concurrency: bool = False,
                   tokens_per_s=None) -> "EnginesReport":
    """Replay `dump` (a path, paths, `Dump`, a Mooncake/Bailian trace, or a list of `Call`) under each engine.

    `engines`: specs ("vllm", "vllm@0.33:block_size=32", "llama.cpp:slots=4") or presets.
    `tokenizer` (a Tokenizer or "qwen3"): name divergence causes as the strata replay does; None: "diverged".
    `cost_model`: prices reads in seconds (default: fitted to the dump's prefill_ms, else none).
    `prices`: per-engine price overrides, e.g. {"anthropic": {"input_usd_per_mtok": 15.0}}.
    `concurrency`: calls arrive at their timestamps and stay in flight for a modelled duration (prefill of
    what they read + decode of their output: `tokens_per_s`, a number or (prefill, decode), else the cost
    model for prefill and each call's recorded decode_ms); the blocks a call in flight holds are pinned, and
    what it leaves is cached when it ends (vLLM pins blocks, SGLang and TRT-LLM lock their path; models
    with no in-flight state of their own, llama.cpp slots, hosted APIs and strata, apply a call when it
    ends). False (default): one call at a time, each done before the next.
    TTLs (hosted APIs) always run on the trace's clock.
    `progress`: a progress bar per engine.
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
    if tokenizer is not None:  # the causes decode the ids: they must be this vocabulary's
        for model in {c.record.get("model") for c in calls if c.record is not None}:
            tokenizer.check_model(model)
    divergence = _divergence_causes(dump, tokenizer, calls)
    if cost_model is None:   # a fit too poor to price seconds (R^2 < MIN_R2) prices tokens only, as the replay does
        from strata_lab.replayer.costs import usable_fit

        cost_model = usable_fit(_fit_cost(calls))[0]
    speeds = _speeds(tokens_per_s)
    if concurrency:
        missing = next((c.index for c in calls if c.ts is None), None)
        if missing is not None:
            raise ValueError(f"concurrency: call {missing} has no ts (arrival time); every call needs one")
        if speeds is None and cost_model is None:
            raise ValueError("concurrency: give tokens_per_s (the trace has no prefill timings to fit a cost model)")
    elif tokens_per_s is not None:
        raise ValueError("tokens_per_s: only used with concurrency=True")
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
        flight: list = []   # (end, seq, replica, call, plan): calls in flight (concurrency)
        for i in it:
            c = calls[i]
            hint, turn = hints[i]
            r = router.route(c)
            if concurrency:
                while flight and flight[0][0] <= c.ts:   # calls that ended before this one arrives
                    end, _, fr, fc, fp = heapq.heappop(flight)
                    models[fr].advance(end)
                    models[fr].finish(fc, fp)
                m = models[r]
                m.advance(c.ts)
                plan = m.plan(c, hint)
                m.start(c, plan)
                heapq.heappush(flight, (c.ts + _duration(c, plan.reused, speeds, cost_model), i, r, c, plan))
            else:
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
            # the serving engine's report sits beside every simulated engine (Contract 4)
            diff = reused - c.reported if c.reported is not None else None
            pct = 100.0 * diff / c.prompt_len if diff is not None and c.prompt_len else math.nan
            for k, v in (("engine", preset.engine), ("spec", spec), ("replica", r), ("index", c.index),
                         ("session", c.session), ("turn", turn), ("ts", c.ts if c.ts is not None else math.nan),
                         ("prompt_len", c.prompt_len), ("held_before", hint.held),
                         ("lcp", hint.lcp), ("exact", hint.exact), ("reused", reused), ("read", read),
                         ("reread", reread), ("unit", plan.unit), ("source", plan.source), ("cause", cause),
                         ("written", plan.written),
                         ("prefill_s", cost_model.seconds(read, reused) if cost_model else math.nan),
                         ("reread_s", cost_model.seconds(reread, reused) if cost_model else math.nan),
                         ("dollars", dollars), ("reported", c.reported), ("reported_by", c.reported_by),
                         ("reported_diff", diff), ("reported_diff_pct", pct), ("reported_write", c.reported_write)):
                cols[k].append(v)
        while flight:
            end, _, fr, fc, fp = heapq.heappop(flight)
            models[fr].advance(end)
            models[fr].finish(fc, fp)
        evictions[spec] = sum(m.evictions for m in models)
    return EnginesReport(cols, presets, evictions, cost_model)


def replay(dump, *, engine=None, **kwargs):
    """`strata_lab.replay`: our engine's weight-free replay (`strata_lab.replayer.replay`, a `Report`), or,
    with `engine="vllm"` (any spec), that engine's cache model (an `EnginesReport`): then `tokenizer`,
    `cost_model` and `progress` are the replay's and every other keyword overrides the preset.

    It sits here, above both, so that the replayer never imports the engine cache models that build on it.

    Args:
        dump: a dump path, paths, `Dump`, or a Parquet store.
        engine: None (our engine's replay) or an engine spec ("vllm", "llama.cpp:slots=4", ...).
        model: "hybrid" or "attention": the reuse rule of our engine.
        checkpoint_policy: a CheckpointPolicy or a spec ("turn", "every:256", "header", "recorded").
        tokenizer: a Tokenizer or a name; names each miss's cause.
        policy: the policy replayed ("recorded", "reply-ids", "fixes", "header", ...; see `parse_policy`).
        full_hit: what the engine does when the whole prompt is held.
        cost_model: prices reads in seconds (default: fitted on the dump's prefill_ms).
        progress: show a progress bar.
        context_chars: characters of text shown around each divergence.
        bytes_per_snapshot: sizes checkpoint budgets and the reported memory.
        cluster: a Dask client, scheduler address or "local[:N]" to replay a store on Dask.
        **kwargs: with `engine`, overrides of the preset's fields (block_size=32, ...).

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


def _replay_signature():
    """`replay`'s parameters as help() and inspect show them: the replayer's, plus `engine` and overrides."""
    import inspect

    from strata_lab.replayer import replay as replay_ours

    P = inspect.Parameter
    core = inspect.signature(replay_ours).parameters
    return inspect.Signature([core["dump"], P("engine", P.KEYWORD_ONLY, default=None)]
                             + [p for n, p in core.items() if n != "dump"] + [P("kwargs", P.VAR_KEYWORD)])


replay.__signature__ = _replay_signature()



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
        evictions, and the comparison with what the log reports (Contract 4): over the calls with a report,
        `simulated_cached` vs `reported_cached` tokens, `reported_diff` (simulated - reported) and
        `reported_diff_pct` (that difference in % of those calls' prompt tokens), `calls_differ`, the rates,
        and `simulated_written` vs `reported_written` on calls with a reported cache write; then the causes."""
        import pandas as pd

        df = self.frame()
        rows = []
        for p in self.presets:
            spec = p.spec()
            g = df[df["spec"] == spec]
            rep = g[g["reported"].notna()]
            wr = g[g["reported_write"].notna()]
            prompt = int(g["prompt_len"].sum())
            rep_prompt = int(rep["prompt_len"].sum())
            sim, got = int(rep["reused"].sum()), int(rep["reported"].sum())
            by = sorted(set(rep["reported_by"].dropna().astype(str)))
            rows.append({
                "engine": p.engine, "spec": spec, "calls": len(g), "prompt_tokens": prompt,
                "reused": int(g["reused"].sum()), "read": int(g["read"].sum()), "reread": int(g["reread"].sum()),
                "hit_rate": g["reused"].sum() / prompt if prompt else math.nan,
                "prefill_s": float(g["prefill_s"].sum(min_count=1)), "reread_s": float(g["reread_s"].sum(min_count=1)),
                "dollars": float(g["dollars"].sum(min_count=1)), "evictions": self.evictions.get(spec, 0),
                "reported_calls": len(rep), "reported_by": ", ".join(by) or None,
                "simulated_cached": sim, "reported_cached": got, "reported_diff": sim - got,
                "reported_diff_pct": 100.0 * (sim - got) / rep_prompt if rep_prompt else math.nan,
                "simulated_rate": sim / rep_prompt if rep_prompt else math.nan,
                "reported_rate": got / rep_prompt if rep_prompt else math.nan,
                "calls_differ": int((rep["reused"] != rep["reported"]).sum()) if len(rep) else 0,
                "reported_write_calls": len(wr), "simulated_written": int(wr["written"].sum()),
                "reported_written": int(wr["reported_write"].sum()),
                "causes": ", ".join(f"{k} {v}" for k, v in sorted(Counter(g["cause"].astype(str)).items(),
                                                                   key=lambda kv: (-kv[1], kv[0]))),
            })
        return pd.DataFrame(rows)

    def lines(self) -> list[str]:
        out = []
        for p, r in zip(self.presets, self.summary().to_dict("records")):
            s = (f"{r['spec']}: hit rate {r['hit_rate']:.1%} ({r['reused']} of {r['prompt_tokens']} prompt tokens "
                 f"reused), {r['reread']} re-read")
            if r["reread_s"] == r["reread_s"]:
                s += f" ({r['reread_s']:.3g} s)"
            if r["dollars"] == r["dollars"]:
                s += f", ${r['dollars']:.4f}"
            out.append(s)
            if r["reported_calls"]:
                who = f" by {r['reported_by']}" if r["reported_by"] else ""
                out.append(f"    vs reported{who} on {r['reported_calls']} calls: simulated {r['simulated_cached']} "
                           f"cached ({r['simulated_rate']:.1%}), reported {r['reported_cached']} "
                           f"({r['reported_rate']:.1%}), difference {r['reported_diff']:+d} tokens "
                           f"({r['reported_diff_pct']:+.1f}% of their prompt tokens), {r['calls_differ']} calls differ")
            if r["reported_write_calls"]:
                out.append(f"    cache writes on {r['reported_write_calls']} calls: simulated {r['simulated_written']}, "
                           f"reported {r['reported_written']}, difference "
                           f"{r['simulated_written'] - r['reported_written']:+d} tokens")
            out.append(f"    causes: {r['causes']}")
            if p.engine == "strata":   # the same engine gives other numbers under other checkpoints: say which
                cp = getattr(p, "checkpoints", "recorded")
                out.append("    checkpoints: " + ("recorded (the snapshots each dump line reports, as the engine kept "
                                                  "them; `strata-lab replay` defaults to --checkpoints turn, a "
                                                  "snapshot at each prompt's end only, and can differ)"
                                                  if cp == "recorded" else f"{cp} (set with strata:checkpoints=...)"))
        return out

    def format(self) -> str:
        df = self.frame()
        show = ["engine", "index", "session", "prompt_len", "reused", "read", "reread", "unit", "cause"]
        if df["reported"].notna().any():
            show += ["reported", "reported_diff"]
        head = df[show].to_string(index=False, max_rows=60)
        return head + "\n\n" + "\n".join(self.lines())

    def to_json(self) -> str:
        """The report as JSON: same input, identical bytes (sorted keys, NaN as null, shortest float repr)."""
        import pandas as pd

        def clean(v):
            if v is None or (isinstance(v, float) and not math.isfinite(v)):
                return None
            if v is pd.NA:
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
