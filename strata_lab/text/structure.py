"""What a chat template does with a conversation, found by rendering probe conversations with the template
itself and comparing the texts (never by looking for one family's strings): where the system message lands,
the generation prompt, the reasoning markers and whether earlier replies keep their reasoning.

Lint rules and miss causes that must hold for any template (ChatML, DeepSeek, Llama, Mistral, ...) read a
template through this, and `mask_volatile` is the one definition of the volatile part of a text (a
timestamp, a date, a request id) that lint and session chaining share.

>>> from strata_lab import ChatTemplate
>>> s = TemplateStructure.of(ChatTemplate.from_name("qwen3"))
>>> s.system_open, s.generation_prompts[-1], s.think, s.strips_history_reasoning
('<|im_start|>system\\n', '<|im_start|>assistant\\n', ('<think>', '</think>'), True)
>>> text = "<|im_start|>system\\nBe brief.<|im_end|>\\n<|im_start|>user\\nhi<|im_end|>\\n"
>>> a, b = s.system_span(text); text[a:b]
'Be brief.'
>>> mask_volatile("Now: 2026-05-01T10:00:07Z (request 7f3a9c2e-1b4d-4e5f-9a8b-0c1d2e3f4a5b), Friday 1 May")
'Now: # (request #), # # #'
"""
from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["TemplateStructure", "mask_volatile", "VOLATILE"]

# The parts of a text that change from call to call while the text means the same: ISO timestamps and dates,
# clock times, uuids and request / trace ids (a run of letters and digits holding a digit), numbers, and the
# names of weekdays and months that a date spelled out carries.
VOLATILE = re.compile(
    r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?"
    r"|\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?"
    r"|[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}"
    r"|\b(?=[A-Za-z_-]*\d)[0-9A-Za-z][0-9A-Za-z_-]{5,}\b"
    r"|\d+"
    r"|\b(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)(?:day|sday|nesday|rsday|urday)?\b"
    r"|\b(?:January|February|March|April|May|June|July|August|September|October|November|December"
    r"|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)\b")


def mask_volatile(text: str) -> str:
    """`text` with each volatile part (`VOLATILE`) replaced by ``#``: two texts that differ only in a
    timestamp, a date or a request id mask to the same string.

    >>> mask_volatile("Current time: 2026-12-01T10:01:17Z") == mask_volatile("Current time: 2026-12-01T10:02:17Z")
    True
    >>> mask_volatile("You are Alice") == mask_volatile("You are Bob")
    False
    """
    return VOLATILE.sub("#", text)


_SYS = ("STRATA_PROBE_SYSTEM_A", "STRATA_PROBE_SYSTEM_B")
_USER = ("STRATA_PROBE_USER_ONE", "STRATA_PROBE_USER_TWO")
_REPLY, _REASONING, _TOOL = "STRATA_PROBE_REPLY", "STRATA_PROBE_REASONING", "STRATA_PROBE_TOOL_OUTPUT"
_TAG = re.compile(r"(<[^<>\s]{1,24}>|<｜[^｜]{1,24}｜>|\[[A-Z_/]{2,24}\])")
_TURN_END = re.compile(r"[ \t\n]*" + _TAG.pattern)   # a marker right after a reply (whitespace before it)
_CACHE: dict = {}


def _tool_call(string: bool = False):
    """A probe tool call; `string`: its arguments as the client's JSON text (templates that splice them in)."""
    return {"id": "call00001", "type": "function",
            "function": {"name": "probe", "arguments": '{"k": "v"}' if string else {"k": "v"}}}


