"""Turning a trace call into the token ids a server would have prefilled, with a given tokenizer and template.

Message-level calls are rendered like the server renders a request (system first, tools, the generation prompt)
and tokenized with special tokens parsed; the reply becomes the ids the template writes for it (content,
reasoning and tool calls, up to and including the end-of-turn token) unless the log carries the generated ids.
Where the log reports ``prompt_tokens``, ``render_exact`` says whether the rendered length equals it.

>>> from strata_lab import ChatTemplate, load_tokenizer
>>> from strata_lab.traces.log_calls import new_call
>>> call = new_call(fidelity="messages", messages=[{"role": "user", "content": "Hi"}], response_text="Hello",
...                 prompt_tokens=9)
>>> r = render_call(call, load_tokenizer("qwen3"), ChatTemplate.from_name("qwen3"))
>>> len(r.prompt_ids), r.exact, load_tokenizer("qwen3").decode(r.gen_ids)
(9, True, '<think>\\n\\n</think>\\n\\nHello<|im_end|>')
"""
from __future__ import annotations

import json
import re
from bisect import bisect_right
from collections import OrderedDict
from dataclasses import dataclass

from strata_lab.text.jinja import TemplateRenderError

__all__ = ["Rendered", "render_call", "reply_ids", "vllm_messages", "PrefixEncoder", "LengthsSynth"]



@dataclass(slots=True)  # (no instance dict: one object a call, not two)
class Rendered:
    prompt_ids: list[int]
    gen_ids: list[int]
    exact: bool | None       # rendered length == reported prompt_tokens (None: not reported)
    diff: int | None         # rendered length - reported prompt_tokens
    synthetic: bool = False  # lengths-only call: placeholder ids that keep the reported reuse
    gen_exact: bool | None = None  # reconstructed reply length == reported completion_tokens (None: not reported)
    gen_diff: int | None = None    # reconstructed reply length - reported completion_tokens
    notes: tuple = ()        # what the render had to assume for this call


def vllm_messages(messages: list[dict], notes: list | None = None, *, parse_arguments: bool = True) -> list[dict]:
    """Messages as vLLM's chat utils hand them to a template: ``content: None`` (what the OpenAI SDK sends beside
    ``tool_calls``) and a missing assistant content become ``""``; tool-call ``arguments`` JSON strings are
    parsed to objects (empty ones to ``{}``), so templates render them with their own ``tojson``; an empty
    ``tool_calls`` list is dropped. Arguments that are not JSON stay a string (noted).

    `parse_arguments=False`: arguments stay the JSON string the client sent (objects, e.g. Anthropic's
    ``input``, are written as JSON), for templates that splice them in as a string (DeepSeek V3 / R1 / V3.1:
    ``'<｜tool▁sep｜>' + tool['function']['arguments']``, which fails on an object).

    >>> m = vllm_messages([{"role": "assistant", "content": None, "tool_calls": [
    ...     {"type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}]}])
    >>> m[0]["content"], m[0]["tool_calls"][0]["function"]["arguments"]
    ('', {'a': 1})
    >>> vllm_messages([{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
    ...     "name": "f", "arguments": {"a": 1}}}]}], parse_arguments=False)[0]["tool_calls"][0]["function"]
    {'name': 'f', 'arguments': '{"a": 1}'}
    """
    out = []
    for m in messages:
        m = dict(m)
        if m.get("content") is None and (m.get("role") == "assistant" or "content" in m):
            m["content"] = ""
        calls = m.get("tool_calls")
        if isinstance(calls, list) and m.get("role") == "assistant":
            if not calls:
                del m["tool_calls"]
            else:
                m["tool_calls"] = [_parsed_call(c, notes, parse_arguments) for c in calls]
        out.append(m)
    return out


def _parsed_call(call, notes: list | None, parse: bool = True):
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        return call
    fn = dict(call["function"])
    args = fn.get("arguments")
    if not parse:  # the string the client sent; an object (or nothing) as JSON
        if not isinstance(args, str):
            fn["arguments"] = json.dumps({} if args is None else args, ensure_ascii=False)
        return {**call, "function": fn}
    if not args:
        fn["arguments"] = {}
    elif isinstance(args, str):
        try:
            fn["arguments"] = json.loads(args)
        except ValueError:
            if notes is not None and "tool-call arguments not JSON: rendered as the string" not in notes:
                notes.append("tool-call arguments not JSON: rendered as the string")
    return {**call, "function": fn}


def _messages(call: dict, notes: list | None = None, parse_arguments: bool = True) -> list[dict]:
    msgs = list(call["messages"] or ())
    if call["system"] and not (msgs and msgs[0].get("role") == "system"):
        msgs.insert(0, {"role": "system", "content": call["system"]})
    return vllm_messages(msgs, notes, parse_arguments=parse_arguments)


