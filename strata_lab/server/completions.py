"""Raw-prompt completions: OpenAI `/v1/completions` and llama.cpp `/completion`.

The prompt is text (encoded as is: no chat template) or a list of token ids, which go to the engine as
given (no template, no retokenization): the way to send a recorded prompt through the server byte for
byte, or to score alternative tokenizations of one text with logprobs / `echo`.

>>> req, rendered = parse_completion({"prompt": [9707, 1879], "max_tokens": 3}, "openai", vocab_size=151669)
>>> rendered.prompt_ids, req.max_tokens, rendered.raw
([9707, 1879], 3, True)
>>> parse_completion({"prompt": "Hi", "n_predict": -1}, "llama", vocab_size=10)[0].max_tokens is None
True
"""
from __future__ import annotations

import json
import time
from typing import Any

from strata_lab.server.errors import RequestError, openai_error
from strata_lab.server.features import parse_features
from strata_lab.server.generation import RenderedPrompt
from strata_lab.server.request import ChatRequest, _bool, _sampling, _stop_sequences, check_int
from strata_lab.server.unsupported import refuse_unsupported

__all__ = ["parse_completion", "parse_completion_batch", "merge_completions", "completion_response", "llama_response", "CompletionStream", "LlamaStream",
           "logprob_entry"]


MAX_BATCH = 64  # prompts in one /v1/completions request


def _one_prompt(value: Any, vocab_size: int, name: str) -> tuple[str | None, list[int] | None]:
    if isinstance(value, str):
        if not value:
            raise RequestError(name, "must not be empty")
        return value, None
    if isinstance(value, list) and value:
        for i, v in enumerate(value):
            check_int(v, f"{name}[{i}]", minimum=0, maximum=vocab_size - 1)
        return None, list(value)
    raise RequestError(name, "must be a non-empty string or a non-empty array of token ids")


def _prompts(value: Any, vocab_size: int) -> list[tuple[str | None, list[int] | None]]:
    """[(text, None) or (None, ids), ...]: a string, an id list, or OpenAI's batch forms ([str, ...],
    [[int, ...], ...]; one element is one prompt)."""
    if isinstance(value, list) and value and all(isinstance(v, (str, list)) for v in value):
        if len(value) > MAX_BATCH:
            raise RequestError("prompt", f"holds at most {MAX_BATCH} prompts, got {len(value)}")
        return [_one_prompt(v, vocab_size, f"prompt[{i}]") for i, v in enumerate(value)]
    if isinstance(value, list) and any(isinstance(v, (str, list)) for v in value):
        raise RequestError("prompt", "must be a string, an array of token ids, or an array of those (a batch), "
                           "not a mix")
    return [_one_prompt(value, vocab_size, "prompt")]


def parse_completion(body: Any, dialect: str, *, vocab_size: int,
                     session_key: str | None = None) -> tuple[ChatRequest, RenderedPrompt]:
    """Check a one-prompt completion body (`dialect` "openai" for /v1/completions, "llama" for /completion)."""
    req, renders = parse_completion_batch(body, dialect, vocab_size=vocab_size, session_key=session_key)
    if len(renders) > 1:
        raise RequestError("prompt", "takes one prompt here")
    return req, renders[0]


