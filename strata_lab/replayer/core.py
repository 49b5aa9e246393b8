"""Replay dumps through the state model: measure reuse and re-read cost, explain each miss, try fixes.

`replay(dump)` steps every session's calls through the session state model (no weights) and reports per
call: prompt_len, held_before, lcp_ids, lcp_text, recorded vs predicted reused, read, reread, the cause,
the divergence context and the seconds a prefill cost model (fitted to the dump's own timings) puts on
the re-read. Counterfactual policies replay the same dump as if a fix had shipped: reply-id reuse
(PromptEncoder.remember_reply), drained ids kept, other checkpoint policies.

>>> import os, tempfile
>>> from strata_lab import load_tokenizer
>>> from strata_lab.dump.writer import Recorder
>>> tok = load_tokenizer("qwen3")
>>> path = os.path.join(tempfile.mkdtemp(), "d.jsonl")
>>> p1 = tok.encode("<|im_start|>user\\nsay it<|im_end|>\\n<|im_start|>assistant\\n")
>>> reply = tok.encode("Hi") + [130947, 5855] + [tok.im_end_id]          # ' öğrenci' in two pieces
>>> p2 = p1 + tok.encode("Hi öğrenci<|im_end|>\\n<|im_start|>user\\nmore<|im_end|>\\n")
>>> with Recorder(path) as rec:
...     rec.write_call(session="s", prompt_ids=p1, reused=0, gen_ids=reply, prefill_ms=10)
...     rec.write_call(session="s", prompt_ids=p2, reused=len(p1), prefill_ms=9)
>>> report = replay(path, tokenizer=tok)
>>> [r.cause for r in report.rows]
['new_session', 'retokenized_reply']
>>> report.rows[1].reused, report.rows[1].reread
(10, 4)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from strata_lab.dump import Dump, Store, load_dump
from strata_lab.rules import CheckpointPolicy, parse_checkpoint_policy
from strata_lab.replayer.costs import CostModel, usable_fit
from strata_lab.replayer.fast import fit_cost_store
from strata_lab.replayer.policies import Policy, PromptRewriter, parse_policy
from strata_lab.replayer.report import Report
from strata_lab.replayer.rowtable import RowTable
from strata_lab.replayer.state import FULL_HIT_RULES, MODELS, SessionState, default_snapshot_bytes
from strata_lab.replayer.step import recorded_prefill_ms, step

__all__ = ["replay", "compare_policies", "fit_cost", "ReplayOptions", "resolve_options"]


@dataclass(frozen=True)
class ReplayOptions:
    """Validated replay settings: the model kind, the prompt policy, the snapshot policy sessions start
    with ("recorded": each dump line's own snapshots), the full-hit rule and the snapshot size."""

    model: str
    policy: Policy
    checkpoints: CheckpointPolicy | str
    full_hit: str
    bytes_per_snapshot: int
    context_chars: int = 40

    def new_state(self) -> SessionState:
        cp = self.checkpoints if isinstance(self.checkpoints, CheckpointPolicy) else CheckpointPolicy()
        return SessionState(model=self.model, policy=cp, full_hit=self.full_hit,
                            bytes_per_snapshot=self.bytes_per_snapshot)

    @property
    def recorded_checkpoints(self) -> bool:
        return self.checkpoints == "recorded"


def resolve_options(*, model: str = "hybrid", checkpoint_policy: CheckpointPolicy | str | None = None,
                    policy: Policy | str = "recorded", full_hit: str = "held_logits",
                    bytes_per_snapshot: int | None = None, context_chars: int = 40) -> ReplayOptions:
    """Check every replay argument before any work; name the bad one.

    >>> resolve_options(checkpoint_policy="every:64").checkpoints.every
    64
    >>> resolve_options(checkpoint_policy=64)
    Traceback (most recent call last):
    ...
    TypeError: checkpoint_policy must be a strata_lab.CheckpointPolicy, a spec string or None, got int
    """
    if model not in MODELS:
        raise ValueError(f"model must be one of {MODELS}, got {model!r}")
    if full_hit not in FULL_HIT_RULES:
        raise ValueError(f"full_hit must be one of {FULL_HIT_RULES}, got {full_hit!r}")
    if isinstance(policy, str):
        policy = parse_policy(policy)
    if not isinstance(policy, Policy):
        raise TypeError(f"policy must be a Policy or a spec string, got {type(policy).__name__}")
    if not (checkpoint_policy is None or isinstance(checkpoint_policy, (str, CheckpointPolicy))):
        raise TypeError(f"checkpoint_policy must be a strata_lab.CheckpointPolicy, a spec string or None, "
                        f"got {type(checkpoint_policy).__name__}")
    ckpt = policy.checkpoint_policy if policy.checkpoint_policy is not None else checkpoint_policy
    if isinstance(ckpt, str) and ckpt != "recorded":
        ckpt = parse_checkpoint_policy(ckpt)
    if ckpt is None:
        ckpt = CheckpointPolicy()
    snap = default_snapshot_bytes(model) if bytes_per_snapshot is None else bytes_per_snapshot
    opts = ReplayOptions(model=model, policy=policy, checkpoints=ckpt, full_hit=full_hit, bytes_per_snapshot=snap,
                         context_chars=context_chars)
    opts.new_state()  # validates the snapshot size and budget against the model
    return opts


def load_tokenizer_arg(tokenizer):
    """A Tokenizer from a name ("qwen3") or the object itself."""
    if isinstance(tokenizer, str):
        from strata_lab.text.tokenizer import load_tokenizer

        return load_tokenizer(tokenizer)
    return tokenizer


def fit_cost(records: Iterable[dict]) -> CostModel | None:
    """A prefill cost model fitted to the records' own timings (None when they carry none)."""
    samples = []
    for rec in records:
        reused = rec.get("reused")
        t = recorded_prefill_ms(rec)
        if isinstance(reused, int) and t is not None:
            samples.append((len(rec["prompt_ids"]) - reused, reused, t))
    try:
        return CostModel.fit(samples)
    except ValueError:
        return None


def replay_records(records: Iterable[dict], opts: ReplayOptions, tok, cost_model: CostModel | None,
                   progress=None) -> tuple[RowTable, int, float | None]:
    """Step each record through its session's state: the rows, the sum of the sessions' peak snapshot
    bytes, and the recorded prefill seconds (None when no line has any)."""
    policy = opts.policy
    rewriter = PromptRewriter(policy, tok) if policy.changes_prompts else None
    states: dict[str, SessionState] = {}
    peak: dict[str, int] = {}
    rows = RowTable()
    recorded_ms = None
    for rec in records:
        sid = str(rec["session"])
        st = states.get(sid)
        first = st is None
        if first:
            st = states[sid] = opts.new_state()
            peak[sid] = 0
        prompt = rewriter.prompt(rec, st) if rewriter is not None else rec["prompt_ids"]
        row = step(st, prompt, rec, tok=tok, first=first, recorded_checkpoints=opts.recorded_checkpoints,
                   prompt_changed=rewriter is not None, cost_model=cost_model, context_chars=opts.context_chars)
        if rewriter is not None:
            rewriter.finish(rec, prompt)
        peak[sid] = max(peak[sid], st.snapshot_bytes())
        t = recorded_prefill_ms(rec)
        if t is not None:
            recorded_ms = (recorded_ms or 0.0) + t
        rows.append(row)
        if progress is not None:
            progress.update(1)
    recorded_s = recorded_ms / 1000.0 if recorded_ms is not None else None
    return rows, sum(peak.values()), recorded_s


def replay(dump, *, model: str = "hybrid", checkpoint_policy: CheckpointPolicy | str | None = None,
           tokenizer="qwen3", policy: Policy | str = "recorded", full_hit: str = "held_logits",
           cost_model: CostModel | None = None, progress: bool = False, context_chars: int = 40,
           bytes_per_snapshot: int | None = None, cluster=None) -> Report:
    """Replay a dump (path, paths, Dump, or a Parquet store) under `policy`; return a Report, one row per call.

    A store's fast path (its delta encoding on the C++ core, in-process or on Dask) is `strata_lab.replay`.

    `checkpoint_policy` (a strata_lab.CheckpointPolicy or a spec such as "every:256"; default: a snapshot
    at each prompt's end) applies unless the policy names its own; "recorded" uses the snapshots each dump
    line reports. `cost_model` defaults to a fit on the dump's prefill_ms. `bytes_per_snapshot` sizes
    budgets and the reported memory (default: a recurrent-state snapshot on hybrid, logits on attention).

    Args:
        dump: a dump path, paths, `Dump`, or a Parquet store.
        model: "hybrid" (restart from a checkpoint at a divergence) or "attention" (any prefix is reused).
        checkpoint_policy: as above; the default ("turn") differs from "recorded" when the engine kept other
            snapshots (header checkpoints), so the same dump gives different numbers under the two.
        tokenizer: a Tokenizer or a name; names each miss's cause (decodes the text around it).
        policy: the policy replayed ("recorded", "reply-ids", "keep-drained", "fixes", "header", ...).
        full_hit: what the engine does when the whole prompt is held (see `FULL_HIT_RULES`).
        cost_model: a `CostModel`; None fits one on the dump's prefill_ms.
        progress: show a progress bar.
        context_chars: characters of text kept around each divergence.
        bytes_per_snapshot: as above.
        cluster: not taken here (`strata_lab.replay(store, cluster=...)`).
    """
    opts = resolve_options(model=model, checkpoint_policy=checkpoint_policy, policy=policy, full_hit=full_hit,
                           bytes_per_snapshot=bytes_per_snapshot, context_chars=context_chars)
    if cost_model is not None and not isinstance(cost_model, CostModel):
        raise TypeError(f"cost_model must be a CostModel or None, got {type(cost_model).__name__}")
    if cluster is not None:
        raise TypeError("cluster: a store replays on Dask through strata_lab.replay(store, cluster=...)")
    dump = dump if isinstance(dump, (Dump, Store)) else load_dump(dump)
    tok = load_tokenizer_arg(tokenizer)
    records = dump.records()
    poor_fit = None
    if cost_model is None:   # a fit too poor to price seconds is set aside: tokens only, and the report says so
        cost_model, poor_fit = usable_fit(fit_cost(records))
    bar = None
    if progress:
        from strata_lab.progress import progress_bar

        bar = progress_bar(total=len(records), desc=f"replay {opts.policy.name}", unit="call")
    try:
        rows, snap_bytes, recorded_s = replay_records(records, opts, tok, cost_model, bar)
    finally:
        if bar is not None:
            bar.close()
    if opts.policy.changes_prompts or opts.policy.checkpoint_policy is not None:
        recorded_s = None  # the recorded timings belong to the recorded prompts and snapshots
    return Report(rows, policy=opts.policy, model=opts.model, cost_model=cost_model, snapshot_bytes=snap_bytes,
                  recorded_prefill_s=recorded_s, poor_fit=poor_fit, checkpoints=str(opts.checkpoints))


def compare_policies(dump, policies: Iterable[Policy | str] = ("recorded", "keep-drained", "every:256"),
                     **kwargs):
    """Replay the same dump under several policies; one row per policy (a pandas DataFrame):
    total read, reread, hit rate, snapshot memory, predicted prefill seconds and reread seconds.

    The cost model is fitted once, on the recorded calls, and shared by every policy.
    """
    import pandas as pd

    dump = load_dump(dump)
    if kwargs.get("cost_model") is None:
        is_store = isinstance(dump, Store)
        kwargs["cost_model"] = usable_fit(fit_cost_store(dump) if is_store else fit_cost(dump.records()))[0]
    if isinstance(kwargs.get("tokenizer"), str) or "tokenizer" not in kwargs:
        kwargs["tokenizer"] = load_tokenizer_arg(kwargs.get("tokenizer", "qwen3"))
    rows = []
    for p in policies:
        r = replay(dump, policy=p, **kwargs)
        rows.append({"policy": r["policy"], "calls": r["calls"], "prompt_tokens": r["prompt_tokens"],
                     "reused": r["reused"], "read": r["read"], "reread": r["reread"], "hit_rate": r["hit_rate"],
                     "snapshot_mib": r["snapshot_mib"], "prefill_s": r["predicted_prefill_s"],
                     "reread_s": r["reread_s"]})
    return pd.DataFrame(rows)
