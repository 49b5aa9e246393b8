"""The Parquet store: lossless round trip, replay on the delta encoding equals replay of the JSONL, Dask."""
import glob
import os
import random
import subprocess
import sys
import warnings

import pandas as pd
import pytest

from strata_lab import replay
from strata_lab.dump import load_dump
from strata_lab.dump import Store, StoreWarning, StoreWriter, convert_jsonl

_SHIPPED = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "dumps", "*.jsonl")))


def _lines(path):
    with open(path, "rb") as f:
        return [ln.rstrip(b"\n") for ln in f if ln.strip()]


def _same_report(a, b):
    pd.testing.assert_frame_equal(a.to_frame(), b.to_frame())
    assert repr(dict(a)) == repr(dict(b))


def _random_dump(path, *, calls=300, sessions=10, replicas=3, seed=0):
    """Sessions that grow, retry, edit history and spread over replicas and two days."""
    rng = random.Random(seed)
    held: dict = {}
    with open(path, "wb") as f:
        for i in range(calls):
            sid = rng.randrange(sessions)
            h = held.get(sid, [])
            keep = len(h) if rng.random() < 0.7 else rng.randrange(len(h) + 1)
            prompt = h[:keep] + [rng.randrange(200, 90000) for _ in range(rng.randrange(1, 40))]
            gen = [rng.randrange(200, 90000) for _ in range(rng.randrange(0, 25))]
            drained = [rng.randrange(200, 90000) for _ in range(rng.randrange(0, 3))]
            rec = {"schema": "strata-dump/1", "ts": 1.7e9 + i * 60.0, "request_id": f"q{i}", "session": f"s{sid}",
                   "call": 0, "prompt_ids": prompt, "reused": keep if keep < len(prompt) else len(prompt) - 1,
                   "gen_ids": gen, "drained_ids": drained, "finish": "stop",
                   "timings": {"prefill_ms": 0.05 * (len(prompt) - keep) + 1.0, "decode_ms": 2.0},
                   "checkpoints": [len(prompt)], "replica": f"r{sid % replicas}"}
            f.write(__import__("orjson").dumps(rec) + b"\n")
            held[sid] = prompt + gen + drained
    return path


@pytest.mark.parametrize("path", _SHIPPED, ids=[os.path.basename(p) for p in _SHIPPED])
def test_jsonl_to_parquet_to_jsonl_gives_identical_lines(tmp_path, path):
    info = convert_jsonl(path, tmp_path / "store")
    assert info["lines"] == len(_lines(path))
    out = tmp_path / "back.jsonl"
    Store(tmp_path / "store").to_jsonl(out)
    assert _lines(out) == _lines(path)


def test_round_trip_keeps_odd_lines_byte_for_byte(tmp_path):
    # valid lines written in ways orjson would not write them: all come back byte for byte
    odd = [b'{"session": "a", "prompt_ids": [1, 2, 3]}',                       # spaces: not orjson's writing
           b'{"prompt_ids":[1,2,3,4],"session":"a","ts":5,"call":1,"x":{"y":[1]}}',  # int ts, extra field
           b'{"session":"a","prompt_ids":[1,2,9],"reused":null,"timings":{"decode_ms":1.0}}',
           b'{"session":"b","prompt_ids":[5],"gen_ids":[2147483647],"k,v":1}',    # the largest id, comma key
           b'{"session":"\\u00e9","prompt_ids":[7]}']
    # lines the reader refuses (docs/DUMP_FORMAT.md) are skipped with a warning, as load_dump skips them
    bad = [b'{"prompt_ids":[1],"call":1.5}', b'{"prompt_ids":[4294967296]}', b'{"prompt_ids":[]}', b'{"torn": tr']
    src = tmp_path / "odd.jsonl"
    src.write_bytes(b"\n".join(odd[:2] + bad[:1] + odd[2:] + bad[1:3]) + b"\n" + bad[3])
    with pytest.warns(Warning, match="skipped"):
        info = convert_jsonl(src, tmp_path / "s")
    assert info["lines"] == len(odd) and info["skipped"] == len(bad)
    assert list(Store(tmp_path / "s").lines()) == odd
    with pytest.warns(Warning):
        assert [r["prompt_ids"] for r in load_dump(tmp_path / "s")] == [r["prompt_ids"] for r in load_dump(src)]


def test_store_is_partitioned_by_day_and_replica_and_delta_encoded(tmp_path):
    src = _random_dump(tmp_path / "d.jsonl")
    convert_jsonl(src, tmp_path / "s")
    st = Store(tmp_path / "s")
    assert sorted(st.domains()) == ["r0", "r1", "r2"]
    days = {os.path.basename(os.path.dirname(p)) for p in st.partitions}
    assert len(days) >= 2 and all(d.startswith("day=2023-11-") for d in days)
    import pyarrow.parquet as pq

    t = [r for p in st.paths
         for r in pq.read_table(p, columns=["parent_call", "shared_len", "suffix_ids", "prompt_len"]).to_pylist()]
    assert any(r["parent_call"] >= 0 and r["shared_len"] > 0 for r in t)
    assert all(len(r["suffix_ids"]) + r["shared_len"] == r["prompt_len"] for r in t)
    assert [r["prompt_ids"] for r in st] == [r["prompt_ids"] for r in load_dump(src)]


