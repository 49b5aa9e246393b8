"""One call record: `open_calls` opens a dump, a store and a log as `CallRecord`s; the engine hands each ended
call's record to its observers (the Recorder is one), once, and reading `Stream.result` writes nothing."""
import json
import subprocess

import pytest

import strata_lab as sl
from strata_lab.dump import CallRecord, convert_jsonl, load_dump
from strata_lab.dump.writer import Recorder, write_records

PROMPT = [9707, 1879, 13, 220, 14990, 135992, 42, 7]


def _records():
    return [{"schema": "strata-dump/1", "ts": 1.7e9 + i, "request_id": f"r{i}", "session": "s", "call": i,
             "prompt_ids": [1, 2, 3] + [9] * i, "reused": 0, "gen_ids": [4], "drained_ids": [], "finish": "stop",
             "timings": {"prefill_ms": 1.5, "decode_ms": 2.5}, "checkpoints": [], "model": "m", "note": i}
            for i in range(3)]


def test_call_record_round_trips_a_dump_line():
    for line in _records():
        rec = CallRecord.from_mapping(line)
        assert rec.to_dict() == line and list(rec.to_dict()) == list(line)  # key order kept too
        assert rec.prefill_ms == 1.5 and rec.extra == {"note": line["note"]} and rec["note"] == line["note"]
    with pytest.raises(ValueError, match="mapping"):
        CallRecord.from_mapping([1, 2])


def test_open_calls_opens_a_dump_a_store_and_a_log_as_one_record_type(tmp_path):
    dump = tmp_path / "d.jsonl"
    write_records(_records(), dump)
    store = tmp_path / "store"
    convert_jsonl(dump, store)
    log = tmp_path / "openai.jsonl"
    body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}
    log.write_text(json.dumps(body) + "\n")

    got = {}
    for name, path in (("dump", dump), ("store", store), ("log", log)):
        src = sl.open_calls(path)
        got[name] = list(src)
        assert src.kind == name
        assert got[name] and all(type(r) is CallRecord for r in got[name]), name
    assert got["dump"] == got["store"] == [CallRecord.from_mapping(r) for r in _records()]
    (imported,) = got["log"]
    assert imported.session == "openai-1" and imported.prompt_ids and imported.extra["fidelity"] == "messages"
    # a directory of dumps, and an object already opened, go the same way
    assert list(sl.open_calls(tmp_path / "d.jsonl")) == list(sl.open_calls(load_dump(dump)))
    with pytest.raises(FileNotFoundError):
        list(sl.open_calls(tmp_path / "missing.jsonl"))


def test_no_dispatch_on_class_name_strings():
    out = subprocess.run(["git", "grep", "-n", '__name__ == "Store"', "--", "strata_lab"], capture_output=True,
                         text=True)
    assert out.stdout == ""
    out = subprocess.run(["git", "grep", "-n", '__name__ == "Dump"', "--", "strata_lab"], capture_output=True,
                         text=True)
    assert out.stdout == ""


