"""The CUDA backend (docs/ENGINE.md "GPU"): ``Engine.load(path, device="cuda")``.

The first tests run everywhere: the options the GPU refuses, and the one error of a machine without a
usable GPU (or a build without the backend). The ``gpu`` tests need a CUDA GPU (conftest skips them with
"no CUDA GPU" elsewhere; ``scripts/device_check.sh`` runs them): the GPU's logits against the CPU engine's
(same bf16 weights, fp32 activations and KV cache) and transformers', greedy ids, Contract 1's reuse and
the call records, batched decode, and a long context.

Tolerances: the GPU rounds each matmul's input and the KV cache to bf16, so its logits are compared with a
bound relative to the largest |logit| (``_REL``), the bound transformers' own bf16 run keeps against its
fp32 run; greedy ids must agree until the first step where the CPU's top two logits are within that bound.
"""
from __future__ import annotations

import numpy as np
import pytest

from strata_lab.engine import Engine, Sampling
from strata_lab.tiny import make_tiny

_REL = 0.03  # max |gpu - reference| <= _REL * max |reference|


def _small(path, **overrides):
    return make_tiny(path, dtype="bfloat16", overrides={"vocab_size": 2048, **overrides})


# ------------------------------------------------------------------ everywhere

def test_device_option_is_checked_before_any_work(tmp_path):
    path = _small(tmp_path / "m", num_hidden_layers=1)
    with pytest.raises(ValueError, match="device must be 'cpu' or 'cuda'"):
        Engine.load(path, device="gpu")
    with pytest.raises(ValueError, match="weights='int8' runs on the CPU only"):
        Engine.load(path, device="cuda", weights="int8")
    with pytest.raises(ValueError, match="kv_cache: device='cuda' keeps a bf16 KV cache"):
        Engine.load(path, device="cuda", kv_cache="f16")
    assert Engine.load(path, threads=1).info["device"] == "cpu"


def test_hybrid_models_say_they_run_on_the_cpu(tmp_path):
    path = make_tiny(tmp_path / "next", arch="qwen3_next", overrides={"vocab_size": 2048})
    with pytest.raises(ValueError, match="hybrid layers run on the CPU only"):
        Engine.load(path, device="cuda")


def test_no_gpu_is_one_clear_error(tmp_path, cuda_gpu):
    if cuda_gpu:
        pytest.skip("a CUDA GPU is present")
    path = _small(tmp_path / "m", num_hidden_layers=1)
    with pytest.raises(RuntimeError, match=r"^device='cuda': (no usable CUDA GPU|no CUDA GPU|this build of strata_lab "
                                           r"has no CUDA backend)") as err:
        Engine.load(path, device="cuda")
    assert "\n" not in str(err.value)


# ------------------------------------------------------------------ on a GPU

def _assert_close(got: np.ndarray, ref: np.ndarray, rel: float = _REL, what: str = "logits"):
    assert got.shape == ref.shape
    assert np.isfinite(got).all(), f"{what}: non-finite values"
    scale = float(np.abs(ref).max())
    err = float(np.abs(got - ref).max())
    assert err <= rel * scale, f"{what}: max |diff| {err:.4g} > {rel} x max |ref| {scale:.4g}"


def _greedy_agree(cpu_ids, gpu_ids, ref_logits, start: int):
    """Equal ids, or a first difference where the CPU's top two logits are within the bf16 bound."""
    for i, (a, b) in enumerate(zip(cpu_ids, gpu_ids)):
        if a == b:
            continue
        row = ref_logits[start + i]
        top = np.sort(row)[-2:]
        assert top[1] - top[0] <= _REL * float(np.abs(row).max()), \
            f"step {i}: gpu {b}, cpu {a}, cpu margin {top[1] - top[0]:.4g}"
        return i
    return len(cpu_ids)


@pytest.fixture(scope="module")
def bf16_dir(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("cuda_bf16"), dtype="bfloat16")


@pytest.fixture(scope="module")
def pair(bf16_dir):
    """The same bf16 folder on the CPU (fp32 activations and KV cache: the reference) and on the GPU."""
    return (Engine.load(bf16_dir, kv_cache="f32", max_context=20000),
            Engine.load(bf16_dir, device="cuda", max_context=20000))


@pytest.mark.gpu
def test_info_says_cuda(pair):
    info = pair[1].info
    assert (info["device"], info["weights"], info["kv_cache"], info["weights_memory"]) == ("cuda", "bf16", "bf16", "cuda")
    assert info["stream_bytes"] > 0


@pytest.mark.gpu
def test_forward_logits_match_the_cpu_engine(pair):
    ids = list(np.random.default_rng(0).integers(0, 151_000, size=70))
    cpu, gpu = pair[0].forward(ids), pair[1].forward(ids)
    _assert_close(gpu, cpu)
    assert (gpu.argmax(1) == cpu.argmax(1)).mean() >= 0.9


@pytest.mark.gpu
def test_decode_equals_the_prefill_rows_and_batching_changes_no_bit(pair):
    cpu, gpu = pair
    ids = list(np.random.default_rng(1).integers(0, 151_000, size=40))
    full = gpu.forward(ids)
    seqs = [ids[:k] for k in (2, 17, 33, 40)]
    alone = gpu._e._decode_fresh(seqs, False)
    batched = gpu._e._decode_fresh(seqs, True)
    assert np.array_equal(alone, batched)  # a row's sums never depend on the batch
    for row, s in zip(alone, seqs):  # decode (split-key attention) against the prefill's row
        _assert_close(row, full[len(s) - 1], rel=0.01, what=f"decode at {len(s)}")


