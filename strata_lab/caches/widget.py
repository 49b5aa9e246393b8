"""A notebook widget: pick engines and parameters, see the per-call reuse bars and the summary update.

Like the widgets in `strata_lab.notebook.widgets`, it holds its children as attributes and its update logic is one
plain method (`run`), so tests drive it headless. ipywidgets and matplotlib are imported when it is built.
"""
from __future__ import annotations

import html
import io

__all__ = ["EngineExplorer"]

# the theme's error colour (readable in light and dark JupyterLab), as notebook.tokview.ALERT
_ERR = '<div style="color:var(--jp-error-color1, #c0392b); font-family:monospace">{}</div>'


class EngineExplorer:
    """Choose engines (and `engine:key=value` overrides, one spec per line); `run()` replays and redraws."""

    def __init__(self, dump, *, engines=("strata", "vllm", "sglang", "llama.cpp"), tokenizer=None):
        import ipywidgets as W

        from strata_lab.caches.call_ids import calls_from_dump

        self.calls = calls_from_dump(dump)
        self.dump = dump
        self.tokenizer = tokenizer
        from strata_lab.caches.presets import ENGINES

        names = ["strata"] + [e for e in ENGINES if e != "strata"]   # every engine modelled, ours first
        self.engines = W.SelectMultiple(options=names, value=tuple(e for e in engines if e in names),
                                        description="engines", rows=len(names))
        self.overrides = W.Textarea(value="\n".join(e for e in engines if e not in names), placeholder=
                                    "one spec per line, e.g. vllm:block_size=32\nllama.cpp:slots=4",
                                    description="specs")
        self.button = W.Button(description="replay", button_style="primary")
        self.button.on_click(lambda _b: self.run())
        self.error, self.summary = W.HTML(), W.HTML()
        self.image = W.Image(format="png", layout=W.Layout(max_width="100%", height="auto"))
        self.widget = W.VBox([W.HBox([self.engines, self.overrides, self.button]), self.error, self.summary,
                              self.image])
        self.report = None
        self.run()

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)

    def specs(self) -> list[str]:
        extra = [s.strip() for s in self.overrides.value.splitlines() if s.strip()]
        return list(self.engines.value) + extra

    def run(self):
        """Replay under the chosen specs; a bad spec shows its error (naming the field) and changes nothing."""
        import matplotlib.pyplot as plt

        from strata_lab.caches.replay import replay_engines
        from strata_lab.caches.sweeps import plot_engines

        try:
            specs = self.specs()
            if not specs:
                raise ValueError("engines: choose at least one engine")
            report = replay_engines(self.dump, specs, tokenizer=self.tokenizer)
        except ValueError as exc:
            self.error.value = _ERR.format(html.escape(str(exc)))
            return None
        self.error.value = ""
        self.report = report
        full = report.summary()
        cols = ["spec", "hit_rate", "reused", "reread", "evictions"]
        if (full["reported_calls"] > 0).any():  # simulated vs what the log reports (Contract 4)
            cols += ["reported_calls", "simulated_cached", "reported_cached", "reported_diff", "reported_diff_pct",
                     "agreement"]
        s = full[cols + ["causes"]]
        # the table keeps to the output's width: long specs and cause lists wrap inside their cells
        table = s.to_html(index=False, float_format=lambda x: f"{x:.3g}")
        self.summary.value = ('<div style="max-width:100%"><style>.strata-engines table{table-layout:fixed;'
                              'width:100%}.strata-engines td,.strata-engines th{overflow-wrap:anywhere;'
                              'word-break:break-word;white-space:normal}</style><div class="strata-engines">'
                              + table + "</div></div>")
        fig = plot_engines(report)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=80)
        plt.close(fig)
        self.image.value = buf.getvalue()
        return s
