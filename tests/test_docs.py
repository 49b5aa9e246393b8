"""Docs that are checked: every module's doctests run, the extension stub matches the extension, and no
file points outside the repository."""
import ast
import doctest
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest

import strata_lab

PKG_DIR = Path(strata_lab.__file__).parent
REPO = Path(__file__).resolve().parent.parent

# Modules whose examples start a server or a browser-side framework are imported but not run here;
# their behaviour is covered by the server tests.
NOT_RUN = {"strata_lab.__main__"}


def _modules():
    names = []
    for info in pkgutil.walk_packages([str(PKG_DIR)], prefix="strata_lab."):
        # _engine: the compiled extension; libstrata_cuda: the CUDA backend's shared library (dlopened, not a
        # Python module, though its .so suffix makes pkgutil list it)
        if info.name.rsplit(".", 1)[-1] in ("_engine", "libstrata_cuda") or info.name in NOT_RUN:
            continue
        names.append(info.name)
    return sorted(names)


MODULES = _modules()


def test_every_module_is_found():
    # the walk must see the subpackages, or the doctest sweep below checks nothing
    assert {"strata_lab.text.tokenizer", "strata_lab.engine", "strata_lab.server.app"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name):
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    tests = finder.find(module, name, globs=vars(module).copy())
    for test in tests:
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} doctest example(s) failed in {name}"


EXTENSIONS = ["_engine", "_replay"]  # each with its stub, strata_lab/<name>.pyi


def _stub(name="_engine"):
    return ast.parse((PKG_DIR / f"{name}.pyi").read_text())


def _public(names):
    return {n for n in names if not n.startswith("_")}


@pytest.mark.parametrize("ext", EXTENSIONS)
def test_stub_names_match_the_extension(ext):
    engine = pytest.importorskip(f"strata_lab.{ext}")
    stub = _stub(ext)
    stub_top = set()
    stub_members: dict[str, set[str]] = {}
    for node in stub.body:
        if isinstance(node, ast.ClassDef):
            stub_top.add(node.name)
            stub_members[node.name] = {
                n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            } | {
                t.id for n in node.body if isinstance(n, ast.AnnAssign) for t in [n.target]
                if isinstance(t, ast.Name)
            } | {
                t.id for n in node.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)
            }
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            stub_top.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            stub_top.add(node.target.id)
        elif isinstance(node, ast.Assign):
            stub_top.update(t.id for t in node.targets if isinstance(t, ast.Name))
    real_top = _public(n for n in dir(engine) if not inspect.ismodule(getattr(engine, n)))
    assert stub_top - {"annotations"} >= real_top, f"missing from {ext}.pyi: {sorted(real_top - stub_top)}"
    assert real_top >= _public(stub_top), f"in {ext}.pyi but not in the extension: {sorted(_public(stub_top) - real_top)}"
    for cls, members in stub_members.items():
        obj = getattr(engine, cls)
        if not inspect.isclass(obj) or issubclass(obj, BaseException):
            continue
        real = _public(vars(obj))
        assert _public(members) >= real, f"{cls}: missing from the stub: {sorted(real - _public(members))}"
        assert real >= _public(members), f"{cls}: in the stub only: {sorted(_public(members) - real)}"


@pytest.mark.parametrize("ext", EXTENSIONS)
def test_stub_signatures_match_the_extension(ext):
    """Parameter names of every stubbed function and method equal the ones pybind11 reports."""
    engine = pytest.importorskip(f"strata_lab.{ext}")
    sig_line = re.compile(r"^(\w+)\((.*?)\)(?: -> .*)?$")

    def real_params(fn):
        doc = (getattr(fn, "__doc__", None) or "").strip().splitlines()
        for line in doc:
            m = sig_line.match(line.strip())
            if m:
                params = [p.split(":")[0].strip() for p in _split_args(m.group(2))]
                return [p for p in params if p and p not in ("self", "*", "/") and not p.startswith("*")]
        return None

    checked = 0
    for node in _stub(ext).body:
        items = []
        if isinstance(node, ast.FunctionDef):
            items.append((getattr(engine, node.name), node))
        elif isinstance(node, ast.ClassDef):
            obj = getattr(engine, node.name)
            for f in node.body:
                if isinstance(f, ast.FunctionDef) and not f.name.startswith("__") and hasattr(obj, f.name):
                    attr = inspect.getattr_static(obj, f.name)
                    if isinstance(attr, property):
                        continue
                    items.append((getattr(obj, f.name), f))
        for fn, f in items:
            real = real_params(fn)
            if real is None:
                continue
            args = f.args
            stub = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs if a.arg != "self"]
            assert stub == real, f"{f.name}: stub params {stub} != extension params {real}"
            checked += 1
    assert checked > 5


