"""Engine tier: batched decode (continuous batching across sessions). Sessions decoding at the same time
advance in one forward (Model::forward_batch: the matmuls take the [batch x hidden] rows together; attention,
and for the hybrid the Gated DeltaNet and MoE, per sequence); each sequence's logits and greedy ids are the
bits it gets alone, for batches of 1-8, dense Qwen3 and the hybrid Qwen3-Next, bf16 and int8 weights, f16, f32
and q8 KV caches (q8 needs head_dim a multiple of 32: the "-hd32" folders)."""
import threading

import numpy as np
import pytest

_engine = pytest.importorskip("strata_lab._engine")
from strata_lab.engine import Engine  # noqa: E402
from strata_lab.tiny import make_tiny  # noqa: E402


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("batched")
    return {
        "dense": make_tiny(root / "dense", dtype="bfloat16", seed=3),
        "hybrid": make_tiny(root / "hybrid", "qwen3_next", "tiny-moe", dtype="bfloat16", seed=4),
        "dense-hd32": make_tiny(root / "dense32", dtype="bfloat16", seed=3, overrides={"head_dim": 32}),
        "hybrid-hd32": make_tiny(root / "hybrid32", "qwen3_next", "tiny-moe", dtype="bfloat16", seed=4,
                                 overrides={"head_dim": 32}),
    }


def _seqs(B, seed):
    rng = np.random.default_rng(seed)
    # different lengths: each sequence decodes at its own position (several key tiles for the longest)
    return [rng.integers(0, 150000, int(rng.integers(2, 90))).tolist() for _ in range(B)]


@pytest.mark.parametrize("arch,weights,kv_cache", [("dense", None, "auto"), ("dense", "int8", "auto"),
                                                   ("dense", None, "f32"), ("hybrid", None, "auto"),
                                                   ("hybrid", "int8", "auto"), ("dense-hd32", None, "q8"),
                                                   ("dense-hd32", "int8", "q8"), ("hybrid-hd32", None, "q8")])
def test_batched_step_gives_each_sequence_its_own_bits(models, arch, weights, kv_cache):
    """One batched forward of B = 1..8 sequences equals, bit for bit, each sequence's own one-token forward
    at 1 and 2 threads (the decode matmul path covers up to 8 rows, tiles of 3 tokens at AVX2), with the f16
    cache (auto for bf16 weights), an f32 one and a q8 one."""
    for threads in (1, 2):
        eng = Engine.load(models[arch], threads=threads, weights=weights, kv_cache=kv_cache)
        assert eng.info["kv_cache"] == {"f32": "f32", "q8": "q8"}.get(kv_cache, "f16")
        for B in (1, 2, 3, 4, 5, 8):
            seqs = _seqs(B, seed=B * 10 + threads)
            alone = eng._e._decode_fresh(seqs, False)
            batched = eng._e._decode_fresh(seqs, True)
            assert batched.shape == (B, eng.vocab_size)
            assert np.isfinite(batched).all()
            np.testing.assert_array_equal(batched, alone, err_msg=f"{arch} {weights} B={B} threads={threads}")
            # and the batch is not a copy of one row: sequences differ
            if B > 1:
                assert not np.array_equal(batched[0], batched[1])


@pytest.mark.parametrize("arch,kv_cache", [("dense", "auto"), ("hybrid", "auto"), ("dense-hd32", "q8"),
                                           ("hybrid-hd32", "q8")])
def test_concurrent_sessions_decode_in_shared_steps_with_their_solo_ids(models, arch, kv_cache):
    """N sessions generating greedily on N threads at once (batches of up to N) produce the ids and final
    logits each produces alone, and the step thread's counts show the batches it ran (the default cache and
    a q8 one)."""
    n_streams, steps = 6, 12
    prompts = _seqs(n_streams, seed=99)
    solo = Engine.load(models[arch], threads=2, kv_cache=kv_cache)
    want = []
    for i, p in enumerate(prompts):
        s = solo.session(f"s{i}")
        ids = list(s.generate(p, max_new_tokens=steps))
        want.append((ids, s.last_logits()))
    assert solo.step_stats()["max_batch"] == 1  # one at a time: never batched

    eng = Engine.load(models[arch], threads=2, kv_cache=kv_cache)
    got = [None] * n_streams
    barrier = threading.Barrier(n_streams)

    def run(i):
        s = eng.session(f"s{i}")
        s.generate(prompts[i], max_new_tokens=0).result  # prompts read first, then all decode together
        barrier.wait()
        got[i] = (list(s.generate(s.held_ids, max_new_tokens=steps)), s.last_logits())

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n_streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    for i in range(n_streams):
        assert got[i] is not None, f"stream {i} did not finish"
        assert got[i][0] == want[i][0], f"stream {i}: batched ids differ from its solo ids"
        np.testing.assert_array_equal(got[i][1], want[i][1], err_msg=f"stream {i}: logits")
    st = eng.step_stats()
    assert st["tokens"] >= n_streams * steps - n_streams  # the first token comes from the prompt read's logits
    assert st["max_batch"] >= 2, st  # decode steps were shared
    assert st["tokens"] / st["steps"] > 1.5, st
    assert st["decoding"] == 0 and st["waiting"] == 0, st


def test_a_failing_read_raises_in_its_own_session_and_the_others_go_on(models):
    """A read that fails (context overflow is refused before any work) leaves the step thread serving the
    other sessions."""
    eng = Engine.load(models["dense"], threads=1, max_context=64)
    s = eng.session("a")
    with pytest.raises(ValueError, match="context overflow"):
        s.generate(list(range(1, 60)), max_new_tokens=10)
    ok = eng.session("b")
    assert len(list(ok.generate([1, 2, 3], max_new_tokens=3))) == 3
