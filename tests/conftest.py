import os

import pytest

# Tests never touch the user's real cache: the built tokenizer goes to a per-run cache dir
# unless the caller chose one (CI keeps it between steps of one run).
os.environ.setdefault("STRATA_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", "build", "test-cache"))


@pytest.fixture(scope="session")
def qwen3():
    from strata_lab import load_tokenizer

    return load_tokenizer("qwen3")
