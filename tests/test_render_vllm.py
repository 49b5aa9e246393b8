"""Templates as vLLM renders them, on an OpenAI-SDK agent log (assistant `content: null` beside `tool_calls`,
tool-call `arguments` as JSON strings, `reasoning_content` sent back) with a DeepSeek-V3.1-style template that
is not append-only and drops reasoning: every call renders to the prompt_tokens a vLLM-like server (transformers'
own template rendering of vLLM's post-processed messages) reports, every reconstructed reply is what the model
generated (its completion_tokens), and a mismatch is reported per call."""
import copy
import json
from pathlib import Path

import pytest

import tokenizer_families as tf
from strata_lab import load_trace
from strata_lab.cli import main

HERE = Path(__file__).parent
LOG = HERE / "fixtures" / "usage" / "openai-sdk-agent.jsonl"
TEMPLATE = HERE / "fixtures" / "templates" / "deepseek_v31_style.jinja"
EOS = "<｜end▁of▁sentence｜>"


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    folder = tf.build("deepseek_v3", tmp_path_factory.mktemp("deepseek"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": TEMPLATE.read_text(), "bos_token": "<｜begin▁of▁sentence｜>", "eos_token": EOS}))
    return folder


def _vllm_like(messages):
    """vLLM's chat utils, written out independently: None content -> "", tool_calls None dropped, arguments
    parsed (empty -> {}), only the fields vLLM passes on."""
    out = []
    for m in copy.deepcopy(messages):
        msg = {"role": m["role"], "content": m.get("content") or ""}
        if m.get("tool_calls"):
            msg["tool_calls"] = [{**c, "function": {"name": c["function"]["name"], "arguments":
                                  json.loads(c["function"]["arguments"]) if c["function"]["arguments"] else {}}}
                                 for c in m["tool_calls"]]
        for k in ("tool_call_id", "reasoning_content"):
            if k in m:
                msg[k] = m[k]
        out.append(msg)
    return out


def _generated(message, thinking: bool, after_tool: bool) -> str:
    """What a DeepSeek-V3.1 model writes after the generation prompt (its output format)."""
    text = (message.get("reasoning_content", "") + "</think>") if thinking and not after_tool else ""
    text += message.get("content") or ""
    if message.get("tool_calls"):
        text += "<｜tool▁calls▁begin｜>" + "".join(
            f"<｜tool▁call▁begin｜>{c['function']['name']}<｜tool▁sep｜>"
            f"{json.dumps(json.loads(c['function']['arguments']), ensure_ascii=False)}<｜tool▁call▁end｜>"
            for c in message["tool_calls"]) + "<｜tool▁calls▁end｜>"
    return text + EOS


@pytest.fixture(scope="module")
def served(model_folder, tmp_path_factory):
    """The fixture log with the usage a vLLM-like server reports (prompt_tokens, completion_tokens)."""
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_file=str(model_folder / "tokenizer.json"),
                                 bos_token="<｜begin▁of▁sentence｜>", eos_token=EOS)
    hf.chat_template = TEMPLATE.read_text()
    path = tmp_path_factory.mktemp("log") / "agent.jsonl"
    expected = []
    with open(path, "w") as f:
        for line in LOG.read_text().splitlines():
            rec = json.loads(line)
            req, msg = rec["request"], rec["response"]["choices"][0]["message"]
            kw = req.get("chat_template_kwargs", {})
            text = hf.apply_chat_template(_vllm_like(req["messages"]), tools=req.get("tools"), tokenize=False,
                                          add_generation_prompt=True, **kw)
            gen = _generated(msg, kw.get("thinking", False), req["messages"][-1]["role"] == "tool")
            rec["response"]["usage"].update(prompt_tokens=len(hf.encode(text, add_special_tokens=False)),
                                            completion_tokens=len(hf.encode(gen, add_special_tokens=False)))
            expected.append(gen)
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    return path, expected


def test_sdk_shaped_calls_all_render_exactly_with_the_replies_the_model_wrote(model_folder, served, tmp_path):
    path, expected = served
    trace = load_trace(path)
    dump = trace.to_dump(model_folder, out=tmp_path / "d.jsonl")
    recs = dump.records()
    assert trace.render_skipped == [] and len(recs) == len(expected) == 7   # none skipped (content: null broke the template)
    assert [r["render_exact"] for r in recs] == [True] * 7, [(r["source"], r["render_diff"]) for r in recs]
    from strata_lab import load_tokenizer

    tok = load_tokenizer(model_folder)
    assert [tok.decode(r["gen_ids"]) for r in recs] == expected  # not just the end-of-turn token
    assert [r["reply_exact"] for r in recs] == [True] * 7
    assert all(r["reported_completion_tokens"] == len(r["gen_ids"]) for r in recs)


def test_mismatches_are_reported_per_call(model_folder, served, tmp_path, capsys):
    path, _ = served
    lines = path.read_text().splitlines()
    bad = json.loads(lines[2])
    bad["response"]["usage"]["prompt_tokens"] += 3
    bad["response"]["usage"]["completion_tokens"] -= 2
    lines[2] = json.dumps(bad, ensure_ascii=False)
    log = tmp_path / "agent.jsonl"
    log.write_text("\n".join(lines) + "\n")
    assert main(["import", str(log), "--tokenizer", str(model_folder), "--out", str(tmp_path / "d.jsonl"),
                 "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "render check: 6/7 calls render to exactly the prompt_tokens the log reports" in out
    assert f"{log}:3: rendered " in out and "(-3)" in out
    assert "reply check: 6/7" in out and "(+2)" in out


def test_render_check_has_a_row_per_call(model_folder, served):
    path, _ = served
    df = load_trace(path).render_check(model_folder)
    assert len(df) == 7 and df["render_exact"].all() and df["reply_exact"].all()
    assert (df["reply_len"] == df["completion_tokens"]).all()


def test_arguments_that_are_not_json_stay_a_string_and_say_so():
    from strata_lab.traces.render import vllm_messages

    notes = []
    m = vllm_messages([{"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": "{not json"}},
        {"type": "function", "function": {"name": "g", "arguments": ""}}]}], notes)
    assert [c["function"]["arguments"] for c in m[0]["tool_calls"]] == ["{not json", {}]
    assert notes == ["tool-call arguments not JSON: rendered as the string"]


def test_replaying_the_log_reports_the_mismatching_call(model_folder, served, tmp_path, capsys):
    path, _ = served
    lines = path.read_text().splitlines()
    bad = json.loads(lines[4])
    bad["response"]["usage"]["prompt_tokens"] -= 5
    lines[4] = json.dumps(bad, ensure_ascii=False)
    log = tmp_path / "agent.jsonl"
    log.write_text("\n".join(lines) + "\n")
    assert main(["replay", str(log), "--tokenizer", str(model_folder), "--engine", "vllm", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "render check: 6/7 calls" in out and f"{log}:5: rendered " in out and "(+5)" in out
