"""The replay report: per-call rows (CallRow) and totals, as a mapping, frames and text.

>>> from strata_lab.replayer import replay
>>> r = replay("dumps/agent.jsonl", model="attention")   # doctest: +SKIP
>>> r["reread"], r.summary()                          # doctest: +SKIP
"""
from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Mapping

from strata_lab.replayer.costs import MIN_R2, CostModel
from strata_lab.replayer.policies import Policy
from strata_lab.replayer.rowtable import RowTable
from strata_lab.replayer.step import CallRow

__all__ = ["Report"]


def _fmt_s(x: float) -> str:
    if x != x:
        return "n/a"
    return f"{x:.0f} s" if abs(x) >= 100 else f"{x:.3g} s"


class Report(Mapping):
    """The replay of one dump under one policy. A read-only mapping of totals, plus per-call rows.

    `report["reread"]`, `report["causes"]`..., `report.rows` (one CallRow per call), `report.to_frame()`,
    `report.sessions_frame()`, `report.summary()`, `report.worst(n)`, `report.format()`.
    """

    def __init__(self, rows, *, policy: Policy, model: str, cost_model: CostModel | None,
                 snapshot_bytes: int, recorded_prefill_s: float | None, poor_fit: CostModel | None = None,
                 checkpoints: str | None = None):
        # rows: CallRows (any iterable) or a RowTable; kept column-wise (strata_lab.replayer.rowtable)
        self.rows = rows if isinstance(rows, RowTable) else RowTable(rows)
        self.policy = policy
        self.model = model
        self.cost_model = cost_model
        self.poor_fit = poor_fit   # a fitted cost model set aside as too poor to price seconds (see MIN_R2)
        self.checkpoints = checkpoints   # the checkpoint policy replayed, in words (None: not given)
        self.snapshot_bytes = snapshot_bytes
        self._totals = self._compute_totals(recorded_prefill_s)

    def _compute_totals(self, recorded_prefill_s):
        # a chunk of rows at a time, in Arrow compute (bounded memory and no Python object per call)
        import pyarrow as pa
        import pyarrow.compute as pc

        prompt = reused = reread = mismatches = compared = 0
        prefill_s = reread_s = 0.0
        sessions: set = set()
        causes: Counter = Counter()

        def total(col):
            v = pc.sum(col).as_py()
            return v if v is not None else 0

        for b in self.rows.iter_batches():
            prompt += total(b.column("prompt_len"))
            reused += total(b.column("reused"))
            reread += total(b.column("reread"))
            prefill_s += float(total(b.column("prefill_s")))
            reread_s += float(total(b.column("reread_s")))
            rec = b.column("recorded_reused")
            known = pc.is_valid(rec)
            compared += total(pc.cast(known, pa.int64()))
            mismatches += total(pc.cast(pc.fill_null(pc.not_equal(rec, b.column("reused")), False), pa.int64()))
            sessions.update(pc.unique(b.column("session")).to_pylist())
            vc = pc.value_counts(b.column("cause").cast(pa.string()))
            causes.update(dict(zip(vc.field("values").to_pylist(), vc.field("counts").to_pylist())))
        predicted_s = prefill_s if self.cost_model else math.nan
        return {
            "policy": self.policy.name,
            "model": self.model,
            "sessions": len(sessions),
            "calls": len(self.rows),
            "prompt_tokens": prompt,
            "reused": reused,
            "read": prompt - reused,
            "reread": reread,
            "hit_rate": reused / prompt if prompt else math.nan,
            "reread_s": reread_s if self.cost_model else math.nan,
            "prefill_s": recorded_prefill_s if recorded_prefill_s is not None else predicted_s,
            "predicted_prefill_s": predicted_s,
            "snapshot_mib": self.snapshot_bytes / 2**20,
            "causes": dict(causes),
            "mismatches": mismatches,
            "compared": compared,
        }

    def __getitem__(self, key):
        return self._totals[key]

    def __iter__(self):
        return iter(self._totals)

    def __len__(self):
        return len(self._totals)

    def to_frame(self):
        """One row per engine call with typed columns (Contract 3)."""
        import pandas as pd

        table = self.rows.table()
        out = {}
        for col, dtype in CallRow.DTYPES.items():
            values = table.column(col).to_pylist()
            if dtype == "object":
                values = [tuple(v) for v in values]
            out[col] = pd.Series(values, dtype=dtype)
        return pd.DataFrame(out)

    def to_dask_frame(self, npartitions: int = 1):
        """The same rows as a dask.dataframe (for pipelines that continue on a cluster)."""
        import dask.dataframe as dd

        if not isinstance(npartitions, int) or isinstance(npartitions, bool) or npartitions < 1:
            raise ValueError(f"npartitions must be a positive int, got {npartitions!r}")
        return dd.from_pandas(self.to_frame(), npartitions=npartitions)

    def sessions_frame(self):
        """Per-session totals: calls, prompt tokens, reused, read, reread, reread seconds, causes."""
        import pandas as pd

        df = self.to_frame()
        if df.empty:
            return pd.DataFrame(columns=["session", "calls", "prompt_tokens", "reused", "read", "reread",
                                         "reread_s", "causes"])
        g = df.groupby("session", sort=False, observed=True)
        out = pd.DataFrame({
            "calls": g.size(),
            "prompt_tokens": g["prompt_len"].sum(),
            "reused": g["reused"].sum(),
            "read": g["read"].sum(),
            "reread": g["reread"].sum(),
            "reread_s": g["reread_s"].sum(min_count=1),
            "causes": g["cause"].agg(lambda s: ", ".join(f"{k} {v}" for k, v in Counter(s).most_common()
                                                         if k != "none")),
        }).reset_index()
        return out

    def summary(self) -> str:
        """One sentence: how much prefill time went to re-reading what the engine held."""
        t = self._totals
        if self.cost_model is None:
            pct = 100.0 * t["reread"] / t["prompt_tokens"] if t["prompt_tokens"] else math.nan
            why = ("no prefill timings to put seconds on it" if self.poor_fit is None else
                   f"the cost model fits the dump's prefill times too poorly to price seconds: R^2 "
                   f"{self.poor_fit.r2:.2f} on {self.poor_fit.points} calls, below {MIN_R2}; tokens only")
            return (f"{t['reread']} of {t['prompt_tokens']} prompt tokens ({pct:.0f}%) were re-read although the "
                    f"engine held them ({why})")
        total = t["prefill_s"]
        pct = 100.0 * t["reread_s"] / total if total else math.nan
        return (f"about {_fmt_s(t['reread_s'])} of {_fmt_s(total)} ({pct:.0f}%) went to re-reading "
                f"what the engine held")

    def worst(self, n: int = 5) -> list[CallRow]:
        """The n calls that re-read the most held tokens (ties: the larger miss, then the earlier call)."""
        def candidates():
            i = 0
            for reread, cause, held, reused in self.rows.iter_columns(["reread", "cause", "held_before", "reused"]):
                for k in range(len(reread)):
                    if reread[k] > 0 or cause[k] not in ("none", "new_session"):
                        yield (-reread[k], -(held[k] - reused[k]), i + k)
                i += len(reread)

        return [self.rows[i] for _a, _b, i in heapq.nsmallest(n, candidates())]

    def format(self, *, worst: int = 5) -> str:
        """The text the CLI prints: per-session table, totals, causes, worst divergences."""
        t = self._totals
        lines = [f"replay: policy {t['policy']}, model {t['model']}"
                 + (f", checkpoints {self.checkpoints}" if self.checkpoints else "")
                 + f", {t['sessions']} sessions, {t['calls']} calls"]
        if self.cost_model is not None:
            lines.append("cost model: " + self.cost_model.describe())
        sf = self.sessions_frame()
        if len(sf):
            lines.append("")
            lines.append(sf.to_string(index=False, float_format=lambda x: f"{x:.3g}"))
        lines.append("")
        lines.append(f"total: {t['calls']} calls, {t['prompt_tokens']} prompt tokens, {t['reused']} reused, "
                     f"{t['read']} read, {t['reread']} reread ({_fmt_s(t['reread_s'])}), hit rate "
                     f"{t['hit_rate']:.1%}")
        lines.append("causes: " + ", ".join(f"{k} {v}" for k, v in Counter(t["causes"]).most_common()))
        if t["compared"]:
            lines.append(f"recorded vs predicted reused: {t['compared'] - t['mismatches']}/{t['compared']} agree")
        lines.append(self.summary())
        bad = self.worst(worst)
        if bad:
            lines.append("")
            lines.append(f"worst divergences (top {len(bad)} by reread):")
            for r in bad:
                lines.append(f"- session {r['session']} turn {r['turn']}: {r['cause']}, reused {r['reused']} "
                             f"of held {r['held_before']}, lcp_ids {r['lcp_ids']}, lcp_text {r['lcp_text']}, "
                             f"reread {r['reread']}")
                for key in ("id_context_held", "id_context_prompt"):
                    if r[key]:
                        lines.append(f"    ids  {r[key]}")
                if r.held_ids_at:
                    lines.append(f"    ids  held {list(r['held_ids_at'])} vs prompt {list(r['prompt_ids_at'])}")
                for key in ("text_context_held", "text_context_prompt"):
                    if r[key]:
                        lines.append(f"    text {r[key]}")
        return "\n".join(lines)

    def __repr__(self):
        t = self._totals
        return (f"Report(policy={t['policy']!r}, calls={t['calls']}, reused={t['reused']}, read={t['read']}, "
                f"reread={t['reread']})")
