"""Replay dumps through the state model: measure reuse and re-read cost, explain each miss, try fixes.

`replay(dump)` steps every session's calls through Contract 1 (no weights) and reports Contract 3 per
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
>>> [r["cause"] for r in report.rows]
['new_session', 'retokenized_reply']
>>> report.rows[1]["reused"], report.rows[1]["reread"]
(10, 4)
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Iterable, Sequence

from strata_lab.replayer.costs import CostModel
from strata_lab.replayer.divergence import CAUSES, classify, find_divergence
from strata_lab.dump import Dump, load_dump
from strata_lab.replayer.state import (ATTENTION_SNAPSHOT_BYTES, CheckpointPolicy, DEFAULT_SNAPSHOT_BYTES, FULL_HIT_RULES,
                          MODELS, SessionState, TurnStart, lcp_len, parse_checkpoint_policy, predict_reuse,
                          reuse_target)

__all__ = ["replay", "Report", "Policy", "parse_policy", "compare_policies", "CAUSES"]


@dataclass(frozen=True)
class Policy:
    """One way to serve the dump's sessions: the recorded prompts, or a fix applied to them.

    reply_ids: prompts rebuilt by a PromptEncoder that was told each previous reply (reply-id reuse).
    keep_drained: the server keeps ids drained after a STOP in the next prompt (when plain text).
    checkpoint_policy: a CheckpointPolicy, "recorded" (the dump's own checkpoints), or None (replay's).
    """

    name: str = "recorded"
    reply_ids: bool = False
    keep_drained: bool = False
    checkpoint_policy: CheckpointPolicy | str | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name must be a non-empty str, got {self.name!r}")
        cp = self.checkpoint_policy
        if not (cp is None or cp == "recorded" or isinstance(cp, CheckpointPolicy)):
            raise ValueError(f"checkpoint_policy must be a CheckpointPolicy, 'recorded' or None, got {cp!r}")


def parse_policy(spec: str, *, bytes_per_snapshot: int = DEFAULT_SNAPSHOT_BYTES) -> Policy:
    """A policy from a CLI spec: parts joined by "+", each one of recorded, reply-ids, keep-drained,
    fixes (both), or a checkpoint spec (turn, none, every:N, at:P,.., budget:MIB[:N], ckpt-recorded,
    header, before-last:ID; "every:N,header" adds the header snapshot to another kind).

    "header" keeps, besides the turn start, a snapshot just before the last ``<|im_start|>`` of each prompt
    (the generation prompt's header): on a hybrid model it serves the next prompt when the template
    rewrites the previous reply (Qwen3 strips its empty ``<think>`` block once a user turn arrives).
    "before-last:ID" does the same for any token id.

    >>> parse_policy("reply-ids+every:256")
    Policy(name='reply-ids+every:256', reply_ids=True, keep_drained=False, checkpoint_policy=EveryN(bytes_per_snapshot=75497472, before_last=None, n=256, turn_start=True))
    >>> parse_policy("header").checkpoint_policy.before_last
    151644
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"policy must be a non-empty spec, got {spec!r}")
    kw: dict = {}
    for part in spec.split("+"):
        p = part.strip().lower().replace("_", "-")
        if p in ("recorded", "baseline"):
            continue
        if p in ("reply-ids", "reply-id-reuse", "reuse-reply-ids"):
            kw["reply_ids"] = True
        elif p in ("keep-drained", "drained"):
            kw["keep_drained"] = True
        elif p == "fixes":
            kw["reply_ids"] = kw["keep_drained"] = True
        elif p == "ckpt-recorded":
            kw["checkpoint_policy"] = "recorded"
        else:
            kw["checkpoint_policy"] = parse_checkpoint_policy(part.strip(), bytes_per_snapshot=bytes_per_snapshot)
    return Policy(name=spec.strip(), **kw)


# --- the report ------------------------------------------------------------------------------------
def _fmt_s(x: float) -> str:
    if x != x:
        return "n/a"
    return f"{x:.0f} s" if abs(x) >= 100 else f"{x:.3g} s"


