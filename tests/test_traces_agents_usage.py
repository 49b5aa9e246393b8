"""Issue 48, "Done when", shape by shape: each agent trace shape imports with its calls and sessions, the prompts
where the file holds them (not length-only), and the reported usage (prompt, cache read, cache write, output:
whichever the file has) summed within 2 % of the file's own totals, computed here from the raw file by the
tool's own semantics, never through our readers."""
import json
import shutil
import warnings
from pathlib import Path

import pytest

from strata_lab import load_trace
from strata_lab.traces import TraceWarning

FIX = Path(__file__).parent / "fixtures" / "traces"
KEYS = ("prompt_tokens", "cached_tokens", "cache_read_tokens", "cache_creation_tokens", "completion_tokens")


def _lines(name):
    out = []
    for line in (FIX / name).read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # the fixtures' torn lines
        if isinstance(rec, dict):
            out.append(rec)
    return out


def _doc(name):
    return json.loads((FIX / name).read_text())


def _total(rows):
    """{key: sum} over dicts of the four counts (a key absent from every row is left out)."""
    out = {}
    for row in rows:
        for k, v in row.items():
            if v is not None:
                out[k] = out.get(k, 0) + v
    return out


def _mini_swe_agent():  # mini-swe-agent 2.x: litellm responses kept in the messages' extra.response
    usages = [m["extra"]["response"]["usage"] for m in _doc("mini-swe-agent.traj.json")["messages"]
              if "response" in m.get("extra", {})]
    return _total({"prompt_tokens": u["prompt_tokens"], "completion_tokens": u["completion_tokens"],
                   "cache_read_tokens": u["prompt_tokens_details"]["cached_tokens"]} for u in usages)


def _mini_swe_agent_1():  # 1.x, an Anthropic model through litellm (prompt_tokens holds the cache buckets)
    usages = [m["extra"]["response"]["usage"] for m in _doc("mini-swe-agent-1.traj.json")["messages"]
              if m["role"] == "assistant"]
    return _total({"prompt_tokens": u["prompt_tokens"], "completion_tokens": u["completion_tokens"],
                   "cache_read_tokens": u["cache_read_input_tokens"],
                   "cache_creation_tokens": u["cache_creation_input_tokens"]} for u in usages)


def _openhands_v0():  # the last event's accumulated_token_usage is the run's total
    acc = [e for e in _doc("openhands-trajectory.json") if "llm_metrics" in e][-1]["llm_metrics"][
        "accumulated_token_usage"]
    return {"prompt_tokens": acc["prompt_tokens"], "completion_tokens": acc["completion_tokens"],
            "cache_read_tokens": acc["cache_read_tokens"], "cache_creation_tokens": acc["cache_write_tokens"]}


def _openhands_eval():  # one line per instance, each with its accumulated_token_usage
    accs = [r["metrics"]["accumulated_token_usage"] for r in _lines("openhands-eval-output.jsonl")]
    return _total({"prompt_tokens": a["prompt_tokens"], "completion_tokens": a["completion_tokens"],
                   "cache_read_tokens": a["cache_read_tokens"], "cache_creation_tokens": a["cache_write_tokens"]}
                  for a in accs)


def _cline():  # Cline's api_req_started: tokensIn, cacheReads and cacheWrites are disjoint
    reqs = [json.loads(m["text"]) for m in _doc("cline-task/ui_messages.json") if m.get("say") == "api_req_started"]
    return _total({"prompt_tokens": r["tokensIn"] + r["cacheReads"] + r["cacheWrites"],
                   "cache_read_tokens": r["cacheReads"], "cache_creation_tokens": r["cacheWrites"],
                   "completion_tokens": r["tokensOut"]} for r in reqs)


def _roo():  # Roo Code's api_req_started: tokensIn is the whole input (its cost helpers' totalInputTokens)
    reqs = [json.loads(m["text"]) for m in _doc("roo-task/ui_messages.json") if m.get("say") == "api_req_started"]
    return _total({"prompt_tokens": r["tokensIn"], "cache_read_tokens": r["cacheReads"],
                   "cache_creation_tokens": r["cacheWrites"], "completion_tokens": r["tokensOut"]}
                  for r in reqs if "tokensIn" in r)


