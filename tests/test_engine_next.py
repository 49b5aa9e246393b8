"""Engine tier: Qwen3-Next (hybrid) through the one Engine API.

Parity with transformers, prefill vs decode, chunked prefill, checkpoint restore, the reference
scenario (a reply re-encoded on the next turn) with the engine's reuse checked against the weight-free
state model, LRU budget eviction, snapshot memory, and replay of a recorded engine session.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("strata_lab._engine")
from strata_lab.tiny import NEXT_PRESETS, make_tiny  # noqa: E402
from strata_lab.engine import Engine  # noqa: E402
from strata_lab.rules import CheckpointPolicy  # noqa: E402
from strata_lab.replayer.state import SessionState  # noqa: E402

TOL = 1e-4
SMALL = dict(hidden_size=32, intermediate_size=48, moe_intermediate_size=16, shared_expert_intermediate_size=24)


def _ids(n, seed=0, hi=151643):
    return [int(i) for i in np.random.default_rng(seed).integers(0, hi, n)]


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    """tiny-moe (untied lm_head, 2 GDN + 2 attention layers, MoE with one dense layer), 32-wide."""
    return Engine.load(make_tiny(tmp_path_factory.mktemp("moe"), "qwen3_next", "tiny-moe", overrides=SMALL), threads=2)


def _snapshot_bytes(shape) -> int:
    """Bytes of one snapshot: conv window + fp32 S of every GDN layer (docs/ENGINE.md 'Session state'),
    plus the fp32 logits after its last id."""
    s = shape
    C = 2 * s.linear_num_key_heads * s.linear_key_head_dim + s.linear_num_value_heads * s.linear_value_head_dim
    S = s.linear_num_value_heads * s.linear_key_head_dim * s.linear_value_head_dim
    per = (s.linear_conv_kernel_dim - 1) * C + S
    return 4 * per * s.layer_types().count("linear_attention") + 4 * s.vocab_size


def _predictor(policy: CheckpointPolicy, snap_bytes: int) -> SessionState:
    """The state model under the engine's own policy (one type), with the engine's snapshot size."""
    return SessionState(policy=policy, bytes_per_snapshot=snap_bytes)


def _call(session, pred, prompt, **kw):
    """One engine call; asserts the engine's reuse equals the state model's prediction."""
    r = session.generate(prompt, **kw).result
    p = pred.call(prompt)
    pred.finish(r.gen_ids, r.drained_ids)
    assert (r.reused, r.lcp) == (p.reused, p.lcp), (r, p)
    assert session.checkpoints == sorted(pred.checkpoints)
    return r


# --- the model ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("preset,pattern", [("tiny", "layer_types"), ("tiny", "full_attention_interval"),
                                            ("tiny-moe", "layer_types"), ("tiny-moe", "full_attention_interval")])
def test_logits_match_transformers(tmp_path, preset, pattern):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    path = make_tiny(tmp_path, "qwen3_next", preset, seed=3, pattern=pattern, mtp=True)
    cfg = json.loads((path / "config.json").read_text())
    assert ("layer_types" in cfg) == (pattern == "layer_types")
    hf = transformers.Qwen3NextForCausalLM.from_pretrained(path, dtype=torch.float32)
    ids = _ids(70, seed=1)  # > one 64-token GDN chunk, not a multiple of it
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].numpy()
    eng = Engine.load(path, threads=2)
    assert eng.info["model_type"] == "qwen3_next"
    assert np.abs(eng.forward(ids) - ref).max() <= TOL
    # the same through a session, token by token (recurrent GDN step, KV cache growing)
    s = eng.session("decode")
    for i in range(12):
        s.generate(ids[: i + 1], max_new_tokens=0)
        assert np.abs(s.last_logits() - ref[i]).max() <= TOL


def test_prefill_equals_token_by_token_decode_at_any_chunking(moe):
    ids = _ids(150, seed=5)
    full = moe.forward(ids)
    s = moe.session("steps")
    s.reset()
    r = s.generate(ids[:1], max_new_tokens=149, force_ids=ids[1:]).result  # 149 one-token decode steps
    assert r.gen_ids == ids[1:] and s.held_ids == ids
    assert np.abs(s.last_logits() - full[-1]).max() <= TOL
    for n in (1, 5, 63, 64, 65, 129):  # one prefill call each: chunk tails of every length
        assert np.abs(moe.forward(ids[:n])[-1] - full[n - 1]).max() <= TOL
    # a session prefill in uneven pieces lands on the same logits
    s.reset()
    for n in (37, 101, 150):
        s.generate(ids[:n], max_new_tokens=0)
    assert np.abs(s.last_logits() - full[-1]).max() <= TOL


def _delta_inputs(T, dk, dv, seed):
    """Delta-rule inputs as the layer makes them: q, k l2-normed (q scaled by dk^-0.5), beta = sigmoid,
    g = -exp(A_log) softplus(a + dt_bias) with the tiny writer's A_log range, a random start state."""
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((T, dk), np.float32), rng.standard_normal((T, dk), np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True) * np.sqrt(dk)
    k /= np.linalg.norm(k, axis=1, keepdims=True)
    v = rng.standard_normal((T, dv), np.float32)
    beta = 1 / (1 + np.exp(-rng.standard_normal(T)))
    g = -rng.uniform(0.5, 8.0) * np.log1p(np.exp(rng.standard_normal(T) * 0.5 - 2))
    S0 = rng.standard_normal((dk, dv), np.float32)
    return q, k, v, beta.astype(np.float32), g.astype(np.float32), S0


