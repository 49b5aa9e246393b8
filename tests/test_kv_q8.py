"""Engine tier: the q8 KV cache (Engine.load kv_cache="q8"; issue 32). K and V are held as int8 in blocks of 32
values along head_dim with one f16 scale per block (absmax / 127, llama.cpp's q8_0).

Checked: the quantisation rule itself (against numpy), the attention kernel over a q8 cache (query rows
quantised the same way, exact int8 block dots for the scores: float64 attention over the dequantised values is
its reference; close to attention over the unquantised ones),
decode == prefill bits at every thread count, the cache's layout in pages (numpy's reshape), and at the engine
level: decode equals the full forward,
logits and greedy ids stay close to the f32 cache's (the stated tolerance below), sessions reuse a held
prefix, cut back and restore checkpoints exactly as they do with the f16 cache, and a head_dim that is not a
multiple of 32 is a clear error. Batched decode with q8: tests/test_batched_decode.py."""
import numpy as np
import pytest

_engine = pytest.importorskip("strata_lab._engine")
from strata_lab.engine import Engine  # noqa: E402
from strata_lab.rules import CheckpointPolicy  # noqa: E402
from strata_lab.tiny import make_tiny  # noqa: E402

from test_engine_attention import TOL, inputs, level, levels, reference  # noqa: E402,F401  (level: the fixture)

# Logit error of the q8 cache against the f32 cache on the tiny models below, as a fraction of the largest
# |logit| (measured: 1.4% dense, 0.7% hybrid; the f16 cache: 0.8%, 0.9%, its bound in test_engine_attention.py
# 2%), and the share of greedy ids (teacher-forced over the f32 cache's own greedy continuation) that must
# agree (measured: 96%, as with the f16 cache).
Q8_LOGIT_TOL = 0.03
Q8_AGREE = 0.9
# The vector kernels take P V in integers: per key tile (64 keys), row and block of 32 values, the weights
# p * dv are rounded to int16 against the tile's largest one (a step of 1/32767 of it) and the sums are exact
# int32 (att_pv_q8_wq in kernels_attention.cpp). Against float64 attention over the dequantised values that adds
# up to half a step per key and value (measured up to 2.5e-4 on outputs up to 3.5 in Q8_CASES, against the
# cache's own error up to 0.054 below); the scalar level widens the cache and stays within TOL.
Q8_PV_TOL = 1e-3


def _np_q8(x):
    """numpy's reading of the rule (llama.cpp's q8_0): d = absmax / 127 (f32), q = round(x * (1 / d)), ties away
    from zero; the scale held is d rounded to f16 (nearest even: numpy's float16 cast), past f16's range its
    largest finite value."""
    b = x.astype(np.float32).reshape(*x.shape[:-1], x.shape[-1] // 32, 32)
    d = (np.abs(b).max(-1) / np.float32(127)).astype(np.float32)
    inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), 0).astype(np.float32)
    r = (b * inv[..., None]).astype(np.float32)
    q = (np.sign(r) * np.floor(np.abs(r) + np.float32(0.5))).clip(-127, 127).astype(np.int8)
    with np.errstate(over="ignore"):
        d16 = d.astype(np.float16)
    d16 = np.where(np.isinf(d16), np.finfo(np.float16).max, d16)
    return q.reshape(x.shape), d16.astype(np.float32)


def _dequant(q, d):
    """The cache's values: float(int8) * scale in f32 (one rounding), as the kernel widens them."""
    return (q.astype(np.float32).reshape(*q.shape[:-1], -1, 32) * d[..., None]).reshape(q.shape).astype(np.float32)


