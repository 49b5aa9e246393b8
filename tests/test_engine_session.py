"""Engine tier: sessions per Contract 1, streaming generate, STOP and drain, force_ids, sampling."""
import gc
import threading
import time

import numpy as np
import pytest

pytest.importorskip("strata_lab._engine")
from strata_lab.engine import Sampling  # noqa: E402
from strata_lab.rules import CheckpointPolicy  # noqa: E402

PROMPT = [9707, 1879, 13, 220, 14990, 135992, 42, 7, 3, 1000, 2000, 3000]
HOT = Sampling(temperature=1.0, top_p=0.95, seed=11)


def fresh(engine, name):
    s = engine.session(name)
    s.reset()
    return s


def test_prefill_then_decode_equals_full_forward(tiny_engine):
    s = fresh(tiny_engine, "pd")
    r = s.generate(PROMPT, max_new_tokens=6).result
    held = s.held_ids
    assert held == PROMPT + r.gen_ids and r.finish == "length"
    full = tiny_engine.forward(held)
    # greedy ids are the argmax of the full forward at each position
    assert r.gen_ids == [int(np.argmax(full[i])) for i in range(len(PROMPT) - 1, len(held) - 1)]
    np.testing.assert_array_equal(s.last_logits(), full[-1])  # bit-identical, not just close


@pytest.mark.parametrize("overrides", [None, {"hidden_size": 40, "intermediate_size": 100, "head_dim": 10}])
def test_bf16_weights_decode_bit_identical_to_full_forward(tmp_path, overrides):
    """bf16 weights take the vdpbf16ps kernels where the CPU has them; K = 40/100 exercise the masked tail."""
    from strata_lab.tiny import make_tiny
    from strata_lab.engine import Engine

    eng = Engine.load(make_tiny(tmp_path, dtype="bfloat16", seed=5, overrides=overrides), threads=2)
    prompt = PROMPT * 2  # 24 tokens: several 6-token prefill tiles plus a remainder
    s = eng.session("bf16")
    r = s.generate(prompt, max_new_tokens=4).result
    full = eng.forward(s.held_ids)
    assert r.gen_ids == [int(np.argmax(full[i])) for i in range(len(prompt) - 1, len(s.held_ids) - 1)]
    np.testing.assert_array_equal(s.last_logits(), full[-1])
    s.generate(prompt[:17], max_new_tokens=0)  # truncate then re-read 1 token
    np.testing.assert_array_equal(s.last_logits(), eng.forward(prompt[:17])[-1])


def test_reuse_after_generate_extends_held(tiny_engine):
    s = fresh(tiny_engine, "reuse")
    s.generate(PROMPT, max_new_tokens=4, sampling=HOT).result
    held = s.held_ids
    nxt = held + [151645, 198, 151644]
    r = s.generate(nxt, max_new_tokens=0).result
    assert (r.reused, r.tokens_read, r.lcp, r.held_before) == (len(held), 3, len(held), len(held))
    assert r.gen_ids == [] and r.drained_ids == [] and r.finish == "length"
    np.testing.assert_array_equal(s.last_logits(), tiny_engine.forward(nxt)[-1])


def test_cut_back_to_earlier_prefix(tiny_engine):
    s = fresh(tiny_engine, "cut")
    s.generate(PROMPT, max_new_tokens=5).result
    other = PROMPT[:7] + [555, 666]
    r = s.generate(other, max_new_tokens=0).result
    assert (r.lcp, r.reused, r.tokens_read) == (7, 7, 2)
    assert r.restored_checkpoint is None  # attention-only: the KV cache is simply cut
    assert s.held_ids == other
    np.testing.assert_array_equal(s.last_logits(), tiny_engine.forward(other)[-1])


