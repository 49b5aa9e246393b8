import glob
import os

import pytest
from hypothesis import given, settings, strategies as st

import strata_lab as sl
from strata_lab.caches.sweeps import compare_policies
from strata_lab.dump.reader import load_dump
from strata_lab.replayer import parse_policy
from strata_lab.replayer.state import DEFAULT_SNAPSHOT_BYTES, SessionState, predict_reuse, snapshot_capacity
from strata_lab.replayer.divergence import find_divergence
from strata_lab.rules import CAUSES, CheckpointPolicy, checkpoint_spec, parse_checkpoint_policy

from replay_cases import CASES, case, write


def replay(path, *, tokenizer, model="hybrid", checkpoint_policy="turn", **kw):
    """Our engine (`strata`) on the one driver; the state model's own defaults (a hybrid model, a snapshot at
    each prompt's end) unless a test says otherwise."""
    cp = checkpoint_policy if isinstance(checkpoint_policy, str) else checkpoint_spec(checkpoint_policy)
    return sl.replay(path, "strata", tokenizer=tokenizer, kind=model, checkpoints=cp, **kw)


@pytest.mark.parametrize("name", CASES)
def test_each_cause_has_its_known_answer(qwen3, tmp_path, name):
    calls, want = case(qwen3, name)
    path = write(tmp_path / f"{name}.jsonl", calls)
    rep = replay(path, tokenizer=qwen3)
    row = rep.rows[1]
    assert row["cause"] == want["cause"], (row["cause"], row["text_context_held"], row["text_context_prompt"])
    assert row["reused"] == want["reused"]
    for key in ("reread", "lcp_ids", "lcp_text"):
        if key in want:
            assert row[key] == want[key], key
    assert row["read"] == row["prompt_len"] - row["reused"]
    assert rep["calls_differ"] == 0, "recorded reused in the hand-built dump equals the prediction"
    assert rep.rows[0]["cause"] == "new_session"


def test_retokenized_reply_context_and_attention(qwen3, tmp_path):
    calls, want = case(qwen3, "retokenized_reply")
    path = write(tmp_path / "r.jsonl", calls)
    row = replay(path, tokenizer=qwen3, model="attention").rows[1]
    assert row["reused"] == want["attention_reused"]
    # the ids part where the texts still agree: both sides read ' öğrenci' after the id divergence
    assert "The word' || ' öğrenci is Turkish." in row["id_context_held"]
    assert "The word' || ' öğrenci is Turkish." in row["id_context_prompt"]
    assert row["text_context_held"] == ""  # no text divergence inside what the session held
    assert row["lcp_text"] == row["held_before"]  # the whole reply's text matched
    # with snapshots inside replies the hybrid model gets closer to the divergence
    row = replay(path, tokenizer=qwen3, checkpoint_policy=CheckpointPolicy(every=2)).rows[1]
    assert want["reused"] < row["reused"] <= want["attention_reused"]


def test_full_hit_rule_is_a_parameter(qwen3, tmp_path):
    calls, _ = case(qwen3, "checkpoint")  # prompt = turn 1 + 3 ids of the reply, no snapshot there
    path = write(tmp_path / "c.jsonl", calls)
    n = len(calls[1]["prompt_ids"])
    row = replay(path, tokenizer=qwen3, full_hit="saved_logits", model="attention").rows[1]
    assert (row["cause"], row["reused"], row["reread"]) == ("none", n, 0)
    row = replay(path, tokenizer=qwen3, model="attention").rows[1]
    assert (row["cause"], row["reused"]) == ("none", n - 1)
    # a retry of the same prompt: the engine's rule reuses it all from the turn-start snapshot's logits
    calls, _ = case(qwen3, "retry")
    p1 = calls[0]["prompt_ids"]
    path = write(tmp_path / "r.jsonl", calls)
    for model in ("hybrid", "attention"):
        row = replay(path, tokenizer=qwen3, model=model).rows[1]
        assert (row["cause"], row["reused"], row["read"], row["reread"]) == ("none", len(p1), 0, 0)
    # the older rule (only the last held id's logits are kept): back to 0 on hybrid, one id on attention
    row = replay(path, tokenizer=qwen3, full_hit="last_held_only").rows[1]
    assert (row["cause"], row["reused"], row["reread"]) == ("no_state_checkpoint", 0, len(p1) - 1)
    assert replay(path, tokenizer=qwen3, model="attention", full_hit="last_held_only").rows[1]["reused"] == len(p1) - 1
    # no snapshots at all: nothing holds logits for position len(p1)
    assert replay(path, tokenizer=qwen3, checkpoint_policy="none").rows[1]["reused"] == 0
    # a prompt equal to held reuses everything (the last logits are kept)
    path = write(tmp_path / "same.jsonl", [dict(prompt_ids=p1, reused=0), dict(prompt_ids=p1, reused=len(p1))])
    assert replay(path, tokenizer=qwen3).rows[1]["reused"] == len(p1)
    assert replay(path, tokenizer=qwen3, full_hit="reread_last").rows[1]["cause"] == "no_state_checkpoint"


