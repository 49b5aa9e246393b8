"""Notebook widgets (ipywidgets 8; JupyterLab and VS Code): templates, prefill, divergences, reuse.

Each widget is a small object holding its child widgets; display it in a notebook cell (it renders its
root `.widget`), or drive it from code: the update methods (`render`, `run`, `show`, `refresh`) are plain
calls and the children's `.value` is what a test or a script reads. ipywidgets and matplotlib are imported
when a widget is built, never when this module is.

Why one module: the four widgets share one base (`_Widget`: display, theme-safe HTML, the tokenizer
argument) and their layout rules (no overflow, chips readable in every theme), which the browser test
holds them to together; apart, each would restate them.

>>> w = TemplateExplorer(messages=[{"role": "user", "content": "Merhaba"}], assistant_prefix="Sure",
...                      enable_thinking=False)
>>> w.prompt_text.endswith("</think>\\n\\nSure"), w.prefix_token == len(w.ids) - 1
(True, True)
"""
from __future__ import annotations

import html
import io
import json
from typing import Sequence

from strata_lab.notebook.tokview import ALERT, MUTED, aligned_html, tokens_html

__all__ = ["TemplateExplorer", "PrefixExperiment", "DivergenceViewer", "ReuseDashboard"]

_DEFAULT_MESSAGES = [
    {"role": "system", "content": "You are a careful assistant."},
    {"role": "user", "content": "Öğrenci listesini [a-zçğıöşü]+ ile filtrele."},
]
_ERR = f'<div style="color:{ALERT}; font-family:monospace">{{}}</div>'
# Text boxes take the width their box gives them: "100%" plus the widgets' own 2 px margins overflowed it.
_FILL = dict(width="auto", max_width="100%")
# Qwen3's template writes an empty <think></think> before any assistant prefix, whatever enable_thinking says.
_PREFIX_THINK = "a prefix always follows an empty &lt;think&gt; block"


def _tok(tokenizer):
    if isinstance(tokenizer, str):
        from strata_lab.text.tokenizer import load_tokenizer

        return load_tokenizer(tokenizer)
    return tokenizer


def _tmpl(template):
    if isinstance(template, str):
        from strata_lab.text.template import ChatTemplate

        return ChatTemplate.from_name(template)
    return template


def _parse_json(text: str, field: str, kind: type):
    if not text.strip():
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{field}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    if not isinstance(value, kind):
        raise ValueError(f"{field}: must be a JSON {kind.__name__}, got {type(value).__name__}")
    return value


def _thinking_value(v) -> bool | None:
    return {"default": None, "on": True, "off": False}[v]


class _Widget:
    widget = None  # the root ipywidgets container

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)


