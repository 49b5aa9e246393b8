"""Widgets headless: build them, call their update methods, read their children's values."""
import json
import re

import pytest

pytest.importorskip("ipywidgets")

from strata_lab.dump.writer import Recorder
from strata_lab.notebook.tokview import COLORS, INK, aligned_html, byte_to_token, pieces, tokens_html
from strata_lab.notebook.widgets import DivergenceViewer, ReuseDashboard, TemplateExplorer


def _chips(html_text):
    return re.findall(r'data-pos="(\d+)" style="background:([^;]+);', html_text)


@pytest.fixture(scope="module")
def dump_path(qwen3, tmp_path_factory):
    tok = qwen3
    path = tmp_path_factory.mktemp("w") / "d.jsonl"
    p1 = tok.encode("<|im_start|>user\nsay it<|im_end|>\n<|im_start|>assistant\n")
    reply = tok.encode("Hi") + [130947, 5855] + tok.encode(" is here") + [tok.im_end_id]
    p2 = p1 + tok.encode("Hi öğrenci is here<|im_end|>\n<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n")
    p3 = p2 + tok.encode("ok<|im_end|>\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n")
    with Recorder(path) as rec:
        rec.write_call(session="s", prompt_ids=p1, reused=0, gen_ids=reply, prefill_ms=10)
        rec.write_call(session="s", prompt_ids=p2, reused=len(p1), gen_ids=tok.encode("ok"),
                       drained_ids=tok.encode(" and"), prefill_ms=9)
        rec.write_call(session="s", prompt_ids=p3, reused=len(p2), prefill_ms=8)
    return path


def test_pieces_join_split_characters(qwen3):
    assert [t for _, _, t in pieces(qwen3, [128, 253] + qwen3.encode(" hello"))] == ["ğ", " hello"]
    ids = qwen3.encode("a öğrenci [a-zçğıöşü]")
    assert "".join(t for _, _, t in pieces(qwen3, ids)) == "a öğrenci [a-zçğıöşü]"
    assert byte_to_token(qwen3, ids, 0) == 0 and byte_to_token(qwen3, ids, 10**6) == len(ids)


def test_tokens_html_alternates_and_escapes(qwen3):
    ids = qwen3.encode("<b>x</b> y")
    h = tokens_html(qwen3, ids)
    chips = _chips(h)
    assert len(chips) == len(ids)
    assert h.count(f"color:{INK};") == len(ids)  # chips set their text colour, not only the background
    assert all(c == COLORS["ab"[i % 2]] for i, (_, c) in enumerate(chips))
    assert "<b>" not in h and "&lt;" in h and "&gt;" in h


def test_template_explorer_prefix_and_thinking(qwen3):
    w = TemplateExplorer(messages=[{"role": "user", "content": "Merhaba"}], assistant_prefix="Tamam, öğrenci",
                         enable_thinking=False)
    assert w.prompt_text.endswith("Tamam, öğrenci")
    assert w.ids == qwen3.encode(w.prompt_text)
    assert qwen3.decode(w.ids[w.prefix_token:]) == "Tamam, öğrenci"
    assert f"{len(w.ids)} tokens" in w.summary.value
    assert w.ids_box.value.split() == [str(i) for i in w.ids]
    chips = dict(_chips(w.output.value))
    assert chips[str(w.prefix_token)] == COLORS["prefix"] and chips["0"] != COLORS["prefix"]
    # a prefix starting with a newline merges with the template's own newline: the token straddles
    w.prefix.value = "\nx"
    assert "BPE merged across the boundary" in w.summary.value
    assert w.thinking.disabled and "empty &lt;think&gt; block" in w.thinking_note.value  # moot with a prefix
    w.prefix.value = ""
    assert w.prefix_token is None and "prefix" not in w.summary.value
    assert not w.thinking.disabled and w.thinking_note.value == ""
    off = w.prompt_text
    w.thinking.value = "on"
    assert w.prompt_text != off and "<think>" not in w.prompt_text[-20:]


