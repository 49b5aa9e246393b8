"""Agent and IDE trajectories: Gemini CLI recordings (JSONL and the older one-document JSON), Cline / Roo Code
task folders (history + ui_messages, joined), Claude Managed Agents session events; the Gemini dialect converter."""
import json
import shutil
import warnings
from pathlib import Path

import pytest

from strata_lab import load_trace
from strata_lab.traces import TraceWarning
from strata_lab.traces.gemini import convert_contents, convert_tools, system_text

FIX = Path(__file__).parent / "fixtures" / "traces"
CLINE = FIX / "cline-task"


def read(path, **kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trace = load_trace(path, **kw)
        calls = trace.calls()
    return trace, calls, [str(w.message) for w in caught if issubclass(w.category, TraceWarning)]


def within(ours, theirs, rel=0.02):
    return abs(ours - theirs) <= rel * max(theirs, 1)


def test_gemini_converter_dialect():
    notes = []
    msgs = convert_contents([
        {"role": "user", "parts": [{"text": "a"}, {"text": "b"}, {"fileData": {"fileUri": "gs://x"}}]},
        {"role": "model", "parts": [{"functionCall": {"name": "f", "args": {"x": 1}}}]},
        {"role": "function", "parts": [{"functionResponse": {"name": "f", "response": {"y": 2}}}]},
    ], notes)
    assert msgs[0]["content"][2] == {"type": "text", "text": "[image]"} and notes == ["image placeholder"]
    assert msgs[1]["tool_calls"][0]["id"] == "f" and msgs[2] == {"role": "tool", "tool_call_id": "f",
                                                                 "content": '{"y": 2}'}
    assert system_text("Be terse.") == "Be terse." and system_text(None) is None
    assert convert_tools([{"functionDeclarations": [{"name": "f", "parameters": {"type": "object"}}]},
                          {"googleSearch": {}}]) == [{"type": "function", "function": {
                              "name": "f", "parameters": {"type": "object"}}}]
    with pytest.raises(ValueError, match=r"contents\[0\]\.role"):
        convert_contents([{"role": "assistant", "parts": []}], [])


def _gemini_totals(path):
    """The file's own per-message token counts (the last copy of each message id)."""
    last = {}
    for line in Path(path).read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("type") == "gemini" and rec.get("tokens"):
            last[rec["id"]] = rec["tokens"]
    return last


def test_gemini_cli_jsonl_session():
    path = FIX / "gemini-cli-session.jsonl"
    trace, calls, warned = read(path)
    assert trace.detected[str(path)][0] == "gemini-cli"
    assert len(calls) == 4 and {c["session"] for c in calls} == {"3f2a9c1e-7b4d-4c2a-9e51-0d6f8a2b1c73"}
    assert all(c["fidelity"] == "messages" and c["messages"] for c in calls)
    first, second, rewound, after = calls
    # the model message was written twice (text + tokens, then its tool call): one call, the later copy
    assert first["response_tool_calls"][0]["function"]["name"] == "list_directory"
    assert first["response_reasoning"] == "Listing files: I should look at src first."
    # the tool results come from the user message that holds them, not twice
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "tool"]
    assert second["messages"][2]["tool_call_id"] == "list_directory-1747213925-1"
    assert "image placeholder" in rewound["notes"]
    # after the rewind the screenshot turn is gone; the info message never was conversation
    assert [m.get("content") for m in after["messages"] if m["role"] == "user"] == [
        "How many Python files are in src?", "Thanks, that is all."]
    assert all("system prompt and tool definitions not in the log" in c["notes"] for c in calls)
    assert any(":12: rewind" in w for w in warned) and any(":15: skipped: not valid JSON" in w for w in warned)
    totals = _gemini_totals(path)
    assert within(sum(c["prompt_tokens"] for c in calls), sum(t["input"] for t in totals.values()))
    assert within(sum(c["cache_read_tokens"] for c in calls), sum(t["cached"] for t in totals.values()))
    assert within(sum(c["completion_tokens"] for c in calls), sum(t["output"] for t in totals.values()))


def test_gemini_cli_legacy_document():
    path = FIX / "gemini-cli-legacy.json"
    trace, calls, _ = read(path)
    assert trace.detected[str(path)][0] == "gemini-cli" and len(calls) == 3
    assert len({c["session"] for c in calls}) == 1
    # the older recording keeps tool results only in toolCalls[].result: they become the tool turn
    second = calls[1]
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "tool"]
    assert "return a - b" in second["messages"][2]["content"]
    doc = json.loads(path.read_text())
    tokens = [m["tokens"] for m in doc["messages"] if m["type"] == "gemini"]
    assert within(sum(c["prompt_tokens"] for c in calls), sum(t["input"] for t in tokens))
    assert within(sum(c["cached_tokens"] for c in calls), sum(t["cached"] for t in tokens))


def _cline_requests():
    ui = json.loads((CLINE / "ui_messages.json").read_text())
    return [json.loads(m["text"]) for m in ui if m.get("say") == "api_req_started"]