# --- TemplateExplorer ---------------------------------------------------------------------------------
class TemplateExplorer(_Widget):
    """Edit messages, tools, the assistant prefix and enable_thinking; see the rendered prompt with token
    boundaries, its ids and count, and where the prefix starts (`prefix_token`, None without a prefix)."""

    def __init__(self, messages: Sequence[dict] | None = None, *, tools: list | None = None,
                 assistant_prefix: str = "", enable_thinking: bool | None = None, template="qwen3",
                 tokenizer="qwen3"):
        import ipywidgets as W

        self.template = _tmpl(template)
        self.tok = _tok(tokenizer)
        self.messages = W.Textarea(json.dumps(list(messages or _DEFAULT_MESSAGES), ensure_ascii=False, indent=1),
                                   description="messages", layout=W.Layout(height="140px", **_FILL))
        self.tools = W.Textarea(json.dumps(tools, ensure_ascii=False, indent=1) if tools else "",
                                description="tools", placeholder="[] (JSON list of tool schemas)",
                                layout=W.Layout(height="60px", **_FILL))
        # a text area, not a one-line box: a prefix may start with (or hold) a newline, and a one-line box
        # silently drops it (the token boundary this widget exists to show goes with it)
        self.prefix = W.Textarea(assistant_prefix, description="prefix", rows=2,
                                 placeholder="assistant prefix (prefill); Enter types a newline",
                                 layout=W.Layout(**_FILL))
        thinking = {None: "default", True: "on", False: "off"}[enable_thinking]
        self.thinking = W.ToggleButtons(options=["default", "on", "off"], value=thinking,
                                        description="thinking", style={"button_width": "72px"},
                                        layout=W.Layout(flex="0 0 auto"))
        self.thinking_note = W.HTML(layout=W.Layout(flex="1 1 0", min_width="0"))
        # PrefixExperiment clears this: there thinking still shapes the run without the prefix
        self.lock_thinking = True
        self.summary = W.HTML()
        self.output = W.HTML()
        self.ids_box = W.Textarea(disabled=True, description="ids", layout=W.Layout(height="60px", **_FILL))
        for child in (self.messages, self.tools, self.prefix, self.thinking):
            child.observe(lambda _change: self.render(), names="value")
        self.widget = W.VBox([self.messages, self.tools, W.HBox([self.thinking, self.thinking_note]), self.prefix,
                              self.summary, self.output, self.ids_box])
        self.prompt_text, self.ids, self.prefix_token, self.error = "", [], None, None
        self.render()

    def render(self) -> str:
        """Render from the current inputs; returns the output HTML (an error message on bad input)."""
        self._show_thinking_state(bool(self.prefix.value))
        try:
            messages = _parse_json(self.messages.value, "messages", list) or []
            tools = _parse_json(self.tools.value, "tools", list)
            prefix = self.prefix.value
            text = self.template.render(messages, tools=tools, assistant_prefix=prefix or None,
                                        enable_thinking=_thinking_value(self.thinking.value))
        except ValueError as exc:
            self.error = str(exc)
            self.output.value = _ERR.format(html.escape(self.error))
            self.summary.value = ""
            return self.output.value
        self.error = None
        ids = self.tok.encode(text)
        self.prompt_text, self.ids = text, ids
        self.prefix_token = None
        marks = {}
        straddle = False
        if prefix:
            head = len(text[:len(text) - len(prefix)].encode("utf-8"))
            n, self.prefix_token = 0, len(ids)
            for i, tid in enumerate(ids):
                if n >= head:
                    self.prefix_token = i
                    break
                n += len(self.tok.token_bytes(tid))
                if n > head:  # this token holds the end of the head and the start of the prefix
                    self.prefix_token, straddle = i, True
                    break
            marks[self.prefix_token] = "prefix"
        start = self.prefix_token if self.prefix_token is not None else len(ids)
        self.output.value = tokens_html(self.tok, ids, marks=marks,
                                        cls=lambda p: "prefix" if p > start or (p == start and not straddle)
                                        else None)
        note = ""
        if prefix:
            note = f"; prefix starts at token {self.prefix_token}"
            if straddle:
                note += " (that token also holds template text: BPE merged across the boundary)"
        self.summary.value = f"<b>{len(ids)} tokens</b>, {len(text)} characters{html.escape(note)}"
        self.ids_box.value = " ".join(map(str, ids))
        return self.output.value

    def _show_thinking_state(self, has_prefix: bool) -> None:
        # a prefix makes the thinking buttons moot: say so (and disable them) rather than let them do nothing
        self.thinking.disabled = has_prefix and self.lock_thinking
        note = ""
        if has_prefix:
            note = (f"{_PREFIX_THINK}: thinking has no effect" if self.lock_thinking
                    else f"{_PREFIX_THINK}: thinking changes only the run without prefix")
        self.thinking_note.value = (f'<span style="font:12px sans-serif; color:{MUTED}">{note}</span>'
                                    if note else "")


