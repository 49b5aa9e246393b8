"""Docs that run verbatim: every shell and Python block of README.md and docs/ (docs/*.md, the user guide in
docs/guide/) runs as written, from a
scratch directory holding a copy of the repository's `dumps/` (the README's blocks run "from the repository
root"), with `strata-lab` meaning this checkout's CLI. An example that fails as written fails here.

Markers (an HTML comment on the line before a block, invisible on GitHub):

* `<!-- docs-test: server -->`: the block's `strata-lab serve` line starts in the background; once /health
  answers, the other lines run against it (curl fails on an HTTP error status here), then the server stops.
* `<!-- docs-test: skip: REASON -->`: not run (a placeholder path, a key, a cluster address, an install);
  every `strata-lab` command in it must still parse with the real CLI parser. Skips stay few (MAX_SKIPS).

The two set-up commands at the top of README.md install the package and run the suite (which holds this
test); they are recognised by their text (SETUP) and only their `strata-lab` part is parsed.
JSON blocks must parse. Blocks without a language are diagrams and layouts.

Runtime: 78 s on 2 cores (2.5 minutes when they are shared; each CLI command is a fresh process of ~6 s; the engine block
loads the tiny model and compiles a grammar).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import strata_lab

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md"] + sorted((REPO / "docs").glob("*.md")) + sorted((REPO / "docs" / "guide").glob("*.md"))
INSTALL_AND_DEMO, INSTALL_AND_TEST = 'pip install ".[server]" && strata-lab demo', 'pip install ".[test]" && pytest'
SETUP = {INSTALL_AND_DEMO, INSTALL_AND_TEST}   # INSTALL_AND_TEST is .ci/run's command: CI runs what the README says
MAX_SKIPS = 5   # the README's and the server page's placeholders, a Dask scheduler, the dev installs, an installed vLLM
SHELL = {"bash", "sh", "shell", "console"}
_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)
_MARK = re.compile(r"<!--\s*docs-test:\s*(skip|server)\b:?\s*(.*?)\s*-->")


def blocks():
    """(id, language, code, marker, reason) of every fenced block in the docs."""
    out = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for m in _FENCE.finditer(text):
            before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
            mark = _MARK.search(before)
            line = text[:m.start()].count("\n") + 1
            out.append((f"{path.relative_to(REPO)}:{line}", m.group(1).lower(), m.group(2),
                        mark.group(1) if mark else None, mark.group(2) if mark else ""))
    return out


BLOCKS = blocks()
RUN = [b for b in BLOCKS if b[1] in SHELL | {"python", "json"} and b[3] != "skip" and b[2].strip() not in SETUP]
NOT_RUN = [b for b in BLOCKS if b[1] in SHELL and (b[3] == "skip" or b[2].strip() in SETUP)]


def test_the_blocks_are_found_and_skips_stay_few():
    langs = {b[1] for b in RUN}
    assert {"bash", "python", "json"} <= langs, langs
    assert sum(b[3] == "server" for b in RUN) == 1
    skipped = [b for b in NOT_RUN if b[3] == "skip"]
    assert len(skipped) <= MAX_SKIPS, [b[0] for b in skipped]
    assert all(b[4] for b in skipped), "every skip says why"
    assert len([b for b in NOT_RUN if b[2].strip() in SETUP]) == 2
    readme = [b for b in BLOCKS if b[0].startswith("README.md:")]
    assert [b[2].strip() for b in readme[:2]] == [INSTALL_AND_DEMO, INSTALL_AND_TEST], "the README opens with them"
    assert INSTALL_AND_TEST in (REPO / ".ci" / "run").read_text().splitlines(), "CI runs the README's test command"


def _cli_lines(code: str):
    """Each `strata-lab ...` command of a shell block, as argv (env assignments and pipes before it dropped)."""
    for raw in code.splitlines():
        line = raw.split("  #", 1)[0].strip()
        for part in line.split("&&"):
            words = shlex.split(part.split("|")[-1], comments=True)
            while words and re.match(r"^\w+=", words[0]):
                words = words[1:]
            if words and words[0] == "strata-lab":
                yield words[1:]


@pytest.mark.parametrize("block", NOT_RUN, ids=[b[0] for b in NOT_RUN])
def test_commands_of_blocks_not_run_parse(block):
    from strata_lab.cli import build_parser

    parser = build_parser()
    for argv in _cli_lines(block[2]):
        try:
            parser.parse_args(argv)
        except SystemExit as exc:
            pytest.fail(f"{block[0]}: strata-lab {' '.join(argv)} does not parse (exit {exc.code})")


@pytest.fixture()
def workdir(tmp_path):
    """A scratch 'repository root': a copy of dumps/ and a `strata-lab` on PATH running this checkout."""
    shutil.copytree(REPO / "dumps", tmp_path / "dumps")
    bin_dir = tmp_path / ".bin"
    bin_dir.mkdir()
    shim = bin_dir / "strata-lab"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m strata_lab "$@"\n')
    shim.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
               PYTHONPATH=os.pathsep.join(filter(None, [str(Path(strata_lab.__file__).resolve().parents[1]),
                                                        os.environ.get("PYTHONPATH")])),
               MPLBACKEND="Agg")
    return tmp_path, env


def _run(args, cwd, env, what, timeout=300):
    r = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{what} failed (exit {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def _wait_health(port: int, proc, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited with {proc.returncode}: {proc.stdout.read()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise AssertionError(f"the server did not answer /health within {timeout} s")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.parametrize("block", RUN, ids=[b[0] for b in RUN])
def test_block_runs_verbatim(block, workdir):
    where, lang, code, mark, _ = block
    cwd, env = workdir
    if lang == "json":
        json.loads(code)
        return
    if lang == "python":
        (cwd / "block.py").write_text(code)
        _run([sys.executable, "block.py"], cwd, env, where)
        return
    if mark != "server":
        _run(["bash", "-e", "-o", "pipefail", "-c", code], cwd, env, where)
        return
    lines = code.strip().splitlines()
    serve = next(line for line in lines if line.lstrip().startswith("strata-lab serve"))
    port = int(re.search(r"--port[ =](\d+)", serve).group(1)) if "--port" in serve else 8080
    assert _port_free(port), f"port {port} is taken; the README's server example needs it"
    proc = subprocess.Popen(["bash", "-c", "exec " + serve.split("  #")[0]], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_health(port, proc)
        rest = "\n".join(line for line in lines if line is not serve)
        # the harness's only addition: an HTTP error status (415, 400 ...) fails the line
        strict = 'curl() { command curl -sS --fail-with-body "$@"; echo; }\n' + rest
        r = _run(["bash", "-e", "-o", "pipefail", "-c", strict], cwd, env, where)
        for out in filter(None, r.stdout.splitlines()):
            json.loads(out)   # every answer is the JSON body of a success
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_engine_import_from_a_checkout_without_a_build_says_how_to_install(tmp_path):
    """Python run from a source checkout (no compiled engine) finds that folder's strata_lab first: the error
    says what to do instead of `cannot import name '_engine'`."""
    shutil.copytree(Path(strata_lab.__file__).parent, tmp_path / "strata_lab",
                    ignore=shutil.ignore_patterns("_engine*.so", "_engine*.pyd", "__pycache__"))
    code = "import strata_lab as sl\nsl.Engine.load(sl.embedded_model('attention'))"
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(tmp_path)))
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError:") and "pip install ." in last and "dev_build.sh" in last, last
