"""Agent sessions: record one against the server, reproduce a dump through the engine, rewrite it.

* `record(scenario, out)` starts `strata-lab serve` on a free port (the tiny hybrid model unless `model`
  names one, dumping every engine call to `out`) and drives a scripted agent (`strata_lab.sessions.agents`) against it
  with the openai SDK. The script decides the tool calls and their results; the model writes the replies.
* `reproduce(dump)` sends the same prompts through a fresh engine, forcing each call's generated and
  drained ids, and compares the engine's `reused` with the replay's prediction for the same policy (and
  with the recorded `reused` where the dump has one); it names the model it ran on.
* `rewrite(dump, out, policy)` runs the calls under any replay policy: prompts rebuilt as a server with a
  fix would have sent them (reply-id reuse, drained ids kept) and/or other engine checkpoints (header,
  every:N ...), recording a new dump, so every predicted win can be measured on the engine.

    strata-lab record --scenario agent --out dumps/agent.jsonl

Why one module: record, reproduce and rewrite share the engine runner, the model choice and the checks of
a dump's model against the one asked for; split, each half would import the other's internals.

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
import time
from dataclasses import dataclass, field, replace
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
            from strata_lab.rules import CheckpointPolicy

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


def _name_kind(name: str) -> str | None:
    """The model kind a dump's `model` field names ('hybrid' / 'attention'), or None when it names no model
    of strata's engine (an imported log's hosted model, say): `replayer.state.model_kind_of`."""
    from strata_lab.replayer.state import model_kind_of

    return model_kind_of(name)


def _dump_models(records) -> list[str]:
    return sorted({str(r["model"]) for r in records if r.get("model")})


def _recorded_policies(records) -> dict:
    """session -> the CheckpointPolicy its calls were recorded with: the `checkpoint_policy` field the
    engine writes into each line, or for older dumps a guess (header checkpoints when a recorded
    checkpoint sits just before the last <|im_start|> of some prompt, as `strata-lab serve` keeps them)."""
    from strata_lab.replayer.state import before_last_pos
    from strata_lab.rules import IM_START_ID, CheckpointPolicy

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
    """A dump's calls run through the engine under a policy, beside the replay's prediction for the same
    policy (`predicted_reused`) and, where the dump records them, the recorded values (`recorded_reused`,
    None where the dump has no `reused`, e.g. an imported log).

    `imported` says what the dump is when another server served every line (an imported log, a proxy
    capture): there is no recorded run to compare with, and `recorded_read` is None.

    `model` names the model the engine ran, `checkpoints` the checkpoint policy the engine ran with.
    """

    rows: list[dict]
    policy: str = "recorded"
    path: str | None = None        # the dump the engine run wrote, if any
    model: str = ""
    checkpoints: str = ""
    notes: list[str] = field(default_factory=list)
    imported: str = ""             # what the dump is when no engine run of ours recorded it ("an openai log")

    @property
    def matches_prediction(self) -> bool:
        """True when the engine reused exactly what the replay predicted, on every call."""
        return all(r["reused"] == r["predicted_reused"] for r in self.rows)

    @property
    def recorded_compared(self) -> int:
        """Calls whose recorded `reused` is compared (the recorded prompts and checkpoints, a recorded value)."""
        return sum(r["recorded_reused"] is not None for r in self.rows)

    @property
    def exact(self) -> bool:
        """True when the engine matches the replay's prediction on every call and the recorded `reused`
        wherever the dump has one (and the run used the recorded prompts and checkpoints)."""
        return self.matches_prediction and all(r["reused"] == r["recorded_reused"] for r in self.rows
                                               if r["recorded_reused"] is not None)

    @property
    def prefill_ratio(self) -> float:
        """Reproduced over recorded prefill time, over calls that recorded one."""
        rec = sum(r["recorded_prefill_ms"] for r in self.rows if r["recorded_prefill_ms"] == r["recorded_prefill_ms"])
        new = sum(r["prefill_ms"] for r in self.rows if r["recorded_prefill_ms"] == r["recorded_prefill_ms"])
        return new / rec if rec > 0 else math.nan

    def totals(self) -> dict:
        """Sums over calls of prompt_len, reused, read, predicted_reused, recorded_reused and recorded_read
        (calls without a recorded value count as 0 reused)."""
        return {k: sum(r[k] or 0 for r in self.rows) for k in ("prompt_len", "reused", "read", "predicted_reused",
                                                               "recorded_reused", "recorded_read")}

    def summary(self) -> str:
        t = self.totals()
        n = len(self.rows)
        pred = sum(r["reused"] == r["predicted_reused"] for r in self.rows)
        head = (f"{n} calls under {self.policy} on {self.model} (checkpoints: {self.checkpoints}): "
                f"reused {t['reused']}, read {t['read']}; the engine matches the replay's prediction on "
                f"{pred}/{n} calls")
        k = self.recorded_compared
        if k:
            same = sum(r["reused"] == r["recorded_reused"] for r in self.rows if r["recorded_reused"] is not None)
            head += f"; {same}/{k} calls reproduce the recorded reused exactly"
        elif self.policy == "recorded":
            head += f"; the dump records no reused to compare ({self.imported or 'an imported log?'})"
        if self.policy != "recorded":
            head += (f"; no recorded engine run to compare reads with ({self.imported}: its lines carry no "
                     "reused of ours)" if self.imported else
                     f"; {t['recorded_read'] - t['read']} fewer tokens read than recorded")
        ratio = self.prefill_ratio
        if ratio == ratio:
            head += f"; prefill time x{ratio:.2f} of recorded"
        return head + "".join(f"\n  note: {x}" for x in self.notes)

    def to_frame(self):
        """One row per call (a pandas DataFrame)."""
        import pandas as pd

        return pd.DataFrame(self.rows)

    def __repr__(self) -> str:
        return f"Reproduction({self.summary()})"


def _policy_prompts(records, policy, tok) -> Iterator[tuple[dict, list[int]]]:
    """Each record with the prompt a server under `policy` would have sent (the replay's own rules)."""
    from strata_lab.replayer import PromptRewriter, SessionState

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


def _run(dump, *, policy: str, model, out, threads: int, tokenizer, allow_model_mismatch: bool = False,
         progress: bool = False) -> Reproduction:
    from strata_lab.dump.reader import load_dump
    from strata_lab.dump.writer import Recorder
    from strata_lab.caches.replay import replay
    from strata_lab.replayer import parse_policy
    from strata_lab.rules import checkpoint_spec

    pol = parse_policy(policy) if isinstance(policy, str) else policy
    if pol.checkpoint_policy == "recorded":
        pol = replace(pol, checkpoint_policy=None)
    name = pol.name
    records = load_dump(dump).records()
    named = _dump_models(records)
    # lines another server served (an imported log: `trace_format`; a proxy capture: `fidelity`) record no run of
    # ours: with none of ours, there is no recorded read to compare with
    elsewhere = [r for r in records if "trace_format" in r or "fidelity" in r]
    imported = ""
    if records and len(elsewhere) == len(records):
        fmts = sorted({str(r["trace_format"]) for r in elsewhere if "trace_format" in r})
        imported = f"an imported {'/'.join(fmts)} log" if fmts else "a capture of another engine"
    # an imported log's `model` is the hosted model it was served by, not one of our engine's
    named_kinds = {k for k in map(_name_kind, _dump_models([r for r in records if "trace_format" not in r]))
                   if k is not None}
    notes = []
    path = _model_for(records, model)
    cfg = json.loads((Path(path) / "config.json").read_text()) if (Path(path) / "config.json").is_file() else {}
    kind = "hybrid" if cfg.get("model_type") == "qwen3_next" else "attention"
    if model is not None and named_kinds and kind not in named_kinds and not allow_model_mismatch:
        raise ValueError(f"model: the dump was recorded on {', '.join(named)} ({'/'.join(sorted(named_kinds))}), "
                         f"not on a {kind} model like {model!r}; its recorded reuse follows another rule. Pass "
                         f"allow_model_mismatch=True (--allow-model-mismatch) to run it anyway")
    if model is None and named and not named_kinds:
        notes.append(f"the dump names {', '.join(named)}, not a model of our engine: ran on the embedded {kind} "
                     f"model (choose with --model)")
    if model is not None and named_kinds and kind not in named_kinds:
        notes.append(f"the dump was recorded on {', '.join(named)}; ran on a {kind} model as asked")
    if isinstance(tokenizer, str):
        from strata_lab.text.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(tokenizer)
    recorded_cps = _recorded_policies(records)
    if pol.checkpoint_policy is not None:
        engine_cps = {str(r["session"]): pol.checkpoint_policy for r in records}
    else:
        engine_cps = recorded_cps
    from strata_lab.rules import CheckpointPolicy

    distinct = {engine_cps.get(str(r["session"]), CheckpointPolicy()) for r in records}
    predict_cp = next(iter(distinct)) if len(distinct) == 1 else "recorded"
    checkpoints = "as recorded per session" if predict_cp == "recorded" else str(predict_cp)
    if pol.checkpoint_policy is None:
        checkpoints += ", as the dump recorded" if recorded_cps else ", the engine default (the dump names none)"
    runner = _EngineRunner(path, threads=threads, policies=engine_cps)
    if model is None and named_kinds and not any(n in runner.name for n in named):
        notes.append(f"the dump names {', '.join(named)}; ran on {runner.name}, the embedded model of that kind "
                     f"(choose another with --model)")
    prompt_policy = replace(pol, checkpoint_policy=None, name="recorded") if not pol.changes_prompts else \
        replace(pol, checkpoint_policy=None)
    predicted = replay(dump, "strata", kind=kind, policy=prompt_policy, tokenizer=tokenizer,
                       checkpoints=predict_cp if predict_cp == "recorded" else checkpoint_spec(predict_cp))
    predicted_rows = sorted(predicted.rows, key=lambda r: r["index"])   # the report is in arrival order
    if len(predicted_rows) != len(records):
        raise RuntimeError(f"the replay has {len(predicted_rows)} rows for {len(records)} calls")
    pairs = ((r, list(r["prompt_ids"])) for r in records) if not pol.changes_prompts else \
        _policy_prompts(records, prompt_policy, tokenizer)
    as_recorded = not pol.changes_prompts and pol.checkpoint_policy is None
    rows = []
    rec_out = Recorder(out) if out is not None else None
    bar = None
    if progress:
        from strata_lab.progress import progress_bar

        bar = progress_bar(total=len(records), desc=f"engine run ({name})", unit="call", tick=1.0)
    try:
        for (rec, prompt), pred in zip(pairs, predicted_rows):
            gen, drained = list(rec["gen_ids"]), list(rec["drained_ids"])
            got = runner.call(str(rec["session"]), prompt, gen + drained)
            t = rec["timings"].get("prefill_ms")
            rr = rec.get("reused")
            recorded_reused = rr if isinstance(rr, int) and not isinstance(rr, bool) else None
            rows.append({"session": str(rec["session"]), "request_id": rec.get("request_id"),
                         "call": rec.get("call", 0), "prompt_len": len(prompt),
                         "recorded_prompt_len": len(rec["prompt_ids"]), "reused": got["reused"],
                         "predicted_reused": int(pred["reused"]),
                         "recorded_reused": recorded_reused if as_recorded else None,
                         "read": len(prompt) - got["reused"],
                         "recorded_read": None if imported else len(rec["prompt_ids"]) - (recorded_reused or 0),
                         "prefill_ms": got["prefill_ms"],
                         "recorded_prefill_ms": float(t) if isinstance(t, (int, float)) else math.nan})
            if rec_out is not None:
                rec_out.write_call(session=str(rec["session"]), prompt_ids=prompt, reused=got["reused"],
                                   gen_ids=gen, drained_ids=drained, finish=rec.get("finish", "stop"),
                                   prefill_ms=got["prefill_ms"], decode_ms=got["decode_ms"],
                                   checkpoints=got["checkpoints"], request_id=rec.get("request_id"),
                                   call=rec.get("call", 0), model=runner.name)
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
        if rec_out is not None:
            rec_out.close()
    return Reproduction(rows, policy=name, path=str(out) if out is not None else None, model=runner.name,
                        checkpoints=checkpoints, notes=notes, imported=imported)


def reproduce(dump, *, model=None, out=None, threads: int = 1, tokenizer="qwen3", policy: str = "recorded",
              allow_model_mismatch: bool = False, progress: bool = False) -> Reproduction:
    """Run a dump's prompts through a fresh engine, each call forced to the recorded generated + drained
    ids, and compare the engine's reuse with the replay's prediction for the same policy, and with the
    recorded `reused` where the dump has it.

    Args:
        dump: a strata-dump/1 path, paths or `Dump` (an imported log's `Trace.to_dump` works too).
        model: a model folder, 'hybrid' / 'attention' (the embedded tiny models), or None (the kind the dump's
            `model` field names; the embedded hybrid model when it names none). The summary names it.
        out: write the engine run here as a dump (None: do not write).
        threads: engine threads.
        tokenizer: a Tokenizer or a name, for prompt rewrites and the replay's causes.
        policy: any replay policy ('recorded', 'header', 'every:64', 'reply-ids', 'fixes+header', ...):
            prompt policies rebuild the prompts, checkpoint policies set the engine's checkpoints
            ('recorded': the dump's own prompts and checkpoint policy).
        allow_model_mismatch: run on `model` even when the dump was recorded on another model kind
            (otherwise a ValueError).
        progress: a progress bar on stderr.
    """
    return _run(dump, policy=policy, model=model, out=out, threads=threads, tokenizer=tokenizer,
                allow_model_mismatch=allow_model_mismatch, progress=progress)


def rewrite(dump, out, *, policy: str = "reply-ids", model=None, threads: int = 1, tokenizer="qwen3",
            allow_model_mismatch: bool = False, progress: bool = False) -> Reproduction:
    """Run the dump's calls under `policy` through the engine (replies forced as recorded), writing the new
    session to `out`, so that every win a replay policy predicts can be measured on the engine.

    Args:
        dump: a strata-dump/1 path, paths or `Dump`.
        out: the dump file the engine run is written to.
        policy: any replay policy except 'recorded': prompt policies (reply-ids, keep-drained, fixes),
            checkpoint policies (header, every:N, at:P, budget:MIB, none, before-last:ID) or both joined
            with '+'.
        model, threads, tokenizer, allow_model_mismatch, progress: as for `reproduce`.
    """
    from strata_lab.replayer import parse_policy

    pol = parse_policy(policy) if isinstance(policy, str) else policy
    if not pol.changes_prompts and pol.checkpoint_policy in (None, "recorded"):
        raise ValueError(f"policy: rewrite needs a policy that changes prompts or checkpoints (reply-ids, "
                         f"keep-drained, fixes, header, every:N, ...), got {pol.name!r}; use reproduce for "
                         f"the recorded calls")
    return _run(dump, policy=pol, model=model, out=out, threads=threads, tokenizer=tokenizer,
                allow_model_mismatch=allow_model_mismatch, progress=progress)


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
           header_checkpoint: bool = True, base_url: str | None = None, progress: bool = False) -> Recorded:
    """Record a scripted session ('agent', 'thinking' or 'webui', see strata_lab.sessions.agents) into `out`.

    `stop_latency`: engine steps a STOP takes to land (default: 2 for 'thinking', whose budget STOPs then
    leave drained ids, else 0). `header_checkpoint=False` runs the server with only turn-start checkpoints
    (`--no-header-checkpoint`), which keeps template-rewrite misses visible in the recording.
    `progress`: a bar on stderr, drawn while the server starts and stepped per request answered.

    Starts the server itself (dumping to `out`) unless `base_url` points at one already running, in which
    case that server's own --dump file receives the calls and `out` must be None.
    """
    from strata_lab.sessions.agents import SCENARIOS, ScriptConfig, run_script
    from strata_lab.dump.reader import load_dump

    if scenario not in SCENARIOS:
        raise ValueError(f"scenario must be one of {sorted(SCENARIOS)}, got {scenario!r}")
    from strata_lab.progress import progress_bar

    cfg = ScriptConfig(turns=turns, max_tokens=max_tokens, seed=seed)
    if base_url is not None:
        if out is not None:
            raise ValueError("out: with base_url the server's own --dump file records the session; pass out=None")
        t0 = time.perf_counter()
        with progress_bar(enabled=progress, desc=f"record {scenario}", unit="request", tick=1.0) as bar:
            n = run_script(scenario, base_url, cfg, on_request=bar.update)
        return Recorded("(server dump)", scenario, reply_id_reuse, n, -1, time.perf_counter() - t0)
    out = Path(out)
    if out.exists():
        raise ValueError(f"out: {out} exists; recordings append, so choose a new file")
    t0 = time.perf_counter()
    if stop_latency is None:
        stop_latency = 2 if scenario == "thinking" else 0
    with progress_bar(enabled=progress, desc=f"record {scenario}", unit="request", tick=1.0) as bar:
        bar.set_postfix_str("starting the server")
        with serve(model=model, dump=out, reply_id_reuse=reply_id_reuse, threads=threads,
                   stop_latency=stop_latency, header_checkpoint=header_checkpoint) as url:
            bar.set_postfix_str("server up")
            n = run_script(scenario, url, cfg, on_request=bar.update)
    calls = len(load_dump(out).records()) if out.exists() else 0
    return Recorded(str(out), scenario, reply_id_reuse, n, calls, time.perf_counter() - t0)
