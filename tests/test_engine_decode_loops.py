"""Engine tier: the decode matvec loop (each thread a contiguous run of 64-row chunks, stealing from the far end
of others'; AVX2 rows 4 to a micro-kernel call; AVX512BF16 bf16 rows one after another in memory order)
decides which thread computes which rows, how many rows one call takes and in which order their bytes are
read, never a row's arithmetic: at every kernel level this CPU has and at any thread count, decode gives the
bits of the full forward (prefill kernels) and covers every row exactly once."""
import numpy as np
import pytest

_engine = pytest.importorskip("strata_lab._engine")
from strata_lab.engine import Engine  # noqa: E402
from strata_lab.tiny import make_tiny  # noqa: E402

LEVELS = ["scalar", "avx2", "avx512", "avx512bf16"]
IDS = [9707, 1879, 0, 151643, 13, 220, 14990, 135992, 128, 253, 42, 7]


def _levels():
    best = _engine.kernel_level()
    return LEVELS[: LEVELS.index(best) + 1]


@pytest.fixture
def restore_level():
    saved = _engine.kernel_level()
    yield
    _engine.set_kernel_level(saved)


@pytest.mark.parametrize("rows", [8, 37, 64 * 5 + 3, 64 * 16 + 40])
def test_int8_decode_rows_bit_identical_under_every_loop(rows, restore_level):
    """n=1 (decode) rows equal the same token's row of an n=5 call (prefill tiles), at every kernel level and
    1-3 threads; row counts with a partial last quad, a partial last chunk and many chunks (stealing)."""
    rng = np.random.default_rng(rows)
    K = 96
    w = rng.integers(-127, 128, (rows, K), dtype=np.int8)
    scale = (rng.random(rows) * 0.01 + 1e-3).astype(np.float32)
    x = rng.standard_normal((5, K)).astype(np.float32)
    exact = x.astype(np.float64) @ (w.astype(np.float64) * scale[:, None]).T
    for level in _levels():
        _engine.set_kernel_level(level)
        full = _engine._int8_matmul(w, scale, x, threads=2)
        assert np.abs(full - exact).max() <= 0.02 * np.abs(exact).max()  # int8 activations: close, not exact
        for threads in (1, 2, 3):
            for t in (0, 3):
                one = _engine._int8_matmul(w, scale, x[t:t + 1], threads=threads)
                np.testing.assert_array_equal(one, full[t:t + 1], err_msg=f"{level} threads={threads}")


def _bf16_bits(a):
    """float32 -> bf16 bits (round to nearest even), as uint16."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


@pytest.mark.parametrize("K", [96, 100, 1024])
def test_bf16_decode_rows_bit_identical_under_every_loop(K, restore_level):
    """bf16 weights, several outputs in one matmul_multi (q/k/v-like; row counts with a partial last quad and
    a partial last chunk; K with and without a tail past the last 32): the rows of a decode call of 1-6 tokens
    equal those tokens' rows of a 9-token call (prefill tiles), at every kernel level and 1-3 threads."""
    rng = np.random.default_rng(K)
    ws = [_bf16_bits(rng.standard_normal((rows, K)) * 0.05) for rows in (37, 64 * 5 + 3, 8)]
    x = rng.standard_normal((9, K)).astype(np.float32)
    wf = [(w.astype(np.uint32) << 16).view(np.float32).astype(np.float64) for w in ws]
    for level in _levels():
        _engine.set_kernel_level(level)
        full = _engine._bf16_matmul(ws, x, threads=2)
        for got, w in zip(full, wf):
            exact = x.astype(np.float64) @ w.T
            assert np.abs(got - exact).max() <= 0.02 * np.abs(exact).max()  # x rounded to bf16 at AVX512BF16
        for threads in (1, 2, 3):
            for t0, n in ((0, 1), (3, 1), (2, 4), (3, 6)):
                part = _engine._bf16_matmul(ws, x[t0:t0 + n], threads=threads)
                for i, (p, f) in enumerate(zip(part, full)):
                    np.testing.assert_array_equal(p, f[t0:t0 + n], err_msg=f"{level} threads={threads} out {i} n={n}")


@pytest.mark.parametrize("weights", [None, "int8"])
def test_decode_logits_equal_full_forward_under_every_loop(tmp_path_factory, weights, restore_level):
    """bf16 rows (the even/odd kernel; the lm_head's 151,936 rows make many chunks) and int8 rows: a session's
    decode logits equal the full forward's bits at every kernel level and 1-3 threads."""
    path = make_tiny(tmp_path_factory.mktemp("dl") / "ck", dtype="bfloat16", seed=5)
    for level in _levels():
        _engine.set_kernel_level(level)
        ref = None
        for threads in (1, 2, 3):
            eng = Engine.load(path, threads=threads, weights=weights)
            s = eng.session("d")
            s.generate(IDS, max_new_tokens=4)
            full = eng.forward(s.held_ids)
            np.testing.assert_array_equal(s.last_logits(), full[-1], err_msg=f"{level} threads={threads}")
            ref = full if ref is None else ref
            np.testing.assert_array_equal(full, ref)  # the forward itself does not depend on the loop


@pytest.fixture
def restore_moe_parallel():
    saved = _engine._kernel_option("moe_parallel")
    yield
    _engine._set_kernel_option("moe_parallel", saved)


def test_moe_experts_side_by_side_keep_the_bits(tmp_path_factory, restore_moe_parallel):
    """Qwen3-Next MoE (kernel option moe_parallel: the active experts one per thread, weighted rows added in
    expert order afterwards) gives the bits of experts one after another, for a prefill and for each decode
    step, at 1-3 threads. (A hybrid's decode is not bit-equal to its full forward: the Gated DeltaNet prefill
    is chunked, its decode recurrent; test_engine_next bounds that.)"""
    path = make_tiny(tmp_path_factory.mktemp("moe") / "ck", "qwen3_next", "tiny-moe", dtype="bfloat16", seed=7)
    ids = [i % 1000 for i in IDS] * 3
    ref = ref_steps = None
    for on in (False, True):
        _engine._set_kernel_option("moe_parallel", on)
        for threads in (1, 2, 3):
            eng = Engine.load(path, threads=threads)
            full = eng.forward(ids)
            s = eng.session("m")
            s.generate(ids[:20], max_new_tokens=0)
            steps = []
            for _ in range(5):
                s.generate(s.held_ids, max_new_tokens=1)
                steps.append(s.last_logits())
            if ref is None:
                ref, ref_steps = full, steps
            np.testing.assert_array_equal(full, ref, err_msg=f"moe_parallel={on} threads={threads}")
            for got, want in zip(steps, ref_steps):
                np.testing.assert_array_equal(got, want, err_msg=f"decode, moe_parallel={on} threads={threads}")
