"""Engine tier: int8 weights quantised at load (per-row absmax scales), accuracy bound and session parity."""
import numpy as np
import pytest

_engine = pytest.importorskip("strata_lab._engine")
from strata_lab.tiny import make_tiny  # noqa: E402
from strata_lab.engine import Engine  # noqa: E402

IDS = [9707, 1879, 0, 151643, 151645, 13, 220, 14990, 135992, 128, 253, 42, 7, 99999, 151935, 3]


@pytest.fixture(scope="module")
def tiny_bf16(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("i8") / "ck", dtype="bfloat16", seed=3)


def test_int8_logits_within_bound_of_stored_weights(tiny_bf16):
    """The stated bound: max |logit error| <= 5% of the largest |logit| (measured ~2.6% at hidden 64: per-row
    scales over short rows are the worst case), mean error <= 3% of the mean |logit| (measured 1.9%), and >= 90% argmax
    agreement, against the same bf16 weights computed in f32 (the exact upcast), over a 16-token forward."""
    ref = Engine.load(tiny_bf16, threads=2).forward(IDS)
    eng = Engine.load(tiny_bf16, threads=2, weights="int8")
    assert eng.info["weights"] == "int8"
    ours = eng.forward(IDS)
    err = np.abs(ours - ref).max()
    assert 0 < err <= 0.05 * np.abs(ref).max()  # quantised (not bit-equal), but close
    assert np.abs(ours - ref).mean() <= 0.03 * np.abs(ref).mean()
    assert np.mean(ours.argmax(1) == ref.argmax(1)) >= 0.9


def test_int8_streams_about_half_the_bytes_of_bf16(tiny_bf16):
    bf16 = Engine.load(tiny_bf16, threads=1).info["stream_bytes"]
    int8 = Engine.load(tiny_bf16, threads=1, weights="int8").info["stream_bytes"]
    assert 0.49 < int8 / bf16 < 0.55  # 1 byte per weight + one f32 scale per row


def test_int8_decode_bit_identical_to_full_forward(tiny_bf16):
    eng = Engine.load(tiny_bf16, threads=2, weights="int8")
    s = eng.session("q")
    r = s.generate(IDS, max_new_tokens=5).result
    full = eng.forward(s.held_ids)
    assert r.gen_ids == [int(np.argmax(full[i])) for i in range(len(IDS) - 1, len(s.held_ids) - 1)]
    np.testing.assert_array_equal(s.last_logits(), full[-1])


def test_int8_scalar_kernels_agree_with_vector_kernels(tiny_bf16):
    eng = Engine.load(tiny_bf16, threads=1, weights="int8")
    best = _engine.kernel_level()
    vec = eng.forward(IDS[:6])
    _engine.set_kernel_level("scalar")
    try:
        scalar = eng.forward(IDS[:6])
    finally:
        _engine.set_kernel_level(best)
    assert np.abs(vec - scalar).max() <= 1e-4


def test_int8_hybrid_model_loads_and_stays_close(tmp_path):
    from strata_lab.tiny import make_tiny

    path = make_tiny(tmp_path / "next", "qwen3_next", dtype="bfloat16")
    ref = Engine.load(path, threads=2).forward(IDS[:8])
    ours = Engine.load(path, threads=2, weights="int8").forward(IDS[:8])
    assert np.abs(ours - ref).max() <= 0.05 * np.abs(ref).max()


def test_bad_weights_option_names_the_field(tiny_bf16):
    with pytest.raises(ValueError, match="weights"):
        Engine.load(tiny_bf16, weights="int4")