def parse_completion_batch(body: Any, dialect: str, *, vocab_size: int,
                           session_key: str | None = None) -> tuple[ChatRequest, list[RenderedPrompt]]:
    """Check a completion body; one RenderedPrompt per prompt of a batch (OpenAI: choice index = prompt * n + j)."""
    if not isinstance(body, dict):
        raise RequestError("body", "must be a JSON object")
    refuse_unsupported(body, "completions")
    prompts = _prompts(body.get("prompt"), vocab_size)
    req: dict = {"dialect": "openai", "messages": []}
    if body.get("stream") is not None:
        req["stream"] = _bool(body["stream"], "stream")
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise RequestError("stream_options", "must be an object")
        if not req.get("stream"):
            raise RequestError("stream_options", "is only allowed when stream is true")
        if options.get("include_usage") is not None:
            req["include_usage"] = _bool(options["include_usage"], "stream_options.include_usage")
    # the output cap: O max_tokens, else llama.cpp's n_predict, else 16 (OpenAI's default); L n_predict, else
    # its synonym max_tokens, else up to the context. -1 (n_predict, or L's max_tokens): up to the context.
    order = ("max_tokens", "n_predict") if dialect == "openai" else ("n_predict", "max_tokens")
    given = [(name, check_int(body[name], name, minimum=-1 if name == "n_predict" or dialect == "llama" else 0))
             for name in order if body.get(name) is not None]
    if given:
        name, n = given[0]
        req["max_tokens"] = None if n < 0 else n
        req["max_tokens_field"] = name
    elif dialect == "openai":
        req["max_tokens"] = 16
    _sampling(body, req)
    req["stop"] = _stop_sequences(body.get("stop"), "stop", allow_str=dialect == "openai")
    if body.get("top_logprobs") is not None:
        raise RequestError("top_logprobs", "is a chat field: a completion's logprobs is the number of "
                           "alternatives", code="unsupported_parameter")
    if body.get("prompt_logprobs") is not None:
        raise RequestError("prompt_logprobs", "is a chat field here: a completion's prompt logprobs come with "
                           "echo and logprobs", code="unsupported_parameter")
    echo = False
    if body.get("echo") is not None:
        echo = _bool(body["echo"], "echo")
    features = parse_features({k: v for k, v in body.items() if k != "echo"}, "openai", header_key=session_key)
    if echo and features.logprobs is not None and features.prompt_logprobs is None:
        from dataclasses import replace

        features = replace(features, prompt_logprobs=features.logprobs)
    if features.n > 1 and req.get("stream"):
        raise RequestError("n", "n > 1 is served without streaming only")
    if features.tool_choice is not None:
        raise RequestError("tool_choice", "needs tools, which a raw completion does not take",
                           code="unsupported_parameter")
    if dialect == "llama":  # /completion answers one completion, as llama.cpp's does
        for name, bad in (("n", features.n > 1), ("echo", echo), ("stream_options", options is not None)):
            if bad:
                raise RequestError(name, "is not supported on /completion (use /v1/completions)",
                                   code="unsupported_parameter")
    if len(prompts) > 1 and req.get("stream"):
        raise RequestError("prompt", "a batch of prompts is served without streaming only")
    req["features"] = features
    if body.get("model") is not None and not isinstance(body["model"], str):
        raise RequestError("model", "must be a string")
    req["model"] = body.get("model")
    chat = ChatRequest(**req)
    chat.extra["echo"] = echo
    if body.get("return_tokens") is not None:
        if dialect != "llama":
            raise RequestError("return_tokens", "is a /completion field", code="unsupported_parameter")
        chat.extra["return_tokens"] = _bool(body["return_tokens"], "return_tokens")
    if dialect == "llama" and body.get("return_token_ids") is not None:
        raise RequestError("return_token_ids", "is a /v1/completions field: /completion returns the generated ids "
                           "as `tokens` (return_tokens)", code="unsupported_parameter")
    renders = [RenderedPrompt(prompt_text=text if text is not None else "", assistant_text="", prefix_text=None,
                        prompt_ids=ids, raw=True) for text, ids in prompts]
    return chat, renders


def _piece(tokenizer, i: int) -> tuple[str, list[int]]:
    try:
        b = tokenizer.token_bytes(i)
    except ValueError:
        b = b""
    return b.decode("utf-8", errors="replace"), list(b)


def logprob_entry(tokenizer, e) -> dict:
    """OpenAI chat's logprobs.content entry for one engine.TokenLogprob."""
    token, raw = _piece(tokenizer, e.id)
    top = []
    for i, lp in e.top:
        t, b = _piece(tokenizer, i)
        top.append({"token": t, "logprob": lp, "bytes": b})
    return {"token": token, "logprob": e.logprob, "bytes": raw, "top_logprobs": top}


def _legacy_logprobs(tokenizer, entries, *, first_none: int = 0, offset0: int = 0) -> dict:
    """/v1/completions logprobs: tokens, token_logprobs, top_logprobs (token -> logprob), text_offset."""
    tokens, lps, tops, offsets = [], [], [], []
    offset = offset0
    for i, e in entries:
        t, _ = _piece(tokenizer, i)
        tokens.append(t)
        offsets.append(offset)
        offset += len(t)
        lps.append(None if e is None else e.logprob)
        tops.append(None if e is None else {_piece(tokenizer, a)[0]: lp for a, lp in e.top})
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def _finish(s) -> str:
    return "stop" if s.finish in ("stop", "cancelled") else s.finish


