"""Logprobs computed in C++ (prompt and generated ids) against transformers' log-softmax, and the token mask."""
import numpy as np
import pytest

from strata_lab.engine import Sampling

IDS = [9707, 1879, 13, 400, 22, 5, 151644, 872, 198, 3838, 374, 220, 17, 10, 17]


@pytest.fixture(scope="module")
def hf_logprobs(tiny_dir):
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([IDS])).logits[0]
    return torch.log_softmax(logits.double(), -1).numpy()


def test_prompt_logprobs_equal_transformers(tiny_engine, hf_logprobs):
    lps = tiny_engine.prompt_logprobs(IDS, top_n=5)
    assert [e.id for e in lps] == IDS[1:]
    got = np.array([e.logprob for e in lps])
    want = np.array([hf_logprobs[j, IDS[j + 1]] for j in range(len(IDS) - 1)])
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    for j, e in enumerate(lps):
        top_ids = [i for i, _ in e.top]
        assert top_ids == list(np.argsort(-hf_logprobs[j], kind="stable")[:5])
        assert [lp for _, lp in e.top] == sorted((lp for _, lp in e.top), reverse=True)


def test_generated_logprobs_are_raw_log_softmax(tiny_engine, hf_logprobs):
    s = tiny_engine.session("lp-gen")
    s.reset()
    stream = s.generate(IDS, max_new_tokens=4, logprobs=3, sampling=Sampling(temperature=1.3, seed=5))
    ids = list(stream)
    assert [e.id for e in stream.logprobs] == ids == stream.result.gen_ids
    assert stream.result.logprobs == stream.logprobs
    # the first generated id's distribution is the prompt's last position, before temperature
    first = stream.logprobs[0]
    assert abs(first.logprob - hf_logprobs[-1, ids[0]]) < 1e-4
    assert first.top[0][0] == int(np.argmax(hf_logprobs[-1]))


def test_greedy_id_is_the_top_logprob(tiny_engine):
    s = tiny_engine.session("lp-greedy")
    s.reset()
    stream = s.generate(IDS[:5], max_new_tokens=5, logprobs=2)
    ids = list(stream)
    for i, e in zip(ids, stream.logprobs):
        assert e.top[0] == (i, e.logprob)
        assert e.top[0][1] >= e.top[1][1]


def test_logprobs_off_by_default_and_bad_values(tiny_engine):
    s = tiny_engine.session("lp-off")
    assert s.generate(IDS[:3], max_new_tokens=2).result.logprobs == []
    with pytest.raises(ValueError, match="logprobs"):
        s.generate(IDS[:3], max_new_tokens=2, logprobs=-1)
    with pytest.raises(ValueError, match="top_n"):
        tiny_engine.prompt_logprobs(IDS, top_n=5000)


class _Only:
    """A token mask that allows only `allowed` ids (the shape a grammar mask has)."""

    def __init__(self, vocab, allowed):
        self.mask_words = (vocab + 31) // 32
        self.allowed = allowed
        self.calls = []

    def __call__(self, n, last, bits):
        self.calls.append((n, last))
        bits[:] = 0
        for i in self.allowed:
            bits[i // 32] |= np.uint32(1 << (i % 32))
        return True


def test_token_mask_restricts_sampling_and_keeps_session_logits(tiny_engine):
    s = tiny_engine.session("mask")
    s.reset()
    mask = _Only(tiny_engine.vocab_size, [13, 400, 151645])
    stream = s.generate(IDS[:4], max_new_tokens=6, token_mask=mask, sampling=Sampling(temperature=1.0, seed=1))
    ids = list(stream)
    assert set(ids) <= {13, 400, 151645} and len(ids) == 6
    assert [n for n, _ in mask.calls] == list(range(6))
    assert [last for _, last in mask.calls[1:]] == ids[:-1]
    # the session's saved logits are the model's, not the masked copy
    ref = tiny_engine.forward(s.held_ids)[-1]
    np.testing.assert_array_equal(s.last_logits(), ref)