def _split_args(text):
    depth, cur, out = 0, "", []
    for ch in text:
        if ch in "[(" :
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur)
    return out


def test_no_file_points_outside_the_repository():
    offenders = []
    pattern = re.compile(r"/(?:work|home|Users)/\w|\.\./shared")  # a machine's folders, or the repo's sibling
    for path in REPO.rglob("*"):
        rel = path.relative_to(REPO)
        hidden = any(p.startswith(".") and p != ".ci" for p in rel.parts)
        if hidden or rel.parts[0] == "build" or not path.is_file() or path.suffix in {".so", ".png", ".jsonl"}:
            continue
        if any(p.endswith(".egg-info") or p == "__pycache__" for p in rel.parts):
            continue
        try:
            text = path.read_text("utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for i, line in enumerate(text.splitlines(), 1):
            if pattern.search(line):
                offenders.append(f"{rel}:{i}: {line.strip()[:100]}")
    assert not offenders, "\n".join(offenders)


def test_docs_cite_only_files_in_the_repository():
    # the contracts and the model math live in docs/, so code can cite them
    for name in ("CONTRACTS.md", "ENGINE.md", "ARCHITECTURE.md", "DUMP_FORMAT.md"):
        assert (REPO / "docs" / name).is_file(), name
    cited = set()
    for path in list(PKG_DIR.rglob("*.py")) + list((REPO / "docs").rglob("*.md")) + [REPO / "README.md"]:
        cited.update(re.findall(r"\b(DESIGN\.md|docs/ENGINE.md\.md|STYLE\.md)\b", path.read_text()))
    assert not cited, f"files outside the repository are cited: {sorted(cited)}"


def test_type_checking_block_names_every_export():
    source = (PKG_DIR / "__init__.py").read_text()
    block = source[source.index("if TYPE_CHECKING:"):]
    tree = ast.parse(block.replace("if TYPE_CHECKING:", "if True:", 1))
    imported = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for a in node.names}
    assert imported == set(strata_lab._EXPORTS), sorted(set(strata_lab._EXPORTS) ^ imported)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for a in node.names:
                assert strata_lab._EXPORTS[a.name] == node.module or node.module.startswith(
                    strata_lab._EXPORTS[a.name]), f"{a.name}: TYPE_CHECKING imports it from {node.module}"


def test_long_modules_say_why():
    # STYLE: 50-400 lines is the comfortable range; a longer module states its reason in its docstring
    long = []
    for path in sorted(PKG_DIR.rglob("*.py")):
        lines = path.read_text().count("\n")
        if lines > 420:
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
            if "Why one module:" not in doc:
                long.append(f"{path.relative_to(PKG_DIR)}: {lines} lines")
    assert not long, "modules over ~400 lines without 'Why one module:' in their docstring: " + ", ".join(long)


def test_readme_is_a_five_minute_read_that_points_to_every_guide_page():
    # issue 51: at most 150 lines; the rest is the user guide (docs/guide/), indexed in docs/README.md
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert readme.count("\n") <= 150, f"README.md has {readme.count(chr(10))} lines (at most 150)"
    index = (REPO / "docs" / "README.md").read_text(encoding="utf-8")
    pages = sorted(p.name for p in (REPO / "docs" / "guide").glob("*.md"))
    assert pages and all(f"(guide/{name})" in index for name in pages), pages
    assert "](docs/README.md)" in readme


# --- every repository path the README and the docs cite exists ------------------------------------------
# docs/research/ quotes other projects' paths (vLLM, SGLang), so it is not among them
CITING = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "docs" / "guide").glob("*.md")),
          REPO / "benchmarks" / "results" / "README.md", REPO / "benchmarks" / "results" / "history.md"]
