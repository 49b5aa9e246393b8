"""Turning a trace call into the token ids a server would have prefilled, with a given tokenizer and template.

Message-level calls are rendered like the server renders a request (system first, tools, the generation prompt)
and tokenized with special tokens parsed; the reply becomes the ids the template writes for it (content,
reasoning and tool calls, up to and including the end-of-turn token) unless the log carries the generated ids.
Where the log reports ``prompt_tokens``, ``render_exact`` says whether the rendered length equals it.

>>> from strata_lab import ChatTemplate, load_tokenizer
>>> from strata_lab.traces.calls import new_call
>>> call = new_call(fidelity="messages", messages=[{"role": "user", "content": "Hi"}], response_text="Hello",
...                 prompt_tokens=9)
>>> r = render_call(call, load_tokenizer("qwen3"), ChatTemplate.from_name("qwen3"))
>>> len(r.prompt_ids), r.exact, load_tokenizer("qwen3").decode(r.gen_ids)
(9, True, '<think>\\n\\n</think>\\n\\nHello<|im_end|>')
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Rendered", "render_call", "LengthsSynth"]


@dataclass
class Rendered:
    prompt_ids: list[int]
    gen_ids: list[int]
    exact: bool | None       # rendered length == reported prompt_tokens (None: not reported)
    diff: int | None         # rendered length - reported prompt_tokens
    synthetic: bool = False  # lengths-only call: placeholder ids that keep the reported reuse


def _messages(call: dict) -> list[dict]:
    msgs = list(call["messages"] or ())
    if call["system"] and not (msgs and msgs[0].get("role") == "system"):
        msgs.insert(0, {"role": "system", "content": call["system"]})
    return msgs


def _reply(call: dict) -> dict | None:
    if call["response_text"] is None and not call["response_tool_calls"] and not call["response_reasoning"]:
        return None
    m = {"role": "assistant", "content": call["response_text"] or ""}
    if call["response_reasoning"]:
        m["reasoning_content"] = call["response_reasoning"]
    if call["response_tool_calls"]:
        m["tool_calls"] = call["response_tool_calls"]
    return m


def reply_text(template, messages: list[dict], reply: dict, prompt_text: str, tools, **kw) -> str:
    """The text the template writes for `reply` after `prompt_text`: what the model generated, through its end
    of turn (the eos string), without what the template adds after that (a newline)."""
    full = template.render(messages + [reply], tools=tools, add_generation_prompt=False, **kw)
    eos = template.special_tokens.get("eos_token")
    if full.startswith(prompt_text):
        text = full[len(prompt_text):]
        if eos and eos in text:
            text = text[: text.rindex(eos) + len(eos)]
        return text
    # the template rewrites the turn once the reply is in (not append-only): the content and the eos
    return (reply.get("content") or "") + (eos or "")


def render_call(call: dict, tokenizer, template, *, enable_thinking: bool | None = None) -> Rendered:
    """Prompt and generated ids of one call (ids-level calls pass through; lengths-level calls raise)."""
    if call["fidelity"] == "ids":
        prompt = list(call["prompt_ids"])
        gen = list(call["response_ids"] or ())
        if not gen and call["response_text"]:
            gen = tokenizer.encode(call["response_text"])
    elif call["fidelity"] == "messages":
        kw = dict((call.get("extra") or {}).get("chat_template_kwargs") or {})  # what the client asked for
        if enable_thinking is not None:
            kw["enable_thinking"] = enable_thinking
        msgs = _messages(call)
        text = template.render(msgs, tools=call["tools"], add_generation_prompt=True, **kw)
        prompt = tokenizer.encode(text)
        reply = _reply(call)
        if call["response_ids"]:
            gen = list(call["response_ids"])
        elif reply is not None:
            gen = tokenizer.encode(reply_text(template, msgs, reply, text, call["tools"], **kw))
        else:
            gen = []
    elif call["fidelity"] == "text":  # the log printed the rendered prompt (vLLM without ids): encode it
        prompt = tokenizer.encode(call["prompt_text"])
        gen = list(call["response_ids"] or ()) or (tokenizer.encode(call["response_text"])
                                                   if call["response_text"] else [])
    else:
        raise ValueError("fidelity: a lengths-only call has no text to render; use LengthsSynth")
    reported = call["prompt_tokens"]
    exact = None if reported is None else len(prompt) == reported
    return Rendered(prompt, gen, exact, None if reported is None else len(prompt) - reported)


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