def test_two_observers_get_the_same_record_and_result_reads_write_nothing(tiny_engine, tmp_path):
    got_a, got_b = [], []
    path = tmp_path / "observed.jsonl"
    rec = Recorder(path)
    tiny_engine.add_observer(got_a.append)
    tiny_engine.add_observer(got_b.append)
    tiny_engine.add_observer(rec)
    try:
        s = tiny_engine.session("observed")
        s.reset()
        stream = s.generate(PROMPT, max_new_tokens=3, record_meta={"request_id": "q1"})
        ids = list(stream)  # the call ends here: one record, now
        assert len(got_a) == 1 and rec.lines == 1
        r1, r2 = stream.result, stream.result  # reading the result (twice) emits nothing more
        assert r1 is r2 and len(got_a) == len(got_b) == 1 and rec.lines == 1
        (a,), (b,) = got_a, got_b
        assert a is b and isinstance(a, CallRecord)
        assert a.prompt_ids == PROMPT and a.gen_ids == ids == r1.gen_ids and a.reused == r1.reused == 0
        assert a.request_id == "q1" and a.session == "observed" and a.finish == r1.finish
        assert "checkpoint_policy" in a.extra

        # a stream held but never read: its record goes out when the next call on the session starts
        unread = s.generate(PROMPT, max_new_tokens=1)
        import time

        deadline = time.monotonic() + 30
        while not unread.done and time.monotonic() < deadline:
            time.sleep(0.01)
        s.generate(s.held_ids, max_new_tokens=0).result
        assert len(got_a) == 3 and [r.call for r in got_a] == [0, 0, 0]
    finally:
        for fn in (got_a.append, got_b.append, rec):
            tiny_engine.remove_observer(fn)
        rec.close()
    lines = list(load_dump(path))
    assert len(lines) == 3 and lines[0]["request_id"] == "q1" and lines[0]["gen_ids"] == ids
    with pytest.raises(ValueError, match="not an observer"):
        tiny_engine.remove_observer(rec)
    with pytest.raises(TypeError, match="callable"):
        tiny_engine.add_observer("nope")


def test_the_recorder_as_an_observer_writes_what_record_to_writes(tiny_engine, tmp_path):
    a, b = tmp_path / "observer.jsonl", tmp_path / "record_to.jsonl"
    s = tiny_engine.session("same")
    with Recorder(a) as rec:
        tiny_engine.add_observer(rec)
        try:
            s.reset()
            s.generate(PROMPT, max_new_tokens=2, record_meta={"request_id": "x", "ts": 5.0}).result
        finally:
            tiny_engine.remove_observer(rec)
    with sl.record_to(b):
        s.reset()
        s.generate(PROMPT, max_new_tokens=2, record_meta={"request_id": "x", "ts": 5.0}).result
    (la,), (lb,) = list(load_dump(a)), list(load_dump(b))
    la["timings"] = lb["timings"] = None  # measured times differ
    assert la == lb and list(la) == list(lb)


def test_an_unread_call_whose_recorder_closed_does_not_fail_the_next_call(tiny_engine, tmp_path):
    s = tiny_engine.session("unread")
    s.reset()
    with sl.record_to(tmp_path / "closed.jsonl"):
        stream = s.generate(PROMPT, max_new_tokens=1)
    import time

    deadline = time.monotonic() + 30
    while not stream.done and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.warns(UserWarning, match="could not be delivered"):
        r = s.generate(s.held_ids, max_new_tokens=0).result
    assert r.prompt_len == len(PROMPT) + 1
    assert stream.result.gen_ids and list(load_dump(tmp_path / "closed.jsonl")) == []


def test_the_two_calls_modules_have_distinct_names():
    import importlib

    from strata_lab.caches import call_ids
    from strata_lab.traces import log_calls

    # caches.call_ids (token-id calls for the cache models) and traces.log_calls (a log's call fields); the old
    # shared name `calls` is neither's any more
    assert call_ids.Call and call_ids.calls_from_dump and log_calls.new_call and log_calls.FIELDS
    for old in ("strata_lab.caches.calls", "strata_lab.traces.calls"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(old)


def test_open_hash_trace_finds_a_production_trace_and_nothing_else(tmp_path):
    from strata_lab.traces.hashtrace import HashTrace
    from strata_lab.traces.opener import open_hash_trace

    dump = tmp_path / "d.jsonl"
    write_records(_records(), dump)
    trace = tmp_path / "t.jsonl"
    sl.export_trace(str(dump), trace, format="mooncake", salt="k")  # the format's own block
    got = open_hash_trace([trace])
    assert isinstance(got, HashTrace) and len(got) == 3
    assert open_hash_trace(dump) is None and open_hash_trace([trace, trace]) is None
    assert open_hash_trace(trace, format="openai") is None
    recs = list(sl.open_calls(trace))  # open_calls reads it too, as a log of synthetic ids
    assert len(recs) == 3 and all(type(r) is CallRecord and r.extra["trace_format"] == "mooncake" for r in recs)
