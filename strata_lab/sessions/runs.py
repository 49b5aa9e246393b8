"""Agent sessions: record one against the server, reproduce a dump through the engine, rewrite it.

* `record(scenario, out)` starts `strata-lab serve` on a free port (the tiny hybrid model unless `model`
  names one, dumping every engine call to `out`) and drives a scripted agent (`strata_lab.sessions.agents`) against it
  with the openai SDK. The script decides the tool calls and their results; the model writes the replies.
* `reproduce(dump)` sends the same prompts through a fresh engine, forcing each call's generated and
  drained ids, and reports whether `reused` and `read` reproduce exactly and how the prefill timings compare.
* `rewrite(dump, out, policy)` rebuilds the prompts as a server with a fix would have sent them (reply-id
  reuse, drained ids kept) and runs them through the engine the same way, recording a new dump.

    strata-lab record --scenario agent --out dumps/agent.jsonl

>>> import tempfile, os
>>> from strata_lab import load_tokenizer
>>> from strata_lab.dump.writer import Recorder
>>> tok = load_tokenizer("qwen3")
>>> path = os.path.join(tempfile.mkdtemp(), "d.jsonl")
>>> p1 = tok.encode("<|im_start|>user\\nhi<|im_end|>\\n<|im_start|>assistant\\n")
>>> with Recorder(path) as rec:
...     rec.write_call(session="s", prompt_ids=p1, reused=0, gen_ids=[220, 14990, tok.im_end_id])
...     rec.write_call(session="s", prompt_ids=p1 + tok.encode(" hello<|im_end|>\\n"), reused=len(p1))
>>> reproduce(path, model="attention").exact
True
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

__all__ = ["record", "reproduce", "rewrite", "serve", "model_kind", "Recorded", "Reproduction"]


# --- models and engines ---------------------------------------------------------------------------------
class _EngineRunner:
    """One loaded model, sessions by name, one call = (prompt, forced ids) -> what the engine did."""

    def __init__(self, path, *, threads: int = 1, policies: dict | None = None):
        self.policies = policies or {}  # session -> CheckpointPolicy (default policy when absent)
        cfg = json.loads((Path(path) / "config.json").read_text())
        self.kind = "hybrid" if cfg.get("model_type") == "qwen3_next" else "attention"
        self.name = f"{cfg.get('model_type')}:{Path(path).name}"
        from strata_lab.engine import Engine

        self._engine = Engine.load(path, threads=threads)
        self._sessions: dict[str, object] = {}

    def call(self, session: str, prompt_ids, force_ids) -> dict:
        s = self._sessions.get(session)
        if s is None:
            from strata_lab.engine import CheckpointPolicy

            s = self._sessions[session] = self._engine.session(
                f"repro-{session}", checkpoints=self.policies.get(session, CheckpointPolicy()))
            s.reset()
        r = s.generate(list(prompt_ids), max_new_tokens=len(force_ids), force_ids=list(force_ids)).result
        return {"reused": r.reused, "prefill_ms": r.prefill_ms, "decode_ms": r.decode_ms,
                "checkpoints": list(r.checkpoints)}


def _model_for(records, model) -> Path:
    from strata_lab.tiny import EMBEDDED_KINDS, embedded_model

    if model is not None and model in EMBEDDED_KINDS:
        return embedded_model(model)
    if model is not None:
        return Path(model)
    return embedded_model(model_kind(records))


def _recorded_policies(records) -> dict:
    """session -> the CheckpointPolicy its calls were recorded with: the `checkpoint_policy` field the
    engine writes into each line, or for older dumps a guess (header checkpoints when a recorded
    checkpoint sits just before the last <|im_start|> of some prompt, as `strata-lab serve` keeps them)."""
    from strata_lab.engine import CheckpointPolicy
    from strata_lab.replayer.state import IM_START_ID, before_last_pos

    policies: dict = {}
    for r in records:
        sid = r.get("session", "default")
        written = r.get("checkpoint_policy")
        if isinstance(written, dict):
            policies.setdefault(sid, CheckpointPolicy(**{**written, "positions": tuple(written.get("positions", ()))}))
            continue
        p = before_last_pos(r["prompt_ids"], IM_START_ID)
        if p is not None and p in set(r.get("checkpoints") or ()):
            policies[sid] = CheckpointPolicy(before_last=IM_START_ID)
    return policies


def model_kind(records) -> str:
    """'attention' or 'hybrid' from the dumps' `model` fields (the replay's model for these calls)."""
    names = " ".join(str(r.get("model", "")) for r in records)
    return "attention" if "attention" in names or ("qwen3" in names and "next" not in names) else "hybrid"


# --- reproduce and rewrite ------------------------------------------------------------------------------
@dataclass
class Reproduction:
    """A dump's calls run again through the engine: recorded vs reproduced reuse, read and prefill time."""

    rows: list[dict]
    policy: str = "recorded"
    path: str | None = None        # the dump the engine run wrote, if any

    @property
    def exact(self) -> bool:
        """True when every call's reused (hence read) equals the recorded one (recorded prompts only)."""
        return all(r["reused"] == r["recorded_reused"] for r in self.rows)

    @property
    def prefill_ratio(self) -> float:
        """Reproduced over recorded prefill time, over calls that recorded one."""
        rec = sum(r["recorded_prefill_ms"] for r in self.rows if r["recorded_prefill_ms"] == r["recorded_prefill_ms"])
        new = sum(r["prefill_ms"] for r in self.rows if r["recorded_prefill_ms"] == r["recorded_prefill_ms"])
        return new / rec if rec > 0 else math.nan

    def totals(self) -> dict:
        return {k: sum(r[k] for r in self.rows) for k in ("prompt_len", "reused", "read", "recorded_reused",
                                                          "recorded_read")}

    def summary(self) -> str:
        t = self.totals()
        same = sum(r["reused"] == r["recorded_reused"] for r in self.rows)
        head = (f"{len(self.rows)} calls under {self.policy}: reused {t['reused']} (recorded {t['recorded_reused']}), "
                f"read {t['read']} (recorded {t['recorded_read']}); ")
        if self.policy == "recorded":
            head += f"{same}/{len(self.rows)} calls reproduce reused exactly"
        else:
            head += f"{t['recorded_read'] - t['read']} fewer tokens read"
        return head + f"; prefill time x{self.prefill_ratio:.2f} of recorded"

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame(self.rows)

    def __repr__(self) -> str:
        return f"Reproduction({self.summary()})"


