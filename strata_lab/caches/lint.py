"""Lint a trace for text that breaks the prompt prefix across calls, price each finding per engine, and fix
what can be fixed by moving content (never deleting it).

Rules (each `Finding` names the call, the position and the text):

| rule | fires when | fix |
|---|---|---|
| `volatile_system` | consecutive calls of a session send a system message that differs only in its volatile parts (`mask_volatile`: a timestamp, a date, a request id) | move the line to the end of the last message (a user message or a tool output) |
| `per_user_early` | the first prompts of two sessions part inside the system message on a line with other words (a user's name, plan, locale) and agree again after it | move the line to the end of the last message (a user message or a tool output) |
| `tool_schema_order` | a `<tools>` definition whose text changes while its JSON does not (key order, whitespace) | rewrite every tool as canonical JSON (sorted keys) |
| `reasoning_stripped` | the reply's reasoning is gone from the next prompt: the client sent it back without it, or the template drops it (the explainer's `template_rewrite`) | none here: send reasoning back, keep it in the template |
| `arguments_reserialised` | the client sends a reply's tool-call arguments back as other text (key order, spacing) | none here: send the arguments back as received |
| `tool_output_truncated` | the client sends an earlier tool output back shorter | none here: truncate once, when the output is first sent |
| `history_edit` | the client changes another message its session held (an edited turn, a dropped message) | none |
| `breakpoint_lookback` | an Anthropic breakpoint more than `lookback_blocks` content blocks past the session's previous one | add a breakpoint at the last boundary the look-back still reaches |
| `prefix_mid_block` | the prefix shared by all sessions ends mid-block (vLLM / TRT-LLM blocks) | none: the lost ids are reported |
| `below_minimum` | a prompt under the hosted minimum that the next call of its session extends | none |

Rules are template-agnostic: on an imported log, the client's habits come from its messages (each dump line's
`history_change`, `strata_lab/traces/habits.py`), and a call whose messages resend what its session held yet
whose ids part was rewritten by the template; on a dump of ids, the system message is located by the
template's own structure (`TemplateStructure`, found by rendering probe conversations; default qwen3's). The
fixes find the system message's lines and the last message (a user message or a tool output) the same way,
so they move text under any template (`--template` names the one the prompts were rendered with).

`tokens` of a finding is what it costs the call, per engine: the ids the session held (up to the prompt's
length) that the engine does not reuse, for divergences; the ids past the last whole block for
`prefix_mid_block`; the prompt for `below_minimum`.

Why one module: the rules, their pricing and the fixes share the finding positions and the per-session
replays; split, each part would re-derive the other's spans.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

import numpy as np

from strata_lab.caches.call_ids import Call, as_ids, calls_from_dump
from strata_lab.text.structure import TemplateStructure, mask_volatile

__all__ = ["Finding", "lint_calls", "fix_calls", "check_fixes", "fix_table", "dump_engines", "before_after",
           "before_after_sessions", "replayed_engines", "RULES", "REFERENCE_ENGINES"]

RULES = ("volatile_system", "per_user_early", "tool_schema_order", "reasoning_stripped", "arguments_reserialised",
         "tool_output_truncated", "history_edit", "breakpoint_lookback", "prefix_mid_block", "below_minimum")
FIXABLE = ("volatile_system", "per_user_early", "tool_schema_order", "breakpoint_lookback")
# a client habit (traces/habits.py) -> the rule that reports it
_HABIT_RULE = {"volatile_system": "volatile_system", "reasoning_dropped": "reasoning_stripped",
               "arguments_reserialised": "arguments_reserialised", "tool_output_truncated": "tool_output_truncated",
               "history_edit": "history_edit"}


@dataclass
class Finding:
    rule: str
    index: int                 # the call (trace index)
    session: str
    position: int              # char offset in the prompt text (ids for block / minimum rules)
    text: str                  # the text that breaks the prefix (a line, a tool, ...)
    tokens: dict = field(default_factory=dict)   # engine spec (as given) -> ids re-read because of it
    other: str | None = None   # per_user_early: the session whose line it is compared with

    def __str__(self):
        cost = ", ".join(f"{k} {v}" for k, v in self.tokens.items())
        return f"{self.rule}: call {self.index} (session {self.session}) at {self.position}: {self.text!r}" + \
            (f" [{cost}]" if cost else "")


def _line_at(text: str, pos: int) -> tuple[int, int]:
    a = text.rfind("\n", 0, pos) + 1
    b = text.find("\n", pos)
    return a, (len(text) if b < 0 else b)


def _first_diff(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _system_end(text: str, structure: TemplateStructure) -> int:
    """Where the system message ends in a prompt's text (-1: it opens with none)."""
    span = structure.system_span(text)
    return span[1] if span is not None else -1


