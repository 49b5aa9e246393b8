"""sessions: reproduce and rewrite dumps through the real engine (tiny models, real Qwen vocab);
record against the real server when it is part of this build."""
import glob
import os

import pytest

from strata_lab.sessions.agents import ScriptConfig, run_script
from strata_lab.dump.writer import Recorder
from strata_lab.caches.replay import replay

pytest.importorskip("strata_lab._engine")
from strata_lab.sessions.runs import Reproduction, reproduce, rewrite  # noqa: E402


def _reused(report) -> list[int]:
    """A replay's reused per call, in dump order (the report is in arrival order)."""
    return [r["reused"] for r in sorted(report.rows, key=lambda r: r["index"])]


@pytest.fixture(scope="module")
def synthetic(qwen3, tmp_path_factory):
    """Three calls of one session, as a hybrid engine would have served them: a reply written in pieces BPE
    merges, then drained ids the next prompt lacks."""
    tok = qwen3
    path = tmp_path_factory.mktemp("s") / "syn.jsonl"
    p1 = tok.encode("<|im_start|>user\nsay it<|im_end|>\n<|im_start|>assistant\n")
    reply = tok.encode("Hi") + [130947, 5855] + tok.encode(" is here and more text") + [tok.im_end_id]
    p2 = p1 + tok.encode("Hi öğrenci is here and more text<|im_end|>\n<|im_start|>user\nmore<|im_end|>\n"
                         "<|im_start|>assistant\n")
    p3 = p2 + tok.encode("ok<|im_end|>\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n")
    with Recorder(path) as rec:
        rec.write_call(session="s", prompt_ids=p1, reused=0, gen_ids=reply, prefill_ms=10, model="qwen3_next")
        rec.write_call(session="s", prompt_ids=p2, reused=len(p1), gen_ids=tok.encode("ok"),
                       drained_ids=tok.encode(" and"), prefill_ms=9, model="qwen3_next")
        rec.write_call(session="s", prompt_ids=p3, reused=len(p2), prefill_ms=8, model="qwen3_next")
    return path


@pytest.mark.parametrize("kind", ["hybrid", "attention"])
def test_engine_run_reproduces_and_replay_agrees(synthetic, tmp_path, qwen3, kind):
    engine_dump = tmp_path / "engine.jsonl"
    if kind == "attention":   # the dump names a hybrid model: refused unless asked
        with pytest.raises(ValueError, match="allow_model_mismatch"):
            reproduce(synthetic, model=kind)
    first = reproduce(synthetic, model=kind, out=engine_dump, allow_model_mismatch=kind == "attention")
    assert isinstance(first, Reproduction) and first.path == str(engine_dump)
    assert first.matches_prediction   # the engine does what the replay predicts for its model
    assert first.exact == (kind == "hybrid")  # the synthetic dump follows the hybrid rule
    again = reproduce(engine_dump)  # model from the dump's own `model` field
    assert again.exact and "3/3 calls reproduce the recorded reused exactly" in again.summary()
    assert again.model.startswith("qwen3_next:" if kind == "hybrid" else "qwen3:") and again.model in again.summary()
    assert again.prefill_ratio > 0
    frame = again.to_frame()
    assert list(frame["read"]) == list(frame["recorded_read"])
    rep = replay(engine_dump, "strata", tokenizer=qwen3, kind=kind, checkpoints="recorded")
    assert rep["calls_differ"] == 0 and rep["reported_calls"] == 3
    assert rep["causes"].get("retokenized_reply") == 1


def test_rewrite_under_fixes_reads_less(synthetic, tmp_path, qwen3):
    base = tmp_path / "base.jsonl"
    reproduce(synthetic, model="hybrid", out=base)
    before = replay(base, "strata", tokenizer=qwen3, checkpoints="recorded")
    for policy, causes_gone in [("reply-ids", "retokenized_reply"), ("fixes", "drained_dropped")]:
        out = tmp_path / f"{policy}.jsonl"
        r = rewrite(base, out, policy=policy)
        assert r.policy == policy and sum(r.totals()[k] for k in ("read",)) < r.totals()["recorded_read"]
        after = replay(out, "strata", tokenizer=qwen3, checkpoints="recorded")
        assert after["calls_differ"] == 0
        assert after["reread"] < before["reread"] and causes_gone not in after["causes"]
    with pytest.raises(ValueError, match="policy"):
        rewrite(base, tmp_path / "x.jsonl", policy="recorded")
    # checkpoint policies run on the engine too, and the engine does what the replay predicts
    for policy in ("every:16", "header", "fixes+header"):
        r = rewrite(base, tmp_path / f"{policy}.jsonl", policy=policy, tokenizer=qwen3)
        pred = replay(base, "strata", tokenizer=qwen3, policy=policy, kind="hybrid")
        assert r.matches_prediction and [x["reused"] for x in r.rows] == _reused(pred), policy


