"""Lint rules: each fires on a trace built to break the prefix its way, and stays quiet on the same trace
without that flaw; --fix moves content (never deletes it) and the replay measures before/after."""
import json
import os

import pytest

from strata_lab import ChatTemplate
from strata_lab.caches import fix_calls, lint_calls, replay_engines
from strata_lab.caches.call_ids import Call, as_ids

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
    from strata_lab.caches.call_ids import calls_from_dump
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

    f = lint_calls(two(37), qwen3, price=False, engines=["vllm", "trtllm"])
    assert [x.tokens for x in f if x.rule == "prefix_mid_block"] == [{"vllm": 5}, {"trtllm": 5}]
    assert "prefix_mid_block" not in rules(lint_calls(two(64), qwen3, price=False, engines=["vllm", "trtllm"]))
    # priced with the spec given (block 64 leaves 37 ids, not 37 % 16), and only on the engines asked for
    f = lint_calls(two(100), qwen3, price=False, engines=["vllm:block_size=64", "sglang"])
    assert [x.tokens for x in f if x.rule == "prefix_mid_block"] == [{"vllm:block_size=64": 36}]
    small = [Call(0, "a", as_ids(range(300))), Call(1, "a", as_ids(range(400)))]
    big = [Call(0, "a", as_ids(range(1300))), Call(1, "a", as_ids(range(1400)))]
    assert "below_minimum" in rules(lint_calls(small, qwen3, price=False))
    assert "below_minimum" not in rules(lint_calls(big, qwen3, price=False))


def _two_sessions(path, tok):
    """s0: a timestamp in the system message (a volatile_system finding); s1: a stable system message whose
    lines must never move (the `# Tools` header the old fix moved in every session)."""
    tmpl = ChatTemplate.from_name("qwen3")
    systems = {"s0": "You are a coding agent.\nCurrent time: 2026-12-01T10:0{t}:17Z\nBe brief.",
               "s1": "You are a coding agent.\n# Tools\nBe brief."}
    with open(path, "w") as f:
        for sid, system in systems.items():
            msgs = []
            for t in range(4):
                msgs.append({"role": "user", "content": f"question {t}: what does file_{t}.py do? " * 20})
                text = tmpl.render([{"role": "system", "content": system.format(t=t)}] + msgs, enable_thinking=False)
                reply = f"It parses the config number {t} and writes the report."
                f.write(json.dumps({"session": sid, "prompt_ids": tok.encode(text),
                                    "gen_ids": tok.encode(reply) + [tok.im_end_id]}) + "\n")
                msgs.append({"role": "assistant", "content": reply})
    return path


def test_fix_changes_only_the_sessions_a_finding_names(qwen3, tmp_path):
    from strata_lab.caches.call_ids import calls_from_dump

    path = _two_sessions(tmp_path / "two.jsonl", qwen3)
    found = lint_calls(path, qwen3, price=False)
    assert {f.session for f in found if f.rule == "volatile_system"} == {"s0"}
    volatile = [f for f in found if f.rule == "volatile_system"]
    fixed = fix_calls(path, volatile, tokenizer=qwen3)
    for c0, c1 in zip(calls_from_dump(path), fixed):
        if c0.session == "s1":
            assert c1.prompt.tolist() == c0.prompt.tolist()      # untouched, byte for byte
        else:
            assert c1.prompt.tolist() != c0.prompt.tolist()
    # with every finding: only sessions some finding names (or compares with) change
    named = {f.session for f in found} | {f.other for f in found if f.other}
    for c0, c1 in zip(calls_from_dump(path), fix_calls(path, found, tokenizer=qwen3)):
        assert c0.session in named or c1.prompt.tolist() == c0.prompt.tolist()


