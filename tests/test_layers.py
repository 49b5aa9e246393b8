"""The one-way arrows between the stages (pyproject.toml [tool.importlinter]) hold."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_import_contracts_hold():
    exe = shutil.which("lint-imports")
    if exe is None:
        pytest.fail("lint-imports is missing: install the test extra (pip install '.[test]')")
    # run from the checkout so the contracts check these sources (static analysis: nothing is imported)
    proc = subprocess.run([exe, "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={"PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin",
                               "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "Contracts: 3 kept, 0 broken" in proc.stdout or "kept, 0 broken" in proc.stdout, proc.stdout


def test_layers_contract_names_every_stage():
    # a new subpackage must take its place in the layers, or it escapes the check
    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    layered = set()
    for contract in config["contracts"]:
        if contract["type"] == "layers":
            for layer in contract["layers"]:
                layered.update(part.strip() for part in layer.split("|"))
    packages = {f"strata_lab.{p.name}" for p in (REPO / "strata_lab").iterdir()
                if (p / "__init__.py").is_file()}
    assert packages <= layered, f"subpackages missing from the layers contract: {sorted(packages - layered)}"


def test_rules_import_nothing_of_strata_lab():
    # strata_lab/rules.py is the bottom floor: every stage reads its rules, so it may not lean on any
    import ast

    tree = ast.parse((REPO / "strata_lab" / "rules.py").read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level]
    assert not [n for n in names if n.split(".")[0] == "strata_lab"], names
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level], "relative import"