def _structure(template) -> TemplateStructure:
    """The `TemplateStructure` of a template given as a ChatTemplate, a preset name or a file (None: qwen3's)."""
    if isinstance(template, TemplateStructure):
        return template
    from strata_lab.text.template import TEMPLATE_PRESETS, ChatTemplate

    if template is None:
        template = "qwen3"
    if not isinstance(template, ChatTemplate):
        template = ChatTemplate.from_name(template) if template in TEMPLATE_PRESETS else ChatTemplate.from_file(template)
    return TemplateStructure.of(template)


def _history_change(c):
    """(has the field, the change) of a call's dump line (`history_change`, written by import)."""
    rec = c.record
    if rec is None:
        return False, None
    try:
        return True, rec["history_change"]
    except KeyError:
        return False, None


def _tools(text: str) -> list[str]:
    a, b = text.find("<tools>\n"), text.find("\n</tools>")
    return text[a + 8:b].split("\n") if 0 <= a < b else []


def _canonical(line: str) -> str | None:
    try:
        return json.dumps(json.loads(line), sort_keys=True, ensure_ascii=False)
    except ValueError:
        return None


def _sessions(calls):
    by: dict = {}
    for c in calls:
        by.setdefault(c.session, []).append(c)
    return by


def lint_calls(dump, tokenizer="qwen3", *, engines=("vllm", "sglang", "anthropic"), price: bool = True,
               template=None, progress: bool = False):
    """All findings on a trace, each priced per engine (see the module docstring).

    Args:
        dump: a dump path, paths, `Dump`, or a list of `Call`.
        tokenizer: a Tokenizer or a name ("qwen3"), to decode prompts.
        template: the chat template the prompts were rendered with (a ChatTemplate, preset name or file):
            where its system message lies (default: qwen3's). Imported logs need none to find the client's
            habits: their lines say what the client changed.
        engines: the engine specs findings are priced on, as given ("vllm:block_size=64"): the block rules
            use their block sizes, the minimum rule their minimums, and `Finding.tokens` is keyed by them.
        price: replay the engines to price divergence findings (False: only the rules' own counts).
        progress: progress bars on stderr (decoding the prompts, the pricing replays).
    """
    from strata_lab.caches.presets import parse_engine
    from strata_lab.caches.replay import replay_engines

    calls = calls_from_dump(dump)
    tok = _tokenizer(tokenizer)
    structure = _structure(template)
    from strata_lab.progress import progress_bar

    texts = {c.index: tok.decode(c.prompt.tolist())
             for c in progress_bar(calls, enabled=progress, desc="lint: decode", unit="call")}
    out: list[Finding] = []
    sessions = _sessions(calls)
    for sid, cs in sessions.items():
        for prev, c in zip(cs, cs[1:]):
            a, b = texts[prev.index], texts[c.index]
            d = _first_diff(a, b)
            has, change = _history_change(c)
            if has:   # an imported log: its messages say what the client changed (any template)
                if isinstance(change, dict) and change.get("habit") in _HABIT_RULE:
                    rule = _HABIT_RULE[change["habit"]]
                    text = change.get("text") or ""
                    if rule == "volatile_system" and 0 <= d < len(b):   # the line as the prompt has it
                        lb = _line_at(b, d)
                        if mask_volatile(a[_line_at(a, d)[0]:_line_at(a, d)[1]]) == mask_volatile(b[lb[0]:lb[1]]):
                            text = b[lb[0]:lb[1]]
                    out.append(Finding(rule, c.index, sid, d, text))
            else:
                end = _system_end(b, structure)
                if 0 <= d < end:
                    la, lb = _line_at(a, d), _line_at(b, d)
                    old, new = a[la[0]:la[1]], b[lb[0]:lb[1]]
                    if mask_volatile(old) == mask_volatile(new):
                        out.append(Finding("volatile_system", c.index, sid, lb[0], new))
            ta, tb = _tools(a), _tools(b)
            if ta != tb and len(ta) == len(tb) and [_canonical(x) for x in ta] == [_canonical(x) for x in tb]:
                k = next(i for i, (x, y) in enumerate(zip(ta, tb)) if x != y)
                out.append(Finding("tool_schema_order", c.index, sid, b.find(tb[k]), tb[k][:80]))
    firsts = [cs[0] for cs in sessions.values()]
    for prev, c in zip(firsts, firsts[1:]):
        a, b = texts[prev.index], texts[c.index]
        d, end = _first_diff(a, b), _system_end(b, structure)
        if 0 <= d < end:
            la, lb = _line_at(a, d), _line_at(b, d)
            old, new = a[la[0]:la[1]], b[lb[0]:lb[1]]
            if mask_volatile(old) != mask_volatile(new) and a[la[1]:_system_end(a, structure)] == b[lb[1]:end]:
                out.append(Finding("per_user_early", c.index, c.session, lb[0], new, other=prev.session))
    # template rewrites of reasoning: the one explainer's divergence per call (computed once, no replay)
    from strata_lab.caches.replay import explain_calls

    views = explain_calls(calls, tok)
    think = structure.think or ("<think>", "</think>")
    for i, c in enumerate(calls):
        e = views[i][2]
        held_ctx = e.div.text_context_held if e.div is not None else ""
        has, change = _history_change(c)
        if e.divergence != "template_rewrite" or (isinstance(change, dict) and
                                                  change.get("habit") == "reasoning_dropped"):
            continue   # (the client's dropped reasoning is reported above, from its messages)
        if (has and change is None and any(m in held_ctx for m in think)) or (not has and think[0] in held_ctx):
            out.append(Finding("reasoning_stripped", c.index, c.session, e.lcp_ids,
                               "the template drops the reply's reasoning: " + held_ctx[:80]))
    # Anthropic look-back
    anth = parse_engine("anthropic")
    for sid, cs in sessions.items():
        last_bp = None
        for c in cs:
            bps = anth.breakpoints(c)
            bounds = anth.boundaries(c)
            if last_bp is not None and bps:
                gap = sum(1 for b in bounds if last_bp < b <= min(x for x in bps if x > last_bp)) \
                    if any(x > last_bp for x in bps) else 0
                if gap >= anth.lookback_blocks:
                    out.append(Finding("breakpoint_lookback", c.index, sid, max(bps),
                                       f"{gap} content blocks since the breakpoint at {last_bp}"))
            if bps:
                last_bp = max(bps)
    # the prefix every session shares, against the block sizes of the engines asked for
    if len(firsts) > 1:
        shared = min(_lcp_all(firsts[0].prompt, f.prompt) for f in firsts[1:])
        for spec in engines:
            e = parse_engine(spec)
            B = getattr(e, "block", None) if e.engine == "vllm" else \
                getattr(e, "tokens_per_block", None) if e.engine == "trtllm" else None
            if B and shared % B and shared > B:
                out.append(Finding("prefix_mid_block", firsts[1].index, firsts[1].session, shared,
                                   f"{shared} shared ids = {shared // B} blocks of {B} + {shared % B}",
                                   {spec: shared % B}))
    hosted = [(spec, e) for spec, e in ((s, parse_engine(s)) for s in engines) if hasattr(e, "min_tokens")]
    if hosted:
        hosted_min = min(e.min_tokens for _, e in hosted)
        for sid, cs in sessions.items():
            for prev, c in zip(cs, cs[1:]):
                if prev.prompt_len < hosted_min and _lcp_all(prev.prompt, c.prompt) == prev.prompt_len:
                    out.append(Finding("below_minimum", prev.index, sid, prev.prompt_len,
                                       f"{prev.prompt_len} ids < {hosted_min}",
                                       {spec: prev.prompt_len for spec, e in hosted
                                        if prev.prompt_len < e.min_tokens}))
    if price and out:
        rep = replay_engines(calls, engines, tokenizer=tok, progress=progress)
        # what the finding costs a call: the report's `reread` (Contract 3), the tokens the session held that
        # the engine read again
        cols = rep.cols
        rr = {(e, i): v for e, i, v in zip(cols["spec"], cols["index"], cols["reread"])}
        for f in out:
            if not f.tokens:
                f.tokens = {e: int(rr.get((parse_engine(e).spec(), f.index), 0)) for e in engines}
    return sorted(out, key=lambda f: (f.index, RULES.index(f.rule)))


