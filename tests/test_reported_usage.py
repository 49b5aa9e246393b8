"""Reported vs simulated cached tokens: what the log says the serving engine cached (and, for hosted APIs,
wrote) travels from the import into the dump, the Parquet store, every engine report, `summary()` and the
plot, per call and per engine (docs/CONTRACTS.md, "Reported cache figures")."""
import json
from pathlib import Path

import pytest

from strata_lab import load_trace
from strata_lab.caches import replay_engines
from strata_lab.cli import main

USAGE = Path(__file__).parent / "fixtures" / "usage"
pytestmark = pytest.mark.filterwarnings("ignore::strata_lab.traces.source.TraceWarning")


def _reported(log):
    return [json.loads(line)["response"]["usage"]["prompt_tokens_details"]["cached_tokens"]
            for line in open(log)]


def test_imported_openai_usage_reaches_the_engine_report(tmp_path, capsys):
    log = USAGE / "openai-cached.jsonl"
    out = tmp_path / "imported.jsonl"
    assert main(["import", str(log), "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["replay", str(out), "--engine", "vllm", "--engine", "sglang", "--json", "-", "--quiet"]) == 0
    doc = json.loads(capsys.readouterr().out)
    want = _reported(log)
    for eng in doc["engines"]:
        assert eng["reported_calls"] == len(want), eng
        assert eng["reported_cached"] == sum(want)
        assert eng["reported_diff"] == eng["simulated_cached"] - eng["reported_cached"]
    calls = [c for c in doc["calls"] if c["engine"] == "vllm"]
    assert sorted((c["index"], c["reported"]) for c in calls) == list(enumerate(want))
    for c in calls:
        assert c["reported_diff"] == c["reused"] - c["reported"]
        assert c["reported_diff_pct"] == pytest.approx(100 * c["reported_diff"] / c["prompt_len"])


def test_replaying_the_log_directly_compares_too(capsys):
    log = USAGE / "openai-cached.jsonl"
    assert main(["replay", str(log), "--engine", "vllm", "--json", "-", "--quiet"]) == 0
    out = capsys.readouterr().out
    doc = json.loads(out[out.index("{"):])
    assert doc["engines"][0]["reported_calls"] == 4