def _gemini(tokens):
    return _total({"prompt_tokens": t["input"], "cache_read_tokens": t["cached"], "completion_tokens": t["output"]}
                  for t in tokens)


def _gemini_jsonl():  # a message written again replaces its earlier copy (same id); $rewindTo drops none of ours
    last = {}
    for rec in _lines("gemini-cli-session.jsonl"):
        if rec.get("type") == "gemini" and rec.get("tokens"):
            last[rec["id"]] = rec["tokens"]
    return _gemini(last.values())


def _gemini_json():
    return _gemini(m["tokens"] for m in _doc("gemini-cli-legacy.json")["messages"] if m["type"] == "gemini")


def _claude_code(name):
    """Per message.id, the last line's usage (a reply streamed over several lines repeats it); Anthropic's three
    input buckets are disjoint. Lines Claude Code writes itself (model <synthetic>) are no API call."""
    last = {}
    for rec in _lines(name):
        msg = rec.get("message")
        if rec.get("type") == "assistant" and isinstance(msg, dict) and msg.get("model") != "<synthetic>":
            last[msg["id"]] = msg["usage"]
    return _total({"prompt_tokens": u["input_tokens"] + u["cache_read_input_tokens"]
                   + u["cache_creation_input_tokens"], "cache_read_tokens": u["cache_read_input_tokens"],
                   "cache_creation_tokens": u["cache_creation_input_tokens"], "completion_tokens": u["output_tokens"]}
                  for u in last.values())


def _managed_agents():  # the last cumulative session.usage
    u = [e["usage"] for e in _lines("managed-agents-events.jsonl") if e.get("type") == "session.usage"][-1]
    read, write = u["cache_read_input_tokens"], u["cache_creation"]["ephemeral_5m_input_tokens"]
    return {"prompt_tokens": u["input_tokens"] + read + write, "cache_read_tokens": read,
            "cache_creation_tokens": write, "completion_tokens": u["output_tokens"]}


def _langsmith():
    """llm runs: langchain's usage_metadata (input_tokens holds the cache buckets) or the run's own counts."""
    rows = []
    for r in _lines("langsmith-runs.jsonl"):
        if r["run_type"] != "llm" or not r.get("outputs"):
            continue
        if "generations" in r["outputs"]:
            u = r["outputs"]["generations"][0][0]["message"]["kwargs"]["usage_metadata"]
            d = u["input_token_details"]
            rows.append({"prompt_tokens": u["input_tokens"], "completion_tokens": u["output_tokens"],
                         "cache_read_tokens": d["cache_read"], "cache_creation_tokens": d["cache_creation"]})
        else:
            rows.append({"prompt_tokens": r["prompt_tokens"], "completion_tokens": r["completion_tokens"],
                         "cache_read_tokens": r["prompt_token_details"]["cache_read"]})
    return _total(rows)


def _openinference():
    """LLM spans' llm.token_count.*; a prompt count below its cache read does not hold it (Anthropic's input
    tokens as some instrumentations report them): the buckets are added."""
    rows = []
    for r in _lines("openinference-spans.jsonl"):
        a = r["attributes"]
        if (a.get("openinference.span.kind") or r.get("span_kind")) != "LLM":
            continue
        p, read = a["llm.token_count.prompt"], a.get("llm.token_count.prompt_details.cache_read", 0)
        write = a.get("llm.token_count.prompt_details.cache_write", 0)
        rows.append({"prompt_tokens": p if p >= read else p + read + write, "cache_read_tokens": read,
                     "cache_creation_tokens": write, "completion_tokens": a["llm.token_count.completion"]})
    return _total(rows)


def _vercel():
    """Model-call spans (doGenerate / doStream; AI SDK 4 promptTokens, 5 inputTokens); an Anthropic model's
    promptTokens leaves out the cache read and write (providerMetadata): added."""
    rows = []
    for r in _lines("vercel-ai-spans.jsonl"):
        a = r["attributes"]
        if not a.get("ai.operationId", "").endswith((".doGenerate", ".doStream")):
            continue
        p = a.get("ai.usage.inputTokens", a.get("ai.usage.promptTokens"))
        read = a.get("ai.usage.cachedInputTokens", 0)
        write = json.loads(a.get("ai.response.providerMetadata", "{}")).get("anthropic", {}).get(
            "cacheCreationInputTokens", 0)
        rows.append({"prompt_tokens": p + read + write if p < read else p, "cache_read_tokens": read,
                     "cache_creation_tokens": write,
                     "completion_tokens": a.get("ai.usage.outputTokens", a.get("ai.usage.completionTokens"))})
    return _total(rows)