def _reply(call: dict, parse_arguments: bool = True) -> dict | None:
    m = _raw_reply(call)
    return vllm_messages([m], parse_arguments=parse_arguments)[0] if m is not None else None


STRING_ARGUMENTS = "arguments rendered as JSON strings: the template splices strings"
# the other way, noted as well, so each call says how its tool-call arguments were rendered
MAPPING_ARGUMENTS = "arguments rendered as parsed mappings: the template serialises them"


def _splices_strings(exc: Exception, call: dict) -> bool:
    """Whether a template's failure is one of a template that splices tool-call arguments in as a string (a
    TypeError from ``str + dict``) on a call whose messages or reply hold tool calls (whose arguments
    `vllm_messages` parsed to objects)."""
    return isinstance(exc.__cause__, TypeError) and _has_tool_calls(call)


def _has_tool_calls(call: dict) -> bool:
    """Whether a call's messages or reply hold tool calls (whose arguments the template renders)."""
    msgs = list(call["messages"] or ())
    return any(m.get("tool_calls") for m in msgs if isinstance(m, dict)) or bool(call["response_tool_calls"])


def _render_messages(call: dict, tokenizer, template, encoder, kw: dict, notes: list, parse_arguments: bool):
    """(prompt ids, generated ids) of a message-level call rendered by the template."""
    msgs = _messages(call, notes, parse_arguments)
    text = template.render(msgs, tools=call["tools"], add_generation_prompt=True, **kw)
    prompt = encoder.encode(text, call["session"]) if encoder is not None else tokenizer.encode(text)
    reply = _reply(call, parse_arguments)
    if call["response_ids"]:
        return prompt, list(call["response_ids"])
    if reply is not None:
        return prompt, reply_ids(tokenizer, template, msgs, reply, text, call["tools"], notes, **kw)
    return prompt, []


def _raw_reply(call: dict) -> dict | None:
    """The reply as the log gives it (before `vllm_messages`)."""
    if call["response_text"] is None and not call["response_tool_calls"] and not call["response_reasoning"]:
        return None
    m = {"role": "assistant", "content": call["response_text"] or ""}
    if call["response_reasoning"]:
        m["reasoning_content"] = call["response_reasoning"]
    if call["response_tool_calls"]:
        m["tool_calls"] = call["response_tool_calls"]
    return m


def _lcp(a: list, b: list) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def reply_ids(tokenizer, template, messages: list[dict], reply: dict, prompt_text: str, tools, notes: list,
              **kw) -> list[int]:
    """The ids the model generated for `reply` after the prompt `prompt_text`, through its end of turn (the eos
    token), without what the template adds after that (a newline).

    The template writes the reply as a history turn. When that turn extends the prompt (append-only templates),
    the generated ids are the extension. Otherwise (templates whose history turn differs from the generation
    prompt, e.g. DeepSeek's ``<｜Assistant｜></think>`` after a ``<｜Assistant｜><think>`` prompt, or that drop
    ``reasoning_content``), the turn is compared with the generation prompt *token by token*: what follows their
    common ids is what the model wrote, and reasoning the template dropped is put back before the think-close
    tag the turn starts with (the model wrote ``reasoning</think>reply``)."""
    full = template.render(messages + [reply], tools=tools, add_generation_prompt=False, **kw)
    eos = template.special_tokens.get("eos_token")
    if full.startswith(prompt_text):
        ids = tokenizer.encode(full[len(prompt_text):])
    else:
        base = template.render(messages, tools=tools, add_generation_prompt=False, **kw)
        if not (full.startswith(base) and prompt_text.startswith(base)):
            notes.append("reply: the template rewrites earlier turns; the reply is its content and eos")
            return tokenizer.encode((reply.get("content") or "") + (eos or ""))
        turn = tokenizer.encode(full[len(base):])
        ids = turn[_lcp(turn, tokenizer.encode(prompt_text[len(base):])):]
    return _reply_end(tokenizer, template, reply, ids, notes)