def completion_response(summary, req: ChatRequest, tokenizer, *, model: str, request_id: str) -> dict:
    echo = req.extra.get("echo", False)
    prompt_text = tokenizer.decode(summary.prompt_ids) if echo else ""
    choices = []
    for s in summary.choices or [summary]:
        lp = None
        if req.features.logprobs is not None:
            entries = [(e.id, e) for e in s.logprobs]
            if echo and summary.prompt_logprobs is not None:
                pl = summary.prompt_logprobs
                entries = [(summary.prompt_ids[0], None)] + [(e.id, e) for e in pl] + entries
            lp = _legacy_logprobs(tokenizer, entries)
        choices.append({"text": prompt_text + s.content, "index": s.index, "logprobs": lp,
                        "finish_reason": _finish(s)})
        if s.token_ids is not None:  # return_token_ids (vLLM): per choice, the prompt's ids and the generated ones
            choices[-1].update(prompt_token_ids=summary.prompt_ids, token_ids=s.token_ids)
    return {"id": request_id, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": choices, "usage": {"prompt_tokens": summary.prompt_tokens,
                                          "completion_tokens": summary.completion_tokens,
                                          "total_tokens": summary.prompt_tokens + summary.completion_tokens,
                                          "prompt_tokens_details": {"cached_tokens": summary.cached_tokens}},
            "timings": summary.timings(), "seed": summary.seed}