def test_quantize_q8_is_the_block_rule_and_within_half_a_step():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((7, 3, 96), dtype=np.float32) * rng.uniform(0.01, 50, (7, 3, 1)).astype(np.float32)
    x[0, 0, :32] = 0.0                       # an all-zero block: scale 0, values 0
    x[1, 1, 32:64] = 1e-30                   # tiny, equal values: every one the block's max (its f16 scale 0)
    x[2, 2, 64] = -1e4                       # one outlier sets its block's step
    x[3, 0, :4] = [127.0, -63.5, 0.5, 1.5]   # steps of exactly 1: ties round away from zero
    x[4, 0, 32:64] = 1e9                     # a step past f16's range: its largest finite scale
    x[5, 1, :32] = np.float32(1e-9)          # a step below f16's smallest: scale 0 (values 127 from the f32 step)
    q, d = _engine._quantize_q8(x)
    assert q.dtype == np.int8 and q.shape == x.shape and d.shape == (7, 3, 3) and d.dtype == np.float32
    nq, nd = _np_q8(x)
    np.testing.assert_array_equal(d, nd)
    np.testing.assert_array_equal(q, nq)
    assert np.abs(q.astype(np.int32)).max() == 127 and (q[0, 0, :32] == 0).all() and d[0, 0, 0] == 0
    assert list(q[3, 0, :4]) == [127, -64, 1, 2]
    assert d[4, 0, 1] == np.finfo(np.float16).max and d[5, 1, 0] == 0 and (q[5, 1, :32] == 127).all()
    assert (d.astype(np.float16).astype(np.float32) == d).all()  # every scale an f16 value
    ok = np.ones(x.shape, bool)
    ok[4, 0, 32:64] = ok[5, 1, :32] = ok[1, 1, 32:64] = False
    assert (_dequant(q, d)[1, 1, 32:64] == 0).all() and (_dequant(q, d)[5, 1, :32] == 0).all()
    # within half a step of the f32 step, plus the f16 rounding of the scale (2^-11 of it) times |q| <= 127
    step = np.repeat(d, 32, axis=-1)
    err = np.abs(_dequant(q, d) - x)
    assert (err[ok] <= (step * (0.5001 + 127 * 2.0 ** -11))[ok] + 1e-37).all(), err[ok].max()
    with pytest.raises(ValueError, match="multiple of 32"):
        _engine._quantize_q8(np.zeros((2, 40), np.float32))


Q8_CASES = [(150, 203, 4, 2, 32), (37, 37, 6, 2, 64), (3, 300, 6, 2, 128), (1, 1000, 16, 8, 128),
            (1, 2047, 8, 2, 64), (6, 777, 6, 1, 128), (2, 65, 3, 3, 32)]


@pytest.mark.parametrize("case", Q8_CASES, ids=lambda c: "n%d-T%d-H%d-kv%d-hd%d" % c)
def test_q8_cache_attention_matches_reference_on_the_quantised_values(level, case):
    """The kernel quantises the query rows like the cache (blocks of 32 along head_dim) and takes exact int8
    block dots for the scores and int16 weights for P V: float64 attention over the dequantised q, K and V is
    its reference (Q8_PV_TOL; the scalar level TOL, as f32 and f16), at every level; against the unquantised
    inputs it stays close and is not equal."""
    n, T, H, Hkv, hd = case
    q, k, v = inputs(*case, seed=21)
    out = _engine._attention(q, k, v, H, Hkv, threads=2, kv_q8=True)
    qd = _dequant(*_engine._quantize_q8(q))
    kd, vd = _dequant(*_engine._quantize_q8(k)), _dequant(*_engine._quantize_q8(v))
    assert np.abs(out - reference(qd, kd, vd)).max() <= (TOL if level == "scalar" else Q8_PV_TOL)
    err = np.abs(out - reference(q, k, v)).max()
    assert 0 < err <= 0.1, err  # measured up to 0.054 (peaked softmax: q scaled by 3)
    # the kernel over the quantised arrays as given is the same kernel
    k8, ks = _engine._quantize_q8(k)
    v8, vs = _engine._quantize_q8(v)
    assert np.array_equal(_engine._attention_q8(q, k8, ks, v8, vs, H, Hkv, threads=2), out)


@pytest.mark.parametrize("case", Q8_CASES, ids=lambda c: "n%d-T%d-H%d-kv%d-hd%d" % c)
def test_q8_cache_attention_bits_equal_at_every_vector_level(case):
    """The AVX-512 levels take the scores with VNNI where the CPU has it (vpdpbusd on k + 128, each row's
    accumulator starting at its correction -128 * sum(q)) and P V in 512-bit registers; every int32 lane and
    every float step is the AVX2 kernel's, so the bits are the same at avx2, avx512 and avx512bf16, for a
    block of queries (prefill) and for the last query alone (decode). Skipped on a CPU with AVX2 only."""
    vector = [lv for lv in levels() if lv != "scalar"]
    if len(vector) < 2:
        pytest.skip("one vector level on this CPU")
    n, T, H, Hkv, hd = case
    q, k, v = inputs(*case, seed=23)
    best = _engine.kernel_level()
    outs = {}
    try:
        for lv in vector:
            assert _engine.set_kernel_level(lv) == lv
            outs[lv] = (_engine._attention(q, k, v, H, Hkv, threads=2, kv_q8=True),
                        _engine._attention(q[-1:], k, v, H, Hkv, threads=2, kv_q8=True))
    finally:
        _engine.set_kernel_level(best)
    for lv in vector[1:]:
        assert np.array_equal(outs[lv][0], outs["avx2"][0]), f"{lv}: prefill bits differ from avx2's"
        assert np.array_equal(outs[lv][1], outs["avx2"][1]), f"{lv}: decode bits differ from avx2's"
    assert np.array_equal(outs["avx2"][1][0], outs["avx2"][0][-1])


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_q8_cache_decode_bits_equal_the_prefill_block(threads):
    n, T, H, Hkv, hd = 11, 2001, 8, 4, 128
    q, k, v = inputs(n, T, H, Hkv, hd, seed=22)
    full = _engine._attention(q, k, v, H, Hkv, threads=threads, kv_q8=True)
    for on in (True, False):
        _engine._set_kernel_option("attn_decode", on)
        try:
            for i in [0, 7, 10]:
                alone = _engine._attention(q[i:i + 1], k[:T - n + i + 1], v[:T - n + i + 1], H, Hkv,
                                           threads=threads, kv_q8=True)
                assert np.array_equal(alone[0], full[i]), f"query {i} differs alone (attn_decode {on})"
        finally:
            _engine._set_kernel_option("attn_decode", True)
    two = _engine._attention(q[3:5], k[:T - n + 5], v[:T - n + 5], H, Hkv, threads=threads, kv_q8=True)
    assert np.array_equal(two, full[3:5])


