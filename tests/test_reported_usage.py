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


def test_the_fields_survive_the_parquet_store_and_old_dumps_still_read(tmp_path):
    from strata_lab.dump import Store, convert_jsonl, load_dump

    dump = load_trace(USAGE / "openai-cached.jsonl").to_dump("qwen3", out=tmp_path / "d.jsonl")
    recs = dump.records()
    assert [r["reported_cached_tokens"] for r in recs] == _reported(USAGE / "openai-cached.jsonl")
    convert_jsonl([str(tmp_path / "d.jsonl")], str(tmp_path / "store"))
    import pyarrow.parquet as pq

    seg = sorted((tmp_path / "store").rglob("*.parquet"))[0]
    t = pq.read_table(seg)
    assert t.column("reported_cached_tokens").to_pylist() == [r["reported_cached_tokens"] for r in recs]
    assert all(e is None or "reported_cached_tokens" not in e for e in t.column("extra").to_pylist())
    st = Store(tmp_path / "store")
    assert st.records() == recs  # identical lines back
    assert st.to_frame()["reported_cached_tokens"].tolist() == [r["reported_cached_tokens"] for r in recs]
    assert load_dump(tmp_path / "d.jsonl").to_frame()["reported_cached_tokens"].tolist() == \
        [r["reported_cached_tokens"] for r in recs]
    # a dump written before Contract 4 (cached_tokens + cache_engine, reported_cache_creation_tokens) reads the same
    old = tmp_path / "old.jsonl"
    with open(old, "w") as f:
        for r in recs:
            r = dict(r)
            r["cached_tokens"] = r.pop("reported_cached_tokens")
            r["reported_cache_creation_tokens"] = 7
            f.write(json.dumps(r) + "\n")
    new_rep = replay_engines(tmp_path / "d.jsonl", ["vllm"]).frame()
    old_rep = replay_engines(old, ["vllm"]).frame()
    assert old_rep["reported"].tolist() == new_rep["reported"].tolist()
    assert old_rep["reported_write"].tolist() == [7] * len(recs)
    assert load_dump(old).to_frame()["reported_cache_write_tokens"].tolist() == [7] * len(recs)


def test_hosted_cache_writes_are_compared_with_the_simulated_writes(tmp_path):
    rows = [dict(session="s", prompt_ids=list(range(2000)), gen_ids=[1, 2], ts=0.0, reported_cached_tokens=0,
                 reported_cache_write_tokens=2000, cache_engine="anthropic"),
            dict(session="s", prompt_ids=list(range(2000)) + [1, 2, 3], ts=5.0, reported_cached_tokens=1990,
                 reported_cache_write_tokens=13, cache_engine="anthropic")]
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"schema": "strata-dump/1", **r}) + "\n" for r in rows))
    rep = replay_engines(path, ["anthropic", "vllm"])
    s = rep.summary().set_index("engine")
    a = s.loc["anthropic"]
    df = rep.frame()
    sim = df[df["engine"] == "anthropic"]
    assert a["reported_write_calls"] == 2 and a["reported_written"] == 2013
    assert a["simulated_written"] == int(sim["written"].sum())
    assert a["reported_cached"] == 1990 and a["simulated_cached"] == int(sim["reused"].sum())
    assert a["reported_diff_pct"] == pytest.approx(100 * (a["simulated_cached"] - 1990) / 4003)
    assert s.loc["vllm", "reported_by"] == "anthropic" and s.loc["vllm", "reported_calls"] == 2
    text = "\n".join(rep.lines())
    assert "vs reported by anthropic on 2 calls" in text and "cache writes on 2 calls" in text


def test_a_bad_reported_figure_is_a_clear_error(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"schema": "strata-dump/1", "prompt_ids": [1, 2], "reported_cached_tokens": "12"}) + "\n")
    with pytest.raises(ValueError, match="reported_cached_tokens must be a non-negative int"):
        replay_engines(path, ["vllm"])


def test_the_engines_plot_shows_the_reported_figures(tmp_path):
    from strata_lab.caches.sweeps import plot_engines

    dump = load_trace(USAGE / "openai-cached.jsonl").to_dump("qwen3", out=tmp_path / "d.jsonl")
    fig = plot_engines(replay_engines(dump, ["vllm", "sglang"]))
    labels = [[t.get_text() for t in ax.get_legend().get_texts()] for ax in fig.axes]
    assert "reported" in labels[0] and "reported" in labels[1]
    xs = [ln for ln in fig.axes[0].get_lines() if ln.get_label() == "reported"][0].get_ydata()
    assert list(xs) == _reported(USAGE / "openai-cached.jsonl")


def test_the_engine_explorer_shows_simulated_vs_reported(tmp_path):
    pytest.importorskip("ipywidgets")
    from strata_lab.caches.widget import EngineExplorer

    dump = load_trace(USAGE / "openai-cached.jsonl").to_dump("qwen3", out=tmp_path / "d.jsonl")
    w = EngineExplorer(dump.paths[0], engines=("vllm",))
    s = w.run()
    assert s.iloc[0]["reported_cached"] == sum(_reported(USAGE / "openai-cached.jsonl"))
    assert "reported_diff_pct" in w.summary.value