def test_template_rewrite_text_context(qwen3, tmp_path):
    path = write(tmp_path / "t.jsonl", case(qwen3, "template_rewrite")[0])
    row = replay(path, tokenizer=qwen3).rows[1]
    assert row["text_context_held"].endswith("|| '<think>\\nTwo plus two is four.\\n</think>\\n\\nThe answer is 4.<|im_end|>'") \
        or "|| '<think>" in row["text_context_held"]
    assert "|| 'The answer is 4." in row["text_context_prompt"]


def test_merged_newline_before_the_reply_is_not_a_retokenization(qwen3, tmp_path):
    calls, want = case(qwen3, "template_rewrite_newline")
    held = calls[0]["prompt_ids"] + calls[0]["gen_ids"]
    prompt = calls[1]["prompt_ids"]
    d = find_divergence(held, prompt, qwen3, lcp_ids=want["lcp_ids"])
    assert d.lcp_text == d.lcp_ids + 1 and not d.retokenized
    assert qwen3.decode(held[d.lcp_ids:d.lcp_ids + 2]) == "\n<think>" and qwen3.decode(prompt[d.lcp_ids:d.lcp_ids + 1]) == "\n\n\n"
    # a genuine retokenization realigns on a shared token boundary before the text parts
    calls, _ = case(qwen3, "retokenized_reply")
    held = calls[0]["prompt_ids"] + calls[0]["gen_ids"]
    lcp = len(calls[0]["prompt_ids"]) + 2
    assert find_divergence(held, calls[1]["prompt_ids"], qwen3, lcp_ids=lcp).retokenized
    # the same merge inside a user turn whose text changed is a history edit
    p1 = qwen3.encode("<|im_start|>user\nfoo\n<|im_end|>\n<|im_start|>assistant\n")
    p2 = qwen3.encode("<|im_start|>user\nfoo\n\n<|im_end|>\n<|im_start|>assistant\n")
    path = write(tmp_path / "h.jsonl", [dict(prompt_ids=p1, reused=0, gen_ids=qwen3.encode("Hi.<|im_end|>")),
                                        dict(prompt_ids=p2, reused=0)])
    row = replay(path, tokenizer=qwen3).rows[1]
    assert row["lcp_text"] > row["lcp_ids"] and row["cause"] == "history_edit"


def test_counterfactual_keep_drained(qwen3, tmp_path):
    calls, _ = case(qwen3, "drained_dropped")
    path = write(tmp_path / "d.jsonl", calls)
    rep = replay(path, tokenizer=qwen3, policy="keep-drained")
    row = rep.rows[1]
    held = len(calls[0]["prompt_ids"]) + len(calls[0]["gen_ids"]) + len(calls[0]["drained_ids"])
    assert (row["cause"], row["reused"], row["reread"]) == ("none", held, 0)
    assert row["reported"] is None  # prompts changed: the recorded count no longer applies


def test_policy_table_and_summary(qwen3, tmp_path):
    rows = []
    for i, name in enumerate(["retokenized_reply", "drained_dropped", "history_edit"]):
        for c in case(qwen3, name)[0]:
            rows.append(dict(c, session=f"s{i}"))
    path = write(tmp_path / "mix.jsonl", rows)
    table = compare_policies(path, ["recorded", "keep-drained", "every:4", "budget:144:4"], tokenizer=qwen3,
                             kind="hybrid", checkpoints="turn")
    assert list(table["policy"]) == ["recorded", "keep-drained", "every:4", "budget:144:4"]
    base, kept, every, budget = (table.iloc[i] for i in range(4))
    assert kept["reread"] < base["reread"] and every["reread"] < base["reread"]
    assert every["spec"].endswith("checkpoints=every:4,kind=hybrid") and "budget:144" in budget["spec"]
    with pytest.raises(ValueError, match="policies"):
        compare_policies(path, [], tokenizer=qwen3)
    rep = replay(path, tokenizer=qwen3)
    assert rep["causes"]["retokenized_reply"] == 1 and rep["causes"]["drained_dropped"] == 1
    # these synthetic times (1 ms + 10 us per id read) have a constant the cost model lacks: R^2 < 0.5,
    # so the summary prices tokens only and says why
    assert rep.poor_fit is not None and "too poorly to price seconds" in rep.headline()
    assert rep.headline().startswith(f"{rep['spec']}: {rep['reread']} of {rep['prompt_tokens']} prompt tokens")
    df = rep.to_frame()
    assert str(df["reused"].dtype) == "int64" and str(df["cause"].dtype) == "category"
    assert len(rep.sessions_frame()) == 3
    assert dict(rep)["calls"] == 6


