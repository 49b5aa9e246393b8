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

__all__ = ["sweep_budget", "compare_engines", "plot_budget_sweep", "plot_engines", "BUDGET_FIELD"]

# the field that sizes each engine's cache in tokens (llama.cpp: slots; hosted APIs: time to live)
BUDGET_FIELD = {"vllm": "kv_tokens", "sglang": "max_total_tokens", "trtllm": "kv_tokens", "llama.cpp": "slots",
                "openai": "ttl_s", "anthropic": "ttl_s"}


def sweep_budget(dump, engines=("vllm", "sglang"), budgets=(), *, field: str | None = None, progress=False,
                 **kw):
    """Replay under each engine at each budget (tokens, unless `field` says otherwise); one row per
    (engine, budget): hit rate, reused, re-read ids and seconds, evictions."""
    import pandas as pd

    from strata_lab.caches.calls import calls_from_dump

    calls = calls_from_dump(dump)
    if not budgets:
        raise ValueError("budgets must list at least one cache size")
    rows = []
    it = [(e, b) for e in engines for b in budgets]
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(it, desc="budget sweep", unit="replay")
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


def compare_engines(dump, engines=("strata", "vllm", "sglang", "llama.cpp", "trtllm", "openai", "anthropic"), **kw):
    """Engine against engine on the same trace: `replay_engines(...).summary()`."""
    return replay_engines(dump, engines, **kw).summary()


def plot_budget_sweep(frame, path=None, *, ax=None):
    """Hit rate (left) and re-read ids (right) against the budget, one line per engine."""
    import matplotlib

    if path is not None and ax is None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, axes = (None, ax) if ax is not None else plt.subplots(1, 2, figsize=(10, 3.6))
    axes = list(axes) if not hasattr(axes, "plot") else [axes]
    for eng, g in frame.groupby("engine", sort=False):
        axes[0].plot(g["budget"], 100 * g["hit_rate"], marker="o", label=eng)
        if len(axes) > 1:
            axes[1].plot(g["budget"], g["reread"], marker="o", label=eng)
    axes[0].set_xlabel(f"cache budget ({frame['field'].iloc[0]})")
    axes[0].set_ylabel("hit rate (%)")
    axes[0].set_xscale("log")
    axes[0].legend()
    if len(axes) > 1:
        axes[1].set_xlabel(f"cache budget ({frame['field'].iloc[0]})")
        axes[1].set_ylabel("ids re-read")
        axes[1].set_xscale("log")
    if fig is not None:
        fig.tight_layout()
        if path is not None:
            fig.savefig(path, dpi=110)
            plt.close(fig)
    return fig


def plot_engines(report, path=None):
    """Per call: reused ids per engine (grouped bars) and, where the log reports them, the cached tokens the
    serving engine reported (red x); right: each engine's hit rate, and its simulated vs the reported rate
    over the calls with a report (Contract 4)."""
    import matplotlib

    if path is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    import numpy as np

    df = report.frame()
    summ = report.summary()
    specs = list(summ["spec"])
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 3.8), gridspec_kw={"width_ratios": [3, 1]})
    idx = sorted(df["index"].unique())
    w = 0.8 / max(len(specs), 1)
    for k, spec in enumerate(specs):
        g = df[df["spec"] == spec].set_index("index").reindex(idx)
        a.bar(np.arange(len(idx)) + k * w, g["reused"], width=w, label=spec)
    a.plot(np.arange(len(idx)) + 0.4 - w / 2, df[df["spec"] == specs[0]].set_index("index").reindex(idx)["prompt_len"],
           "k_", markersize=12, label="prompt")
    first = df[df["spec"] == specs[0]].set_index("index").reindex(idx)
    if first["reported"].notna().any():
        a.plot(np.arange(len(idx)) + 0.4 - w / 2, first["reported"].astype("float64"), "rx", markersize=7,
               label="reported")
    a.set_xlabel("call")
    a.set_ylabel("reused ids")
    a.legend(fontsize=7)
    b.barh(specs, 100 * summ["hit_rate"], label="simulated, all calls")
    if (summ["reported_calls"] > 0).any():
        y = np.arange(len(specs))
        b.plot(100 * summ["simulated_rate"], y, "ko", markersize=5, label="simulated, reported calls")
        b.plot(100 * summ["reported_rate"], y, "rx", markersize=7, label="reported")
        b.legend(fontsize=6)
    b.set_xlabel("hit rate (%)")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
        plt.close(fig)
    return fig
