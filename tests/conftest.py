import os

import pytest

# Tests never touch the user's real cache: the built tokenizer goes to a per-run cache dir
# unless the caller chose one (CI keeps it between steps of one run).
os.environ.setdefault("STRATA_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", "build", "test-cache"))
# Some tests import torch (transformers references) before the engine loads: PyTorch's libgomp, loaded first,
# would be the engine's too with spinning waits (strata_lab.engine warns). Sleeping waits from the start.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

# Property tests judge results, never speed: no per-example deadline (Hypothesis' default 200 ms fails a
# correct example on a machine busy with other work). A test's own settings() still override the rest.
from hypothesis import settings as _hypothesis_settings  # noqa: E402

_hypothesis_settings.register_profile("strata", deadline=None)
_hypothesis_settings.load_profile("strata")


@pytest.fixture(scope="session")
def qwen3():
    from strata_lab import load_tokenizer

    return load_tokenizer("qwen3")


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A tiny Qwen3 model folder with float32 weights (hidden 64, 2 layers, real vocab)."""
    from strata_lab.tiny import make_tiny

    return make_tiny(tmp_path_factory.mktemp("tiny_f32"), dtype="float32")


@pytest.fixture(scope="session")
def tiny_engine(tiny_dir):
    pytest.importorskip("strata_lab._engine")
    from strata_lab.engine import Engine

    return Engine.load(tiny_dir, threads=2, max_context=256)


def cuda_gpu_present() -> bool:
    """Whether a CUDA GPU is usable here: the driver library loads, initialises and counts a device (no
    framework imported; the engine's own backend says more at Engine.load(device="cuda"))."""
    import ctypes

    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    count = ctypes.c_int(0)
    return driver.cuInit(0) == 0 and driver.cuDeviceGetCount(ctypes.byref(count)) == 0 and count.value > 0


@pytest.fixture(scope="session")
def cuda_gpu() -> bool:
    return cuda_gpu_present()


def pytest_collection_modifyitems(config, items):
    """`gpu` tests are skipped without a CUDA GPU. `live` tests start real engines: they run only when `-m`
    names them (`pytest -m live`)."""
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if gpu_items and not cuda_gpu_present():
        skip_gpu = pytest.mark.skip(reason="no CUDA GPU")
        for item in gpu_items:
            item.add_marker(skip_gpu)
    if "live" in (config.getoption("markexpr", "") or ""):
        return
    skip = pytest.mark.skip(reason="live engine check: run with pytest -m live")
    for item in items:
        if item.get_closest_marker("live") is not None:
            item.add_marker(skip)


# ---- test tiers (docs/ARCHITECTURE.md, "Tests") -----------------------------------------------------------------
# Every test file has one tier, by its name. `pytest -m unit` is the quick loop (under 2 minutes on 2 cores).
# unit: seconds a file, in-process, no model run, no server; engine: heavier in-process work (our engine, the
# native replay core on stores and traces, reference tokenizers and templates from transformers, hypothesis
# sweeps, plots); server: starts processes that serve or a CLI per case (server, proxy, README blocks);
# notebook: runs the notebooks or their widgets, the browser test included. A test may carry its own tier marker
# (a cheap check in a slow file). A file missing here runs as unit, with a warning: add it.
TIERS = ("unit", "engine", "server", "notebook")
_TIER_FILES = {
    "unit": """benchmarks caches_engines caches_lint caches_replay divergence_walk docs dump_validation encoder
        glossary imported_defaults install layers outputs_safety record replay reported_agreement reported_usage
        traces traces_agents_ide traces_agents_misc traces_agents_oh traces_agents_swe traces_agents_usage traces_chaining
        traces_real
        validate_cli writer_safety sglang_oracle""",
    "engine": """batched_decode bench_bandwidth call_records cli_help cli_progress cuda engine_attention
        engine_decode_loops engine_int8 engine_load engine_load_hardening engine_logprobs engine_next
        engine_prefill_gemm engine_record engine_sampling engine_session fast_render fidelity gguf_export hash_traces
        kv_hugepages kv_q8 lint_templates model_folders native_import openai_convert plots rates_property render_vllm
        replay_native replay_one sessions store store_hostile strategies strategies_templates template templates_real tokenizer
        tokenizer_cache tokenizer_families trace_reproduce""",
    "server": """cli_errors cli_hostile docs_run proxy proxy_live server_agent server_batching server_dump_safety
        server_extra_fields server_features server_fields server_fuzz_hostile server_grammar server_http
        server_isolation server_limits server_load server_parity server_responses server_robust server_sampling
        server_security server_unit""",
    "notebook": "notebooks widgets widgets_browser",
}
TIER_OF_FILE = {f"test_{name}.py": tier for tier, names in _TIER_FILES.items() for name in names.split()}


@pytest.hookimpl(tryfirst=True, specname="pytest_collection_modifyitems")
def pytest_collection_modifyitems_tiers(config, items):
    """Marks each test with its file's tier before `-m` selects (a test's own tier marker wins)."""
    import warnings

    unknown = set()
    for item in items:
        if any(item.get_closest_marker(tier) is not None for tier in TIERS):
            continue
        tier = TIER_OF_FILE.get(item.path.name)
        if tier is None:
            unknown.add(item.path.name)
        item.add_marker(tier or "unit")
    for name in sorted(unknown):
        warnings.warn(pytest.PytestWarning(f"{name} has no tier in tests/conftest.py (TIER_OF_FILE): it runs as "
                                           f"unit; add it to unit, engine, server or notebook"))


def pytest_ignore_collect(collection_path, config):
    """With `-m`, a file none of whose tests can match is not imported (`pytest -m unit` skips importing the
    heavy files). A file's tests carry its tier or a tier marker written in it, and any other markers: the file
    is skipped only when the expression is false for every such combination."""
    expr_text = config.getoption("markexpr", "") or ""
    tier = TIER_OF_FILE.get(collection_path.name)
    if not expr_text or tier is None:
        return None
    try:
        import itertools
        import re

        from _pytest.mark.expression import Expression

        expr = Expression.compile(expr_text)
        names = set(re.findall(r"[\w.+-]+", expr_text)) - {"and", "or", "not"} - set(TIERS)
        if len(names) > 10:
            return None
        source = collection_path.read_text(encoding="utf-8")
        tiers = {tier} | set(re.findall(r"mark\.(" + "|".join(TIERS) + r")\b", source))
        for own, values in itertools.product(tiers, itertools.product((False, True), repeat=len(names))):
            marks = {own} | {n for n, v in zip(sorted(names), values) if v}
            if expr.evaluate(lambda name, /, **kwargs: name in marks):
                return None
        return True
    except Exception:  # an expression this cannot read: collect as usual, `-m` still selects
        return None