def _policy_prompts(records, policy, tok) -> Iterator[tuple[dict, list[int]]]:
    """Each record with the prompt a server under `policy` would have sent (the replay's own rules)."""
    from strata_lab.replayer import PromptRewriter, SessionState, parse_policy

    policy = parse_policy(policy) if isinstance(policy, str) else policy
    if policy.checkpoint_policy is not None or not policy.changes_prompts:
        raise ValueError(f"policy: rewrite changes prompts only (reply-ids, keep-drained), got {policy.name!r}")
    states = {}
    rewriter = PromptRewriter(policy, tok)
    for rec in records:
        sid = str(rec["session"])
        st = states.setdefault(sid, SessionState(model="attention"))  # held ids and segments only
        prompt = rewriter.prompt(rec, st)
        st.call(prompt)
        st.finish(rec["gen_ids"], rec["drained_ids"])
        rewriter.finish(rec, prompt)
        yield rec, prompt


def _run(dump, *, policy: str, model, out, threads: int, tokenizer) -> Reproduction:
    from strata_lab.dump.reader import load_dump
    from strata_lab.dump.writer import Recorder

    records = load_dump(dump).records()
    runner = _EngineRunner(_model_for(records, model), threads=threads, policies=_recorded_policies(records))
    if isinstance(tokenizer, str):
        from strata_lab.text.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(tokenizer)
    pairs = ((r, list(r["prompt_ids"])) for r in records) if policy == "recorded" else \
        _policy_prompts(records, policy, tokenizer)
    rows = []
    rec_out = Recorder(out) if out is not None else None
    try:
        for rec, prompt in pairs:
            gen, drained = list(rec["gen_ids"]), list(rec["drained_ids"])
            got = runner.call(str(rec["session"]), prompt, gen + drained)
            t = rec["timings"].get("prefill_ms")
            recorded_reused = rec.get("reused") if isinstance(rec.get("reused"), int) else 0
            rows.append({"session": str(rec["session"]), "request_id": rec.get("request_id"),
                         "call": rec.get("call", 0), "prompt_len": len(prompt),
                         "recorded_prompt_len": len(rec["prompt_ids"]), "reused": got["reused"],
                         "recorded_reused": recorded_reused, "read": len(prompt) - got["reused"],
                         "recorded_read": len(rec["prompt_ids"]) - recorded_reused,
                         "prefill_ms": got["prefill_ms"],
                         "recorded_prefill_ms": float(t) if isinstance(t, (int, float)) else math.nan})
            if rec_out is not None:
                rec_out.write_call(session=str(rec["session"]), prompt_ids=prompt, reused=got["reused"],
                                   gen_ids=gen, drained_ids=drained, finish=rec.get("finish", "stop"),
                                   prefill_ms=got["prefill_ms"], decode_ms=got["decode_ms"],
                                   checkpoints=got["checkpoints"], request_id=rec.get("request_id"),
                                   call=rec.get("call", 0), model=runner.name)
    finally:
        if rec_out is not None:
            rec_out.close()
    return Reproduction(rows, policy=policy, path=str(out) if out is not None else None)


def reproduce(dump, *, model=None, out=None, threads: int = 1, tokenizer="qwen3") -> Reproduction:
    """Run a dump's prompts through a fresh engine, each call forced to the recorded generated + drained
    ids, and compare reused / read / prefill time with the recording. `model`: a model folder,
    'hybrid' / 'attention' (the embedded tiny models), or None (from the dump's `model` field).
    `out` writes the engine run as a dump."""
    return _run(dump, policy="recorded", model=model, out=out, threads=threads, tokenizer=tokenizer)


