"""Engine tier: the sampler's logit modifiers (logit_bias, repetition / frequency / presence penalty).

Each greedy step is checked against the documented formula applied, in numpy, to the raw logits that a
teacher-forced forward gives for the same prefix: the engine's id must be the argmax of the modified
logits. A large bias on one id makes the output repeat it, so the penalties have something to act on.
"""
import numpy as np
import pytest

pytest.importorskip("strata_lab._engine")
from strata_lab.engine import Sampling  # noqa: E402

PROMPT = [9707, 1879, 13, 220, 14990, 135992, 42, 7, 3, 1000, 2000, 3000]
STEPS = 24


def _greedy(engine, name, prompt, sampling, steps=STEPS):
    s = engine.session(name)
    s.reset()
    return s.generate(prompt, max_new_tokens=steps, sampling=sampling).result.gen_ids


def _reference(engine, prompt, gen, *, bias=(), rep=1.0, last_n=64, freq=0.0, pres=0.0):
    """The ids greedy decoding with these modifiers must give, from teacher-forced raw logits."""
    full = engine.forward(list(prompt) + list(gen))
    want = []
    for t in range(len(gen)):
        logits = full[len(prompt) - 1 + t].astype(np.float64).copy()
        for i, b in bias:
            logits[i] = -np.inf if b <= -100 else logits[i] + b
        history = list(prompt) + list(gen[:t])
        window = history if last_n < 0 else history[max(0, len(history) - last_n):] if last_n else []
        if rep != 1.0:
            for i in set(window):
                logits[i] = logits[i] / rep if logits[i] > 0 else logits[i] * rep
        counts = {}
        for i in gen[:t]:
            counts[i] = counts.get(i, 0) + 1
        for i, c in counts.items():
            logits[i] -= c * freq + pres
        want.append(int(np.argmax(logits)))
    return want


def test_bias_minus_100_bans_the_greedy_id(tiny_engine):
    base = _greedy(tiny_engine, "b0", PROMPT, Sampling(), steps=1)
    banned = _greedy(tiny_engine, "b1", PROMPT, Sampling(logit_bias={base[0]: -100}))
    assert base[0] not in banned
    assert banned == _reference(tiny_engine, PROMPT, banned, bias=((base[0], -100),))


def test_positive_bias_repeats_an_id_and_matches_the_formula(tiny_engine):
    x = 4000
    gen = _greedy(tiny_engine, "b2", PROMPT, Sampling(logit_bias={x: 50}))
    assert gen == [x] * STEPS


def test_frequency_penalty_breaks_the_run_exactly_as_the_formula_says(tiny_engine):
    x = 4000
    plain = _greedy(tiny_engine, "f0", PROMPT, Sampling(logit_bias={x: 12}))
    assert plain == [x] * STEPS
    gen = _greedy(tiny_engine, "f1", PROMPT, Sampling(logit_bias={x: 12}, frequency_penalty=2.0))
    assert gen != plain and gen[0] == x
    assert gen == _reference(tiny_engine, PROMPT, gen, bias=((x, 12),), freq=2.0)


def test_presence_penalty_is_paid_once_per_id(tiny_engine):
    x = 4000
    gen = _greedy(tiny_engine, "p1", PROMPT, Sampling(logit_bias={x: 12}, presence_penalty=2.0))
    assert gen == [x] * STEPS  # -2 once does not beat a +12 bias
    near = _greedy(tiny_engine, "p2", PROMPT, Sampling(logit_bias={x: 12}, presence_penalty=2.0,
                                                        frequency_penalty=0.5))
    assert near == _reference(tiny_engine, PROMPT, near, bias=((x, 12),), pres=2.0, freq=0.5)


@pytest.mark.parametrize("last_n", [64, -1, 3, 0])
def test_repetition_penalty_over_its_window(tiny_engine, last_n):
    x = 4000
    prompt = PROMPT[:6] + [x] + PROMPT[6:]  # x sits 6 ids before the prompt's end
    gen = _greedy(tiny_engine, f"r{last_n}", prompt, Sampling(logit_bias={x: 20}, repetition_penalty=10.0,
                                                              penalty_last_n=last_n))
    assert gen == _reference(tiny_engine, prompt, gen, bias=((x, 20),), rep=10.0, last_n=last_n)
    if last_n in (64, -1):
        assert x not in gen  # (logit + 20) / 10 loses to the rest
    else:  # outside the window (3) or off (0): x first; with a window it is penalised while inside it
        assert gen[0] == x
        assert (gen[1] != x) if last_n == 3 else gen == [x] * STEPS


def test_min_p_near_one_at_temperature_one_is_greedy(tiny_engine):
    greedy = _greedy(tiny_engine, "m0", PROMPT, Sampling())
    for seed in (1, 2, 3):
        assert _greedy(tiny_engine, "m1", PROMPT, Sampling(temperature=1.0, min_p=0.999, seed=seed)) == greedy
    assert _greedy(tiny_engine, "m2", PROMPT, Sampling(temperature=1.0, seed=1)) != greedy


def test_modifiers_leave_the_session_logits_and_logprobs_raw(tiny_engine):
    s = tiny_engine.session("raw")
    s.reset()
    r = s.generate(PROMPT, max_new_tokens=2, logprobs=0, sampling=Sampling(logit_bias={4000: 50})).result
    full = tiny_engine.forward(PROMPT + r.gen_ids)
    np.testing.assert_array_equal(s.last_logits(), full[-1])
    lse = np.log(np.sum(np.exp(full[len(PROMPT) - 1].astype(np.float64))))
    assert r.logprobs[0].logprob == pytest.approx(full[len(PROMPT) - 1][4000] - lse, abs=1e-4)


@pytest.mark.parametrize("kwargs,match", [
    (dict(repetition_penalty=0.0), "repetition_penalty"), (dict(penalty_last_n=-2), "penalty_last_n"),
    (dict(frequency_penalty=float("inf")), "frequency_penalty"), (dict(logit_bias={1: float("nan")}), "NaN")])
def test_bad_modifiers_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Sampling(**kwargs)


def test_bias_id_out_of_the_vocabulary_raises_before_work(tiny_engine):
    s = tiny_engine.session("oob")
    s.reset()
    with pytest.raises(ValueError, match="logit_bias"):
        s.generate(PROMPT, max_new_tokens=1, sampling=Sampling(logit_bias={10**7: 1.0}))
    assert s.held_ids == []