def test_cline_folder_joins_history_and_usage():
    trace, calls, warned = read(CLINE)
    hist = str(CLINE / "api_conversation_history.json")
    assert set(trace.stats) == {hist}  # ui_messages.json is read with the history, not on its own
    assert any("task_metadata.json: skipped" in w for w in warned)
    assert len(calls) == 3 and {c["session"] for c in calls} == {"cline-task"}
    assert all(c["fidelity"] == "messages" and c["messages"] for c in calls)
    assert calls[1]["messages"][2] == {"role": "tool", "tool_call_id": "toolu_01Ab",
                                       "content": "import argparse\n\np = argparse.ArgumentParser()\n"
                                                  "args = p.parse_args()\n"}
    assert calls[1]["response_reasoning"] == "Add the argument before parse_args."
    assert "image placeholder" in calls[2]["notes"] and calls[0]["model"] == "claude-sonnet-4-5"
    reqs = _cline_requests()
    # Anthropic semantics: the prompt is tokensIn + cacheReads + cacheWrites
    assert [c["prompt_tokens"] for c in calls] == [r["tokensIn"] + r["cacheReads"] + r["cacheWrites"] for r in reqs]
    assert within(sum(c["cache_read_tokens"] for c in calls), sum(r["cacheReads"] for r in reqs))
    assert within(sum(c["cache_creation_tokens"] for c in calls), sum(r["cacheWrites"] for r in reqs))
    assert within(sum(c["completion_tokens"] for c in calls), sum(r["tokensOut"] for r in reqs))


def test_cline_files_alone():
    _, hist, _ = read(CLINE / "api_conversation_history.json")
    assert [c["fidelity"] for c in hist] == ["messages"] * 3
    assert [c["prompt_tokens"] for c in hist] == [9120, 9532, 11433]  # newer Cline's metrics.tokens
    _, ui, _ = read(CLINE / "ui_messages.json")
    assert [c["fidelity"] for c in ui] == ["lengths"] * 3 and [c["prompt_len"] for c in ui] == [9120, 9532, 11433]


def test_cline_deleted_range_and_roo_usage(tmp_path):
    task = tmp_path / "task-1"
    shutil.copytree(CLINE, task)
    ui = json.loads((task / "ui_messages.json").read_text())
    reqs = [m for m in ui if m.get("say") == "api_req_started"]
    reqs[2]["conversationHistoryDeletedRange"] = [1, 2]  # Cline dropped messages 1..2 from the last request
    info = json.loads(reqs[1]["text"])
    reqs[1]["text"] = json.dumps(dict(info, tokensIn=9532, apiProtocol="anthropic"))  # Roo Code: the whole input
    (task / "ui_messages.json").write_text(json.dumps(ui))
    _, calls, _ = read(task)
    assert calls[1]["prompt_tokens"] == 9532
    # messages 0, 3, 4: the task, the edit and its result; the read and its result are gone
    assert [m["role"] for m in calls[2]["messages"]] == ["user", "assistant", "tool", "user"]
    assert calls[2]["messages"][1]["tool_calls"][0]["id"] == "toolu_02Cd"
    assert any("left out of the request" in n for n in calls[2]["notes"])


def test_managed_agents_events():
    path = FIX / "managed-agents-events.jsonl"
    trace, calls, warned = read(path)
    st = trace.stats[str(path)]
    assert trace.detected[str(path)][0] == "managed-agents"
    assert len(calls) == 4 and len({c["session"] for c in calls}) == 1
    assert [c["fidelity"] for c in calls] == ["messages"] * 3 + ["lengths"]
    first, second, third, compacted = calls
    assert first["response_tool_calls"][0]["function"]["arguments"] == {"command": "gh issue list --state open"}
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "tool"]
    assert second["messages"][2]["content"] == "#12 crash on start\n#15 docs typo"
    assert third["messages"][-1] == {"role": "user", "content": "Draft a fix for #12."}
    assert compacted["response_text"] == "Done." and compacted["prompt_len"] == 300
    assert any("is_error" in w for w in warned) and any("cross-posted" in f for f in st["facts"])
    # usage summed against the file's own cumulative session.usage snapshot
    events = [json.loads(l) for l in path.read_text().splitlines() if l.startswith("{")]
    total = [e["usage"] for e in events if e["type"] == "session.usage"][-1]
    assert within(sum(c["prompt_tokens"] - c["cache_read_tokens"] - c["cache_creation_tokens"] for c in calls),
                  total["input_tokens"])
    assert within(sum(c["cache_read_tokens"] for c in calls), total["cache_read_input_tokens"])
    assert within(sum(c["cache_creation_tokens"] for c in calls),
                  total["cache_creation"]["ephemeral_5m_input_tokens"])
    assert within(sum(c["completion_tokens"] for c in calls), total["output_tokens"])


@pytest.mark.parametrize("fixture", ["gemini-cli-session.jsonl", "cline-task", "managed-agents-events.jsonl"])
def test_cli_import_end_to_end(fixture, tmp_path, capsys):
    from strata_lab.cli import main

    out = tmp_path / "x.jsonl"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)
        assert main(["import", str(FIX / fixture), "--tokenizer", "qwen3", "--out", str(out)]) == 0
    recs = [json.loads(l) for l in out.read_text().splitlines()]
    assert recs and all(r["prompt_ids"] for r in recs)
    assert all("not in the" in " ".join(r["trace_notes"]) for r in recs)
    assert f"{len(recs)} calls in 1 sessions" in capsys.readouterr().out
