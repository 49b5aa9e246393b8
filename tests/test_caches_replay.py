"""replay_engines / sl.replay(engine=...) / `strata-lab replay --engine`: shared cache in arrival order,
routing, reported vs simulated, deterministic JSON, and `strata` exact against our engine's dumps."""
import glob
import json
import os

import pytest

import strata_lab as sl
from strata_lab.caches import replay_engines
from strata_lab.cli import main

DUMPS = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "dumps", "*.jsonl")))


@pytest.mark.parametrize("path", DUMPS, ids=[os.path.basename(p) for p in DUMPS])
def test_strata_is_exact_against_our_engine_on_every_shipped_dump(qwen3, path):
    rep = replay_engines(path, ["strata"], tokenizer=qwen3)
    df = rep.frame()
    assert df["reported"].notna().all() and len(df) > 0
    assert (df["reused"] == df["reported"]).all(), df[["index", "reused", "reported"]]
    s = rep.summary().iloc[0]
    assert s["calls_differ"] == 0 and s["simulated_rate"] == s["reported_rate"]
    # the default replay is this one: the engine the dump names, strata with its recorded checkpoints
    default = sl.replay(path, tokenizer=qwen3)
    assert default.specs == rep.specs and default.frame().equals(df)


def _write(path, calls):
    """strata-dump/1 lines as an importer would write them (optional fields: ts, cached_tokens, ...)."""
    with open(path, "w") as f:
        for c in calls:
            f.write(json.dumps({"schema": "strata-dump/1", **c}) + "\n")
    return path


def test_sessions_share_one_cache_in_timestamp_order(tmp_path):
    # written out of order: session b's call arrives first (ts 1) and fills the cache that a reads at ts 2
    path = _write(tmp_path / "d.jsonl", [
        dict(session="a", prompt_ids=list(range(40)) + [1], ts=2.0),
        dict(session="b", prompt_ids=list(range(40)) + [2], ts=1.0),
    ])
    df = replay_engines(path, ["sglang"]).frame()
    assert df["index"].tolist() == [1, 0]
    assert df["reused"].tolist() == [0, 40] and df["source"].tolist()[1] == 1


def test_routing_rules_and_the_routing_cause(tmp_path):
    path = _write(tmp_path / "d.jsonl", [
        dict(session="s", prompt_ids=list(range(100)), gen_ids=[5], ts=0.0),
        dict(session="s", prompt_ids=list(range(100)) + [5, 6], ts=1.0),
    ])
    df = replay_engines(path, ["sglang:replicas=2,routing=round_robin", "sglang:replicas=2,routing=session"]).frame()
    rr, sess = df[df["spec"].str.contains("round")], df[df["spec"].str.contains("session")]
    assert rr["replica"].tolist() == [0, 1] and rr["cause"].tolist() == ["new_session", "routing"]
    assert sess["replica"].tolist() == [0, 0] and sess["reused"].tolist()[1] == 100
    df = replay_engines(path, ["sglang:replicas=4,routing=cache_aware"]).frame()
    assert df["replica"].nunique() == 1 and df["reused"].tolist()[1] == 100


def test_reported_cached_tokens_side_by_side(tmp_path):
    calls = [dict(session="s", prompt_ids=list(range(64)), gen_ids=[1], cached_tokens=0, cache_engine="vllm"),
             dict(session="s", prompt_ids=list(range(64)) + [1, 2, 3], cached_tokens=64, cache_engine="vllm"),
             dict(session="s", prompt_ids=list(range(64)) + [1, 2, 3, 4], cached_tokens=60, cache_engine="vllm")]
    path = _write(tmp_path / "d.jsonl", calls)
    rep = replay_engines(path, ["vllm", "sglang"])
    s = rep.summary().set_index("engine")
    # the serving engine's figure sits beside every simulated engine, labelled with who reported it
    assert s.loc["vllm", "reported_calls"] == 3 and s.loc["sglang", "reported_calls"] == 3
    assert s.loc["vllm", "reported_by"] == s.loc["sglang", "reported_by"] == "vllm"
    assert s.loc["vllm", "calls_differ"] == 1          # 64 simulated where the engine reported 60
    assert s.loc["vllm", "reported_rate"] == pytest.approx(124 / 199)
    assert s.loc["vllm", "reported_diff"] == 4 and s.loc["vllm", "reported_diff_pct"] == pytest.approx(400 / 199)
    assert "reported 124 (62.3%), difference +4 tokens (+2.0% of their prompt tokens), 1 calls differ" \
        in "\n".join(rep.lines())