def _responses():
    rows = [r["response"]["usage"] for r in _lines("openai-responses.jsonl")
            if isinstance(r.get("response"), dict) and r["response"].get("usage")]
    return _total({"prompt_tokens": u["input_tokens"], "cache_read_tokens": u["input_tokens_details"]["cached_tokens"],
                   "completion_tokens": u["output_tokens"]} for u in rows)


# shape -> (fixture, format, calls, sessions, length-only calls (the file lacks their prompt), file totals or None
# where the file reports no per-call usage)
SHAPES = {
    "SWE-agent 0.x": ("swe-agent-0.7.traj", "swe-agent", 3, 1, 0, None),
    "SWE-agent 1.x": ("swe-agent-1.1.traj", "swe-agent", 4, 1, 0, None),
    "mini-swe-agent 2.x": ("mini-swe-agent.traj.json", "mini-swe-agent", 4, 1, 0, _mini_swe_agent),
    "mini-swe-agent 1.x": ("mini-swe-agent-1.traj.json", "mini-swe-agent", 3, 1, 0, _mini_swe_agent_1),
    "OpenHands V0": ("openhands-trajectory.json", "openhands", 4, 1, 0, _openhands_v0),
    "OpenHands V1 eval": ("openhands-eval-output.jsonl", "openhands-eval", 4, 2, 0, _openhands_eval),
    "Cline folder": ("cline-task", "cline", 3, 1, 0, _cline),
    "Roo Code folder": ("roo-task", "cline", 3, 1, 0, _roo),
    "aider history": ("aider.llm.history", "aider", 3, 1, 0, None),
    "Gemini CLI JSONL": ("gemini-cli-session.jsonl", "gemini-cli", 4, 1, 0, _gemini_jsonl),
    "Gemini CLI JSON": ("gemini-cli-legacy.json", "gemini-cli", 3, 1, 0, _gemini_json),
    "Claude Code 2.x session": ("claude-code-session.jsonl", "claude-code", 3, 1, 0,
                                lambda: _claude_code("claude-code-session.jsonl")),
    "Claude Code 2.x subagent": ("claude-code-agent-a1b2c3.jsonl", "claude-code", 2, 1, 0,
                                 lambda: _claude_code("claude-code-agent-a1b2c3.jsonl")),
    "Claude Code 2.x subagent, prompt elsewhere": ("cc-2.0-agent-headless.jsonl", "claude-code", 3, 1, 1,
                                                   lambda: _claude_code("cc-2.0-agent-headless.jsonl")),
    "Claude Code 2.x compact + rewind": ("cc-2.1-compact-rewind.jsonl", "claude-code", 5, 1, 0,
                                         lambda: _claude_code("cc-2.1-compact-rewind.jsonl")),
    "Claude Code 1.0 sidechains": ("cc-1.0-subagents.jsonl", "claude-code", 8, 3, 0,
                                   lambda: _claude_code("cc-1.0-subagents.jsonl")),
    # the compacted call's prompt is not in the events (agent.thread_context_compacted): length-only
    "Anthropic agent-session events": ("managed-agents-events.jsonl", "managed-agents", 4, 1, 1, _managed_agents),
    "LangSmith runs": ("langsmith-runs.jsonl", "langsmith", 3, 2, 0, _langsmith),
    "OpenInference spans": ("openinference-spans.jsonl", "otel", 3, 2, 0, _openinference),
    # one span recorded with recordInputs: false (no prompt in the file)
    "Vercel AI SDK spans": ("vercel-ai-spans.jsonl", "otel", 5, 4, 1, _vercel),
    "OpenAI Responses input items": ("openai-responses.jsonl", "openai-responses", 3, 2, 0, _responses),
}


