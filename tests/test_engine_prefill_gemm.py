"""Engine tier: the bf16-weight prefill GEMM (kernels::matmul_multi through _bf16_matmul) against float64 and
against itself: every token's row has the same bits whatever the number of tokens computed with it (decode
n = 1, batched decode n <= 8, the prefill tiles and their edges), at every kernel level this CPU has, with
several outputs in one call as the q/k/v and gate/up matmuls run."""
import numpy as np
import pytest

_engine = pytest.importorskip("strata_lab._engine")

LEVELS = ["scalar", "avx2", "avx512", "avx512bf16"]


def _bf16_bits(a):
    """float32 -> bf16 bits (round to nearest even), as uint16."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _bf16_float(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _levels():
    best = _engine.kernel_level()
    return LEVELS[: LEVELS.index(best) + 1]


@pytest.mark.parametrize("K", [64, 100, 1024, 3072 + 16])
def test_bf16_prefill_rows_token_independent_and_close_to_float64(K):
    rng = np.random.default_rng(K)
    rows = (37, 64 + 8, 5)  # edges: a partial row quad, a partial row block, fewer rows than a block
    ws = [_bf16_bits(rng.standard_normal((r, K)).astype(np.float32) * 0.05) for r in rows]
    n = 29  # 6-token tiles 0..23 full, 24..28 an edge tile (5 tokens)
    x = rng.standard_normal((n, K)).astype(np.float32)
    best = _engine.kernel_level()
    try:
        for level in _levels():
            _engine.set_kernel_level(level)
            full = _engine._bf16_matmul(ws, x, threads=2)
            assert [f.shape for f in full] == [(n, r) for r in rows]
            for w, f in zip(ws, full):
                ref = x.astype(np.float64) @ _bf16_float(w).astype(np.float64).T
                # avx512bf16 rounds x to bf16 (relative 2^-9 per element), the others are f32 sums
                tol = 1e-2 if level == "avx512bf16" else 1e-4
                assert np.abs(f - ref).max() <= tol * np.abs(ref).max(), level
            for m in (1, 2, 5, 7, 8, 13):
                for t0 in range(0, n, m):
                    part = _engine._bf16_matmul(ws, x[t0:t0 + m], threads=2)
                    for p, f in zip(part, full):
                        np.testing.assert_array_equal(p, f[t0:t0 + m], err_msg=f"{level} n={m} t0={t0}")
            one = _engine._bf16_matmul(ws, x, threads=1)
            for p, f in zip(one, full):
                np.testing.assert_array_equal(p, f, err_msg=f"{level}: 1 thread")
    finally:
        _engine.set_kernel_level(best)


def test_bf16_matmul_rejects_bad_shapes():
    x = np.zeros((3, 8), np.float32)
    with pytest.raises(ValueError, match="ws\\[1\\]"):
        _engine._bf16_matmul([np.zeros((4, 8), np.uint16), np.zeros((4, 9), np.uint16)], x)
    with pytest.raises(ValueError, match="1..8"):
        _engine._bf16_matmul([], x)


@pytest.mark.parametrize("K", [72, 1040])
def test_long_prefill_rows_match_decode_across_token_chunks(K):
    # the AVX2 prefill packs x in chunks of at most 384 tokens (the tile walks K in ranges above 1024): a token's
    # row is still the bits of its own decode (n = 1) on both sides of every chunk edge. K = 72: rows widened
    # in order (K % 16 != 0); K = 1040: the even/odd order and two K ranges.
    rng = np.random.default_rng(K + 1)
    rows = (37, 72)
    ws = [_bf16_bits(rng.standard_normal((r, K)).astype(np.float32) * 0.05) for r in rows]
    n = 2 * 384 + 29  # three chunks at 4,096-token sizes: 267 + 267 + 263 (multiples of the 3-token tile)
    x = rng.standard_normal((n, K)).astype(np.float32)
    probe = sorted({0, 1, 2, 3, 265, 266, 267, 268, 383, 384, 385, 533, 534, 535, n - 2, n - 1})
    best = _engine.kernel_level()
    try:
        for level in _levels():
            _engine.set_kernel_level(level)
            full = _engine._bf16_matmul(ws, x, threads=2)
            for w, f in zip(ws, full):
                ref = x.astype(np.float64) @ _bf16_float(w).astype(np.float64).T
                tol = 1e-2 if level == "avx512bf16" else 1e-4
                assert np.abs(f - ref).max() <= tol * np.abs(ref).max(), level
            for t in probe:
                one = _engine._bf16_matmul(ws, x[t:t + 1], threads=1)
                for p, f in zip(one, full):
                    np.testing.assert_array_equal(p[0], f[t], err_msg=f"{level} token {t}")
            mid = _engine._bf16_matmul(ws, x[260:540], threads=2)  # one chunk, its edges elsewhere
            for p, f in zip(mid, full):
                np.testing.assert_array_equal(p, f[260:540], err_msg=f"{level}: tokens 260..539 alone")
    finally:
        _engine.set_kernel_level(best)