def test_check_fixes_keeps_a_fix_only_where_no_session_gets_worse(qwen3, tmp_path):
    from strata_lab.caches.lint import _session_read, check_fixes

    path = _two_sessions(tmp_path / "two.jsonl", qwen3)
    asked = ["vllm:block_size=64", "sglang"]
    found = lint_calls(path, qwen3, engines=asked)
    fixed, decisions = check_fixes(path, found, qwen3, engines=asked, shown=())   # judged and shown: those asked
    kept = [d for d in decisions if d["rule"] == "volatile_system" and d["kept"]]
    assert kept and set(kept[0]["per_engine"]) == set(asked) and all(e["asked"] for e in kept[0]["per_engine"].values())
    before, after = _session_read(path, asked), _session_read(fixed, asked)
    assert all(after[k] <= v for k, v in before.items())            # nobody worse on the engines asked for
    assert sum(after.values()) < sum(before.values())
    # engines not asked for are replayed beside them, marked, and never decide
    _, shown = check_fixes(path, found, qwen3, engines=["sglang"], shown=("llama.cpp",))
    per = next(d for d in shown if d["kept"])["per_engine"]
    assert per["sglang"]["asked"] and not per["llama.cpp"]["asked"]
    assert per["sglang"]["read_after"] < per["sglang"]["read_before"]


def test_check_fixes_drops_a_fix_that_makes_a_session_worse(qwen3, tmp_path):
    """Moving a user's line out of the system message lets the second session share the first one's prefix
    (459 -> 84 ids read on SGLang) but costs the first session its within-session reuse (467 -> 538): the
    fix is dropped, and the trace stays as it was."""
    from strata_lab.caches.call_ids import calls_from_dump
    from strata_lab.caches.lint import _session_read, check_fixes

    tmpl = ChatTemplate.from_name("qwen3")
    path = tmp_path / "users.jsonl"
    with open(path, "w") as f:
        for sid, name in (("s0", "Alice, plan pro"), ("s1", "Bob, plan free")):
            msgs = []
            for t in range(6):
                msgs.append({"role": "user", "content": f"q{t}"})
                text = tmpl.render([{"role": "system", "content": f"Hi.\nThe user is {name}.\nBe brief."}] + msgs,
                                   enable_thinking=False)
                reply = f"Answer {t}: " + "the configuration parser reads every file and writes a report. " * 6
                f.write(json.dumps({"session": sid, "prompt_ids": qwen3.encode(text),
                                    "gen_ids": qwen3.encode(reply) + [qwen3.im_end_id]}) + "\n")
                msgs.append({"role": "assistant", "content": reply})
    found = lint_calls(path, qwen3, engines=["sglang"])
    assert "per_user_early" in rules(found)
    alone = _session_read(fix_calls(path, found, tokenizer=qwen3), ["sglang"])
    before = _session_read(path, ["sglang"])
    assert alone[("sglang", "s1")] < before[("sglang", "s1")] and alone[("sglang", "s0")] > before[("sglang", "s0")]
    fixed, decisions = check_fixes(path, found, qwen3, engines=["sglang"])
    assert [(d["rule"], d["kept"]) for d in decisions] == [("per_user_early", False)]
    assert "s0" in decisions[0]["why"] and "read more" in decisions[0]["why"]
    assert [c.prompt.tolist() for c in fixed] == [c.prompt.tolist() for c in calls_from_dump(path)]


def test_lint_cli_fix_reports_per_engine_and_session_or_nothing_to_fix(qwen3, tmp_path, capsys):
    from strata_lab.cli import main

    out = tmp_path / "fixed.jsonl"
    assert main(["lint", AGENT, "--fix", str(out), "-q"]) == 0
    text = capsys.readouterr().out
    assert "nothing to fix" in text and not out.exists()
    path = _two_sessions(tmp_path / "two.jsonl", qwen3)
    assert main(["lint", str(path), "--engine", "vllm:block_size=64", "--fix", str(out), "-q"]) == 0
    text = capsys.readouterr().out
    assert "volatile_system" in text and ("kept:" in text or "dropped:" in text)
    if "kept:" in text:
        assert out.exists() and "per engine:" in text and "per session (ids read):" in text and "s1" in text
        assert oct(os.stat(out).st_mode & 0o777) == "0o600"
    else:
        assert "nothing to fix" in text and not out.exists()
