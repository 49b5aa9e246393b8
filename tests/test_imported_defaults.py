"""An imported log gets one answer wherever a default applies (issue 49): `replay` with no engine and
`--engine strata` replay the same engine (the kind the log's model names, turn-start checkpoints: a log of
another server recorded no snapshots of ours); `rewrite` says there is no recorded run to compare with; and
`lint --fix` on the shipped log whose system prompt carries the time moves it, judged on the engine asked for,
with what the fix gains shown per engine."""
import json
import os

import pytest

from strata_lab.cli import main

ROOT = os.path.join(os.path.dirname(__file__), "..")
DATED = os.path.join(ROOT, "dumps", "logs", "openai-dated.jsonl")
AGENT = os.path.join(ROOT, "dumps", "agent.jsonl")


@pytest.fixture(scope="module")
def dated(tmp_path_factory):
    out = tmp_path_factory.mktemp("dated") / "dated.jsonl"
    assert main(["import", DATED, "--tokenizer", "qwen3", "--out", str(out), "-q"]) == 0
    return out


def test_replay_default_is_strata_with_the_dumps_kind_and_turn_checkpoints(dated, qwen3):
    import strata_lab as sl

    plain, named = sl.replay(dated, tokenizer=qwen3), sl.replay(dated, "strata", tokenizer=qwen3)
    assert plain.summary().equals(named.summary())
    assert plain.specs == ["strata@1:checkpoints=turn,kind=attention"]     # the log names qwen3-8b
    told = sl.replay(dated, "strata:kind=hybrid", tokenizer=qwen3)
    assert told.specs == ["strata@1:checkpoints=turn,kind=hybrid"]
    # our own recordings keep their recorded checkpoints and the hybrid kind they name
    assert sl.replay(AGENT, tokenizer=qwen3).specs == ["strata@1"]


