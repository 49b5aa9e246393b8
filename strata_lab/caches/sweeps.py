"""Sweeps and plots: hit rate and re-read seconds as the cache budget shrinks, and engine against engine.

>>> import os, tempfile
>>> from strata_lab.dump.writer import Recorder
>>> path = os.path.join(tempfile.mkdtemp(), "d.jsonl")
>>> with Recorder(path) as rec:
...     for s in range(3):
...         rec.write_call(session=f"s{s}", prompt_ids=list(range(s * 100, s * 100 + 64)), reused=0)
...     for s in range(3):
...         rec.write_call(session=f"s{s}", prompt_ids=list(range(s * 100, s * 100 + 70)), reused=64)
>>> df = sweep_budget(path, ["sglang"], [64, 128, 1024])
>>> df[["budget", "reused"]].values.tolist()   # LRU under a cyclic working set larger than the cache: 0
[[64, 0], [128, 0], [1024, 192]]
"""
from __future__ import annotations

from strata_lab.caches.presets import parse_engine
from strata_lab.caches.replay import replay_engines

__all__ = ["sweep_budget", "compare_engines", "compare_policies", "plot_budget_sweep", "plot_engines", "BUDGET_FIELD"]

# the field that sizes each engine's cache in tokens (llama.cpp: slots; hosted APIs: time to live)
BUDGET_FIELD = {"vllm": "kv_tokens", "sglang": "max_total_tokens", "trtllm": "kv_tokens", "llama.cpp": "slots",
                "openai": "ttl_s", "anthropic": "ttl_s"}


def sweep_budget(dump, engines=("vllm", "sglang"), budgets=(), *, field: str | None = None, progress=False,
                 **kw):
    """Replay under each engine at each budget (tokens, unless `field` says otherwise); one row per
    (engine, budget): hit rate, reused, re-read ids and seconds, evictions."""
    import pandas as pd

    from strata_lab.caches.call_ids import calls_from_dump

    calls = calls_from_dump(dump)
    if not budgets:
        raise ValueError("budgets must list at least one cache size")
    rows = []
    from strata_lab.progress import progress_bar

    it = progress_bar([(e, b) for e in engines for b in budgets], enabled=progress, desc="budget sweep",
                      unit="replay")
    for e, b in it:
        p = parse_engine(e)
        f = field or BUDGET_FIELD.get(p.engine)
        if f is None:
            raise ValueError(f"field: {p.engine} has no cache budget to sweep")
        s = replay_engines(calls, [p.with_(**{f: b})], **kw).summary().iloc[0]
        rows.append({"engine": p.engine, "spec": p.spec(), "budget": b, "field": f, "hit_rate": s["hit_rate"],
                     "reused": int(s["reused"]), "reread": int(s["reread"]), "reread_s": s["reread_s"],
                     "evictions": int(s["evictions"])})
    return pd.DataFrame(rows)


def compare_engines(dump, engines=None, **kw):
    """Engine against engine on the same trace: `replay_engines(...).summary()`; `engines` None: every engine
    modelled (`caches.presets.ENGINES`), ours first."""
    if engines is None:
        from strata_lab.caches.presets import ENGINES

        engines = ["strata"] + [e for e in ENGINES if e != "strata"]
    return replay_engines(dump, engines, **kw).summary()


def compare_policies(dump, policies=("recorded", "keep-drained", "every:256"), engine="strata", *,
                     tokenizer="qwen3", cost_model=None, **overrides):
    """The same dump replayed (`strata_lab.replay`) under each policy on one engine; one row per policy (a
    pandas DataFrame): the engine's spec, calls, prompt tokens, reused, read, reread, hit rate, prefill and
    reread seconds (the report's totals, Contract 3).

    Args:
        dump: a dump path, paths, `Dump`, a Parquet store, or a list of `Call`.
        policies: the policies replayed ("recorded", "reply-ids", "keep-drained", "fixes", "every:256", "header").
        engine: the engine spec (default our engine, `strata`); a policy's checkpoint part sets a strata
            engine's checkpoints.
        tokenizer: a Tokenizer or a name; names each miss's cause and rebuilds the prompts a policy changes.
        cost_model: prices reads in seconds; None fits one, once, on the recorded calls, shared by every policy.
        **overrides: the engine preset's settings (`kind="attention"`, `checkpoints="turn"`).
    """
    import pandas as pd

    from strata_lab.caches.call_ids import calls_from_dump
    from strata_lab.caches.replay import _as_store, _fit_cost, replay
    from strata_lab.replayer.costs import usable_fit

    policies = list(policies)
    if not policies:
        raise ValueError("policies must name at least one policy")
    if isinstance(tokenizer, str):
        from strata_lab.text.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(tokenizer)
    store = _as_store(dump)
    source = store if store is not None else calls_from_dump(dump)
    if cost_model is None:
        if store is not None:
            from strata_lab.replayer.fast import fit_cost_store

            cost_model = usable_fit(fit_cost_store(store))[0]
        else:
            cost_model = usable_fit(_fit_cost(source))[0]
    rows = []
    for p in policies:
        t = replay(source, engine, policy=p, tokenizer=tokenizer, cost_model=cost_model, **overrides).totals()
        rows.append({"policy": t["policy"], "spec": t["spec"], "calls": t["calls"], "prompt_tokens": t["prompt_tokens"],
                     "reused": t["reused"], "read": t["read"], "reread": t["reread"], "hit_rate": t["hit_rate"],
                     "prefill_s": t["prefill_s"], "reread_s": t["reread_s"]})
    return pd.DataFrame(rows)