def _lcp_all(a: np.ndarray, b: np.ndarray) -> int:
    from strata_lab.caches.call_ids import lcp

    return lcp(a, b)


def _tokenizer(tok):
    if isinstance(tok, str):
        from strata_lab.text.tokenizer import load_tokenizer

        return load_tokenizer(tok)
    return tok


def _move_line_to_end(text: str, start: int, end: int, structure: TemplateStructure) -> str:
    """Take text[start:end] (a line of the system message) out, with one newline beside it, and append it to
    the end of the last message's content, a user message or a tool output (where the template's structure
    puts it): each call's line then sits after everything the session sent before; the text unchanged when the
    prompt has no such message after the system message."""
    line = text[start:end]
    if text[end:end + 1] == "\n":
        cut = text[:start] + text[end + 1:]
    elif start > 0 and text[start - 1] == "\n":   # the system message's last line: its newline is before it
        cut = text[:start - 1] + text[end:]
    else:
        return text
    at = structure.last_content_end(cut)
    sys_span = structure.system_span(cut)
    if at is None or (sys_span is not None and at <= sys_span[1]):
        return text
    return cut[:at] + "\n" + line + cut[at:]


def _line_no(text: str, pos: int) -> int:
    return text[:pos].count("\n")


def _system_lines(text: str, structure: TemplateStructure) -> list[tuple[int, int]]:
    """(start, end) of each line of the system message's content that can move: every line when it has more
    than one (a line alone is the whole message)."""
    span = structure.system_span(text)
    if span is None:
        return []
    a, end = span
    out = []
    while a < end:
        b = text.find("\n", a, end)
        b = end if b < 0 else b
        out.append((a, b))
        a = b + 1
    return [(x, y) for x, y in out if y > x] if len(out) > 1 else []