def test_reply_ids_policy_uses_the_encoder(qwen3, tmp_path):
    pytest.importorskip("strata_lab.text.encoder")
    calls, _ = case(qwen3, "retokenized_reply")
    path = write(tmp_path / "r.jsonl", calls)
    row = replay(path, tokenizer=qwen3, policy="reply-ids").rows[1]
    assert row["cause"] == "none" and row["reused"] == row["held_before"]
    calls, _ = case(qwen3, "drained_dropped")
    path = write(tmp_path / "d.jsonl", calls)
    row = replay(path, tokenizer=qwen3, policy="fixes").rows[1]
    assert row["cause"] == "none" and row["reused"] == row["held_before"]


def _budget_request_dump(tok, path):
    """A thinking-budget request as strata_lab/server/generation.py runs it: call 0 stops at the budget and
    drains ' ],\n'; call 1 continues with prompt = first prompt + thought + kept drained + wrap-up ids (ids,
    not re-encoded: ' ],\n' + '\n\n' would BPE to ' ],' + '\n\n\n'). The model writes ' öğrenci' in two
    pieces in call 1. The next request re-sends the whole reply as text."""
    from strata_lab.server.generation import WRAP_UP

    enc = tok.encode
    p0 = enc("<|im_start|>user\nCount.<|im_end|>\n<|im_start|>assistant\n<think>\n")
    gen0, drained0 = enc("Counting letters"), enc(" ],\n")
    p1 = p0 + gen0 + drained0 + enc(WRAP_UP)
    gen1 = enc("The word") + [130947, 5855] + enc(" has one.") + [tok.im_end_id]
    text2 = tok.decode(p1 + gen1) + "\n<|im_start|>user\nMore.<|im_end|>\n<|im_start|>assistant\n"
    p2 = enc(text2)
    assert enc(tok.decode(p1))[:len(p1)] != p1  # re-encoding the wrap-up prompt would part from held
    return write(path, [dict(prompt_ids=p0, reused=0, gen_ids=gen0, drained_ids=drained0, finish="budget",
                             request_id="r1", call=0),
                        dict(prompt_ids=p1, reused=len(p0) + len(gen0) + len(drained0), gen_ids=gen1,
                             request_id="r1", call=1),
                        dict(prompt_ids=p2, reused=len(p0), request_id="r2")])  # BPE parts at ' ],\n'



def test_reply_ids_policy_models_the_wrap_up_call(qwen3, tmp_path):
    pytest.importorskip("strata_lab.text.encoder")
    path = _budget_request_dump(qwen3, tmp_path / "budget.jsonl")
    base = replay(path, tokenizer=qwen3)
    assert base["calls_differ"] == 0 and base.rows[2]["cause"] == "retokenized_reply"
    for policy in ("reply-ids", "fixes"):
        rep = replay(path, tokenizer=qwen3, policy=policy)
        r0, r1, r2 = rep.rows
        # the wrap-up call's prompt is built from ids, so it extends what the engine holds, as recorded
        assert (r1["cause"], r1["reused"], r1["prompt_len"]) == ("none", base.rows[1]["reused"],
                                                                base.rows[1]["prompt_len"]), policy
        # the server remembered the whole reply (thought + kept drained + wrap-up + answer) once, against the
        # first prompt: the next request keeps every held id
        assert (r2["cause"], r2["reused"], r2["reread"]) == ("none", r2["held_before"], 0), policy
        assert rep["reread"] < base["reread"]


