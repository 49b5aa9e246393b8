"""What a log reports as cached, against the replay: rates are shares of the prompt tokens the log reports (a
Claude Code log's prompt holds a system prompt and tools it never shows, so the rendered prompt is too short a
denominator), the per-call agreement with the matching cache model (docs/CONTRACTS.md, Contract 4), and
DeepSeek templates that splice tool-call arguments in as strings (tests/fixtures/templates/README.md)."""
import json
import re
from pathlib import Path

import pytest

from strata_lab import load_trace, replay
from strata_lab.caches import replay_engines
from strata_lab.caches.report import AGREE_POINTS
from strata_lab.cli import main
from strata_lab.text.template import ChatTemplate
from strata_lab.traces.render import STRING_ARGUMENTS

FIXTURES = Path(__file__).parent / "fixtures"
TRACES = FIXTURES / "traces"
TEMPLATES = FIXTURES / "templates"
DEEPSEEK_LOG = TRACES / "openai-deepseek-tools.jsonl"
pytestmark = pytest.mark.filterwarnings("ignore::strata_lab.traces.source.TraceWarning")


@pytest.mark.parametrize("name", ["claude-code-session.jsonl", "claude-code-agent-a1b2c3.jsonl",
                                  "cc-1.0-subagents.jsonl", "cc-2.0-agent-headless.jsonl",
                                  "cc-2.1-compact-rewind.jsonl"])
def test_no_reported_rate_above_one_on_claude_code_logs(name, tmp_path):
    dump = load_trace(TRACES / name).to_dump("qwen3", out=tmp_path / "d.jsonl")
    rep = replay_engines(dump, ["anthropic"])
    s = rep.summary().iloc[0]
    assert s["reported_calls"] > 0
    assert 0.0 <= s["reported_rate"] <= 1.0 and 0.0 <= s["simulated_rate"] <= 1.0
    # the denominator is what the log reports (input + cache read + cache creation), not the rendered prompt
    recs = dump.records()
    want = sum(r["reported_prompt_tokens"] for r in recs if r["reported_cached_tokens"] is not None)
    assert s["reported_prompt_tokens"] == want > s["reported_cached"]
    assert s["reported_rate"] == pytest.approx(s["reported_cached"] / want)
    for row in rep.rows:
        if row["reported"] is not None:
            assert row["reported"] <= row["reported_prompt"]
            assert -100.0 <= row["reported_diff_pct"] <= 100.0


def _dump(path, rows):
    path.write_text("".join(json.dumps({"schema": "strata-dump/1", "session": "s", **r}) + "\n" for r in rows))
    return path


def test_agreement_columns_on_a_constructed_case(tmp_path):
    a, b = list(range(64)), list(range(64)) + [1, 2, 3]
    rows = [dict(prompt_ids=a, gen_ids=[1], reported_cached_tokens=0, reported_prompt_tokens=64, cache_engine="vllm"),
            # the log counts 36 prompt tokens more than the render (a system prompt it does not show)
            dict(prompt_ids=b, gen_ids=[9], reported_cached_tokens=64, reported_prompt_tokens=103, cache_engine="vllm"),
            dict(prompt_ids=b + [9, 4], gen_ids=[5], reported_cached_tokens=20, reported_prompt_tokens=105,
                 cache_engine="vllm"),
            dict(prompt_ids=list(range(500, 530)), gen_ids=[1])]   # no report
    rep = replay_engines(_dump(tmp_path / "d.jsonl", rows), ["vllm", "sglang"])
    df = rep.frame()
    v = df[df["engine"] == "vllm"].reset_index(drop=True)
    assert v["reported_prompt"].tolist()[:3] == [64, 103, 105] and v["reported_prompt"].isna().tolist()[3]
    for k, base in enumerate([64, 103, 105]):
        diff = int(v.loc[k, "reused"]) - rows[k]["reported_cached_tokens"]
        assert v.loc[k, "reported_diff_pct"] == pytest.approx(100.0 * diff / base)
        assert bool(v.loc[k, "reported_agrees"]) == (abs(diff) <= AGREE_POINTS / 100 * base)
    assert v["reported_agrees"].isna().tolist() == [False, False, False, True]
    assert v["reported_agrees"].tolist()[:3] == [True, True, False]   # 0 = 0, 64 = 64, 64 against 20
    s = rep.summary().set_index("engine")
    for eng in ("vllm", "sglang"):
        g = df[df["engine"] == eng]
        agree = int(g["reported_agrees"].fillna(False).astype(bool).sum())
        assert s.loc[eng, "reported_calls"] == 3 and s.loc[eng, "agree_calls"] == agree
        assert s.loc[eng, "agree_share"] == pytest.approx(agree / 3)
        assert s.loc[eng, "agreement"] == f"{agree}/3 calls ({agree / 3:.0%})"
    assert s.loc["vllm", "agreement"] == "2/3 calls (67%)"
    assert bool(s.loc["vllm", "models_reporter"]) and not bool(s.loc["sglang", "models_reporter"])
    assert s.loc["vllm", "reported_prompt_tokens"] == 64 + 103 + 105
    assert s.loc["vllm", "reported_rate"] == pytest.approx(84 / 272)
    assert s.loc["vllm", "simulated_rate"] == pytest.approx(s.loc["vllm", "simulated_cached"] / (64 + 67 + 69))
    text = "\n".join(rep.lines())
    assert "agreement with the log (cached within 5 points of the reported prompt tokens): 2/3 calls (67%) " \
           "(the reporter's cache model)" in text
    doc = json.loads(rep.to_json())
    assert doc["engines"][0]["agreement"] == "2/3 calls (67%)"
    assert [c["reported_agrees"] for c in doc["calls"] if c["engine"] == "vllm"] == [True, True, False, None]
    # the plots say it too: the one-engine report's title, the engines plot's title
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from strata_lab.caches.sweeps import plot_engines
    from strata_lab.notebook.plots import plot_report

    fig = plot_report(v)
    assert "2/3 calls (67%)" in fig._suptitle.get_text()
    fig2 = plot_engines(rep)
    assert re.search(r"vllm\S* 2/3 calls \(67%\)", fig2._suptitle.get_text())
    plt.close(fig)
    plt.close(fig2)


