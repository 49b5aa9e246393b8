"""Agent trajectories: SWE-agent ``.traj`` (0.x and 1.1+), mini-swe-agent ``.traj.json`` (1.x and 2.x) and aider's
``--llm-history-file``, on the fixtures in tests/fixtures/traces/ (their layouts: that folder's README)."""
import json
import warnings
from pathlib import Path

import pytest

from strata_lab import load_trace
from strata_lab.traces import TraceWarning
from strata_lab.traces.registry import detect_format
from strata_lab.traces.source import Source

FIX = Path(__file__).parent / "fixtures" / "traces"
pytestmark = pytest.mark.filterwarnings("ignore::strata_lab.traces.source.TraceWarning")

# fixture -> (format, calls, sessions)
SHAPES = {
    "swe-agent-1.1.traj": ("swe-agent", 4, {"acme__pager-12"}),
    "swe-agent-0.7.traj": ("swe-agent", 3, {"swe-agent-0.7"}),
    "mini-swe-agent.traj.json": ("mini-swe-agent", 4, {"acme__pager-12"}),
    "mini-swe-agent-1.traj.json": ("mini-swe-agent", 3, {"acme__pager-7"}),
    "aider.llm.history": ("aider", 3, {"aider.llm"}),
}


def read(path, **kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trace = load_trace(path, **kw)
        calls = trace.calls()
    return trace, calls, [str(w.message) for w in caught if issubclass(w.category, TraceWarning)]


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_each_shape_reads_its_calls_as_messages(name):
    fmt, n_calls, sessions = SHAPES[name]
    trace, calls, warned = read(FIX / name)
    assert trace.detected[str(FIX / name)][0] == fmt and not warned
    assert len(calls) == n_calls and {c["session"] for c in calls} == sessions
    for c in calls:
        assert c["format"] == fmt and c["fidelity"] == "messages" and c["prompt_len"] is None
        assert c["messages"] and all(isinstance(m, dict) and m["role"] in ("system", "user", "assistant", "tool")
                                     for m in c["messages"])
        assert any(isinstance(m.get("content"), (str, list)) and m["content"] for m in c["messages"])
        assert c["notes"] is not None and c["response_text"] is not None


def _text(m):
    content = m.get("content")
    return content if isinstance(content, str) else "".join(p["text"] for p in content or ())


def test_swe_agent_1x_uses_each_steps_query_and_keeps_requeries():
    _, calls, _ = read(FIX / "swe-agent-1.1.traj")
    doc = json.loads((FIX / "swe-agent-1.1.traj").read_text())
    steps = doc["trajectory"]
    assert [len(c["messages"]) for c in calls] == [len(s["query"]) for s in steps]
    for c, s in zip(calls, steps):
        assert [_text(m) for m in c["messages"]] == [_text(m) for m in s["query"]]
        assert c["response_text"] == s["response"] and c["model"] == "claude-sonnet-4-20250514"
    first, requeried, fixed, submit = calls
    assert first["response_tool_calls"][0]["function"]["name"] == "bash" and first["response_tool_calls"][0]["id"] == "call_a1"
    assert requeried["response_tool_calls"] is None
    assert any("requeried reply" in n for n in requeried["notes"])
    # the requery's prompt holds the rejected reply and the format error; the history does not
    assert fixed["messages"][-2]["content"] == requeried["response_text"] and fixed["messages"][-1]["role"] == "user"
    assert submit["messages"][3] == {"role": "tool", "tool_call_id": "call_a1", "content": doc["history"][3]["content"]}
    assert submit["messages"][4]["tool_calls"][0]["function"]["name"] == "str_replace_editor"
    assert all("tool definitions not in the trajectory" in c["notes"] for c in calls)
    # totals only: the file's model_stats are a fact of the file, the calls carry no usage
    assert all(c["prompt_tokens"] is None for c in calls)
    stats = doc["info"]["model_stats"]
    assert len(calls) == stats["api_calls"]
    trace = load_trace(FIX / "swe-agent-1.1.traj")
    list(trace)
    (fact,) = trace.stats[str(FIX / "swe-agent-1.1.traj")]["facts"]
    assert f"tokens_sent {stats['tokens_sent']:,}" in fact and "api_calls 4" in fact


def test_swe_agent_0x_rebuilds_prompts_from_history_and_skips_demonstrations():
    _, calls, _ = read(FIX / "swe-agent-0.7.traj")
    doc = json.loads((FIX / "swe-agent-0.7.traj").read_text())
    history = doc["history"]
    replies = [h for h in history if h["role"] == "assistant"]
    assert [c["response_text"] for c in calls] == [h["content"] for h in replies]
    for c, h in zip(calls, replies):
        k = history.index(h)
        assert c["messages"] == [{"role": x["role"], "content": x["content"]} for x in history[:k]]
    assert calls[0]["messages"][1]["content"].startswith("Here is a demonstration")  # sent, not a call
    assert len(calls) == doc["info"]["model_stats"]["api_calls"]
    assert all(any("rebuilt from history" in n for n in c["notes"]) for c in calls)


def test_swe_agent_retry_attempts_are_sessions_and_0x_subroutines_apart(tmp_path):
    doc = json.loads((FIX / "swe-agent-1.1.traj").read_text())
    retry = {"attempts": [doc, doc], **doc}
    path = tmp_path / "acme__pager-12.traj"
    path.write_text(json.dumps(retry, indent=2))
    trace, calls, _ = read(path)
    assert trace.detected[str(path)][0] == "swe-agent"
    assert len(calls) == 8 and {c["session"] for c in calls} == {"acme__pager-12/attempt-0", "acme__pager-12/attempt-1"}
    assert len({c["source"] for c in calls}) == 8  # each call names its own step's line
    old = json.loads((FIX / "swe-agent-0.7.traj").read_text())
    old["history"] += [{"role": "system", "content": "You edit one file.", "agent": "edit"},
                       {"role": "user", "content": "Edit core.py", "agent": "edit"},
                       {"role": "assistant", "content": "done", "agent": "edit"}]
    path = tmp_path / "sub.traj"
    path.write_text(json.dumps(old, indent=2))
    _, calls, _ = read(path)
    assert calls[-1]["session"] == "sub/edit" and [m["role"] for m in calls[-1]["messages"]] == ["system", "user"]


def test_mini_swe_agent_usage_and_cost_match_the_files_totals():
    doc = json.loads((FIX / "mini-swe-agent.traj.json").read_text())
    _, calls, _ = read(FIX / "mini-swe-agent.traj.json")
    stats = doc["info"]["model_stats"]
    assert len(calls) == stats["api_calls"]
    assert sum(c["extra"]["cost"] for c in calls) == pytest.approx(stats["instance_cost"], rel=0.02)
    responses = [m["extra"]["response"] for m in doc["messages"] if "response" in m.get("extra", {})]
    assert sum(c["prompt_tokens"] for c in calls) == pytest.approx(
        sum(r["usage"]["prompt_tokens"] for r in responses), rel=0.02)
    assert [c["cached_tokens"] for c in calls] == [r["usage"]["prompt_tokens_details"]["cached_tokens"]
                                                   for r in responses]
    first, format_error, fix, submit = calls
    assert first["tools"][0]["function"]["name"] == "bash" and first["request_id"] == "chatcmpl-m1"
    assert first["response_tool_calls"][0]["id"] == "call_m1" and first["ts"] == 1750000001.5
    # a reply the agent could not parse lives only in the format error's extra.response
    assert format_error["response_text"].startswith("The floor division") and format_error["response_tool_calls"] is None
    assert any("format error" in n for n in format_error["notes"])
    assert fix["messages"][-1]["role"] == "user" and fix["messages"][-1]["content"].startswith("No tool calls")
    assert submit["messages"][-3:-1] == [fix["messages"][-1], {
        "role": "assistant", "content": "I will switch to ceiling division.", "tool_calls": fix["response_tool_calls"]}]
    assert all(m["role"] != "exit" for c in calls for m in c["messages"])


def test_mini_swe_agent_1x_reads_anthropic_style_cache_usage():
    doc = json.loads((FIX / "mini-swe-agent-1.traj.json").read_text())
    _, calls, _ = read(FIX / "mini-swe-agent-1.traj.json")
    usages = [m["extra"]["response"]["usage"] for m in doc["messages"] if m["role"] == "assistant"]
    assert len(calls) == doc["info"]["model_stats"]["api_calls"]
    assert sum(c["prompt_tokens"] for c in calls) == pytest.approx(sum(u["prompt_tokens"] for u in usages), rel=0.02)
    # call 2's usage has no prompt_tokens_details: cache_read_input_tokens gives the cached tokens
    assert [c["cached_tokens"] for c in calls] == [u["cache_read_input_tokens"] for u in usages]
    assert [c["cache_creation_tokens"] for c in calls] == [u["cache_creation_input_tokens"] for u in usages]
    assert calls[0]["tools"] is None and calls[0]["model"] == "claude-sonnet-4-20250514"
    assert calls[2]["messages"][2] == {"role": "assistant", "content": calls[0]["response_text"]}


def test_aider_sections_list_content_and_empty_reply(tmp_path):
    _, calls, _ = read(FIX / "aider.llm.history")
    first, second, third = calls
    assert [m["role"] for m in first["messages"]][:3] == ["system", "user", "assistant"]
    assert first["messages"][0]["content"] == ("Act as a careful software developer.\nMake every code change with a "
                                               "*SEARCH/REPLACE block*.\n\nReply in English.")
    assert first["response_text"] == ("The fix belongs in pager/core.py.\n\nPlease add it to the chat so I can edit "
                                      "it.")
    # --cache-prompts: list content, a text part's later lines unprefixed, cache_control noted
    assert second["messages"][0]["content"] == [{"type": "text", "text": first["messages"][0]["content"]}]
    assert second["messages"][3]["content"][0]["text"].endswith("for i in range(pages)]\n```")
    assert second["messages"][2] == {"role": "assistant", "content": first["response_text"]}
    assert "cache_control marks (not modelled)" in second["notes"]
    assert third["response_text"] == "" and third["ts"] - first["ts"] == 158  # TO LLM times, to the second
    bad = tmp_path / "h.txt"
    bad.write_text("TO LLM 2025-01-01T00:00:00\n-------\nUSER hi\n-------\n-------\nUSER again\n"
                   "LLM RESPONSE 2025-01-01T00:00:01\nASSISTANT yo\nLLM RESPONSE 2025-01-01T00:00:02\nASSISTANT x\n"
                   "TO LLM 2025-01-01T00:00:03\n-------\nUSER cut\n")
    trace, calls, warned = read(bad)
    assert trace.detected[str(bad)][0] == "aider" and len(calls) == 2
    assert [m["role"] for m in calls[0]["messages"]] == ["user", "assistant", "user"]
    assert any("alternation assumed" in n for n in calls[0]["notes"])
    assert calls[1]["response_text"] is None and any("no LLM RESPONSE" in n for n in calls[1]["notes"])
    assert len(warned) == 1 and f"{bad}:9: skipped: LLM RESPONSE without a TO LLM" in warned[0]


def test_detection_peeks_the_head_and_tail_only(tmp_path):
    doc = json.loads((FIX / "mini-swe-agent.traj.json").read_text())
    # a config past the first 64 KiB and no mini_version before it: the tail's trajectory_format tells
    doc["info"] = {"model_stats": doc["info"]["model_stats"], "config": {"agent": {"system_template": "x" * 70000}}}
    big = tmp_path / "big.traj.json"
    big.write_text(json.dumps(doc, indent=2))
    assert detect_format(Source(big))[0] == "mini-swe-agent"
    # one line (no indent): still a trajectory, not an OpenAI body with messages
    flat = tmp_path / "flat.traj.json"
    flat.write_text(json.dumps(json.loads((FIX / "mini-swe-agent.traj.json").read_text())))
    assert detect_format(Source(flat))[0] == "mini-swe-agent"
    flat = tmp_path / "flat.traj"
    flat.write_text(json.dumps(json.loads((FIX / "swe-agent-1.1.traj").read_text())))
    assert detect_format(Source(flat))[0] == "swe-agent"
    # an observation quoting a vLLM log line does not make the trajectory a vLLM log
    doc = json.loads((FIX / "swe-agent-0.7.traj").read_text())
    doc["history"][4]["content"] += "\nINFO Received request cmpl-1: prompt_token_ids: [1, 2]"
    quoted = tmp_path / "q.traj"
    quoted.write_text(json.dumps(doc, indent=2))
    assert detect_format(Source(quoted))[0] == "swe-agent"
    # OTel's console exporter (indented objects) is still OTel; a JSON object of another kind is no trajectory
    assert detect_format(Source(FIX / "otel-console.txt"))[0] == "otel"
    other = tmp_path / "o.json"
    other.write_text(json.dumps({"info": {"x": 1}, "messages": []}, indent=2))
    with pytest.raises(ValueError, match="format: cannot tell"):
        detect_format(Source(other))


def test_a_broken_trajectory_is_one_clear_warning(tmp_path):
    path = tmp_path / "cut.traj"
    path.write_text((FIX / "swe-agent-1.1.traj").read_text()[:3000])
    trace, calls, warned = read(path, format="swe-agent")
    assert calls == [] and len(warned) == 1 and str(path) in warned[0] and "skipped" in warned[0]


def test_cli_imports_a_trajectory(tmp_path, capsys):
    from strata_lab.cli import main

    out = tmp_path / "x.jsonl"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)
        assert main(["import", str(FIX / "mini-swe-agent.traj.json"), "--tokenizer", "qwen3", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "mini-swe-agent" in text and "4 calls" in text
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 4 and {r["session"] for r in records} == {"acme__pager-12"}
    assert [r["reported_prompt_tokens"] for r in records] == [412, 486, 531, 604]
    assert all(r["prompt_ids"] for r in records)


def test_doctests():
    import doctest
    import importlib

    for name in ("swe_agent", "mini_swe_agent", "aider"):
        mod = importlib.import_module(f"strata_lab.traces.{name}")
        assert doctest.testmod(mod).failed == 0, name


def test_mini_swe_agent_responses_api_objects(tmp_path):
    def response(rid, output, prompt, cached):
        return {"id": rid, "object": "response", "model": "gpt-5", "output": output,
                "usage": {"input_tokens": prompt, "output_tokens": 5, "input_tokens_details": {"cached_tokens": cached}},
                "extra": {"actions": [], "cost": 0.001, "timestamp": 1.0}}
    call = {"type": "function_call", "call_id": "c1", "name": "bash", "arguments": "{\"command\": \"ls\"}", "id": "fc_1"}
    done = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "done"}]}
    doc = {"info": {"model_stats": {"instance_cost": 0.002, "api_calls": 2}, "mini_version": "2.4.6"},
           "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "T"},
                        response("resp_1", [call], 100, 0),
                        {"type": "function_call_output", "call_id": "c1", "output": "a.py", "extra": {"returncode": 0}},
                        response("resp_2", [done], 130, 64)],
           "trajectory_format": "mini-swe-agent-1.1", "instance_id": "x-1"}
    path = tmp_path / "x-1.traj.json"
    path.write_text(json.dumps(doc, indent=2))
    _, calls, warned = read(path)
    assert not warned and len(calls) == 2 and calls[0]["response_tool_calls"][0]["id"] == "c1"
    assert [m["role"] for m in calls[1]["messages"]] == ["system", "user", "assistant", "tool"]
    assert calls[1]["messages"][2]["tool_calls"][0]["function"]["name"] == "bash"
    assert calls[1]["messages"][3] == {"role": "tool", "tool_call_id": "c1", "content": "a.py"}
    assert (calls[1]["response_text"], calls[1]["prompt_tokens"], calls[1]["cached_tokens"]) == ("done", 130, 64)
