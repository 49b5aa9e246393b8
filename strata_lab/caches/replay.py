"""The one replay driver: any trace under any engines' caches (ours, `strata`, among them), one report type.

`replay(source)` replays under the engine the dump names (our dumps: `strata`, with the checkpoints each
line recorded); `replay(source, engine="vllm")` or `replay_engines(source, [...])` under others. Every
path returns a `ReplayReport`: per (engine, call) reused / read / reread, the unit that served it, the
cause of each miss (the one explainer, `strata_lab.replayer.explain`), prefill seconds, hosted-API dollars,
what the log reported (Contract 4); per engine a summary (docs/CONTRACTS.md, Contract 3).

Calls from every session share one cache per replica, in arrival (`ts`) order (file order when a call has
no `ts`). Each engine gets fresh models; each call's divergence is computed once for all of them.

Why one module: every source (JSONL, a store, Dask) and every engine meet in one driver, and choosing the
C++ core's path for our own engine is part of that driver's choice of route; split, the route and its
fallback would be two readings of the same conditions.

>>> import os, tempfile
>>> from strata_lab.dump.writer import Recorder
>>> path = os.path.join(tempfile.mkdtemp(), "d.jsonl")
>>> with Recorder(path) as rec:
...     rec.write_call(session="s", prompt_ids=list(range(40)), reused=0, gen_ids=[7, 8])
...     rec.write_call(session="s", prompt_ids=list(range(40)) + [7, 9], reused=40)
>>> rep = replay_engines(path, ["vllm", "sglang", "strata:kind=attention"])
>>> rep.frame()[["engine", "reused", "cause"]].values.tolist()
[['vllm', 0, 'new_session'], ['vllm', 32, 'diverged'], ['sglang', 0, 'new_session'], ['sglang', 41, 'diverged'], ['strata', 0, 'new_session'], ['strata', 41, 'diverged']]
"""
from __future__ import annotations

import dataclasses
import heapq
import math
from collections import Counter

from strata_lab.caches.base import Hint
from strata_lab.caches.call_ids import Call, as_ids, calls_from_dump, lcp_call
from strata_lab.caches.fleet import Router
from strata_lab.caches.presets import parse_engine
from strata_lab.progress import progress_bar
from strata_lab.caches.report import (_DTYPES, ReplayReport,  # noqa: F401 (re-exported)
                                      reported_agrees, reported_base)
from strata_lab.replayer.explain import SessionHistory, attribute, explain, name_habit
from strata_lab.rules import checkpoint_spec

__all__ = ["replay", "replay_engines", "ReplayReport", "explain_calls", "default_engine"]



def _order(calls: list[Call]) -> list[int]:
    if all(c.ts is not None for c in calls):
        return sorted(range(len(calls)), key=lambda i: (calls[i].ts, i))
    return list(range(len(calls)))


def _reply(c: Call) -> tuple:
    """(generated, drained) ids a call left: the dump line's, else its whole output as generated."""
    rec = c.record
    if rec is not None and isinstance(rec.get("gen_ids"), list):
        return rec.get("gen_ids") or [], rec.get("drained_ids") or []
    return c.output, ()


def explain_calls(calls: list[Call], tokenizer=None, order: list[int] | None = None, *,
                  context_chars: int = 40) -> dict[int, tuple]:
    """Per call (by position in `calls`): (Hint, turn in session, Explanation): each call's divergence from
    what its session held, computed once for every engine (`strata_lab.replayer.explain`)."""
    order = _order(calls) if order is None else order
    hist: dict[str, SessionHistory] = {}
    last: dict[str, Call] = {}
    turns: Counter = Counter()
    named = tokenizer is not None and not (calls and calls[0].blocks is not None)   # hash traces have no text
    if named:   # nor has a dump of one: its placeholder ids pass the vocabulary
        rows = getattr(tokenizer, "embedding_rows", None)
        named = rows is None or not any((c.record or {}).get("synthetic_ids") is True and len(c.prompt) and
                                        int(c.prompt.max()) >= rows for c in calls)
    out = {}
    for i in order:
        c = calls[i]
        h = hist.get(c.session)
        if h is None:
            h = hist[c.session] = SessionHistory()
        prev = last.get(c.session)
        n = lcp_call(c.prompt, prev) if prev is not None else 0
        e = explain(h, c.prompt, tokenizer if named else None, context_chars=context_chars, lcp_ids=n)
        if named:
            name_habit(e, c.record)   # an imported log's messages name the client's habit (any template)
        gen, drained = _reply(c)
        h.finish(gen, drained, held=c.sequence())
        hint = Hint(None, 0, 0) if prev is None else Hint(prev, n, min(n, max(c.prompt_len - 1, 0)))
        out[i] = (hint, turns[c.session], e)
        turns[c.session] += 1
        last[c.session] = c
    return out


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