def test_policy_specs_validate():
    assert parse_policy("fixes+budget:512").keep_drained
    assert snapshot_capacity(parse_checkpoint_policy("budget:144"), DEFAULT_SNAPSHOT_BYTES) == 2
    for bad in ("every:0", "every:x", "budget:-1", "wat"):
        with pytest.raises(ValueError):
            parse_policy(bad)
    with pytest.raises(ValueError, match="every must"):
        CheckpointPolicy(every=-1)
    with pytest.raises(ValueError, match="model"):
        SessionState(model="mamba")


def test_memory_budget_evicts_lru():
    s = SessionState(policy=CheckpointPolicy(budget_mib=2, every=10), bytes_per_snapshot=2**20)
    s.call(list(range(1, 31)))
    assert list(s.checkpoints) == [20, 30] and s.snapshot_bytes() == 2 * 2**20


# --- property test over random sessions -------------------------------------------------------------
_ids = st.lists(st.integers(min_value=1, max_value=40), min_size=0, max_size=12)


@st.composite
def sessions(draw):
    calls, held = [], []
    for _ in range(draw(st.integers(1, 6))):
        keep = draw(st.integers(0, len(held)))
        prompt = held[:keep] + draw(_ids)
        if not prompt:
            prompt = [draw(st.integers(1, 40))]
        gen, drained = draw(_ids), draw(st.lists(st.integers(1, 40), max_size=2))
        calls.append((prompt, gen, drained))
        held = prompt + gen + drained
    return calls


@settings(max_examples=60, deadline=None)
@given(sessions(), st.sampled_from([CheckpointPolicy(), CheckpointPolicy(every=3), CheckpointPolicy(at_prompt_end=False)]))
def test_random_sessions_obey_contract_1(qwen3, calls, policy):
    hyb = SessionState(model="hybrid", policy=policy)
    att = SessionState(model="attention", policy=policy)
    full = SessionState(model="hybrid", policy=CheckpointPolicy(every=1))  # a snapshot (with logits) at every position
    held = []
    for prompt, gen, drained in calls:
        att_ckpts = set(att.checkpoints)  # their snapshots keep the logits
        a, h, f = att.call(prompt), hyb.call(prompt), full.call(prompt)
        lcp = 0
        while lcp < min(len(prompt), len(held)) and prompt[lcp] == held[lcp]:
            lcp += 1
        full_hit = prompt == held or (lcp == len(prompt) and len(prompt) in att_ckpts)
        assert a.reused == (lcp if full_hit else min(lcp, len(prompt) - 1))
        assert h.reused <= a.reused and f.reused == lcp
        assert h.reused == a.reused or h.reused == 0 or h.reused in range(1, a.reused)
        assert all(c <= len(hyb.held) for c in hyb.checkpoints)
        d = find_divergence(held, prompt, qwen3, lcp_ids=lcp)
        hb, pb = qwen3.ids_bytes(held), qwen3.ids_bytes(prompt)
        assert d.lcp_text >= lcp
        assert pb.startswith(qwen3.ids_bytes(held[:d.lcp_text]))
        assert d.lcp_text == len(held) or not pb.startswith(qwen3.ids_bytes(held[:d.lcp_text + 1]))
        for s in (att, hyb, full):
            s.finish(gen, drained)
        held = prompt + gen + drained
        assert att.held == hyb.held == held


@settings(max_examples=15, deadline=None)
@given(sessions())
def test_random_dumps_replay_consistently(qwen3, tmp_path_factory, calls):
    path = tmp_path_factory.mktemp("prop") / "p.jsonl"
    write(path, [dict(prompt_ids=p, reused=predict_reuse(p, [], [], model="hybrid") if i == 0 else 0,
                      gen_ids=g, drained_ids=d) for i, (p, g, d) in enumerate(calls)])
    rep = replay(path, tokenizer=qwen3)
    for r in rep.rows:
        assert r["cause"] in CAUSES
        assert r["read"] + r["reused"] == r["prompt_len"]
        assert 0 <= r["reread"] <= r["held_before"]
        assert r["lcp_text"] >= r["lcp_ids"] >= r["reused"]
        assert r["cause"] != "none" or r["reread"] == 0


# --- dumps recorded from the engine (added when the engine lands) --------------------------------------
_RECORDED = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "dumps", "*.jsonl")))


@pytest.mark.parametrize("path", _RECORDED, ids=[os.path.basename(p) for p in _RECORDED])
def test_recorded_engine_dumps_match_prediction(qwen3, path):
    recs = load_dump(path).records()
    model = "attention" if any("attention" in str(r.get("model", "")) for r in recs) else "hybrid"
    rep = replay(path, tokenizer=qwen3, model=model, checkpoint_policy="recorded")
    assert rep["calls_differ"] == 0, [(r["session"], r["turn"], r["reported"], r["reused"])
                                      for r in rep.rows if r["reported"] != r["reused"]][:5]


