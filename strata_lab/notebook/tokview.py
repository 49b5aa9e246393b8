"""HTML views of token ids: token boundaries, and held vs prompt aligned at their divergence.

Plain functions returning HTML strings (inline styles, so they render the same in JupyterLab, VS Code and a
saved notebook). The widgets put them in `ipywidgets.HTML`; tests read them as text.

>>> from strata_lab import load_tokenizer
>>> tok = load_tokenizer("qwen3")
>>> [text for _, _, text in pieces(tok, [128, 253, 23811])]     # 'ğ' as two byte ids stays one piece
['ğ', ' hello']
"""
from __future__ import annotations

import html
from typing import Callable, Sequence

__all__ = ["pieces", "tokens_html", "aligned_html", "byte_to_token"]

# background per token class; the two plain shades alternate so token boundaries show. Chips set their text
# colour too (INK): a theme's own text colour (white in JupyterLab Dark) is unreadable on these pastels.
INK = "#1f2328"
COLORS = {
    "a": "#e8eef7", "b": "#f7efe0",            # plain tokens, alternating
    "common": "#eeeeee",                        # ids both sides share (reused or reusable)
    "same_text": "#fff3b0",                     # ids differ, text still the same (retokenized)
    "diverge": "#f4a6a6",                       # first text divergence
    "gen": "#d8f0d2", "drained": "#f1d4f7",     # held ids the model generated / drained after STOP
    "prefix": "#cfe3ff",                        # assistant prefix (TemplateExplorer)
}
# text on the page's own background follows the JupyterLab theme (the fallbacks serve VS Code, saved HTML)
MUTED = "var(--jp-ui-font-color2, #555)"
ALERT = "var(--jp-error-color1, #c0392b)"
_BOX = ("font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12px; line-height: 1.9; "
        "white-space: pre-wrap; word-break: break-all")


def pieces(tok, ids: Sequence[int]) -> list[tuple[int, int, str]]:
    """Split ids into (start, end, text) pieces: one per token, except that tokens holding parts of one
    UTF-8 character are joined into one piece (their text alone is not valid UTF-8)."""
    out: list[tuple[int, int, str]] = []
    buf, start = b"", 0
    for i, tid in enumerate(ids):
        buf += tok.token_bytes(tid)
        try:
            text = buf.decode("utf-8")
        except UnicodeDecodeError:
            if len(buf) < 8 and i + 1 < len(ids):  # wait for the rest of the character
                continue
            text = buf.decode("utf-8", errors="replace")
        out.append((start, i + 1, text))
        buf, start = b"", i + 1
    return out


def _chip(text: str, ids: Sequence[int], pos: int, color: str, extra: str = "") -> str:
    shown = html.escape(text).replace("\n", "↵\n").replace("\t", "⇥")
    title = f"pos {pos}: id{'s' if len(ids) > 1 else ''} {' '.join(map(str, ids))}"
    return (f'<span title="{title}" data-pos="{pos}" style="background:{color}; color:{INK}; '
            f'border-radius:2px; padding:1px 0; margin-right:1px;{extra}">{shown}</span>')


def tokens_html(tok, ids: Sequence[int], *, cls: Callable[[int], str | None] | None = None, offset: int = 0,
                marks: dict[int, str] | None = None) -> str:
    """Ids as chips with alternating shades (token boundaries). `cls(pos)` may name a COLORS key for a
    position; `marks` maps positions to a label drawn as a bar before that token (e.g. {12: "prefix"}).

    >>> from strata_lab import load_tokenizer
    >>> h = tokens_html(load_tokenizer("qwen3"), [9707, 1879], marks={1: "here"})
    >>> h.count("<span title="), "here" in h
    (2, True)
    """
    marks = marks or {}
    parts = [f'<div style="{_BOX}">']
    for n, (s, e, text) in enumerate(pieces(tok, ids)):
        for p in range(s, e):
            if p + offset in marks:
                parts.append(_bar(marks[p + offset]))
        name = cls(s + offset) if cls else None
        color = COLORS.get(name) if name else None
        parts.append(_chip(text, ids[s:e], s + offset, color or COLORS["ab"[n % 2]]))
    if len(ids) + offset in marks:
        parts.append(_bar(marks[len(ids) + offset]))
    parts.append("</div>")
    return "".join(parts)


def _bar(label: str) -> str:
    return (f'<span style="border-left:2px solid {ALERT}; margin:0 2px; padding-left:2px; color:{ALERT}; '
            f'font-size:10px; vertical-align:super">{html.escape(label)}</span>')


def byte_to_token(tok, ids: Sequence[int], byte_offset: int) -> int:
    """Index of the token holding byte `byte_offset` of the ids' text (len(ids) past the end)."""
    n = 0
    for i, tid in enumerate(ids):
        n += len(tok.token_bytes(tid))
        if n > byte_offset:
            return i
    return len(ids)


def aligned_html(tok, held: Sequence[int], prompt: Sequence[int], *, lcp_ids: int, lcp_text: int,
                 byte_in_token: int, reused: int, segments: Sequence[tuple] = (), before: int = 12,
                 after: int = 24) -> str:
    """Held and prompt ids from a little before their first id divergence, one row each.

    Grey: ids both share; yellow: ids that differ while the text is the same (a retokenization); red: the
    token holding the first text divergence; green / violet on the held row: generated / drained ids.
    Bars mark `reused` (what the engine took from its state), the first id and the first text divergence.
    """
    start = max(0, min(lcp_ids, reused) - before)
    text_byte = len(tok.ids_bytes(held[:lcp_text])) + byte_in_token
    text_tok_prompt = byte_to_token(tok, prompt, text_byte)
    # where the prompt's ids after lcp_ids stop spelling the held text: its tokens before text_tok_prompt
    seg_kind = {}
    for s, e, kind, *_ in segments:
        if kind in ("gen", "drained"):
            for p in range(max(s, start), min(e, lcp_text + after + 1)):
                seg_kind[p] = kind

    def held_cls(p):
        if p < lcp_ids:
            return "common"
        if p < lcp_text:
            return "same_text"
        if p == lcp_text:
            return "diverge"
        return seg_kind.get(p)

    def prompt_cls(p):
        if p < lcp_ids:
            return "common"
        if p < text_tok_prompt:
            return "same_text"
        if p == text_tok_prompt:
            return "diverge"
        return None

    h_end = min(len(held), max(lcp_text + 1, lcp_ids) + after)
    p_end = min(len(prompt), max(text_tok_prompt + 1, lcp_ids) + after)

    def marks(side_text_tok):
        m = {reused: f"reused {reused}"}
        if lcp_ids != reused:
            m[lcp_ids] = f"id ≠ at {lcp_ids}"
        if side_text_tok not in m and side_text_tok != lcp_ids:
            m[side_text_tok] = "text ≠" if lcp_text < len(held) else "held text ends"
        return m

    label = f'style="font:11px sans-serif; color:{MUTED}; margin-top:4px"'
    return (f'<div {label}>held [{start}:{h_end}] of {len(held)}</div>'
            + tokens_html(tok, list(held[start:h_end]), cls=held_cls, offset=start, marks=marks(lcp_text))
            + f'<div {label}>prompt [{start}:{p_end}] of {len(prompt)}</div>'
            + tokens_html(tok, list(prompt[start:p_end]), cls=prompt_cls, offset=start,
                          marks=marks(text_tok_prompt)))
