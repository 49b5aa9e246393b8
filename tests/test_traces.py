"""Trace import: every reader on hand-written fixtures (odd cases included), detection, the trace table,
rendering to strata-dump/1 and the round trip into replay."""
import json
import os
import warnings
from pathlib import Path

import pytest

from strata_lab import load_trace, replay
from strata_lab.traces import READERS, TraceWarning
from strata_lab.traces.claude_code import NOT_LOGGED

FIX = Path(__file__).parent / "fixtures" / "traces"
DUMPS = Path(__file__).parent.parent / "dumps"
pytestmark = pytest.mark.filterwarnings("ignore::strata_lab.traces.source.TraceWarning")

# fixture -> (format detected, calls read, sessions)
FIXTURES = {
    "openai.jsonl": ("openai", 5, 3),
    "anthropic.jsonl": ("anthropic", 3, 2),
    "otel-spans.jsonl": ("otel", 4, 3),
    "claude-code-session.jsonl": ("claude-code", 3, 1),
    "claude-code-agent-a1b2c3.jsonl": ("claude-code", 2, 1),
    "codex-rollout.jsonl": ("codex", 2, 1),
    "capture.har": ("har", 3, 2),
    "vllm.log": ("vllm-log", 3, 1),
    "sglang.log": ("sglang-log", 3, 2),
    "llama-server.log": ("llama.cpp-log", 4, 2),
    "sharegpt.json": ("sharegpt", 3, 2),
    # issue 28: the shapes real tools write (tests/test_traces_real.py checks each in detail)
    "proxy-capture.jsonl": ("proxy", 3, 2),
    "openai-batch-input.jsonl": ("openai", 3, 3),
    "openai-batch-output.jsonl": ("openai-batch", 3, 1),
    "openai-errors.jsonl": ("openai", 1, 1),
    "anthropic-nosystem.jsonl": ("anthropic", 4, 2),
    "otel-console.txt": ("otel", 2, 1),
    "sharegpt-tools.json": ("sharegpt", 4, 1),
    "sharegpt-messages.jsonl": ("sharegpt", 4, 2),
    "vllm-text.log": ("vllm-log", 2, 1),
    "vllm-edits.log": ("vllm-log", 6, 3),
    "sglang-edits.jsonl": ("sglang-log", 6, 3),
    "sglang-default.log": ("sglang-log", 2, 1),
    "llama-cancel.log": ("llama.cpp-log", 2, 1),
    "codex-rollout-late.jsonl": ("codex", 2, 1),
    "cc-1.0-subagents.jsonl": ("claude-code", 8, 3),
    "mooncake.jsonl": ("mooncake", 6, 6),
    "bailian.jsonl": ("bailian", 6, 4),
    # issue 48: Claude Code 2.x subagent opening on a reply, JS SDK spans, the generic message-list reader
    "cc-2.0-agent-headless.jsonl": ("claude-code", 3, 1),
    "vercel-ai-spans.jsonl": ("otel", 5, 4),
    "openinference-spans.jsonl": ("otel", 3, 2),
    "generic-nested.json": ("generic", 5, 3),
    "generic-lines.jsonl": ("generic", 2, 1),
    # issue 48: OpenHands, LangSmith, OpenAI Responses (tests/test_traces_agents_oh.py checks each in detail)
    "openhands-trajectory.json": ("openhands", 4, 1),
    "openhands-eval-output.jsonl": ("openhands-eval", 4, 2),
    "langsmith-runs.jsonl": ("langsmith", 3, 2),
    "openai-responses.jsonl": ("openai-responses", 3, 2),
    # issue 48: agent trajectories (tests/test_traces_agents_swe.py checks each in detail)
    "swe-agent-1.1.traj": ("swe-agent", 4, 1),
    "swe-agent-0.7.traj": ("swe-agent", 3, 1),
    "mini-swe-agent.traj.json": ("mini-swe-agent", 4, 1),
    "mini-swe-agent-1.traj.json": ("mini-swe-agent", 3, 1),
    "aider.llm.history": ("aider", 3, 1),
    # issue 48: Gemini CLI, Cline / Roo Code, Managed Agents (tests/test_traces_agents_ide.py checks each in detail)
    "gemini-cli-session.jsonl": ("gemini-cli", 4, 1),
    "gemini-cli-legacy.json": ("gemini-cli", 3, 1),
    "cline-task/api_conversation_history.json": ("cline", 3, 1),
    "cline-task/ui_messages.json": ("cline", 3, 1),
    "managed-agents-events.jsonl": ("managed-agents", 4, 1),
}


