"""Issue 52: no command writes over one of its inputs, outputs are written whole or not at all, inputs are
bounded before anything is allocated, exports are salted afresh, and hostile option values are refused with
one line. Each case runs `strata_lab.cli.main` in process on a few-line dump (fast)."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from strata_lab.cli import main
from strata_lab.dump.files import check_output, replaced_output
from strata_lab.dump.writer import write_records


def _dump(path, sessions=2, calls=2):
    recs = []
    for s in range(sessions):
        base = list(range(100 * s + 1, 100 * s + 40))
        for c in range(calls):
            recs.append({"schema": "strata-dump/1", "ts": 1.7e9 + 10 * s + c, "session": f"s{s}", "call": c,
                         "prompt_ids": base + list(range(500, 500 + 20 * c)), "reused": 0, "gen_ids": [7, 8],
                         "finish": "stop"})
    write_records(recs, path)
    return str(path)


def _mooncake(path, lines=3):
    with open(path, "w") as f:
        for i in range(lines):
            f.write(json.dumps({"timestamp": i, "input_length": 600, "output_length": 4, "hash_ids": [1, 2 + i]})
                    + "\n")
    return str(path)


def _refused(argv, capsys, option):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and option in err, err
    return err


@pytest.mark.parametrize("argv, option", [
    (["replay", "{d}", "--json", "{d}"], "--json"),
    (["replay", "{d}", "--png", "{d}"], "--png"),
    (["sweep", "{d}", "--csv", "{d}", "--capacity", "1000", "--policy", "lru"], "--csv"),
    (["export", "{d}", "--format", "mooncake", "--out", "{d}"], "--out"),
    (["lint", "{d}", "--fix", "{d}"], "--fix"),
    (["convert", "{d}", "--out", "{d}"], "--out"),
    (["reproduce", "{d}", "--out", "{d}"], "--out"),
])
def test_an_output_that_is_the_input_is_refused_before_any_work(tmp_path, capsys, argv, option):
    d = _dump(tmp_path / "d.jsonl")
    before = open(d, "rb").read()
    _refused([a.format(d=d) for a in argv], capsys, option)
    assert open(d, "rb").read() == before


def test_import_onto_its_own_log_through_links_is_refused(tmp_path, capsys):
    log = _mooncake(tmp_path / "log.jsonl")
    before = open(log, "rb").read()
    os.symlink(log, tmp_path / "sym.jsonl")
    os.link(log, tmp_path / "hard.jsonl")
    for out in (log, str(tmp_path / "sym.jsonl"), str(tmp_path / "hard.jsonl"), "./" + os.path.relpath(log)):
        err = _refused(["import", log, "--out", out, "-q"], capsys, "--out")
        assert "is the input" in err
    assert open(log, "rb").read() == before


def test_an_output_inside_an_input_directory_is_refused(tmp_path, capsys):
    folder = tmp_path / "logs"
    folder.mkdir()
    _mooncake(folder / "a.jsonl")
    err = _refused(["import", str(folder), "--out", str(folder / "out.jsonl"), "-q"], capsys, "--out")
    assert "inside the input directory" in err
    assert sorted(os.listdir(folder)) == ["a.jsonl"]


def test_a_fifo_output_is_refused_not_waited_on(tmp_path, capsys):
    d = _dump(tmp_path / "d.jsonl")
    fifo = tmp_path / "out.csv"
    os.mkfifo(fifo)
    err = _refused(["sweep", d, "--csv", str(fifo), "--capacity", "1000", "--policy", "lru", "-q"], capsys, "--csv")
    assert "not a regular file" in err


def test_the_same_file_named_for_two_outputs_is_refused(tmp_path, capsys):
    d = _dump(tmp_path / "d.jsonl")
    out = str(tmp_path / "x.png")
    _refused(["sweep", d, "--csv", out, "--png", out, "--capacity", "1000", "--policy", "lru"], capsys, "--png")


def test_a_failed_run_leaves_the_previous_output(tmp_path, capsys, monkeypatch):
    d = _dump(tmp_path / "d.jsonl")
    out = tmp_path / "t.jsonl"
    out.write_text("previous\n")

    def dies(src, path, **kw):   # a reader that dies part-way, after writing half a file
        with open(path, "w") as f:
            f.write('{"half": ')
        raise ValueError("the reader died")

    monkeypatch.setattr("strata_lab.caches.export.export_trace", dies)
    assert main(["export", d, "--format", "mooncake", "--out", str(out), "-q"]) == 2
    assert out.read_text() == "previous\n"
    assert sorted(os.listdir(tmp_path)) == ["d.jsonl", "t.jsonl"]   # no temporary left behind


def test_outputs_are_replaced_whole(tmp_path, capsys):
    d = _dump(tmp_path / "d.jsonl")
    out = tmp_path / "r.json"
    out.write_text("old")
    assert main(["replay", d, "--json", str(out), "-q"]) == 0
    assert json.loads(out.read_text())
    assert sorted(os.listdir(tmp_path)) == ["d.jsonl", "r.json"]


def test_check_output_and_replaced_output_directly(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("{}\n")
    with pytest.raises(ValueError, match="--out .* is the input"):
        check_output(str(src), [str(src)], "--out")
    with pytest.raises(ValueError, match="a directory"):
        check_output(str(tmp_path), [], "--out")
    check_output(str(tmp_path / "new"), [str(src)], "--out")
    with pytest.raises(RuntimeError):
        with replaced_output(tmp_path / "new") as tmp:
            open(tmp, "w").write("x")
            raise RuntimeError
    assert not (tmp_path / "new").exists() and os.listdir(tmp_path) == ["in.jsonl"]


# --- bounds before allocation -----------------------------------------------------------------------------
def test_a_huge_declared_length_is_refused_before_allocation(tmp_path):
    from strata_lab.traces.hashtrace import load_hash_trace

    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps({"timestamp": 0, "input_length": 5, "output_length": 2_000_000_000,
                                "hash_ids": [1]}) + "\n")
    with pytest.warns(Warning, match="output_length 2000000000 is over the limit"):
        with pytest.raises(ValueError, match="no valid mooncake line"):
            load_hash_trace(path)


def test_a_trace_past_the_token_limit_is_refused(tmp_path, monkeypatch):
    from strata_lab.traces.hashtrace import load_hash_trace

    monkeypatch.setenv("STRATA_LIMIT_TRACE_TOKENS", "1000")
    with pytest.raises(ValueError, match="trace_tokens"):
        load_hash_trace(_mooncake(tmp_path / "m.jsonl", lines=5))


def test_gzip_traces_are_read_and_bounded_while_inflating(tmp_path, monkeypatch):
    import gzip

    from strata_lab.traces.hashtrace import load_hash_trace

    plain = open(_mooncake(tmp_path / "m.jsonl"), "rb").read()
    path = tmp_path / "m.jsonl.gz"
    path.write_bytes(gzip.compress(plain))
    assert len(load_hash_trace(path)) == 3
    monkeypatch.setenv("STRATA_LIMIT_TRACE_BYTES", "50")
    with pytest.raises(ValueError, match="decompresses to over 50 bytes"):
        load_hash_trace(path)


def test_a_store_segment_declaring_too_many_ids_is_refused(tmp_path, monkeypatch):
    from strata_lab.dump import Store, convert_jsonl
    from strata_lab.dump.store_check import StoreError

    convert_jsonl(_dump(tmp_path / "d.jsonl"), tmp_path / "s")
    monkeypatch.setenv("STRATA_LIMIT_SEGMENT_IDS", "50")
    with pytest.raises(StoreError, match="over the limit of 50 for one segment"):
        list(Store(tmp_path / "s"))


def test_a_dump_line_past_the_call_limit_is_skipped(tmp_path, monkeypatch):
    from strata_lab.dump import load_dump

    monkeypatch.setenv("STRATA_LIMIT_CALL_TOKENS", "30")
    with pytest.warns(Warning, match="call_tokens"):
        assert load_dump(_dump(tmp_path / "d.jsonl")).records() == []


# --- exports --------------------------------------------------------------------------------------------
def test_exports_are_salted_afresh_unless_a_salt_is_given(tmp_path, capsys):
    d = _dump(tmp_path / "d.jsonl", sessions=3)
    outs = [str(tmp_path / f"e{i}.jsonl") for i in range(4)]
    for out in outs[:2]:
        assert main(["export", d, "--format", "mooncake", "--out", out, "-q"]) == 0
    for out in outs[2:]:
        assert main(["export", d, "--format", "mooncake", "--out", out, "--salt", "k", "-q"]) == 0
    read = [open(o, "rb").read() for o in outs]
    assert read[0] != read[1] and read[2] == read[3]


def test_min_sessions_keeps_only_blocks_shared_by_k_sessions(tmp_path):
    from strata_lab.caches.export import export_trace

    shared = list(range(1, 33))   # two blocks of 16 every session starts with
    recs = [{"session": f"s{s}", "call": c, "ts": 10.0 * s + c, "prompt_ids": shared + [1000 + s] * 16 * (c + 1),
             "reused": 0} for s in range(3) for c in range(2)]
    d = str(tmp_path / "d.jsonl")
    write_records(recs, d)
    out = str(tmp_path / "e.jsonl")
    export_trace(d, out, format="bailian", block=16, salt="x", min_sessions=2)
    rows = [json.loads(line) for line in open(out)]
    firsts = {tuple(r["hash_ids"][:2]) for r in rows}
    assert len(firsts) == 1                                  # the common prefix keeps its reuse
    assert rows[1]["hash_ids"][2] == rows[0]["hash_ids"][2]  # a session's own reuse is kept...
    by_session: dict = {}
    for r, rec in zip(rows, recs):
        by_session.setdefault(rec["session"], set()).update(r["hash_ids"][2:])
    a, b, c = by_session.values()
    assert not (a & b or a & c or b & c)                     # ...and its private blocks match no other session
    # a guess planted in another session: the victim's private block, held by 2 sessions, k = 3 hides it
    recs.append({"session": "attacker", "call": 0, "ts": 99.0, "prompt_ids": shared + [1000] * 16, "reused": 0})
    write_records(recs, d)
    export_trace(d, out, format="bailian", block=16, salt="x", min_sessions=3)
    rows = [json.loads(line) for line in open(out)]
    assert not set(rows[-1]["hash_ids"][2:]) & set(rows[0]["hash_ids"][2:])
    export_trace(d, out, format="bailian", block=16, salt="x", min_sessions=1)
    rows = [json.loads(line) for line in open(out)]
    assert rows[-1]["hash_ids"][2] == rows[0]["hash_ids"][2]  # k = 1: every block's reuse, across sessions too
    with pytest.raises(ValueError, match="min_sessions"):
        export_trace(d, out, format="bailian", min_sessions=0)


def test_a_mooncake_export_with_its_own_block_replays(tmp_path, capsys):
    d = _dump(tmp_path / "d.jsonl")
    out = str(tmp_path / "m.jsonl")
    assert main(["export", d, "--format", "mooncake", "--block", "16", "--min-sessions", "1", "--out", out,
                 "-q"]) == 0
    assert all(json.loads(line)["block_tokens"] == 16 for line in open(out))
    capsys.readouterr()
    assert main(["replay", out, "--engine", "vllm:block_size=16", "--json", "-", "-q"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report


# --- smaller CLI items ----------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, option", [
    (["record", "--turns", "1000000000", "--out", "{t}/r.jsonl"], "--turns"),
    (["record", "--max-tokens", "99999999999", "--out", "{t}/r.jsonl"], "--max-tokens"),
    (["serve", "--allowed-host", ""], "--allowed-host"),
    (["serve", "--alias", "model\nname"], "--alias"),
])
def test_hostile_option_values_are_refused_with_one_line(tmp_path, capsys, argv, option):
    _refused([a.format(t=tmp_path) for a in argv], capsys, option)
    assert not (tmp_path / "r.jsonl").exists()


def test_record_turns_in_exponent_form_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["record", "--turns", "1e9", "--out", str(tmp_path / "r.jsonl")])
    assert exc.value.code == 2 and "--turns" in capsys.readouterr().err