def test_replay_cli_default_equals_engine_strata(dated, tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert main(["replay", str(dated), "-q", "--json", str(a)]) == 0
    assert main(["replay", str(dated), "-q", "--engine", "strata", "--json", str(b)]) == 0
    ea, eb = json.loads(a.read_text())["engines"], json.loads(b.read_text())["engines"]
    assert ea == eb and ea[0]["spec"] == "strata@1:checkpoints=turn,kind=attention"
    # a setting given stays as given, even one equal to the preset's
    assert main(["replay", str(dated), "-q", "--model", "hybrid", "--json", str(a)]) == 0
    assert json.loads(a.read_text())["engines"][0]["spec"] == "strata@1:checkpoints=turn,kind=hybrid"


def test_rewrite_of_an_imported_log_says_there_is_no_recorded_run(dated, tmp_path):
    from strata_lab.sessions import rewrite

    r = rewrite(dated, tmp_path / "rw.jsonl", policy="header")
    text = r.summary()
    assert "fewer tokens read than recorded" not in text and "no recorded engine run" in text
    assert "an imported openai log" in text and all(row["recorded_read"] is None for row in r.rows)


def test_reproduce_of_an_imported_log_says_there_is_nothing_recorded_to_compare(dated, capsys):
    pytest.importorskip("strata_lab._engine")
    assert main(["reproduce", str(dated), "-q"]) == 0
    text = capsys.readouterr().out
    assert "the dump records no reused to compare (an imported openai log)" in text
    assert "than recorded" not in text


def test_lint_fix_on_the_dated_log_moves_the_time_and_shows_each_engine(dated, tmp_path, capsys, qwen3):
    out = tmp_path / "fixed.jsonl"
    assert main(["lint", str(dated), "--engine", "vllm", "--fix", str(out), "-q"]) == 0
    text = capsys.readouterr().out
    assert "kept: volatile_system in session(s) openai-dated-1, openai-dated-2" in text
    assert "(not asked for)" in text and "reread_before" in text and "per engine (judged" in text
    for line in open(out, encoding="utf-8"):
        prompt = qwen3.decode(json.loads(line)["prompt_ids"])
        system = prompt[:prompt.index("<|im_end|>")]
        assert "Current time" not in system and prompt.count("Current time: 2026-12-01T09:") == 1
    vllm = next(row for row in text.splitlines() if row.strip().startswith("vllm@"))
    before, after = (float(x) for x in vllm.split()[-2:])
    assert after > before                                            # the hit rate on vLLM rises


def test_lint_reads_a_log_as_its_import_reads_it(dated, tmp_path, capsys):
    # the log itself, rendered as `import` renders it: the same findings as on the imported dump, and --fix writes
    # a dump (an output never overwrites the input)
    assert main(["lint", DATED, "-q"]) == 1
    raw = [x for x in capsys.readouterr().out.splitlines() if x.startswith("volatile_system")]
    assert main(["lint", str(dated), "-q"]) == 1
    assert raw == [x for x in capsys.readouterr().out.splitlines() if x.startswith("volatile_system")] and len(raw) == 4
    out = tmp_path / "fixed.jsonl"
    assert main(["lint", DATED, "--engine", "vllm", "--fix", str(out), "-q"]) == 0
    assert "kept: volatile_system" in capsys.readouterr().out and out.stat().st_size > 0
    # a file no reader reads is one line, before any work
    bad = tmp_path / "notes.txt"
    bad.write_text("nothing here is a log\n")
    assert main(["lint", str(bad), "-q"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "error" in err[0]


def test_lint_default_engines_are_those_the_dump_names(dated, qwen3):
    from strata_lab.caches.lint import dump_engines

    assert dump_engines(dated) == ["strata"] and dump_engines(AGENT) == ["strata"]


def test_each_call_says_how_its_tool_call_arguments_were_rendered(dated):
    from strata_lab import ChatTemplate, load_trace
    from strata_lab.traces.render import MAPPING_ARGUMENTS, STRING_ARGUMENTS

    recs = [json.loads(line) for line in open(dated, encoding="utf-8")]
    assert all(r["render_notes"] == [MAPPING_ARGUMENTS] for r in recs)        # every call holds a tool call
    # DeepSeek's own V3.1 template splices strings: those calls say so, and only so
    fixtures = os.path.join(os.path.dirname(__file__), "fixtures")
    tmpl = ChatTemplate.from_file(os.path.join(fixtures, "templates", "deepseek-ai-DeepSeek-V3.1.jinja"))
    df = load_trace(os.path.join(fixtures, "traces", "openai-deepseek-tools.jsonl")).render_check("qwen3", tmpl)
    assert all(STRING_ARGUMENTS in n and MAPPING_ARGUMENTS not in n for n in df["notes"])


def test_id_level_chaining_is_unmasked_and_says_so():
    """A timestamp early in the prompt splits an id-level log's calls (the rule says so); message-level
    chaining masks it (tests/test_lint_templates.py)."""
    from strata_lab.traces.log_calls import CHAINING_RULE, SessionChain

    chain = SessionChain("ids")
    head = list(range(1000, 1100))
    first = chain.session_of_ids(head + [7, 7] + list(range(2000, 2100)), [5, 5])
    again = chain.session_of_ids(head + [7, 8] + list(range(2000, 2100)) + [5, 5, 9], [])
    assert first != again and "compared unmasked" in CHAINING_RULE and "--session-key" in CHAINING_RULE


def test_tool_definitions_sent_in_another_key_order_are_the_clients_edit():
    from strata_lab.traces.habits import history_change

    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    prev = {"messages": [{"role": "user", "content": "hi"}], "tools": [tool], "response_text": "yes"}
    now = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yes"},
                        {"role": "user", "content": "more"}], "tools": [{"function": tool["function"], "type": "function"}]}
    change = history_change(prev, now)
    assert change["habit"] == "history_edit" and change["message"] is None and "key" in change["text"]
    assert history_change(prev, {**now, "tools": [tool]}) is None
