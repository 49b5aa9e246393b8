"""`strata-lab demo`: one agent session served twice (reply-id reuse off, then on), replayed and compared.

1. records the scripted agent session (`strata_lab.sessions.agents`) against `strata-lab serve` on the embedded tiny
   model, once with reply-id reuse off and once on, each into its own dump;
2. replays both (the state model must agree with what the engine reported);
3. prints reused, read, reread and seconds for both runs;
4. writes a PNG: reuse per call for each run, and the totals side by side.
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

__all__ = ["run_demo"]


def _plot(frames: dict, table, path) -> None:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    from strata_lab.caches.plotstyle import legend_outside, save
    from strata_lab.notebook.plots import plot_reuse, stacked_reuse

    fig, axes = plt.subplots(1, len(frames) + 1, figsize=(5 * (len(frames) + 1), 3.6), layout="constrained")
    for ax, (name, frame) in zip(axes, frames.items()):
        plot_reuse(frame, ax)
        ax.set_title(f"reuse per call: {name}")
    ax = axes[-1]
    stacked_reuse(ax, table, labels=table["run"])
    ax.set_ylabel("prompt tokens")
    ax.set_title("session totals")
    for a in axes[:-1]:
        a.get_legend().remove()   # one legend for the three panels, outside the data
    legend_outside(ax)
    save(fig, path, dpi=90)


def run_demo(png="strata-demo.png", *, out_dir=None, model="hybrid", turns: int = 4, max_tokens: int = 24,
             seed: int = 0, quiet: bool = False, progress: bool | None = None):
    """Run the demo; returns the comparison (a pandas DataFrame, one row per run). Dumps go to `out_dir`
    (a new temp dir by default), the plot to `png`. `quiet`: print nothing; `progress`: a bar on stderr per
    recording, stepped per request (default: when not quiet)."""
    import pandas as pd

    from strata_lab.caches.replay import replay
    from strata_lab.dump.reader import load_dump
    from strata_lab.sessions.runs import model_kind, record

    say = (lambda *a: None) if quiet else print
    out_dir = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix="strata-demo-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    rows, frames = [], {}
    for reuse in (False, True):
        name = f"reply-id reuse {'on' if reuse else 'off'}"
        path = out_dir / f"agent-reuse-{'on' if reuse else 'off'}.jsonl"
        if path.exists():
            path.unlink()
        say(f"recording the agent session, {name} ...", flush=True)
        t0 = time.perf_counter()
        rec = record("agent", path, model=model, reply_id_reuse=reuse, turns=turns, max_tokens=max_tokens,
                     seed=seed, progress=not quiet if progress is None else progress)
        wall = time.perf_counter() - t0
        records = load_dump(path).records()
        kind = model_kind(records)
        report = replay(path, "strata", kind=kind, checkpoints="recorded")
        if report["calls_differ"]:
            raise RuntimeError(f"{path}: the replay disagrees with the engine on {report['calls_differ']} calls")
        frames[name] = report.frame()
        # the prefill seconds the engine spent, as recorded (the report's prefill_s is the cost model's)
        prefill_ms = [r["timings"].get("prefill_ms") for r in records]
        rows.append({"run": name, "requests": rec.requests, "calls": report["calls"],
                     "prompt_tokens": report["prompt_tokens"], "reused": report["reused"], "read": report["read"],
                     "reread": report["reread"],
                     "prefill_s": sum(t for t in prefill_ms if isinstance(t, (int, float))) / 1000.0, "wall_s": wall,
                     "misses": ", ".join(f"{c} {n}" for c, n in sorted(report["causes"].items())
                                         if c not in ("none", "new_session")),
                     "dump": str(path)})
    table = pd.DataFrame(rows)
    _plot(frames, table, png)
    say("")
    say(table.drop(columns=["dump"]).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    off, on = rows
    say(f"\nreply-id reuse: {off['reread']} -> {on['reread']} tokens re-read, {off['read']} -> {on['read']} read "
        f"({kind} model, replay agrees with the engine on every call)")
    # the server without its header checkpoint
    turn_only = replay(on["dump"], "strata", kind=kind, checkpoints="turn")
    say(f"header checkpoint (before the generation prompt's <|im_start|>): {turn_only['reread']} -> {on['reread']} "
        f"tokens re-read, {turn_only['read']} -> {on['read']} read (reuse on; turn start only -> recorded)")
    say(f"dumps in {out_dir}; plot written to {png}")
    return table