def merge_completions(bodies: list[dict], n: int) -> dict:
    """One /v1/completions body for a batch: prompt p's choice j gets index p * n + j; usage is summed."""
    out = dict(bodies[0])
    out["choices"] = [{**c, "index": p * n + c["index"]} for p, b in enumerate(bodies) for c in b["choices"]]
    usage = {k: sum(b["usage"][k] for b in bodies) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    usage["prompt_tokens_details"] = {"cached_tokens": sum(b["usage"]["prompt_tokens_details"]["cached_tokens"]
                                                           for b in bodies)}
    out["usage"] = usage
    out["timings"] = [b["timings"] for b in bodies]
    return out


def _stop_type(s) -> str:
    if s.stop_sequence is not None:
        return "word"
    return {"stop": "eos", "length": "limit"}.get(s.finish, "none")


def _llama_probs(tokenizer, entries) -> list[dict]:
    out = []
    for e in entries:
        token, raw = _piece(tokenizer, e.id)
        out.append({"id": e.id, "token": token, "logprob": e.logprob, "bytes": raw,
                    "top_logprobs": [{"id": i, "token": _piece(tokenizer, i)[0], "logprob": lp,
                                      "bytes": _piece(tokenizer, i)[1]} for i, lp in e.top]})
    return out


def llama_response(summary, req: ChatRequest, tokenizer, *, model: str, request_id: str) -> dict:
    """llama.cpp /completion's body: content, ids, stop type, slot, timings, completion_probabilities."""
    body = {"content": summary.content, "tokens": summary.gen_ids, "id_slot": summary.slot, "stop": True,
            "model": model, "tokens_predicted": summary.completion_tokens,
            "tokens_evaluated": summary.prompt_tokens, "tokens_cached": summary.cached_tokens,
            "stop_type": _stop_type(summary), "stopping_word": summary.stop_sequence or "",
            "truncated": False, "timings": summary.timings(), "seed": summary.seed,
            "generation_settings": {"seed": summary.seed, "n_predict": -1 if req.max_tokens is None else req.max_tokens,
                                    "temperature": req.temperature, "top_k": req.top_k, "top_p": req.top_p,
                                    "min_p": req.min_p, "repeat_penalty": req.repetition_penalty,
                                    "repeat_last_n": req.repeat_last_n, "presence_penalty": req.presence_penalty,
                                    "frequency_penalty": req.frequency_penalty}}
    if req.features.logprobs is not None:
        body["completion_probabilities"] = _llama_probs(tokenizer, summary.logprobs)
    if not req.extra.get("return_tokens", True):  # llama.cpp's switch; here the ids come by default
        del body["tokens"]
    return body


def _frame(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


class CompletionStream:
    """SSE frames of a streamed /v1/completions response: the same text, logprobs (echo included) and
    finish as the whole body; usage only with stream_options.include_usage (a last chunk with no choices)."""

    def __init__(self, request_id: str, model: str, prompt_tokens: int, *, include_usage: bool = False,
                 cached_tokens: int = 0, req: ChatRequest | None = None, tokenizer=None):
        self.request_id, self.model, self.created = request_id, model, int(time.time())
        self.include_usage, self.req, self.tokenizer = include_usage, req, tokenizer
        self.offset = 0       # text_offset of the next logprobs token
        self._echo: list[str] = []
        self._prompt_ids: list | None = None  # return_token_ids (vLLM): the first chunk carries the prompt's ids

    def _chunk(self, text: str, finish=None, logprobs=None, token_ids=None, **extra) -> str:
        choice = {"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish}
        if self._prompt_ids is not None:
            choice["prompt_token_ids"], self._prompt_ids = self._prompt_ids, None
        if token_ids is not None:
            choice["token_ids"] = token_ids
        return _frame({"id": self.request_id, "object": "text_completion", "created": self.created,
                       "model": self.model, "choices": [choice], **extra})

    def _wants_logprobs(self) -> bool:
        return self.req is not None and self.req.features.logprobs is not None

    def prompt_info(self, info: dict) -> None:
        """The start payload: echo sends the prompt (and its logprobs) first; return_token_ids its ids."""
        if info.get("return_token_ids"):
            self._prompt_ids = list(info.get("prompt_ids") or [])
        if self.req is None or not self.req.extra.get("echo"):
            return
        ids = info.get("prompt_ids") or []
        text = self.tokenizer.decode(ids)
        lp = None
        if self._wants_logprobs() and info.get("prompt_logprobs") is not None:
            entries = [(ids[0], None)] + [(e.id, e) for e in info["prompt_logprobs"]]
            lp = _legacy_logprobs(self.tokenizer, entries, offset0=self.offset)
            self.offset += sum(len(t) for t in lp["tokens"])
        self._echo = [self._chunk(text, logprobs=lp)]

    def start(self) -> list[str]:
        return self._echo

    def event(self, ev) -> list[str]:
        return [self._chunk(ev.text)]

    def raw_logprobs(self, e) -> list[str]:
        """One generated id's logprobs, in a chunk with no text right after that id's text."""
        if not self._wants_logprobs():
            return []
        lp = _legacy_logprobs(self.tokenizer, [(e.id, e)], offset0=self.offset)
        self.offset += len(lp["tokens"][0])
        return [self._chunk("", logprobs=lp)]

    def done(self, summary) -> list[str]:
        frames = [self._chunk("", _finish(summary), token_ids=summary.token_ids, timings=summary.timings(),
                              seed=summary.seed)]
        if self.include_usage:
            frames.append(_frame({"id": self.request_id, "object": "text_completion", "created": self.created,
                                  "model": self.model, "choices": [],
                                  "usage": {"prompt_tokens": summary.prompt_tokens,
                                            "completion_tokens": summary.completion_tokens,
                                            "total_tokens": summary.prompt_tokens + summary.completion_tokens,
                                            "prompt_tokens_details": {"cached_tokens": summary.cached_tokens}}}))
        return frames + ["data: [DONE]\n\n"]

    def error(self, err: RequestError) -> list[str]:
        return [_frame(openai_error(err)), "data: [DONE]\n\n"]


class LlamaStream:
    """SSE frames of a streamed llama.cpp /completion: {"content", "stop": false} ... then the final body."""

    def __init__(self, request_id: str, model: str, prompt_tokens: int, *, req=None, tokenizer=None,
                 include_usage: bool = False, cached_tokens: int = 0):  # the last two: unused, as above
        self.request_id, self.model, self.req, self.tokenizer = request_id, model, req, tokenizer

    def start(self) -> list[str]:
        return []

    def event(self, ev) -> list[str]:
        return [_frame({"content": ev.text, "stop": False})]

    def done(self, summary) -> list[str]:
        body = llama_response(summary, self.req, self.tokenizer, model=self.model, request_id=self.request_id)
        body["content"] = ""
        return [_frame(body)]

    def error(self, err: RequestError) -> list[str]:
        return [_frame({"error": {"code": err.status, "message": str(err), "type": err.code}})]
