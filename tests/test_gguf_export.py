"""The GGUF writer (strata_lab.tiny.gguf_export) against llama.cpp: a tiny Qwen3-Next folder written as an
f32 qwen3next GGUF gives llama.cpp logits equal to the engine's on the same ids, in one batch and with the
last ids decoded one at a time.

Skipped when llama-cpp-python (not a project dependency) is absent. Tolerance: 1e-4 absolute on logits of
magnitude ~5, with llama.cpp's KV cache in f32 (its default f16 cache alone gives ~6e-4); measured ~1e-5.
The second test writes the same folder with one transformation left out at a time and checks that the
comparison then fails by far more than the tolerance, so a wrong transformation cannot pass.
"""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("strata_lab._engine")
pytest.importorskip("gguf")
llama_cpp = pytest.importorskip("llama_cpp")

from strata_lab.engine import Engine  # noqa: E402
from strata_lab.tiny import NEXT_PRESETS, make_tiny  # noqa: E402
from strata_lab.tiny import gguf_export  # noqa: E402

TOL = 1e-4
# tiny-moe with every layer MoE (llama.cpp's qwen3next has no dense layers), 32 wide: 2 GDN + 2 gated
# attention layers, Hk=2 < Hv=4 (so the key-head grouping of in_proj_qkvz/in_proj_ba matters), 4 experts
# top-2 plus the gated shared expert, untied lm_head, the real Qwen vocab
SHAPE = dict(hidden_size=32, moe_intermediate_size=16, shared_expert_intermediate_size=24, mlp_only_layers=())
IDS = [int(i) for i in np.random.default_rng(1).integers(0, 151643, 40)]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("next"), "qwen3_next", "tiny-moe", seed=3, overrides=SHAPE, mtp=True)


@pytest.fixture(scope="module")
def engine_logits(folder):
    return Engine.load(folder, threads=2).forward(IDS)


def _llama_logits(path, ids, steps=0):
    """llama.cpp's logits for every id: one batch, then the last ``steps`` ids one call each (its recurrent
    GDN step and conv state carried between calls)."""
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=64, n_batch=64, n_ubatch=64, logits_all=True,
                          type_k=0, type_v=0, n_threads=2, verbose=False)  # type 0: GGML_TYPE_F32 cache
    try:
        llm.eval(ids[: len(ids) - steps])
        for i in range(len(ids) - steps, len(ids)):
            llm.eval([ids[i]])
        return np.array(llm.scores[: len(ids)], dtype=np.float32)
    finally:
        llm.close()


def test_llama_cpp_logits_match_the_engine(folder, engine_logits, tmp_path):
    out = gguf_export.write_gguf(folder, tmp_path / "next.gguf", "f32")
    assert np.abs(engine_logits).max() > 1.0  # logits are not trivially small
    assert np.abs(_llama_logits(out, IDS) - engine_logits).max() <= TOL
    assert np.abs(_llama_logits(out, IDS, steps=8) - engine_logits).max() <= TOL


# each undoes one of the writer's steps on what it yields (dt_bias: zeroed instead, its rename being needed
# to load at all); "qkv ungrouped" puts back in_proj_qkvz's per-key-head row order
BROKEN = {
    "norms without +1": lambda n, a: (n, a - 1.0) if n.endswith("norm.weight") and "linear_attn" not in n else (n, a),
    "A_log as stored": lambda n, a: (n, np.log(-a)) if n.endswith(".A_log") else (n, a),
    "dt_bias dropped to 0": lambda n, a: (n, np.zeros_like(a)) if n.endswith(".dt_proj.bias") else (n, a),
    "qkv ungrouped": lambda n, a: (n, a) if not n.endswith("attn_qkv.weight") else (n, _ungrouped(a)),
}


def _ungrouped(qkv):
    """The grouped-per-key-head row order the writer undoes, put back (as if it had not been split)."""
    t = NEXT_PRESETS["tiny-moe"]
    hk, dk, hv, dv = t.linear_num_key_heads, t.linear_key_head_dim, t.linear_num_value_heads, t.linear_value_head_dim
    q, k, v = np.split(qkv, [hk * dk, 2 * hk * dk])
    r = hv // hk
    return np.concatenate([np.concatenate([q[g * dk:(g + 1) * dk], k[g * dk:(g + 1) * dk],
                                           v[g * r * dv:(g + 1) * r * dv]]) for g in range(hk)])


@pytest.mark.slow  # ~4 s each, mostly gguf packing the 151936-token vocab
@pytest.mark.parametrize("broken", sorted(BROKEN))
def test_a_missing_transformation_fails_the_comparison(folder, engine_logits, tmp_path, monkeypatch, broken):
    real = gguf_export._next_tensors
    monkeypatch.setattr(gguf_export, "_next_tensors",
                        lambda st, cfg: (BROKEN[broken](n, a) for n, a in real(st, cfg)))
    got = _llama_logits(gguf_export.write_gguf(folder, tmp_path / "bad.gguf", "f32"), IDS)
    err = np.abs(got - engine_logits).max()
    assert not err <= 100 * TOL  # NaN (a positive decay blows the state up) fails too


def test_folders_llama_cpp_cannot_load_are_refused(tmp_path):
    dense = make_tiny(tmp_path / "dense", "qwen3_next", "tiny", overrides={"hidden_size": 32})
    with pytest.raises(ValueError, match="MoE"):
        gguf_export.write_gguf(dense, tmp_path / "x.gguf", "f32")
    mixed = make_tiny(tmp_path / "mixed", "qwen3_next", "tiny-moe", overrides={"hidden_size": 32})  # layer 2 dense
    with pytest.raises(ValueError, match="every layer"):
        gguf_export.write_gguf(mixed, tmp_path / "y.gguf", "f32")
