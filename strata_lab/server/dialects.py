"""Responses and stream chunks in each API dialect, built from the runner's events and Summary.

`OpenAIStream` / `AnthropicStream` turn ("event", Event) and ("done", Summary) into SSE frames;
`openai_response` / `anthropic_response` build the non-streaming bodies.

>>> s = OpenAIStream("chatcmpl-1", "m", 0)
>>> s.start()[0].startswith('data: {"id":"chatcmpl-1"')
True
"""
from __future__ import annotations

import json
import time
import uuid

from strata_lab.server.errors import RequestError, anthropic_error, openai_error
from strata_lab.server.output import Event, ToolCall

__all__ = ["openai_response", "anthropic_response", "OpenAIStream", "AnthropicStream", "new_id"]

_ANTHROPIC_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "cancelled": "end_turn"}


def new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:24]


def _dumps(obj) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def _finish(summary) -> str:
    return "tool_calls" if summary.tool_calls else summary.finish


def _anthropic_stop(summary) -> str:
    if summary.stop_sequence is not None and not summary.tool_calls:
        return "stop_sequence"
    return _ANTHROPIC_STOP[_finish(summary)]


def openai_usage(summary) -> dict:
    return {"prompt_tokens": summary.prompt_tokens, "completion_tokens": summary.completion_tokens,
            "total_tokens": summary.prompt_tokens + summary.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": summary.cached_tokens}}


def anthropic_usage(summary) -> dict:
    return {"input_tokens": summary.prompt_tokens - summary.cached_tokens, "output_tokens": summary.completion_tokens,
            "cache_read_input_tokens": summary.cached_tokens, "cache_creation_input_tokens": 0}


def _openai_call(call: ToolCall, index: int) -> dict:
    return {"index": index, "id": new_id("call_"), "type": "function",
            "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)}}


def _openai_message(summary) -> dict:
    message: dict = {"role": "assistant", "content": summary.content}
    if summary.reasoning:
        message["reasoning_content"] = summary.reasoning
    if summary.tool_calls:
        message["tool_calls"] = [{k: v for k, v in _openai_call(c, i).items() if k != "index"}
                                 for i, c in enumerate(summary.tool_calls)]
        message["content"] = summary.content or None
    return message


def _prompt_logprobs(summary, tokenizer) -> list | None:
    """vLLM's prompt_logprobs: None for the first prompt id, then {id: {logprob, rank, decoded_token}}."""
    if summary.prompt_logprobs is None:
        return None
    out: list = [None]
    for e in summary.prompt_logprobs:
        entry = {str(e.id): {"logprob": e.logprob, "rank": None, "decoded_token": tokenizer.decode([e.id])}}
        for rank, (i, lp) in enumerate(e.top, 1):
            entry.setdefault(str(i), {"logprob": lp, "rank": rank, "decoded_token": tokenizer.decode([i])})
            if i == e.id:
                entry[str(i)]["rank"] = rank
        out.append(entry)
    return out


def openai_response(summary, *, model: str, request_id: str, tokenizer=None, logprobs: bool = False) -> dict:
    """The chat.completion body: one choice per Summary in `summary.choices` (n > 1), logprobs when asked."""
    from strata_lab.server.completions import logprob_entry

    choices = []
    for s in summary.choices or [summary]:
        lp = {"content": [logprob_entry(tokenizer, e) for e in s.logprobs]} if logprobs else None
        choices.append({"index": s.index, "message": _openai_message(s), "finish_reason": _finish(s), "logprobs": lp})
        if s.token_ids is not None:  # return_token_ids (vLLM): each choice's generated ids
            choices[-1]["token_ids"] = s.token_ids
    body = {"id": request_id, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": choices, "usage": openai_usage(summary), "timings": summary.timings(), "seed": summary.seed}
    if summary.prompt_logprobs is not None:
        body["prompt_logprobs"] = _prompt_logprobs(summary, tokenizer)
    if summary.token_ids is not None:  # return_token_ids (vLLM): the ids the engine was handed
        body["prompt_token_ids"] = summary.prompt_ids
    return body


def anthropic_response(summary, *, model: str, request_id: str) -> dict:
    content = []
    if summary.reasoning:
        content.append({"type": "thinking", "thinking": summary.reasoning, "signature": ""})
    if summary.content:
        content.append({"type": "text", "text": summary.content})
    for call in summary.tool_calls:
        content.append({"type": "tool_use", "id": new_id("toolu_"), "name": call.name, "input": call.arguments})
    return {"id": request_id, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": _anthropic_stop(summary), "stop_sequence": summary.stop_sequence,
            "usage": anthropic_usage(summary), "timings": summary.timings(), "seed": summary.seed}


class OpenAIStream:
    """SSE frames of one streamed chat completion (n > 1: each choice's chunks carry its index)."""

    def __init__(self, request_id: str, model: str, prompt_tokens: int, *, include_usage: bool = False,
                 cached_tokens: int = 0):
        self.request_id, self.model = request_id, model
        self.created = int(time.time())
        self.calls: dict[int, int] = {}  # tool calls sent so far, per choice
        self.include_usage = include_usage  # stream_options.include_usage: one usage chunk before [DONE]
        self.prompt_token_ids: list | None = None  # return_token_ids (vLLM): sent in the first chunk

    def prompt_info(self, info: dict) -> None:
        """The start payload: with return_token_ids the first chunk carries the prompt's ids (as vLLM's)."""
        if info.get("return_token_ids"):
            self.prompt_token_ids = list(info.get("prompt_ids") or [])

    def _chunk(self, delta: dict, finish=None, index: int = 0, token_ids=None, **extra) -> str:
        choice = {"index": index, "delta": delta, "finish_reason": finish, "logprobs": None}
        if token_ids is not None:  # return_token_ids: a choice's generated ids, in its finishing chunk
            choice["token_ids"] = token_ids
        body = {"id": self.request_id, "object": "chat.completion.chunk", "created": self.created,
                "model": self.model, "choices": [choice], **extra}
        return f"data: {_dumps(body)}\n\n"

    def start(self) -> list[str]:
        if self.prompt_token_ids is not None:
            return [self._chunk({"role": "assistant", "content": ""}, prompt_token_ids=self.prompt_token_ids)]
        return [self._chunk({"role": "assistant", "content": ""})]

    def event(self, ev: Event, index: int = 0) -> list[str]:
        if ev.kind == "content":
            return [self._chunk({"content": ev.text}, index=index)]
        if ev.kind == "reasoning":
            return [self._chunk({"reasoning_content": ev.text}, index=index)]
        n = self.calls.get(index, 0)
        self.calls[index] = n + 1
        return [self._chunk({"tool_calls": [_openai_call(ev.call, n)]}, index=index)]

    def choice_event(self, index: int, ev: Event) -> list[str]:
        """An event of choice `index` > 0 (n > 1); its first one opens the choice with the role."""
        opened = [] if index in self.calls else [self._chunk({"role": "assistant", "content": ""}, index=index)]
        self.calls.setdefault(index, 0)
        return opened + self.event(ev, index)

    def logprobs(self, entry: dict, index: int = 0) -> list[str]:
        """One generated id's logprobs, as a chunk with an empty delta right after that id's text."""
        body = {"id": self.request_id, "object": "chat.completion.chunk", "created": self.created,
                "model": self.model, "choices": [{"index": index, "delta": {}, "finish_reason": None,
                                                  "logprobs": {"content": [entry]}}]}
        return [f"data: {_dumps(body)}\n\n"]

    def done(self, summary) -> list[str]:
        frames = [self._chunk({}, _finish(c), index=c.index, token_ids=c.token_ids) for c in summary.choices[1:]]
        frames.append(self._chunk({}, _finish(summary), token_ids=summary.token_ids, timings=summary.timings(),
                                  seed=summary.seed))
        if self.include_usage:  # OpenAI: a last chunk with no choices carries the usage
            body = {"id": self.request_id, "object": "chat.completion.chunk", "created": self.created,
                    "model": self.model, "choices": [], "usage": openai_usage(summary)}
            frames.append(f"data: {_dumps(body)}\n\n")
        return frames + ["data: [DONE]\n\n"]

    def error(self, err: RequestError) -> list[str]:
        return [f"data: {_dumps(openai_error(err))}\n\n", "data: [DONE]\n\n"]


class AnthropicStream:
    """SSE frames of one streamed message: message_start, content blocks, message_delta, message_stop."""

    def __init__(self, request_id: str, model: str, prompt_tokens: int, *, include_usage: bool = True,
                 cached_tokens: int = 0):
        self.request_id, self.model, self.prompt_tokens = request_id, model, prompt_tokens
        self.cached_tokens = cached_tokens  # the engine's planned reuse: the same split as the final usage
        self.index = -1
        self.open: str | None = None

    @staticmethod
    def _frame(kind: str, body: dict) -> str:
        return f"event: {kind}\ndata: {_dumps({'type': kind, **body})}\n\n"

    def start(self) -> list[str]:
        message = {"id": self.request_id, "type": "message", "role": "assistant", "model": self.model,
                   "content": [], "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": self.prompt_tokens - self.cached_tokens, "output_tokens": 0,
                             "cache_read_input_tokens": self.cached_tokens, "cache_creation_input_tokens": 0}}
        return [self._frame("message_start", {"message": message})]

    def _close(self) -> list[str]:
        if self.open is None:
            return []
        frames = []
        if self.open == "thinking":
            frames.append(self._frame("content_block_delta", {"index": self.index,
                                                              "delta": {"type": "signature_delta", "signature": ""}}))
        frames.append(self._frame("content_block_stop", {"index": self.index}))
        self.open = None
        return frames

    def _open(self, kind: str, block: dict) -> list[str]:
        frames = self._close()
        self.index += 1
        self.open = kind
        frames.append(self._frame("content_block_start", {"index": self.index, "content_block": block}))
        return frames

    def event(self, ev: Event) -> list[str]:
        frames: list[str] = []
        if ev.kind == "tool_call":
            frames += self._open("tool_use", {"type": "tool_use", "id": new_id("toolu_"), "name": ev.call.name,
                                              "input": {}})
            frames.append(self._frame("content_block_delta", {"index": self.index, "delta": {
                "type": "input_json_delta", "partial_json": json.dumps(ev.call.arguments, ensure_ascii=False)}}))
            return frames + self._close()
        kind = "thinking" if ev.kind == "reasoning" else "text"
        if self.open != kind:
            block = {"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking" else \
                {"type": "text", "text": ""}
            frames += self._open(kind, block)
        delta = {"type": "thinking_delta", "thinking": ev.text} if kind == "thinking" else \
            {"type": "text_delta", "text": ev.text}
        frames.append(self._frame("content_block_delta", {"index": self.index, "delta": delta}))
        return frames

    def done(self, summary) -> list[str]:
        return self._close() + [
            self._frame("message_delta", {"delta": {"stop_reason": _anthropic_stop(summary),
                                                    "stop_sequence": summary.stop_sequence},
                                          "usage": anthropic_usage(summary), "timings": summary.timings(),
                                          "seed": summary.seed}),
            self._frame("message_stop", {})]

    def error(self, err: RequestError) -> list[str]:
        return self._close() + [f"event: error\ndata: {_dumps(anthropic_error(err))}\n\n"]
