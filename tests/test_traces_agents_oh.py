"""Agent trace readers (issue 48): OpenHands V0 trajectories, OpenHands evaluation output (V1 SDK events),
LangSmith run exports and OpenAI Responses request logs: detection, calls and sessions, prompts as chat
messages, reported usage against the file's own totals, and one CLI import end to end."""
import json
import warnings
from pathlib import Path

import pytest

from strata_lab import load_trace
from strata_lab.traces import TraceWarning

FIX = Path(__file__).parent / "fixtures" / "traces"


def read(name, **kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trace = load_trace(FIX / name, **kw)
        calls = trace.calls()
    return trace, calls, [str(w.message) for w in caught if issubclass(w.category, TraceWarning)]


def near(total, expected):
    assert expected > 0 and abs(total - expected) <= 0.02 * expected, (total, expected)


def test_openhands_v0_trajectory():
    trace, calls, warned = read("openhands-trajectory.json")
    assert trace.detected[str(FIX / "openhands-trajectory.json")][0] == "openhands"
    assert len(calls) == 4 and {c["session"] for c in calls} == {"openhands-trajectory"}
    assert len(warned) == 1 and ":118: skipped: not an OpenHands event" in warned[0]
    first, second, text_only, finish = calls
    # one call for the two actions of response chatcmpl-a1 (parallel tool calls)
    assert first["request_id"] == "chatcmpl-a1" and len(first["response_tool_calls"]) == 2
    assert first["messages"][0]["role"] == "system" and "careful coding agent" in first["messages"][0]["content"]
    assert [t["function"]["name"] for t in first["tools"]] == ["execute_bash", "str_replace_editor", "finish"]
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "tool", "tool"]
    assert second["messages"][2]["tool_calls"][1]["function"]["name"] == "str_replace_editor"
    assert second["messages"][3] == {"role": "tool", "tool_call_id": "call_1", "content": "calc.py  test_calc.py"}
    assert second["cached_tokens"] == 1152 and second["model"] == "litellm_proxy/example-model"
    # the text-only reply: usage from the change in accumulated_token_usage
    assert text_only["response_text"].startswith("I changed") and text_only["prompt_tokens"] == 1800
    assert "usage from the change in accumulated_token_usage" in text_only["notes"]
    assert finish["messages"][-1] == {"role": "user", "content": "Thanks, please wrap up."}
    assert all(c["fidelity"] == "messages" and c["prompt_text"] is None for c in calls)
    # reported usage sums to the file's own accumulated_token_usage
    events = json.loads((FIX / "openhands-trajectory.json").read_text())
    total = [e for e in events if "llm_metrics" in e][-1]["llm_metrics"]["accumulated_token_usage"]
    near(sum(c["prompt_tokens"] for c in calls), total["prompt_tokens"])
    near(sum(c["completion_tokens"] for c in calls), total["completion_tokens"])
    near(sum(c["cached_tokens"] for c in calls), total["cache_read_tokens"])


def test_openhands_v1_evaluation_output():
    _, calls, warned = read("openhands-eval-output.jsonl")
    assert len(warned) == 1 and ":2: skipped: not valid JSON" in warned[0]
    assert [c["session"] for c in calls] == ["demo__io-101", "demo__io-101", "demo__cli-7", "demo__cli-7"]
    a1, a2, b1, b2 = calls
    assert a1["messages"][0]["content"] == "You are OpenHands agent, a helpful assistant." \
        "Working directory: /workspace/repo"
    assert [t["function"]["name"] for t in a1["tools"]] == ["terminal", "finish"]
    assert "tool parameter schemas not in the file" in a1["notes"]
    assert [tc["function"]["arguments"] for tc in a1["response_tool_calls"]] == \
        ['{"command": "pytest -q tests/test_io.py"}', '{"command": "ls src"}']
    assert [m["role"] for m in a2["messages"]] == ["system", "user", "assistant", "tool", "tool"]
    assert a2["messages"][4] == {"role": "tool", "tool_call_id": "tc-2", "content": "io.py  __init__.py"}
    assert a2["cached_tokens"] == 2048 and a2["model"] == "litellm_proxy/example-model"
    # the condensation forgot the first action and its output; its summary takes their place
    assert b2["messages"][2] == {"role": "user", "content": "The parser is built in src/cli.py line 12."}
    assert len(b2["messages"]) == 3 and b2["response_reasoning"] == "The request is ambiguous about timings."
    for n, line in enumerate((FIX / "openhands-eval-output.jsonl").read_text().splitlines()):
        if n == 1:
            continue
        rec = json.loads(line)
        mine = [c for c in calls if c["session"] == rec["instance_id"]]
        total = rec["metrics"]["accumulated_token_usage"]
        near(sum(c["prompt_tokens"] for c in mine), total["prompt_tokens"])
        near(sum(c["completion_tokens"] for c in mine), total["completion_tokens"])


