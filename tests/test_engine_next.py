"""Qwen3-Next in the C++ engine: parity with transformers, GDN prefill/decode, hybrid checkpoints."""
from __future__ import annotations

import json

import numpy as np
import pytest

from strata_lab._tiny_next import make_tiny_next
from strata_lab.hybrid_reuse import HybridStateModel
from strata_lab.next_model import CheckpointPolicy, NextEngine

pytest.importorskip("strata_lab._engine")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return NextEngine.load(make_tiny_next(tmp_path_factory.mktemp("tiny"), preset="tiny-moe"))


def _ids(n, seed=0, vocab=512):
    return [int(i) for i in np.random.default_rng(seed).integers(0, vocab, n)]


@pytest.mark.parametrize("preset,pattern", [("tiny", "layer_types"), ("tiny", "full_attention_interval"),
                                            ("tiny-moe", "layer_types"), ("tiny-moe", "full_attention_interval")])
def test_logits_match_transformers(tmp_path, preset, pattern):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    path = make_tiny_next(tmp_path, preset=preset, pattern=pattern, mtp=True, seed=3)
    hf = transformers.Qwen3NextForCausalLM.from_pretrained(path, dtype=torch.float32)
    ids = _ids(70, seed=1)  # > one 64-token chunk, not a multiple of it
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].numpy()
    eng = NextEngine.load(path)
    assert np.abs(eng.forward(ids) - ref).max() <= 1e-4
    assert np.abs(eng.decode_steps(ids[:20]) - ref[:20]).max() <= 1e-4


@pytest.mark.parametrize("n", [1, 5, 63, 64, 65, 150])
def test_chunked_prefill_equals_recurrent_and_decode(tiny, n):
    ids = _ids(n, seed=n)
    chunked = tiny.forward(ids, mode="chunked")
    assert np.abs(chunked - tiny.forward(ids, mode="recurrent")).max() <= 1e-4
    assert np.abs(chunked - tiny.decode_steps(ids)).max() <= 1e-4


def test_session_extends_and_restores_like_fresh_forward(tiny):
    s = tiny.session(CheckpointPolicy(every=8))
    prompt = _ids(30, seed=5)
    r1 = s.generate(prompt, max_new_tokens=12)
    assert (r1.reused, r1.read, r1.restored) == (0, 30, None)
    assert s.held_ids == prompt + r1.gen_ids
    assert s.checkpoints == [8, 16, 24, 30, 32, 40]
    # diverge 5 tokens into the reply: lcp 35, largest checkpoint <= 35 is 32
    p2 = prompt + r1.gen_ids[:5] + [7, 8, 9]
    r2 = s.generate(p2)
    assert (r2.lcp, r2.reused, r2.restored, r2.read) == (35, 32, 32, 6)
    assert np.abs(s.last_logits - tiny.forward(p2)[-1]).max() <= 1e-4
    assert s.checkpoints == [8, 16, 24, 30, 32, 38]
    # extending the held ids reuses everything, no restore
    r3 = s.generate(p2 + [11, 12])
    assert (r3.reused, r3.restored) == (len(p2), None)
    assert np.abs(s.last_logits - tiny.forward(p2 + [11, 12])[-1]).max() <= 1e-4
    # a prompt that ends exactly at a checkpoint answers from the snapshot's saved logits
    r4 = s.generate(prompt)
    assert (r4.reused, r4.restored, r4.logits_saved) == (30, 30, True)
    assert np.abs(s.last_logits - tiny.forward(prompt)[-1]).max() <= 1e-4
    assert s.snapshot_bytes > 0 and s.memory_bytes > s.snapshot_bytes


def test_budget_evicts_least_recently_used(tiny):
    s1 = tiny.session(CheckpointPolicy(at_prompt_end=False, every=4))
    s1.generate(_ids(4))
    per = s1.snapshot_bytes
    policy = CheckpointPolicy(every=4, budget_mib=2.5 * per / 2**20)
    s = tiny.session(policy)
    model = HybridStateModel(policy, snapshot_mib=per / 2**20)
    calls = [(_ids(10, 1), 6), (_ids(10, 1) + _ids(6, 2), 5), (_ids(10, 1)[:9] + [3, 4, 5], 3)]
    for prompt, n in calls:
        r = s.generate(prompt, max_new_tokens=n)
        pred = model.call(prompt, r.gen_ids)
        assert (r.reused, r.restored) == (pred.reused, pred.restored)
        assert s.checkpoints == sorted(model.checkpoints)
        assert s.snapshot_bytes <= policy.budget_mib * 2**20
        assert np.abs(s.last_logits - tiny.forward(s.held_ids)[-1]).max() <= 1e-4 or r.gen_ids