def _moves(calls, findings, tok) -> dict:
    """session -> the system-message lines to move: ("norm", pattern) for volatile lines (digits / hex
    replaced), ("exact", text) for a user's line. Only sessions a finding names (or compares with)."""
    by_index = {c.index: c for c in calls}
    firsts = {}
    for c in calls:
        firsts.setdefault(c.session, c)
    moves: dict = {}
    for f in findings:
        if f.rule == "volatile_system":
            moves.setdefault(f.session, set()).add(("norm", mask_volatile(f.text)))
        elif f.rule == "per_user_early":
            moves.setdefault(f.session, set()).add(("exact", f.text))
            if f.other is not None and f.index in by_index and f.other in firsts:
                n = _line_no(tok.decode(by_index[f.index].prompt.tolist()), f.position)
                other = tok.decode(firsts[f.other].prompt.tolist()).split("\n")
                if n < len(other):
                    moves.setdefault(f.other, set()).add(("exact", other[n]))
    return moves


def fix_calls(dump, findings=None, tokenizer="qwen3", *, template=None) -> list[Call]:
    """The trace with the given fixable findings fixed (content moved or re-serialised, never removed),
    touching only what each finding names.

    Prompts are decoded, rewritten and encoded again; outputs stay as recorded. In the sessions a
    `volatile_system` / `per_user_early` finding names (and, for the latter, the session it was compared
    with), the system-message line it names (a volatile line by its shape: `mask_volatile`) moves to the end
    of the last message of each prompt (a user message or a tool output), both found by the template's structure;
    in the sessions a `tool_schema_order`
    finding names, tools become canonical JSON; a breakpoint is added where the look-back ends in the
    sessions a `breakpoint_lookback` finding names. Calls of other sessions stay as they are.

    Args:
        dump: a dump path, paths, `Dump`, or a list of `Call`.
        findings: the findings to fix (default: every finding `lint_calls` reports).
        tokenizer: a Tokenizer or a name.
        template: the chat template the prompts were rendered with (as `lint_calls`; default qwen3's).
    """
    from strata_lab.caches.presets import parse_engine

    calls = calls_from_dump(dump)
    tok = _tokenizer(tokenizer)
    structure = _structure(template)
    findings = lint_calls(dump, tok, price=False, template=structure) if findings is None else findings
    moves = _moves(calls, findings, tok)
    canon = {f.session for f in findings if f.rule == "tool_schema_order"}
    lookback_sessions = {f.session for f in findings if f.rule == "breakpoint_lookback"}
    anth = parse_engine("anthropic")
    lookback = anth.lookback_blocks
    out, last_bp = [], {}
    for c in calls:
        if c.session not in moves and c.session not in canon and c.session not in lookback_sessions:
            out.append(c)
            continue
        text = tok.decode(c.prompt.tolist())
        new = text
        wanted = moves.get(c.session, set())
        for a, b in reversed(_system_lines(new, structure)):   # bottom first: earlier offsets stay valid
            line = new[a:b]
            if ("exact", line) in wanted or ("norm", mask_volatile(line)) in wanted:
                new = _move_line_to_end(new, a, b, structure)
        if c.session in canon:
            ts = _tools(new)
            if ts:
                a = new.find("<tools>\n") + 8
                old = "\n".join(ts)
                new = new[:a] + "\n".join(_canonical(x) or x for x in ts) + new[a + len(old):]
        prompt = c.prompt if new == text else as_ids(tok.encode(new))
        fixed = replace(c, prompt=prompt, memo=None)
        if c.session in lookback_sessions and c.breakpoints and prompt is c.prompt:
            bounds = anth.boundaries(c)
            prev = last_bp.get(c.session)
            bps = list(c.breakpoints)
            later = [b for b in bounds if prev is not None and b > prev]
            if later and len(bps) < anth.max_breakpoints and len(later) >= lookback and later[lookback - 2] < min(bps):
                bps = sorted(bps + [later[lookback - 2]])   # the look-back from here still reaches prev
            fixed = replace(fixed, breakpoints=tuple(bps))
            last_bp[c.session] = max(bps)
        out.append(fixed)
    return out