def _apply_policy(calls: list[Call], policy, tok) -> list[Call]:
    """The calls a server under a prompt-changing policy (reply-ids, keep-drained, fixes) would have sent: a
    transform of the call stream, so it applies to every engine. Reported figures belong to the recorded
    prompts and are dropped."""
    from strata_lab.replayer.policies import PromptRewriter
    from strata_lab.replayer.state import SessionState

    if tok is None:
        raise ValueError(f"policy {policy.name!r} rebuilds prompts from text: give a tokenizer")
    rw = PromptRewriter(policy, tok)
    states: dict = {}
    out = []
    for c in calls:
        rec = c.record
        if rec is None or not isinstance(rec.get("gen_ids"), list):
            raise ValueError(f"policy {policy.name!r}: call {c.index} has no dump record (strata-dump/1 lines "
                             "carry the replies a policy rebuilds prompts from)")
        st = states.get(c.session)
        if st is None:
            st = states[c.session] = SessionState(model="attention")
        prompt = rw.prompt(rec, st)
        st.call(prompt)
        st.finish(rec["gen_ids"], rec.get("drained_ids") or [])
        rw.finish(rec, prompt)
        new = dict(rec, prompt_ids=list(prompt), reused=None)
        out.append(dataclasses.replace(c, prompt=as_ids(prompt), record=new, reported=None, reported_by=None,
                                       reported_write=None, reported_prompt=None, memo=None))
    return out


def _as_store(dump):
    """The Parquet store `dump` is (a `Store`, a store directory, or a store's `fast.StoreScan`), else None."""
    import os

    from strata_lab.dump import Store
    from strata_lab.replayer.fast import StoreScan

    if isinstance(dump, StoreScan):
        return dump.store
    if isinstance(dump, Store):
        return dump
    if isinstance(dump, (str, os.PathLike)) and os.path.isdir(dump) and \
            any(n.startswith("day=") for n in os.listdir(dump)):
        return Store(dump)
    return None


def _arrival_order(table):
    """The core's rows (store order) in the order every replay reports its calls: `_order`'s, by (ts, index)
    when every call has a ts. Our engine's caches are per session, so only the rows move, not their values."""
    import pyarrow.compute as pc

    if table is None or table.num_rows == 0:
        return table
    ts = table.column("ts")
    if ts.null_count or pc.any(pc.is_nan(ts)).as_py():
        return table
    return table.take(pc.sort_indices(table, [("ts", "ascending"), ("index", "ascending")]))


def _core_replay(scan, preset, pol, tokenizer, cost_model, *, progress: bool, context_chars: int,
                 cluster) -> "ReplayReport":
    """Our engine (`strata`) over a store of our own lines on the C++ replay core (`strata_lab.replayer.native`),
    in-process or on Dask: the same rows as the call-by-call replay of the same lines. `scan`: the store's
    `fast.StoreScan` (its models, cost samples and session ends, read in one pass)."""
    from strata_lab.caches.call_ids import as_ids
    from strata_lab.caches.strata import for_calls
    from strata_lab.replayer.core import resolve_options
    from strata_lab.replayer.costs import usable_fit
    from strata_lab.replayer.native import replay_store

    store, models = scan.store, scan.models
    preset = for_calls(preset, [Call(0, "", as_ids([]), record={"model": m, "checkpoints": []}) for m in models])
    for m in models:
        tokenizer.check_model(m)
    opts = resolve_options(model=preset.kind, checkpoint_policy=preset.checkpoints, full_hit=preset.full_hit,
                           context_chars=context_chars)
    poor_fit = None
    if cost_model is None:   # as the call-by-call replay: a fit too poor to price seconds prices tokens only
        cost_model, poor_fit = usable_fit(scan.cost_model)
    if cluster is not None:
        from strata_lab.replayer.distributed import replay_on_cluster

        table = replay_on_cluster(store, opts, tokenizer, cost_model, cluster=cluster, progress=progress,
                                  spec=preset.spec())
    else:
        table = replay_store(store, opts, tokenizer, cost_model, spec=preset.spec(), progress=progress,
                             ends=scan.ends)
    return ReplayReport.from_table(_arrival_order(table), [preset], {preset.spec(): 0}, cost_model, policy=pol.name,
                                   poor_fit=poor_fit)