@dataclass(frozen=True)
class TemplateStructure:
    """A template's structure, from probe renders (`of`).

    system_open: the text before the system message's content when a prompt starts with it (None: the
        template puts the system message elsewhere, e.g. into the last user turn).
    system_opens: every such text the probes saw (without tools, then with tools: some templates write
        into the system turn's header when tools are given); `system_span` tries each.
    system_closes: `system_close`, and the system turn's own close when tools come between it and the first
        user message (`system_span` ends at the first of them found).
    system_close: the text between the system content and the first user message's content.
    generation_prompts: what `add_generation_prompt` adds after a user turn (thinking off, then on) and after
        a tool output, distinct and non-empty.
    think: (open, close) reasoning markers the template writes or opens the reply with; None when it has none.
    renders_reasoning: the template writes a final reply's reasoning.
    strips_history_reasoning: an earlier reply's reasoning is gone from the next prompt (after a new user turn).
    user_open: the text every user message's content follows (the end of the turn before it and the user
        header; None when the probes do not agree on one).
    user_ends: the texts that can follow a user message's content (the next turn's opening, the generation
        prompts), each with what closes the user turn.
    turn_end: the marker the template writes right after a reply's content to end the turn (``<|im_end|>``,
        ``<|eot_id|>``, ``<｜end▁of▁sentence｜>``, ``</s>`` where `eos_token` is set), what the model generates
        last; None when a reply's turn ends with no marker.
    tool_close: what follows a tool output's content when it is the last message of a prompt (before any
        generation prompt); None when the probe's tool output is not found.
    """

    name: str
    system_open: str | None
    system_close: str
    generation_prompts: tuple
    think: tuple | None
    renders_reasoning: bool
    strips_history_reasoning: bool
    user_open: str | None = None
    user_ends: tuple = ()
    system_opens: tuple = ()
    system_closes: tuple = ()
    turn_end: str | None = None
    tool_close: str | None = None

    @classmethod
    def of(cls, template) -> "TemplateStructure":
        """The structure of a `ChatTemplate` (computed once per template source)."""
        key = (template.source, tuple(sorted(template.special_tokens.items())))
        got = _CACHE.get(key)
        if got is None:
            got = _CACHE[key] = cls._probe(template)
        return got

    @classmethod
    def _probe(cls, t) -> "TemplateStructure":
        def render(msgs, gen=False, **kw):
            try:
                return t.render(msgs, add_generation_prompt=gen, **kw)
            except Exception:   # a template that refuses a probe shape (roles, ids) tells nothing about it
                return None

        sys_a = [{"role": "system", "content": _SYS[0]}, {"role": "user", "content": _USER[0]}]
        text = render(sys_a) or ""
        i, j = text.find(_SYS[0]), text.find(_USER[0])
        system_open, system_close = None, ""
        if 0 <= i < j:
            system_close = text[i + len(_SYS[0]):j]
            longer = render(sys_a + [{"role": "assistant", "content": _REPLY}, {"role": "user", "content": _USER[1]}])
            # the system message opens every prompt (not only the one whose last user turn carries it)
            if longer is not None and longer.find(_SYS[0]) == i and text[:i] == longer[:i]:
                system_open = text[:i]
        sys_opens = [system_open]
        tooled = render(sys_a, tools=[{"type": "function", "function": {"name": "probe", "description": "probe",
                                                                         "parameters": {"type": "object"}}}])
        sys_closes = [system_close]
        if system_open is not None and tooled is not None and 0 <= tooled.find(_SYS[0]) < tooled.find(_USER[0]):
            ti = tooled.find(_SYS[0])
            sys_opens.append(tooled[:ti])
            after = tooled[ti + len(_SYS[0]):]
            k = 0
            while k < min(len(after), len(system_close)) and after[k] == system_close[k]:
                k += 1
            if 0 < k < len(system_close):   # the tools sit between the system turn's close and the user's
                sys_closes.append(system_close[:k])
        user = [{"role": "user", "content": _USER[0]}]
        gens = []
        base = render(user)
        for kw in ({"enable_thinking": False}, {"enable_thinking": True}, {}):
            g = render(user, True, **kw)
            if base is not None and g is not None and g.startswith(base) and len(g) > len(base):
                gens.append(g[len(base):])
        for string in (False, True):   # parsed arguments, else the JSON text (DeepSeek V3.1 as shipped)
            tool_turn = user + [{"role": "assistant", "content": "", "tool_calls": [_tool_call(string)]},
                                {"role": "tool", "tool_call_id": "call00001", "content": _TOOL}]
            a = render(tool_turn)
            if a is not None:
                break
        b = render(tool_turn, True)
        if a is not None and b is not None and b.startswith(a) and len(b) > len(a):
            gens.append(b[len(a):])
        gens = tuple(dict.fromkeys(gens))
        reply = {"role": "assistant", "content": _REPLY, "reasoning_content": _REASONING}
        last = render(user + [reply]) or ""
        renders = _REASONING in last
        think = None
        if renders:
            k = last.find(_REASONING)
            before = _TAG.findall(last[:k])
            after = _TAG.findall(last[k + len(_REASONING):last.find(_REPLY, k)])
            if before and after:
                think = (before[-1], after[0])
        if think is None:   # a template that opens the reply with the marker (thinking on) and closes it (off)
            tags_on = [_TAG.findall(g) for g in gens]
            ends = [x[-1] for x in tags_on if x]
            opens = [e for e in ends if not e.startswith(("</", "<｜/"))]
            closes = [e for e in ends if e.startswith("</")]
            if opens and closes:
                think = (opens[0], closes[0])
        hist = render(user + [reply, {"role": "user", "content": _USER[1]}], True) or ""
        ended = render(user + [{"role": "assistant", "content": _REPLY}]) or ""
        end = _TURN_END.match(ended, ended.rfind(_REPLY) + len(_REPLY)) if _REPLY in ended else None
        user_open, user_ends = cls._user_turn(render, sys_a, gens)
        tool_close = a[a.rfind(_TOOL) + len(_TOOL):] if a is not None and _TOOL in a else None
        return cls(name=t.name, system_open=system_open, system_close=system_close, generation_prompts=gens,
                   think=think, renders_reasoning=renders, strips_history_reasoning=_REASONING not in hist,
                   user_open=user_open, user_ends=user_ends,
                   system_opens=tuple(dict.fromkeys(o for o in sys_opens if o is not None)),
                   system_closes=tuple(dict.fromkeys(c for c in sys_closes if c)),
                   turn_end=end.group(1) if end else None, tool_close=tool_close)

    @staticmethod
    def _user_turn(render, sys_a, gens) -> tuple:
        """(user_open, user_ends) from a conversation of two user turns around a reply."""
        two = render(sys_a + [{"role": "assistant", "content": _REPLY}, {"role": "user", "content": _USER[1]}])
        if two is None:
            return None, ()
        u1, r, u2 = two.find(_USER[0]), two.find(_REPLY), two.find(_USER[1])
        if not 0 <= u1 < r < u2:
            return None, ()
        before1, before2 = two[:u1], two[r + len(_REPLY):u2]
        k = 0
        while k < min(len(before1), len(before2)) and before1[-1 - k] == before2[-1 - k]:
            k += 1
        close = two[u2 + len(_USER[1]):]   # what ends the last user turn (no generation prompt)
        ends = [two[u1 + len(_USER[0]):r]] + [close + g for g in gens] + [close]
        return (before1[len(before1) - k:] or None), tuple(dict.fromkeys(e for e in ends if e))

    def system_span(self, text: str) -> tuple[int, int] | None:
        """(start, end) of the system message in a prompt's text (its content, and what the template writes
        into the same turn: tools), or None when the prompt does not open with one."""
        if self.system_open is None or not self.system_close:
            return None
        opening = next((o for o in sorted(self.system_opens or (self.system_open,), key=len, reverse=True)
                        if text.startswith(o)), None)
        if opening is None:
            return None
        a = len(opening)
        ends = [b for b in (text.find(c, a) for c in self.system_closes or (self.system_close,)) if b >= 0]
        return (a, min(ends)) if ends else None

    def last_user_span(self, text: str) -> tuple[int, int] | None:
        """(start, end) of the content of the last user message in a prompt's text (what the template writes
        for the user role: with some templates a tool output too), or None when none is found.

        >>> from strata_lab import ChatTemplate
        >>> s = TemplateStructure.of(ChatTemplate.from_name("qwen3"))
        >>> text = "<|im_start|>user\\nhi<|im_end|>\\n<|im_start|>assistant\\nyes<|im_end|>\\n<|im_start|>user\\nmore<|im_end|>\\n"
        >>> a, b = s.last_user_span(text); text[a:b]
        'more'
        """
        if not self.user_open:
            return None
        a = text.rfind(self.user_open)
        if a < 0:
            return None
        a += len(self.user_open)
        ends = [b for b in (text.find(e, a) for e in self.user_ends) if b >= 0]
        return (a, min(ends)) if ends else None

    def last_content_end(self, text: str) -> int | None:
        """Where the content of a prompt's last message ends: a user message's, or a tool output's where the
        prompt ends with one (templates that write tool outputs in a turn of their own); None when neither is
        found.

        >>> from strata_lab import ChatTemplate
        >>> s = TemplateStructure.of(ChatTemplate.from_name("qwen3"))
        >>> text = "<|im_start|>system\\nS<|im_end|>\\n<|im_start|>user\\nhi<|im_end|>\\n<|im_start|>assistant\\n"
        >>> text[s.last_content_end(text):]
        '<|im_end|>\\n<|im_start|>assistant\\n'
        """
        span = self.last_user_span(text)
        ends = [span[1]] if span is not None else []
        body = text[:len(text) - len(self.generation_prompt_at_end(text))]
        if self.tool_close and body.endswith(self.tool_close):
            ends.append(len(body) - len(self.tool_close))
        return max(ends) if ends else None

    def generation_prompt_at_end(self, text: str) -> str:
        """The generation prompt a prompt's text ends with ("" when none of the template's does)."""
        for g in sorted(self.generation_prompts, key=len, reverse=True):
            if text.endswith(g):
                return g
        return ""