def test_header_policy_on_the_shipped_agent_dump(qwen3):
    """`--policy header`: a snapshot before the generation prompt's <|im_start|> serves the template
    rewrite (the old reply's empty <think> block stripped) that sends the baseline back to 0."""
    path = os.path.join(os.path.dirname(__file__), "..", "dumps", "agent.jsonl")
    base = replay(path, tokenizer=qwen3, model="hybrid", checkpoint_policy="turn")
    hdr = replay(path, tokenizer=qwen3, model="hybrid", policy="header")
    assert hdr["reused"] > base["reused"] and hdr["reread"] < base["reread"]
    # every id the header snapshot serves is one not re-read; what stays re-read is the rewrite's own cost (the
    # held ids past the divergence that the prompt repeats: no snapshot can serve them)
    assert base["reread"] - hdr["reread"] == hdr["reused"] - base["reused"]
    tail = sum(r["reread"] - (r["lcp_text"] - r["lcp_ids"]) - (r["lcp_ids"] - r["reused"]) for r in hdr.rows
               if r["cause"] == "template_rewrite")
    assert tail > 0
    assert hdr["prompt_tokens"] == base["prompt_tokens"]
    worst = max(base.rows, key=lambda r: r["reread"])
    assert worst["cause"] == "template_rewrite" and worst["reused"] == 0
    assert next(r for r in hdr.rows if r["index"] == worst["index"])["reused"] > 0


@pytest.mark.parametrize("spec,want", [
    ("header", CheckpointPolicy(before_last=151644)), ("before-last:7", CheckpointPolicy(before_last=7)),
    ("every:64,header", CheckpointPolicy(every=64, before_last=151644)),
    ("budget:288,before-last:9", CheckpointPolicy(budget_mib=288, before_last=9)),
    ("none,header", CheckpointPolicy(at_prompt_end=False, before_last=151644))])
def test_parse_header_specs(spec, want):
    assert parse_policy(spec).checkpoint_policy == want


@pytest.mark.parametrize("spec", ["before-last:x", "before-last:-3", "every:4,before-last:"])
def test_bad_header_specs_raise(spec):
    with pytest.raises(ValueError, match="before_last|invalid literal"):
        parse_policy(spec)


def test_header_prediction_matches_state_model_rules():
    s = SessionState(policy=CheckpointPolicy(before_last=9))
    s.call([1, 9, 2, 9, 3])
    assert list(s.checkpoints) == [3, 5]
    s.finish([4, 5])
    assert s.call([1, 9, 2, 9, 3, 4, 5, 9, 6]).reused == 7  # extends held; the header at 7 is not read
    assert list(s.checkpoints) == [3, 5, 9]
    s.finish([])
    p = s.call([1, 9, 2, 9, 7, 9, 8])  # diverges after the first header: restores 3, snapshots 5
    assert (p.reused, p.restored_checkpoint, list(s.checkpoints)) == (3, 3, [3, 5, 7])


def test_one_snapshot_policy_type_and_wrong_types_raise(qwen3, tmp_path):
    """The engine's CheckpointPolicy is the replay's too; anything else is a TypeError, not a fallback."""
    calls, _ = case(qwen3, CASES[0])
    path = write(tmp_path / "d.jsonl", calls)
    every = replay(path, tokenizer=qwen3, checkpoint_policy=sl.CheckpointPolicy(every=2))
    assert every["spec"] == "strata@1:checkpoints=every:2,kind=hybrid"  # the policy was applied
    for bad in (object(), {"every": 2}, 256):
        with pytest.raises(TypeError, match="checkpoint policy spec"):
            sl.replay(path, tokenizer=qwen3, checkpoints=bad)
    with pytest.raises(TypeError, match="policy must"):
        SessionState(policy="every:4")


def test_replay_does_not_import_the_server():
    import subprocess
    import sys

    code = ("import sys, strata_lab.replayer, strata_lab.sessions; "
            "print(sorted(m for m in sys.modules if m.startswith('strata_lab.server')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_strata_lab_replay_is_the_function():
    import types

    from strata_lab.caches.replay import replay as public_replay

    # the public replay sits above the replayer (ours) and the engine cache models (engine="vllm")
    assert isinstance(sl.replay, types.FunctionType) and sl.replay is public_replay