# --- PrefixExperiment -----------------------------------------------------------------------------------
class PrefixExperiment(_Widget):
    """Run an engine with and without an assistant prefix, side by side: the continuation, its ids and the
    top candidates (with probabilities) at the first generated step.

    `engine` is a strata_lab Engine (`engine.forward(ids)` gives logits; continuations decode greedily in a
    scratch session). `run()` fills `results`: {"without": {...}, "with": {...}}.
    """

    def __init__(self, engine, messages: Sequence[dict] | None = None, *, assistant_prefix: str = "Sure,",
                 enable_thinking: bool | None = False, max_new_tokens: int = 12, top_k: int = 5,
                 template="qwen3", tokenizer="qwen3"):
        import ipywidgets as W

        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
        if not isinstance(top_k, int) or top_k < 1:
            raise ValueError(f"top_k must be a positive int, got {top_k!r}")
        self.engine, self.top_k = engine, top_k
        self.explorer = TemplateExplorer(messages, assistant_prefix=assistant_prefix,
                                         enable_thinking=enable_thinking, template=template, tokenizer=tokenizer)
        self.tok = self.explorer.tok
        self.explorer.lock_thinking = False
        self.explorer.render()
        self.max_new_tokens = W.IntSlider(max_new_tokens, min=1, max=128, description="new tokens")
        self.button = W.Button(description="run", button_style="primary")
        self.button.on_click(lambda _b: self.run())
        # the two sides share the row; min_width 0 lets a long continuation wrap instead of widening it
        half = dict(flex="1 1 0", min_width="0")
        self.left, self.right = W.HTML(layout=W.Layout(**half)), W.HTML(layout=W.Layout(**half))
        # bad input is said here, in the widget: an exception in a button's callback reaches only the log console
        self.status = W.HTML()
        self.widget = W.VBox([self.explorer.messages, self.explorer.prefix,
                              W.HBox([self.explorer.thinking, self.explorer.thinking_note]),
                              W.HBox([self.max_new_tokens, self.button]), self.status, W.HBox([self.left, self.right])])
        self.results: dict = {}
        self.error: str | None = None
        # the explorer re-renders on every edit (its observers run first): its error shows here as one types
        for child in (self.explorer.messages, self.explorer.prefix, self.explorer.thinking):
            child.observe(lambda _change: self._show_error(self.explorer.error), names="value")
        self._show_error(self.explorer.error)

    def _show_error(self, error: str | None) -> None:
        self.error = error
        self.status.value = "" if error is None else _ERR.format(html.escape(error))

    def _side(self, prefix: str) -> dict:
        import numpy as np

        ex = self.explorer
        text = ex.template.render(_parse_json(ex.messages.value, "messages", list) or [],
                                  assistant_prefix=prefix or None,
                                  enable_thinking=_thinking_value(ex.thinking.value))
        ids = self.tok.encode(text)
        logits = np.asarray(self.engine.forward(ids)[-1], dtype=np.float64)
        logits = logits[:self.tok.vocab_size]  # rows past the vocab are padding
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        top = np.argsort(-probs)[:self.top_k]
        from strata_lab.engine import Sampling

        session = self.engine.session(f"prefix-experiment-{len(self.results)}-{id(self)}")
        session.reset()
        gen = session.generate(ids, max_new_tokens=self.max_new_tokens.value, sampling=Sampling(temperature=0.0),
                               stop_ids=[i for i in (self.tok.im_end_id,) if i is not None]).ids()
        session.reset()
        return {"prompt_ids": ids, "gen_ids": gen, "continuation": self.tok.decode(gen),
                "top": [(int(i), self.tok.decode([int(i)]), float(probs[i])) for i in top]}

    def run(self) -> dict:
        """Run both sides with the current inputs; returns and shows `results`. Bad input (messages that are not
        JSON, a conversation the template refuses) is shown in the widget (`status`; `error` holds the text)
        and returns {}."""
        from strata_lab.text.jinja import RenderLimitError

        self.results = {}
        try:
            without, with_ = self._side(""), self._side(self.explorer.prefix.value)
        except (ValueError, RenderLimitError) as exc:
            self._show_error(str(exc))
            self.left.value = self.right.value = ""
            return self.results
        self._show_error(None)
        self.results["without"], self.results["with"] = without, with_
        self.left.value = self._html("without prefix", self.results["without"])
        self.right.value = self._html(f"with prefix {self.explorer.prefix.value!r}", self.results["with"])
        return self.results

    def _html(self, title: str, r: dict) -> str:
        rows = "".join(f"<tr><td>{i}</td><td><code>{html.escape(repr(t))}</code></td><td>{p:.3f}</td></tr>"
                       for i, t, p in r["top"])
        return (f'<div style="padding:4px 12px"><b>{html.escape(title)}</b> ({len(r["prompt_ids"])} prompt ids)'
                f'<pre style="white-space:pre-wrap">{html.escape(r["continuation"])}</pre>'
                f'<div style="font:11px monospace">ids {r["gen_ids"]}</div>'
                f'<table><tr><th>id</th><th>token</th><th>p (first step)</th></tr>{rows}</table></div>')


