"""benchmarks/ keeps its layout: end-to-end benchmarks at the top, kernel A/B harnesses in benchmarks/kernels/,
and every script still starts where it lives (a harness moved without its imports fails here, not on the
day someone needs its numbers). Nothing is timed: each script only answers --help."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "benchmarks"
KERNELS = sorted((BENCH / "kernels").glob("*.py"))


def test_kernel_harnesses_live_in_kernels():
    names = {p.stem for p in KERNELS}
    assert {"ab_decode", "attention_ab", "decode_attention_ab", "kv_cache_ab", "int8_storage"} <= names
    # an A/B harness at the top level belongs in kernels/
    top = {p.stem for p in BENCH.glob("*.py")}
    assert not top & names, sorted(top & names)


def test_scripts_cite_only_scripts_that_exist():
    missing = []
    for path in sorted(BENCH.rglob("*.py")):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            for cited in re.findall(r"\bbenchmarks/[\w/]+\.py\b", line):
                if not (REPO / cited).is_file():
                    missing.append(f"{path.relative_to(REPO)}:{i}: {cited}")
    assert not missing, "\n".join(missing)


@pytest.mark.parametrize("script", KERNELS + [BENCH / "engine.py", BENCH / "grammar.py"],
                         ids=lambda p: str(p.relative_to(BENCH)))
def test_script_starts(script, tmp_path):
    # run from elsewhere, as a user would from the repository root: imports must not depend on the cwd
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, str(script), "--help"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "usage:" in proc.stdout


def test_harnesses_find_the_shared_model_folder():
    # ab_decode and kv_cache_ab borrow benchmarks/engine.py's model_folder(); the path they put on sys.path
    # must be benchmarks/, one level above them
    for name in ("ab_decode.py", "kv_cache_ab.py"):
        text = (BENCH / "kernels" / name).read_text()
        assert "from engine import model_folder" in text and "resolve().parents[1]" in text, name
    proc = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                           "from engine import model_folder; print(model_folder.__module__)", str(BENCH)],
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "engine", proc.stderr[-2000:]


@pytest.mark.parametrize("args, message", [
    (["--skip", "hf,llama-f16"], "--skip: unknown llama-f16"),
    (["--llama-server", "avx2"], "expected LABEL=PATH"),
    (["--llama-server", "avx2=no/such/llama-server"], "is not an executable file"),
])
def test_engine_rejects_bad_options_before_any_work(args, message, tmp_path):
    # an unknown --skip name or a --llama-server peer that cannot run is a clear error, not a table without it
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, str(BENCH / "engine.py"), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and message in proc.stderr, (proc.returncode, proc.stderr[-2000:])
    assert "bf16 weights" not in proc.stdout  # stopped before the model folder and the run's header


def test_llama_server_build_script_rejects_an_unknown_isa(tmp_path):
    proc = subprocess.run(["bash", str(REPO / "scripts" / "build_llama_server.sh"), "--isa", "avx512", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--isa must be native or avx2" in proc.stderr, proc.stderr
    assert not any(tmp_path.iterdir())  # nothing downloaded or built


@pytest.mark.parametrize("args, message", [
    (["--llama-server", "no/such/llama-server", "--model", "m.gguf"], "'no/such/llama-server' is not an executable"),
    (["--llama-server", sys.executable, "--model", "no/such.gguf"], "--model: 'no/such.gguf' is not a file"),
    (["--llama-server", sys.executable], "--llama-server needs --model GGUF"),
    (["--model", "m.gguf"], "--model needs --llama-server PATH"),
    (["--llama-server", sys.executable, "--model", "m.gguf", "--requests", "10"], "the fake upstream only"),
])
def test_proxy_rejects_a_real_engine_it_cannot_run_before_any_work(args, message, tmp_path):
    # the real-engine mode of benchmarks/proxy.py: a missing binary or model is a one-line error, no upstream started
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, str(BENCH / "proxy.py"), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and message in proc.stderr, (proc.returncode, proc.stderr[-2000:])
    assert not proc.stdout
