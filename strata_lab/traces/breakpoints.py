"""Anthropic ``cache_control`` breakpoints as token positions of the rendered prompt, for the dump's
``cache_control`` field (what the Anthropic cache model reads: with it, the model runs in breakpoint mode).

A reader locates each breakpoint in the converted call (`anthropic.from_request` writes ``extra["cache_at"]``:
the end of a system block, of a tool definition, of a message's content part, tool call or reasoning). Here a
private-use character is put at that spot, the prompt rendered again, and the first character where the two
renders differ is the breakpoint's end in the text; the token position is the number of prompt tokens that end
at or before it. ``["auto"]`` (a top-level ``cache_control``: automatic mode) is the end of the prompt. An
Anthropic call with no ``cache_control`` at all gets an empty list (nothing is cached); calls of other formats
get None (the dump says nothing, the model runs in automatic mode).

`positions` also gives the ends of the request's content blocks (the dump's ``content_blocks``: Anthropic's
look-back counts blocks, not chat turns) from one render with a distinct private-use character at the end of
every text block, image placeholder, tool result and system block (tool-use and thinking blocks are not
marked); breakpoints on such blocks take their position from that render, the others (tools, tool calls,
reasoning) from one render each. Cost per Anthropic call: two renders and one encoding, plus one render per
breakpoint on a tool definition, tool call or thinking block.

>>> from strata_lab import ChatTemplate, load_tokenizer
>>> from strata_lab.traces.anthropic import from_request
>>> call = from_request({"model": "claude", "system": [{"type": "text", "text": "Be brief.",
...     "cache_control": {"type": "ephemeral"}}], "messages": [{"role": "user", "content": "Hi"}]})
>>> tok, tmpl = load_tokenizer("qwen3"), ChatTemplate.from_name("qwen3")
>>> ids = tok.encode(tmpl.render([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]))
>>> pos = token_positions(call, tok, tmpl, ids, {})
>>> tok.decode(ids[:pos[0]])
'<|im_start|>system\\nBe brief.'
"""
from __future__ import annotations

import bisect

__all__ = ["positions", "token_positions", "MAX_BREAKPOINTS"]

SENTINEL = "\ue000"
MAX_BREAKPOINTS = 4  # Anthropic refuses more; the cache model checks it


def _messages(call: dict) -> tuple[list[dict], int]:
    msgs = list(call["messages"] or ())
    shift = 0
    if call["system"] and not (msgs and msgs[0].get("role") == "system"):
        msgs.insert(0, {"role": "system", "content": call["system"]})
        shift = 1
    return msgs, shift


def _marked(msgs: list[dict], tools, shift: int, loc: list):
    """(messages, tools) with the sentinel at `loc`, copying only what changes; None if `loc` is stale."""
    msgs, tools = list(msgs), list(tools or ())
    kind = loc[0]
    if kind == "system":
        m = dict(msgs[0])
        text = m.get("content")
        if not isinstance(text, str):
            return None
        m["content"] = text[: loc[1]] + SENTINEL + text[loc[1]:]
        msgs[0] = m
        return msgs, tools or None
    if kind == "tool":
        if loc[1] >= len(tools):
            return None
        tools[loc[1]] = {**tools[loc[1]], SENTINEL: 0}
        return msgs, tools
    k = loc[1] + shift
    if kind != "msg" or k >= len(msgs):
        return None
    m = dict(msgs[k])
    what, n = loc[2], loc[3]
    if what == "content":
        c = m.get("content")
        if isinstance(c, str) or c is None:
            m["content"] = (c or "") + SENTINEL
        elif isinstance(c, list) and n < len(c):
            c = list(c)
            c[n] = {**c[n], "text": c[n].get("text", "") + SENTINEL}
            m["content"] = c
        else:
            return None
    elif what == "call":
        calls = list(m.get("tool_calls") or ())
        if n >= len(calls):
            return None
        fn = dict(calls[n]["function"])
        args = fn.get("arguments")
        fn["arguments"] = {**args, SENTINEL: 0} if isinstance(args, dict) else str(args or "") + SENTINEL
        calls[n] = {**calls[n], "function": fn}
        m["tool_calls"] = calls
    elif what == "reasoning":
        m["reasoning_content"] = (m.get("reasoning_content") or "") + SENTINEL
    else:
        return None
    msgs[k] = m
    return msgs, tools or None


