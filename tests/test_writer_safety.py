"""Every path that writes call records goes through the one writer: files 0600 (an existing 0644 one narrowed),
directories 0700, a symbolic link refused without touching its target. One test per writer.

Each file writer is run twice: onto a pre-created 0644 file (it must end 0600, holding the new content), and
onto a symbolic link to a victim file (refused; the victim keeps its bytes and its mode)."""
import json
import os
import stat
import types
import warnings

import pytest

import strata_lab as sl
from strata_lab.dump import Store, StoreWriter, convert_jsonl, load_dump
from strata_lab.dump.writer import Recorder, StoreRecorder, write_lines, write_records

REC = {"schema": "strata-dump/1", "ts": 1.7e9, "session": "s", "call": 0, "prompt_ids": [1, 2, 3], "gen_ids": [4]}


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _victim(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"do not touch\n")
    os.chmod(victim, 0o644)
    return victim


def check_file_writer(tmp_path, write, *, suffix=".jsonl", appends=False):
    """`write(path)` writes calls to `path`: it narrows a 0644 file and refuses a link."""
    pre = tmp_path / f"pre{suffix}"
    pre.write_bytes(b"old content that is not a dump\n")
    os.chmod(pre, 0o644)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "narrowed it to 0600" is said; the mode is what is checked
        write(pre)
    assert _mode(pre) == 0o600
    assert (b"old content" in pre.read_bytes()) == appends

    victim = _victim(tmp_path)
    link = tmp_path / f"link{suffix}"
    link.symlink_to(victim)
    with pytest.raises(ValueError, match="symbolic link"):
        write(link)
    assert victim.read_bytes() == b"do not touch\n" and _mode(victim) == 0o644
    assert os.path.islink(link)


def test_recorder_appends(tmp_path):
    def write(p):
        with Recorder(p) as rec:
            rec.write_call(session="s", prompt_ids=[1, 2], reused=0)
    pre = tmp_path / "pre.jsonl"
    check_file_writer(tmp_path, write, appends=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the old line is skipped with a DumpWarning
        assert len(list(load_dump(pre))) == 1  # appended after the old (skipped) line


def test_write_records(tmp_path):
    check_file_writer(tmp_path, lambda p: write_records([REC, sl.CallRecord.from_mapping(REC)], p))
    assert [r["prompt_ids"] for r in load_dump(tmp_path / "pre.jsonl")] == [[1, 2, 3], [1, 2, 3]]


def test_write_lines(tmp_path):
    check_file_writer(tmp_path, lambda p: write_lines([json.dumps(REC).encode()], p))
    with pytest.raises(ValueError, match="newline"):
        write_lines([b"{}\n{}"], tmp_path / "x.jsonl")


@pytest.fixture
def openai_log(tmp_path):
    path = tmp_path / "log" / "calls.jsonl"
    path.parent.mkdir()
    body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}
    path.write_text(json.dumps(body) + "\n")
    return path


def test_trace_to_dump(tmp_path, openai_log):
    trace = sl.load_trace(openai_log)
    check_file_writer(tmp_path, lambda p: trace.to_dump("qwen3", out=p))
    assert len(list(load_dump(tmp_path / "pre.jsonl"))) == 1


def test_trace_write_jsonl_and_parquet(tmp_path, openai_log):
    trace = sl.load_trace(openai_log)
    check_file_writer(tmp_path, lambda p: trace.write(p))
    sub = tmp_path / "pq"
    sub.mkdir()
    check_file_writer(sub, lambda p: trace.write(p), suffix=".parquet")
    import pandas as pd

    assert len(pd.read_parquet(sub / "pre.parquet")) == 1


def test_write_calls_of_lint_fix(tmp_path):
    from strata_lab.caches.call_ids import calls_from_records, write_calls

    calls = list(calls_from_records([REC]))
    check_file_writer(tmp_path, lambda p: write_calls(calls, p))
    assert [r["prompt_ids"] for r in load_dump(tmp_path / "pre.jsonl")] == [[1, 2, 3]]


def _store(tmp_path, name="store"):
    root = tmp_path / name
    with StoreWriter(root) as w:
        w.write(REC)
    return root


def test_store_to_jsonl(tmp_path):
    store = Store(_store(tmp_path))
    check_file_writer(tmp_path, store.to_jsonl)
    assert [r["prompt_ids"] for r in load_dump(tmp_path / "pre.jsonl")] == [[1, 2, 3]]