def replay_engines(dump, engines=("vllm", "sglang", "llama.cpp", "strata"), *, tokenizer=None, cost_model=None,
                   prices: dict | None = None, progress: bool = False, concurrency: bool = False,
                   tokens_per_s=None, policy="recorded", context_chars: int = 40, cluster=None) -> "ReplayReport":
    """Replay `dump` (a path, paths, `Dump`, a Parquet store, a Mooncake/Bailian trace, or a list of `Call`)
    under each engine.

    `engines`: specs ("vllm", "vllm@0.33:block_size=32", "llama.cpp:slots=4", "strata:checkpoints=turn") or
    presets.
    `tokenizer` (a Tokenizer or "qwen3"): names each divergence's cause; None: "diverged".
    `cost_model`: prices reads in seconds (default: fitted to the dump's prefill_ms, else none).
    `prices`: per-engine price overrides, e.g. {"anthropic": {"input_usd_per_mtok": 15.0}}.
    `concurrency`: calls arrive at their timestamps and stay in flight for a modelled duration (prefill of
    what they read + decode of their output: `tokens_per_s`, a number or (prefill, decode), else the cost
    model for prefill and each call's recorded decode_ms); the blocks a call in flight holds are pinned, and
    what it leaves is cached when it ends (vLLM pins blocks, SGLang and TRT-LLM lock their path; models
    with no in-flight state of their own, llama.cpp slots, hosted APIs and strata, apply a call when it
    ends). False (default): one call at a time, each done before the next.
    TTLs (hosted APIs) always run on the trace's clock.
    `policy`: a counterfactual policy ("recorded", "reply-ids", "keep-drained", "fixes"; a checkpoint part
    such as "every:256" or "header" sets the `strata` engines' checkpoints): prompt policies transform the
    call stream, so they apply to every engine.
    `progress`: a progress bar per engine.
    `context_chars`: characters of text kept around each divergence (the report's context columns).
    `cluster`: replay a store on Dask (a `distributed.Client`, a scheduler address, or "local[:N]"), one task
    per cache domain (replica); our engine (`strata`) on a store of our own lines only.

    Our engine alone on a store of our own lines (and a tokenizer to name the causes) replays on the C++ replay
    core (`strata_lab.replayer.native`), in-process or on Dask: the same rows as the call-by-call replay.
    """
    from strata_lab.replayer.policies import Policy, parse_policy

    if cluster is not None:  # its form, before any work
        from strata_lab.replayer.distributed import local_workers

        local_workers(cluster)

    if isinstance(engines, str):
        engines = [engines]
    presets = [parse_engine(e) for e in engines]
    if not presets:
        raise ValueError("engines must name at least one engine")
    for name, kw in (prices or {}).items():
        if not isinstance(kw, dict):
            raise ValueError(f"prices[{name!r}] must be a dict of price fields")
        presets = [p.with_(**kw) if p.engine == name else p for p in presets]
    pol = parse_policy(policy) if isinstance(policy, str) else policy
    if not isinstance(pol, Policy):
        raise TypeError(f"policy must be a Policy or a spec string, got {type(policy).__name__}")
    if pol.checkpoint_policy is not None:
        if not any(p.engine == "strata" for p in presets):
            raise ValueError(f"policy {pol.name!r}: a checkpoint policy applies to the strata engine; add it "
                             "(engine strata)")
        cp = checkpoint_spec(pol.checkpoint_policy)
        presets = [p.with_(checkpoints=cp) if p.engine == "strata" else p for p in presets]
    if isinstance(tokenizer, str):
        from strata_lab.text.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(tokenizer)
    from strata_lab.replayer.fast import StoreScan, scan_store

    store = _as_store(dump)
    scan = dump if isinstance(dump, StoreScan) else scan_store(store) if store is not None else None
    core = (scan is not None and tokenizer is not None and len(presets) == 1 and presets[0].engine == "strata"
            and presets[0].replicas == 1 and not concurrency and tokens_per_s is None and not pol.changes_prompts)
    if core:
        from strata_lab.replayer.native import native_available

        core = native_available()
    if cluster is not None and not core:
        raise ValueError("cluster: Dask replays our engine alone (engine strata, one replica) on a store of our "
                         "own lines (strata-lab convert dump.jsonl --out DIR), with a tokenizer and no prompt "
                         "policy or concurrency")
    if core:
        return _core_replay(scan, presets[0], pol, tokenizer, cost_model, progress=progress,
                            context_chars=context_chars, cluster=cluster)
    calls = calls_from_dump(store if store is not None else dump)
    from strata_lab.caches.strata import for_calls

    presets = [for_calls(p, calls) if p.engine == "strata" else p for p in presets]   # what the spec leaves unsaid
    if tokenizer is not None:  # the causes decode the ids: they must be this vocabulary's (ids rendered here from
        # a log's messages are the rendering tokenizer's whatever model the log names)
        for model in {c.record.get("model") for c in calls if c.record is not None
                      and c.record.get("fidelity") not in ("messages", "lengths")}:
            tokenizer.check_model(model)
    if pol.changes_prompts:
        calls = _apply_policy(calls, pol, tokenizer)
    poor_fit = None
    if cost_model is None:   # a fit too poor to price seconds (R^2 < MIN_R2) prices tokens only, and says so
        from strata_lab.replayer.costs import usable_fit

        cost_model, poor_fit = usable_fit(_fit_cost(calls))
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
    views = explain_calls(calls, tokenizer, order, context_chars=context_chars)
    cols: dict[str, list] = {k: [] for k in _DTYPES}
    evictions = {}
    for preset in presets:
        models = [preset.build() for _ in range(preset.replicas)]
        router = Router(preset)
        where: dict[str, int] = {}
        it = progress_bar(order, enabled=progress, desc=f"replay {preset.spec()}", unit="call")
        spec = preset.spec()
        flight: list = []   # (end, seq, replica, call, plan): calls in flight (concurrency)
        for i in it:
            c = calls[i]
            hint, turn, e = views[i]
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
            cause, reread, div_rr, eng_rr = attribute(e, reused=reused, engine_cause=plan.cause, exact=hint.exact,
                                                      prompt_len=c.prompt_len, moved=moved,
                                                      refused=plan.cause == "refused")
            read = c.prompt_len - reused
            dollars = preset.dollars(c.prompt_len, len(c.output), reused, plan.written) \
                if hasattr(preset, "dollars") else math.nan
            # the serving engine's report sits beside every simulated engine (Contract 4), as a share of the
            # prompt tokens the log reports (a Claude Code log's prompt holds a system prompt it never shows)
            diff = reused - c.reported if c.reported is not None else None
            base = reported_base(c.prompt_len, c.reported, c.reported_prompt)
            pct = 100.0 * diff / base if diff is not None and base else math.nan
            d = e.div
            for k, v in (("engine", preset.engine), ("spec", spec), ("replica", r), ("index", c.index),
                         ("turn", turn), ("session", c.session), ("request_id", c.request_id),
                         ("ts", c.ts if c.ts is not None else math.nan), ("prompt_len", c.prompt_len),
                         ("held_before", e.held), ("lcp_ids", e.lcp_ids), ("lcp_text", e.lcp_text),
                         ("exact", hint.exact), ("reused", reused), ("read", read), ("reread", reread),
                         ("cause", cause), ("divergence", e.divergence), ("divergence_reread", div_rr),
                         ("engine_reread", eng_rr), ("unit", plan.unit), ("source", plan.source),
                         ("written", plan.written),
                         ("prefill_s", cost_model.seconds(read, reused) if cost_model else math.nan),
                         ("reread_s", cost_model.seconds(reread, reused) if cost_model else math.nan),
                         ("dollars", dollars), ("reported", c.reported), ("reported_by", c.reported_by),
                         ("reported_diff", diff), ("reported_diff_pct", pct), ("reported_write", c.reported_write),
                         ("reported_prompt", c.reported_prompt),
                         ("reported_agrees", reported_agrees(reused, c.reported, base)),
                         ("id_context_held", d.id_context_held if d is not None else ""),
                         ("id_context_prompt", d.id_context_prompt if d is not None else ""),
                         ("text_context_held", d.text_context_held if d is not None else ""),
                         ("text_context_prompt", d.text_context_prompt if d is not None else "")):
                cols[k].append(v)
        while flight:
            end, _, fr, fc, fp = heapq.heappop(flight)
            models[fr].advance(end)
            models[fr].finish(fc, fp)
        evictions[spec] = sum(m.evictions for m in models)
    return ReplayReport(cols, presets, evictions, cost_model, policy=pol.name, poor_fit=poor_fit)