@pytest.mark.parametrize("dk,dv", [(16, 16), (24, 40), (64, 64), (128, 128)])
def test_delta_rule_chunked_state_equals_recurrent_state(dk, dv):
    """The delta rule alone (one head, fp32): T = 150 tokens (64 + 64 + 22) from a non-zero start state,
    chunked in matrix form and in row form, against the token-by-token recurrence. Final state S and
    outputs agree to 1e-5 relative to their largest entry (measured <= 1e-6: fp32 sums in another order)."""
    from strata_lab import _engine

    args = _delta_inputs(150, dk, dv, seed=dk + dv)
    o_ref, S_ref = _engine._gdn_delta(*args, mode="recurrent")
    assert np.abs(S_ref - args[5]).max() > 0.1  # the state moved
    for mode in ("matrix", "rows"):
        o, S = _engine._gdn_delta(*args, mode=mode, chunk=64)
        assert np.abs(S - S_ref).max() <= 1e-5 * np.abs(S_ref).max(), mode
        assert np.abs(o - o_ref).max() <= 1e-5 * np.abs(o_ref).max(), mode


@pytest.mark.parametrize("path", ["matrix", "matrix-scalar-kernels", "rows"])
def test_chunked_prefill_state_equals_recurrent_state(tmp_path, path):
    """The state a chunked prefill leaves is the token-by-token recurrent state.

    n = 150 = 64 + 64 + 22 (more than two 64-token GDN chunks, not a multiple of the chunk), on head dims
    that are not multiples of the 8-wide GEMM vectors (dk 24, dv 40: masked column tails, row tails). Session
    A prefills the 150 ids in one call, session B reads them one decode step (recurrent GDN step) at a
    time; then both decode the same 24 further ids one step each. The state is only observable through
    the logits, so every step's logits are compared: a state difference would carry into each of them.
    Tolerance: 1e-4 absolute on logits of magnitude ~5 (fp32 state, sums in a different order).
    Paths: the matrix form on the best kernels, on the scalar fallback, and the older row form.
    """
    from strata_lab import _engine

    shape = dict(SMALL, vocab_size=4096, linear_key_head_dim=24, linear_value_head_dim=40)
    eng = Engine.load(make_tiny(tmp_path, "qwen3_next", "tiny", seed=4, overrides=shape), threads=2)
    ids = _ids(174, seed=9, hi=4096)
    best = _engine.kernel_level()
    try:
        if path == "rows":
            _engine._set_kernel_option("gdn_matrix", False)
        elif path == "matrix-scalar-kernels":
            _engine.set_kernel_level("scalar")
        a = eng.session("prefill")
        a.generate(ids[:150], max_new_tokens=0)
        b = eng.session("steps")
        for n in range(1, 151):
            b.generate(ids[:n], max_new_tokens=0)
        assert np.abs(a.last_logits() - b.last_logits()).max() <= TOL
        for n in range(151, len(ids) + 1):
            a.generate(ids[:n], max_new_tokens=0)
            b.generate(ids[:n], max_new_tokens=0)
            assert np.abs(a.last_logits() - b.last_logits()).max() <= TOL, n
        assert np.abs(a.last_logits()).max() > 1.0  # logits are not trivially small
    finally:
        _engine._set_kernel_option("gdn_matrix", True)
        _engine.set_kernel_level(best)


