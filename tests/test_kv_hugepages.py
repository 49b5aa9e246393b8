"""Engine tier: the f32 / f16 / q8 KV cache arrays of 2 MiB and more sit on their own 2 MiB-aligned mappings, advised
as transparent huge pages before they are touched (issue 32: decode attention at 1,024 tokens streamed its
4 KiB-paged cache ~1.2x slower; benchmarks/results/kv_hugepages.md). STRATA_KV_HUGEPAGES=0,
read at each allocation, keeps plain pages (the A/B). Checked: the same bits with and without, through the
cache's growth from malloc'ed to mapped arrays, a cut back and a regrowth; and, where THP runs in "madvise"
mode, that the cache really lands on huge pages only when advised."""
from pathlib import Path

import numpy as np
import pytest

_engine = pytest.importorskip("strata_lab._engine")
from strata_lab.engine import Engine  # noqa: E402
from strata_lab.tiny import make_tiny  # noqa: E402

# 8 kv heads x head_dim 128: a 2 KiB f16 row (4 KiB f32), so 1,100 tokens make each K and V array >= 2 MiB.
SHAPE = {"vocab_size": 4096, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 16,
         "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 128}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("kvhuge") / "m", dtype="bfloat16", seed=3, overrides=SHAPE)


def _run(eng, name, prompt):
    """Prefill in two calls (the cache grows from a malloc'ed array below 2 MiB to a mapped one), decode, cut
    back to a prefix and grow again: every step's logits."""
    s = eng.session(name)
    out = []
    s.generate(prompt[:300], max_new_tokens=0).result
    out.append(s.last_logits().copy())
    r = s.generate(prompt, max_new_tokens=6).result
    out.append(s.last_logits().copy())
    held = list(s.held_ids)
    s.generate(prompt[:700], max_new_tokens=0).result  # cut back
    out.append(s.last_logits().copy())
    s.generate(prompt + r.gen_ids, max_new_tokens=3).result  # regrow past the old length
    out.append(s.last_logits().copy())
    return r.gen_ids, held, out


@pytest.mark.parametrize("kv_cache", ["f16", "f32", "q8"])
def test_huge_page_cache_gives_the_plain_page_cache_bits(folder, kv_cache, monkeypatch):
    eng = Engine.load(folder, threads=2, max_context=2048, kv_cache=kv_cache)
    prompt = np.random.default_rng(0).integers(0, SHAPE["vocab_size"], 1100).tolist()
    monkeypatch.setenv("STRATA_KV_HUGEPAGES", "0")
    plain_ids, _, plain = _run(eng, "plain", prompt)
    monkeypatch.delenv("STRATA_KV_HUGEPAGES")
    huge_ids, held, huge = _run(eng, "huge", prompt)
    assert huge_ids == plain_ids
    for a, b in zip(huge, plain):
        np.testing.assert_array_equal(a, b)
    # and the prefill-sized forward of the same tokens (decode == full forward holds on mapped arrays too)
    np.testing.assert_array_equal(huge[1], eng.forward(held)[-1])


def _anon_huge_kib() -> int:
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    raise AssertionError("no AnonHugePages line in /proc/self/smaps_rollup")


def _thp_mode() -> str:
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return ""
    return text.split("[", 1)[1].split("]", 1)[0] if "[" in text else ""


@pytest.mark.skipif(_thp_mode() != "madvise" or not Path("/proc/self/smaps_rollup").exists(),
                    reason="needs Linux transparent huge pages in 'madvise' mode")
def test_cache_lands_on_huge_pages_only_when_advised(folder, monkeypatch):
    eng = Engine.load(folder, threads=2, max_context=4096, kv_cache="f16")
    prompt = np.random.default_rng(1).integers(0, SHAPE["vocab_size"], 2100).tolist()
    grew = {}
    for env in ("0", "1"):  # 2 layers x K, V of 2,100 x 2 KiB = 4.3 MB each: 2 whole 2 MiB pages each
        monkeypatch.setenv("STRATA_KV_HUGEPAGES", env)
        s = eng.session("s" + env)
        before = _anon_huge_kib()
        s.generate(prompt, max_new_tokens=0).result
        grew[env] = _anon_huge_kib() - before
    assert grew["1"] - grew["0"] >= 8 * 1024, grew  # >= 4 of the 8 whole huge pages the 4 arrays span
