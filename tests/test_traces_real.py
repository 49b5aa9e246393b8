"""Issue 28: the shapes real tools write, on small anonymised fixtures of each (tests/fixtures/traces/, see its
README): every one imports with the right calls, sessions and reported usage, and `strata-lab import` says per
file what it read and exits non-zero when a file gives no call."""
import json
import warnings
from pathlib import Path

import pytest

from strata_lab import load_trace, replay
from strata_lab.traces import TraceWarning

FIX = Path(__file__).parent / "fixtures" / "traces"


def read(*names, **kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trace = load_trace([FIX / n for n in names] if len(names) > 1 else FIX / names[0], **kw)
        calls = trace.calls()
    return trace, calls, [str(w.message) for w in caught if issubclass(w.category, TraceWarning)]


def test_proxy_capture_with_streamed_body_raw_and_refused_requests():
    trace, calls, warned = read("proxy-capture.jsonl")
    assert trace.detected[str(FIX / "proxy-capture.jsonl")][0] == "proxy"
    first, second, chat = calls  # count_tokens passed over; the 401 and the 429 skipped
    assert len(warned) == 2 and ":4: skipped" in warned[0] and "HTTP 401" in warned[0] and "HTTP 429" in warned[1]
    # the streamed (SSE body_raw) reply is assembled: its tool call and its usage
    assert first["response_tool_calls"][0]["function"] == {"name": "Bash", "arguments": {"command": "ls"}}
    assert (first["cache_read_tokens"], first["cache_creation_tokens"], first["prompt_tokens"]) == (0, 2100, 2112)
    assert "streamed response" in first["notes"] and first["request_id"] == "msg_P1"
    assert (second["cache_read_tokens"], second["cache_creation_tokens"], second["cached_tokens"]) == (2100, 25, 2100)
    assert second["messages"][2] == {"role": "tool", "tool_call_id": "toolu_P1", "content": "a.py\nb.py"}
    # the session id inside Claude Code's metadata.user_id, not the user
    assert first["session"] == second["session"] == "5d1c0b7e-0000-4000-8000-000000000001"
    assert chat["format"] == "proxy" and chat["messages"][0]["role"] == "system"  # body given as JSON text
    assert (chat["prompt_tokens"], chat["cached_tokens"], chat["response_text"]) == (21, 0, "4")
    assert any("passed over" in f for f in trace.stats[str(FIX / "proxy-capture.jsonl")]["facts"])


def test_openai_batch_output_joins_its_input_on_custom_id():
    trace, calls, warned = read("openai-batch-input.jsonl", "openai-batch-output.jsonl")
    by_id = {c["request_id"]: c for c in calls}
    # req-1 and req-2 keep their prompt (input file) and get usage and reply from the output file, whatever
    # the order of the output lines; req-3 failed in the batch (no model call); req-9 has no input line
    assert set(by_id) == {"chatcmpl-req-1", "chatcmpl-req-2", "req-9"}
    one = by_id["chatcmpl-req-1"]
    assert one["fidelity"] == "messages" and one["messages"][1]["content"] == "The app crashes on start."
    assert (one["prompt_tokens"], one["cached_tokens"], one["response_text"]) == (32, 0, "bug")
    assert by_id["chatcmpl-req-2"]["response_text"] == "feature"
    alone = by_id["req-9"]
    assert (alone["fidelity"], alone["prompt_len"], alone["cached_tokens"]) == ("lengths", 1100, 1024)
    assert any("req-3" in w and "failed" in w for w in warned)
    # the output file alone: length-only calls with the usage it reports
    _, out, _ = read("openai-batch-output.jsonl")
    assert [(c["request_id"], c["prompt_tokens"], c["cached_tokens"]) for c in out] == [
        ("req-2", 31, 0), ("req-1", 32, 0), ("req-9", 1100, 1024)]
    assert all(c["fidelity"] == "lengths" and c["notes"] for c in out)


def test_otel_console_exporter_spans_without_content_are_length_calls():
    trace, calls, warned = read("otel-console.txt")
    assert trace.detected[str(FIX / "otel-console.txt")][0] == "otel" and not warned
    a, b = calls  # the HTTP span is not a model call
    assert [c["fidelity"] for c in calls] == ["lengths", "lengths"]
    assert (a["prompt_len"], a["completion_tokens"], a["request_id"]) == (1210, 18, "chatcmpl-O1")
    assert (b["prompt_tokens"], b["cached_tokens"]) == (1290, 1152)
    assert a["session"] == b["session"]  # one trace: one agent run
    assert "no message content captured: lengths and usage only" in a["notes"]


def test_sharegpt_function_call_observation_and_tools():
    _, calls, warned = read("sharegpt-tools.json")
    assert not warned and len(calls) == 4  # not cut at the first function_call turn
    ask, answer, ask2, answer2 = calls
    assert ask["response_tool_calls"][0]["function"] == {"name": "get_weather", "arguments": {"city": "Oslo"}}
    assert ask["tools"][0]["function"]["name"] == "get_weather" and ask["messages"][0]["role"] == "system"
    assert answer["messages"][-1] == {"role": "tool", "tool_call_id": "call_0", "content": "{\"temp\": 3}"}
    assert answer["messages"][-2]["tool_calls"][0]["id"] == "call_0" and answer["response_text"] == "3 degrees in Oslo."
    assert answer2["response_text"] == "14 degrees in Rome." and len(answer2["messages"]) == 8
    assert {c["session"] for c in calls} == {"tool_a"}


def test_sharegpt_messages_role_content_variant():
    trace, calls, _ = read("sharegpt-messages.jsonl")
    assert trace.detected[str(FIX / "sharegpt-messages.jsonl")][0] == "sharegpt"
    assert [c["response_text"] for c in calls] == ["Paris.", "Madrid.", "", "3 degrees."]
    assert calls[2]["response_tool_calls"][0]["function"]["name"] == "get_weather" and calls[2]["tools"]
    assert calls[3]["messages"][-1]["role"] == "tool" and len({c["session"] for c in calls}) == 2


def test_vllm_request_lines_without_ids_keep_the_prompt_text(tmp_path, qwen3):
    _, calls, warned = read("vllm-text.log")
    assert not warned and [c["fidelity"] for c in calls] == ["text", "text"]
    assert calls[0]["prompt_text"].startswith("<|im_start|>user\nWhat's a prime?")  # the repr is parsed
    assert calls[0]["response_text"] == "A number with two divisors." and calls[0]["session"] == calls[1]["session"]
    records = load_trace(FIX / "vllm-text.log").to_dump(qwen3, out=tmp_path / "d.jsonl").records()
    assert records[0]["prompt_ids"] == qwen3.encode(calls[0]["prompt_text"])
    assert records[1]["prompt_ids"][:len(records[0]["prompt_ids"])] == records[0]["prompt_ids"]
    assert "prompt_token_ids: None" in records[0]["trace_notes"][0]


def test_default_vllm_log_gives_no_calls_and_says_what_it_reports():
    trace, calls, _ = read("vllm-default.log")
    st = trace.stats[str(FIX / "vllm-default.log")]
    assert calls == [] and "--enable-log-requests" in st["why_none"]
    assert any("3 requests" in f for f in st["facts"]) and any("41.7%" in f for f in st["facts"])


def test_default_sglang_log_reads_prefill_batches():
    trace, calls, _ = read("sglang-default.log")
    assert [(c["prompt_len"], c["cached_tokens"]) for c in calls] == [(1208, 0), (1290, 1204)]
    assert all(c["fidelity"] == "lengths" and c["request_id"] is None and c["notes"] for c in calls)
    assert any("2 requests" in f for f in trace.stats[str(FIX / "sglang-default.log")]["facts"])  # not split


def test_anthropic_body_without_system_is_anthropic_and_user_id_is_not_a_session():
    trace, calls, warned = read("anthropic-nosystem.jsonl")
    assert trace.detected[str(FIX / "anthropic-nosystem.jsonl")][0] == "anthropic"
    assert len(calls) == 4 and len(warned) == 1 and "invalid x-api-key" in warned[0]  # the 401 is no call
    # one user (metadata.user_id), two conversations: two sessions, each chained on its messages
    assert calls[0]["session"] == calls[2]["session"] != calls[1]["session"] == calls[3]["session"]
    assert (calls[2]["prompt_tokens"], calls[2]["cache_read_tokens"]) == (19, 14)


def test_openai_error_responses_are_not_calls():
    _, calls, warned = read("openai-errors.jsonl")
    assert len(calls) == 1 and len(warned) == 2 and "HTTP 401" in warned[1]


def test_codex_token_count_before_its_items_attaches_to_the_right_call():
    _, calls, _ = read("codex-rollout-late.jsonl")
    a, b = calls
    assert (a["prompt_tokens"], a["cached_tokens"], a["completion_tokens"]) == (5200, 0, 40)
    assert (b["prompt_tokens"], b["cached_tokens"], b["completion_tokens"]) == (5300, 5120, 12)
    assert (a["request_id"], b["request_id"]) == ("rs_0a1", "msg_0b1")
    assert a["ts"] < b["ts"] and b["messages"][-1]["role"] == "tool"
    assert "base instructions (system prompt) not in the log" in a["notes"]
    assert "tool definitions not in the log" in b["notes"]


def test_codex_totals_only_give_each_call_its_difference(tmp_path):
    lines = []
    for line in (FIX / "codex-rollout-late.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if isinstance((rec["payload"] or {}).get("info"), dict):
            rec["payload"]["info"].pop("last_token_usage")
        lines.append(json.dumps(rec))
    path = tmp_path / "rollout.jsonl"
    path.write_text("\n".join(lines) + "\n")
    calls = load_trace(path).calls()
    assert [(c["prompt_tokens"], c["cached_tokens"]) for c in calls] == [(5200, 0), (5300, 5120)]


def test_codex_old_order_still_reads(tmp_path):
    _, calls, _ = read("codex-rollout.jsonl")
    assert [(c["prompt_tokens"], c["cached_tokens"]) for c in calls] == [(4100, 3072), (4200, 4096)]
    assert "base instructions (system prompt) not in the log" not in calls[0]["notes"]


def test_claude_code_old_sidechains_compact_and_rewind():
    _, calls, warned = read("cc-1.0-subagents.jsonl")
    sid = "3e0c7a51-0000-4000-8000-00000000beef"
    by = {c["request_id"]: c for c in calls}
    # two subagents without agentId: two sessions, apart from each other and from the main one
    assert by["SA1"]["session"] == f"{sid}/sidechain-s1"
    assert by["SB1"]["session"] == by["SB2"]["session"] == f"{sid}/sidechain-s2"
    assert [m["content"] for m in by["SA1"]["messages"]] == ["Check the tests"]
    assert by["SB2"]["messages"][0]["content"] == "Check the docs" and len(by["SB2"]["messages"]) == 3
    assert {by[k]["session"] for k in ("M1", "M2", "M3", "M4", "M5")} == {sid}
    assert [c["request_id"] for c in calls] == ["M1", "SA1", "SB1", "SB2", "M2", "M3", "M4", "M5"]  # file order
    # /compact: the history after the boundary is the summary, not the conversation before it
    assert by["M3"]["messages"][0]["content"].startswith("This session is being continued")
    assert [m["content"] for m in by["M3"]["messages"]][1:] == ["Now fix lint."]
    # rewind: M5 continues from "Which linter?", not from the abandoned "ruff" branch
    assert [m["content"] for m in by["M5"]["messages"]][1:] == ["Now fix lint.", "Which linter?", "flake8"]
    assert [m["content"] for m in by["M4"]["messages"]][-1] == "ruff"
    assert any("rewind" in w and ":17:" in w for w in warned)


def test_claude_code_tool_results_hung_on_their_own_lines_are_no_rewind(tmp_path):
    # parallel tool calls over two assistant lines, each result pointing at its own tool call's line
    def line(kind, uuid, parent, content, mid=None):
        msg = {"role": kind, "content": content} if kind == "user" else {"id": mid, "role": "assistant",
                                                                          "model": "claude", "content": content}
        return {"type": kind, "sessionId": "s", "uuid": uuid, "parentUuid": parent, "message": msg}
    lines = [line("user", "u", None, "go"),
             line("assistant", "a1", "u", [{"type": "tool_use", "id": "t1", "name": "Read", "input": {}}], "M1"),
             line("assistant", "a2", "a1", [{"type": "tool_use", "id": "t2", "name": "Read", "input": {}}], "M1"),
             line("user", "r1", "a1", [{"type": "tool_result", "tool_use_id": "t1", "content": "one"}]),
             line("user", "r2", "a2", [{"type": "tool_result", "tool_use_id": "t2", "content": "two"}]),
             line("assistant", "a3", "r2", [{"type": "text", "text": "done"}], "M2")]
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        calls = load_trace(path).calls()
    assert [m.get("content") for m in calls[1]["messages"]] == ["go", "", "one", "two"]
    assert not [w for w in caught if "rewind" in str(w.message)]


def test_llamacpp_cancelled_task_keeps_its_cached_prefix():
    _, calls, _ = read("llama-cancel.log")
    assert [(c["request_id"], c["prompt_len"], c["cached_tokens"]) for c in calls] == [
        ("task-0", 1208, 0), ("task-25", 1500, 1204)]
    assert any("no timing line" in n for n in calls[1]["notes"])


def test_anthropic_cache_control_reaches_the_dump_as_positions(tmp_path, qwen3):
    dump = load_trace(FIX / "anthropic.jsonl").to_dump(qwen3, out=tmp_path / "d.jsonl")
    a, b, auto = dump.records()
    for rec in (a, b):
        assert rec["cache_control"] and all(0 < p <= len(rec["prompt_ids"]) for p in rec["cache_control"])
    # system[0]'s breakpoint ends with the system text, the tool_result's with its content (at the last token
    # boundary at or before the block's end: a token that runs past it is not in the cached prefix)
    for rec, text in ((a, "You are a weather bot."), (b, "18C, sunny")):
        p = rec["cache_control"][0 if rec is a else -1]
        head, one_more = qwen3.decode(rec["prompt_ids"][:p]), qwen3.decode(rec["prompt_ids"][:p + 1])
        assert head.endswith(text) or (text not in head and text in one_more), (head, p)
    assert auto["cache_control"] == [len(auto["prompt_ids"])]  # automatic mode: the end of the prompt
    # the Anthropic cache model runs in breakpoint mode on them
    from strata_lab.caches.call_ids import calls_from_dump

    assert [c.breakpoints for c in calls_from_dump(dump)] == [tuple(r["cache_control"]) for r in (a, b, auto)]
    # a request with no cache_control caches nothing: an empty list, not automatic mode
    nos = load_trace(FIX / "anthropic-nosystem.jsonl").to_dump(qwen3, out=tmp_path / "n.jsonl").records()
    assert all(r["cache_control"] == [] for r in nos)
    # the content blocks' ends (what the look-back counts) ride along, the breakpoints among them
    assert set(b["cache_control"]) <= set(b["content_blocks"]) and len(b["content_blocks"]) > len(b["cache_control"])
    # Claude Code logs do not say where the breakpoints were: no field (automatic mode)
    cc = load_trace(FIX / "claude-code-session.jsonl").to_dump(qwen3, out=tmp_path / "c.jsonl").records()
    assert all("cache_control" not in r for r in cc)


def test_anthropic_model_reads_the_previous_breakpoint_of_a_proxied_session(tmp_path, qwen3):
    from strata_lab.caches.replay import replay_engines

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)
        dump = load_trace(FIX / "proxy-capture.jsonl").to_dump(qwen3, out=tmp_path / "d.jsonl")
    first, second, _ = dump.records()
    df = replay_engines(dump, ["anthropic:min_tokens=4"], tokenizer=qwen3, progress=False).frame()
    # the second request's tool_result breakpoint looks back over its blocks to the first request's last
    # breakpoint (the end of "List the files."), as the API did (it reported the whole earlier prefix read)
    assert df["reused"].tolist()[:2] == [0, first["cache_control"][-1]]
    assert first["cache_control"][-1] in second["content_blocks"]


def test_every_reader_carries_reported_usage_into_the_dump(tmp_path, qwen3):
    expect = {"proxy-capture.jsonl": [0, 2100, 0], "otel-console.txt": [None, 1152],
              "codex-rollout-late.jsonl": [0, 5120], "llama-cancel.log": [0, 1204],
              "sglang-default.log": [0, 1204], "openai-batch-output.jsonl": [0, 0, 1024]}
    for name, cached in expect.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TraceWarning)
            recs = load_trace(FIX / name).to_dump(qwen3, out=tmp_path / "d.jsonl").records()
        assert [r["reported_cached_tokens"] for r in recs] == cached, name
    rows = replay(load_trace(FIX / "sglang-default.log").to_dump(qwen3, out=tmp_path / "s.jsonl"),
                  engine="strata:kind=attention").rows
    assert [r["lcp_ids"] for r in rows] == [0, 1204]  # placeholder ids keep the reported reuse