def test_prompt_equal_to_held_uses_saved_logits(tiny_engine):
    s = fresh(tiny_engine, "same")
    s.generate(PROMPT, max_new_tokens=3).result
    held = s.held_ids
    r = s.generate(held, max_new_tokens=0).result
    assert (r.reused, r.tokens_read, r.used_saved_logits) == (len(held), 0, True)
    # a strict prefix of held re-reads its last id (reuse = len(prompt) - 1)
    r = s.generate(held[:8], max_new_tokens=0).result
    assert (r.reused, r.tokens_read, r.used_saved_logits) == (7, 1, False)
    np.testing.assert_array_equal(s.last_logits(), tiny_engine.forward(held[:8])[-1])
    assert s.plan(held[:8]) == {"lcp": 8, "reused": 8, "restore": None, "saved_logits": True}


def test_stream_yields_ids_and_stop_drains(tiny_engine):
    s = fresh(tiny_engine, "stop")
    stream = s.generate(PROMPT, max_new_tokens=40, sampling=HOT, stop_latency=2)
    got = []
    for i in stream:
        got.append(i)
        if len(got) == 3:
            stream.stop()
    r = stream.result
    assert r.finish == "cancelled"
    assert got == r.gen_ids and len(r.gen_ids) >= 3
    # stop_latency more steps, plus the step the request landed in when it arrived mid-step
    assert len(r.drained_ids) in (2, 3)
    assert s.held_ids == PROMPT + r.gen_ids + r.drained_ids
    # the drained ids are really in the state: the next turn reuses them
    nxt = s.held_ids + [151645]
    assert s.generate(nxt, max_new_tokens=0).result.reused == len(nxt) - 1


@pytest.mark.parametrize("latency", [0, 1, 3])
def test_paced_stop_counts_from_the_reader(tiny_engine, latency):
    # a slow reader (another process could be holding the CPU): the loop waits for it, so the ids after the
    # last one it took are the drained ones, exactly stop_latency of them
    s = fresh(tiny_engine, f"paced{latency}")
    stream = s.generate(PROMPT, max_new_tokens=40, sampling=HOT, stop_latency=latency, paced=True)
    got = []
    for i in stream:
        got.append(i)
        time.sleep(0.02)
        if len(got) == 3:
            stream.stop()
    r = stream.result
    assert r.finish == "cancelled" and got == r.gen_ids and len(r.gen_ids) == 3
    assert len(r.drained_ids) == latency if latency else len(r.drained_ids) in (0, 1)
    assert s.held_ids == PROMPT + r.gen_ids + r.drained_ids
    # the same ids as an unstopped call: draining changes nothing of what is sampled
    s.reset()
    whole = s.generate(PROMPT, max_new_tokens=len(r.gen_ids) + len(r.drained_ids), sampling=HOT).result
    assert whole.gen_ids == r.gen_ids + r.drained_ids


def test_paced_stream_awaited_or_dropped_unread(tiny_engine):
    s = fresh(tiny_engine, "paced-unread")
    assert len(s.generate(PROMPT, max_new_tokens=6, paced=True).result.gen_ids) == 6  # result lets go
    s.generate(PROMPT, max_new_tokens=6, paced=True)  # dropped: the job lets go, the next call starts
    gc.collect()
    assert len(s.generate(PROMPT, max_new_tokens=2).result.gen_ids) == 2
    with pytest.raises(TypeError, match="paced must be a bool"):
        s.generate(PROMPT, max_new_tokens=2, paced=1)


def test_stop_from_another_thread(tiny_engine):
    s = fresh(tiny_engine, "thread")
    stream = s.generate(PROMPT, max_new_tokens=200, sampling=HOT)
    t = threading.Timer(0.05, stream.stop)
    t.start()
    ids = list(stream)
    r = stream.result
    t.join()
    assert r.finish in ("cancelled", "length")
    assert ids == r.gen_ids
    assert s.held_ids == PROMPT + r.gen_ids + r.drained_ids


def test_stop_ids_finish_stop(tiny_engine):
    s = fresh(tiny_engine, "stopids")
    first = s.generate(PROMPT, max_new_tokens=5).result.gen_ids
    s.reset()
    r = s.generate(PROMPT, max_new_tokens=5, stop_ids=[first[2]]).result
    assert r.finish == "stop" and r.gen_ids == first[:3]