_MAX_MARKERS = 6000  # distinct private-use characters U+E000..; a call with more blocks gets no content_blocks
_FIRST = 0xE000


def _block_marked(msgs: list[dict], shift: int, locs: list) -> list[dict]:
    """Messages with private-use character U+E000+q at the end of block q (text-like blocks only)."""
    msgs = list(msgs)
    system_marks: list = []
    for q, loc in enumerate(locs):
        mark = chr(_FIRST + q)
        if loc[0] == "system" and shift:
            system_marks.append((loc[1], mark))
        elif loc[0] == "msg" and loc[2] == "content" and loc[1] + shift < len(msgs):
            k = loc[1] + shift
            m = msgs[k] = dict(msgs[k])
            c = m.get("content")
            if isinstance(c, str) or c is None:
                m["content"] = (c or "") + mark
            elif isinstance(c, list) and loc[3] < len(c):
                c = m["content"] = list(c)
                c[loc[3]] = {**c[loc[3]], "text": c[loc[3]].get("text", "") + mark}
    if system_marks:
        text = msgs[0]["content"]
        for at, mark in sorted(system_marks, reverse=True):
            text = text[:at] + mark + text[at:]
        msgs[0] = {**msgs[0], "content": text}
    return msgs


def positions(call: dict, tokenizer, template, prompt_ids, kw: dict) -> tuple[list[int] | None, list[int] | None]:
    """(cache_control, content_blocks) of one call as token positions of `prompt_ids` (rendered from `call`
    with `template` and `kw`). cache_control: ascending, at most `MAX_BREAKPOINTS` (the last ones); None when
    the log says nothing of breakpoints (not an Anthropic request). content_blocks: None when unknown (the
    template changes the text around the blocks, or the ids are not this render's)."""
    at = (call.get("extra") or {}).get("cache_at")
    if at is None or call["fidelity"] != "messages":
        return None, None
    if not at:
        return [], None  # the request set no cache_control: nothing is cached, blocks do not matter
    msgs, shift = _messages(call)
    base = template.render(msgs, tools=call["tools"], add_generation_prompt=True, **kw)
    enc = tokenizer.hf.encode(base, add_special_tokens=False)
    ends = [e for _, e in enc.offsets] if list(enc.ids) == list(prompt_ids) else None
    n = len(prompt_ids)

    def token_at(c: int) -> int:
        if ends is not None:
            return bisect.bisect_right(ends, c)
        head = tokenizer.encode(base[:c])  # the ids are not this render's: the shared prefix of the cut text
        return next((i for i, (a, b) in enumerate(zip(head, prompt_ids)) if a != b), min(len(head), n))

    locs = (call.get("extra") or {}).get("block_at") or []
    block_pos: dict = {}
    blocks = None
    if locs and len(locs) <= _MAX_MARKERS and ends is not None:
        marked = template.render(_block_marked(msgs, shift, locs), tools=call["tools"], add_generation_prompt=True,
                                 **kw)
        top = chr(_FIRST + len(locs))
        seen, plain = 0, []
        for i, ch in enumerate(marked):
            if "\ue000" <= ch < top:
                block_pos[tuple(locs[ord(ch) - _FIRST])] = token_at(i - seen)
                seen += 1
            else:
                plain.append(ch)
        if seen and "".join(plain) == base:
            blocks = sorted({p for p in block_pos.values() if 0 < p <= n})
        else:
            block_pos = {}  # the template changed the text around the markers: no positions from it
    out = set()
    for loc in at:
        if loc[0] == "auto":
            out.add(n)
            continue
        pos = block_pos.get(tuple(loc))
        if pos is None:
            marked = _marked(msgs, call["tools"], shift, loc)
            if marked is None:
                continue
            text = template.render(marked[0], tools=marked[1], add_generation_prompt=True, **kw)
            c = next((i for i, (a, b) in enumerate(zip(base, text)) if a != b), None)
            if c is None:
                continue  # the template does not show that block (e.g. old reasoning): no position to give
            pos = token_at(c)
        if 0 < pos <= n:
            out.add(pos)
    bps = sorted(out)[-MAX_BREAKPOINTS:]
    if blocks is not None:
        blocks = sorted(set(blocks) | set(bps))
    return bps, blocks


def token_positions(call: dict, tokenizer, template, prompt_ids, kw: dict) -> list[int] | None:
    """The breakpoints alone (see `positions`)."""
    return positions(call, tokenizer, template, prompt_ids, kw)[0]