_SHIPPED = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "dumps", "*.jsonl")))


@pytest.mark.parametrize("path", _SHIPPED, ids=[os.path.basename(p) for p in _SHIPPED])
def test_counterfactual_prompts_match_the_engine_on_shipped_dumps(path, tmp_path, qwen3):
    # the replay's counterfactual (wrap-up calls built from ids, one remember_reply per request) predicts
    # what the engine reuses when it is sent those prompts, on every call; and reply-id reuse never re-reads
    # more than the recording (thinking.jsonl used to: 240 -> 254, from re-encoding the wrap-up prompts)
    base = replay(path, "strata", tokenizer=qwen3, kind="hybrid", checkpoints="turn")
    for policy in ("reply-ids", "fixes"):
        r = rewrite(path, tmp_path / f"{policy}.jsonl", policy=policy, tokenizer=qwen3)
        pred = replay(path, "strata", tokenizer=qwen3, policy=policy, kind="hybrid", checkpoints="turn")
        assert [row["reused"] for row in r.rows] == _reused(pred), policy
        assert pred["reread"] <= base["reread"], policy


def test_header_checkpoints_measured_on_the_engine(tmp_path, qwen3):
    """The biggest predicted win on the shipped agent dump (header checkpoints) runs on the engine: the
    engine's reuse equals the prediction, and it reads less than the recording."""
    path = os.path.join(os.path.dirname(__file__), "..", "dumps", "agent.jsonl")
    r = rewrite(path, tmp_path / "header.jsonl", policy="header", tokenizer=qwen3)
    pred = replay(path, "strata", tokenizer=qwen3, policy="header", kind="hybrid")
    assert [x["reused"] for x in r.rows] == _reused(pred)
    assert r.totals()["read"] < r.totals()["recorded_read"]
    assert "header" in r.summary() and r.model in r.summary()


def test_reproduce_an_imported_log_compares_with_the_prediction(tmp_path, qwen3):
    """An imported trace records no `reused`: reproduce compares the engine with the replay's prediction
    (it used to compare with zeros: '9/28 calls reproduce', exit 1) and names the model it ran on."""
    import warnings

    from strata_lab import load_trace
    from strata_lab.cli import main
    from strata_lab.traces import TraceWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)
        dump = load_trace(os.path.join(os.path.dirname(__file__), "..", "dumps", "logs", "openai.jsonl")).to_dump(
            qwen3, out=tmp_path / "imported.jsonl")
    r = reproduce(dump, tokenizer=qwen3)
    assert r.recorded_compared == 0 and r.exact and r.matches_prediction
    assert sum(x["reused"] for x in r.rows) > 0
    assert "records no reused" in r.summary() and r.model in r.summary() and "embedded" in r.model
    assert main(["reproduce", str(tmp_path / "imported.jsonl"), "-q"]) == 0


def test_script_config_validates():
    with pytest.raises(ValueError, match="max_tokens"):
        ScriptConfig(max_tokens=0)
    with pytest.raises(ValueError, match="scenario"):
        run_script("chess", "http://127.0.0.1:9/v1")


def _has_server():
    from strata_lab.cli import build_parser

    return "serve" in build_parser()._subparsers._group_actions[0].choices


server = pytest.mark.skipif(not _has_server(), reason="this build has no `strata-lab serve`")


@server
def test_record_webui_session_against_the_server(tmp_path, qwen3):
    from strata_lab.dump.reader import load_dump
    from strata_lab.sessions.runs import record

    out = tmp_path / "webui.jsonl"
    rec = record("webui", out, turns=2, max_tokens=6, seed=3)
    assert rec.requests == 6 and rec.calls == 6 and rec.path == str(out)
    recs = load_dump(out).records()
    # the n_predict: 0 warm-ups only read their prompt
    assert [len(r["gen_ids"]) == 0 for r in recs] == [True, True, False, True, True, False]
    rep = replay(out, "strata", tokenizer=qwen3, checkpoints="recorded")
    assert rep["calls_differ"] == 0 and rep["reported_calls"] == 6
    assert reproduce(out).exact
    with pytest.raises(ValueError, match="out"):
        record("webui", out)  # never appends to an existing recording


@server
def test_demo_cli(tmp_path, capsys):
    from strata_lab.cli import main

    png = tmp_path / "demo.png"
    assert main(["demo", "--png", str(png), "--out-dir", str(tmp_path / "d"), "--turns", "2"]) == 0
    out = capsys.readouterr().out
    assert "reply-id reuse off" in out and "reply-id reuse on" in out and "reread" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["agent-reuse-off.jsonl", "agent-reuse-on.jsonl"]
