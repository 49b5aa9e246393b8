"""The one replay report (`ReplayReport`): per-call rows keyed by (engine, call) in an Arrow table, per-engine
totals, the headline, the worst divergences, text and deterministic JSON. Every column is defined once, in
docs/CONTRACTS.md (Contract 3; the reported columns: Contract 4). `strata_lab.caches.replay` builds it.

Why one module: the rows, the totals and every view of them (the terminal's summary and worst calls, the
JSON) read the one column definition; apart, each view would restate it.
"""
from __future__ import annotations

import heapq
import json
import math
from collections import Counter

import numpy as np

__all__ = ["ReplayReport", "COLUMNS", "AGREE_POINTS", "reported_base", "reported_agrees",
           "agreement"]

# a call's reported and simulated cached tokens agree when they are within this many points of its prompt
AGREE_POINTS = 5.0

_DTYPES = {
    "engine": "category", "spec": "category", "replica": "int64", "index": "int64", "turn": "int64",
    "session": "string", "request_id": "string", "ts": "float64", "prompt_len": "int64", "held_before": "int64",
    "lcp_ids": "int64", "lcp_text": "int64", "exact": "int64", "reused": "int64", "read": "int64",
    "reread": "int64", "cause": "category", "divergence": "category", "divergence_reread": "int64",
    "engine_reread": "int64", "unit": "string", "source": "Int64", "written": "int64", "prefill_s": "float64",
    "reread_s": "float64", "dollars": "float64", "reported": "Int64", "reported_by": "string",
    "reported_diff": "Int64", "reported_diff_pct": "float64", "reported_write": "Int64", "reported_prompt": "Int64",
    "reported_agrees": "boolean",
    "id_context_held": "string", "id_context_prompt": "string", "text_context_held": "string",
    "text_context_prompt": "string",
}
COLUMNS = tuple(_DTYPES)


def reported_base(prompt_len: int, reported: int | None, reported_prompt: int | None) -> int:
    """The prompt tokens a call's reported figures are a share of (Contract 4): the log's own count where it
    reports one (OpenAI ``prompt_tokens``; Anthropic input + cache read + cache creation, which counts the
    system prompt and tools a Claude Code log never shows), else the rendered prompt; never below the reported
    cached tokens (a log whose cached count passes its prompt count contradicts itself).

    >>> reported_base(100, 40, None), reported_base(100, 4000, 4100), reported_base(10, 30, 20)
    (100, 4100, 30)
    """
    base = reported_prompt if reported_prompt is not None else prompt_len
    return max(base, reported or 0)


def reported_agrees(reused: int, reported: int | None, base: int) -> bool | None:
    """Whether a call's simulated cached tokens agree with what the log reports: within `AGREE_POINTS` points
    of the reported prompt tokens (`reported_base`); None where the log reports nothing.

    >>> reported_agrees(960, 1000, 1000), reported_agrees(900, 1000, 1000), reported_agrees(5, None, 10)
    (True, False, None)
    """
    if reported is None:
        return None
    return abs(reused - reported) <= AGREE_POINTS / 100.0 * base if base else reused == reported


def agreement(frame) -> dict:
    """One engine's agreement with the log, from its rows of `ReplayReport.frame()`: `agree_calls` (calls whose
    simulated cached tokens are within `AGREE_POINTS` points of the reported prompt tokens of what the log
    reports), `reported_calls`, `agree_share` and `agreement` in words ("3/4 calls (75%)")."""
    rep = frame[frame["reported"].notna()]
    agree = int(rep["reported_agrees"].fillna(False).astype(bool).sum())
    share = agree / len(rep) if len(rep) else math.nan
    words = f"{agree}/{len(rep)} calls ({share:.0%})" if len(rep) else "no call reports its cached tokens"
    return {"agree_calls": agree, "reported_calls": len(rep), "agree_share": share, "agreement": words}


def _fmt_s(x: float) -> str:
    if x != x:
        return "n/a"
    return f"{x:.0f} s" if abs(x) >= 100 else f"{x:.3g} s"