class Report(Mapping):
    """The replay of one dump under one policy. A read-only mapping of totals, plus per-call rows.

    `report["reread"]`, `report["causes"]`..., `report.rows` (one dict per call), `report.to_frame()`,
    `report.sessions_frame()`, `report.summary()`, `report.worst(n)`, `report.format()`.
    """

    def __init__(self, rows: list[dict], *, policy: Policy, model: str, cost_model: CostModel | None,
                 snapshot_bytes: int, recorded_prefill_s: float | None):
        self.rows = rows
        self.policy = policy
        self.model = model
        self.cost_model = cost_model
        self.snapshot_bytes = snapshot_bytes
        self._totals = self._compute_totals(recorded_prefill_s)

    def _compute_totals(self, recorded_prefill_s):
        rows = self.rows
        prompt = sum(r["prompt_len"] for r in rows)
        reused = sum(r["reused"] for r in rows)
        reread = sum(r["reread"] for r in rows)
        predicted_s = sum(r["prefill_s"] for r in rows) if self.cost_model else math.nan
        rec_known = [r for r in rows if r["recorded_reused"] is not None]
        return {
            "policy": self.policy.name,
            "model": self.model,
            "sessions": len({r["session"] for r in rows}),
            "calls": len(rows),
            "prompt_tokens": prompt,
            "reused": reused,
            "read": prompt - reused,
            "reread": reread,
            "hit_rate": reused / prompt if prompt else math.nan,
            "reread_s": sum(r["reread_s"] for r in rows) if self.cost_model else math.nan,
            "prefill_s": recorded_prefill_s if recorded_prefill_s is not None else predicted_s,
            "predicted_prefill_s": predicted_s,
            "snapshot_mib": self.snapshot_bytes / 2**20,
            "causes": dict(Counter(r["cause"] for r in rows)),
            "mismatches": sum(1 for r in rec_known if r["recorded_reused"] != r["reused"]),
            "compared": len(rec_known),
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

        df = pd.DataFrame(self.rows, columns=_COLUMNS)
        for col, dtype in _DTYPES.items():
            df[col] = df[col].astype(dtype)
        return df

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
            return (f"{t['reread']} of {t['prompt_tokens']} prompt tokens were re-read although the engine held "
                    f"them (no prefill timings to put seconds on it)")
        total = t["prefill_s"]
        pct = 100.0 * t["reread_s"] / total if total else math.nan
        return (f"about {_fmt_s(t['reread_s'])} of {_fmt_s(total)} ({pct:.0f}%) went to re-reading "
                f"what the engine held")

    def worst(self, n: int = 5) -> list[dict]:
        """The n calls that re-read the most held tokens."""
        return sorted((r for r in self.rows if r["reread"] > 0 or r["cause"] not in ("none", "new_session")),
                      key=lambda r: (-r["reread"], -(r["held_before"] - r["reused"])))[:n]

    def format(self, *, worst: int = 5) -> str:
        """The text the CLI prints: per-session table, totals, causes, worst divergences."""
        t = self._totals
        lines = [f"replay: policy {t['policy']}, model {t['model']}, {t['sessions']} sessions, {t['calls']} calls"]
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
                lines.append(f"- session {r['session']} call {r['index']}: {r['cause']}, reused {r['reused']} "
                             f"of held {r['held_before']}, lcp_ids {r['lcp_ids']}, lcp_text {r['lcp_text']}, "
                             f"reread {r['reread']}")
                for key in ("id_context_held", "id_context_prompt"):
                    if r[key]:
                        lines.append(f"    ids  {r[key]}")
                if r["held_ids_at"]:
                    lines.append(f"    ids  held {list(r['held_ids_at'])} vs prompt {list(r['prompt_ids_at'])}")
                for key in ("text_context_held", "text_context_prompt"):
                    if r[key]:
                        lines.append(f"    text {r[key]}")
        return "\n".join(lines)

    def __repr__(self):
        t = self._totals
        return (f"Report(policy={t['policy']!r}, calls={t['calls']}, reused={t['reused']}, read={t['read']}, "
                f"reread={t['reread']})")


_DTYPES = {
    "session": "string", "index": "int64", "request_id": "string", "call": "int64", "ts": "float64",
    "prompt_len": "int64", "held_before": "int64", "lcp_ids": "int64", "lcp_text": "int64",
    "reused": "int64", "recorded_reused": "Int64", "read": "int64", "reread": "int64", "cause": "category",
    "checkpoint_gap": "int64", "snapshots": "int64", "snapshot_mib": "float64", "gen_len": "int64",
    "drained_len": "int64", "prefill_ms": "float64", "prefill_s": "float64", "reread_s": "float64",
    "id_context_held": "string", "id_context_prompt": "string", "text_context_held": "string",
    "text_context_prompt": "string",
}
_COLUMNS = list(_DTYPES) + ["held_ids_at", "prompt_ids_at"]


# --- the replay ------------------------------------------------------------------------------------
def _plain_drained(drained: Sequence[int], tok) -> bool:
    """PR 1536's rule: drained ids join the text only when plain (no special id, no '<')."""
    if not drained or any(i in tok.special_ids or i in tok.added_tokens.values() for i in drained):
        return False
    try:
        text = tok.ids_bytes(drained).decode("utf-8")
    except UnicodeDecodeError:
        return False
    return "<" not in text


def _keep_drained(prompt, state: SessionState, tok):
    """The prompt a server that kept the last reply's drained ids would have sent, or None (no change)."""
    seg = next((s for s in reversed(state.segments) if s[2] == "drained"), None)
    if seg is None or seg[1] != len(state.held):
        return None
    start, end = seg[0], seg[1]
    held = state.held
    drained = held[start:end]
    if not _plain_drained(drained, tok):
        return None
    lcp = lcp_len(prompt, held)
    if lcp >= end:
        return None
    div = find_divergence(held, prompt, tok, lcp_ids=lcp)
    if not start <= div.lcp_text < end:
        return None  # the text does not part at the drained ids: nothing was dropped there
    if lcp >= start:  # ids intact up to the drained ones: splice them back in
        return held[:end] + prompt[start:]
    cut = len(tok.ids_bytes(held[:start]))  # text agrees up to here; splice the drained text in
    pb = tok.ids_bytes(prompt)
    return tok.encode((pb[:cut] + tok.ids_bytes(drained) + pb[cut:]).decode("utf-8", errors="replace"))


class _Request:
    """The request a session's server is serving, as the replay's counterfactual tracks it.

    The server (strata_lab/server/generation.py) encodes a request's prompt once; a thinking-budget wrap-up
    continues with prompt = first prompt + thought ids + kept drained ids + wrap-up ids, built from ids and
    never re-encoded; and it calls remember_reply(first prompt, every id of the reply) once, after the
    request's last engine call. A counterfactual that re-encoded the wrap-up prompt's text would re-tokenize
    ids the engine holds (drained ' ],\n' + wrap-up '\n\n' encode as ' ],\n\n\n') and lose reuse the
    server keeps.
    """

    def __init__(self, request_id, recorded_prompt, prompt):
        self.request_id = request_id
        self.recorded_prompt = list(recorded_prompt)
        self.prompt = list(prompt)
        self.reply: list[int] = []

    def continued_by(self, rec) -> bool:
        """Whether `rec` is a later engine call of this request (a wrap-up continuation)."""
        rp = rec["prompt_ids"]
        return (self.request_id is not None and rec.get("request_id") == self.request_id
                and int(rec.get("call") or 0) > 0 and len(rp) >= len(self.recorded_prompt)
                and rp[:len(self.recorded_prompt)] == self.recorded_prompt)

    def continuation(self, rec) -> list[int]:
        """This call's prompt in the counterfactual: our first prompt plus the ids the server appended."""
        return self.prompt + list(rec["prompt_ids"][len(self.recorded_prompt):])

    def add_call(self, prompt, gen, drained, tok) -> None:
        """The reply so far, as the server assembles it: ids after the first prompt, this call's generated
        ids, and the leading plain drained ids (server.generation.plain_drained)."""
        from strata_lab.server.generation import plain_drained
        from strata_lab.server.output import TextStream

        stops = tuple(i for i in (tok.im_end_id, tok.eos_id) if i is not None)
        reply = list(prompt[len(self.prompt):]) + list(gen)
        text = TextStream(tok)  # the server's stream of the reply's text: does it end inside a character?
        for i in reply:
            if i not in stops:
                text.push(i)
        self.reply = reply + plain_drained(tok, drained, stops, mid_character=text.mid_character)

    def remember(self, encoder, tok) -> None:
        # ids past the vocabulary (a random model's spare rows) have no text: the server stops there
        known = next((k for k, i in enumerate(self.reply) if i >= tok.vocab_size), len(self.reply))
        encoder.remember_reply(self.prompt, self.reply[:known])


class _Rewriter:
    """The prompts a server under a prompt-changing policy would have sent, call by call.

    `prompt(rec, state)` before each call (state: the session's SessionState, for the drained splice),
    `finish(rec, prompt)` after it. A request's first call is rebuilt (drained splice, then the session's
    PromptEncoder, which remembers earlier replies); a later call of the same request (a wrap-up) is the
    rebuilt first prompt plus the ids the server appended, as the server does (see _Request).
    """

    def __init__(self, policy: Policy, tok):
        self.policy = policy
        self.tok = tok
        self.encoders: dict = {}
        self.requests: dict[str, _Request] = {}  # per session: the request in flight

    def prompt(self, rec, state: SessionState) -> list[int]:
        sid, tok, policy = str(rec["session"]), self.tok, self.policy
        req = self.requests.get(sid)
        if req is not None and req.continued_by(rec):
            return req.continuation(rec)
        if req is not None and policy.reply_ids:
            req.remember(self.encoders[sid], tok)  # the server remembers a reply when its request ends
        prompt = list(rec["prompt_ids"])
        if policy.keep_drained:
            prompt = _keep_drained(prompt, state, tok) or prompt
        if policy.reply_ids:
            enc = self.encoders.get(sid)
            if enc is None:
                enc = self.encoders[sid] = _make_encoder(tok)
            prompt = list(enc.encode(tok.decode(prompt)))
        self.requests[sid] = _Request(rec.get("request_id"), rec["prompt_ids"], prompt)
        return prompt

    def finish(self, rec, prompt) -> None:
        self.requests[str(rec["session"])].add_call(prompt, rec["gen_ids"], rec["drained_ids"], self.tok)


def _make_encoder(tok):
    try:
        from strata_lab.text.encoder import PromptEncoder
    except ImportError as exc:
        raise ValueError("policy reply_ids needs strata_lab.encoder.PromptEncoder, which this build lacks") from exc
    return PromptEncoder(tok)


def _fit_cost(records: list[dict]) -> CostModel | None:
    samples = []
    for rec in records:
        reused = rec.get("reused")
        t = rec["timings"].get("prefill_ms") if isinstance(rec.get("timings"), dict) else None
        if isinstance(reused, int) and isinstance(t, (int, float)):
            samples.append((len(rec["prompt_ids"]) - reused, reused, float(t)))
    try:
        return CostModel.fit(samples)
    except ValueError:
        return None


def replay(dump, *, model: str = "hybrid", checkpoint_policy: CheckpointPolicy | str | None = None,
           tokenizer="qwen3", policy: Policy | str = "recorded", full_hit: str = "held_logits",
           cost_model: CostModel | None = None, progress: bool = False, context_chars: int = 40,
           engine=None, **engine_params) -> Report:
    """Replay a dump (path, paths, or Dump) under `policy`; return a Report with one row per call.

    `checkpoint_policy` (default TurnStart) applies unless the policy names its own; "recorded" uses
    the checkpoints each dump line reports. `cost_model` defaults to a fit on the dump's prefill_ms.
    `engine="vllm"` (any `strata_lab.caches` spec, `engine_params` as its overrides) replays another
    engine's cache instead and returns a `caches.EnginesReport`.
    """
    if engine is not None or engine_params:  # another engine's cache model: strata_lab.caches
        from strata_lab.caches.replay import replay_one_engine

        return replay_one_engine(dump, engine, engine_params, tokenizer=tokenizer, cost_model=cost_model,
                                 progress=progress)
    if model not in MODELS:
        raise ValueError(f"model must be one of {MODELS}, got {model!r}")
    if full_hit not in FULL_HIT_RULES:
        raise ValueError(f"full_hit must be one of {FULL_HIT_RULES}, got {full_hit!r}")
    # snapshot size for specs parsed here: recurrent state on a hybrid model, just logits on attention
    snap_bytes = DEFAULT_SNAPSHOT_BYTES if model == "hybrid" else ATTENTION_SNAPSHOT_BYTES
    if isinstance(policy, str):
        policy = parse_policy(policy, bytes_per_snapshot=snap_bytes)
    if not isinstance(policy, Policy):
        raise ValueError(f"policy must be a Policy or a spec string, got {policy!r}")
    ckpt = policy.checkpoint_policy if policy.checkpoint_policy is not None else checkpoint_policy
    if isinstance(ckpt, str):
        ckpt = ckpt if ckpt == "recorded" else parse_checkpoint_policy(ckpt, bytes_per_snapshot=snap_bytes)
    if ckpt is None:
        ckpt = TurnStart(bytes_per_snapshot=snap_bytes)
    if isinstance(tokenizer, str):
        from strata_lab.text.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(tokenizer)
    tok = tokenizer
    records = dump.records() if isinstance(dump, Dump) else load_dump(dump).records()
    if cost_model is None:
        cost_model = _fit_cost(records)

    it = records
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(records, desc=f"replay {policy.name}", unit="call")

    states: dict[str, SessionState] = {}
    rewriter = _Rewriter(policy, tok) if policy_changes_prompts(policy) else None
    peak_bytes: dict[str, int] = {}
    rows: list[dict] = []
    recorded_ms = 0.0
    have_recorded_ms = False
    for rec in it:
        sid = str(rec["session"])
        st = states.get(sid)
        first = st is None
        if first:
            st = states[sid] = SessionState(model=model, policy=ckpt if isinstance(ckpt, CheckpointPolicy)
                                            else TurnStart(bytes_per_snapshot=snap_bytes), full_hit=full_hit)
            peak_bytes[sid] = 0
        prompt = rewriter.prompt(rec, st) if rewriter is not None else rec["prompt_ids"]
        held = st.held
        held_before = len(held)
        lcp = lcp_len(prompt, held)
        div = find_divergence(held, prompt, tok, lcp_ids=lcp, context_chars=context_chars) if held else None
        target = reuse_target(len(prompt), held_before, lcp, full_hit, st.checkpoints)
        reused = predict_reuse(prompt, held, st.checkpoints, model=model, full_hit=full_hit, lcp=lcp)
        cause = classify(held=held, prompt=prompt, segments=st.segments, div=div, reused=reused, target=target,
                         tok=tok, first_call=first)
        pred = st.call(prompt)
        assert pred.reused == reused  # one rule, two call sites
        gen, drained = rec["gen_ids"], rec["drained_ids"]
        st.finish(gen, drained)
        if ckpt == "recorded":  # both models: an attention-only snapshot's logits serve a full hit
            st.checkpoints.clear()
            st.checkpoints.update((int(c), None) for c in rec["checkpoints"] if 0 < int(c) <= len(st.held))
        if rewriter is not None:
            rewriter.finish(rec, prompt)
        snap = st.snapshot_bytes()
        peak_bytes[sid] = max(peak_bytes[sid], snap)

        lcp_text = div.lcp_text if div is not None else 0
        useful = min(lcp_text, held_before, target if lcp_text >= len(prompt) else lcp_text)
        reread = max(useful - pred.reused, 0)
        read = len(prompt) - pred.reused
        t = rec["timings"].get("prefill_ms")
        if isinstance(t, (int, float)):
            recorded_ms += float(t)
            have_recorded_ms = True
        recorded_reused = rec.get("reused")
        rows.append({
            "session": sid, "index": st.calls - 1, "request_id": rec.get("request_id"), "call": rec.get("call", 0),
            "ts": rec.get("ts"), "prompt_len": len(prompt), "held_before": held_before, "lcp_ids": lcp,
            "lcp_text": lcp_text, "reused": pred.reused,
            "recorded_reused": recorded_reused if isinstance(recorded_reused, int) and not policy_changes_prompts(policy)
            and not isinstance(recorded_reused, bool) else None,
            "read": read, "reread": reread, "cause": cause, "checkpoint_gap": max(target - pred.reused, 0),
            "snapshots": len(st.checkpoints), "snapshot_mib": snap / 2**20,
            "gen_len": len(gen), "drained_len": len(drained),
            "prefill_ms": float(t) if isinstance(t, (int, float)) else math.nan,
            "prefill_s": cost_model.seconds(read, pred.reused) if cost_model else math.nan,
            "reread_s": cost_model.seconds(reread, pred.reused) if cost_model else math.nan,
            "id_context_held": div.id_context_held if div else "", "id_context_prompt": div.id_context_prompt if div else "",
            "text_context_held": div.text_context_held if div else "",
            "text_context_prompt": div.text_context_prompt if div else "",
            "held_ids_at": div.held_ids_at if div else (), "prompt_ids_at": div.prompt_ids_at if div else (),
        })
    recorded_prefill_s = recorded_ms / 1000.0 if have_recorded_ms and not policy_changes_prompts(policy) \
        and policy.checkpoint_policy is None else None
    return Report(rows, policy=policy, model=model, cost_model=cost_model,
                  snapshot_bytes=sum(peak_bytes.values()), recorded_prefill_s=recorded_prefill_s)


def policy_changes_prompts(policy: Policy) -> bool:
    return policy.reply_ids or policy.keep_drained


def compare_policies(dump, policies: Iterable[Policy | str] = ("recorded", "keep-drained", "every:256"),
                     **kwargs):
    """Replay the same dump under several policies; one row per policy (a pandas DataFrame):
    total read, reread, hit rate, snapshot memory, predicted prefill seconds and reread seconds.

    The cost model is fitted once, on the recorded calls, and shared by every policy.
    """
    import pandas as pd

    dump = load_dump(dump)
    if kwargs.get("cost_model") is None:
        kwargs["cost_model"] = _fit_cost(dump.records())
    rows = []
    for p in policies:
        r = replay(dump, policy=p, **kwargs)
        rows.append({"policy": r["policy"], "calls": r["calls"], "prompt_tokens": r["prompt_tokens"],
                     "reused": r["reused"], "read": r["read"], "reread": r["reread"], "hit_rate": r["hit_rate"],
                     "snapshot_mib": r["snapshot_mib"], "prefill_s": r["predicted_prefill_s"],
                     "reread_s": r["reread_s"]})
    return pd.DataFrame(rows)
