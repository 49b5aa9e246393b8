"""One house style for every figure: readable log axes, legends outside the data, causes ranked by tokens,
integer call ticks, transparent figures with grey ink (both JupyterLab themes), and a cost model that says
when its fit is too poor to price seconds."""
import io
import os

import matplotlib
import numpy as np
import pandas as pd
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from strata_lab.caches import replay_engines  # noqa: E402
from strata_lab.caches.plotstyle import INK  # noqa: E402
from strata_lab.caches.sweeps import plot_budget_sweep, plot_engines, sweep_budget  # noqa: E402
from strata_lab.notebook.plots import plot_causes, plot_report, plot_reuse  # noqa: E402
from strata_lab.caches.replay import replay  # noqa: E402

DUMPS = os.path.join(os.path.dirname(__file__), "..", "dumps")


def _png_alpha_corner(fig):
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    buf.seek(0)
    return plt.imread(buf)[0, 0, 3]


def _both_themes(fig):
    """Transparent background; every visible text in the grey ink that reads on white and on near-black."""
    assert fig.patch.get_alpha() == 0.0 and _png_alpha_corner(fig) == 0.0
    fig.canvas.draw()
    for ax in fig.axes:
        texts = [ax.title, ax.xaxis.label, ax.yaxis.label] + ax.get_xticklabels() + ax.get_yticklabels()
        leg = ax.get_legend()
        texts += leg.get_texts() if leg is not None else []
        for t in texts:
            if t.get_text():
                assert matplotlib.colors.to_hex(t.get_color()) == INK, (t.get_text(), t.get_color())


def _overlaps(a, b):
    return not (a.x1 <= b.x0 or b.x1 <= a.x0 or a.y1 <= b.y0 or b.y1 <= a.y0)


def test_budget_sweep_log_axis_labels_the_budgets_plainly(qwen3):
    frame = sweep_budget(os.path.join(DUMPS, "webui.jsonl"), ["vllm", "sglang"], [128, 256, 512, 1024, 4096, 65536])
    fig = plot_budget_sweep(frame)
    fig.canvas.draw()
    for ax in fig.axes:
        labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
        assert labels == ["128", "256", "512", "1024", "4096", "64K"]
        assert not [t.get_text() for t in ax.get_xticklabels(minor=True) if t.get_text()]
    _both_themes(fig)
    plt.close(fig)


def test_engines_plot_legend_outside_the_data_and_short_labels():
    rep = replay_engines(os.path.join(DUMPS, "agent.jsonl"),
                         ["vllm:block_size=32,kv_blocks=8774", "sglang", "llama.cpp:slots=4", "anthropic"])
    fig = plot_engines(rep)
    fig.canvas.draw()
    a, b = fig.axes
    legend = a.get_legend()
    assert not _overlaps(legend.get_window_extent(), a.get_window_extent())
    assert all(len(line) <= 18 for t in b.get_yticklabels() for line in t.get_text().split("\n"))
    ticks = a.get_xticks()
    assert np.allclose(ticks, np.round(ticks))
    # the spec labels take less than a third of the width
    assert b.get_window_extent().width < fig.bbox.width / 3
    _both_themes(fig)
    plt.close(fig)


def test_causes_are_ranked_by_tokens_not_by_calls():
    frame = pd.DataFrame({"cause": ["none"] * 91 + ["template_rewrite"] * 2,
                          "reread": [0] * 91 + [2400, 2331]})
    ax = plot_causes(frame)
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == ["template_rewrite", "none"]
    assert [c.get_width() for c in ax.containers[0]] == [4731, 0]
    plt.close(ax.figure)


def test_reuse_plot_has_integer_call_ticks_and_an_outside_legend(qwen3):
    frame = replay(os.path.join(DUMPS, "agent.jsonl"), tokenizer=qwen3).frame()
    ax = plot_reuse(frame.iloc[:3])
    ax.figure.canvas.draw()
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks)
    assert not _overlaps(ax.get_legend().get_window_extent(), ax.get_window_extent())
    _both_themes(ax.figure)
    plt.close(ax.figure)


def test_report_figure_reads_in_both_themes(qwen3, tmp_path):
    frame = replay(os.path.join(DUMPS, "thinking.jsonl"), tokenizer=qwen3).frame()
    fig = plot_report(frame)
    _both_themes(fig)
    plot_report(frame, tmp_path / "r.png")
    assert plt.imread(tmp_path / "r.png")[0, 0, 3] == 0.0
    plt.close(fig)


def test_dashboard_and_engine_explorer_images_are_transparent(qwen3):
    pytest.importorskip("ipywidgets")
    from strata_lab.caches.widget import EngineExplorer
    from strata_lab.notebook.widgets import ReuseDashboard

    for w in (ReuseDashboard(os.path.join(DUMPS, "agent.jsonl"), tokenizer=qwen3),
              EngineExplorer(os.path.join(DUMPS, "agent.jsonl"), tokenizer=qwen3)):
        img = plt.imread(io.BytesIO(w.image.value))
        assert img.shape[2] == 4 and img[0, 0, 3] == 0.0, type(w).__name__


def test_poor_cost_model_fit_prices_tokens_only(qwen3):
    # thinking.jsonl's prefill times on 2 shared cores: the fit explains them worse than their mean (R^2 < 0)
    rep = replay(os.path.join(DUMPS, "thinking.jsonl"), tokenizer=qwen3)
    assert rep.poor_fit is not None and rep.poor_fit.r2 < 0.5 and rep.cost_model is None
    text = rep.headline()
    assert "too poorly to price seconds" in text and "of prefill" not in text
    assert rep.frame()["reread_s"].isna().all()
    good = replay(os.path.join(DUMPS, "agent.jsonl"), tokenizer=qwen3)
    assert good.cost_model is not None and good.cost_model.r2 >= 0.5 and "of prefill" in good.headline()