def default_engine(calls: list[Call]) -> str:
    """The engine a trace names: the one engine every reported figure comes from when it is one we model
    (our dumps: `strata`, with the checkpoints each line recorded; a vLLM log that says so: `vllm`); a trace
    that names none replays under our engine, `strata`, as `--engine strata` does: the replay takes the kind
    the dump's `model` names and, for a log of another server (no state snapshots of ours), the turn-start
    checkpoints (`caches.strata.for_calls`)."""
    from strata_lab.caches.presets import ENGINES

    by = {c.reported_by for c in calls if c.reported_by is not None}
    if len(by) == 1:
        name = next(iter(by))
        if name in ENGINES:
            return name
    return "strata"


def replay(dump, engine=None, *, tokenizer="qwen3", policy="recorded", cost_model=None, progress: bool = False,
           context_chars: int = 40, **kwargs) -> "ReplayReport":
    """`strata_lab.replay`: replay a dump (path, paths, `Dump`, store, trace or `Call`s) under an engine's cache;
    always a `ReplayReport`.

    Args:
        dump: a dump path, paths, `Dump`, a Parquet store, a hash trace or a list of `Call`.
        engine: an engine spec ("strata", "vllm", "llama.cpp:slots=4", "strata:kind=attention,checkpoints=turn")
            or a list of them; None: the engine the dump names (`default_engine`; our dumps: `strata` with the
            checkpoints each line recorded).
        tokenizer: a Tokenizer or a name; names each miss's cause (None: "diverged").
        policy: the policy replayed ("recorded", "reply-ids", "keep-drained", "fixes", "every:256", "header", ...).
        cost_model: prices reads in seconds (default: fitted on the dump's prefill_ms).
        progress: show a progress bar.
        context_chars: characters of text shown around each divergence.
        **kwargs: overrides of the engine's preset (block_size=32, checkpoints="turn", ...); `prices`,
            `concurrency`, `tokens_per_s`, `cluster` as `replay_engines`.
    """
    own = {k: kwargs.pop(k) for k in ("prices", "concurrency", "tokens_per_s", "cluster") if k in kwargs}
    if "bytes_per_snapshot" in kwargs:
        raise TypeError("replay: bytes_per_snapshot= is not a setting of the replay (the strata engine sizes "
                        "snapshots by its kind)")
    if engine is None:
        from strata_lab.replayer.fast import scan_store

        store = _as_store(dump)
        scan = scan_store(store) if store is not None else None
        if scan is not None:   # our engine's own lines: engine strata (the scan goes on with them, read once)
            dump, engine = scan, ["strata"]
        else:
            calls = calls_from_dump(dump)
            dump, engine = calls, [default_engine(calls)]
    engines = [engine] if isinstance(engine, str) or not isinstance(engine, (list, tuple)) else list(engine)
    if kwargs:
        if len(engines) != 1:
            raise ValueError(f"overrides {sorted(kwargs)} apply to one engine; got {len(engines)}")
        engines = [parse_engine(engines[0]).with_(**kwargs)]
    return replay_engines(dump, engines, tokenizer=tokenizer, cost_model=cost_model, progress=progress,
                          policy=policy, context_chars=context_chars, **own)
