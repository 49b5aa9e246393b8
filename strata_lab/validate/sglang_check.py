"""Check strata's SGLang model against SGLang itself: the in-process oracle (SGLang's own radix tree and KV
allocator driven as the scheduler drives them, `sglang_oracle.py`; no model, no server, no GPU).

SGLang lives in its own environment: `STRATA_SGLANG_PYTHON` names its Python (else this one, if it imports
sglang). docs/FIDELITY.md says how that environment is made.

The engine is configured from strata's spec (`sglang:page_size=16,max_total_tokens=3000,...`): the same
page size, eviction policy and token budget (`--page-size`, `--radix-eviction-policy`, `--max-total-tokens`).
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from strata_lab.validate.workloads import Request, drive

__all__ = ["sglang_python", "oracle_job", "run_oracle", "run_oracle_many", "dump_rows"]

_ORACLE = Path(__file__).with_name("sglang_oracle.py")
TREES = ("unified", "radix")


def sglang_python() -> str | None:
    """A Python that imports sglang, or None."""
    env = os.environ.get("STRATA_SGLANG_PYTHON")
    if env:
        return env if shutil.which(env) or os.path.exists(env) else None
    return sys.executable if importlib.util.find_spec("sglang") is not None else None


def oracle_job(rows, preset, tree: str = "unified") -> dict:
    """The oracle's job for calls served as `rows` [(request, output, _)] by an engine configured as `preset`
    (a `strata_lab.caches.sglang.Preset`)."""
    if tree not in TREES:
        raise ValueError(f"tree must be one of {TREES}, got {tree!r}")
    if preset.shape.hybrid:
        raise ValueError("the SGLang oracle drives the full-attention tree only (the preset's model is hybrid)")
    return {"page_size": preset.page_size, "max_total_tokens": preset.capacity_tokens(),
            "eviction_policy": preset.eviction_policy, "tree": tree,
            "calls": [{"prompt": list(req.prompt), "output": list(out), "salt": req.salt} for req, out, _ in rows]}


def dump_rows(path) -> list:
    """The calls of a dump as served rows, with the outputs it recorded: [(request, output, None)]."""
    from strata_lab.caches.call_ids import calls_from_dump

    return [(Request(c.session, c.prompt.tolist(), max(len(c.output), 1), c.cache_salt), c.output.tolist(), None)
            for c in calls_from_dump(path)]


def run_oracle_many(runs, *, tree: str = "unified", python: str | None = None, timeout: float = 1800):
    """Several (rows, spec) runs with one SGLang process (`rows`: [(request, output, _)], `spec`: a
    `sglang:...` engine spec); per run (rows with SGLang's cached tokens as the report, version) or
    (None, error text)."""
    from strata_lab.caches.presets import parse_engine

    jobs = []
    for rows, spec in runs:
        preset = parse_engine(spec)
        if preset.engine != "sglang":
            raise ValueError(f"the SGLang oracle needs a sglang spec, got {spec!r}")
        jobs.append(oracle_job(rows, preset, tree))
    python = python or sglang_python()
    if python is None:
        raise RuntimeError("SGLang is not installed: set STRATA_SGLANG_PYTHON to a Python that imports sglang")
    r = subprocess.run([python, str(_ORACLE)], input=json.dumps({"jobs": jobs}), capture_output=True, text=True,
                       timeout=timeout, env=dict(os.environ, PYTHONHASHSEED="0", PYTHONWARNINGS="ignore"))
    if r.returncode != 0:
        raise RuntimeError(f"SGLang oracle failed (rc {r.returncode}): {r.stderr.strip()[-2000:]}")
    res = json.loads(r.stdout)
    version = f"{res['version']} {res['tree']}"
    out = []
    for (rows, _spec), got in zip(runs, res["results"]):
        if isinstance(got, dict):
            out.append((None, got["error"]))
        else:
            out.append(([(req, o, rep) for (req, o, _), rep in zip(rows, got)], version))
    return out


def run_oracle(workload, spec: str, *, seed: int = 0, tree: str = "unified", python: str | None = None):
    """Serve `workload` with SGLang's in-process cache code configured as `spec`; returns the rows
    `[(request, output, reported)]` and SGLang's version (with the tree class)."""
    from strata_lab.validate.vllm_check import _synthetic

    rows, version = run_oracle_many([(drive(workload, _synthetic(seed)), spec)], tree=tree, python=python)[0]
    if rows is None:
        raise RuntimeError(version)
    return rows, version
