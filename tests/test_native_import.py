"""The compiled extensions are imported in one place, strata_lab/_native.py: `_engine` (inference, OpenMP) and
`_replay` (the store replay core, no OpenMP). So a store replay before `Engine.load` loads no OpenMP runtime,
gives no warning, and leaves the engine the OpenMP settings it sets for itself; and the enums and the
checkpoint policy cross from C++ to Python by name, declared once."""
from __future__ import annotations

import ast
import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import strata_lab
from strata_lab import _native

PKG = Path(strata_lab.__file__).resolve().parent
ROOT = PKG.parent
EXTENSIONS = ("_engine", "_replay")


# --- one importer ---------------------------------------------------------------------------------
def extension_imports(source: str) -> list[str]:
    """The direct imports of strata_lab._engine / strata_lab._replay in a module's source (import statements,
    relative ones too, and import_module / __import__ / importorskip calls naming them)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name in {f"strata_lab.{e}" for e in EXTENSIONS}]
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:  # relative: from . import _engine, from ._engine import x
                if mod in EXTENSIONS or (not mod and any(a.name in EXTENSIONS for a in node.names)):
                    found.append("." * node.level + mod)
            elif mod in {f"strata_lab.{e}" for e in EXTENSIONS}:
                found.append(mod)
            elif mod == "strata_lab":
                found += [f"strata_lab.{a.name}" for a in node.names if a.name in EXTENSIONS]
        elif isinstance(node, ast.Call):
            for arg in node.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and \
                        re.fullmatch(r"strata_lab\._(engine|replay)", arg.value):
                    found.append(arg.value)
    return found


def test_the_import_check_sees_every_form():
    src = ("from strata_lab import _engine\nimport strata_lab._replay\nfrom strata_lab._engine import Engine\n"
           "from . import _replay\nimportlib.import_module('strata_lab._engine')\n"
           "from strata_lab import _native, engine\nx = 'strata_lab._engine is named in a string'\n")
    assert extension_imports(src) == ["strata_lab._engine", "strata_lab._replay", "strata_lab._engine", ".",
                                      "strata_lab._engine"]


def test_only_native_imports_the_extensions():
    files = [p for p in PKG.rglob("*.py") if p.name != "_native.py"]
    files += [p for d in ("benchmarks", "scripts") if (ROOT / d).is_dir() for p in (ROOT / d).rglob("*.py")]
    assert len(files) > 50
    offenders = {str(p.relative_to(ROOT)): hits for p in files
                 if (hits := extension_imports(p.read_text(encoding="utf-8")))}
    assert not offenders, f"import the extensions through strata_lab._native: {offenders}"


# --- one declaration, crossing by name ------------------------------------------------------------------
needs_replay = pytest.mark.skipif(not _native.replay_available(), reason="needs the compiled replay core")


@needs_replay
def test_enums_cross_by_name():
    from strata_lab.rules import CAUSES
    from strata_lab.replayer.state import FULL_HIT_RULES

    ext = _native.replay()
    assert set(ext.FullHit.__members__) == set(FULL_HIT_RULES)
    assert set(ext.Cause.__members__) <= set(CAUSES), set(ext.Cause.__members__) - set(CAUSES)


@needs_replay
@pytest.mark.parametrize("which", ["replay", "engine"])
def test_checkpoint_policy_fields_are_the_bindings(which):
    """strata_lab.CheckpointPolicy has exactly the C++ struct's fields (named by the binding, in order), with
    the same defaults (None and () are the struct's -1 and []), and `_native` copies every one."""
    from strata_lab.rules import CheckpointPolicy

    if which == "engine":
        pytest.importorskip("strata_lab._engine")
    ext = getattr(_native, which)()
    native_default = ext.CheckpointPolicy()
    names = type(native_default)._fields
    assert [f.name for f in dataclasses.fields(CheckpointPolicy)] == list(names)
    mine = CheckpointPolicy()
    for name in names:
        got = getattr(mine, name)
        want = getattr(native_default, name)
        assert (-1 if got is None else list(got) if isinstance(got, tuple) else got) == want, name
    p = CheckpointPolicy(at_prompt_end=False, every=7, positions=(3, 9), budget_mib=1.5, before_last=42)
    n = p._native(ext)
    assert [getattr(n, k) for k in names] == [False, 7, [3, 9], 1.5, 42]
    bad = ext.CheckpointPolicy()
    bad.every = -1
    with pytest.raises(ValueError, match="checkpoints.every"):
        bad.validate()


# --- import order cannot change the engine's threads ----------------------------------------------------
_CHILD = r"""
import os, sys, tempfile, warnings
warnings.simplefilter("always")
import strata_lab as sl
from strata_lab import _native
from strata_lab.dump import convert_jsonl
d = tempfile.mkdtemp()
convert_jsonl(sys.argv[1], os.path.join(d, "s"))
report = sl.replay(os.path.join(d, "s"))
print("ROWS", len(report.rows), flush=True)
print("GOMP_AFTER_REPLAY", _native.libgomp_mapped(), flush=True)
from strata_lab.engine import Engine
from strata_lab.tiny import make_tiny
engine = Engine.load(make_tiny(os.path.join(d, "m")), threads=2)
r = engine.session("a").generate([9707, 1879], max_new_tokens=4).result
print("GEN", len(r.gen_ids), flush=True)
print("ENV", os.environ.get("OMP_WAIT_POLICY"), os.environ.get("GOMP_SPINCOUNT"), flush=True)
print("OPENMP", _native.engine().build_info()["openmp"], flush=True)
"""


@needs_replay
def test_store_replay_before_engine_load_keeps_the_engines_openmp_settings(tmp_path):
    """A store replay, then Engine.load and a decode, in a fresh process with no OpenMP variables set: the
    replay loads no libgomp, nothing warns, and libgomp (OMP_DISPLAY_ENV: what it read when it loaded) runs
    with the wait the engine sets (passive, GOMP_SPINCOUNT 20000), not libgomp's default (300000 spins)."""
    pytest.importorskip("strata_lab._engine")
    dump = ROOT / "dumps" / "agent.jsonl"
    if not dump.is_file():
        pytest.skip("needs the shipped dumps/ (a source checkout)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_"))}
    env["OMP_DISPLAY_ENV"] = "VERBOSE"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    out = subprocess.run([sys.executable, "-c", _CHILD, str(dump)], capture_output=True, text=True, env=env,
                         timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    assert int(lines["ROWS"]) > 0
    assert lines["GOMP_AFTER_REPLAY"] == "False"  # the replay loaded no OpenMP runtime
    assert lines["GEN"] == "4"
    assert lines["ENV"] == "passive 20000"
    if lines["OPENMP"] != "True":
        pytest.skip("this engine build has no OpenMP: nothing to keep")
    warned = [line for line in out.stderr.splitlines() if "Warning" in line and re.search(r"OpenMP|libgomp|OMP_", line)]
    assert not warned, out.stderr[-3000:]
    shown = dict(re.findall(r"^\s+(\w+) = '([^']*)'", out.stderr, flags=re.M))
    assert shown.get("OMP_WAIT_POLICY") == "PASSIVE", out.stderr[-3000:]
    assert shown.get("GOMP_SPINCOUNT") == "20000", out.stderr[-3000:]
