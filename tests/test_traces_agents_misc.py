"""Issue 48 (agent traces), the smaller readers and messages: Claude Code 2.x subagent transcripts that open on a
reply, the JS SDKs' spans (Vercel AI SDK, OpenInference), OpenAI Batch files judged together, 0-call imports,
the generic message-list reader with --messages-path and --inspect, and errors that name what was seen."""
import json
import warnings
from pathlib import Path

import pytest

from strata_lab import load_trace
from strata_lab.traces import TraceWarning
from strata_lab.traces.claude_code import HEADLESS, HEADLESS_AFTER

FIX = Path(__file__).parent / "fixtures" / "traces"


def read(name, **kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trace = load_trace(FIX / name if isinstance(name, str) else name, **kw)
        calls = trace.calls()
    return trace, calls, [str(w.message) for w in caught if issubclass(w.category, TraceWarning)]


def cli(*argv):
    from strata_lab.cli import main

    return main([str(a) for a in argv])


def test_claude_code_subagent_that_opens_on_a_reply_keeps_that_call_as_lengths():
    trace, calls, warned = read("cc-2.0-agent-headless.jsonl")
    assert not warned
    first, second, third = calls
    assert {c["session"] for c in calls} == {"5d0c9e2a-7b41-4f38-9c6e-0a1b2c3d4e5f/agent-7e3f9a10"}
    assert (first["fidelity"], first["messages"], first["prompt_len"], first["prompt_tokens"]) == \
        ("lengths", None, 4106, 4106)
    assert HEADLESS in first["notes"] and first["response_tool_calls"][0]["function"]["name"] == "Glob"
    # the later prompts start at that reply (one reply over two lines is one call)
    assert second["fidelity"] == third["fidelity"] == "messages" and HEADLESS_AFTER in third["notes"]
    assert second["messages"][0]["role"] == "assistant" and second["messages"][1]["role"] == "tool"
    assert (second["request_id"], second["cached_tokens"]) == ("msg_H2", 4100)
    st = trace.stats[str(FIX / "cc-2.0-agent-headless.jsonl")]
    assert st["calls"] == 3 and st["fidelity"] == {"lengths": 1, "messages": 2}


def test_claude_code_headless_reply_is_rendered_not_dropped(tmp_path):
    trace = load_trace(FIX / "cc-2.0-agent-headless.jsonl")
    recs = trace.to_dump("qwen3", out=tmp_path / "d.jsonl").records()
    assert len(recs) == 3 and not trace.render_skipped
    assert recs[0]["synthetic_ids"] and len(recs[0]["prompt_ids"]) == 4106


def test_vercel_ai_sdk_spans():
    _, calls, warned = read("vercel-ai-spans.jsonl")
    assert not warned
    # model-call spans only (doGenerate / doStream), not the run around them, the tool span or the embedding
    assert [c["request_id"] for c in calls] == ["chatcmpl-vx1", "chatcmpl-vx2", "b000000000000002",
                                                "c000000000000002", "b000000000000003"]
    step1, step2, other, claude, bare = calls
    assert step1["messages"] == [{"role": "system", "content": "You answer questions about the build."},
                                 {"role": "user", "content": "Which target builds the docs?"}]
    assert step1["response_tool_calls"][0]["function"] == {"name": "readFile", "arguments": {"path": "Makefile"}}
    assert step2["messages"][2]["tool_calls"][0]["function"]["arguments"] == {"path": "Makefile"}
    assert step2["messages"][3] == {"role": "tool", "tool_call_id": "call_mk1", "content": "docs:\n\tmkdocs build"}
    assert (step2["prompt_tokens"], step2["cached_tokens"], step2["finish"]) == (180, 128, "stop")
    # the steps of one run share a session; another trace with the same first prompt is another session
    assert step1["session"] == step2["session"] != other["session"]
    assert other["ts"] == 1767261700.0 and step1["ts"] == 1767261600.0
    # AI SDK 4 names (args / result); an Anthropic model under AI SDK 5: the cache buckets are added
    assert claude["messages"][3]["content"] == '{"matches": ["test:", "test-fast:"]}'
    assert (claude["prompt_tokens"], claude["cached_tokens"], claude["cache_creation_tokens"]) == (2052, 2000, 40)
    assert any("Anthropic input tokens" in n for n in claude["notes"])
    assert (bare["fidelity"], bare["prompt_len"]) == ("lengths", 140)
    assert bare["session"].endswith("trace-0af7651916cd43dd8448eb211c80319c")


def test_openinference_spans():
    _, calls, warned = read("openinference-spans.jsonl")
    assert not warned and len(calls) == 3  # the TOOL and AGENT spans are no calls
    a, b, nested = calls
    assert a["session"] == b["session"] == "rel-7" and a["request_id"] == "0x11aa"
    assert a["tools"][0]["function"]["name"] == "git_tags"
    assert a["response_tool_calls"][0]["function"]["name"] == "git_tags"
    assert b["messages"][3] == {"role": "tool", "content": "v2.1\nv2.2\nv2.3", "tool_call_id": "call_t1"}
    assert (b["prompt_tokens"], b["cached_tokens"], b["response_text"]) == (240, 192, "Yes, v2.3 is tagged.")
    # Phoenix's nested export; a prompt count below the cache read is without it: added
    assert nested["messages"][0]["content"].startswith("Describe this chart.")
    assert (nested["prompt_tokens"], nested["cached_tokens"]) == (1530, 1500)


def test_otel_trace_ids_from_js_span_objects(tmp_path):
    span = {"name": "ai.generateText.doGenerate", "attributes": {
        "ai.prompt.messages": json.dumps([{"role": "user", "content": "same question"}]),
        "ai.response.text": "same answer", "ai.usage.promptTokens": 5}}
    lines = [dict(span, _spanContext={"traceId": t, "spanId": s}) for t, s in (("t1", "s1"), ("t2", "s2"))]
    path = tmp_path / "spans.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    calls = load_trace(path).calls()
    assert len({c["session"] for c in calls}) == 2 and [c["request_id"] for c in calls] == ["s1", "s2"]


def _batch(tmp_path):
    inp = tmp_path / "in.jsonl"
    out = tmp_path / "out.jsonl"
    inp.write_text("".join(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
                                       "body": {"model": "m", "messages": [{"role": "user", "content": f"q{i}"}]}})
                           + "\n" for i in range(2)))
    out.write_text("".join(json.dumps({"id": f"b{i}", "custom_id": f"r{i}", "error": None, "response": {
        "status_code": 200, "body": {"choices": [{"message": {"role": "assistant", "content": "a"}}],
                                     "usage": {"prompt_tokens": 9, "completion_tokens": 1}}}}) + "\n"
                       for i in range(2)))
    return inp, out