def test_hosted_prices_are_settable(tmp_path):
    path = _write(tmp_path / "d.jsonl", [dict(session="s", prompt_ids=list(range(2000)), gen_ids=[1, 2], ts=0.0)])
    a = replay_engines(path, ["anthropic"]).frame()["dollars"].iloc[0]
    assert a == pytest.approx((2000 * 3.0 * 1.25 + 2 * 15.0) / 1e6)   # all written (automatic breakpoint)
    b = replay_engines(path, ["anthropic"], prices={"anthropic": {"input_usd_per_mtok": 15.0}}).frame()["dollars"]
    assert b.iloc[0] == pytest.approx((2000 * 15.0 * 1.25 + 2 * 15.0) / 1e6)


def test_sl_replay_dispatches_to_an_engine(qwen3):
    rep = sl.replay(DUMPS[0], engine="vllm", tokenizer=qwen3, block_size=32)
    assert [p.spec() for p in rep.presets] == ["vllm@0.33:block_size=32"]
    assert set(rep.frame()["reused"] % 32) == {0}
    with pytest.raises(ValueError, match="block_size"):
        sl.replay(DUMPS[0], engine="vllm", tokenizer=qwen3, block_size=0)


def test_cli_engines_json_is_deterministic(capsys):
    args = ["replay", DUMPS[0], "--engine", "vllm", "--engine", "sglang", "--engine", "llama.cpp:slots=4",
            "--engine", "anthropic", "--json"]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert main(args) == 0
    assert capsys.readouterr().out == first
    doc = json.loads(first)
    assert [e["spec"] for e in doc["engines"]] == ["vllm@0.33", "sglang@0.5", "llama.cpp@b7000:slots=4",
                                                   "anthropic@2026-11"]
    assert {c["engine"] for c in doc["calls"]} == {"vllm", "sglang", "llama.cpp", "anthropic"}


def test_cli_bad_engine_is_an_error_naming_the_field(capsys):
    assert main(["replay", DUMPS[0], "--engine", "vllm:blok_size=3", "-q"]) == 2
    assert "blok_size" in capsys.readouterr().err


def test_engine_explorer_widget_headless():
    pytest.importorskip("ipywidgets")
    from strata_lab.caches.widget import EngineExplorer

    w = EngineExplorer(DUMPS[0], engines=("vllm", "sglang"))
    assert "vllm@0.33" in w.summary.value and w.image.value[:4] == b"\x89PNG"
    w.overrides.value = "llama.cpp:slots=4"
    w.run()
    assert "llama.cpp@b7000:slots=4" in w.summary.value
    w.overrides.value = "vllm:blok_size=3"
    before = w.summary.value
    assert w.run() is None and "blok_size" in w.error.value and w.summary.value == before


def test_sweeps_and_cli_lint(tmp_path, capsys):
    from strata_lab.caches.sweeps import plot_budget_sweep, sweep_budget

    df = sweep_budget(DUMPS[0], ["vllm", "sglang"], [64, 512, 100000])
    for _, g in df.groupby("engine"):
        assert g["hit_rate"].is_monotonic_increasing and g["hit_rate"].iloc[0] < g["hit_rate"].iloc[-1]
    plot_budget_sweep(df, tmp_path / "sweep.png")
    assert (tmp_path / "sweep.png").stat().st_size > 1000
    out = tmp_path / "fixed.jsonl"
    assert main(["lint", DUMPS[0], "--engine", "vllm", "--fix", str(out)]) == 0
    text = capsys.readouterr().out
    # the shipped agent dump has findings but none a fix can move: nothing is written (it used to write a
    # byte-identical copy); tests/test_caches_lint.py covers a fix that is written
    assert "reasoning_stripped" in text and "nothing to fix" in text and not out.exists()


def test_json_report_is_identical_across_processes_and_hash_seeds(tmp_path):
    import subprocess

    from strata_lab._spawn import child_process_args

    outs = []
    for seed in ("1", "2"):
        path = tmp_path / f"r{seed}.json"
        spawn = child_process_args(["replay", DUMPS[0], "--engine", "vllm", "--engine",
                                    "sglang:replicas=2,routing=cache_aware", "--engine", "anthropic",
                                    "--engine", "strata", "--json", str(path)],
                                   env={**os.environ, "PYTHONHASHSEED": seed})
        subprocess.run(**spawn, capture_output=True, text=True, check=True)
        outs.append(path.read_bytes())
    assert outs[0] == outs[1] and len(outs[0]) > 1000
