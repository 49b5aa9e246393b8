"""Engine tier: a recorder observing the engine (attached to it, or by `record_to` / $STRATA_PROMPT_DUMP to every
engine of the process) writes one strata-dump/1 line per call."""
import os
import subprocess
import sys

import pytest

pytest.importorskip("strata_lab._engine")
from strata_lab import load_dump, record_to, replay  # noqa: E402
from strata_lab.engine import Sampling  # noqa: E402
from strata_lab.dump.writer import Recorder  # noqa: E402

PROMPT = [9707, 1879, 13, 220, 14990, 135992, 42, 7]


def test_record_to_writes_one_line_per_call(tiny_engine, tmp_path):
    path = tmp_path / "calls.jsonl"
    s = tiny_engine.session("rec")
    s.reset()
    with record_to(path):
        r1 = s.generate(PROMPT, max_new_tokens=3, sampling=Sampling(temperature=1.0, seed=3)).result
        held = s.held_ids
        ids = list(s.generate(held + [151645, 198], max_new_tokens=2,
                              record_meta={"request_id": "r2", "call": 0}))
        s.generate(held[:4], max_new_tokens=0).result
    s.generate(PROMPT, max_new_tokens=1).result  # after the context manager: not recorded
    recs = list(load_dump(path))
    assert len(recs) == 3
    first, second, third = recs
    assert first["prompt_ids"] == PROMPT and first["gen_ids"] == r1.gen_ids and first["reused"] == 0
    assert first["session"] == "rec" and first["finish"] == "length" and first["schema"] == "strata-dump/1"
    assert second["request_id"] == "r2" and second["gen_ids"] == ids and second["reused"] == len(held)
    assert third["reused"] == 4 - 1 and third["gen_ids"] == []  # cut back; the last prompt id is re-read
    assert all(set(r["timings"]) == {"prefill_ms", "decode_ms"} for r in recs)
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    # the weight-free replay predicts exactly what the engine did
    rep = replay(load_dump(path), engine="strata:kind=attention")
    frame = rep.to_frame()
    assert (frame["reported"] == frame["reused"]).all() and rep["calls_differ"] == 0


def test_stop_reason_budget_is_the_recorded_finish(tiny_engine, tmp_path):
    path = tmp_path / "budget.jsonl"
    s = tiny_engine.session("budget")
    s.reset()
    rec = tiny_engine.add_observer(Recorder(path))
    try:
        stream = s.generate(PROMPT, max_new_tokens=40, sampling=Sampling(temperature=1.0, seed=1), stop_latency=2)
        got = []
        for i in stream:
            got.append(i)
            if len(got) == 3:
                stream.stop(reason="budget")
        r = stream.result
    finally:
        tiny_engine.remove_observer(rec)
        rec.close()
    (line,) = list(load_dump(path))
    assert r.finish == line["finish"] == "budget"
    assert line["drained_ids"] == r.drained_ids and len(r.drained_ids) >= 1
    assert s.held_ids == PROMPT + r.gen_ids + r.drained_ids
    with pytest.raises(ValueError, match="reason"):
        stream.stop(reason="tired")


def test_generate_takes_no_recorder_and_the_innermost_record_to_records(tiny_engine, tmp_path):
    from strata_lab.engine import process_observers

    s = tiny_engine.session("off")
    with pytest.raises(TypeError, match="record"):  # recording is an observer, not a call's parameter
        s.generate(PROMPT, max_new_tokens=1, record=False)
    outer, inner = tmp_path / "outer.jsonl", tmp_path / "inner.jsonl"
    with record_to(outer) as a:
        with record_to(inner) as b:
            assert b in process_observers() and a not in process_observers()
            s.generate(PROMPT, max_new_tokens=1).result
        s.generate(PROMPT, max_new_tokens=2).result
    assert a not in process_observers() and b not in process_observers()
    assert [len(r["gen_ids"]) for r in load_dump(inner)] == [1]
    assert [len(r["gen_ids"]) for r in load_dump(outer)] == [2]


def test_env_var_turns_recording_on(tiny_dir, tmp_path):
    path = tmp_path / "env.jsonl"
    code = ("from strata_lab import Engine; s = Engine.load(%r, threads=1).session('env');"
            "[s.generate([1, 2, 3, 4], max_new_tokens=2).result for _ in range(2)]" % str(tiny_dir))
    from strata_lab._spawn import child_process_args

    spawn = child_process_args([], env={**os.environ, "STRATA_PROMPT_DUMP": str(path)})
    spawn["args"] = [sys.executable, "-c", code]  # the same strata_lab as this test, not the checkout's sources
    subprocess.run(**spawn, check=True)
    recs = list(load_dump(path))
    assert [r["reused"] for r in recs] == [0, 4]  # same prompt again: the turn-start snapshot has its logits


def test_lines_carry_the_checkpoint_policy_and_reproduce_uses_it(tmp_path):
    # a hybrid session with an every-3 policy: reproducing the dump needs that policy to be exact
    from strata_lab import embedded_model
    from strata_lab.engine import Engine
    from strata_lab.rules import CheckpointPolicy
    from strata_lab.sessions.runs import reproduce

    engine = Engine.load(embedded_model("hybrid"), threads=1)
    s = engine.session("policy", checkpoints=CheckpointPolicy(every=3))
    s.reset()
    path = tmp_path / "policy.jsonl"
    with record_to(path):
        r = s.generate(PROMPT, max_new_tokens=4, sampling=Sampling(temperature=1.0, seed=5)).result
        # the next prompt parts inside the reply: only an every-3 checkpoint serves it
        s.generate(PROMPT + r.gen_ids[:2] + [9707, 1879], max_new_tokens=1).result
    recs = list(load_dump(path))
    assert recs[0]["checkpoint_policy"] == {"at_prompt_end": True, "every": 3, "positions": [], "budget_mib": 0.0,
                                            "before_last": None}
    assert recs[1]["reused"] == 9  # the checkpoint at 9 (every 3) inside the reply, not the turn start at 8
    rep = reproduce(path, model=str(embedded_model("hybrid")))
    assert rep.exact