@pytest.mark.gpu
@pytest.mark.parametrize("which", ["embedded", "qwen3-0.6b"])
def test_greedy_ids_equal_the_cpu_engine(which, tmp_path):
    if which == "embedded":
        from strata_lab.tiny import embedded_model

        path = embedded_model("attention")  # 151669 rows: the lm_head's padded tile
    else:
        path = make_tiny(tmp_path / "m", preset="qwen3-0.6b", dtype="bfloat16")
    cpu = Engine.load(path, kv_cache="f32", max_context=4096)
    gpu = Engine.load(path, device="cuda", max_context=4096)
    prompt = list(np.random.default_rng(2).integers(0, 150_000, size=48))
    n = 12
    cpu_ids = cpu.session("a").generate(prompt, max_new_tokens=n).ids()
    gpu_ids = gpu.session("a").generate(prompt, max_new_tokens=n).ids()
    ref = cpu.forward(prompt + cpu_ids)
    _assert_close(gpu.forward(prompt + cpu_ids), ref)
    _greedy_agree(cpu_ids, gpu_ids, ref, len(prompt) - 1)


@pytest.mark.gpu
def test_logits_match_transformers(bf16_dir, pair):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    ids = list(np.random.default_rng(3).integers(0, 151_000, size=64))
    x = torch.tensor([ids], device="cuda")
    ref = {}
    for dtype in (torch.float32, torch.bfloat16):
        hf = transformers.AutoModelForCausalLM.from_pretrained(bf16_dir, dtype=dtype, attn_implementation="sdpa")
        with torch.no_grad():
            ref[dtype] = hf.to("cuda")(x).logits[0].float().cpu().numpy()
        del hf
    gpu = pair[1].forward(ids)
    _assert_close(gpu, ref[torch.float32], what="engine (cuda) vs transformers f32")
    ours = np.abs(gpu - ref[torch.float32]).max()
    theirs = np.abs(ref[torch.bfloat16] - ref[torch.float32]).max()
    assert ours <= max(2 * theirs, 1e-3 * np.abs(ref[torch.float32]).max()), (ours, theirs)


def _calls(engine, script):
    """Run a script of (session, prompt, forced ids) calls; the call records' Contract 1 fields."""
    records = []
    engine.add_observer(records.append)
    try:
        for name, prompt, forced in script:
            engine.session(name).generate(prompt, max_new_tokens=len(forced), force_ids=forced).ids()
    finally:
        engine.remove_observer(records.append)
    return [(r.session, r.prompt_ids, r.reused, r.gen_ids, r.drained_ids, r.checkpoints, r.finish) for r in records]


@pytest.mark.gpu
def test_reuse_and_call_records_equal_the_cpu_engine(bf16_dir):
    rng = np.random.default_rng(4)
    a = [int(i) for i in rng.integers(0, 150_000, size=300)]
    r1 = [int(i) for i in rng.integers(0, 150_000, size=20)]
    b = [int(i) for i in rng.integers(0, 150_000, size=40)]
    script = [("s", a, r1),                      # cold
              ("s", a + r1 + b, [7, 8, 9]),      # the reply reused
              ("s", a[:150] + b, [5]),           # divergence: truncated to the common prefix
              ("s", a[:150] + b + [5], []),      # the held ids again, one more
              ("t", a[:1], [1, 2])]              # another session
    cpu = Engine.load(bf16_dir, kv_cache="f32")
    gpu = Engine.load(bf16_dir, device="cuda")
    assert _calls(gpu, script) == _calls(cpu, script)
    # the reused state gives the logits a fresh read gives
    fresh = Engine.load(bf16_dir, device="cuda").session("f")
    fresh.generate(a[:150] + b + [5], max_new_tokens=0).ids()
    _assert_close(gpu.session("s").last_logits(), fresh.last_logits(), rel=0.01, what="reused vs fresh")
    _assert_close(gpu.session("s").last_logits(), cpu.session("s").last_logits())
    assert gpu.session("s").memory_bytes() > 0


@pytest.mark.gpu
def test_long_context_prefill_and_decode(tmp_path):
    # head_dim 128 (the 0.6B's), 9,000 positions: 18 prefill chunks, then decode over many key chunks
    path = make_tiny(tmp_path / "m", dtype="bfloat16",
                     overrides={"head_dim": 128, "max_position_embeddings": 20000})
    prompt = [int(i) for i in np.random.default_rng(5).integers(0, 150_000, size=9000)]
    forced = [11, 12, 13, 14]
    out = {}
    for device, kv in (("cpu", "f32"), ("cuda", "auto")):
        s = Engine.load(path, device=device, kv_cache=kv).session("long")
        s.generate(prompt, max_new_tokens=0).ids()
        after_prompt = s.last_logits().copy()
        s.generate(prompt + forced, max_new_tokens=0).ids()  # 4 ids: one prefill chunk of 4 rows
        s.generate(prompt + forced + [15], max_new_tokens=2, force_ids=[16, 17]).ids()  # decode steps
        out[device] = (after_prompt, s.last_logits().copy())
    _assert_close(out["cuda"][0], out["cpu"][0], what="after 9,000 ids")
    _assert_close(out["cuda"][1], out["cpu"][1], what="after decoding at 9,006")


@pytest.mark.gpu
def test_sampled_generation_runs_on_the_host_sampler(pair):
    s = pair[1].session("sampled")
    ids = s.generate([1, 2, 3], max_new_tokens=8, sampling=Sampling(temperature=1.0, seed=3)).ids()
    assert len(ids) == 8 and s.held_ids == [1, 2, 3] + ids
    s2 = pair[1].session("sampled2")
    assert s2.generate([1, 2, 3], max_new_tokens=8, sampling=Sampling(temperature=1.0, seed=3)).ids() == ids