def test_force_ids_reproduce_a_call(tiny_engine):
    a = fresh(tiny_engine, "rec")
    rec = a.generate(PROMPT, max_new_tokens=8, sampling=HOT, stop_latency=1)
    it = iter(rec)
    next(it)
    rec.stop()
    list(it)
    r = rec.result
    b = fresh(tiny_engine, "replay")
    f = b.generate(PROMPT, max_new_tokens=len(r.gen_ids) + len(r.drained_ids),
                   force_ids=r.gen_ids + r.drained_ids).result
    assert f.gen_ids == r.gen_ids + r.drained_ids and f.finish == "length"
    assert b.held_ids == a.held_ids
    np.testing.assert_array_equal(b.last_logits(), a.last_logits())


def test_same_seed_same_sample(tiny_engine):
    runs = []
    for seed in (5, 5, 6):
        s = fresh(tiny_engine, "seed")
        runs.append(s.generate(PROMPT, max_new_tokens=12, sampling=Sampling(temperature=1.3, top_k=50, min_p=0.01,
                                                                            seed=seed)).result.gen_ids)
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_sampling_filters(tiny_engine):
    s = fresh(tiny_engine, "filters")
    s.generate(PROMPT, max_new_tokens=0).result
    logits = s.last_logits()
    top = int(np.argmax(logits))
    for samp in (Sampling(temperature=1.0, top_k=1, seed=1), Sampling(temperature=5.0, top_p=1e-6, seed=2),
                 Sampling(temperature=9.0, min_p=1.0, seed=3)):
        s.reset()
        assert s.generate(PROMPT, max_new_tokens=1, sampling=samp).result.gen_ids == [top]


def test_prompt_only_call_and_several_sessions(tiny_engine):
    a, b = fresh(tiny_engine, "a"), fresh(tiny_engine, "b")
    ra = a.generate(PROMPT, max_new_tokens=0).result
    assert (ra.gen_ids, ra.reused, ra.tokens_read, ra.finish) == ([], 0, len(PROMPT), "length")
    assert a.held_ids == PROMPT and b.held_ids == []
    sb = b.generate(PROMPT[:4], max_new_tokens=3)
    sa = a.generate(PROMPT + [1], max_new_tokens=3)  # both decode threads run at once
    assert sa.result.reused == len(PROMPT) and sb.result.reused == 0
    assert tiny_engine.session("a") is a


def test_checkpoint_policy(tiny_engine):
    s = tiny_engine.session("ck", checkpoints=CheckpointPolicy(every=4, positions=(6,)))
    s.reset()
    r = s.generate(PROMPT, max_new_tokens=5).result
    assert r.checkpoints == [4, 6, 8, 12, 16] == s.checkpoints
    # Qwen3: the KV cache holds the state, a snapshot holds only the logits after its last id
    V = tiny_engine.info["vocab_size"]
    assert s.snapshot_bytes == 5 * 4 * V and s.memory_bytes > s.snapshot_bytes
    s.generate(PROMPT[:9] + [77], max_new_tokens=0).result
    assert s.checkpoints == [4, 6, 8, 10]  # snapshots past the cut are dropped; prompt end added
    # a prefix ending on a checkpoint takes its logits: nothing read, equal to a fresh forward
    r = s.generate(PROMPT[:8], max_new_tokens=0).result
    assert (r.reused, r.tokens_read, r.used_saved_logits, r.restored_checkpoint) == (8, 0, True, 8)
    np.testing.assert_array_equal(s.last_logits(), tiny_engine.forward(PROMPT[:8])[-1])


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(prompt_ids=[], max_new_tokens=1), ValueError, "prompt_ids must not be empty"),
    (dict(prompt_ids=[1, 151936], max_new_tokens=1), ValueError, r"prompt_ids\[1\] = 151936 is out of range"),
    (dict(prompt_ids=[-3], max_new_tokens=1), ValueError, "out of range"),
    (dict(prompt_ids=[1], max_new_tokens=-1), ValueError, "max_new_tokens must be >= 0"),
    (dict(prompt_ids=[1], max_new_tokens=1.0), TypeError, "max_new_tokens must be an int"),
    (dict(prompt_ids=[1] * 200, max_new_tokens=57), ValueError, "context overflow"),
    (dict(prompt_ids=[1], max_new_tokens=1, force_ids=[10**9]), ValueError, r"force_ids\[0\]"),
    (dict(prompt_ids=[1], max_new_tokens=1, stop_ids=[-1]), ValueError, r"stop_ids\[0\]"),
    (dict(prompt_ids=[1], max_new_tokens=1, stop_latency=-1), ValueError, "stop_latency"),
])
def test_bad_generate_input_raises_before_work(tiny_engine, kwargs, exc, match):
    s = fresh(tiny_engine, "bad")
    s.generate([5, 6], max_new_tokens=0).result
    with pytest.raises(exc, match=match):
        s.generate(**kwargs)
    assert s.held_ids == [5, 6] and not s._s.busy()