def test_hash_trace_export(tmp_path):
    src = tmp_path / "src.jsonl"
    write_records([REC, dict(REC, call=1, prompt_ids=[1, 2, 3, 4, 5])], src)
    sub = tmp_path / "out"
    sub.mkdir()
    check_file_writer(sub, lambda p: sl.export_trace(str(src), p, format="mooncake", block=2, salt="k"))
    assert len((sub / "pre.jsonl").read_text().splitlines()) == 2


def test_fleet_dump(tmp_path):
    from strata_lab.fleet.generator import FleetConfig, write_fleet

    cfg = FleetConfig(sessions=2, replicas=1, tenants=1, duration_s=60.0)
    check_file_writer(tmp_path, lambda p: write_fleet(p, cfg))
    assert len(list(load_dump(tmp_path / "pre.jsonl"))) >= 2


def test_validate_compare_dump(tmp_path):
    from strata_lab.validate.compare import Comparison, write_dump

    req = types.SimpleNamespace(session="s", prompt=[1, 2, 3], salt=None, sent=None, done=None, slot=None)
    comp = Comparison(spec="vllm", engine="vllm", rows=[(req, [4], 0)], predicted=[0], causes=[None])
    check_file_writer(tmp_path, lambda p: write_dump(p, comp))
    assert [r["prompt_ids"] for r in load_dump(tmp_path / "pre.jsonl")] == [[1, 2, 3]]


# --- stores: directories 0700, segment files 0600, links refused --------------------------------------------

def _check_store_files(root):
    for dirpath, dirs, files in os.walk(root):
        assert _mode(dirpath) == 0o700, dirpath
        for f in files:
            assert _mode(os.path.join(dirpath, f)) == 0o600, f


def check_store_writer(tmp_path, write):
    """`write(root)` writes a store at `root`: an existing 0755 root ends 0700 with 0600 files; a root, a
    partition or a segment's temporary that is a symbolic link is refused or replaced, never followed."""
    pre = tmp_path / "pre"
    pre.mkdir()
    os.chmod(pre, 0o755)
    write(pre)
    _check_store_files(pre)
    assert [r["prompt_ids"] for r in Store(pre)] == [[1, 2, 3]]

    victim_dir = tmp_path / "victim_dir"
    victim_dir.mkdir()
    os.chmod(victim_dir, 0o755)
    link = tmp_path / "linked"
    link.symlink_to(victim_dir, target_is_directory=True)
    with pytest.raises(ValueError, match="symbolic link"):
        write(link)
    with pytest.raises(ValueError, match="symbolic link"):
        write(str(link) + "/")
    assert os.listdir(victim_dir) == [] and _mode(victim_dir) == 0o755

    # a partition that is a link to another directory is refused
    root = tmp_path / "planted"
    (root / "day=2023-11-14").mkdir(parents=True)
    (root / "day=2023-11-14" / "replica=default").symlink_to(victim_dir, target_is_directory=True)
    with pytest.raises(ValueError, match="symbolic link"):
        write(root)
    assert os.listdir(victim_dir) == []

    # a planted temporary (segment or open marker) pointing at a victim file: the victim is untouched
    victim = _victim(tmp_path)
    root = tmp_path / "planted2"
    part = root / "day=2023-11-14" / "replica=default"
    part.mkdir(parents=True, mode=0o700)
    os.chmod(root, 0o700)
    os.chmod(root / "day=2023-11-14", 0o700)
    (part / "seg-000000.parquet.tmp").symlink_to(victim)
    (part / "_open.tmp").symlink_to(victim)
    write(root)
    assert victim.read_bytes() == b"do not touch\n" and _mode(victim) == 0o644
    _check_store_files(root)


def test_store_writer(tmp_path):
    def write(root):
        with StoreWriter(root) as w:
            w.write(REC)
    check_store_writer(tmp_path, write)


def test_store_recorder(tmp_path):
    def write(root):
        with StoreRecorder(root) as rec:
            rec.write_call(session="s", prompt_ids=[1, 2, 3], reused=0, gen_ids=[4], ts=1.7e9)
    check_store_writer(tmp_path, write)


def test_convert_jsonl(tmp_path):
    src = tmp_path / "src.jsonl"
    write_records([REC], src)
    check_store_writer(tmp_path, lambda root: convert_jsonl(src, root))