def test_template_explorer_tools_and_errors():
    w = TemplateExplorer(messages=[{"role": "user", "content": "weather?"}])
    w.tools.value = json.dumps([{"type": "function", "function": {"name": "get_weather", "parameters": {}}}])
    assert "get_weather" in w.prompt_text and w.error is None
    w.tools.value = "{"
    assert w.error.startswith("tools: not valid JSON")
    assert "tools: not valid JSON" in w.output.value
    w.tools.value = ""
    w.messages.value = '{"role": "user"}'
    assert w.error == "messages: must be a JSON list, got dict"
    w.messages.value = '[{"role": "robot", "content": "x"}]'
    assert "role" in w.error
    w.messages.value = '[{"role": "user", "content": "ok"}]'
    assert w.error is None and "ok" in w.prompt_text


def test_divergence_viewer_steps_and_highlights(dump_path):
    v = DivergenceViewer(dump_path)
    assert len(v.calls) == 3
    assert "new session" in v.panel.value and "new_session" in v.header.value
    v.show(1)
    assert v.position == 1 and v.slider.value == 2  # the slider counts from 1, as the header does
    assert "call 2 of 3" in v.header.value and v.slider.description == "call"
    assert "retokenized_reply" in v.header.value and "reread <b" in v.header.value
    held, prompt = v.panel.value.split("prompt [")
    hchips = dict(_chips(held))
    assert hchips["10"] == COLORS["common"]                   # 'Hi' shared
    assert hchips["11"] == hchips["12"] == COLORS["same_text"]  # ' öğren' 'ci': ids differ, same text
    assert "reused 10" in held and "id ≠ at 11" in held
    assert _chips(prompt)[11 - 0][1] == COLORS["same_text"]   # ' öğrenci' on the prompt side
    assert "first id divergence" in v.context.value
    v._step(1)
    assert v.position == 2 and "drained_dropped" in v.header.value
    assert dict(_chips(v.panel.value.split("prompt [")[0]))["26"] == COLORS["diverge"]
    assert "first text divergence" in v.context.value
    assert v.next_miss() == 1  # wraps around to the retokenized reply
    with pytest.raises(ValueError, match="position"):
        v.show(7)


def test_divergence_viewer_only_misses(dump_path):
    v = DivergenceViewer(dump_path, only_misses=True)
    assert [v.calls[i]["row"]["cause"] for i in v.order] == ["retokenized_reply", "drained_dropped"]
    assert v.slider.description == "miss" and (v.slider.min, v.slider.max, v.slider.value) == (1, 2, 1)
    assert "miss 1 of 2" in v.header.value and "turn 1" in v.header.value