# --- DivergenceViewer -----------------------------------------------------------------------------------
class DivergenceViewer(_Widget):
    """Step through a dump's calls: held vs prompt aligned at their first id divergence and first text
    divergence, with the cause and reused / read / reread from the replay (recorded prompts).

    On a Parquet store the viewer pages: one replica (cache domain) at a time, `page_size` calls per page,
    replayed as you turn pages (`turn_page`), so the store is never loaded whole.

    >>> v = DivergenceViewer("dumps/agent.jsonl")            # doctest: +SKIP
    >>> v.show(3); v.panel.value                              # doctest: +SKIP
    """

    def __init__(self, dump, *, tokenizer="qwen3", model: str = "hybrid", checkpoint_policy=None,
                 full_hit: str = "held_logits", only_misses: bool = False, page_size: int = 200):
        import ipywidgets as W

        from strata_lab.dump import Store, load_dump

        self.tok = _tok(tokenizer)
        self.dump = load_dump(dump)
        self.only_misses = only_misses
        self.pager = None
        from strata_lab.caches.presets import parse_engine
        from strata_lab.rules import checkpoint_spec

        # the one driver's engine: ours, strata; checkpoint_policy None: a snapshot at each prompt's end
        over = {"kind": model, "full_hit": full_hit,
                "checkpoints": checkpoint_spec(checkpoint_policy) if checkpoint_policy is not None else "turn"}
        engine = parse_engine("strata").with_(**over)
        if isinstance(self.dump, Store):  # a store: page through it, never load it whole
            from strata_lab.replayer.pages import StorePager

            self.report = None
            self.pager = StorePager(self.dump, page_size=page_size, tokenizer=self.tok, model=model,
                                    checkpoint_policy=checkpoint_policy, full_hit=full_hit, spec=engine.spec())
            self.calls = self.pager.calls
        else:   # the one driver: our engine, strata, as `strata_lab.replay` replays it (Contract 3)
            from strata_lab.caches.call_ids import calls_from_dump
            from strata_lab.caches.replay import replay_engines

            records = self.dump.records()
            self.report = replay_engines(calls_from_dump(self.dump), [engine], tokenizer=self.tok)
            by_index = sorted(self.report.rows, key=lambda r: r["index"])
            rows = [dict(r, recorded_reused=r["reported"], call=rec.get("call", 0), gen_len=len(rec["gen_ids"]),
                         drained_len=len(rec["drained_ids"])) for r, rec in zip(by_index, records)]
            self.calls = self._pair(records, rows)
        if not self.calls:
            raise ValueError("dump: no engine calls to show")
        self.order = self._order()
        # the slider counts from 1, in the unit it steps through (the header says "miss 2 of 5" to match);
        # positions in the API (show, next_miss) count from 0
        self.unit = "miss" if only_misses else "call"
        self.slider = W.IntSlider(1, min=1, max=len(self.order), description=self.unit)
        self.prev, self.next = W.Button(description="◀", layout=W.Layout(width="40px")), \
            W.Button(description="▶", layout=W.Layout(width="40px"))
        self.prev.on_click(lambda _b: self._step(-1))
        self.next.on_click(lambda _b: self._step(1))
        self.worst = W.Button(description="next miss")
        self.worst.on_click(lambda _b: self.next_miss())
        self.header, self.panel, self.context = W.HTML(), W.HTML(), W.HTML()
        self.slider.observe(lambda ch: self.show(ch["new"] - 1), names="value")
        bar = [self.prev, self.slider, self.next, self.worst]
        if self.pager is not None:
            self.prev_page_button = W.Button(description="◀ page")
            self.next_page_button = W.Button(description="page ▶")
            self.prev_page_button.on_click(lambda _b: self.turn_page(-1))
            self.next_page_button.on_click(lambda _b: self.turn_page(1))
            self.domain_box = W.Dropdown(options=list(self.pager.domains), value=self.pager.domain,
                                         description="replica")
            self.domain_box.observe(lambda ch: self.turn_page(0, domain=ch["new"]), names="value")
            bar += [self.prev_page_button, self.next_page_button, self.domain_box]
        self.widget = W.VBox([W.HBox(bar), self.header, self.panel, self.context])
        self.show(0)

    def _order(self) -> list[int]:
        return [i for i, c in enumerate(self.calls)
                if not self.only_misses or c["row"]["cause"] not in ("none", "new_session")] or [0]

    def turn_page(self, direction: int, *, domain: str | None = None) -> bool:
        """Store mode: the next (+1) or previous (-1) page of calls, or the first page of another replica."""
        if self.pager is None:
            raise ValueError("turn_page: only a store is paged (this viewer holds a whole dump)")
        if domain is not None:
            self.pager.set_domain(domain)
            moved = True
        else:
            moved = self.pager.next_page() if direction > 0 else self.pager.prev_page()
        if moved:
            self.calls = self.pager.calls
            self.order = self._order()
            self.slider.value = 1
            self.slider.max = len(self.order)
            self.show(0, force=True)
        return moved

    @staticmethod
    def _pair(records, rows) -> list[dict]:
        # held before each call = the session's previous prompt + generated + drained ids (Contract 1)
        held: dict[str, list[int]] = {}
        segs: dict[str, list[tuple]] = {}
        out = []
        for rec, row in zip(records, rows):
            sid = str(rec["session"])
            h = held.get(sid, [])
            out.append({"held": h, "prompt": rec["prompt_ids"], "segments": segs.get(sid, []), "row": row})
            p, g = len(rec["prompt_ids"]), len(rec["gen_ids"])
            segs[sid] = [(p, p + g, "gen", None), (p + g, p + g + len(rec["drained_ids"]), "drained", None)]
            held[sid] = list(rec["prompt_ids"]) + list(rec["gen_ids"]) + list(rec["drained_ids"])
        return out

    def _label(self, position: int) -> str:
        page = f" on page {self.pager.page + 1}" if self.pager is not None else ""
        return f"{self.unit} {position + 1} of {len(self.order)}{page}"

    @property
    def position(self) -> int:
        """The position shown, from 0 (the slider shows it from 1)."""
        return self.slider.value - 1

    def _step(self, d: int) -> None:
        self.slider.value = min(max(self.slider.value + d, self.slider.min), self.slider.max)

    def next_miss(self) -> int:
        """Move to the next call that re-read held tokens (wraps around); returns its position."""
        n = len(self.order)
        for k in range(1, n + 1):
            j = (self.position + k) % n
            if self.calls[self.order[j]]["row"]["reread"] > 0:
                self.slider.value = j + 1
                return j
        return self.position

    def show(self, position: int, *, force: bool = False) -> str:
        """Show the call at `position` (among the viewer's calls, from 0); returns the aligned-view HTML."""
        from strata_lab.replayer.divergence import find_divergence

        if not 0 <= position < len(self.order):
            raise ValueError(f"position must be in [0, {len(self.order)}), got {position}")
        if self.position != position and not force:
            self.slider.value = position + 1  # the observer calls show() again
            return self.panel.value
        c = self.calls[self.order[position]]
        r = c["row"]
        rec_reused = r["recorded_reused"]
        self.header.value = (
            f'<div style="font-family:sans-serif"><b>{self._label(position)}</b>: '
            f'session {html.escape(str(r["session"]))}, turn {r["turn"]}'
            f' (request {html.escape(str(r["request_id"]))}.{r["call"]}): cause <b>{r["cause"]}</b>; '
            f'prompt {r["prompt_len"]}, held {r["held_before"]}, lcp_ids {r["lcp_ids"]}, lcp_text {r["lcp_text"]}'
            f'<br>reused <b>{r["reused"]}</b>'
            + (f" (engine recorded {rec_reused})" if rec_reused is not None else "")
            + f', read <b>{r["read"]}</b>, reread <b style="color:{ALERT}">{r["reread"]}</b>'
            + (f' ({r["reread_s"] * 1000:.1f} ms)' if r["reread_s"] == r["reread_s"] else "")
            + f', generated {r["gen_len"]}, drained {r["drained_len"]}</div>')
        if not c["held"]:
            self.panel.value = (f'<div style="font-family:sans-serif; color:{MUTED}">'
                                'new session: nothing held</div>')
            self.context.value = ""
            return self.panel.value
        d = find_divergence(c["held"], c["prompt"], self.tok, lcp_ids=r["lcp_ids"])
        self.panel.value = aligned_html(self.tok, c["held"], c["prompt"], lcp_ids=d.lcp_ids, lcp_text=d.lcp_text,
                                        byte_in_token=d.byte_in_token, reused=r["reused"], segments=c["segments"])
        lines = [("first id divergence", d.id_context_held, d.id_context_prompt),
                 ("first text divergence", d.text_context_held, d.text_context_prompt)]
        self.context.value = "".join(
            f'<div style="font:12px monospace"><i>{t}</i><br>{html.escape(a)}<br>{html.escape(b)}</div>'
            for t, a, b in lines if a or b)
        return self.panel.value


