import json
import os
import stat
import threading
import warnings

import pytest

from strata_lab.dump import writer as record
from strata_lab.cli import main
from strata_lab.dump.reader import DumpWarning, load_dump
from strata_lab.dump.writer import ENV_VAR, Recorder
from strata_lab.recording import active, record_to, start_env_recording, stop_env_recording

from replay_cases import case, write


def test_file_mode_0600_even_with_permissive_umask(tmp_path):
    old = os.umask(0)
    try:
        with Recorder(tmp_path / "d.jsonl") as rec:
            rec.write_call(session="s", prompt_ids=[1], reused=0)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "d.jsonl").st_mode) == 0o600


def test_line_fields_and_unknown_fields_kept(tmp_path):
    path = tmp_path / "d.jsonl"
    with Recorder(path) as rec:
        rec.write_call(session="s", prompt_ids=[1, 2], reused=1, gen_ids=[3], drained_ids=[4], finish="budget",
                       prefill_ms=2.5, checkpoints=[2], encoder={"kept_ids": 1}, model="tiny", client="x")
    line = json.loads(path.read_text())
    assert line["schema"] == "strata-dump/1" and line["drained_ids"] == [4] and line["client"] == "x"
    assert line["timings"] == {"prefill_ms": 2.5, "decode_ms": 0.0}
    (rec_,) = load_dump(path)
    assert rec_["client"] == "x"
    df = load_dump(path).to_frame()
    assert df["client"].tolist() == ["x"] and int(df["encoder_kept_ids"][0]) == 1
    assert str(df["prefill_ms"].dtype) == "float64" and str(df["call"].dtype) == "int64"


@pytest.mark.parametrize("kw, field", [
    (dict(prompt_ids="abc"), "prompt_ids"), (dict(reused=5), "reused"), (dict(finish="done"), "finish"),
    (dict(gen_ids=[-1]), "gen_ids"), (dict(call=-1), "call")])
def test_bad_calls_name_the_field(tmp_path, kw, field):
    args = dict(session="s", prompt_ids=[1, 2], reused=0)
    args.update(kw)
    with Recorder(tmp_path / "d.jsonl") as rec, pytest.raises(ValueError, match=field):
        rec.write_call(**args)
    assert (tmp_path / "d.jsonl").read_bytes() == b""


def test_concurrent_writers_give_one_valid_line_per_call(tmp_path):
    path = tmp_path / "d.jsonl"
    n_threads, per = 8, 60
    big = list(range(20000))  # ~110 KB lines: larger than any pipe/atomic-write guarantee
    with Recorder(path) as rec:
        def work(t):
            for i in range(per):
                rec.write_call(session=f"t{t}", call=i, prompt_ids=big if i % 10 == 0 else [t, i], reused=0)
        threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b""
    seen = sorted((r["session"], r["call"]) for r in map(json.loads, lines[:-1]))
    assert seen == sorted((f"t{t}", i) for t in range(n_threads) for i in range(per))


def test_env_var_and_context_manager(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert Recorder.from_env() is None and active() is None
    assert Recorder.from_env({ENV_VAR: ""}) is None
    env_path = tmp_path / "env.jsonl"
    monkeypatch.setenv(ENV_VAR, str(env_path))
    assert active() is None  # env recording is turned on by strata_lab's import (variable set) or by asking
    from strata_lab.engine import process_observers

    start_env_recording()
    try:
        rec = active()
        assert rec is not None and rec is active() and rec.path == str(env_path)
        (env_observer,) = [o for o in process_observers() if type(o).__name__ == "_EnvRecorder"]
        inner = tmp_path / "inner.jsonl"
        with pytest.raises(RuntimeError):
            with record_to(inner) as r2:
                # one process observer records: the innermost block's recorder
                assert active() is r2 and r2 in process_observers() and env_observer not in process_observers()
                raise RuntimeError("boom")
        # removed in finally; the environment recorder is back
        assert r2.closed and active() is rec and r2 not in process_observers() and env_observer in process_observers()
        monkeypatch.delenv(ENV_VAR)
        assert active() is None
    finally:
        stop_env_recording()
    assert rec.closed and env_observer not in process_observers()


def test_torn_and_garbage_lines_are_skipped_with_file_and_line(tmp_path):
    path = tmp_path / "d.jsonl"
    with Recorder(path) as rec:
        rec.write_call(session="s", prompt_ids=[1, 2], reused=0)
    with open(path, "ab") as f:
        f.write(b"garbage\n[1, 2]\n\n{\"prompt_ids\": \"x\"}\n{\"schema\": \"other/2\", \"prompt_ids\": [1]}\n")
        f.write(b'{"session": "s", "prompt_ids": [3]}\n')
        f.write(b'{"schema": "strata-dump/1", "session": "s", "prompt_ids": [1, 2, 3')  # torn by a crash
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        recs = load_dump(path).records()
    assert [r["prompt_ids"] for r in recs] == [[1, 2], [3]]
    msgs = [str(w.message) for w in caught if issubclass(w.category, DumpWarning)]
    assert len(msgs) == 5
    assert msgs[0].startswith(f"{path}:2: skipped bad line")
    assert msgs[-1].startswith(f"{path}:8: skipped torn last line")


def test_many_files_and_directory(tmp_path):
    for i in range(3):
        with Recorder(tmp_path / f"{i}.jsonl") as rec:
            rec.write_call(session="s", prompt_ids=[i + 1], reused=0)
    assert [r["prompt_ids"] for r in load_dump(tmp_path)] == [[1], [2], [3]]
    assert len(load_dump([tmp_path / "0.jsonl", tmp_path / "2.jsonl"]).records()) == 2
    with pytest.raises(FileNotFoundError):
        load_dump(tmp_path / "missing.jsonl")


def test_cli_replay_prints_summary_and_writes_png(qwen3, tmp_path, capsys):
    rows = []
    for i, name in enumerate(["retokenized_reply", "drained_dropped", "none"]):
        rows += [dict(c, session=f"s{i}") for c in case(qwen3, name)[0]]
    path = write(tmp_path / "d.jsonl", rows)
    png = tmp_path / "out.png"
    # these hand-written lines record no snapshots (checkpoints []): the engine's turn-start ones are modelled
    assert main(["replay", str(path), "--checkpoints", "turn", "--policy", "keep-drained", "--policy", "every:4",
                 "--png", str(png), "-q"]) == 0
    out = capsys.readouterr().out
    for text in ("retokenized_reply 1", "drained_dropped 1", "too poorly to price seconds",  # 1 ms + 10 us/id
                 "worst divergences", "policy comparison", "keep-drained", "every:4", "s0", "s2",
                 "vs reported by strata on 6 calls", "0 calls differ", "ids  held: ", "|| ' öğrenci is Turkish"):
        assert text in out, text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_replay_bad_policy_is_an_error(tmp_path, capsys):
    path = write(tmp_path / "d.jsonl", [dict(prompt_ids=[1, 2], reused=0)])
    assert main(["replay", str(path), "--policy", "every:0", "-q"]) == 2
    assert "every:0" in capsys.readouterr().err
