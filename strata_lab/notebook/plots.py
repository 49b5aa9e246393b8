"""Matplotlib views of a replay frame (`ReplayReport.frame()`) and a policy table (`caches.sweeps.compare_policies`).

matplotlib is imported when a function runs, never at import time. Each function takes an optional
`ax` and returns it. Figures follow the house style (`strata_lab.caches.plotstyle`: both JupyterLab themes,
legends outside the data, integer call ticks); the causes panel ranks causes by the tokens they cost.

>>> import pandas as pd
>>> ax = plot_causes(pd.DataFrame({"cause": ["none", "retokenized_reply", "none"]}))
>>> [t.get_text() for t in ax.get_yticklabels()]
['none', 'retokenized_reply']
"""
from __future__ import annotations

from strata_lab.caches.plotstyle import house_style, integer_ticks, legend_outside, save

__all__ = ["plot_reuse", "plot_wasted", "plot_causes", "plot_policies", "plot_report"]


def _axes(ax):
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(8, 3.5), layout="constrained")[1]


def stacked_reuse(ax, frame, labels=None):
    """Stacked bars, one per row of `frame` (columns reused, read, reread): reused, reread, read (new)."""
    x = range(len(frame))
    reused = frame["reused"].to_numpy()
    reread = frame["reread"].to_numpy()
    fresh = frame["read"].to_numpy() - reread
    width = 0.85 if len(frame) <= 60 else 1.0  # many calls: bars touch, so no white stripes
    ax.bar(x, reused, label="reused", color="#4c9a2a", width=width)
    ax.bar(x, reread, bottom=reused, label="reread", color="#d1495b", width=width)
    ax.bar(x, fresh, bottom=reused + reread, label="read (new)", color="#8da9c4", width=width)
    if labels is not None:
        ax.set_xticks(list(x), list(labels))
    return ax


def plot_reuse(frame, ax=None):
    """Stacked bars per call: reused, read (new), reread (read again although held)."""
    ax = _axes(ax)
    stacked_reuse(ax, frame)
    ax.set_xlabel("call")
    ax.set_ylabel("prompt tokens")
    ax.set_title("reuse per call")
    integer_ticks(ax)
    legend_outside(ax)
    house_style(ax.figure)
    return ax


def plot_wasted(frame, ax=None):
    """Cumulative seconds spent re-reading held tokens (or tokens, without a cost model)."""
    ax = _axes(ax)
    col = "reread_s" if frame["reread_s"].notna().any() else "reread"
    ax.plot(range(len(frame)), frame[col].fillna(0).cumsum().to_numpy(), color="#d1495b")
    ax.set_xlabel("call")
    ax.set_ylabel("wasted seconds" if col == "reread_s" else "reread tokens")
    ax.set_title("cumulative re-read cost" + ("" if col == "reread_s" else " (tokens: no usable cost model)"))
    integer_ticks(ax)
    house_style(ax.figure)
    return ax


def plot_causes(frame, ax=None):
    """Re-read tokens per cause (horizontal bars, the costliest first), each labelled with its call count;
    calls per cause when the frame has no `reread` column."""
    ax = _axes(ax)
    causes = frame["cause"].astype(str)
    counts = causes.value_counts()
    if "reread" in frame:
        tokens = frame.groupby(causes)["reread"].sum().reindex(counts.index).fillna(0)
        order = sorted(counts.index, key=lambda c: (-tokens[c], -counts[c], c))
        ax.barh(order, [tokens[c] for c in order], color="#2e4057")
        for i, cause in enumerate(order):
            ax.annotate(f"{counts[cause]} call{'s' if counts[cause] != 1 else ''}", (tokens[cause], i),
                        xytext=(3, 0), textcoords="offset points", va="center", fontsize="small")
        ax.set_xlabel("re-read tokens")
    else:
        ax.barh(counts.index.tolist(), counts.to_numpy(), color="#2e4057")
        ax.set_xlabel("calls")
        integer_ticks(ax)
    ax.invert_yaxis()
    ax.set_title("causes")
    house_style(ax.figure)
    return ax


def plot_policies(table, ax=None):
    """Reread tokens (bars) per policy, with the hit rate in each label."""
    ax = _axes(ax)
    labels = [f"{p}\n{h:.0%} hit" for p, h in zip(table["policy"], table["hit_rate"])]
    ax.bar(labels, table["reread"].to_numpy(), color="#edae49")
    ax.set_ylabel("reread tokens")
    ax.set_title("policy comparison")
    ax.tick_params(axis="x", labelsize="small")
    house_style(ax.figure)
    return ax


def plot_report(frame, path=None, *, policies=None):
    """One figure with all views (the policy panel when `policies` is given); saved to `path` if set. Where
    the log reports cached tokens, the title gives the replay's agreement with them (Contract 4)."""
    import matplotlib

    if path is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    n = 4 if policies is not None else 3
    fig, axes = plt.subplots(n, 1, figsize=(9, 3.2 * n), layout="constrained")
    plot_reuse(frame, axes[0])
    plot_wasted(frame, axes[1])
    plot_causes(frame, axes[2])
    if policies is not None:
        plot_policies(policies, axes[3])
    if "reported_agrees" in frame and frame["reported"].notna().any():  # reported vs simulated (Contract 4)
        from strata_lab.caches.report import AGREE_POINTS, agreement

        fig.suptitle(f"agreement with the log's cached tokens (within {AGREE_POINTS:g} points of its prompt "
                     f"tokens): {agreement(frame)['agreement']}", fontsize="medium")
    house_style(fig)
    if path is not None:
        save(fig, path, dpi=100)
    return fig