def test_prefill_longer_than_the_session_chunk(moe):
    ids = _ids(530, seed=6)  # the session reads 512, then 18
    s = moe.session("long")
    s.reset()
    s.generate(ids, max_new_tokens=0)
    assert np.abs(s.last_logits() - moe.forward(ids)[-1]).max() <= TOL


# --- sessions on the hybrid model -------------------------------------------------------------------
def test_restore_checkpoint_then_continue_equals_fresh_forward(moe):
    policy = CheckpointPolicy(every=8)
    s = moe.session("restore", checkpoints=policy)
    s.reset()
    pred = _predictor(policy, _snapshot_bytes(NEXT_PRESETS["tiny-moe"]))
    prompt = _ids(30, seed=7)
    r1 = _call(s, pred, prompt, max_new_tokens=12)
    assert (r1.reused, r1.tokens_read, r1.restored_checkpoint) == (0, 30, None)
    assert s.checkpoints == [8, 16, 24, 30, 32, 40]
    # diverge 5 ids into the reply: lcp 35, the largest checkpoint <= 35 is 32
    p2 = prompt + r1.gen_ids[:5] + [7, 8, 9]
    r2 = _call(s, pred, p2, max_new_tokens=0)
    assert (r2.lcp, r2.reused, r2.restored_checkpoint, r2.tokens_read) == (35, 32, 32, 6)
    assert r2.reread == 3 and r1.reread == 0  # held 35 matching ids, restored to 32: 3 read again
    assert np.abs(s.last_logits() - moe.forward(p2)[-1]).max() <= TOL
    assert s.checkpoints == [8, 16, 24, 30, 32, 38]
    # extending the held ids reuses everything, nothing restored
    r3 = _call(s, pred, p2 + [11, 12], max_new_tokens=3)
    assert (r3.reused, r3.restored_checkpoint) == (len(p2), None)
    assert np.abs(s.last_logits() - moe.forward(s.held_ids)[-1]).max() <= TOL
    # a prefix of held ending exactly at a checkpoint: restored, its saved logits used, nothing read
    r4 = _call(s, pred, prompt, max_new_tokens=0)
    assert (r4.reused, r4.restored_checkpoint, r4.used_saved_logits, r4.tokens_read) == (30, 30, True, 0)
    assert np.abs(s.last_logits() - moe.forward(prompt)[-1]).max() <= TOL
    # ending one past a checkpoint: the last id is re-read from the one before
    r4 = _call(s, pred, prompt[:25], max_new_tokens=0)
    assert (r4.reused, r4.restored_checkpoint, r4.used_saved_logits, r4.tokens_read) == (24, 24, False, 1)
    # no checkpoint at or before the divergence: start over
    r5 = _call(s, pred, [prompt[0] + 1] + prompt[1:], max_new_tokens=0)
    assert (r5.reused, r5.restored_checkpoint) == (0, 0)


