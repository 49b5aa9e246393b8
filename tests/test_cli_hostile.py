"""Every subcommand, every option, hostile values (issue 34): exit 0/1/2 with at most a one-line error, never a
traceback, a hang or a runaway allocation.

One child process per subcommand calls `strata_lab.cli.main` in process for each (option, value) pair; the
calls that would start a server or record a session stop where that work would begin, and a plot is an empty
file in its place (validation and the output files are what is tested here; the server tier and
tests/test_plots.py test the rest).
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from strata_lab._spawn import child_process_args

HOSTILE = ["-1", "0", "-99999999999999999999", "99999999999999999999", "1e309", "nan", "inf", "", "x" * 5000,
           "MISSING", "/dev/zero", "FIFO", "BINARY", "caf\udce9"]
# the engine spec and dask address forms, hostile
SPECS = {"--engine": ["llama.cpp:slots=1000000000", "vllm:blocks=-5", "sglang:x=1", ":", "llama.cpp:slots=nan",
                      "vllm:gpu_memory_utilization=9"],
         "--dask": ["local:0", "local:-3", "local:100000", "tcp://", "local:nan"],
         "--policy": ["no-such-policy", "reply-ids:x=1"]}

DRIVER = r'''
import json, os, signal, sys, traceback, io, contextlib
sys.setrecursionlimit(3000)
import resource
resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))  # a runaway allocation fails instead of swapping
from strata_lab.cli import main
import strata_lab.server, strata_lab.sessions, strata_lab.sessions.demo


class Reached(Exception):
    pass


def reached(*a, **k):
    raise Reached()


strata_lab.server.serve = reached
strata_lab.sessions.record = reached
strata_lab.sessions.demo.run_demo = reached
cases = json.loads(sys.stdin.read())


def drawn(frame, path=None, **kwargs):  # the file the plot would be, without drawing it (the plot tests draw)
    if path is not None:
        with open(path, "wb") as f:
            f.write(b"\x89PNG\r\n")


if any("--png" in argv for argv in cases):
    import strata_lab.caches.capacity, strata_lab.caches.sweeps, strata_lab.notebook.plots
    strata_lab.caches.capacity.plot_sweep = strata_lab.caches.sweeps.plot_engines = drawn
    strata_lab.notebook.plots.plot_report = drawn
bad = []


def alarm(*_):
    raise TimeoutError("over 120 s")


signal.signal(signal.SIGALRM, alarm)
for argv in cases:
    argv = [a.encode("utf-8", "surrogatepass").decode("utf-8", "surrogateescape") for a in argv]
    err = io.StringIO()
    signal.alarm(120)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 2
    except Reached:
        code = 0
    except BaseException as exc:
        bad.append([argv[:6], "".join(traceback.format_exception(exc))[-1500:]])
        continue
    finally:
        signal.alarm(0)
    text = err.getvalue()
    if code not in (0, 1, 2) or "Traceback" in text:
        bad.append([argv[:6], f"exit {code}: {text[-1500:]}"])
    elif code == 2 and text.strip() and "error:" not in text:
        bad.append([argv[:6], f"exit 2 without an error line: {err.getvalue()[-800:]}"])
print(json.dumps(bad))
'''


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    import os

    d = tmp_path_factory.mktemp("cli")
    dump = d / "d.jsonl"
    dump.write_text("".join(json.dumps({"ts": 1.0 + i, "session": "s", "prompt_ids": list(range(1, 5 + i)),
                                        "gen_ids": [7]}) + "\n" for i in range(3)))
    (d / "conv.json").write_text(json.dumps([{"role": "user", "content": "hi"}]))
    (d / "binary.bin").write_bytes(bytes(range(256)) * 64)
    os.mkfifo(d / "fifo")
    return d


def _subcommands():
    from strata_lab.cli import build_parser
    import argparse

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices


def _cases(name, sp, d) -> list[list[str]]:
    import argparse

    base = {"tokenize": ["hi"], "import": [str(d / "d.jsonl")], "replay": [str(d / "d.jsonl")],
            "convert": [str(d / "d.jsonl")], "lint": [str(d / "d.jsonl")], "template": [str(d / "conv.json")],
            "reproduce": [str(d / "d.jsonl")], "rewrite": [str(d / "d.jsonl")], "serve": [], "demo": [],
            "record": [], "export": [str(d / "d.jsonl")], "sweep": [str(d / "d.jsonl"), "--capacity", "4096", "--policy", "lru"]}[name]
    required = {"convert": ["--out", str(d / "out-store")], "record": ["--out", str(d / "new.jsonl")],
                "rewrite": ["--out", str(d / "rw.jsonl")],
                "export": ["--format", "mooncake", "--out", str(d / "exp.jsonl")]}.get(name, [])
    cases = []

    def value(v):
        return {"FIFO": str(d / "fifo"), "BINARY": str(d / "binary.bin"),
                "MISSING": str(d / "no" / "such" / "x")}.get(v, v)

    for action in sp._actions:
        if isinstance(action, argparse._HelpAction) or action.nargs == 0:
            continue
        values = SPECS.get(action.option_strings[0] if action.option_strings else "", []) + HOSTILE
        for v in values:
            if action.option_strings:
                opt = action.option_strings[0]
                rest = [a for a in required if a != opt] if opt not in required else []
                if opt in required:
                    rest = []
                cases.append(base + [opt, value(v)] + rest)
            else:  # a positional: the hostile value in its place
                cases.append([value(v)] + required if name not in ("serve", "demo", "record") else [])
    return [[name] + c for c in cases if c is not None]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tokenize", "import", "replay", "convert", "lint", "template", "serve", "demo",
                                  "record", "reproduce", "rewrite", "export", "sweep"])
def test_every_option_with_hostile_values(inputs, name):
    commands = _subcommands()
    assert name in commands
    cases = _cases(name, commands[name], inputs)
    assert cases
    spawn = child_process_args([])
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(DRIVER)], input=json.dumps(cases), env=spawn["env"],
                       cwd=str(inputs), capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    bad = json.loads(r.stdout.strip().splitlines()[-1])
    assert not bad, "\n\n".join(f"{argv}:\n{why}" for argv, why in bad[:5])


def test_every_subcommand_is_walked():
    assert set(_subcommands()) == {"tokenize", "import", "replay", "convert", "lint", "template", "serve", "demo",
                                   "record", "reproduce", "rewrite", "export", "sweep", "proxy"}
