"""strata's SGLang model against SGLang's own radix tree and KV allocator, driven in-process
(`strata_lab/validate/sglang_oracle.py`; `pytest -m live`, `STRATA_SGLANG_PYTHON`: a Python that imports
sglang 0.5.23, docs/FIDELITY.md says how it is made)."""
from __future__ import annotations

from pathlib import Path

import pytest

DUMPS = Path(__file__).parents[1] / "dumps"
SPECS = ["sglang", "sglang:page_size=16", "sglang:max_total_tokens=1500",
         "sglang:eviction_policy=lfu,max_total_tokens=1500", "sglang:eviction_policy=fifo,max_total_tokens=1500"]


def test_oracle_job_carries_the_spec():
    from strata_lab.caches.presets import parse_engine
    from strata_lab.validate.sglang_check import dump_rows, oracle_job

    rows = dump_rows(DUMPS / "agent.jsonl")
    job = oracle_job(rows, parse_engine("sglang:page_size=16,max_total_tokens=3008,eviction_policy=lfu"))
    assert (job["page_size"], job["max_total_tokens"], job["eviction_policy"], job["tree"]) == (16, 3008, "lfu", "unified")
    assert [c["prompt"] for c in job["calls"]] == [r[0].prompt for r in rows]
    assert [c["output"] for c in job["calls"]] == [r[1] for r in rows]
    with pytest.raises(ValueError, match="tree must be one of"):
        oracle_job(rows, parse_engine("sglang"), tree="hicache")


def test_oracle_without_sglang_says_how_to_get_it(monkeypatch, tmp_path):
    from strata_lab.validate.sglang_check import dump_rows, run_oracle_many

    monkeypatch.setenv("STRATA_SGLANG_PYTHON", str(tmp_path / "missing" / "python"))
    with pytest.raises(RuntimeError, match="STRATA_SGLANG_PYTHON"):
        run_oracle_many([(dump_rows(DUMPS / "agent.jsonl"), "sglang")])


@pytest.mark.live
def test_live_sglang_oracle_dumps_and_agent_sessions():
    from strata_lab.validate.compare import compare
    from strata_lab.validate.sglang_check import dump_rows, run_oracle_many, sglang_python
    from strata_lab.validate.vllm_check import _synthetic
    from strata_lab.validate.workloads import agent_workload, drive

    if sglang_python() is None:
        pytest.skip("SGLang not installed (set STRATA_SGLANG_PYTHON to a Python that imports sglang 0.5.23)")
    workloads = [dump_rows(DUMPS / f"{n}.jsonl") for n in ("agent", "thinking", "webui")]
    workloads.append(drive(agent_workload(seed=1, sessions=5, turns=6, system_len=120, turn_len=40, max_tokens=9),
                           _synthetic(0)))
    runs = [(rows, spec) for rows in workloads for spec in SPECS]
    for (_rows, spec), (rows, version) in zip(runs, run_oracle_many(runs)):
        assert rows is not None, f"{spec}: {version}"
        assert version.startswith("0.5.23 UnifiedRadixCache"), version
        c = compare(rows, spec, "sglang")
        assert c.exact == c.calls, c.line()