def test_retry_of_the_same_prompt_reuses_the_turn_start(moe):
    """Regenerate: the same prompt after a reply. The only snapshot is at len(prompt) (the turn start);
    its saved logits serve the full prompt, so nothing is read, and the logits equal a fresh forward."""
    policy = CheckpointPolicy()
    s = moe.session("retry", checkpoints=policy)
    s.reset()
    pred = _predictor(policy, _snapshot_bytes(NEXT_PRESETS["tiny-moe"]))
    prompt = _ids(21, seed=12)
    fresh = moe.forward(prompt)[-1]
    r1 = _call(s, pred, prompt, max_new_tokens=6)
    assert s.checkpoints == [21]
    for _ in range(2):  # retry twice: each one restores the same turn start
        r = _call(s, pred, prompt, max_new_tokens=4)
        assert (r.lcp, r.reused, r.tokens_read, r.restored_checkpoint, r.used_saved_logits) == (21, 21, 0, 21, True)
        assert r.gen_ids[:4] == r1.gen_ids[:4]  # greedy: the same reply from the same logits
        assert s.held_ids == prompt + r.gen_ids and s.checkpoints == [21]
    s.generate(prompt, max_new_tokens=0)
    assert np.abs(s.last_logits() - fresh).max() <= 1e-6
    # and the replay predicts it from the ids alone
    assert pred.call(prompt).reused == 21


def test_snapshot_memory_is_reported(moe):
    s = moe.session("mem", checkpoints=CheckpointPolicy(every=4))
    s.reset()
    s.generate(_ids(20, seed=8), max_new_tokens=0)
    assert s.checkpoints == [4, 8, 12, 16, 20]
    per = _snapshot_bytes(NEXT_PRESETS["tiny-moe"])
    assert s.snapshot_bytes == 5 * per
    assert s.memory_bytes > s.snapshot_bytes


def test_budget_evicts_least_recently_used(moe):
    per = _snapshot_bytes(NEXT_PRESETS["tiny-moe"])
    policy = CheckpointPolicy(every=4, budget_mib=2.5 * per / 2**20)  # room for two snapshots
    s = moe.session("budget", checkpoints=policy)
    s.reset()
    pred = _predictor(policy, per)
    base = _ids(10, seed=1)
    r = _call(s, pred, base, max_new_tokens=6)
    assert s.checkpoints == [12, 16]  # 4, 8, 10 evicted, oldest first
    _call(s, pred, s.held_ids + _ids(6, seed=2), max_new_tokens=5)
    assert len(s.checkpoints) == 2 and s.snapshot_bytes == 2 * per
    # diverge early: every checkpoint is past the cut, back to 0
    r = _call(s, pred, base[:9] + [3, 4, 5], max_new_tokens=3)
    assert (r.reused, r.restored_checkpoint) == (0, 0)
    assert s.snapshot_bytes <= policy.budget_mib * 2**20
    # a restore counts as a use: the restored snapshot survives the next eviction
    held = s.held_ids
    r = _call(s, pred, held[:13] + [1], max_new_tokens=0)
    assert r.restored_checkpoint == 12 and 12 in s.checkpoints
    assert np.abs(s.last_logits() - moe.forward(s.held_ids)[-1]).max() <= TOL


_TWO_SNAPSHOTS_MIB = 2.5 * _snapshot_bytes(NEXT_PRESETS["tiny-moe"]) / 2**20


MARK = 151644  # <|im_start|>: the header checkpoints' id


@pytest.mark.parametrize("policy", [CheckpointPolicy(), CheckpointPolicy(every=5),
                                    CheckpointPolicy(every=3, budget_mib=_TWO_SNAPSHOTS_MIB),
                                    CheckpointPolicy(before_last=MARK),
                                    CheckpointPolicy(every=3, budget_mib=_TWO_SNAPSHOTS_MIB, before_last=MARK)],
                         ids=["turn", "every5", "budget", "header", "budget-header"])