def test_langsmith_runs_lines_and_array(tmp_path):
    trace, calls, warned = read("langsmith-runs.jsonl")
    path = str(FIX / "langsmith-runs.jsonl")
    assert len(warned) == 1 and ":6: skipped: llm run" in warned[0]
    assert [c["session"] for c in calls] == ["thread-7", "thread-7", "1f0a4b2c-0000-4000-8000-000000000002"]
    first, second, wrapped = calls
    assert first["messages"] == [{"role": "system", "content": "You answer questions about the weather."},
                                 {"role": "user", "content": "Is it raining in Oslo?"}]
    assert first["response_tool_calls"] == [{"type": "function", "id": "toolu_1",
                                             "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]
    assert first["cache_creation_tokens"] == 380 and first["tools"][0]["function"]["name"] == "get_weather"
    assert second["messages"][3] == {"role": "tool", "content": "Light rain, 9 C.", "tool_call_id": "toolu_1"}
    assert second["cached_tokens"] == 380 and second["response_text"] == "Yes, light rain at 9 C."
    assert wrapped["response_text"] == "11" and wrapped["prompt_tokens"] == 24
    assert any("1 chain, 1 tool" in f for f in trace.stats[path]["facts"])
    runs = [json.loads(x) for x in (FIX / "langsmith-runs.jsonl").read_text().splitlines()]
    expect = sum(r.get("prompt_tokens") or 0 for r in runs) + sum(
        g[0]["message"]["kwargs"]["usage_metadata"]["input_tokens"]
        for r in runs if r["run_type"] == "llm" and r.get("outputs") and "generations" in r["outputs"]
        for g in r["outputs"]["generations"])
    near(sum(c["prompt_tokens"] for c in calls), expect)
    # the same runs as one JSON array (client.list_runs dumped)
    arr = tmp_path / "runs.json"
    arr.write_text(json.dumps(runs, indent=1))
    trace2, calls2, _ = read(arr)
    assert trace2.detected[str(arr)][0] == "langsmith"
    assert [c["messages"] for c in calls2] == [c["messages"] for c in calls]


def test_openai_responses_log():
    _, calls, warned = read("openai-responses.jsonl")
    assert len(warned) == 1 and ":4: skipped: error response" in warned[0]
    first, second, bare = calls
    assert first["system"].startswith("You are a code review assistant")
    assert first["response_reasoning"] == "Need to read setup.py."
    assert first["response_tool_calls"][0]["function"] == {"name": "read_file", "arguments": '{"path": "setup.py"}'}
    assert [t["function"]["name"] for t in first["tools"]] == ["read_file"]
    assert "hosted tools (not rendered)" in first["notes"]
    # previous_response_id: the earlier turn, its output and the new item
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "tool"]
    assert second["messages"][1]["tool_calls"][0]["id"] == "call_r1"
    assert second["session"] == first["session"] != bare["session"]
    assert second["cached_tokens"] == 256 and second["request_id"] == "resp_02"
    assert bare["messages"] == [{"role": "system", "content": "Answer in one word."},
                                {"role": "user", "content": "Capital of Peru?"},
                                {"role": "assistant", "content": "Lima"},
                                {"role": "user", "content": "And of Chile?"}]
    assert bare["prompt_tokens"] is None
    usage = [json.loads(x).get("response") for x in (FIX / "openai-responses.jsonl").read_text().splitlines()]
    near(sum(c["prompt_tokens"] or 0 for c in calls), sum((u or {}).get("usage", {}) and u["usage"]["input_tokens"]
                                                          for u in usage if u and u.get("usage")))


def test_responses_missing_previous_response_is_noted(tmp_path):
    log = tmp_path / "r.jsonl"
    log.write_text(json.dumps({"model": "m", "previous_response_id": "resp_gone",
                               "input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}) + "\n")
    _, calls, _ = read(log)
    assert "previous_response_id not in the log: the earlier turns are missing" in calls[0]["notes"]


@pytest.mark.parametrize("name", ["openhands-trajectory.json", "langsmith-runs.jsonl"])
def test_cli_import_end_to_end(tmp_path, capsys, name):
    from strata_lab.cli import main

    out = tmp_path / "x.jsonl"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)
        assert main(["import", str(FIX / name), "--tokenizer", "qwen3", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    lines = [json.loads(x) for x in out.read_text().splitlines() if x.strip()]
    n = 4 if name.startswith("openhands") else 3
    assert f"{n} calls" in text and len([x for x in lines if "prompt_ids" in x]) == n
    assert all(x["prompt_ids"] for x in lines if "prompt_ids" in x)