@pytest.fixture(scope="module")
def qwen_vocab(tmp_path_factory):
    # Real Qwen vocab size so real token ids flow through; small hidden size keeps it fast.
    return NextEngine.load(make_tiny_next(tmp_path_factory.mktemp("qv"), preset="tiny", vocab_size=151936,
                                          tie_word_embeddings=True, hidden_size=32, intermediate_size=48))


@pytest.mark.parametrize("every", [0, 4])
def test_reference_scenario_retokenized_reply(qwen_vocab, every):
    """A reply the model wrote as [130947, 5855] is re-encoded as [135992] on the next turn."""
    from strata_lab import load_tokenizer

    tok = load_tokenizer("qwen3")
    turn1 = tok.encode("<|im_start|>user\nBir cümle yaz<|im_end|>\n<|im_start|>assistant\n")
    reply_text = " Bu cümlede bir öğrenci var."
    head = tok.encode(" Bu cümlede bir")
    reply = head + [130947, 5855] + tok.encode(" var.") + [tok.token_id("<|im_end|>")]
    assert tok.decode(reply[:-1]) == reply_text
    turn2 = (turn1 + tok.encode(reply_text + "<|im_end|>\n<|im_start|>user\nTeşekkürler<|im_end|>\n"
                                              "<|im_start|>assistant\n"))
    policy = CheckpointPolicy(every=every)
    s = qwen_vocab.session(policy)
    model = HybridStateModel(policy)
    r1 = s.generate(turn1, force_ids=reply)
    p1 = model.call(turn1, r1.gen_ids)
    r2 = s.generate(turn2, max_new_tokens=2)
    p2 = model.call(turn2, r2.gen_ids)
    lcp = len(turn1) + len(head)  # ids part at the re-encoded word
    assert r2.lcp == lcp
    assert [(r.reused, r.restored) for r in (r1, r2)] == [(p.reused, p.restored) for p in (p1, p2)]
    if every == 0:
        assert (r2.reused, r2.restored) == (len(turn1), len(turn1))  # back to the turn start
    else:
        assert r2.reused == lcp // every * every > len(turn1)  # last checkpoint inside the reply
    assert r2.reread == lcp - r2.reused
    assert np.abs(s.last_logits - qwen_vocab.forward(s.held_ids)[-1]).max() <= 1e-4 or r2.gen_ids


def test_bad_checkpoints_raise(tmp_path):
    from safetensors.numpy import load_file, save_file

    path = make_tiny_next(tmp_path / "a", mtp=True)
    NextEngine.load(path)  # mtp.* tensors are ignored
    t = load_file(str(path / "model.safetensors"))
    extra = dict(t, **{"model.layers.0.extra.weight": np.zeros(3, np.float32)})
    save_file(extra, str(path / "model.safetensors"))
    with pytest.raises(ValueError, match="unexpected tensor model.layers.0.extra.weight"):
        NextEngine.load(path)
    missing = {k: v for k, v in t.items() if k != "model.layers.0.linear_attn.A_log"}
    save_file(missing, str(path / "model.safetensors"))
    with pytest.raises(ValueError, match="missing tensor model.layers.0.linear_attn.A_log"):
        NextEngine.load(path)
    bad = dict(t, **{"model.layers.0.linear_attn.A_log": np.zeros(3, np.float32)})
    save_file(bad, str(path / "model.safetensors"))
    with pytest.raises(ValueError, match="A_log"):
        NextEngine.load(path)
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(dict(cfg, model_type="qwen3")))
    with pytest.raises(ValueError, match="model_type"):
        NextEngine.load(path)
    with pytest.raises(ValueError, match="every"):
        CheckpointPolicy(every=-1)
    with pytest.raises(ValueError, match="pattern"):
        make_tiny_next(tmp_path / "b", pattern="nope")


def test_out_of_range_ids(tiny):
    with pytest.raises(IndexError, match="out of range"):
        tiny.forward([1, 512])
    with pytest.raises(IndexError, match="out of range"):
        tiny.session().generate([600])
    with pytest.raises(ValueError, match="max_new_tokens"):
        tiny.session().generate([1], max_new_tokens=-1)


def test_make_tiny_dispatches_to_qwen3_next(tmp_path):
    from strata_lab import make_tiny

    p = make_tiny(tmp_path / "m", arch="qwen3_next", preset="tiny-moe", overrides={"num_hidden_layers": 2})
    cfg = json.loads((p / "config.json").read_text())
    assert (cfg["model_type"], cfg["num_hidden_layers"], cfg["num_experts"]) == ("qwen3_next", 2, 4)
    assert NextEngine.load(p).forward([1, 2]).shape == (2, 512)
    pb = make_tiny(tmp_path / "b", arch="qwen3_next", dtype="bfloat16")
    assert NextEngine.load(pb).forward([3]).shape == (1, 512)