def read(name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)
        trace = load_trace(FIX / name)
        return trace, trace.calls()


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_shape_calls_prompts_and_usage_against_the_files_own_totals(shape):
    name, fmt, n_calls, n_sessions, n_lengths, totals = SHAPES[shape]
    trace, calls = read(name)
    assert {v[0] for v in trace.detected.values()} == {fmt}
    assert len(calls) == n_calls and len({c["session"] for c in calls}) == n_sessions
    # the prompts the file holds are messages, not lengths
    assert sum(c["fidelity"] == "lengths" for c in calls) == n_lengths
    assert all(c["messages"] for c in calls if c["fidelity"] != "lengths")
    assert all(c["prompt_tokens"] for c in calls if c["fidelity"] == "lengths")  # kept with their usage
    if totals is None:  # the file reports no per-call usage: none is made up
        assert all(c[k] is None for c in calls for k in KEYS)
        return
    want = totals()
    assert want.get("prompt_tokens") and want.get("completion_tokens")
    for key, expect in want.items():
        # the cache read is every reader's cached_tokens (cache_read_tokens is set by the Anthropic-shaped ones)
        got = sum(c["cached_tokens" if key == "cache_read_tokens" else key] or 0 for c in calls)
        assert abs(got - expect) <= 0.02 * max(expect, 1), (shape, key, got, expect)


@pytest.mark.parametrize("name", ["swe-agent-0.7.traj", "swe-agent-1.1.traj"])
def test_swe_agent_totals_are_the_files_facts(name):
    # SWE-agent keeps token totals for the whole run only (info.model_stats): they are reported as the file's
    # facts, beside calls that carry no usage
    stats = _doc(name)["info"]["model_stats"]
    trace, calls = read(name)
    (fact,) = trace.stats[str(FIX / name)]["facts"]
    assert f"tokens_sent {stats['tokens_sent']:,}" in fact and f"tokens_received {stats['tokens_received']:,}" in fact
    assert len(calls) == stats["api_calls"]


def test_vercel_run_span_totals_its_steps():
    # the run span (ai.generateText) reports its steps' total prompt tokens: the two steps read add up to it
    run = next(r for r in _lines("vercel-ai-spans.jsonl") if r["attributes"].get("ai.operationId") == "ai.generateText")
    trace_id = run["spanContext"]["traceId"] if "spanContext" in run else run["traceId"]
    _, calls = read("vercel-ai-spans.jsonl")
    mine = [c for c in calls if c["session"].endswith(trace_id) or c["request_id"] in ("chatcmpl-vx1", "chatcmpl-vx2")]
    assert len(mine) == 2 and sum(c["prompt_tokens"] for c in mine) == run["attributes"]["ai.usage.promptTokens"]


def test_claude_code_2x_compact_boundary_and_rewind():
    trace, calls = read("cc-2.1-compact-rewind.jsonl")
    first, second, third, rewound, compacted = calls
    text = [[m.get("content") for m in c["messages"]] for c in calls]
    assert text[0] == ["Add a --verbose flag to cli.py"]
    assert first["response_reasoning"] == "Read cli.py first." and first["completion_tokens"] == 74  # last line
    assert second["messages"][2]["role"] == "tool" and third["messages"][-1]["content"] == "Make -v a short form as well."
    # /rewind: the new prompt hangs on the reply before "Make -v ...": that turn and its reply are gone
    assert text[3][-1] == "Call it --debug instead." and "Make -v a short form as well." not in text[3]
    assert rewound["messages"][:4] == third["messages"][:4]
    # /compact: the history starts over at the summary
    assert compacted["messages"][0]["content"].startswith("This session is being continued")
    assert text[4][1:] == ["Now add a test for the flag."]
    assert (compacted["cache_read_tokens"], compacted["cache_creation_tokens"]) == (0, 2890)


def test_claude_code_2x_folder_with_subagents_subfolder(tmp_path):
    # Claude Code 2.1 writes a session's subagents to <sessionId>/subagents/agent-<id>.jsonl: the project folder
    # reads as the session and its subagent, each its own session
    sid = "7f1c2e9a-0b4d-4c55-9a1e-3d2f6b8c9e01"
    (tmp_path / sid / "subagents").mkdir(parents=True)
    shutil.copy(FIX / "claude-code-session.jsonl", tmp_path / f"{sid}.jsonl")
    shutil.copy(FIX / "claude-code-agent-a1b2c3.jsonl", tmp_path / sid / "subagents" / "agent-a1b2c3.jsonl")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)
        calls = load_trace(tmp_path).calls()
    assert len(calls) == 5 and {c["session"] for c in calls} == {sid, f"{sid}/agent-a1b2c3"}