def test_session_key_option(tmp_path):
    lines = [{"meta": {"conv": c}, "request": {"model": "m", "messages": [{"role": "user", "content": t}]}}
             for c, t in (("x", "a"), ("y", "b"), ("x", "c"))]
    path = tmp_path / "log.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert [c["session"] for c in load_trace(path, session_key="meta.conv")] == ["x", "y", "x"]
    assert len({c["session"] for c in load_trace(path)}) == 3  # chained: three different first messages
    with pytest.raises(ValueError, match="session_key: vllm-log logs are text lines"):
        load_trace(FIX / "vllm.log", session_key="a.b")
    with pytest.raises(ValueError, match="session_key: claude-code logs name their sessions"):
        load_trace(FIX / "claude-code-session.jsonl", session_key="a")
    with pytest.raises(ValueError, match="session_key: 'a..b' is not a field path"):
        load_trace(path, session_key="a..b")


def test_chaining_joins_an_edited_history_by_its_longest_prefix(tmp_path):
    sys_ = {"role": "system", "content": "You are an agent."}
    u1, u2 = {"role": "user", "content": "Fix the bug."}, {"role": "user", "content": "Write docs."}
    a1 = {"role": "assistant", "content": "Looked at main.py."}
    t1 = {"role": "user", "content": "Now test."}
    # the log starts mid-session, and the agent rewrites its history between calls (a compacted reply): no
    # earlier prompt is a prefix of the next, but they share the system prompt and the first user turn
    bodies = [[sys_, u1, a1, t1],
              [sys_, u1, {"role": "assistant", "content": "(summary)"}, t1, {"role": "assistant", "content": "ok"},
               {"role": "user", "content": "continue"}],
              [sys_, u1, a1, {"role": "user", "content": "Other branch."}],
              [sys_, u2]]  # the same system prompt only: another session
    path = tmp_path / "calls.jsonl"
    path.write_text("".join(json.dumps({"model": "m", "messages": b}) + "\n" for b in bodies))
    sessions = [c["session"] for c in load_trace(path)]
    assert sessions[0] == sessions[1] == sessions[2] != sessions[3]