# --- ReuseDashboard -------------------------------------------------------------------------------------
class ReuseDashboard(_Widget):
    """The replay plots and the policy comparison for a dump; pick the policies to compare. One replay driver
    (`strata_lab.replay`): our engine, `strata`, with `model` as its kind and `checkpoint_policy` as its
    checkpoints (default: the ones each dump line recorded)."""

    def __init__(self, dump, *, policies: Sequence[str] = ("recorded", "reply-ids", "keep-drained", "fixes",
                                                           "every:256"),
                 tokenizer="qwen3", model: str = "hybrid", checkpoint_policy=None):
        import ipywidgets as W

        from strata_lab.caches.call_ids import calls_from_dump
        from strata_lab.caches.presets import parse_engine
        from strata_lab.dump import load_dump

        self.tok = _tok(tokenizer)
        self.dump = load_dump(dump)
        self.calls = calls_from_dump(self.dump)
        over = {"kind": model}
        if checkpoint_policy is not None:
            from strata_lab.rules import checkpoint_spec

            over["checkpoints"] = checkpoint_spec(checkpoint_policy)
        self.engine = parse_engine("strata").with_(**over)
        options = list(dict.fromkeys(["recorded", *policies, "reply-ids", "keep-drained", "fixes", "every:64",
                                      "every:256", "none"]))
        self.policies = W.SelectMultiple(options=options, value=tuple(dict.fromkeys(["recorded", *policies])),
                                         description="policies", rows=min(len(options), 8))
        self.button = W.Button(description="compare", button_style="primary")
        self.button.on_click(lambda _b: self.refresh())
        self.summary, self.table = W.HTML(), W.HTML()
        self.image = W.Image(format="png")
        self.widget = W.VBox([W.HBox([self.policies, self.button]), self.summary, self.table, self.image])
        self.report = self.comparison = None
        self.refresh()

    def refresh(self):
        """Replay under the selected policies; update the summary, the table and the plot. Returns the table."""
        from strata_lab.caches.replay import replay_engines
        from strata_lab.caches.sweeps import compare_policies
        from strata_lab.notebook.plots import plot_report

        self.report = replay_engines(self.calls, [self.engine], tokenizer=self.tok)
        chosen = list(self.policies.value) or ["recorded"]
        # the engine's spec is the same on every row (it is the dashboard's engine): not a column here
        self.comparison = compare_policies(self.calls, chosen, self.engine, tokenizer=self.tok,
                                           cost_model=self.report.cost_model).drop(columns=["spec"])
        t = self.report.totals()
        self.summary.value = (f'<div style="font-family:sans-serif">{t["calls"]} calls, {t["prompt_tokens"]} '
                              f'prompt tokens: {t["reused"]} reused, {t["read"]} read, {t["reread"]} reread. '
                              f'{html.escape(self.report.headline())}</div>')
        self.table.value = self.comparison.to_html(index=False, float_format=lambda x: f"{x:.3g}")
        import matplotlib.pyplot as plt

        fig = plot_report(self.report.frame(), policies=self.comparison)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=80)
        plt.close(fig)  # the Image widget shows it; an open figure would also print under the inline backend
        self.image.value = buf.getvalue()
        return self.comparison