_SPAN = re.compile(r"`([^`\n]+)`|\]\(([^)\s#]+)(?:#[^)]*)?\)")
_TOKEN = re.compile(r"[A-Za-z0-9_.*/-]+")
_SOURCE = re.compile(r"\.(py|pyi|cpp|h|md|toml|ipynb|jinja|sh)$")
# names that look like files but are not ours: other projects' sources the docs quote (vLLM, llama.cpp)
FOREIGN = {"llama.cpp",  # the project, not a file
           "chat_template.jinja",  # a model folder's file
           "single_type_kv_cache_manager.py", "server-task.cpp", "server-context.cpp", "block_pool.py",
           "sampling_params.py"}


def _top_level():
    return {p.name for p in REPO.iterdir() if not p.name.startswith(".")}


def _subpackages():
    return {p.name for p in PKG_DIR.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}


def _file_names():
    names = set()
    for root in ("strata_lab", "engine", "benchmarks", "tests", "scripts", "docs", "notebooks"):
        names.update(p.name for p in (REPO / root).rglob("*") if p.is_file())
    return names | {p.name for p in REPO.iterdir() if p.is_file()}


def cited_paths(path: Path):
    """(line, token, candidates): each repository path a markdown file cites in backticks or a link, with the
    places it may live (any one must exist); a bare source file name may live anywhere in the repository."""
    top, subs = _top_level(), _subpackages()
    text = path.read_text(encoding="utf-8")
    out = []
    for m in _SPAN.finditer(text):
        line = text[:m.start()].count("\n") + 1
        for token in _TOKEN.findall(m.group(1) or m.group(2)):
            token = token.rstrip(".,:;")
            if token.startswith("."):
                continue  # a suffix (`.jinja`), not a path
            first = token.split("/")[0]
            if "/" in token and first in top:
                out.append((line, token, [REPO / token.rstrip("/")]))
            elif "/" in token and first in subs:       # package-relative: server/cpu.py
                out.append((line, token, [PKG_DIR / token.rstrip("/")]))
            elif m.group(2) and not token.startswith(("http", "mailto")) and "/" in token and first in {".", ".."}:
                out.append((line, token, [(path.parent / token).resolve()]))
            elif "/" not in token and _SOURCE.search(token) and token not in FOREIGN:
                out.append((line, token, [path.parent / token, None]))   # None: anywhere by name
            elif m.group(2) and "/" not in token and not token.startswith("http") and _SOURCE.search(token):
                out.append((line, token, [path.parent / token]))
    return out


def test_cited_paths_are_found():
    # the parser must see the citations, or the check below passes on nothing
    tokens = {t for _, t, _ in cited_paths(REPO / "docs" / "ARCHITECTURE.md")}
    assert {"strata_lab/server/app.py", "engine/include/strata/kernels.h", "docs/CONTRACTS.md"} <= tokens
    assert "benchmarks/kernels/ab_decode.py" in {t for _, t, _ in cited_paths(REPO / "benchmarks" / "results" / "README.md")}


@pytest.mark.parametrize("doc", CITING, ids=lambda p: str(p.relative_to(REPO)))
def test_docs_cite_only_paths_that_exist(doc):
    names = _file_names()
    missing = []
    for line, token, places in cited_paths(doc):
        found = any(p is None and Path(token).name in names or p is not None and list(p.parent.glob(p.name))
                    for p in places)
        if not found:
            missing.append(f"{doc.relative_to(REPO)}:{line}: {token}")
    assert not missing, "cited but not in the repository:\n" + "\n".join(missing)


def test_results_index_lists_every_result_file():
    results = REPO / "benchmarks" / "results"
    index = (results / "README.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"`([^`\s]+)`", index))
    files = {str(p.relative_to(results)) for p in results.rglob("*") if p.is_file()} - {"README.md"}
    assert not files - listed, f"benchmarks/results/README.md does not list: {sorted(files - listed)}"


def test_architecture_layers_are_the_enforced_ones():
    # docs/ARCHITECTURE.md's layer table, top to bottom, is pyproject.toml's layers contract, row for row
    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c["layers"] for c in config["contracts"] if c["type"] == "layers")
    enforced = [set(part.strip() for part in row.split("|")) for row in layers]
    rows = re.findall(r"^\| \d+ \| (.+?) \|", (REPO / "docs" / "ARCHITECTURE.md").read_text(), re.M)
    documented = [{"strata_lab." + m.replace("strata_lab/", "").strip("/").removesuffix(".py")
                   for m in re.findall(r"`(strata_lab/[\w/.]+)`", row)} for row in rows]
    assert documented == enforced