@pytest.mark.parametrize("policy", ["recorded", "every:8", "header", "ckpt-recorded", "budget:150", "fixes"])
@pytest.mark.parametrize("model", ["hybrid", "attention"])
def test_store_replay_equals_jsonl_replay(qwen3, tmp_path, policy, model):
    for path in _SHIPPED + [_random_dump(tmp_path / "g.jsonl")]:
        store = tmp_path / ("s-" + os.path.basename(path))
        convert_jsonl(path, store)
        engine = f"strata:kind={model},checkpoints=turn"
        _same_report(replay(path, engine, tokenizer=qwen3, policy=policy),
                     replay(store, engine, tokenizer=qwen3, policy=policy))


def test_writer_killed_loses_only_the_open_row_group_and_says_so(tmp_path):
    code = ("import os, sys; sys.path.insert(0, sys.argv[2]); from strata_lab.dump import StoreWriter\n"
            "w = StoreWriter(sys.argv[1], row_group_rows=4)\n"
            "for i in range(10): w.write({'ts': 1.7e9, 'session': 's', 'prompt_ids': list(range(i + 1))})\n"
            "os._exit(9)\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "s"), root])
    assert r.returncode == 9
    with pytest.warns(StoreWarning, match="did not close"):
        st = Store(tmp_path / "s")
    assert [len(r["prompt_ids"]) for r in st] == list(range(1, 9))  # two row groups of 4 survive
    with pytest.warns(StoreWarning):
        w = StoreWriter(tmp_path / "s", row_group_rows=4)  # reopening clears the marker after warning
    w.write({"ts": 1.7e9, "session": "s", "prompt_ids": [0, 1]})
    w.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(Store(tmp_path / "s").records()) == 9


def test_cli_convert_and_replay(tmp_path):
    src = _SHIPPED[0]
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    r = subprocess.run([sys.executable, "-m", "strata_lab", "convert", src, "--out", str(tmp_path / "s"), "-q"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0 and "Parquet" in r.stdout, r.stderr
    r = subprocess.run([sys.executable, "-m", "strata_lab", "replay", str(tmp_path / "s"), "-q"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0 and "strata@1: hit rate" in r.stdout and "re-read" in r.stdout, r.stderr
    r = subprocess.run([sys.executable, "-m", "strata_lab", "replay", str(tmp_path / "s"), "-q", "--dask", "local:x"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "local:N" in r.stderr


def test_dask_two_workers_equal_in_process(qwen3, tmp_path):
    pytest.importorskip("distributed")
    src = _random_dump(tmp_path / "d.jsonl", calls=400, sessions=12, replicas=4, seed=3)
    convert_jsonl(src, tmp_path / "s", row_group_rows=64)
    here = replay(tmp_path / "s", tokenizer=qwen3, policy="every:16")
    there = replay(tmp_path / "s", tokenizer="qwen3", policy="every:16", cluster="local:2")
    _same_report(here, there)
    ddf = there.to_dask_frame(npartitions=3)
    assert ddf.npartitions == 3 and ddf["reread"].sum().compute() == here["reread"]
    with pytest.raises(ValueError, match="store"):
        replay(src, tokenizer=qwen3, cluster="local:2")


def test_fleet_generator_renders_real_sessions_with_realistic_causes(qwen3, tmp_path):
    from strata_lab.fleet import FleetConfig, generate_fleet, write_fleet

    cfg = FleetConfig(sessions=12, replicas=3, seed=2, p_edit=0.3, p_budget_stop=0.3)
    recs = list(generate_fleet(cfg, tokenizer=qwen3))
    assert recs == list(generate_fleet(cfg, tokenizer=qwen3))  # seeded
    assert [r["ts"] for r in recs] == sorted(r["ts"] for r in recs)
    assert len({r["replica"] for r in recs}) == 3 and any(".sub" in r["session"] for r in recs)
    text = qwen3.decode(recs[-1]["prompt_ids"])
    assert text.startswith("<|im_start|>system\nYou are a") and "<tools>" in text
    path = tmp_path / "f.jsonl"
    assert write_fleet(path, cfg, tokenizer=qwen3) == len(recs)
    rep = replay(path, tokenizer=qwen3)
    assert rep["calls_differ"] == 0  # the recorded reuse is the state model's
    for cause in ("retokenized_reply", "template_rewrite", "drained_dropped", "history_edit"):
        assert rep["causes"].get(cause, 0) > 0, rep["causes"]
    info = convert_jsonl(path, tmp_path / "s")
    assert info["bytes_in"] > 10 * info["bytes_out"]  # agent-like traces: >= 10x smaller as Parquet
    _same_report(rep, replay(tmp_path / "s", tokenizer=qwen3))
    with pytest.raises(ValueError, match="p_edit"):
        FleetConfig(p_edit=2.0)


def test_recorder_writes_a_store_directly(tmp_path):
    from strata_lab.dump.writer import Recorder
    from strata_lab.recording import active, record_to
    from strata_lab.dump.writer import StoreRecorder

    calls = [dict(session="s", prompt_ids=list(range(1, 5 + k)), reused=k, gen_ids=[7, 8], ts=1.7e9 + k,
                  request_id=f"q{k}", prefill_ms=1.5, decode_ms=2.0, checkpoints=[4 + k]) for k in range(7)]
    with Recorder(tmp_path / "d.jsonl") as rec:
        for c in calls:
            rec.write_call(**c)
    with record_to(str(tmp_path / "st") + "/") as rec:
        assert isinstance(rec, StoreRecorder) and active() is rec
        for c in calls:
            rec.write_call(**c)
        with pytest.raises(ValueError, match="reused"):
            rec.write_call(session="s", prompt_ids=[1], reused=5)
    assert rec.closed and rec.lines == 7
    assert list(Store(tmp_path / "st").lines()) == _lines(tmp_path / "d.jsonl")
