"""Start-up (issue 31): the byte table is cached on disk and read back exactly; a changed file is not served
from a stale cache; the byte-level check does not serialise the whole vocabulary."""
import os

import pytest

from strata_lab.text import tokenizer as tk
from strata_lab.text.vocab import _has_decoder


@pytest.fixture()
def tok_file(tmp_path, monkeypatch):
    monkeypatch.setenv("STRATA_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "tokenizer.json"
    tk.load_tokenizer("qwen3").save(path)
    return path


def _fresh(path):
    tk._LOADED.clear()
    return tk.load_tokenizer(path)


def test_byte_table_round_trips_through_the_cache(tok_file):
    first = _fresh(tok_file)
    cache = first._bytes_cache
    assert cache is not None and not cache.exists()
    built = list(first._bytes_table())  # built, then written
    assert cache.exists()
    second = _fresh(tok_file)
    assert second._bytes_cache == cache
    read = second._bytes_table()
    assert read == built and second.vocab_bytes() == first.vocab_bytes()
    ids = second.encode("Hello wörld 你好 🙂")
    assert second.ids_bytes(ids) == "Hello wörld 你好 🙂".encode()


def test_a_changed_tokenizer_file_gets_a_new_cache(tok_file):
    a = _fresh(tok_file)._bytes_cache
    st = tok_file.stat()
    os.utime(tok_file, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert _fresh(tok_file)._bytes_cache != a


def test_a_corrupt_cache_is_rebuilt(tok_file):
    first = _fresh(tok_file)
    cache = first._bytes_cache
    want = list(first._bytes_table())
    cache.write_bytes(b"not an npz")
    assert _fresh(tok_file)._bytes_table() == want



def test_byte_level_check_reads_the_decoder(tok_file):
    t = _fresh(tok_file)
    assert t._byte_level_flag is None  # nothing read at load
    assert t._byte_level is True and _has_decoder(t.hf, "ByteLevel") and not _has_decoder(t.hf, "Metaspace")