def test_reuse_dashboard(dump_path):
    d = ReuseDashboard(dump_path, policies=("recorded", "fixes"))
    assert list(d.comparison["policy"]) == ["recorded", "fixes"]
    assert bytes(d.image.value)[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<table" in d.table.value and "fixes" in d.table.value
    rec = d.comparison.set_index("policy")
    assert rec.loc["fixes", "reread"] < rec.loc["recorded", "reread"]
    d.policies.value = ("recorded", "every:64")
    assert list(d.refresh()["policy"]) == ["recorded", "every:64"]
    assert "reread" in d.summary.value


def test_prefix_experiment_on_the_tiny_engine(tmp_path):
    pytest.importorskip("strata_lab._engine")
    from strata_lab.tiny import make_tiny
    from strata_lab.engine import Engine
    from strata_lab.notebook.widgets import PrefixExperiment

    engine = Engine.load(make_tiny(tmp_path / "m"), threads=1)
    w = PrefixExperiment(engine, [{"role": "user", "content": "Merhaba"}], assistant_prefix="Tamam,",
                         max_new_tokens=5, top_k=3)
    r = w.run()
    without, with_ = r["without"], r["with"]
    assert with_["prompt_ids"][:len(without["prompt_ids"]) - 1] != [] and with_["prompt_ids"] != without["prompt_ids"]
    assert w.explorer.tok.decode(with_["prompt_ids"]).endswith("Tamam,")
    for side in (without, with_):
        assert len(side["gen_ids"]) <= 5 and len(side["top"]) == 3
        probs = [p for _, _, p in side["top"]]
        assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1
        assert side["gen_ids"][0] == side["top"][0][0]  # greedy: the first step takes the top candidate
    assert "with prefix" in w.right.value and str(with_["gen_ids"][0]) in w.right.value
    with pytest.raises(ValueError, match="top_k"):
        PrefixExperiment(engine, top_k=0)


def test_prefix_experiment_shows_bad_input_in_the_widget():
    """Messages that are not JSON are said in the widget's status area (a button callback that raised would
    reach only JupyterLab's log console); the engine is never called."""
    pytest.importorskip("ipywidgets")
    from strata_lab.notebook.widgets import PrefixExperiment

    class NoEngine:
        def forward(self, ids):
            raise AssertionError("bad input must not reach the engine")

    w = PrefixExperiment(NoEngine(), [{"role": "user", "content": "Merhaba"}])
    assert w.status.value == "" and w.error is None
    w.explorer.messages.value = '[{"role": "user", '           # shown as one types
    assert "messages: not valid JSON" in w.status.value and w.error.startswith("messages: not valid JSON")
    w.status.value = ""
    assert w.run() == {} and "messages: not valid JSON" in w.status.value   # and when run is pressed
    assert w.left.value == w.right.value == ""
    w.button.click()                                                       # the button does not raise
    assert "messages: not valid JSON" in w.status.value
    w.explorer.messages.value = '{"role": "user"}'
    assert "messages: must be a JSON list" in w.status.value
    w.explorer.messages.value = '[{"role": "user", "content": "Merhaba"}]'
    assert w.status.value == "" and w.error is None


def test_divergence_viewer_pages_through_a_store(dump_path, tmp_path):
    """On a store the viewer holds one page of one replica's calls, replayed as pages turn."""
    import glob
    import os

    from strata_lab.dump import convert_jsonl

    def body(header):  # the header after its "call k of n" label, which counts within the page
        return header.split("</b>:", 1)[1]

    whole = DivergenceViewer(dump_path)
    convert_jsonl(dump_path, tmp_path / "s")
    v = DivergenceViewer(str(tmp_path / "s"), page_size=2)
    assert v.report is None and len(v.calls) == 2 and v.pager.page == 0
    assert body(v.header.value) == body(whole.header.value) and "call 1 of 2 on page 1" in v.header.value
    v.show(1)
    whole.show(1)
    assert body(v.header.value) == body(whole.header.value) and v.context.value == whole.context.value
    assert v.turn_page(1) and len(v.calls) == 1 and v.pager.page == 1
    whole.show(2)
    assert body(v.header.value) == body(whole.header.value) and "drained_dropped" in v.header.value
    assert "call 1 of 1 on page 2" in v.header.value
    assert not v.turn_page(1)            # the end: nothing changes
    assert v.turn_page(-1) and v.pager.page == 0 and "new_session" in v.header.value
    with pytest.raises(ValueError, match="page_size"):
        DivergenceViewer(str(tmp_path / "s"), page_size=0)
    # a shipped multi-session dump: pages never hold more than page_size calls
    shipped = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "dumps", "webui.jsonl")))[0]
    convert_jsonl(shipped, tmp_path / "w")
    w = DivergenceViewer(str(tmp_path / "w"), page_size=5)
    seen = len(w.calls)
    while w.turn_page(1):
        assert len(w.calls) <= 5
        seen += len(w.calls)
    assert seen == 12


def test_reuse_dashboard_on_a_store(dump_path, tmp_path):
    from strata_lab.dump import convert_jsonl

    convert_jsonl(dump_path, tmp_path / "s")
    a = ReuseDashboard(dump_path, policies=("recorded", "every:4", "fixes"))
    b = ReuseDashboard(str(tmp_path / "s"), policies=("recorded", "every:4", "fixes"))
    assert a.comparison.equals(b.comparison)