# engines replayed beside the ones asked for, so a fix's gain or cost on them is seen (never judged)
REFERENCE_ENGINES = ("vllm", "sglang", "llama.cpp", "anthropic", "strata")


def dump_engines(dump) -> list[str]:
    """The engines a trace names, to judge fixes on by default: those its reported cache figures come from
    (`cache_engine`, our dumps' `reused`: strata) when they are engines we model, else the replay's default
    (`replay.default_engine`: our engine)."""
    from strata_lab.caches.presets import ENGINES
    from strata_lab.caches.replay import default_engine

    calls = calls_from_dump(dump)
    named = sorted({c.reported_by for c in calls if c.reported_by in ENGINES})
    return named or [default_engine(calls)]


def _session_read(calls, specs, column: str = "read") -> dict:
    """(spec as given, session) -> prompt ids read (not reused; `column="reread"`: ids the session held and
    read again), replayed under each spec."""
    from strata_lab.caches.replay import replay_engines

    specs = list(specs)
    df = replay_engines(calls, specs).frame()
    # the report's specs, in the order given (a strata spec shows what the dump settled: `caches.strata.for_calls`)
    label = dict(zip(dict.fromkeys(df["spec"].astype(str)), specs))
    g = df.groupby([df["spec"].astype(str), df["session"].astype(str)])[["read", "reread"]].sum()
    return {(label[k[0]], k[1]): int(v[column]) for k, v in g.iterrows()} if column else \
        {(label[k[0]], k[1]): (int(v["read"]), int(v["reread"])) for k, v in g.iterrows()}