def test_random_sessions_reuse_equals_state_model(moe, policy):
    """Random agent-like call sequences: extend, cut inside replies, repeat, retry; the engine's reuse and
    checkpoints equal the weight-free prediction on every call. With before_last, new prompt ids are
    often that id, so header snapshots land inside prompts, get restored, cut and evicted."""
    rng = np.random.default_rng(11)
    if policy.before_last is not None:
        def _ids(n, seed=0):
            ids = np.random.default_rng(seed).integers(0, 151643, n)
            ids[np.random.default_rng(seed + 1).random(n) < 0.35] = MARK
            return [int(i) for i in ids]
    else:
        _ids = globals()["_ids"]
    s = moe.session("random", checkpoints=policy)
    s.reset()
    pred = _predictor(policy, _snapshot_bytes(NEXT_PRESETS["tiny-moe"]))
    last = None
    restored = header = 0
    for _ in range(16 if policy.before_last is not None else 12):
        held = s.held_ids
        kind = rng.integers(0, 5) if held else 0
        if kind == 0:
            prompt = held + _ids(int(rng.integers(1, 8)), seed=int(rng.integers(1 << 30)))
        elif kind == 1:
            cut = int(rng.integers(1, len(held) + 1))
            prompt = held[:cut] + _ids(int(rng.integers(1, 5)), seed=int(rng.integers(1 << 30)))
        elif kind == 2:
            prompt = held[: int(rng.integers(1, len(held) + 1))]
        elif kind == 3:
            prompt = held
        else:  # a retry of the previous prompt (ends on its turn-start snapshot when that survives)
            prompt = last
        last = prompt
        r = _call(s, pred, prompt, max_new_tokens=int(rng.integers(0, 6)))
        restored += (r.restored_checkpoint or 0) > 0
        header += 0 < (r.restored_checkpoint or 0) < len(prompt) and prompt[r.restored_checkpoint] == MARK
    assert np.abs(s.last_logits() - moe.forward(s.held_ids)[-1]).max() <= TOL
    assert restored > 0 and (header > 0 or policy.before_last is None or policy.budget_mib)


@pytest.fixture(scope="module")
def scenario(qwen3):
    """Turn 1, a reply the model wrote with ' öğrenci' as [130947, 5855], turn 2 re-encoding it [135992]."""
    tok = qwen3
    turn1 = tok.encode("<|im_start|>user\nBir cümle yaz<|im_end|>\n<|im_start|>assistant\n")
    text = " Bu cümlede bir öğrenci var."
    head = tok.encode(" Bu cümlede bir")
    reply = head + [130947, 5855] + tok.encode(" var.") + [tok.token_id("<|im_end|>")]
    assert tok.decode(reply[:-1]) == text
    turn2 = turn1 + tok.encode(text + "<|im_end|>\n<|im_start|>user\nTeşekkürler<|im_end|>\n<|im_start|>assistant\n")
    assert 135992 in turn2[len(turn1):]
    return turn1, reply, turn2, len(turn1) + len(head)


@pytest.mark.parametrize("every", [0, 4])
def test_reference_scenario_retokenized_reply(moe, scenario, every):
    turn1, reply, turn2, lcp = scenario
    policy = CheckpointPolicy(every=every)
    s = moe.session(f"ref{every}", checkpoints=policy)
    s.reset()
    pred = _predictor(policy, _snapshot_bytes(NEXT_PRESETS["tiny-moe"]))
    _call(s, pred, turn1, max_new_tokens=len(reply), force_ids=reply)
    r2 = _call(s, pred, turn2, max_new_tokens=2)
    assert r2.lcp == lcp  # the ids part at the re-encoded word
    if every == 0:
        assert (r2.reused, r2.restored_checkpoint) == (len(turn1), len(turn1))  # back to the turn start
    else:
        assert r2.reused == r2.restored_checkpoint == lcp // every * every > len(turn1)  # inside the reply
    assert r2.tokens_read == len(turn2) - r2.reused
    assert np.abs(s.last_logits() - moe.forward(s.held_ids)[-1]).max() <= TOL
    _call(s, pred, s.held_ids + turn1[:3], max_new_tokens=1)  # the next turn extends: nothing restored