def read(name, **kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trace = load_trace(FIX / name, **kw)
        calls = trace.calls()
    return trace, calls, [str(w.message) for w in caught if issubclass(w.category, TraceWarning)]


def test_every_format_has_a_reader_and_a_fixture():
    assert set(READERS) == {f for f, _, _ in FIXTURES.values()} | {"strata"}


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_detects_and_reads_each_fixture(name):
    fmt, n_calls, n_sessions = FIXTURES[name]
    trace, calls, _ = read(name)
    path = str(FIX / name)
    assert trace.detected[path][0] == fmt and trace.detected[path][1]  # says what and why
    assert len(calls) == n_calls
    assert len({c["session"] for c in calls}) == n_sessions
    for c in calls:
        assert c["format"] == fmt and c["source"].startswith(path + ":")
        assert c["fidelity"] in ("ids", "messages", "text", "lengths")
    # calls number 0, 1, ... within each session
    by = {}
    for c in calls:
        by.setdefault(c["session"], []).append(c["call"])
    assert all(v == list(range(len(v))) for v in by.values())
    # the same file read with its format named gives the same calls
    assert [c["source"] for c in load_trace(path, format=fmt)] == [c["source"] for c in calls]


def test_bad_records_are_skipped_naming_file_and_line():
    expect = {"openai.jsonl": ":4: skipped: not valid JSON", "anthropic.jsonl": ":4: skipped: messages",
              "claude-code-session.jsonl": ":6: skipped: not valid JSON",
              "codex-rollout.jsonl": ":15: skipped: line without a payload", "capture.har": "answered HTTP 400",
              "vllm.log": ":8: skipped: prompt_token_ids list not closed",
              "llama-server.log": ":39: skipped: JSON line without timings",
              "sharegpt.json": "conversation 'conv_c' turn 0"}
    for name, text in expect.items():
        _, _, warned = read(name)
        assert len(warned) == 1 and text in warned[0] and str(FIX / name) in warned[0], (name, warned)


def test_openai_pairs_tools_images_batch_and_usage():
    _, calls, _ = read("openai.jsonl")
    first, second, third, image, batch = calls
    assert first["response_tool_calls"][0]["function"] == {"name": "read_file", "arguments": '{"path": "README.md"}'}
    assert second["messages"][3] == {"role": "tool", "tool_call_id": "call_1", "content": "# strata\nA toolkit."}
    assert [c["cached_tokens"] for c in (first, second, third)] == [0, 128, 192]
    assert first["session"] == second["session"] == third["session"]  # prefix-chained: no id in the log
    assert image["messages"][0]["content"][1] == {"type": "text", "text": "[image]"}
    assert "image placeholder" in image["notes"] and image["system"] is None
    assert batch["request_id"] == "req-7" and batch["messages"][0]["role"] == "system"  # developer -> system


def test_render_check_says_whether_the_template_matches_the_server():
    trace, _, _ = read("openai.jsonl")
    check = trace.render_check("qwen3")
    # the fixture's server used our qwen3 template for calls 0 and 1; call 2 reports 7 more tokens
    assert check["render_exact"].tolist()[:3] == [True, True, False]
    assert check["render_diff"].tolist()[2] == -7
    assert check["render_exact"].isna().tolist()[3:] == [True, True]  # nothing reported


def test_anthropic_breakpoints_thinking_tool_results_and_usage():
    _, calls, _ = read("anthropic.jsonl")
    a, b, auto = calls
    assert a["cache_breakpoints"] == ["system[0]", "tools[0]"]
    assert b["cache_breakpoints"] == ["system[0]", "tools[0]", "messages[2].content[0]"]
    assert auto["cache_breakpoints"] == ["auto"] and "image placeholder" in auto["notes"]
    assert a["system"] == "You are a weather bot." and a["tools"][0]["function"]["name"] == "get_weather"
    assert a["response_reasoning"] == "Need the tool." and a["response_tool_calls"][0]["id"] == "toolu_01"
    assert b["messages"][1]["reasoning_content"] == "Need the tool."
    assert b["messages"][2] == {"role": "tool", "tool_call_id": "toolu_01", "content": "18C, sunny"}
    # input_tokens counts only what follows the last breakpoint: the prompt is the sum of the three buckets
    assert (b["prompt_tokens"], b["cache_read_tokens"], b["cache_creation_tokens"]) == (1290, 1200, 60)


def test_claude_code_groups_lines_keeps_sidechains_apart_and_notes_gaps():
    _, calls, _ = read("claude-code-session.jsonl")
    first, second, third = calls
    # two lines share message.id msg_A1: one call with the thinking and the tool call
    assert first["request_id"] == "msg_A1" and first["response_reasoning"] == "Look at the test first."
    assert first["response_tool_calls"][0]["function"]["name"] == "Read"
    assert first["completion_tokens"] == 61  # the last line's usage
    assert (first["cache_read_tokens"], first["cache_creation_tokens"], first["prompt_tokens"]) == (11800, 2100, 13904)
    assert second["messages"][-1]["content"].endswith("[truncated: 1840 more lines]")  # truncated content kept
    assert third["messages"][-1]["content"][0]["text"] == "[image]"
    assert all("API Error" not in (c["response_text"] or "") for c in calls)  # client-written error lines
    assert all(NOT_LOGGED in c["notes"] for c in calls)
    _, side, _ = read("claude-code-agent-a1b2c3.jsonl")
    assert {c["session"] for c in side} == {"7f1c2e9a-0b4d-4c55-9a1e-3d2f6b8c9e01/agent-a1b2c3"}
    assert all("subagent sidechain" in c["notes"] for c in side)
    both = load_trace(FIX / "claude-code-*.jsonl").calls()  # a glob: main session and its subagent
    assert len({c["session"] for c in both}) == 2


def test_codex_calls_close_at_token_count():
    _, calls, _ = read("codex-rollout.jsonl")
    a, b = calls
    assert a["session"] == "0199a213-81c0-7800-8aa1-bbab2a035a53" and a["model"] == "gpt-5-codex"
    assert a["system"] == "You are Codex, a coding agent."
    assert a["response_tool_calls"][0]["function"]["name"] == "shell" and "encrypted reasoning" in a["notes"]
    assert (a["prompt_tokens"], a["cached_tokens"], b["cached_tokens"]) == (4100, 3072, 4096)
    assert b["messages"][-1]["role"] == "tool" and b["messages"][-1]["tool_call_id"] == "call_Q1"
    assert b["response_text"] == "Two entries: README.md and src." and b["response_reasoning"] == "**Listing done**"


def test_otel_semconv_and_older_events():
    _, calls, warned = read("otel-spans.jsonl")
    a, b, old, bare = calls
    # a span recorded without its content (capture off) is a length-only call with its usage, not dropped
    assert (bare["fidelity"], bare["prompt_len"], bare["prompt_tokens"], bare["messages"]) == ("lengths", 50, 50, None)
    assert "no message content captured: lengths and usage only" in bare["notes"] and not warned
    assert a["session"] == b["session"] == "conv-42" and a["system"] == "You are a weather bot."
    assert b["messages"][2] == {"role": "tool", "tool_call_id": "call_w", "content": "rainy, 9C"}
    assert (b["prompt_tokens"], b["cached_tokens"], b["response_text"]) == (1360, 1280, "Rainy and 9C.")
    assert old["messages"] == [{"role": "user", "content": "Say hi"}] and old["response_text"] == "hi"
    assert old["prompt_tokens"] == 21


def test_har_streams_and_key_order(tmp_path):
    _, calls, _ = read("capture.har")
    plain, streamed, claude = calls
    assert streamed["response_text"] == "Use the cache." and streamed["cached_tokens"] == 176
    assert "streamed response" in streamed["notes"] and "streamed response" not in plain["notes"]
    assert claude["response_text"] == "Hello!"
    assert claude["response_tool_calls"][0]["function"]["arguments"] == {"q": "strata"}
    # the second client sent the tool schema with its keys in another order: kept, so the render differs
    assert list(plain["tools"][0]) == ["type", "function"] and list(streamed["tools"][0]) == ["function", "type"]
    rows = replay(load_trace(FIX / "capture.har").to_dump("qwen3", out=tmp_path / "d.jsonl"), engine="strata:kind=attention").rows
    assert rows[1]["cause"] == "history_edit" and "tools" in rows[1]["text_context_held"] + rows[1]["text_context_prompt"]


def test_id_logs_keep_ids_and_chain_sessions(qwen3):
    _, vllm, _ = read("vllm.log")
    assert all(c["fidelity"] == "ids" for c in vllm) and len({c["session"] for c in vllm}) == 1
    assert qwen3.decode(vllm[0]["response_ids"]).endswith("Hello! How can I help?<|im_end|>")
    assert vllm[1]["prompt_ids"][:len(vllm[0]["prompt_ids"])] == vllm[0]["prompt_ids"]
    _, sg, _ = read("sglang.log")
    assert [c["fidelity"] for c in sg] == ["ids", "ids", "lengths"] and sg[1]["cached_tokens"] == 27
    assert "ids cut by --log-requests-level 2 (use level 3)" in sg[2]["notes"] and sg[2]["prompt_len"] == 4000


def test_llamacpp_lengths_and_ground_truth(tmp_path):
    _, calls, _ = read("llama-server.log")
    assert [c["cached_tokens"] for c in calls] == [0, 1204, 0, 236]
    assert [c["prompt_len"] for c in calls] == [1208, 1290, 1400, 300]
    assert "restored context checkpoint" in calls[1]["notes"] and "forced full prompt re-processing" in calls[2]["notes"]
    # placeholder ids keep the reported reuse: the replay of the rendered dump reuses what llama.cpp reported
    rows = replay(load_trace(FIX / "llama-server.log").to_dump("qwen3", out=tmp_path / "d.jsonl"), engine="strata:kind=attention").rows
    assert [r["lcp_ids"] for r in rows] == [0, 1204, 0, 0] and [r["prompt_len"] for r in rows] == [1208, 1290, 1400, 300]


def test_sharegpt_expands_cumulative_requests():
    _, calls, _ = read("sharegpt.json")
    assert [(c["session"], len(c["messages"]), c["response_text"]) for c in calls] == [
        ("conv_a", 1, "7."), ("conv_a", 3, "11."), ("conv_b", 2, "Bonjour")]


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_every_format_round_trips_into_replay(name, tmp_path, qwen3):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)
        trace = load_trace(FIX / name)
        calls = trace.calls()
        dump = trace.to_dump(qwen3, out=tmp_path / "d.jsonl")
        records = dump.records()
        report = replay(dump, engine="strata:kind=attention", tokenizer=qwen3)
    assert oct(os.stat(tmp_path / "d.jsonl").st_mode & 0o777) == "0o600"
    assert len(records) == len(calls) == len(report.rows)
    assert [r["source"] for r in records] == [c["source"] for c in calls]
    for rec, call in zip(records, calls):
        assert rec["schema"] == "strata-dump/1" and rec["session"] == call["session"]
        if call["fidelity"] == "ids":
            assert rec["prompt_ids"] == call["prompt_ids"]
        if call["fidelity"] == "messages" and call["response_text"]:
            assert call["response_text"] in qwen3.decode(rec["gen_ids"])
    assert report.rows[0]["cause"] == "new_session"


