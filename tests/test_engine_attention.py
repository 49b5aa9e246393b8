"""Engine tier: the attention kernel on its own (strata_lab._engine._attention) against a float64 numpy
reference, at contexts longer than one key tile (64 keys) with sizes that fit no tile (n, context, head_dim
odd multiples of 8, GQA groups of 1-3), at every vector level this machine runs (avx2: the tiled
online-softmax kernel; scalar: the per-query loop); and the contract decode relies on: a query's output has
the same bits whichever other queries share the call."""
import numpy as np
import pytest

_engine = pytest.importorskip("strata_lab._engine")

# |error| bound against float64: outputs are convex combinations of N(0, 1) values; float32 accumulation
# over a few hundred keys and a 128-long dot measured ~1.5e-6.
TOL = 2e-5

# (queries n, context T, heads H, kv heads Hkv, head_dim hd): T > 64 (several key tiles, the last partial),
# n not a multiple of the 16-position query block, hd not a multiple of 32 (partial column groups)
CASES = [(150, 203, 4, 2, 40), (37, 37, 6, 2, 24), (3, 300, 6, 2, 128), (1, 129, 16, 8, 128), (97, 97, 3, 1, 8),
         (70, 133, 3, 3, 16)]


def reference(q, k, v):
    n, H, hd = q.shape
    T, Hkv, _ = k.shape
    G = H // Hkv
    q, k, v = q.astype(np.float64), k.astype(np.float64), v.astype(np.float64)
    out = np.empty((n, H, hd))
    visible = np.arange(T)[None, :] <= np.arange(T - n, T)[:, None]  # causal: query i at position T - n + i
    for h in range(H):
        s = np.where(visible, q[:, h] @ k[:, h // G].T / np.sqrt(hd), -np.inf)
        p = np.exp(s - s.max(1, keepdims=True))
        out[:, h] = (p / p.sum(1, keepdims=True)) @ v[:, h // G]
    return out


def inputs(n, T, H, Hkv, hd, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((n, H, hd), dtype=np.float32) * 3  # peaked softmax: the running max matters
    k = rng.standard_normal((T, Hkv, hd), dtype=np.float32)
    v = rng.standard_normal((T, Hkv, hd), dtype=np.float32)
    return q, k, v


def levels():
    best = _engine.kernel_level()
    order = ["scalar", "avx2", "avx512", "avx512bf16"]
    return order[: order.index(best) + 1]


@pytest.fixture(params=levels())
def level(request):
    best = _engine.kernel_level()
    used = _engine.set_kernel_level(request.param)
    assert used == request.param
    yield used
    _engine.set_kernel_level(best)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "n%d-T%d-H%d-kv%d-hd%d" % c)
def test_attention_matches_float64_reference(level, case):
    q, k, v = inputs(*case)
    out = _engine._attention(q, k, v, case[2], case[3], threads=2)
    assert out.shape == q.shape and out.dtype == np.float32
    err = np.abs(out - reference(q, k, v)).max()
    assert err <= TOL, f"{level}: max |error| {err:.2e} > {TOL}"


def test_tiled_and_scalar_paths_agree_and_differ_from_a_wrong_mask():
    """The A/B switch really selects another implementation, and both agree; a reference that lets the
    queries see one future key does not (the comparison can fail)."""
    q, k, v = inputs(100, 180, 4, 2, 64, seed=1)
    tiled = _engine._attention(q, k, v, 4, 2)
    _engine._set_kernel_option("attn_tiled", False)
    try:
        plain = _engine._attention(q, k, v, 4, 2)
    finally:
        _engine._set_kernel_option("attn_tiled", True)
    assert np.abs(tiled - plain).max() <= TOL
    leaky = reference(q, np.concatenate([k, k[-1:]]), np.concatenate([v, v[-1:] + 5]))  # shifted by one
    assert np.abs(tiled - leaky).max() > 100 * TOL


@pytest.mark.parametrize("threads", [1, 2])
def test_each_query_has_the_same_bits_alone_as_in_any_block(level, threads):
    """Decode computes one position alone against the whole cache; the full forward computes it in a
    block with others. Every query, and every split of the queries into calls, must give the same bits."""
    n, T, H, Hkv, hd = 90, 200, 6, 2, 128  # positions 110..199: two key tiles and a partial third
    q, k, v = inputs(n, T, H, Hkv, hd, seed=2)
    full = _engine._attention(q, k, v, H, Hkv, threads=threads)
    for i in [0, 1, 15, 16, 17, 40, 63, 89]:  # one query, cache up to its own position
        alone = _engine._attention(q[i:i + 1], k[:T - n + i + 1], v[:T - n + i + 1], H, Hkv, threads=threads)
        assert np.array_equal(alone[0], full[i]), f"query {i} differs alone ({level})"
    for a, b in [(0, 7), (7, 30), (30, 90)]:  # chunks that cut the 16-position blocks elsewhere
        part = _engine._attention(q[a:b], k[:T - n + b], v[:T - n + b], H, Hkv, threads=threads)
        assert np.array_equal(part, full[a:b])


def test_attention_rejects_bad_shapes():
    q, k, v = inputs(4, 10, 4, 2, 16)
    with pytest.raises(ValueError):
        _engine._attention(q, k, v, 3, 2)  # H does not match q
    with pytest.raises(ValueError):
        _engine._attention(q, k[:3], v[:3], 4, 2)  # fewer cache rows than queries


def test_long_prompt_decode_bit_identical_to_full_forward(tmp_path):
    """The engine-level contract across several key tiles: a 150-token prompt (prefill in query blocks),
    then greedy decode; the last decode step's logits equal the full forward's row, bit for bit, and so does
    re-reading one token after cutting the cache back to 131 (a position inside the third key tile)."""
    from strata_lab.engine import Engine
    from strata_lab.tiny import make_tiny

    eng = Engine.load(make_tiny(tmp_path / "ck", dtype="bfloat16", seed=5), threads=2, max_context=512)
    _decode_equals_full_forward(eng, np.random.default_rng(3).integers(0, 151000, 150).tolist(), "long")


def _decode_equals_full_forward(eng, prompt, name):
    """Prefill `prompt`, greedy-decode 4 tokens, then cut back to 131 ids and re-read one: the greedy ids, the
    last decode step's logits and the re-read logits equal the full forward's, bit for bit. Returns the full
    forward's logits over the held ids."""
    s = eng.session(name)
    r = s.generate(prompt, max_new_tokens=4).result
    full = eng.forward(s.held_ids)
    assert r.gen_ids == [int(np.argmax(full[i])) for i in range(len(prompt) - 1, len(s.held_ids) - 1)]
    np.testing.assert_array_equal(s.last_logits(), full[-1])
    s.generate(prompt[:131], max_new_tokens=0)
    np.testing.assert_array_equal(s.last_logits(), eng.forward(prompt[:131])[-1])
    return full


# Decode (1-6 queries) at long contexts: the streaming decode path (kernel option attn_decode, on by default:
# each thread walks the key tiles once for a contiguous run of kv heads) against float64, against the
# per-kv-head decode it replaced (attn_decode off: same per-row arithmetic, so the same bits), over thread
# counts, and against the same positions computed inside a prefill-sized call (decode == full forward).
# Contexts not a multiple of the 64-key tile; GQA groups 1-4; kv head counts that 2 or 3 threads split
# unevenly.
DECODE_CASES = [(1, 1000, 16, 8, 128), (1, 2047, 8, 2, 64), (1, 3001, 12, 3, 128), (2, 1500, 4, 4, 40),
                (3, 1099, 16, 4, 24), (6, 777, 6, 1, 128), (1, 65, 3, 3, 8)]


def _decode_bits(q, k, v, H, Hkv, threads, on=True):
    _engine._set_kernel_option("attn_decode", on)
    try:
        return _engine._attention(q, k, v, H, Hkv, threads=threads)
    finally:
        _engine._set_kernel_option("attn_decode", True)


@pytest.mark.parametrize("case", DECODE_CASES, ids=lambda c: "n%d-T%d-H%d-kv%d-hd%d" % c)
def test_decode_path_matches_reference_old_decode_and_thread_counts(level, case):
    n, T, H, Hkv, hd = case
    q, k, v = inputs(*case, seed=7)
    assert _engine._kernel_option("attn_decode")
    out = _decode_bits(q, k, v, H, Hkv, 2)
    err = np.abs(out - reference(q, k, v)).max()
    assert err <= TOL, f"{level}: max |error| {err:.2e} > {TOL}"
    assert np.array_equal(out, _decode_bits(q, k, v, H, Hkv, 2, on=False)), "attn_decode on/off bits differ"
    for threads in (1, 3):
        assert np.array_equal(out, _decode_bits(q, k, v, H, Hkv, threads)), f"{threads} threads: other bits"


@pytest.mark.parametrize("threads", [1, 2])
def test_decode_path_bits_equal_the_prefill_block(threads):
    """Positions 2990..3000 of a 3001-key context: each decoded alone (and two of them together) gives the
    bits the prefill-sized call (tiled query blocks, packed key tiles) gives the same positions."""
    n, T, H, Hkv, hd = 11, 3001, 8, 4, 128
    q, k, v = inputs(n, T, H, Hkv, hd, seed=8)
    full = _engine._attention(q, k, v, H, Hkv, threads=threads)
    for i in [0, 5, 10]:
        alone = _engine._attention(q[i:i + 1], k[:T - n + i + 1], v[:T - n + i + 1], H, Hkv, threads=threads)
        assert np.array_equal(alone[0], full[i]), f"query {i} differs alone"
    two = _engine._attention(q[3:5], k[:T - n + 5], v[:T - n + 5], H, Hkv, threads=threads)
    assert np.array_equal(two, full[3:5])


# f16 KV cache (kernel option kv_f16, off by default): the cache rounded to f16 (round to nearest even,
# numpy's float16), then the same kernel; checked against float64 attention over the rounded K/V, decode
# (streaming path, 1 and 2 threads, on/off) against the prefill-sized call, and at the engine level: decode
# logits equal the full forward's with the option on, and stay close to the f32 cache's.
@pytest.mark.parametrize("case", CASES + DECODE_CASES[:4], ids=lambda c: "n%d-T%d-H%d-kv%d-hd%d" % c)
def test_f16_cache_attention_matches_reference_on_rounded_kv(level, case):
    n, T, H, Hkv, hd = case
    q, k, v = inputs(*case, seed=9)
    k[3, 0, :2] = [1e-6, -3e-7]  # f16 subnormals
    out = _engine._attention(q, k, v, H, Hkv, threads=2, kv_f16=True)
    k16, v16 = k.astype(np.float16).astype(np.float32), v.astype(np.float16).astype(np.float32)
    err = np.abs(out - reference(q, k16, v16)).max()
    assert err <= TOL, f"{level}: max |error| {err:.2e} > {TOL}"
    # the cache's rounding is numpy's (nearest even), also near f16's top (65504; 65519 is the largest float32
    # that rounds down to it): the f16 cache gives the bits the f32 kernel gives the pre-rounded values
    v[1, 0, :4] = [4000.5, -60000.0, 65519.0, 2049.0]
    k[2, -1, :2] = [0.1, 1.0 + 2.0**-11]  # a tie: rounds to even
    out = _engine._attention(q, k, v, H, Hkv, threads=2, kv_f16=True)
    k16, v16 = k.astype(np.float16).astype(np.float32), v.astype(np.float16).astype(np.float32)
    # above the scalar level the f16 cache runs the AVX2 tiled kernel (AVX-512 CPUs too): the f32 kernel at
    # avx2 is the one with the same arithmetic
    _engine.set_kernel_level("avx2" if level in ("avx512", "avx512bf16") else level)
    try:
        same = _engine._attention(q, k16, v16, H, Hkv, threads=2)
    finally:
        _engine.set_kernel_level(level)
    assert np.array_equal(out, same)


@pytest.mark.parametrize("threads", [1, 2])
def test_f16_cache_decode_bits_equal_the_prefill_block(threads):
    n, T, H, Hkv, hd = 11, 2001, 8, 4, 128
    q, k, v = inputs(n, T, H, Hkv, hd, seed=10)
    full = _engine._attention(q, k, v, H, Hkv, threads=threads, kv_f16=True)
    for on in (True, False):
        _engine._set_kernel_option("attn_decode", on)
        try:
            for i in [0, 10]:
                alone = _engine._attention(q[i:i + 1], k[:T - n + i + 1], v[:T - n + i + 1], H, Hkv, threads=threads,
                                           kv_f16=True)
                assert np.array_equal(alone[0], full[i]), f"query {i} differs alone (attn_decode {on})"
        finally:
            _engine._set_kernel_option("attn_decode", True)


@pytest.mark.parametrize("threads", [1, 2])
def test_f16_cache_prefill_blocks_keep_each_querys_bits(level, threads):
    """A prefill of 300 queries at a 400-key f16 cache runs three query blocks (128, 128 and a partial 44) whose
    key tiles are copied as f16 and widened in registers: every query gives the bits it gives alone (decode) and
    in calls cut elsewhere, and the bits of the f32 kernel (avx2) on the pre-rounded cache."""
    n, T, H, Hkv, hd = 300, 400, 16, 8, 128
    q, k, v = inputs(n, T, H, Hkv, hd, seed=11)
    k16, v16 = k.astype(np.float16), v.astype(np.float16)
    full = _engine._attention(q, k16, v16, H, Hkv, threads=threads)
    for i in [0, 1, 63, 64, 127, 128, 129, 200, 255, 256, 299]:
        alone = _engine._attention(q[i:i + 1], k16[:T - n + i + 1], v16[:T - n + i + 1], H, Hkv, threads=threads)
        assert np.array_equal(alone[0], full[i]), f"query {i} differs alone ({level})"
    for a, b in [(0, 100), (100, 250), (250, 300)]:
        part = _engine._attention(q[a:b], k16[:T - n + b], v16[:T - n + b], H, Hkv, threads=threads)
        assert np.array_equal(part, full[a:b]), f"queries {a}..{b} differ ({level})"
    if level != "scalar":
        _engine.set_kernel_level("avx2")
        try:
            same = _engine._attention(q, k16.astype(np.float32), v16.astype(np.float32), H, Hkv, threads=threads)
        finally:
            _engine.set_kernel_level(level)
        assert np.array_equal(full, same)
    err = np.abs(full - reference(q, k16.astype(np.float32), v16.astype(np.float32))).max()
    assert err <= TOL, f"{level}: max |error| {err:.2e} > {TOL}"


def test_f16_cache_engine_decode_equals_full_forward_and_stays_close_to_f32(tmp_path):
    """A bf16 model folder gets an f16 cache by default (kv_cache="auto"): decode equals the full forward, the
    logits differ from an explicit f32 cache's (the cache really changed) and stay close to them."""
    from strata_lab.engine import Engine
    from strata_lab.tiny import make_tiny

    path = make_tiny(tmp_path / "ck", dtype="bfloat16", seed=5)
    prompt = np.random.default_rng(4).integers(0, 151000, 150).tolist()
    f32 = Engine.load(path, threads=2, max_context=512, kv_cache="f32")
    assert f32.info["kv_cache"] == "f32"
    ref = _decode_equals_full_forward(f32, prompt, "f32")[: len(prompt)]
    eng = Engine.load(path, threads=2, max_context=512)
    assert eng.info["kv_cache"] == "f16"
    half = _decode_equals_full_forward(eng, prompt, "f16")[: len(prompt)]
    assert not np.array_equal(half, ref)
    scale = np.abs(ref).max()
    assert np.abs(half - ref).max() <= 2e-2 * scale, (np.abs(half - ref).max(), scale)
    assert np.array_equal(half, Engine.load(path, threads=2, max_context=512, kv_cache="f16").forward(prompt))


def test_kv_cache_auto_explicit_and_the_kernel_option_override(tmp_path):
    """f32 weights: "auto" is f32; kv_cache="f16" gives the f16 cache's logits; the kernel option kv_f16
    turns an "auto" engine's new caches to f16 (the same bits) but not an explicit kv_cache="f32"; int8
    weights default to f16; a bad kv_cache is a ValueError naming the field."""
    from strata_lab.engine import Engine
    from strata_lab.tiny import make_tiny

    path = make_tiny(tmp_path / "ck", dtype="float32", seed=6)
    prompt = np.random.default_rng(5).integers(0, 151000, 80).tolist()
    auto = Engine.load(path, threads=2, max_context=256)
    assert auto.info["kv_cache"] == "f32"
    ref = auto.forward(prompt)
    np.testing.assert_array_equal(ref, Engine.load(path, threads=2, max_context=256, kv_cache="f32").forward(prompt))
    half = Engine.load(path, threads=2, max_context=256, kv_cache="f16").forward(prompt)
    assert not np.array_equal(half, ref)
    assert not _engine._kernel_option("kv_f16")
    explicit = Engine.load(path, threads=2, max_context=256, kv_cache="f32")
    _engine._set_kernel_option("kv_f16", True)
    try:
        np.testing.assert_array_equal(auto.forward(prompt), half)  # caches created while the option is on
        np.testing.assert_array_equal(explicit.forward(prompt), ref)  # an explicit kv_cache wins
    finally:
        _engine._set_kernel_option("kv_f16", False)
    np.testing.assert_array_equal(auto.forward(prompt), ref)
    assert Engine.load(path, threads=1, weights="int8").info["kv_cache"] == "f16"
    assert Engine.load(path, threads=1, weights="int8", kv_cache="f32").info["kv_cache"] == "f32"
    for bad in ("F16", "bf16", None, 16, "Q8", "q8_0", "int8"):
        with pytest.raises(ValueError, match="kv_cache must be 'auto', 'f32', 'f16' or 'q8'"):
            Engine.load(path, threads=1, kv_cache=bad)
    with pytest.raises(ValueError, match="kv_cache must be"):
        _engine.Engine(str(path), 1, 0, True, False, "stored", "half")


# Decode's prefetch walks the next key tile line by line (the span's last line too when the rows do not start
# on a 64-byte line) and asks for key tile 0 up front. Prefetch only: an f16 cache 16 bytes past a line gives
# the bits of the same cache on a line, and of the full (prefill) kernel at the same positions.
@pytest.mark.parametrize("case", DECODE_CASES[:5], ids=lambda c: "n%d-T%d-H%d-kv%d-hd%d" % c)
def test_decode_prefetch_of_unaligned_rows_keeps_the_bits(case):
    n, T, H, Hkv, hd = case
    q, k, v = inputs(*case, seed=11)
    buf = np.empty(2 * k.size + 64, dtype=np.float16)  # float16 views 16 bytes past a 64-byte line
    start = ((64 - buf.ctypes.data % 64) % 64 + 16) // 2
    k16 = buf[start:start + k.size].reshape(k.shape)
    v16 = buf[start + k.size:start + 2 * k.size].reshape(v.shape)
    k16[...], v16[...] = k, v
    assert k16.ctypes.data % 64 == 16
    aligned = _engine._attention(q, k.astype(np.float16), v.astype(np.float16), H, Hkv, threads=2)
    assert np.array_equal(_engine._attention(q, k16, v16, H, Hkv, threads=2), aligned)
    assert np.array_equal(_engine._attention(q, k16, v16, H, Hkv, threads=1), aligned)


@pytest.mark.parametrize("name", ["linear_prefetch", "attn_pf_lines", "attn_first_tile", "release_teams", "decode_seq",
                                  "decode_pool", "bf16_eo", "decode_rows8", "decode_runs"])
def test_deleted_kernel_switches_are_a_clear_error(name):
    """The switches whose A/B was decided are gone with their losing code (benchmarks/results/history.md):
    setting or reading one names the switches that remain."""
    for call in (lambda: _engine._set_kernel_option(name, True), lambda: _engine._kernel_option(name)):
        with pytest.raises(ValueError, match=r"unknown kernel option '\w+' \(int8_dot"):
            call()


def test_float16_cache_arrays_are_the_rounded_cache_and_bad_mixes_are_refused():
    """float16 k and v go to the f16 kernel as they are: the bits kv_f16=True gives the f32 arrays (which it
    rounds the same way); mixed dtypes, kv_f16 with float16 arrays and strided float16 views are refused."""
    n, T, H, Hkv, hd = 3, 300, 6, 2, 128
    q, k, v = inputs(n, T, H, Hkv, hd, seed=12)
    k16, v16 = k.astype(np.float16), v.astype(np.float16)
    out = _engine._attention(q, k16, v16, H, Hkv, threads=2)
    assert np.array_equal(out, _engine._attention(q, k, v, H, Hkv, threads=2, kv_f16=True))
    assert not np.array_equal(out, _engine._attention(q, k, v, H, Hkv, threads=2))  # f32 cache: other bits
    with pytest.raises(ValueError, match="both be float16"):
        _engine._attention(q, k16, v, H, Hkv)
    with pytest.raises(ValueError, match="float16 already"):
        _engine._attention(q, k16, v16, H, Hkv, kv_f16=True)
    with pytest.raises(ValueError, match="C-contiguous"):
        _engine._attention(q, k16[::2], v16[::2], H, Hkv)