def test_batch_input_and_output_are_judged_together(tmp_path, capsys):
    inp, out = _batch(tmp_path)
    trace, calls, _ = read([inp, out])
    assert len(calls) == 2 and trace.stats[str(out)]["joined"] == 2
    assert cli("import", inp, out, "--out", tmp_path / "t.parquet", "-q") == 0
    text = capsys.readouterr().out
    assert "2 of its lines matched input lines on custom_id" in text and "2 calls in 2 sessions" in text


def test_an_import_whose_calls_all_fail_to_render_exits_non_zero(tmp_path, capsys):
    path = tmp_path / "calls.jsonl"  # read, but a role the chat template does not know (a DeepSeek-like log)
    path.write_text(json.dumps({"model": "m", "messages": [{"role": "ipython", "content": "x"}]}) + "\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rc = cli("import", path, "--out", tmp_path / "d.jsonl", "-q")
    err = capsys.readouterr().err
    assert rc == 1 and not (tmp_path / "d.jsonl").exists()
    lines = [x for x in err.splitlines() if "error" in x]
    assert len(lines) == 1 and "none of the 1 calls could be rendered" in lines[0]


def test_an_import_with_no_call_exits_non_zero_with_one_line(tmp_path, capsys):
    path = tmp_path / "spans.jsonl"
    path.write_text(json.dumps({"name": "ai.toolCall", "spanContext": {"traceId": "t", "spanId": "s"},
                                "attributes": {"ai.operationId": "ai.toolCall"}}) + "\n")
    assert cli("import", path, "--out", tmp_path / "t.parquet", "-q") == 1
    err = [x for x in capsys.readouterr().err.splitlines() if "error" in x]
    assert len(err) == 1 and "no calls" in err[0]


def test_generic_reader_finds_nested_message_lists():
    trace, calls, warned = read("generic-nested.json")
    assert trace.detected[str(FIX / "generic-nested.json")][0] == "generic" and not warned
    assert {c["notes"][0] for c in calls} == {f"messages from runs[*].chat.messages ({d})"
                                             for d in ("openai", "anthropic", "gemini")}
    assert len(calls) == 5 and len({c["session"] for c in calls}) == 3
    tool = calls[2]  # the Anthropic tool call, converted by the Anthropic reader's own conversion
    assert tool["response_tool_calls"][0]["function"]["name"] == "ls"
    assert calls[3]["messages"][2]["role"] == "tool"
    assert calls[4]["messages"] == [{"role": "user", "content": "Name one prime above 10."}]
    assert calls[4]["response_text"] == "11"
    _, lines, _ = read("generic-lines.jsonl")
    assert [(c["prompt_tokens"], c["cached_tokens"]) for c in lines] == [(21, 0), (35, 16)]
    assert lines[0]["session"] == lines[1]["session"]  # chained by prefix


def test_messages_path_chooses_the_lists(tmp_path, capsys):
    doc = {"a": {"messages": [{"role": "user", "content": "one"}]},
           "b": [{"msgs": [{"role": "user", "content": "two"}, {"role": "assistant", "content": "2"}]}]}
    path = tmp_path / "x.json"
    path.write_text(json.dumps(doc, indent=1))
    calls = load_trace(path, messages_path="b[*].msgs").calls()
    assert [c["response_text"] for c in calls] == ["2"] and calls[0]["notes"][0] == "messages from b[*].msgs (openai)"
    with pytest.raises(ValueError, match="messages_path: --messages-path reads the files with the generic"):
        load_trace(path, format="openai", messages_path="a.messages")
    with pytest.raises(ValueError, match="messages_path: ''"):
        load_trace(path, messages_path="")
    assert cli("import", path, "--messages-path", "a.messages", "--out", tmp_path / "t.parquet", "-q") == 0
    assert "1 calls in 1 sessions" in capsys.readouterr().out


def test_inspect_prints_what_it_sees_and_imports_nothing(capsys):
    assert cli("import", FIX / "generic-nested.json", "--inspect") == 0
    out = capsys.readouterr().out
    assert "one JSON document" in out and "record keys: experiment (1), harness_version (1), runs (1)" in out
    assert "message list: runs[*].chat.messages (openai)" in out
    assert "reader: generic (message lists at runs[*].chat.messages" in out
    assert cli("import", FIX / "openai.jsonl", "--inspect") == 0
    out = capsys.readouterr().out
    assert "usage-like fields: response.usage.completion_tokens" in out and "reader: openai" in out


def test_a_pretty_printed_file_forced_on_a_json_lines_reader_says_so_once(tmp_path):
    path = tmp_path / "one.json"
    path.write_text(json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, indent=2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ValueError) as exc:
            load_trace(path, format="openai").calls()
    assert not caught
    text = str(exc.value)
    assert "one JSON document (one object over many lines)" in text and "the openai reader" in text
    assert "the generic reader reads it" in text and "--format generic" in text
    with pytest.raises(ValueError, match="the sharegpt reader reads it"):
        load_trace(FIX / "sharegpt.json", format="openai").calls()


def test_cannot_tell_names_what_it_saw_and_the_nearest_reader(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps({"log": "a", "entries_v2": [], "temperature": 0.2}) + "\n")
    with pytest.raises(ValueError) as exc:
        load_trace(path)
    text = str(exc.value)
    assert "its first record's keys are log, entries_v2, temperature" in text and "nearest reader is har" in text
    assert "--format NAME" in text and "pass format=" not in text and "--inspect" in text
    txt = tmp_path / "notes.txt"
    txt.write_text("just some notes\n")
    with pytest.raises(ValueError, match="it starts 'just some notes'"):
        load_trace(txt)


def test_vllm_format_on_a_file_that_is_no_vllm_log_does_not_ask_to_restart_vllm(tmp_path):
    txt = tmp_path / "app.log"
    txt.write_text("2026-01-01 started\n2026-01-01 stopped\n")
    trace, calls, _ = read(txt, format="vllm-log")
    why = trace.stats[str(txt)]["why_none"]
    assert not calls and why.startswith("not a vLLM log") and "--enable-log-requests" not in why
    trace, _, _ = read("vllm-default.log", format="vllm-log")  # a real vLLM log without request logging
    assert "--enable-log-requests" in trace.stats[str(FIX / "vllm-default.log")]["why_none"]
    trace, _, _ = read("generic-lines.jsonl", format="vllm-log")
    assert "the generic reader reads it" in trace.stats[str(FIX / "generic-lines.jsonl")]["why_none"]


def test_a_json_array_forced_on_a_reader_of_another_kind_names_the_one_that_reads_it(tmp_path, capsys):
    # sharegpt reads JSON arrays too: each OpenHands event is skipped, and the one error line says which reader
    # reads the file
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert cli("import", FIX / "openhands-trajectory.json", "--format", "sharegpt", "--out", tmp_path / "d.jsonl",
                   "-q") == 1
    err = [x for x in capsys.readouterr().err.splitlines() if ": error: " in x]
    assert len(err) == 1 and "every record was skipped" in err[0]
    assert "the openhands reader reads it" in err[0] and "pass --format openhands" in err[0]


def test_an_unknown_format_name_suggests_the_nearest(tmp_path):
    with pytest.raises(ValueError, match=r"format: unknown 'opneai' \(did you mean --format openai\?\)"):
        load_trace(FIX / "openai.jsonl", format="opneai")


TEMPLATES = Path(__file__).parent / "fixtures" / "templates"


@pytest.mark.parametrize("path", sorted(TEMPLATES.glob("deepseek-ai-*.jinja")) + sorted(
    (TEMPLATES / "llama.cpp").glob("deepseek-ai-*.jinja")), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_deepseek_template_renders_every_call_of_a_tool_call_log(path):
    # DeepSeek's own templates (V3.1 as shipped, R1 (whose tool-call part is V3's), the distills, V3.2, V4) and
    # llama.cpp's copies: a template that cannot take parsed arguments renders those calls with the JSON string
    from strata_lab.text.template import ChatTemplate
    from strata_lab.traces.render import STRING_ARGUMENTS

    trace = load_trace(FIX / "openai-deepseek-tools.jsonl")
    df = trace.render_check("qwen3", ChatTemplate.from_file(path))
    assert len(df) == 4 and trace.render_skipped == []
    notes = [STRING_ARGUMENTS in n for n in df["notes"]]
    assert all(notes) or not any(notes)  # per call, and the same for every tool-call turn of one template


def test_a_forced_reader_that_skips_the_first_records_names_the_one_that_reads_it_and_stops_warning():
    # 15 OpenHands events forced onto sharegpt: three warnings, then one naming the reader, then none
    trace, _, said = read("openhands-trajectory.json", format="sharegpt")
    assert len(said) == 4 and all(": skipped: " in s for s in said[:3])
    assert "its first 3 records do not fit the sharegpt reader; the openhands reader reads it" in said[3]
    assert trace.stats[str(FIX / "openhands-trajectory.json")]["skipped"] == 15