def rewrite(dump, out, *, policy: str = "reply-ids", model=None, threads: int = 1,
            tokenizer="qwen3") -> Reproduction:
    """Rebuild the dump's prompts under `policy` (reply-ids, keep-drained, fixes) and run them through the
    engine (replies forced as recorded), writing the new session to `out`."""
    if policy == "recorded":
        raise ValueError("policy: rewrite needs a policy that changes prompts (reply-ids, keep-drained, fixes)")
    return _run(dump, policy=policy, model=model, out=out, threads=threads, tokenizer=tokenizer)


# --- recording against the server -----------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve(*, model=None, dump=None, reply_id_reuse: bool = True, threads: int = 1, stop_latency: int = 0,
          header_checkpoint: bool = True, timeout: float = 60.0) -> Iterator[str]:
    """Run `strata-lab serve` in a subprocess on a free port; yields its base URL (…/v1); stops it after."""
    port = _free_port()
    from strata_lab._spawn import child_process_args

    cmd = ["serve", "--port", str(port), "--threads", str(threads),
           "--model", str(Path(_model_for([], model)).resolve())]
    if dump is not None:
        cmd += ["--dump", str(Path(dump).resolve())]
    if not reply_id_reuse:
        cmd += ["--no-reply-reuse"]
    if not header_checkpoint:
        cmd += ["--no-header-checkpoint"]
    if stop_latency:
        cmd += ["--stop-latency", str(stop_latency)]
    log = open(os.devnull, "wb") if os.environ.get("STRATA_SERVE_LOG") is None \
        else open(os.environ["STRATA_SERVE_LOG"], "ab")
    spawn = child_process_args(cmd)
    proc = subprocess.Popen(**spawn, stdout=log, stderr=subprocess.STDOUT)
    cmd = spawn["args"]
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout
        import httpx

        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"strata-lab serve exited with {proc.returncode} (set STRATA_SERVE_LOG=file "
                                   f"to see why): {' '.join(cmd)}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=1.0).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"strata-lab serve did not answer within {timeout} s")
            time.sleep(0.2)
        yield url + "/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@dataclass
class Recorded:
    """What `record` did: where the dump is, how many requests and engine calls, how long it took."""

    path: str
    scenario: str
    reply_id_reuse: bool
    requests: int
    calls: int
    seconds: float
    notes: list[str] = field(default_factory=list)

    def __repr__(self) -> str:
        return (f"Recorded({self.scenario!r}, reply_id_reuse={self.reply_id_reuse}, {self.requests} requests, "
                f"{self.calls} engine calls, {self.seconds:.1f} s -> {self.path})")


def record(scenario: str, out, *, model=None, reply_id_reuse: bool = False, turns: int = 4,
           max_tokens: int = 24, seed: int = 0, threads: int = 1, stop_latency: int | None = None,
           header_checkpoint: bool = True, base_url: str | None = None) -> Recorded:
    """Record a scripted session ('agent', 'thinking' or 'webui', see strata_lab.sessions.agents) into `out`.

    `stop_latency`: engine steps a STOP takes to land (default: 2 for 'thinking', whose budget STOPs then
    leave drained ids, else 0). `header_checkpoint=False` runs the server with only turn-start checkpoints
    (`--no-header-checkpoint`), which keeps template-rewrite misses visible in the recording.

    Starts the server itself (dumping to `out`) unless `base_url` points at one already running, in which
    case that server's own --dump file receives the calls and `out` must be None.
    """
    from strata_lab.sessions.agents import SCENARIOS, ScriptConfig, run_script
    from strata_lab.dump.reader import load_dump

    if scenario not in SCENARIOS:
        raise ValueError(f"scenario must be one of {sorted(SCENARIOS)}, got {scenario!r}")
    cfg = ScriptConfig(turns=turns, max_tokens=max_tokens, seed=seed)
    if base_url is not None:
        if out is not None:
            raise ValueError("out: with base_url the server's own --dump file records the session; pass out=None")
        t0 = time.perf_counter()
        n = run_script(scenario, base_url, cfg)
        return Recorded("(server dump)", scenario, reply_id_reuse, n, -1, time.perf_counter() - t0)
    out = Path(out)
    if out.exists():
        raise ValueError(f"out: {out} exists; recordings append, so choose a new file")
    t0 = time.perf_counter()
    if stop_latency is None:
        stop_latency = 2 if scenario == "thinking" else 0
    with serve(model=model, dump=out, reply_id_reuse=reply_id_reuse, threads=threads,
               stop_latency=stop_latency, header_checkpoint=header_checkpoint) as url:
        n = run_script(scenario, url, cfg)
    calls = len(load_dump(out).records()) if out.exists() else 0
    return Recorded(str(out), scenario, reply_id_reuse, n, calls, time.perf_counter() - t0)