def _np_pages(k8, ks, v8, vs):
    """numpy's reading of the q8 cache's layout (state.h kQ8Page): rows [T, Hkv, d] padded with zeros to whole
    pages of 64 positions, kv head by kv head ([Hkv, pages, run]), a kv head's part of a page one run of bytes:
    K [d / 4, 64, 4] (the keys in the lanes), V [32, d, 2] (positions in pairs, interleaved value by value),
    K's scales [d / 32, 64] and V's [64, d / 32], both f16."""
    T, Hkv, d = k8.shape
    P = -(-T // 64)

    def pages(x):
        pad = np.zeros((P * 64, Hkv, x.shape[-1]), x.dtype)
        pad[:T] = x
        return pad.reshape(P, 64, Hkv, x.shape[-1])

    parts = [pages(k8).reshape(P, 64, Hkv, d // 4, 4).transpose(0, 2, 3, 1, 4),
             pages(v8).reshape(P, 32, 2, Hkv, d).transpose(0, 3, 1, 4, 2),
             pages(ks.astype(np.float16)).transpose(0, 2, 3, 1),
             pages(vs.astype(np.float16)).transpose(0, 2, 1, 3)]
    runs = [np.ascontiguousarray(x).reshape(P, Hkv, -1).view(np.int8) for x in parts]
    return np.concatenate(runs, axis=2).transpose(1, 0, 2).reshape(-1)


@pytest.mark.parametrize("T", [1, 63, 64, 65, 200])
def test_q8_cache_pages_are_64_positions_kv_head_by_kv_head(T):
    """_q8_pages lays a cache out as the engine holds it (numpy's reshape is the reference: kv head by kv head,
    one run per page of K with the keys in the lanes, V in pairs of positions and the f16 scales), and the kernel over those
    pages in place gives the bits it gives over the rows (copied into pages per call)."""
    H, Hkv, hd = 8, 4, 64
    q, k, v = inputs(3 if T >= 3 else 1, T, H, Hkv, hd, seed=T)
    k8, ks = _engine._quantize_q8(k)
    v8, vs = _engine._quantize_q8(v)
    pages = _engine._q8_pages(k8, ks, v8, vs)
    assert pages.dtype == np.int8 and pages.shape == (-(-T // 64) * Hkv * 64 * (2 * hd + 4 * hd // 32),)
    assert np.array_equal(pages, _np_pages(k8, ks, v8, vs))
    for threads in (1, 2):
        rows = _engine._attention_q8(q, k8, ks, v8, vs, H, Hkv, threads=threads)
        assert np.array_equal(rows, _engine._attention_q8_pages(q, pages, H, Hkv, length=T, threads=threads))
        assert np.array_equal(rows, _engine._attention(q, k, v, H, Hkv, threads=threads, kv_q8=True))
    with pytest.raises(ValueError, match="_q8_pages"):
        _engine._attention_q8_pages(q, pages[:-1], H, Hkv, length=T)
    with pytest.raises(ValueError, match="length >= n"):
        _engine._attention_q8_pages(q, pages, H, Hkv, length=0)
    with pytest.raises(ValueError, match="float32"):
        _engine._attention_q8(q, k8, ks[..., :1], v8, vs, H, Hkv)
    with pytest.raises(ValueError, match="k's shape"):
        _engine._q8_pages(k8, ks, v8[:, :1], vs)


def test_attention_refuses_q8_with_f16_arrays_or_both_caches():
    q, k, v = inputs(1, 40, 2, 1, 32, seed=1)
    with pytest.raises(ValueError, match="float16 already"):
        _engine._attention(q, k.astype(np.float16), v.astype(np.float16), 2, 1, kv_q8=True)
    with pytest.raises(ValueError, match="at most one"):
        _engine._attention(q, k, v, 2, 1, kv_f16=True, kv_q8=True)
    with pytest.raises(ValueError, match="multiple of 32"):
        _engine._attention(*inputs(1, 40, 2, 1, 24, seed=1), 2, 1, kv_q8=True)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("q8")
    return {
        "dense": make_tiny(root / "dense", dtype="bfloat16", seed=5, overrides={"head_dim": 64}),
        "hybrid": make_tiny(root / "hybrid", "qwen3_next", "tiny-moe", dtype="bfloat16", seed=6,
                            overrides={"head_dim": 32}),
    }


# Qwen3-Next's decode and full forward agree to this (tests/test_engine_next.py's TOL), not bit for bit at every
# kernel level: its Gated DeltaNet steps one token at a time in decode and runs the chunked form over a prompt.
NEXT_TOL = 1e-4


def _decode_equals_full_forward(eng, prompt, name, exact=True):
    """Prefill, greedy-decode 4 tokens, cut back to 131 ids and re-read one: ids and logits equal the full
    forward's, bit for bit for a dense model (as tests/test_engine_attention.py checks the f32 and f16 caches),
    within NEXT_TOL for a hybrid one."""
    s = eng.session(name)
    r = s.generate(prompt, max_new_tokens=4).result
    full = eng.forward(s.held_ids)
    assert r.gen_ids == [int(np.argmax(full[i])) for i in range(len(prompt) - 1, len(s.held_ids) - 1)]
    same = np.testing.assert_array_equal if exact else (
        lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=NEXT_TOL))
    same(s.last_logits(), full[-1])
    s.generate(prompt[:131], max_new_tokens=0)
    same(s.last_logits(), eng.forward(prompt[:131])[-1])
    return full


@pytest.mark.parametrize("arch", ["dense", "hybrid"])
def test_q8_engine_decode_equals_full_forward_and_stays_close_to_f32(folders, arch):
    """info says q8; decode equals the full forward; logits within Q8_LOGIT_TOL of the f32 cache's (and not
    equal to them, nor to the f16 cache's); greedy ids agree with the f32 cache's on >= Q8_AGREE of a
    teacher-forced continuation."""
    path = folders[arch]
    prompt = np.random.default_rng(4).integers(0, 151000, 150).tolist()
    f32 = Engine.load(path, threads=2, max_context=512, kv_cache="f32")
    q8 = Engine.load(path, threads=2, max_context=512, kv_cache="q8")
    assert q8.info["kv_cache"] == "q8" and f32.info["kv_cache"] == "f32"
    _decode_equals_full_forward(q8, prompt, "q8", exact=arch == "dense")
    s = f32.session("greedy")
    gen = s.generate(prompt, max_new_tokens=48).result.gen_ids
    ids = prompt + gen
    ref, got = f32.forward(ids), q8.forward(ids)
    scale = np.abs(ref).max()
    err = np.abs(got - ref).max()
    assert 0 < err <= Q8_LOGIT_TOL * scale, (err, scale)
    assert not np.array_equal(got, Engine.load(path, threads=2, max_context=512, kv_cache="f16").forward(ids))
    lo = len(prompt) - 1
    agree = np.mean(np.argmax(got[lo:-1], axis=1) == np.asarray(gen))
    assert agree >= Q8_AGREE, agree


def test_q8_sessions_reuse_and_cut_back_like_f16(folders):
    """Dense: a prompt extending the held ids reuses them all; a prompt diverging earlier cuts the cache
    back; the logits equal a fresh forward's, bit for bit; the q8 cache holds 1.0625 bytes per value (int8 and
    an f16 scale per 32), against the f16 cache's 2 (the same 320-token prefill in f32, f16 and q8 -- five whole
    q8 pages, state.h kQ8Page, and as many rows in the f32 and f16 caches: the f16 cache's bytes are the f32
    session's minus the f16 one's)."""
    eng = Engine.load(folders["dense"], threads=2, max_context=1024, kv_cache="q8")
    prompt = np.random.default_rng(8).integers(0, 151000, 300).tolist()
    s = eng.session("reuse")
    s.generate(prompt, max_new_tokens=5).result
    held = s.held_ids
    nxt = held + [151645, 198, 151644]
    r = s.generate(nxt, max_new_tokens=0).result
    assert (r.reused, r.tokens_read) == (len(held), 3)
    np.testing.assert_array_equal(s.last_logits(), eng.forward(nxt)[-1])
    other = prompt[:77] + [555, 666]
    r = s.generate(other, max_new_tokens=2).result
    assert (r.lcp, r.reused, r.tokens_read, r.restored_checkpoint) == (77, 77, 2, None)
    np.testing.assert_array_equal(s.last_logits(), eng.forward(s.held_ids)[-1])
    mem = {}
    long_prompt = np.random.default_rng(9).integers(0, 151000, 320).tolist()
    for kv in ("f32", "f16", "q8"):
        sm = Engine.load(folders["dense"], threads=2, max_context=1024, kv_cache=kv).session("mem")
        sm.generate(long_prompt, max_new_tokens=0).result
        mem[kv] = sm.memory_bytes
    c16 = mem["f32"] - mem["f16"]
    c8 = mem["q8"] - (mem["f16"] - c16)
    assert c16 > 2 * 300 * 2 * 2 * 64 and abs(c8 / c16 - 1.0625 / 2) < 0.01, mem


def test_q8_sessions_across_page_boundaries(folders):
    """The q8 cache grows page by page (64 positions, kv head by kv head): decode steps that start a page, a
    cut back into an earlier page and a re-read that fills it and starts new ones all keep the full forward's
    logits bit for bit (dense model)."""
    eng = Engine.load(folders["dense"], threads=2, max_context=1024, kv_cache="q8")
    ids = np.random.default_rng(12).integers(0, 151000, 200).tolist()
    s = eng.session("pages")
    r = s.generate(ids[:61], max_new_tokens=6).result  # positions 61..66: page 1 starts at 64
    assert len(r.gen_ids) == 6
    np.testing.assert_array_equal(s.last_logits(), eng.forward(s.held_ids)[-1])
    for n in (64, 65, 130, 63, 129, 200):  # cut back (into pages 0 and 1) and read on past the next page
        r = s.generate(ids[:n], max_new_tokens=1).result
        np.testing.assert_array_equal(s.last_logits(), eng.forward(s.held_ids)[-1])


def test_q8_hybrid_checkpoints_restore_like_f16(folders):
    """Hybrid (Gated DeltaNet + q8 attention): a divergence inside the reply restores the checkpoint before it
    and re-reads the rest; a prompt ending on a checkpoint takes its saved logits; each matches a fresh
    forward as closely as it does with the f16 cache (the chunked GDN prefill's float order differs)."""
    dev = {}
    for kv in ("f16", "q8"):
        eng = Engine.load(folders["hybrid"], threads=2, max_context=512, kv_cache=kv)
        s = eng.session("ck", checkpoints=CheckpointPolicy(every=8))
        prompt = np.random.default_rng(7).integers(0, 151000, 30).tolist()
        r1 = s.generate(prompt, max_new_tokens=12).result
        assert s.checkpoints == [8, 16, 24, 30, 32, 40]
        p2 = prompt + r1.gen_ids[:5] + [7, 8, 9]
        r2 = s.generate(p2, max_new_tokens=0).result
        assert (r2.lcp, r2.reused, r2.restored_checkpoint, r2.tokens_read) == (35, 32, 32, 6)
        e2 = np.abs(s.last_logits() - eng.forward(p2)[-1]).max()
        r3 = s.generate(prompt, max_new_tokens=0).result
        assert (r3.reused, r3.restored_checkpoint, r3.used_saved_logits, r3.tokens_read) == (30, 30, True, 0)
        e3 = np.abs(s.last_logits() - eng.forward(prompt)[-1]).max()
        dev[kv] = (e2, e3, r1.gen_ids)
    for e in dev["q8"][:2]:
        assert e <= 1e-4, dev
    assert dev["q8"][2][:6] == dev["f16"][2][:6]


def test_q8_needs_head_dim_a_multiple_of_32(tmp_path):
    for name, args in (("dense", ()), ("hybrid", ("qwen3_next", "tiny-moe"))):
        path = make_tiny(tmp_path / name, *args, dtype="bfloat16", seed=1)  # head_dim 16
        with pytest.raises(ValueError, match=r"kv_cache 'q8' needs head_dim a multiple of 32 \(config.json head_dim 16\)"):
            Engine.load(path, threads=1, kv_cache="q8")
        assert Engine.load(path, threads=1, kv_cache="f16").info["kv_cache"] == "f16"
