#!/usr/bin/env python3
"""Run llama.cpp's own server test suite against `strata-lab serve` (through launcher.py) and write a summary.

    nice python benchmarks/llamacpp_suite/run.py --suite LLAMA_CPP/tools/server/tests [--timeout 90] [-k EXPR]

The suite (llama.cpp's tools/server/tests; also vendored in the llama-cpp-python sdist under
vendor/llama.cpp/tools/server/tests) is given by --suite or $LLAMA_CPP_SERVER_TESTS. It is copied to a temp dir and
run there, never in place and never committed here. Its extra requirements (aiohttp, wget, prometheus-client,
pytest-timeout for the per-test limit) are benchmark-only and not project dependencies.

One change is made to the copy: the session fixture's `ServerPreset.load_all()` (which starts every preset once to
download its model from the Hugging Face hub) becomes a no-op: nothing is downloaded here, the launcher serves the
embedded model whatever the preset names, and presets whose flags we cannot honour would otherwise fail the whole
session instead of their own tests.

The summary (command, counts, every test's outcome) goes to benchmarks/results/llamacpp_suite.md; any text in that
file below the ANALYSIS marker line is kept across runs (the hand-written review of the passing tests).
"""
from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(REPO, "benchmarks", "results", "llamacpp_suite.md")
ANALYSIS = "<!-- ANALYSIS: hand-written below this line, kept across runs -->"
LOAD_ALL = "        ServerPreset.load_all()"


def outcomes(junit: str) -> list[tuple[str, str, str]]:
    """(test id, outcome, first line of the message) per test case of a junit xml file."""
    rows = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        outcome, msg = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                msg = (el.get("message") or "").splitlines()[0][:160] if el.get("message") else ""
                break
        rows.append((name, outcome, msg))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", default=os.environ.get("LLAMA_CPP_SERVER_TESTS"),
                    help="llama.cpp's tools/server/tests directory ($LLAMA_CPP_SERVER_TESTS)")
    ap.add_argument("--timeout", type=int, default=90, help="seconds per test (pytest-timeout)")
    ap.add_argument("-k", dest="keyword", help="pytest -k expression (a partial run; the summary says so)")
    ap.add_argument("--out", default=RESULTS, help="summary file (default benchmarks/results/llamacpp_suite.md)")
    ap.add_argument("--log", help="also keep pytest's full output here")
    ap.add_argument("files", nargs="*", help="test files under unit/ (default: all)")
    a = ap.parse_args()
    if not a.suite or not os.path.isfile(os.path.join(a.suite, "utils.py")):
        raise SystemExit("run.py: --suite (or $LLAMA_CPP_SERVER_TESTS) must name llama.cpp's tools/server/tests "
                         f"directory (holding utils.py); got {a.suite!r}")
    for mod in ("aiohttp", "wget", "prometheus_client", "pytest_timeout", "openai", "filelock"):
        try:
            __import__(mod)
        except ImportError:
            raise SystemExit(f"run.py: the suite needs the Python module {mod!r}; pip install it (benchmark-only)")

    with tempfile.TemporaryDirectory(prefix="llamacpp-suite-") as tmp:
        suite = os.path.join(tmp, "tests")
        shutil.copytree(a.suite, suite, ignore=shutil.ignore_patterns("tmp", "__pycache__", ".pytest_cache"))
        conftest = os.path.join(suite, "conftest.py")
        text = open(conftest).read()
        if LOAD_ALL not in text:
            raise SystemExit("run.py: the suite's conftest.py no longer calls ServerPreset.load_all() as expected; "
                             "update LOAD_ALL in run.py")
        open(conftest, "w").write(text.replace(LOAD_ALL, "        pass  # strata_lab: no model downloads"))
        junit = os.path.join(tmp, "junit.xml")
        targets = [os.path.join("unit", f) for f in a.files] or ["unit"]
        cmd = [sys.executable, "-m", "pytest", *targets, "-q", "-p", "no:cacheprovider", "-o", "addopts=",
               f"--timeout={a.timeout}", f"--junitxml={junit}", "-rN"]
        if a.keyword:
            cmd += ["-k", a.keyword]
        env = {**os.environ, "LLAMA_SERVER_BIN_PATH": os.path.join(HERE, "launcher.py"),
               "PORT": str(random.Random().randrange(20000, 40000)), "PYTHONPATH": REPO}
        t0 = time.time()
        proc = subprocess.run(cmd, cwd=suite, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        wall = time.time() - t0
        if a.log:
            with open(a.log, "w") as f:
                f.write(proc.stdout)
        if not os.path.exists(junit):
            sys.stdout.write(proc.stdout[-4000:])
            raise SystemExit(f"run.py: pytest wrote no junit report (exit {proc.returncode})")
        # no path of this machine in the committed summary
        rows = [(n, o, re.sub(r"/(root|tmp|work|home)/[^\s'\"]*", "<path>",
                               m.replace(suite, "<suite copy>").replace(REPO, "<repo>")))
                for n, o, m in outcomes(junit)]

    counts = Counter(o for _, o, _ in rows)
    kept = ""
    if os.path.exists(a.out):
        old = open(a.out).read()
        if ANALYSIS in old:
            kept = old.split(ANALYSIS, 1)[1]
    shown = ["python benchmarks/llamacpp_suite/run.py --suite $LLAMA_CPP_SERVER_TESTS", f"--timeout {a.timeout}"]
    if a.keyword:
        shown.append(f"-k {a.keyword!r}")
    shown += a.files
    lines = [
        "# llama.cpp's server test suite against `strata-lab serve`",
        "",
        "Generated by `benchmarks/llamacpp_suite/run.py` (see its docstring and `launcher.py` for the flag mapping).",
        "",
        f"Command: `nice {' '.join(shown)}`",
        "",
        f"Tests: {len(rows)}: **{counts['passed']} passed**, {counts['failed']} failed, {counts['error']} errors, "
        f"{counts['skipped']} skipped ({wall:.0f} s wall).",
        "",
        "Passing tests:",
        "",
    ]
    lines += [f"- `{n}`" for n, o, _ in rows if o == "passed"] or ["- (none)"]
    lines += ["", "<details><summary>Every other test and the first line of its failure</summary>", ""]
    lines += [f"- {o}: `{n}`: {m.replace('|', '/').replace('`', chr(39))}" for n, o, m in rows if o != "passed"]
    lines += ["", "</details>", "", ANALYSIS]
    with open(a.out, "w") as f:
        f.write("\n".join(lines) + (kept if kept else "\n"))
    print(f"{len(rows)} tests: {dict(counts)}; summary in {os.path.relpath(a.out, REPO)}")


if __name__ == "__main__":
    main()