def test_a_gemini_report_is_judged_by_the_gemini_model(tmp_path):
    # a second call that repeats 3,000 ids: the rule allows them all; the first log says Google cached them, the
    # second that it cached none (implicit caching gives no guarantee): the model agrees with the first only
    ids = list(range(3000))
    for got, words in ((3000, "2/2 calls (100%)"), (0, "1/2 calls (50%)")):
        rows = [dict(session="s", prompt_ids=ids, gen_ids=[1], reported_cached_tokens=0,
                     reported_prompt_tokens=3000, cache_engine="gemini", ts=0.0),
                dict(session="s", prompt_ids=ids + [5], gen_ids=[1], reported_cached_tokens=got,
                     reported_prompt_tokens=3001, cache_engine="gemini", ts=10.0)]
        rep = replay(_dump(tmp_path / f"d{got}.jsonl", rows), tokenizer=None)
        s = rep.summary().iloc[0]
        assert s["engine"] == "gemini" and s["models_reporter"]     # the log's reporter names the engine
        assert s["agreement"] == words and s["simulated_cached"] == 3000
        assert words in "\n".join(rep.lines())
    # below the documented minimum (2,048 on Gemini 2.5) nothing is cached, whatever repeats
    short = [dict(session="s", prompt_ids=ids[:1000], gen_ids=[1], reported_cached_tokens=0, cache_engine="gemini"),
             dict(session="s", prompt_ids=ids[:1001], gen_ids=[1], reported_cached_tokens=0, cache_engine="gemini")]
    rep = replay(_dump(tmp_path / "short.jsonl", short), tokenizer=None)
    assert list(rep.frame()["cause"]) == ["new_session", "below_minimum"]
    assert rep.summary().iloc[0]["agreement"] == "2/2 calls (100%)"


def test_a_gemini_cli_session_replays_under_the_gemini_model(tmp_path):
    dump = load_trace(TRACES / "gemini-cli-session.jsonl").to_dump("qwen3", out=tmp_path / "g.jsonl")
    assert {r["cache_engine"] for r in dump.records()} == {"gemini"}
    rep = replay(dump)
    s = rep.summary().iloc[0]
    assert s["engine"] == "gemini" and s["models_reporter"] and s["reported_calls"] == 4
    assert 0.0 <= s["reported_rate"] <= 1.0


def _render(template):
    trace = load_trace(DEEPSEEK_LOG)
    df = trace.render_check("qwen3", template)
    return trace, df


def test_deepseek_v31_as_shipped_renders_every_call_with_string_arguments():
    # DeepSeek's own V3.1 template splices arguments with `+`: a parsed mapping fails, the client's JSON renders
    tmpl = ChatTemplate.from_file(TEMPLATES / "deepseek-ai-DeepSeek-V3.1.jinja")
    trace, df = _render(tmpl)
    assert len(df) == 4 and trace.render_skipped == []
    assert all(STRING_ARGUMENTS in n for n in df["notes"])
    from strata_lab import load_tokenizer
    from strata_lab.traces.render import render_call

    tok = load_tokenizer("qwen3")
    last = list(load_trace(DEEPSEEK_LOG))[-1]
    r = render_call(last, tok, tmpl)
    text = tok.decode(r.prompt_ids)
    # the client's strings as sent, compact or spaced
    assert '<｜tool▁sep｜>{"pattern":"MAX_RETRIES","dir":"src"}<｜tool▁call▁end｜>' in text
    assert '<｜tool▁sep｜>{"dir": "src/net"}<｜tool▁call▁end｜>' in text
    assert tok.decode(r.gen_ids).startswith('<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>list_dir<｜tool▁sep｜>{"dir":"src"}')


@pytest.mark.parametrize("name", ["deepseek-ai-DeepSeek-V3.1-llamacpp.jinja",
                                  "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja"])
def test_deepseek_templates_that_take_parsed_arguments_render_them_unchanged(name):
    trace, df = _render(ChatTemplate.from_file(TEMPLATES / name))
    assert len(df) == 4 and trace.render_skipped == []
    assert not any(STRING_ARGUMENTS in n for n in df["notes"])


def test_import_with_the_shipped_v31_template_writes_every_call(tmp_path, capsys):
    out = tmp_path / "d.jsonl"
    assert main(["import", str(DEEPSEEK_LOG), "--out", str(out), "--template",
                 str(TEMPLATES / "deepseek-ai-DeepSeek-V3.1.jinja"), "--quiet"]) == 0
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(recs) == 4 and all(STRING_ARGUMENTS in r["render_notes"] for r in recs)
    assert "4 calls in 1 sessions" in capsys.readouterr().out


def test_import_where_no_call_renders_fails_with_one_line(tmp_path, capsys):
    bad = tmp_path / "refuses.jinja"
    bad.write_text("{% for message in messages %}{{ raise_exception('no message renders') }}{% endfor %}")
    out = tmp_path / "d.jsonl"
    assert main(["import", str(DEEPSEEK_LOG), "--out", str(out), "--template", str(bad), "--quiet"]) != 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("strata-lab import: error")]
    assert len(err) == 1 and "4 calls" in err[0]
    assert not out.exists()