def test_strata_dumps_import_unchanged(tmp_path):
    trace = load_trace(DUMPS / "agent.jsonl")
    assert trace.detected[str(DUMPS / "agent.jsonl")][0] == "strata"
    dump = trace.to_dump("qwen3", out=tmp_path / "again.jsonl")
    a, b = replay(DUMPS / "agent.jsonl").rows, replay(dump).rows
    keys = ("prompt_len", "reused", "reported", "cause", "read")
    assert [[r[k] for k in keys] for r in a] == [[r[k] for k in keys] for r in b]


def test_frame_types_and_parquet(tmp_path):
    import pandas as pd

    trace = load_trace([FIX / "openai.jsonl", FIX / "llama-server.log"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)
        df = trace.to_frame()
        out = trace.write(tmp_path / "t.parquet")
    assert len(df) == 9 and str(df["prompt_tokens"].dtype) == "Int64" and str(df["fidelity"].dtype) == "category"
    assert df["n_messages"].tolist()[:3] == [2, 4, 6] and df["format"].tolist()[-1] == "llama.cpp-log"
    back = pd.read_parquet(out)
    assert back["session"].tolist() == df["session"].tolist()
    assert json.loads(back["messages"][1])[3]["role"] == "tool"
    assert back["cached_tokens"].tolist()[:3] == [0, 128, 192]
    with pytest.raises(ValueError, match="out: .* must end in .parquet"):
        trace.write(tmp_path / "t.csv")


def test_load_trace_inputs_and_errors(tmp_path):
    t = load_trace(FIX)  # a directory: every file, each format detected
    assert set(f for f, _ in t.detected.values()) == {f for f, _, _ in FIXTURES.values()}
    with pytest.raises(ValueError, match="format: unknown 'nope'"):
        load_trace(FIX / "openai.jsonl", format="nope")
    junk = tmp_path / "junk.txt"
    junk.write_text("hello\nworld\n")
    with pytest.raises(ValueError, match="format: cannot tell the format of .*junk.txt"):
        load_trace(junk)
    with pytest.raises(FileNotFoundError, match="no such log file"):
        load_trace(tmp_path / "missing.jsonl")


def test_reading_streams_with_bounded_memory(tmp_path):
    import tracemalloc

    line = json.dumps({"request": {"model": "m", "messages": [{"role": "user", "content": "x" * 2000}]},
                       "response": {"choices": [{"message": {"content": "y" * 200}}]}}) + "\n"
    path = tmp_path / "big.jsonl"
    with open(path, "w") as f:
        for i in range(4000):
            f.write(line.replace('"m"', f'"m{i}"'))
    size = path.stat().st_size
    tracemalloc.start()
    n = sum(1 for _ in load_trace(path, format="openai"))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert n == 4000 and peak < size / 4, (peak, size)


def test_progress_bar_runs(capsys):
    calls = load_trace(FIX / "codex-rollout.jsonl", progress=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)
        assert len(calls.calls()) == 2


def test_cli_import_and_replay(tmp_path, capsys):
    from strata_lab.cli import main

    out = tmp_path / "cc.jsonl"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)
        assert main(["import", str(FIX / "claude-code-session.jsonl"), "--tokenizer", "qwen3", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "claude-code" in text and "3 calls" in text and out.exists()
    assert main(["import", str(FIX / "openai.jsonl"), "--format", "openai", "--out", str(tmp_path / "t.parquet"),
                 "-q"]) == 0
    assert (tmp_path / "t.parquet").exists()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)
        assert main(["replay", str(FIX / "openai.jsonl"), "--format", "openai", "--tokenizer", "qwen3", "-q",
                     "--model", "attention"]) == 0
    assert "calls" in capsys.readouterr().out
    assert main(["import", str(FIX / "openai.jsonl"), "--format", "nope", "--out", str(tmp_path / "x.jsonl")]) == 2


def test_doctests():
    import doctest
    import importlib

    for name in ("source", "log_calls", "opener", "openai", "anthropic", "registry", "render", "trace", "breakpoints"):
        mod = importlib.import_module(f"strata_lab.traces.{name}")
        assert doctest.testmod(mod).failed == 0, name


def test_claude_code_keeps_a_bounded_number_of_open_sessions(tmp_path, monkeypatch):
    import strata_lab.traces.claude_code as cc

    monkeypatch.setattr(cc, "MAX_OPEN_SESSIONS", 2)
    lines = []
    for turn in range(2):
        for s in ("a", "b", "c"):  # three sessions interleaved: the oldest is closed when the third opens
            lines.append({"type": "user", "sessionId": s, "uuid": f"{s}u{turn}", "parentUuid": f"{s}a{turn - 1}" if turn else None,
                          "message": {"role": "user", "content": f"q{turn}"}})
            lines.append({"type": "assistant", "sessionId": s, "uuid": f"{s}a{turn}", "parentUuid": f"{s}u{turn}",
                          "message": {"id": f"{s}m{turn}", "role": "assistant", "content": [{"type": "text", "text": "ok"}]}})
    path = tmp_path / "many.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        calls = load_trace(path).calls()
    assert len(calls) == 6
    assert any("seen again" in str(w.message) and "history restarts" in str(w.message) for w in caught)


def test_a_directory_skips_files_that_are_not_logs(tmp_path):
    import shutil

    shutil.copy(FIX / "codex-rollout.jsonl", tmp_path / "rollout.jsonl")
    (tmp_path / "README.txt").write_text("notes about these logs\n")
    with pytest.warns(TraceWarning, match="README.txt: skipped: format: cannot tell"):
        trace = load_trace(tmp_path)
    assert list(trace.detected.values())[0][0] == "codex" and len(trace.paths) == 1


def test_generated_ids_in_the_log_show_retokenized_replies(tmp_path, qwen3):
    # a vLLM log whose reply ids are not the canonical encoding of their text (' öğrenci' in two pieces):
    # the next prompt re-encodes the text, and the replay names the cause
    p1 = qwen3.encode("<|im_start|>user\nsay it<|im_end|>\n<|im_start|>assistant\n")
    reply = qwen3.encode("Hi") + [130947, 5855] + [qwen3.im_end_id]
    p2 = p1 + qwen3.encode("Hi öğrenci<|im_end|>\n<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n")
    ids = lambda xs: "[" + ", ".join(map(str, xs)) + "]"  # noqa: E731
    log = tmp_path / "vllm.log"
    log.write_text(
        f"DEBUG 11-30 12:00:00 [logger.py:50] Request r1 details: prompt: 'x', prompt_token_ids: {ids(p1)}, x.\n"
        f"INFO 11-30 12:00:01 [logger.py:71] Generated response r1: output: 'Hi öğrenci', output_token_ids: {ids(reply)}, x\n"
        f"DEBUG 11-30 12:00:02 [logger.py:50] Request r2 details: prompt: 'y', prompt_token_ids: {ids(p2)}, x.\n")
    trace = load_trace(log)
    assert trace.detected[str(log)][0] == "vllm-log"
    rows = replay(trace.to_dump(qwen3, out=tmp_path / "d.jsonl"), tokenizer=qwen3, engine="strata:kind=attention").rows
    assert [r["cause"] for r in rows] == ["new_session", "retokenized_reply"]


def test_json_arrays_stream_with_bounded_memory(tmp_path):
    import tracemalloc

    conv = {"conversations": [{"from": "human", "value": "q" * 3000}, {"from": "gpt", "value": "a" * 3000}]}
    path = tmp_path / "big.json"
    with open(path, "w") as f:
        f.write("[\n")
        f.write(",\n".join(json.dumps({**conv, "id": f"c{i}"}) for i in range(6000)))
        f.write("\n]\n")
    tracemalloc.start()
    n = sum(1 for _ in load_trace(path))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert n == 6000 and peak < path.stat().st_size / 4, (peak, path.stat().st_size)  # a 1 MiB window, not the file


def test_chat_template_kwargs_of_the_request_reach_the_template(tmp_path, qwen3):
    body = {"model": "m", "messages": [{"role": "user", "content": "2+2?"}],
            "chat_template_kwargs": {"enable_thinking": False}}
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(body) + "\n" + json.dumps({k: v for k, v in body.items() if k != "chat_template_kwargs"}) + "\n")
    off, default = load_trace(path).to_dump(qwen3, out=tmp_path / "d.jsonl").records()
    assert qwen3.decode(off["prompt_ids"]).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert qwen3.decode(default["prompt_ids"]).endswith("<|im_start|>assistant\n")