class ReplayReport:
    """The one replay report: per-call rows keyed by (engine, call) in an Arrow table (`frame()`, `table`),
    per-engine totals (`summary()`, a DataFrame), the headline per engine (`headline()`), the worst
    divergences (`worst()`), text (`format()`) and a deterministic JSON report (`to_json()`). Columns are
    defined once, in docs/CONTRACTS.md (Contract 3). A one-engine report is also a mapping of that engine's
    totals: `report["reread"]`, `report["causes"]`.
    """

    def __init__(self, cols: dict, presets: list, evictions: dict, cost_model, policy: str = "recorded",
                 poor_fit=None):
        import pyarrow as pa

        kinds = {"string": pa.string(), "category": pa.string(), "int64": pa.int64(), "Int64": pa.int64(),
                 "float64": pa.float64(), "boolean": pa.bool_()}
        self.table = pa.table({k: pa.array(cols[k], type=kinds[d]) for k, d in _DTYPES.items()})
        self.presets = presets
        self.evictions = evictions
        self.cost_model = cost_model
        self.poor_fit = poor_fit   # the prefill-time fit rejected as too poor to price seconds (None: none rejected)
        self.policy = policy
        self._cols = None
        self._summary = None
        self.note = None   # a caveat the text report prints (how these rows were made)

    @classmethod
    def from_table(cls, table, presets: list, evictions: dict, cost_model, policy: str = "recorded",
                   poor_fit=None) -> "ReplayReport":
        """A report of rows already in columns (an Arrow table holding `COLUMNS`; None: no row), as the C++
        replay core writes them (`strata_lab.replayer.native`)."""
        rep = cls({k: [] for k in _DTYPES}, presets, evictions, cost_model, policy=policy, poor_fit=poor_fit)
        if table is not None:
            rep.table = table.select(list(COLUMNS)).cast(rep.table.schema)
        return rep

    # --- rows ------------------------------------------------------------------------------------------
    @property
    def cols(self) -> dict:
        """The columns as Python lists (column name -> values, one per (engine, call) row)."""
        if self._cols is None:
            self._cols = {k: self.table.column(k).to_pylist() for k in COLUMNS}
        return self._cols

    @property
    def rows(self) -> list[dict]:
        """One dict per (engine, call) row."""
        return self.table.to_pylist()

    def frame(self):
        """One row per (engine, call), typed columns (Contract 3)."""
        import pandas as pd

        return pd.DataFrame({k: pd.Series(self.cols[k], dtype=_DTYPES[k]) for k in COLUMNS})

    to_frame = frame

    def to_dask_frame(self, npartitions: int = 1):
        """The same rows as a dask.dataframe (for pipelines that continue on a cluster)."""
        import dask.dataframe as dd

        if not isinstance(npartitions, int) or isinstance(npartitions, bool) or npartitions < 1:
            raise ValueError(f"npartitions must be a positive int, got {npartitions!r}")
        return dd.from_pandas(self.frame(), npartitions=npartitions)

    @property
    def specs(self) -> list[str]:
        return [p.spec() for p in self.presets]

    def _spec(self, engine) -> str:
        if engine is None:
            return self.specs[0]
        for p in self.presets:
            if engine in (p.spec(), p.engine):
                return p.spec()
        raise KeyError(f"engine {engine!r} is not in this report ({', '.join(self.specs)})")

    # --- totals ----------------------------------------------------------------------------------------
    def summary(self):
        """One row per engine: calls, prompt tokens, reused, read, reread, hit rate, seconds, dollars,
        evictions, and the comparison with what the log reports (Contract 4): over the calls with a report,
        `simulated_cached` vs `reported_cached` tokens, `reported_diff` (simulated - reported) and
        `reported_diff_pct` (that difference in % of those calls' reported prompt tokens), `calls_differ`, the
        rates (`simulated_rate` of the rendered prompts, `reported_rate` of the reported prompt tokens,
        `reported_prompt_tokens`), the agreement (`agree_calls`: calls within `AGREE_POINTS` points,
        `agree_share`, `models_reporter`: this engine is the reporter's cache model, `agreement`: in words),
        and `simulated_written` vs `reported_written` on calls with a reported cache write; then the causes."""
        import pandas as pd

        if self._summary is not None:
            return self._summary.copy()
        df = self.frame()
        rows = []
        for p in self.presets:
            spec = p.spec()
            g = df[df["spec"] == spec]
            rep = g[g["reported"].notna()]
            wr = g[g["reported_write"].notna()]
            prompt = int(g["prompt_len"].sum())
            rendered = int(rep["prompt_len"].sum())
            rep_prompt = sum(reported_base(n, r, q if q is not pd.NA else None)
                             for n, r, q in zip(rep["prompt_len"], rep["reported"], rep["reported_prompt"]))
            sim, got = int(rep["reused"].sum()), int(rep["reported"].sum())
            by = sorted(set(rep["reported_by"].dropna().astype(str)))
            agr = agreement(g)
            rows.append({
                "engine": p.engine, "spec": spec, "policy": self.policy, "sessions": int(g["session"].nunique()),
                "calls": len(g), "prompt_tokens": prompt,
                "reused": int(g["reused"].sum()), "read": int(g["read"].sum()), "reread": int(g["reread"].sum()),
                "divergence_reread": int(g["divergence_reread"].sum()),
                "engine_reread": int(g["engine_reread"].sum()),
                "hit_rate": g["reused"].sum() / prompt if prompt else math.nan,
                "prefill_s": float(g["prefill_s"].sum(min_count=1)), "reread_s": float(g["reread_s"].sum(min_count=1)),
                "dollars": float(g["dollars"].sum(min_count=1)), "evictions": self.evictions.get(spec, 0),
                "reported_calls": len(rep), "reported_by": ", ".join(by) or None,
                "simulated_cached": sim, "reported_cached": got, "reported_diff": sim - got,
                "reported_diff_pct": 100.0 * (sim - got) / rep_prompt if rep_prompt else math.nan,
                "reported_prompt_tokens": rep_prompt,
                "simulated_rate": sim / rendered if rendered else math.nan,
                "reported_rate": got / rep_prompt if rep_prompt else math.nan,
                "calls_differ": int((rep["reused"] != rep["reported"]).sum()) if len(rep) else 0,
                "agree_calls": agr["agree_calls"], "agree_share": agr["agree_share"],
                "models_reporter": p.engine in by, "agreement": agr["agreement"],
                "reported_write_calls": len(wr), "simulated_written": int(wr["written"].sum()),
                "reported_written": int(wr["reported_write"].sum()),
                "causes": ", ".join(f"{k} {v}" for k, v in sorted(Counter(g["cause"].astype(str)).items(),
                                                                   key=lambda kv: (-kv[1], kv[0]))),
            })
        self._summary = pd.DataFrame(rows)
        return self._summary.copy()

    def totals(self, engine=None) -> dict:
        """One engine's totals (the `summary()` row, `causes` as a dict)."""
        spec = self._spec(engine)
        row = next(r for r in self.summary().to_dict("records") if r["spec"] == spec)
        g = Counter(c for s, c in zip(self.cols["spec"], self.cols["cause"]) if s == spec)
        row["causes"] = dict(g)
        return row

    def _single(self) -> dict:
        if len(self.presets) != 1:
            raise KeyError(f"this report covers {len(self.presets)} engines ({', '.join(self.specs)}): use "
                           "report.totals(engine) or report.summary()")
        return self.totals()

    def __getitem__(self, key):
        return self._single()[key]

    def __iter__(self):
        return iter(self._single())

    def __len__(self):
        return len(self._single())

    def keys(self):
        return self._single().keys()

    def get(self, key, default=None):
        return self._single().get(key, default)

    def sessions_frame(self):
        """Per (engine, session): calls, prompt tokens, reused, read, reread, reread seconds, causes."""
        import pandas as pd

        df = self.frame()
        cols = ["spec", "session", "calls", "prompt_tokens", "reused", "read", "reread", "reread_s", "causes"]
        if df.empty:
            return pd.DataFrame(columns=cols)
        g = df.groupby(["spec", "session"], sort=False, observed=True)
        return pd.DataFrame({
            "calls": g.size(), "prompt_tokens": g["prompt_len"].sum(), "reused": g["reused"].sum(),
            "read": g["read"].sum(), "reread": g["reread"].sum(), "reread_s": g["reread_s"].sum(min_count=1),
            "causes": g["cause"].agg(lambda s: ", ".join(f"{k} {v}" for k, v in Counter(s.astype(str)).most_common()
                                                         if k != "none")),
        }).reset_index()[cols]

    def headline(self, engine=None) -> str:
        """One sentence per engine: how much was re-read although the session held it."""
        t = self.totals(engine)
        pct = 100.0 * t["reread"] / t["prompt_tokens"] if t["prompt_tokens"] else math.nan
        s = (f"{t['spec']}: {t['reread']} of {t['prompt_tokens']} prompt tokens ({pct:.0f}%) were re-read although "
             "the session had held them")
        if t["reread_s"] == t["reread_s"] and t["prefill_s"] == t["prefill_s"] and self.cost_model is not None:
            share = 100.0 * t["reread_s"] / t["prefill_s"] if t["prefill_s"] else math.nan
            s += f"; about {_fmt_s(t['reread_s'])} of {_fmt_s(t['prefill_s'])} of prefill ({share:.0f}%)"
        elif self.cost_model is None and self.poor_fit is not None:
            from strata_lab.replayer.costs import MIN_R2

            s += (f" (the cost model fits the dump's prefill times too poorly to price seconds: R^2 "
                  f"{self.poor_fit.r2:.2f} on {self.poor_fit.points} calls, below {MIN_R2}; tokens only)")
        return s

    def worst(self, n: int = 5, engine=None) -> list[dict]:
        """One engine's n calls that re-read the most tokens (ties: the larger miss, then the earlier call)."""
        spec = self._spec(engine)
        c = self.cols
        cand = [(-c["reread"][k], -(c["held_before"][k] - c["reused"][k]), c["index"][k], k)
                for k in range(len(c["index"])) if c["spec"][k] == spec
                and (c["reread"][k] > 0 or c["cause"][k] not in ("none", "new_session"))]
        return [{name: c[name][k] for name in COLUMNS} for *_x, k in heapq.nsmallest(n, cand)]

    # --- text ------------------------------------------------------------------------------------------
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
                out.append(f"    agreement with the log (cached within {AGREE_POINTS:g} points of the reported prompt "
                           f"tokens): {r['agreement']}" + (" (the reporter's cache model)" if r["models_reporter"]
                                                          else ""))
            else:
                out.append("    vs reported: no call in this trace reports its cached tokens")
            if r["reported_write_calls"]:
                out.append(f"    cache writes on {r['reported_write_calls']} calls: simulated {r['simulated_written']}, "
                           f"reported {r['reported_written']}, difference "
                           f"{r['simulated_written'] - r['reported_written']:+d} tokens")
            out.append(f"    causes: {r['causes']}")
            if p.engine == "strata":   # the same engine gives other numbers under other checkpoints: say which
                cp = getattr(p, "checkpoints", "recorded")
                out.append("    checkpoints: " + ("recorded (the snapshots each dump line reports, as the engine kept "
                                                  "them)" if cp == "recorded" else
                                                  f"{cp} (modelled; set with strata:checkpoints=...)"))
        return out

    def calls_table(self, rows: int | None = 10) -> str:
        """The per-call rows as text: one table per engine (every engine is shown, however many calls), each
        holding its `rows` calls that re-read the most (ties: the earlier call), or all its calls in call order
        when it has no more than `rows`; `rows=None`: every row of every engine, in report order."""
        df = self.frame()
        show = ["engine", "index", "session", "turn", "prompt_len", "reused", "read", "reread", "unit", "cause",
                "reported", "reported_diff"]
        if rows is None:
            return df[show].to_string(index=False)
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
            raise ValueError(f"rows must be an int >= 0 (calls shown per engine), got {rows!r}")
        parts = []
        for spec in self.specs:
            g = df[df["spec"] == spec]
            if len(g) <= rows:
                title, pick = f"{spec}: every call ({len(g)})", g
            else:
                pick = g.sort_values(["reread", "index"], ascending=[False, True], kind="stable").head(rows)
                title = (f"{spec}: the {rows} of {len(g)} calls that re-read the most (--rows N for more, "
                         "--all-rows for every call)")
            parts += [title, pick[show].to_string(index=False) if len(pick) else "(no call shown)", ""]
        return "\n".join(parts[:-1])

    def format(self, *, worst: int = 5, rows: int | None = 10) -> str:
        """The text the CLI prints: a summary per engine, each engine's `rows` calls that re-read the most
        (`calls_table`; None: every row), per-engine totals and causes, headline, worst divergences."""
        df = self.frame()
        head = f"replay: policy {self.policy}, engines {', '.join(self.specs)}, {df['index'].nunique()} calls"
        summ = self.summary()[["spec", "calls", "prompt_tokens", "reused", "read", "reread", "hit_rate"]]
        summ = summ.assign(hit_rate=[f"{x:.1%}" if x == x else "n/a" for x in summ["hit_rate"]])
        parts = [head, "", summ.to_string(index=False), "", self.calls_table(rows), "", *self.lines(), ""]
        parts += [self.headline(p.spec()) for p in self.presets]
        if self.note:
            parts.append("note: " + self.note)
        for p in self.presets:
            bad = self.worst(worst, p.spec())
            if not bad:
                continue
            parts += ["", f"worst divergences on {p.spec()} (top {len(bad)} by tokens re-read):"]
            for r in bad:
                parts.append(f"- session {r['session']} turn {r['turn']} (call {r['index']}): {r['cause']}, reread "
                             f"{r['reread']} (divergence {r['divergence_reread']}, engine {r['engine_reread']}), "
                             f"reused {r['reused']} of held {r['held_before']}, lcp_ids {r['lcp_ids']}, lcp_text "
                             f"{r['lcp_text']}")
                for key in ("id_context_held", "id_context_prompt"):
                    if r[key]:
                        parts.append(f"    ids  {r[key]}")
                for key in ("text_context_held", "text_context_prompt"):
                    if r[key]:
                        parts.append(f"    text {r[key]}")
        return "\n".join(parts)

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
        cols = self.cols
        calls = [{k: clean(cols[k][i]) for k in COLUMNS} for i in range(len(cols["index"]))]
        doc = {"schema": "strata-replay/1", "policy": self.policy, "engines": summary, "calls": calls,
               "cost_model": self.cost_model.describe() if self.cost_model else None}
        return json.dumps(doc, sort_keys=True, allow_nan=False, separators=(",", ":")) + "\n"

    def __repr__(self):
        return f"ReplayReport({self.specs}, calls={self.table.num_rows})"