def test_recorded_engine_session_replays_to_the_same_reuse(moe, scenario, qwen3, tmp_path):
    from strata_lab.caches.replay import replay
    from strata_lab.dump.writer import Recorder
    from strata_lab.rules import checkpoint_spec

    turn1, reply, turn2, _ = scenario
    s = moe.session("recorded", checkpoints=CheckpointPolicy(every=4))
    s.reset()
    path = tmp_path / "hybrid.jsonl"
    calls = [dict(prompt=turn1, force=reply), dict(prompt=turn2, force=None),
             dict(prompt=None, force=None), dict(prompt="cut", force=None)]
    with Recorder(path) as rec:
        for i, c in enumerate(calls):
            prompt = c["prompt"]
            if prompt is None:
                prompt = s.held_ids + turn1[-3:]
            elif prompt == "cut":
                prompt = s.held_ids[: len(turn1) + 6] + [13]
            kw = dict(max_new_tokens=len(c["force"]), force_ids=c["force"]) if c["force"] else dict(max_new_tokens=3)
            r = s.generate(prompt, **kw).result
            rec.write_call(session="s", prompt_ids=prompt, reused=r.reused, gen_ids=r.gen_ids,
                           drained_ids=r.drained_ids, finish=r.finish, prefill_ms=r.prefill_ms,
                           decode_ms=r.decode_ms, checkpoints=r.checkpoints, call=0, model="qwen3_next-tiny")
    rep = replay(path, "strata", tokenizer=qwen3, kind="hybrid", checkpoints="recorded")
    assert len(rep.rows) == 4 and rep["calls_differ"] == 0
    assert [r["reported"] for r in rep.rows] == [r["reused"] for r in rep.rows]
    assert rep.rows[1]["cause"] == "retokenized_reply"
    # and the same dump under the policy the session ran with, predicted from the ids alone
    rep2 = replay(path, "strata", tokenizer=qwen3, kind="hybrid",
                  checkpoints=checkpoint_spec(CheckpointPolicy(every=4)))
    assert rep2["calls_differ"] == 0


# --- loading -----------------------------------------------------------------------------------------
def test_bad_checkpoints_raise(tmp_path):
    from safetensors.numpy import load_file, save_file

    from strata_lab.engine import ModelFolderError

    path = make_tiny(tmp_path / "a", "qwen3_next", overrides=SMALL, mtp=True)
    Engine.load(path)  # mtp.* tensors are ignored
    t = load_file(str(path / "model.safetensors"))
    save_file(dict(t, **{"model.layers.0.extra.weight": np.zeros(3, np.float32)}), str(path / "model.safetensors"))
    with pytest.raises(ModelFolderError, match="model.layers.0.extra.weight"):
        Engine.load(path)
    save_file({k: v for k, v in t.items() if k != "model.layers.0.linear_attn.A_log"}, str(path / "model.safetensors"))
    with pytest.raises(ModelFolderError, match="model.layers.0.linear_attn.A_log"):
        Engine.load(path)
    save_file(dict(t, **{"model.layers.0.linear_attn.A_log": np.zeros(3, np.float32)}), str(path / "model.safetensors"))
    with pytest.raises(ModelFolderError, match="A_log"):
        Engine.load(path)
    save_file(t, str(path / "model.safetensors"))
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(dict(cfg, layer_types=cfg["layer_types"][:2])))
    with pytest.raises(ModelFolderError, match="layer_types"):
        Engine.load(path)
    (path / "config.json").write_text(json.dumps(dict(cfg, linear_num_value_heads=3)))
    with pytest.raises(ModelFolderError, match="linear_num_value_heads"):
        Engine.load(path)
    with pytest.raises(ValueError, match="pattern"):
        make_tiny(tmp_path / "b", "qwen3_next", pattern="nope")


def test_out_of_range_ids(moe):
    with pytest.raises(ValueError, match="out of range"):
        moe.forward([1, moe.vocab_size])
    with pytest.raises(ValueError, match="out of range"):
        moe.session("oor").generate([moe.vocab_size + 5], max_new_tokens=0)


