"""Dump files opened safely; a full disk loses dump lines, never responses; bad start-up options fail fast."""
import json
import os
import resource
import subprocess
import re
import sys
import threading
import warnings

import httpx
import pytest

from _strata_server import free_port, tiny_model
from strata_lab.dump.writer import Recorder


# --- the recorder's open ------------------------------------------------------------------------------------
def test_symlink_dump_is_refused_and_its_target_untouched(tmp_path):
    target = tmp_path / "elsewhere.txt"
    target.write_text("precious\n")
    link = tmp_path / "dump.jsonl"
    link.symlink_to(target)
    with pytest.raises(ValueError, match="symbolic link"):
        Recorder(link)
    assert target.read_text() == "precious\n"


def test_too_open_dump_is_narrowed_to_0600_with_a_warning(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("")
    path.chmod(0o644)
    with pytest.warns(UserWarning, match="narrowed it to 0600"):
        rec = Recorder(path)
    rec.write_call(session="s", prompt_ids=[1], reused=0, finish="stop")
    rec.close()
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a 0600 file opens quietly
        Recorder(path).close()


@pytest.mark.parametrize("kind", ["dir", "fifo", "device"])
def test_non_regular_dump_is_refused(tmp_path, kind):
    if kind == "dir":
        path = tmp_path
    elif kind == "fifo":
        path = tmp_path / "fifo"
        os.mkfifo(path)  # before the fix, opening this for writing hung
    else:
        path = "/dev/null"
    outcome = []

    def try_open():  # in a thread: before the fix a FIFO blocked the open forever
        try:
            Recorder(path)
            outcome.append(None)
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=try_open, daemon=True)
    thread.start()
    thread.join(30)
    assert outcome, "the open hung"
    assert isinstance(outcome[0], ValueError) and re.search("directory|not a regular file", str(outcome[0]))


@pytest.mark.parametrize("on_error", ["count", "raise"])
def test_failed_writes_are_counted_or_raised(tmp_path, on_error):
    rec = Recorder(tmp_path / "d.jsonl", on_error=on_error)
    os.close(rec._fd)
    rec._fd = os.open(os.devnull, os.O_RDONLY)  # every write now fails (EBADF), as on a full disk
    if on_error == "raise":  # the default: a library caller sees the error
        with pytest.raises(OSError):
            rec.write_call(session="s", prompt_ids=[1], reused=0, finish="stop")
    else:
        rec.write_call(session="s", prompt_ids=[1], reused=0, finish="stop")
        assert (rec.lines, rec.lost) == (0, 1) and "OSError" in rec.last_error
    rec.close()


# --- start-up refusals: one line, exit 2 -----------------------------------------------------------------------
def _serve(*args, timeout=120):
    from strata_lab._spawn import child_process_args

    spawn = child_process_args(["serve", "--port", free_port(), "--model", str(tiny_model()), *args])
    return subprocess.run(**spawn, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("case", ["dev_full", "directory", "empty", "symlink", "threads"])
def test_bad_serve_options_fail_fast(tmp_path, case):
    link = tmp_path / "link.jsonl"
    link.symlink_to(tmp_path / "target.jsonl")
    args = {"dev_full": ["--dump", "/dev/full"], "directory": ["--dump", str(tmp_path)], "empty": ["--dump", ""],
            "symlink": ["--dump", str(link)], "threads": ["--threads", "1000000"]}[case]
    r = _serve(*args)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("strata-lab serve: error:"), r.stderr[-2000:]
    assert {"dev_full": "regular file", "directory": "directory", "empty": "dump", "symlink": "symbolic link",
            "threads": "threads"}[case] in lines[0]


# --- a full disk after start-up --------------------------------------------------------------------------------
def test_dump_write_failures_keep_serving_and_are_counted(tmp_path):
    """RLIMIT_FSIZE makes every append to the dump fail (EFBIG), like a disk that filled after start-up."""
    from strata_lab._spawn import child_process_args

    dump = tmp_path / "full.jsonl"
    limit = 1 << 20
    with open(dump, "wb") as f:
        f.write(b"\n" * limit)  # blank lines: a valid dump, already at the size limit
    dump.chmod(0o600)
    port = free_port()
    spawn = child_process_args(["serve", "--port", port, "--model", str(tiny_model()), "--ctx", "256",
                                "--dump", dump])
    log = open(tmp_path / "log", "wb")

    def limit_file_size():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    proc = subprocess.Popen(**spawn, stdout=log, stderr=subprocess.STDOUT, preexec_fn=limit_file_size)
    url = f"http://127.0.0.1:{port}"
    try:
        from _strata_server import ServerProcess

        ServerProcess.adopt(proc, port, tmp_path / "log")
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0}
        for _ in range(2):
            r = httpx.post(url + "/v1/chat/completions", json=body, timeout=60)
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["completion_tokens"] > 0
        assert httpx.get(url + "/health").json() == {"status": "ok", "dump_lost_lines": 2}
        dump_props = httpx.get(url + "/props").json()["dump"]
        assert dump_props["lost_lines"] == 2 and dump_props["lines"] == 0 and "EFBIG" in str(
            dump_props["last_error"]) or "File too large" in str(dump_props["last_error"])
        assert os.path.getsize(dump) == limit
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()
    assert "lost 1 line(s)" in (tmp_path / "log").read_text()


# --- one route: the server's recorder observes its engine -----------------------------------------------------
@pytest.mark.parametrize("with_dump", [False, True])
def test_server_records_each_call_once_through_its_own_recorder(tmp_path, with_dump):
    """$STRATA_PROMPT_DUMP turns on process-wide recording when strata_lab is imported; a server records through
    its own recorder (--dump, else that variable) and turns the process-wide one off: one line per call, in
    one file."""
    from strata_lab._spawn import child_process_args
    from _strata_server import ServerProcess

    env_dump, flag_dump = tmp_path / "env.jsonl", tmp_path / "flag.jsonl"
    port = free_port()
    args = ["serve", "--port", port, "--model", str(tiny_model()), "--ctx", "256"]
    spawn = child_process_args(args + (["--dump", flag_dump] if with_dump else []),
                               env={**os.environ, "STRATA_PROMPT_DUMP": str(env_dump)})
    log = open(tmp_path / "log", "wb")
    proc = subprocess.Popen(**spawn, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        ServerProcess.adopt(proc, port, tmp_path / "log")
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}
        for _ in range(2):
            assert httpx.post(url + "/v1/chat/completions", json=body, timeout=60).status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()
    written, untouched = (flag_dump, env_dump) if with_dump else (env_dump, flag_dump)
    lines = [json.loads(x) for x in written.read_text().splitlines() if x.strip()]
    assert len(lines) == 2 and len({r["request_id"] for r in lines}) == 2, lines
    assert not untouched.exists() or untouched.read_text() == ""