def _cli(*argv):
    from strata_lab.cli import main

    return main(list(argv))


def test_cli_import_reports_per_file_and_fails_on_a_file_without_calls(tmp_path, capsys):
    out = tmp_path / "d.jsonl"
    assert _cli("import", str(FIX / "proxy-capture.jsonl"), "--out", str(out), "-q") == 0
    text, err = capsys.readouterr()
    assert "proxy (first record's keys" in text and "3 calls in 2 sessions" in text
    assert "rendered: 3 of 3 calls" in text and "usage: reported on 3 of 3 calls, cached tokens on 3" in text
    # warnings are one line each, naming the log's file:line, never a line of our source
    assert err.count("\n") == 2 and all(x.startswith("strata-lab import: warning: ") for x in err.splitlines())
    assert ".py" not in err
    # a file with no calls: non-zero, one line saying why, no empty dump left
    empty = tmp_path / "e.jsonl"
    assert _cli("import", str(FIX / "vllm-default.log"), "--out", str(empty), "-q") == 1
    text, err = capsys.readouterr()
    assert not empty.exists() and "0 calls" in text and "the log reports: 3 requests served" in text
    errors = [x for x in err.splitlines() if "error" in x]
    assert len(errors) == 1 and "no calls: a default vLLM log" in errors[0]
    # several files, one without calls: the others are written, the exit says one gave none
    both = tmp_path / "both.jsonl"
    assert _cli("import", str(FIX / "proxy-capture.jsonl"), str(FIX / "vllm-default.log"), "--out", str(both),
                "-q") == 1
    text, err = capsys.readouterr()
    assert both.exists() and len(both.read_text().splitlines()) == 3 and "no calls: a default vLLM log" in err
    junk = tmp_path / "bad.jsonl"
    junk.write_text(json.dumps({"model": "m", "messages": []}) + "\n")
    assert _cli("import", str(junk), "--format", "openai", "--out", str(tmp_path / "j.parquet"), "-q") == 1
    assert "no calls: every record was skipped (1 of them)" in capsys.readouterr().err


def test_cli_help_documents_the_chaining_rule_and_session_key(capsys):
    for cmd in ("import", "replay"):
        with pytest.raises(SystemExit):
            _cli(cmd, "--help")
        text = " ".join(capsys.readouterr().out.split())
        assert "--session-key FIELD.PATH" in text and "longest prefix over recent calls (not equality)" in text, cmd
        # the id-level rule, with its minimum, is the same rule on ids
        assert "Id-level logs (vLLM, SGLang) compare token ids" in text and "except at most its last 16 ids" in text


def test_cli_replay_takes_session_key(tmp_path, capsys):
    lines = [{"sid": "s1", "request": {"model": "m", "messages": [{"role": "user", "content": t}]}} for t in "ab"]
    path = tmp_path / "log.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert _cli("replay", str(path), "--session-key", "sid", "-q", "--model", "attention") == 0
    assert "log.jsonl: openai" in capsys.readouterr().out