def test_make_tiny_dispatches_to_qwen3_next(tmp_path):
    from strata_lab import make_tiny

    p = make_tiny(tmp_path / "m", arch="qwen3_next", preset="tiny-moe",
                  overrides={"num_hidden_layers": 2, **SMALL})
    cfg = json.loads((p / "config.json").read_text())
    assert (cfg["model_type"], cfg["num_hidden_layers"], cfg["num_experts"]) == ("qwen3_next", 2, 4)
    assert (p / "tokenizer.json").exists() and "chat_template" in json.loads((p / "tokenizer_config.json").read_text())
    eng = Engine.load(p)
    assert eng.forward([1, 2]).shape == (2, 151936)
    # bfloat16 storage is used in place (mmapped views), logits close to the f32 weights' own rounding
    pb = make_tiny(tmp_path / "b", arch="qwen3_next", dtype="bfloat16", overrides=SMALL)
    eb = Engine.load(pb)
    ef = Engine.load(make_tiny(tmp_path / "f", arch="qwen3_next", overrides=SMALL))
    assert eb.info["weight_bytes"] * 2 == ef.info["weight_bytes"]
    assert np.isfinite(eb.forward([3, 4, 5])).all()


@pytest.mark.parametrize("header", [True, False], ids=["header", "turn-only"])
def test_template_rewrite_restores_header_checkpoint(moe, qwen3, header):
    """The Qwen3 template strips the previous reply's empty <think> block once a user turn arrives, so the
    next prompt parts from the held ids right after the old generation prompt's header. A before_last
    checkpoint (just before that <|im_start|>) serves it: the call reads only the assistant turn onward;
    with the turn start only, a hybrid session starts over from 0."""
    from strata_lab import ChatTemplate

    tok, tmpl = qwen3, ChatTemplate.from_name("qwen3")
    im_start = tok.token_id("<|im_start|>")
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}]
    # thinking off: the generation prompt ends with an empty '<think>\n\n</think>\n\n' block
    p1 = tok.encode(tmpl.render(msgs, enable_thinking=False))
    assert tok.decode(p1).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    reply_text = "Blue."
    reply = tok.encode(reply_text) + [tok.token_id("<|im_end|>")]
    msgs2 = msgs + [{"role": "assistant", "content": reply_text}, {"role": "user", "content": "Another?"}]
    p2 = tok.encode(tmpl.render(msgs2, enable_thinking=False))
    lcp = next(i for i, (a, b) in enumerate(zip(p1 + reply, p2)) if a != b)
    hdr = max(i for i, t in enumerate(p1) if t == im_start)  # before '<|im_start|>assistant\n'
    # the old reply's empty think block is gone: p2 parts right after the old generation prompt's header,
    # before the turn-start checkpoint at len(p1)
    assert tok.decode(p1[hdr:lcp]) == "<|im_start|>assistant\n" and lcp < len(p1) and p2[hdr] == im_start

    policy = CheckpointPolicy(before_last=im_start if header else None)
    s = moe.session(f"rewrite-{header}", checkpoints=policy)
    s.reset()
    pred = _predictor(policy, _snapshot_bytes(NEXT_PRESETS["tiny-moe"]))
    r1 = _call(s, pred, p1, max_new_tokens=len(reply), force_ids=reply)
    assert r1.checkpoints == ([hdr, len(p1)] if header else [len(p1)])
    r2 = _call(s, pred, p2, max_new_tokens=0)
    if header:
        assert (r2.reused, r2.restored_checkpoint, r2.tokens_read) == (hdr, hdr, len(p2) - hdr)
        assert hdr in r2.checkpoints  # kept for the next rewrite
    else:
        assert (r2.reused, r2.tokens_read) == (0, len(p2))
    assert np.abs(s.last_logits() - moe.forward(p2)[-1]).max() <= TOL
    # the header snapshot's logits are exact: a prompt ending there is served from it, nothing read
    if header:
        r3 = _call(s, pred, p2[:hdr], max_new_tokens=0)
        assert r3.used_saved_logits and r3.tokens_read == 0
        assert np.abs(s.last_logits() - moe.forward(p2[:hdr])[-1]).max() <= TOL