def _reply_end(tokenizer, template, reply: dict, ids: list[int], notes: list) -> list[int]:
    """The generated ids from the reply turn's ids: reasoning the template dropped put back, cut after eos."""
    eos = template.special_tokens.get("eos_token")
    reasoning = reply.get("reasoning_content")
    if reasoning and reasoning.strip() not in tokenizer.decode(ids):
        close = tokenizer.added_tokens.get("</think>")
        head = tokenizer.decode(ids[:3]).lstrip()
        if close is not None and head.startswith("</think>"):
            ids = tokenizer.encode(reasoning) + ids
        elif close is not None:
            # the template never writes this turn's reasoning (DeepSeek after a tool output, Llama, Mistral):
            # the model wrote it before the reply, between the think markers its tokenizer has
            from strata_lab.text.structure import TemplateStructure

            think = TemplateStructure.of(template).think or ("<think>", "</think>")
            ids = tokenizer.encode(f"{think[0]}\n{reasoning.strip()}\n{think[1]}\n\n") + ids
            notes.append("reply: reasoning the template does not write put back before the reply, between "
                         f"{think[0]} and {think[1]}")
        else:
            notes.append("reply: the template drops reasoning_content and has no think tags; reply without it")
    eos_id = tokenizer.added_tokens.get(eos) if eos else None
    if eos_id is not None:
        i = len(ids) - 1  # the last eos, searched from the end (a reply's is near its end: no forward scan)
        while i >= 0 and ids[i] != eos_id:
            i -= 1
        if i >= 0:
            ids = ids[: i + 1]
    return ids


class PrefixEncoder:
    """`encode(text, key)` equals `tokenizer.encode(text)` and reuses the ids of the previous text encoded
    under `key` (a session) up to the last added token both texts share (ending at least the longest added
    token's length before their first difference, so that both texts' scans find it), encoding only the rest.

    Exact because the tokenizer splits a text at its added tokens and tokenizes each piece on its own; only
    added tokens without lstrip / rstrip / single_word that match the raw text serve as cut points, and a
    tokenizer whose pre-tokenizer treats the first piece differently (Metaspace ``prepend_scheme: first``) is
    encoded whole. At most `max_keys` sessions are remembered (least recently used go first).

    >>> from strata_lab import load_tokenizer
    >>> tok = load_tokenizer("qwen3")
    >>> enc = PrefixEncoder(tok)
    >>> a = "<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n"
    >>> b = a + "Hello<|im_end|>\\n<|im_start|>user\\nMore<|im_end|>\\n"
    >>> enc.encode(a, "s") == tok.encode(a), enc.encode(b, "s") == tok.encode(b), enc.reused
    (True, True, 5)
    """

    def __init__(self, tokenizer, max_keys: int = 1024):
        self.tokenizer = tokenizer
        self.max_keys = max_keys
        self.reused = 0  # ids taken from earlier texts (last encode)
        cuts = {t.content: i for i, t in tokenizer.hf.get_added_tokens_decoder().items()
                if t.content and not (t.lstrip or t.rstrip or t.single_word or t.normalized)}
        pre = tokenizer.hf.pre_tokenizer
        first_only = pre is not None and b'"prepend_scheme":"first"' in pre.__getstate__()
        self._cuts = cuts if not first_only else {}
        self._cut_ids = frozenset(self._cuts.values())
        self._max_cut = max(map(len, self._cuts), default=0)
        self._pattern = re.compile("|".join(map(re.escape, sorted(cuts, key=len, reverse=True)))) if cuts else None
        self._last: OrderedDict = OrderedDict()  # key -> (text, ids, cut char ends, ids before each cut)
        # (ids, ends of the added-token matches, ids up to and including each) in one step, where the tokenizer
        # has it (traces.fast_encode.FastTokenizer: the same scan, whose cut points are these)
        self._encode_cuts = getattr(tokenizer, "encode_cuts", None) if self._cuts else None

    def encode(self, text: str, key=None) -> list[int]:
        if not self._cuts or key is None:
            self.reused = 0
            return self.tokenizer.encode(text)
        start, head, ends, counts = 0, [], [], []
        prev = self._last.pop(key, None)
        if prev is not None:
            ptext, pids, pends, pcounts = prev
            # matches ending this far before the first difference are the same in both texts' scans (a longer
            # added token starting there would still end before it)
            j = bisect_right(pends, _common_prefix(text, ptext) - self._max_cut)
            if j:
                start, head = pends[j - 1], pids[:pcounts[j - 1]]
                ends, counts = pends[:j], pcounts[:j]
        self.reused = len(head)
        if self._encode_cuts is not None:  # the tokenizer's own scan gives the cut points (FastTokenizer)
            tail, tends, tcounts = self._encode_cuts(text[start:])
            ends.extend([start + e for e in tends])
            counts.extend([len(head) + c for c in tcounts])
            ids = head + tail if head else tail
            self._remember(key, (text, ids, ends, counts))
            return ids
        tail = self.tokenizer.encode(text[start:])
        ids = head + tail if head else tail
        # the cut points of the new part: the k-th raw match of an added token is the k-th such id
        pos, cuts, cut_ids = 0, self._cuts, self._cut_ids
        for m in self._pattern.finditer(text, start):
            want = cuts[m.group()]
            while pos < len(tail) and tail[pos] != want:
                if tail[pos] in cut_ids:  # another added token first: the texts disagree, stop here
                    pos = len(tail)
                    break
                pos += 1
            if pos >= len(tail):
                break
            pos += 1
            ends.append(m.end())
            counts.append(len(head) + pos)
        self._remember(key, (text, ids, ends, counts))
        return ids

    def _remember(self, key, state) -> None:
        self._last[key] = state
        if len(self._last) > self.max_keys:
            self._last.popitem(last=False)


