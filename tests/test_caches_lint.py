"""Lint rules: each fires on a trace built to break the prefix its way, and stays quiet on the same trace
without that flaw; --fix moves content (never deletes it) and the replay measures before/after."""
import json
import os

import pytest

from strata_lab import ChatTemplate
from strata_lab.caches import fix_calls, lint_calls, replay_engines
from strata_lab.caches.calls import Call, as_ids

AGENT = os.path.join(os.path.dirname(__file__), "..", "dumps", "agent.jsonl")
TOOL = {"type": "function", "function": {"name": "read_file", "description": "Read a file of the repository",
                                         "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                                                        "required": ["path"]}}}


def _reordered(tool):
    f = tool["function"]
    return {"function": {"parameters": f["parameters"], "name": f["name"], "description": f["description"]},
            "type": "function"}


def write_sessions(path, tok, *, systems, turns=4, tools=None, tools_by_turn=None):
    """One session per system prompt template ({t}: the turn), the whole history sent every turn."""
    tmpl = ChatTemplate.from_name("qwen3")
    ts = 0.0
    with open(path, "w") as f:
        for s, system in enumerate(systems):
            msgs = []
            for t in range(turns):
                msgs.append({"role": "user", "content": f"question {t}: what does file_{t}.py do? " * 20})
                tl = tools_by_turn(t) if tools_by_turn else tools
                text = tmpl.render([{"role": "system", "content": system.format(t=t)}] + msgs, tools=tl,
                                   enable_thinking=False)
                reply = f"It parses the config number {t} and writes the report."
                gen = tok.encode(reply) + [tok.im_end_id]
                f.write(json.dumps({"schema": "strata-dump/1", "session": f"s{s}", "ts": ts,
                                    "prompt_ids": tok.encode(text), "gen_ids": gen}) + "\n")
                msgs.append({"role": "assistant", "content": reply})
                ts += 1.0
    return path


def rules(findings):
    return {f.rule for f in findings}


def test_volatile_system_fires_and_the_fix_moves_it(qwen3, tmp_path):
    bad = write_sessions(tmp_path / "bad.jsonl", qwen3,
                         systems=["You are a coding agent.\nCurrent time: 2026-12-01T10:0{t}:17Z\nBe brief."])
    good = write_sessions(tmp_path / "good.jsonl", qwen3, systems=["You are a coding agent.\nBe brief."])
    found = lint_calls(bad, qwen3)
    assert "volatile_system" in rules(found) and "volatile_system" not in rules(lint_calls(good, qwen3))
    f = next(f for f in found if f.rule == "volatile_system")
    assert f.text == "Current time: 2026-12-01T10:01:17Z" and f.tokens["vllm"] > 0
    fixed = fix_calls(bad, tokenizer=qwen3)
    before = replay_engines(bad, ["vllm", "sglang"]).summary().set_index("engine")
    after = replay_engines(fixed, ["vllm", "sglang"]).summary().set_index("engine")
    assert (after["reused"] > 2 * before["reused"]).all()
    # moved, never deleted: every prompt keeps exactly its characters
    from strata_lab.caches.calls import calls_from_dump
    for c0, c1 in zip(calls_from_dump(bad), fixed):
        t0, t1 = qwen3.decode(c0.prompt.tolist()), qwen3.decode(c1.prompt.tolist())
        assert sorted(t0) == sorted(t1) and "Current time" in t1[t1.rfind("<|im_start|>user"):]
    assert "volatile_system" not in rules(lint_calls(fixed, qwen3, price=False))


def test_per_user_early_fires_across_sessions(qwen3, tmp_path):
    bad = write_sessions(tmp_path / "bad.jsonl", qwen3, turns=2,
                         systems=["You are helpful.\nThe user is Alice, plan pro.\nAnswer briefly.",
                                  "You are helpful.\nThe user is Bob, plan free.\nAnswer briefly."])
    good = write_sessions(tmp_path / "good.jsonl", qwen3, turns=2,
                          systems=["You are helpful.\nAnswer briefly.", "You are helpful.\nAnswer briefly."])
    assert "per_user_early" in rules(lint_calls(bad, qwen3))
    assert "per_user_early" not in rules(lint_calls(good, qwen3))
    fixed = fix_calls(bad, tokenizer=qwen3)
    # after the fix both sessions share the whole system message: the second session's first call hits
    b = replay_engines(bad, ["sglang"]).frame()
    a = replay_engines(fixed, ["sglang"]).frame()
    assert a[a["session"] == "s1"]["reused"].iloc[0] > b[b["session"] == "s1"]["reused"].iloc[0] + 20


def test_tool_schema_order_fires_when_only_key_order_changes(qwen3, tmp_path):
    bad = write_sessions(tmp_path / "bad.jsonl", qwen3, systems=["You are a coding agent."],
                         tools_by_turn=lambda t: [TOOL if t % 2 == 0 else _reordered(TOOL)])
    good = write_sessions(tmp_path / "good.jsonl", qwen3, systems=["You are a coding agent."], tools=[TOOL])
    assert "tool_schema_order" in rules(lint_calls(bad, qwen3))
    assert "tool_schema_order" not in rules(lint_calls(good, qwen3))
    fixed = fix_calls(bad, tokenizer=qwen3)
    assert "tool_schema_order" not in rules(lint_calls(fixed, qwen3, price=False))
    assert replay_engines(fixed, ["vllm"]).summary()["reused"][0] > replay_engines(bad, ["vllm"]).summary()["reused"][0]


def test_reasoning_stripped_on_the_shipped_agent_dump(qwen3, tmp_path):
    assert "reasoning_stripped" in rules(lint_calls(AGENT, qwen3))
    # append-only: each prompt is the previous prompt + the reply as generated + the next user turn
    held = qwen3.encode("<|im_start|>system\nYou are a coding agent.<|im_end|>\n")
    with open(tmp_path / "good.jsonl", "w") as f:
        for t in range(3):
            prompt = held + qwen3.encode(f"<|im_start|>user\nquestion {t}<|im_end|>\n<|im_start|>assistant\n")
            gen = qwen3.encode(f"<think>\nstep {t}\n</think>\n\nanswer {t}") + [qwen3.im_end_id]
            f.write(json.dumps({"session": "s", "prompt_ids": prompt, "gen_ids": gen}) + "\n")
            held = prompt + gen + qwen3.encode("\n")
    assert "reasoning_stripped" not in rules(lint_calls(tmp_path / "good.jsonl", qwen3))


def _anthropic_calls(gap_blocks):
    """Two calls: the first writes a breakpoint at 500; the second's only breakpoint is gap_blocks content
    blocks (of 100 ids) later."""
    ids = list(range(5000, 5000 + 500 + gap_blocks * 100))
    blocks = tuple(range(100, len(ids) + 1, 100))
    return [Call(0, "a", as_ids(ids[:500]), ts=0.0, breakpoints=(500,), content_blocks=blocks[:5]),
            Call(1, "a", as_ids(ids), ts=1.0, breakpoints=(len(ids),), content_blocks=blocks)]


def test_breakpoint_lookback_fires_past_20_blocks_and_the_fix_adds_one(qwen3):
    far, near = _anthropic_calls(25), _anthropic_calls(10)
    assert "breakpoint_lookback" in rules(lint_calls(far, qwen3, engines=["anthropic:min_tokens=100"]))
    assert "breakpoint_lookback" not in rules(lint_calls(near, qwen3, engines=["anthropic:min_tokens=100"]))
    fixed = fix_calls(far, tokenizer=qwen3)
    assert len(fixed[1].breakpoints) == 2
    spec = ["anthropic:min_tokens=100"]
    assert replay_engines(far, spec).frame()["reused"].tolist() == [0, 0]
    assert replay_engines(fixed, spec).frame()["reused"].tolist() == [0, 500]


def test_prefix_mid_block_and_below_minimum(qwen3):
    def two(shared):
        return [Call(0, "a", as_ids(list(range(shared)) + [1, 2])), Call(1, "b", as_ids(list(range(shared)) + [3]))]

    f = lint_calls(two(37), qwen3, price=False)
    assert [x.tokens for x in f if x.rule == "prefix_mid_block"] == [{"vllm": 5}, {"trtllm": 5}]
    assert "prefix_mid_block" not in rules(lint_calls(two(64), qwen3, price=False))
    small = [Call(0, "a", as_ids(range(300))), Call(1, "a", as_ids(range(400)))]
    big = [Call(0, "a", as_ids(range(1300))), Call(1, "a", as_ids(range(1400)))]
    assert "below_minimum" in rules(lint_calls(small, qwen3, price=False))
    assert "below_minimum" not in rules(lint_calls(big, qwen3, price=False))
