import os

import pytest

# Tests never touch the user's real cache: the built tokenizer goes to a per-run cache dir
# unless the caller chose one (CI keeps it between steps of one run).
os.environ.setdefault("STRATA_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", "build", "test-cache"))
# Some tests import torch (transformers references) before the engine loads: PyTorch's libgomp, loaded first,
# would be the engine's too with spinning waits (strata_lab.engine warns). Sleeping waits from the start.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")


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