def plot_budget_sweep(frame, path=None, *, ax=None):
    """Hit rate (left) and re-read ids (right) against the budget, one line per engine."""
    import matplotlib

    if path is not None and ax is None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, axes = (None, ax) if ax is not None else plt.subplots(1, 2, figsize=(11, 3.6), layout="constrained")
    axes = list(axes) if not hasattr(axes, "plot") else [axes]
    from strata_lab.caches.plotstyle import house_style, legend_outside, readable_log_axis, save

    for eng, g in frame.groupby("engine", sort=False):
        axes[0].plot(g["budget"], 100 * g["hit_rate"], marker="o", label=eng)
        if len(axes) > 1:
            axes[1].plot(g["budget"], g["reread"], marker="o", label=eng)
    axes[0].set_xlabel(f"cache budget ({frame['field'].iloc[0]})")
    axes[0].set_ylabel("hit rate (%)")
    readable_log_axis(axes[0], frame["budget"])
    if len(axes) > 1:
        axes[1].set_xlabel(f"cache budget ({frame['field'].iloc[0]})")
        axes[1].set_ylabel("ids re-read")
        readable_log_axis(axes[1], frame["budget"])
    legend_outside(axes[-1])
    house_style(axes[0].figure)
    if fig is not None and path is not None:
        save(fig, path, dpi=110)
    return fig


def plot_engines(report, path=None):
    """Per call: reused ids per engine (grouped bars) and, where the log reports them, the cached tokens the
    serving engine reported (red x); right: each engine's hit rate, and its simulated vs the reported rate
    over the calls with a report (Contract 4); the title: each engine's agreement with the log (calls whose
    simulated cached tokens are within `AGREE_POINTS` points of the reported ones)."""
    import matplotlib

    if path is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    import numpy as np

    from strata_lab.caches.plotstyle import INK, house_style, integer_ticks, save

    df = report.frame()
    summ = report.summary()
    specs = list(summ["spec"])
    labels = [_short_spec(s) for s in specs]
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 3.8), gridspec_kw={"width_ratios": [4, 1]}, layout="constrained")
    idx = sorted(df["index"].unique())
    w = 0.8 / max(len(specs), 1)
    for k, (spec, label) in enumerate(zip(specs, labels)):
        g = df[df["spec"] == spec].set_index("index").reindex(idx)
        a.bar(np.arange(len(idx)) + k * w, g["reused"], width=w, label=label)
    a.plot(np.arange(len(idx)) + 0.4 - w / 2, df[df["spec"] == specs[0]].set_index("index").reindex(idx)["prompt_len"],
           "_", color=INK, markersize=12, label="prompt")
    first = df[df["spec"] == specs[0]].set_index("index").reindex(idx)
    if first["reported"].notna().any():
        a.plot(np.arange(len(idx)) + 0.4 - w / 2, first["reported"].astype("float64"), "x", color="tab:red",
               markersize=7, label="reported")
    a.set_xlabel("call")
    a.set_ylabel("reused ids")
    integer_ticks(a)
    # above the bars, never over them
    a.legend(loc="lower left", bbox_to_anchor=(0.0, 1.02), ncols=min(len(specs) + 2, 4), frameon=False,
             fontsize="small", borderaxespad=0.0)
    b.barh(labels, 100 * summ["hit_rate"], label="simulated, all calls")
    if (summ["reported_calls"] > 0).any():
        y = np.arange(len(specs))
        b.plot(100 * summ["simulated_rate"], y, "o", color=INK, markersize=5, label="simulated, reported calls")
        b.plot(100 * summ["reported_rate"], y, "x", color="tab:red", markersize=7, label="reported")
        b.legend(loc="lower left", bbox_to_anchor=(0.0, 1.02), frameon=False, fontsize="x-small",
                 borderaxespad=0.0)
    b.invert_yaxis()
    b.set_xlabel("hit rate (%)")
    if (summ["reported_calls"] > 0).any():  # per engine: calls whose simulated cached tokens agree with the log
        from strata_lab.caches.report import AGREE_POINTS

        fig.suptitle(f"agreement with the log (within {AGREE_POINTS:g} points): " + "; ".join(
            f"{spec.split(':')[0]} {words}" for spec, words in zip(specs, summ["agreement"])), fontsize="medium")
    b.tick_params(axis="y", labelsize="small")
    house_style(fig)
    if path is not None:
        save(fig, path, dpi=110)
    return fig


def _short_spec(spec: str, width: int = 18) -> str:
    """A spec label that fits beside a bar: the name on one line, each override on its own.

    >>> print(_short_spec("vllm@0.11:block_size=32,kv_blocks=8774"))
    vllm@0.11
    block_size=32
    kv_blocks=8774
    """
    name, _, over = spec.partition(":")
    parts = [name] + [p for p in over.split(",") if p]
    return "\n".join(p if len(p) <= width else p[:width - 1] + "…" for p in parts)