@pytest.mark.parametrize("kwargs,match", [
    (dict(temperature=-1.0), "temperature"), (dict(top_k=-2), "top_k"), (dict(top_p=0.0), "top_p"),
    (dict(min_p=1.5), "min_p"), (dict(seed=-1), "seed")])
def test_bad_sampling_raises(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Sampling(**kwargs)


def test_busy_session_raises(tiny_engine):
    s = fresh(tiny_engine, "busy")
    stream = s.generate(PROMPT, max_new_tokens=100)
    try:
        with pytest.raises(RuntimeError, match="busy"):
            s.generate(PROMPT, max_new_tokens=1)
    finally:
        stream.stop()
        stream.result


@pytest.mark.parametrize("every,budget_snaps,header", [(0, 0, None), (3, 0, None), (3, 2, None), (0, 0, 151644),
                                                       (3, 2, 151644)],
                         ids=["turn", "every3", "budget", "header", "budget-header"])
def test_random_sessions_reuse_equals_state_model(tiny_engine, every, budget_snaps, header):
    """Attention-only: retries, prefixes, cuts and extensions; the engine's reuse and checkpoints equal
    the weight-free prediction on every call (its snapshots are just logits, 4 * vocab bytes each)."""
    from strata_lab.replayer.state import SessionState

    per = 4 * tiny_engine.info["vocab_size"]
    if budget_snaps:
        policy = CheckpointPolicy(every=every, budget_mib=(budget_snaps + 0.5) * per / 2**20, before_last=header)
    else:
        policy = CheckpointPolicy(every=every, before_last=header)
    pred = SessionState(model="attention", policy=policy, bytes_per_snapshot=per)  # one policy type
    s = tiny_engine.session(f"rand{every}-{budget_snaps}-{header}", checkpoints=policy)
    s.reset()
    rng = np.random.default_rng(5)
    hits = 0
    for i in range(14):
        held = s.held_ids
        kind = int(rng.integers(0, 4)) if held else 0
        if kind == 0:
            new = [int(x) for x in rng.integers(0, 151643, int(rng.integers(1, 6)))]
            prompt = held + ([header if rng.random() < 0.4 else x for x in new] if header else new)
        elif kind == 1:
            new = int(rng.integers(0, 151643))
            prompt = held[: int(rng.integers(1, len(held) + 1))] + [header if header and rng.random() < 0.4 else new]
        elif kind == 2:
            prompt = held[: int(rng.integers(1, len(held) + 1))]
        else:  # a retry: the previous call's prompt
            prompt = last
        last = prompt
        r = s.generate(prompt, max_new_tokens=int(rng.integers(0, 4))).result
        p = pred.call(prompt)
        pred.finish(r.gen_ids, r.drained_ids)
        assert (r.reused, r.lcp) == (p.reused, p.lcp), (i, r, p)
        assert (r.restored_checkpoint or None) == p.restored_checkpoint
        assert s.checkpoints == sorted(pred.checkpoints) and s.snapshot_bytes == pred.snapshot_bytes()
        hits += r.used_saved_logits and r.reused < r.held_before
    np.testing.assert_array_equal(s.last_logits(), tiny_engine.forward(s.held_ids)[-1])
    assert hits > 0  # the checkpoint-logits rule was exercised