def test_roo_code_condense_starts_the_request_over_at_its_summary():
    hist = _doc("roo-task/api_conversation_history.json")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trace = load_trace(FIX / "roo-task")
        calls = trace.calls()
    assert set(trace.stats) == {str(FIX / "roo-task" / "api_conversation_history.json")}
    assert [str(w.message).split(": skipped: ")[1] for w in caught if issubclass(w.category, TraceWarning)] == [
        "the task-list entry (totals) of a Cline / Roo Code task folder (no model calls; "
        "api_conversation_history.json holds them)"]
    first, second, after = calls
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "tool", "user"]
    # every message before the summary carries condenseParent: the third request is the summary alone
    assert len(after["messages"]) == 1 and after["messages"][0]["content"][0]["text"].startswith(
        "## Conversation Summary")
    assert "messages 0..4 condensed into the summary at message 5 (not sent)" in after["notes"]
    assert after["response_tool_calls"][0]["function"]["name"] == "attempt_completion"
    # the task's own totals (history_item.json, what Roo's task list shows) against the calls' usage
    item = _doc("roo-task/history_item.json")
    for key, theirs in (("prompt_tokens", "tokensIn"), ("completion_tokens", "tokensOut"),
                        ("cache_read_tokens", "cacheReads"), ("cache_creation_tokens", "cacheWrites")):
        assert abs(sum(c[key] for c in calls) - item[theirs]) <= 0.02 * item[theirs], key
    assert hist[5]["isSummary"] and all(m.get("condenseParent") == hist[5]["condenseId"] for m in hist[:5])


def test_roo_code_truncation_marker_hides_its_messages(tmp_path):
    task = tmp_path / "t"
    shutil.copytree(FIX / "roo-task", task)
    hist = _doc("roo-task/api_conversation_history.json")[:5]
    for m in hist:
        m.pop("condenseParent")
    # a sliding-window truncation hid messages 1..2 (the read and its result) for the third request
    for m in hist[1:3]:
        m["truncationParent"] = "tr-1"
    hist.insert(3, {"role": "user", "content": "[Sliding window truncation: 2 messages hidden to reduce context]",
                    "isTruncationMarker": True, "truncationId": "tr-1"})
    hist.append({"role": "assistant", "content": [{"type": "text", "text": "Done."}]})
    (task / "api_conversation_history.json").write_text(json.dumps(hist))
    # the truncation was made for the third request (after its api_req_started), as Roo's attemptApiRequest does
    ui = _doc("roo-task/ui_messages.json")
    at = [k for k, m in enumerate(ui) if m.get("say") == "api_req_started"][2] + 1
    ui.insert(at, {"ts": ui[at - 1]["ts"] + 1, "type": "say", "say": "sliding_window_truncation", "contextTruncation": {
        "truncationId": "tr-1", "messagesRemoved": 2, "prevContextTokens": 13300, "newContextTokens": 9000}})
    (task / "ui_messages.json").write_text(json.dumps(ui))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)
        calls = load_trace(task).calls()
    # the marker sits before message 4, which request 1 ended with, but came in force at request 2
    assert [m["role"] for m in calls[1]["messages"]] == ["user", "assistant", "tool", "user"]
    assert [m["role"] for m in calls[2]["messages"]] == ["user", "user", "assistant", "tool", "user"]
    assert calls[2]["messages"][1]["content"].startswith("[Sliding window truncation")
    assert "2 messages hidden by a sliding-window truncation marker" in calls[2]["notes"]
    # the history alone: the marker is taken to hold from its position (noted)
    (task / "ui_messages.json").unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)
        calls = load_trace(task / "api_conversation_history.json").calls()
    assert [m["role"] for m in calls[1]["messages"]] == ["user", "user"]
    assert any("not known without ui_messages.json" in n for n in calls[1]["notes"])