def replayed_engines(asked, shown):
    """The specs replayed: those asked for, then each engine of `shown` none of them is."""
    from strata_lab.caches.presets import parse_engine

    have = {parse_engine(e).engine for e in asked}
    return list(dict.fromkeys(list(asked) + [e for e in shown if parse_engine(e).engine not in have]))


def check_fixes(dump, findings, tokenizer="qwen3", engines=None, *, template=None, shown=REFERENCE_ENGINES,
                progress: bool = False):
    """Fix the fixable findings one group at a time (a rule and the sessions it names; a volatile line, in
    every session that has it), judged on the engines
    asked for (`engines`; default: those the trace names, `dump_engines`): a group is kept only where each of
    them reads fewer ids over the trace and no session the fix rewrites reads more on any of them (a session
    it leaves as it was may read a little more, a prefix it shared with a rewritten one: said in `why`). The engines of `shown` that none asked for are replayed too and what
    a fix gains or costs there is shown, marked, never a reason to keep or drop it. Returns (fixed calls,
    decisions), one decision per group: {rule, sessions, kept, why, per_engine}, where per_engine maps each
    spec replayed to {asked, read_before, read_after, reread_before, reread_after} (ids summed over the trace).

    Args:
        dump: a dump path, paths, `Dump`, or a list of `Call`.
        findings: the findings (`lint_calls`); those of rules without a fix are ignored.
        tokenizer: a Tokenizer or a name.
        engines: engine specs to judge on, as given on the command line (None: `dump_engines`).
        template: the chat template the prompts were rendered with (as `lint_calls`; default qwen3's).
        shown: engines replayed beside them and shown, not judged (default `REFERENCE_ENGINES`; () for none).
        progress: a progress bar on stderr, one step per group checked.
    """
    tok = _tokenizer(tokenizer)
    current = calls_from_dump(dump)
    asked = list(dict.fromkeys(engines)) if engines else dump_engines(current)
    specs = replayed_engines(asked, shown)
    structure = _structure(template)
    groups: dict = {}
    for f in findings:   # a volatile line is one fix wherever it is (the client writes it into every session)
        if f.rule in FIXABLE:
            key = (f.rule, mask_volatile(f.text), None) if f.rule == "volatile_system" else (f.rule, f.session, f.other)
            groups.setdefault(key, []).append(f)
    decisions = []
    before = _session_read(current, specs, None) if groups else {}
    from strata_lab.progress import progress_bar

    def totals(read):
        return {spec: [sum(v[i] for k, v in read.items() if k[0] == spec) for i in (0, 1)] for spec in specs}

    for (rule, _, _), fs in progress_bar(list(groups.items()), enabled=progress, desc="lint: check fixes",
                                         unit="fix"):
        sessions = sorted({f.session for f in fs} | {f.other for f in fs if f.other is not None})
        candidate = fix_calls(current, fs, tok, template=structure)
        if all(a.prompt is b.prompt and a.breakpoints == b.breakpoints for a, b in zip(candidate, current)):
            decisions.append({"rule": rule, "sessions": sessions, "kept": False, "why": "changes nothing"})
            continue
        after = _session_read(candidate, specs, None)
        tb, ta = totals(before), totals(after)
        per = {spec: {"asked": spec in asked, "read_before": tb[spec][0], "read_after": ta[spec][0],
                      "reread_before": tb[spec][1], "reread_after": ta[spec][1]} for spec in specs}
        shown_text = "; ".join(f"{spec} {tb[spec][0] - ta[spec][0]:+d} ids" + ("" if spec in asked else
                                                                                " (not asked for)")
                               for spec in specs)
        rewritten = {b.session for a, b in zip(candidate, current)
                     if not (a.prompt is b.prompt and a.breakpoints == b.breakpoints)}
        worse = [(k, before[k][0], v[0]) for k, v in after.items() if k in before and v[0] > before[k][0]
                 and k[0] in asked]
        own = [w for w in worse if w[0][1] in rewritten]
        lost = [spec for spec in asked if ta[spec][0] >= tb[spec][0]]
        if own or lost:
            (spec, sid), b, a = max(own or worse or [((lost[0], None), tb[lost[0]][0], ta[lost[0]][0])],
                                    key=lambda w: w[2] - w[1])
            why = (f"session {sid} would read more on {spec} ({b} -> {a} ids)"
                   + (f" and {len(own) - 1} more" if len(own) > 1 else "") if own else
                   f"{spec} would read no fewer ids ({b} -> {a})")
            decisions.append({"rule": rule, "sessions": sessions, "kept": False, "per_engine": per,
                              "why": f"{why}; saved per engine: {shown_text}"})
            continue
        others = "; ".join(f"session {sid} reads {a - b} more on {spec} (it shared a prefix with a rewritten one)"
                           for (spec, sid), b, a in worse)
        decisions.append({"rule": rule, "sessions": sessions, "kept": True, "per_engine": per,
                          "why": f"ids saved per engine: {shown_text}; "
                                 + (others or f"no session reads more on {', '.join(asked)}")})
        current, before = candidate, after
    return current, decisions