def _common_prefix(a: str, b: str) -> int:
    """Length of the common prefix of two strings (comparisons done by str.startswith, in C)."""
    if a.startswith(b):
        return len(b)
    lo, hi = 0, min(len(a), len(b))  # a[:lo] == b[:lo]; they differ before hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a.startswith(b[lo:mid], lo):  # only the part not yet known to be equal is compared (and copied)
            lo = mid
        else:
            hi = mid - 1
    return lo


def render_call(call: dict, tokenizer, template, *, enable_thinking: bool | None = None,
                encoder=None) -> Rendered:
    """Prompt and generated ids of one call (ids-level calls pass through; lengths-level calls raise).
    `template` (a `ChatTemplate`) renders message-level calls, every template the same way; `encoder`: a
    `PrefixEncoder` (the same ids as `tokenizer.encode`, reusing the session's previous ones)."""
    notes: list = []
    if call["fidelity"] == "ids":
        prompt = list(call["prompt_ids"])
        gen = list(call["response_ids"] or ())
        if not gen and call["response_text"]:
            gen = tokenizer.encode(call["response_text"])
    elif call["fidelity"] == "messages":
        kw = dict((call.get("extra") or {}).get("chat_template_kwargs") or {})  # what the client asked for
        if enable_thinking is not None:
            kw["enable_thinking"] = enable_thinking
        try:
            prompt, gen = _render_messages(call, tokenizer, template, encoder, kw, notes, True)
        except TemplateRenderError as exc:
            # the template splices arguments in as a string (DeepSeek V3 / R1 / V3.1): render the client's
            # JSON strings, as a server that hands the template the request's arguments unparsed does
            if not _splices_strings(exc, call):
                raise
            notes.clear()
            try:
                prompt, gen = _render_messages(call, tokenizer, template, encoder, kw, notes, False)
            except TemplateRenderError:
                raise exc from None
            notes.append(STRING_ARGUMENTS)
    elif call["fidelity"] == "text":  # the log printed the rendered prompt (vLLM without ids): encode it
        prompt = tokenizer.encode(call["prompt_text"])
        gen = list(call["response_ids"] or ()) or (tokenizer.encode(call["response_text"])
                                                   if call["response_text"] else [])
    else:
        raise ValueError("fidelity: a lengths-only call has no text to render; use LengthsSynth")
    if call["fidelity"] == "messages" and STRING_ARGUMENTS not in notes and _has_tool_calls(call):
        notes.append(MAPPING_ARGUMENTS)   # the template was handed parsed arguments (vLLM's way)
    reported = call["prompt_tokens"]
    exact = None if reported is None else len(prompt) == reported
    done = call["completion_tokens"] if gen else None  # no reply logged: nothing to check
    return Rendered(prompt, gen, exact, None if reported is None else len(prompt) - reported,
                    gen_exact=None if done is None else len(gen) == done,
                    gen_diff=None if done is None else len(gen) - done, notes=tuple(notes))


class LengthsSynth:
    """Placeholder ids for lengths-only calls (llama.cpp logs, cut SGLang ids): each prompt shares exactly the
    reported cached tokens with the session's previous prompt + reply and is fresh after that, so a replay
    sees the same prefix structure the engine reported. The ids are ordinary vocabulary tokens, not the text."""

    def __init__(self, tokenizer):
        special = set(tokenizer.special_ids) | set(tokenizer.added_tokens.values())
        top = min(tokenizer.vocab_size, 100_000)
        self._pool = [i for i in range(min(1000, top // 4), top) if i not in special]
        self._next = 0
        self._held: dict[str, list[int]] = {}

    def _fresh(self, n: int) -> list[int]:
        out = [self._pool[(self._next + k) % len(self._pool)] for k in range(n)]
        self._next = (self._next + n) % len(self._pool)
        return out

    def render(self, call: dict) -> Rendered:
        held = self._held.get(call["session"], [])
        n = int(call["prompt_len"] or call["prompt_tokens"] or 0)
        cached = min(int(call["cached_tokens"] or 0), len(held), n)
        prompt = held[:cached] + self._fresh(n - cached)
        gen = self._fresh(int(call["completion_tokens"] or 1))
        self._held[call["session"]] = prompt + gen
        return Rendered(prompt, gen, None, None, synthetic=True)
