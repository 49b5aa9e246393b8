"""Every notebook runs (nbclient, python3 kernel) from a copy of `notebooks/` alone, in a temp directory
with nothing of the checkout beside it, and is stored without outputs.

The kernel inherits this process's environment (PYTHONPATH, STRATA_CACHE_DIR), so it imports the same
strata_lab the tests do; the notebooks find the dumps through `example_dumps()` (an installed strata_lab
ships them). `scripts/make_notebooks.py` is their source: the committed files are exactly what it writes.
"""
import importlib.util
import json
import pathlib
import shutil

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT = 180


def _tree(*dirs):
    return {p: p.stat().st_mtime_ns for d in dirs for p in (ROOT / d).rglob("*") if p.is_file()
            and ".ipynb_checkpoints" not in p.parts}


@pytest.mark.unit
def test_the_notebooks_exist():
    assert [p.stem for p in NOTEBOOKS] == ["01_reuse_divergence", "02_tokenizer_boundaries", "03_agent_session",
                                           "04_templates_and_prefill", "05_import_your_traffic",
                                           "06_engines_side_by_side", "07_production_traces"]


@pytest.mark.unit
def test_the_generator_writes_the_committed_notebooks():
    pytest.importorskip("nbformat")
    spec = importlib.util.spec_from_file_location("make_notebooks", ROOT / "scripts" / "make_notebooks.py")
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    assert sorted(make.NOTEBOOKS) == [p.stem for p in NOTEBOOKS]
    for path in NOTEBOOKS:
        committed, written = json.loads(path.read_text(encoding="utf-8")), make.notebook(path.stem)
        assert committed["metadata"] == written["metadata"], path.name
        assert [(c["id"], c["cell_type"], "".join(c["source"])) for c in committed["cells"]] == \
            [(c["id"], c["cell_type"], c["source"]) for c in written["cells"]], \
            f"{path.name} differs from what scripts/make_notebooks.py writes: edit the script, then run it"


@pytest.mark.unit
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_stored_without_outputs(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code":
            assert cell.get("outputs") == [], f"cell {i} has outputs"
            assert cell.get("execution_count") is None, f"cell {i} has an execution count"
    assert nb["metadata"]["kernelspec"]["name"] == "python3"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")

    copy = tmp_path / "notebooks"
    shutil.copytree(ROOT / "notebooks", copy)          # notebooks/ alone: no tests/, no dumps/ beside it
    nb = nbformat.read(copy / path.name, as_version=4)
    before = _tree("notebooks", "dumps")
    client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name="python3",
                                     resources={"metadata": {"path": str(copy)}})
    client.execute()  # raises CellExecutionError with the cell's traceback on failure
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    assert _tree("notebooks", "dumps") == before, "a notebook wrote inside the checkout"