def fix_table(decision) -> str:
    """A decision's per-engine table (`check_fixes`): ids read and re-read before and after the fix, and
    whether the engine judged it ("asked") or is only shown."""
    import pandas as pd

    rows = [{"engine": spec, "judged": "yes" if d["asked"] else "no (not asked for)",
             "reread_before": d["reread_before"], "reread_after": d["reread_after"],
             "reread_change": d["reread_after"] - d["reread_before"],
             "read_before": d["read_before"], "read_after": d["read_after"],
             "read_change": d["read_after"] - d["read_before"]}
            for spec, d in (decision.get("per_engine") or {}).items()]
    return pd.DataFrame(rows).to_string(index=False) if rows else ""


def before_after_sessions(dump, fixed, engines=("vllm", "sglang", "llama.cpp", "anthropic")):
    """One row per engine and session: ids read before and after the fix (a pandas DataFrame)."""
    import pandas as pd

    b, a = _session_read(calls_from_dump(dump), engines), _session_read(fixed, engines)
    return pd.DataFrame([{"engine": k[0], "session": k[1], "read_before": v, "read_after": a.get(k),
                          "change": (a.get(k, v) - v)} for k, v in sorted(b.items())])


def before_after(dump, fixed, engines=("vllm", "sglang", "llama.cpp", "anthropic"), asked=None):
    """One row per engine: reused, re-read and hit rate before and after the fix (a pandas DataFrame).

    Args:
        dump: the trace before (a path, `Dump` or `Call`s).
        fixed: the trace after (`Call`s, e.g. from `check_fixes`).
        engines: engine specs.
        asked: the specs the fix was judged on: a `judged` column marks the others "no (not asked for)"
            (None: no such column).
    """
    import pandas as pd

    from strata_lab.caches.replay import replay_engines

    b = replay_engines(dump, engines).summary()
    a = replay_engines(fixed, engines).summary()
    df = pd.DataFrame({"engine": b["spec"], "reused_before": b["reused"], "reused_after": a["reused"],
                       "reread_before": b["reread"], "reread_after": a["reread"],
                       "hit_rate_before": b["hit_rate"], "hit_rate_after": a["hit_rate"]})
    if asked is not None:
        engines = [engines] if isinstance(engines, str) else list(engines)   # the summary's rows, in this order
        df.insert(1, "judged", ["yes" if e in asked else "no (not asked for)" for e in engines])
    return df
