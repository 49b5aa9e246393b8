"""The work of one chat request on the engine: encode, generate, budget wrap-up, record, remember.

`ChatRunner.run(job, req, rendered)` runs on the engine worker's thread (one request at a time). It emits
("start", info), then ("event", output.Event) as text arrives, then ("done", Summary) or ("error", exc).
Every engine call goes through `ChatRunner.call(job, EngineCall, choice) -> CallOutcome`.

Slots (`--slots N`): the runner picks the request's slot (slots.py) once its prompt ids are known. `n > 1`
runs n calls on that slot with the same prompt: the first reads it, the others restore the snapshot at
the prompt's end (Contract 1: a prompt that is a prefix of held ending on a checkpoint reads nothing), so
the prompt is read once; choice i samples with its own seed stream (`choice_seed`).

Thinking budget (pr-1536): while the output is inside `<think>`, generated ids are counted; at the budget
the runner calls `stream.stop()`. Ids the engine drained after the STOP are in its state: the leading run
of plain-text ones (no stop id, no `<`, no split character) joins the thinking, the rest is dropped from
the text (they stay in the dump). A wrap-up closes the reasoning and a second engine call continues with
prompt = first prompt + thought ids + kept drained ids + wrap-up ids, so the engine reuses all it holds.

Isolation by API key (`run(..., owner=)`: the key's name, None without keys or with --shared-cache): the
slot is picked among the key's own (slots.py) and reset when it last held another key's ids, and each key
has its own prompt encoder (its remembered prompts and replies), so nothing one key sent shapes what
another is served or told (`cached_tokens`).

Non-finite logits (broken weights) are caught on every path: the engine reports each generated id's
logprob (0 alternatives when the client asked for none), and an id whose logprob is not finite never
reaches the output; the request ends with a 503 (a stream: an error event).

Why one module: the budget wrap-up, the n > 1 choices, logprobs, the non-finite-logits guard and the
recorder all act inside one generation loop over one stream; split, each part would reach into its state.
"""
from __future__ import annotations

import math
import os
import secrets
import sys
import threading
import uuid
from collections import OrderedDict
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any, Sequence

from strata_lab.text.stream import plain_drained
from strata_lab.server.errors import RequestError
from strata_lab.server.output import Event, OutputParser, StopMatcher, TextStream
from strata_lab.server.request import ChatRequest

__all__ = ["ChatRunner", "RenderedPrompt", "Summary", "WRAP_UP", "plain_drained", "EngineCall", "CallOutcome", "choice_seed"]

# Qwen's own wording for closing a reasoning cut short by a budget.
WRAP_UP = ("\n\nConsidering the limited time by the user, I have to give the solution based on the "
           "thinking directly now.\n</think>\n\n")


@dataclass
class RenderedPrompt:
    """What the HTTP side prepared before queueing: the rendered prompt and where the assistant turn starts."""

    prompt_text: str
    assistant_text: str          # the rendered assistant turn so far (after its header): primes the parser
    prefix_text: str | None      # the assistant prefix as appended (for the debug accounting)
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    prompt_ids: list[int] | None = None  # completions: these ids go to the engine as given (no encoder)
    raw: bool = False                    # completions: all output is content (no <think>/<tool_call> routing)


@dataclass
class CallStats:
    prompt_len: int
    reused: int
    generated: int
    prefill_ms: float
    decode_ms: float


@dataclass
class Summary:
    finish: str                  # "stop" | "length" | "cancelled"
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    calls: list[CallStats]
    reasoning: str = ""
    content: str = ""
    tool_calls: list = field(default_factory=list)
    stop_sequence: str | None = None  # the stop sequence that ended the output, if one did
    index: int = 0                    # the choice (n > 1)
    gen_ids: list = field(default_factory=list)    # the reply's ids (the turn end excluded)
    logprobs: list = field(default_factory=list)   # engine.TokenLogprob per gen id, when asked for
    choices: list = field(default_factory=list)    # every choice's Summary (this one first) when n > 1
    prompt_ids: list = field(default_factory=list)
    prompt_logprobs: list | None = None            # engine.TokenLogprob per prompt id after the first
    slot: int = 0
    seed: int = 0                                  # the request's seed: the client's, or the fresh one drawn
    events: list = field(default_factory=list)     # the choice's output Events in order (what a stream sent)
    reasoning_tokens: int = 0                      # generated ids read while inside the thought
    token_ids: list | None = None                  # return_token_ids (vLLM): the ids the engine generated after
                                                   # the prompt, the end of turn included (None: not asked)

    def timings(self) -> dict:
        """llama.cpp-style timings summed over the request's engine calls."""
        prompt_n = sum(c.prompt_len - c.reused for c in self.calls)
        prompt_ms = sum(c.prefill_ms for c in self.calls)
        predicted_ms = sum(c.decode_ms for c in self.calls)
        return {"prompt_n": prompt_n, "cache_n": sum(c.reused for c in self.calls), "prompt_ms": prompt_ms,
                "prompt_per_second": prompt_n / prompt_ms * 1000 if prompt_ms > 0 else 0.0,
                "predicted_n": self.completion_tokens, "predicted_ms": predicted_ms,
                "predicted_per_second": self.completion_tokens / predicted_ms * 1000 if predicted_ms > 0 else 0.0}


def choice_seed(seed: int | None, index: int) -> int:
    """The seed of choice `index`: the request's seed for choice 0, then a splitmix step per choice, so
    choices differ and the same request gives the same choices.

    >>> choice_seed(7, 0), choice_seed(7, 1) != choice_seed(7, 2)
    (7, True)
    """
    base = 0 if seed is None else int(seed)
    return (base + index * 0x9E3779B97F4A7C15) % 2**64


@dataclass
class EngineCall:
    """One engine call the runner makes: the prompt, the cap, how to sample, what to record."""

    prompt_ids: list[int]
    max_new: int
    sampling: Any                     # engine.Sampling
    record_meta: dict
    budget: int | None = None         # thinking budget: stop after this many reasoning ids
    logprobs: int | None = None
    token_mask: Any = None            # grammar mask for the decode loop (grammar.GrammarMask)
    extra_stop: tuple = ()            # the request's stop_token_ids (vLLM): they end the call too


@dataclass
class CallOutcome:
    """What one engine call did, as the runner saw it."""

    result: Any                       # engine.GenerateResult
    consumed: int                     # ids fed to the output while the stream ran (the rest came after a stop)
    hit_budget: bool                  # stopped by the thinking budget


class _Choice:
    """One choice's output path: ids -> UTF-8 text -> stop sequences -> reasoning/content/tool calls."""

    def __init__(self, runner: "ChatRunner", job, rendered: RenderedPrompt, req: ChatRequest, index: int):
        self.runner, self.job, self.index, self.raw = runner, job, index, rendered.raw
        self.parser = OutputParser()
        if not rendered.raw:
            self.parser.prime(rendered.assistant_text)
        self.text = TextStream(runner.tokenizer)
        controls = req.features.controls
        # stop sequences: the text ends before the first one (after it with include_stop_str_in_output)
        self.matcher = StopMatcher(req.stop, include=controls.include_stop, after=controls.min_tokens)
        self.stop_token_ids, self.include_stop = frozenset(controls.stop_token_ids), controls.include_stop
        self.events: list[Event] = []
        self.reasoning_tokens = 0
        self.one_call = not req.parallel_tool_calls  # parallel_tool_calls false: the reply ends after one call
        self.calls = 0

    def _route(self, text: str) -> list[Event]:
        if self.raw:
            return [Event("content", text)] if text else []
        return self.parser.feed(text)

    def _emit(self, evs) -> None:
        for ev in evs:
            if ev.kind == "tool_call":
                if self.one_call and self.calls:
                    continue
                self.calls += 1
            self.events.append(ev)
            if self.index == 0:
                self.job.emit("event", ev)
            else:  # n > 1: streamed with the choice's index (OpenAI chat)
                self.job.emit("choice_event", (self.index, ev))

    def feed(self, ids: Sequence[int]) -> None:
        for i in ids:
            if i in self.runner.stop_ids:  # the end of the turn is not text
                continue
            if i in self.stop_token_ids and not self.include_stop:  # vLLM: a stop id's text is left out
                continue
            self._emit(self._route(self.matcher.push(self.text.push(i))))

    def finish(self) -> None:
        tail = self.matcher.push(self.text.flush()) + self.matcher.flush()
        evs = self._route(tail) if tail else []
        self._emit(evs + ([] if self.raw else self.parser.finish()))


def _stats_dict(stats: Any) -> dict | None:
    if stats is None:
        return None
    if is_dataclass(stats):
        return asdict(stats)
    if isinstance(stats, dict):
        return dict(stats)
    return {k: v for k, v in vars(stats).items() if not k.startswith("_")}


def _finite(entry) -> bool:
    """A TokenLogprob whose logprob and alternatives are all finite numbers."""
    return math.isfinite(entry.logprob) and all(math.isfinite(lp) for _, lp in entry.top)


def _debugging() -> bool:
    return os.environ.get("STRATA_DEBUG", "") not in ("", "0")


def _debug(line: str) -> None:
    if _debugging():
        print(f"[strata] {line}", file=sys.stderr, flush=True)


class ChatRunner:
    """Owns the slots (engine sessions), the prompt encoder and the recorder; runs one request per slot at a
    time (several slots at once: the engine batches their decode steps)."""

    def __init__(self, *, tokenizer, pool, encoder, max_context: int, recorder=None, reply_reuse: bool = True,
                 model_name: str = "strata", stop_latency: int = 0, engine=None, grammars=None,
                 max_tokens_default: int | None = None, default_seed: int | None = None):
        self.tokenizer = tokenizer
        self.pool = pool                  # slots.SlotPool
        self.encoder = encoder
        self.max_context = max_context
        self.recorder = recorder
        self.reply_reuse = reply_reuse
        self.model_name = model_name
        self.engine = engine              # strata_lab.engine.Engine: prompt logprobs (and keeps sessions alive)
        self.grammars = grammars          # grammar.GrammarCompiler, or None (constraints then 400 at parse)
        self.stop_ids = tuple(i for i in (tokenizer.im_end_id, tokenizer.eos_id) if i is not None)
        self.stop_latency = stop_latency  # engine steps before a STOP takes effect (models a late STOP)
        self.engine_calls = 0
        self.max_tokens_default = max_tokens_default  # the cap of a request that names none (None: the context)
        self.default_seed = default_seed  # the seed of a request that names none (None: a fresh one each)
        if recorder is not None:  # the recorder observes the engine: it gets each call's record when the call ends
            if engine is None:
                raise ValueError("a recorder observes the engine: pass engine= with recorder=")
            engine.add_observer(recorder)
        # requests run on several worker lanes (one per slot): a slot serves one request at a time
        self._slots_cv = threading.Condition()
        self._in_use: set[int] = set()
        self._encode_lock = threading.Lock()  # the encoder keeps per-call state (last_stats)
        self._encoders: OrderedDict = OrderedDict()  # API key name -> its own PromptEncoder (most recent last)

    # --- one request ------------------------------------------------------------------------------
    def run(self, job, req: ChatRequest, rendered: RenderedPrompt, *, owner: str | None = None) -> None:
        """Run one request for API key `owner` (None: no key, or --shared-cache) on a slot of its own."""
        f = req.features
        if rendered.prompt_ids is not None:
            prompt_ids, encoder_stats = list(rendered.prompt_ids), None
        else:
            with self._encode_lock:
                encoder = self.encoder_for(owner)
                prompt_ids = list(encoder.encode(rendered.prompt_text))
                encoder_stats = _stats_dict(getattr(encoder, "last_stats", None))
        prompt_ids = f.controls.truncate(prompt_ids, self.max_context)  # vLLM's truncate_prompt_tokens
        f.controls.check_vocab(self.engine.vocab_size if self.engine is not None else self.tokenizer.vocab_size)
        self._check_context(req, prompt_ids)
        # no seed: the server's --seed, else a fresh one per request
        seed = req.seed if req.seed is not None else self.default_seed if self.default_seed is not None \
            else secrets.randbits(63)
        bias = self._logit_bias(req)
        if rendered.prefix_text and _debugging():  # a second encode of the prompt: only when it is printed
            base = rendered.prompt_text[:len(rendered.prompt_text) - len(rendered.prefix_text)]
            x = len(self.tokenizer.encode_batch([base])[0])
            z = len(prompt_ids)
            _debug(f"assistant prefill: {z - x} tokens (prompt {x} -> {z}, generation starts at position {z})")
        with self._slots_cv:
            slot = self.pool.choose(prompt_ids, slot=f.slot, key=f.session_key, busy=self._in_use, owner=owner)
            while slot.id in self._in_use:  # its slot serves another request: wait for it (bounded by that one)
                if job.cancelled:
                    return
                self._slots_cv.wait(timeout=0.1)
            self._in_use.add(slot.id)
            foreign = self.pool.take(slot, owner)
        try:
            if foreign:  # another key's ids: dropped before this key's prompt is planned or read
                slot.session.reset()
            self._run_on(job, req, rendered, slot, prompt_ids, encoder_stats, seed, bias)
        finally:
            with self._slots_cv:
                self._in_use.discard(slot.id)
                self._slots_cv.notify_all()

    def _run_on(self, job, req: ChatRequest, rendered: RenderedPrompt, slot, prompt_ids: list[int], encoder_stats,
                seed: int, bias) -> None:
        f = req.features
        if not f.cache_prompt:
            slot.session.reset()
        # the reuse the engine will apply (Contract 1's rule, the same the call follows): message_start's usage
        cached = int(slot.session.plan(prompt_ids)["reused"])
        prompt_lp = None
        if f.prompt_logprobs is not None:
            prompt_lp = self.engine.prompt_logprobs(prompt_ids, top_n=f.prompt_logprobs)
            if not all(_finite(e) for e in prompt_lp):
                raise self._non_finite()
        job.emit("start", {"prompt_tokens": len(prompt_ids), "cached_tokens": cached, "slot": slot.id,
                           "prompt_ids": prompt_ids, "prompt_logprobs": prompt_lp, "seed": seed,
                           "return_token_ids": f.return_token_ids})

        summaries, calls_made = [], 0
        for index in range(f.n):
            if job.cancelled and index > 0:
                break
            s, used = self._choice(job, req, rendered, slot, prompt_ids, index, calls_made,
                                   encoder_stats if index == 0 else None, seed=seed, bias=bias)
            calls_made += used
            summaries.append(s)
        first = summaries[0]
        first.choices = summaries
        first.prompt_logprobs = prompt_lp
        first.prompt_ids = prompt_ids
        first.slot = slot.id
        first.completion_tokens = sum(s.completion_tokens for s in summaries)
        first.seed = seed
        job.emit("done", first)

    def _logit_bias(self, req: ChatRequest) -> tuple:
        """The request's logit_bias as ((id, bias), ...): a text key biases each id of its encoding; an id
        outside the vocabulary is a 400 naming it."""
        out: dict[int, float] = {}
        vocab = self.engine.vocab_size if self.engine is not None else self.tokenizer.vocab_size
        texts = [key for key, _ in req.logit_bias if isinstance(key, str)]
        # one encode_batch call: it releases the GIL (the texts are bounded: request.MAX_BIAS_TEXT)
        encoded = iter(self.tokenizer.encode_batch(texts) if texts else [])
        for key, value in req.logit_bias:
            ids = next(encoded) if isinstance(key, str) else [key]
            for i in ids:
                if not 0 <= i < vocab:
                    raise RequestError("logit_bias", f"token id {i} is out of range (0..{vocab - 1})")
                out[i] = value
        if req.ignore_eos:  # llama.cpp's ignore_eos: the end-of-turn ids can never be sampled
            out.update({i: -100.0 for i in self.stop_ids})
        return tuple(out.items())

    def _choice(self, job, req: ChatRequest, rendered: RenderedPrompt, slot, prompt_ids: list[int], index: int, call0: int,
                encoder_stats, *, seed: int, bias: tuple = ()) -> tuple[Summary, int]:
        """One choice: the first call, a thinking-budget wrap-up call if needed; returns (Summary, calls)."""
        from strata_lab.engine import Sampling

        f = req.features
        sampling = Sampling(temperature=req.temperature, top_p=req.top_p, top_k=req.top_k, min_p=req.min_p,
                            seed=choice_seed(seed, index), logit_bias=bias,
                            repetition_penalty=req.repetition_penalty, penalty_last_n=req.repeat_last_n,
                            frequency_penalty=req.frequency_penalty, presence_penalty=req.presence_penalty)
        out = _Choice(self, job, rendered, req, index)
        mask = self.grammars.mask_for(req, rendered) if self.grammars is not None else None
        mask = self._controlled(req, mask)
        limit = req.max_tokens if req.max_tokens is not None else self.max_tokens_default
        meta = {"request_id": rendered.request_id, "call": call0, "model": self.model_name}
        if encoder_stats is not None:
            meta["encoder"] = encoder_stats
        first = self.call(job, slot, EngineCall(prompt_ids, self._room(len(prompt_ids), limit), sampling, meta,
                                                budget=req.thinking_budget, logprobs=f.logprobs, token_mask=mask,
                                                extra_stop=f.controls.stop_token_ids), out)
        result = first.result
        gen_ids = list(result.gen_ids)
        token_ids = list(gen_ids)  # return_token_ids: what the engine generated (a wrap-up adds to it below)
        out.feed(gen_ids[first.consumed:])  # ids the engine passed on after we stopped reading
        finish = ("cancelled" if job.cancelled else "stop" if out.matcher.hit is not None else
                  "budget" if first.hit_budget else result.finish)
        calls = [self._stats(0, prompt_ids, result)]
        logprobs = list(result.logprobs) if f.logprobs is not None else []  # else the guard's own, not sent
        reply_ids = gen_ids + plain_drained(self.tokenizer, result.drained_ids, self.stop_ids,
                                            mid_character=out.text.mid_character)
        completion = len(reply_ids)

        if first.hit_budget and not job.cancelled and out.matcher.hit is None:
            # wrap-up: the first prompt + thought ids + kept drained ids + the closing words, one more call
            kept = reply_ids[len(gen_ids):]
            out.feed(kept)
            wrap_ids = self.tokenizer.encode(WRAP_UP) if out.parser.in_reasoning else []
            out.feed(wrap_ids)
            prompt2 = prompt_ids + gen_ids + kept + wrap_ids
            remaining = None if limit is None else max(0, limit - completion)
            if len(prompt2) <= self.max_context:
                meta2 = {"request_id": rendered.request_id, "call": call0 + 1, "model": self.model_name}
                second = self.call(job, slot, EngineCall(prompt2, self._room(len(prompt2), remaining), sampling,
                                                         meta2, logprobs=f.logprobs,
                                                         token_mask=self._controlled(req, None, done=reply_ids),
                                                         extra_stop=f.controls.stop_token_ids), out)
                result = second.result
                gen2 = list(result.gen_ids)
                token_ids = gen_ids + kept + wrap_ids + gen2
                out.feed(gen2[second.consumed:])
                finish = "cancelled" if job.cancelled else "stop" if out.matcher.hit is not None else result.finish
                calls.append(self._stats(1, prompt2, result))
                more = gen2 + plain_drained(self.tokenizer, result.drained_ids, self.stop_ids,
                                            mid_character=out.text.mid_character)
                reply_ids = gen_ids + kept + wrap_ids + more
                logprobs += list(result.logprobs) if f.logprobs is not None else []
                completion += len(more)
            else:
                finish = "length"

        out.finish()
        if self.reply_reuse and rendered.prompt_ids is None and f.controls.truncate_prompt_tokens is None:
            self.encoder_for(slot.owner).remember_reply(prompt_ids, reply_ids)

        from strata_lab.server.output import collect

        reasoning, content, tool_calls = collect(out.events)
        if finish == "budget":
            finish = "length"
        summary = Summary(finish=finish, prompt_tokens=len(prompt_ids), completion_tokens=completion,
                          cached_tokens=calls[0].reused, calls=calls, reasoning=reasoning, content=content,
                          tool_calls=tool_calls, stop_sequence=out.matcher.hit, index=index,
                          gen_ids=[i for i in reply_ids if i not in self.stop_ids],
                          logprobs=[e for e in logprobs if e.id not in self.stop_ids],
                          events=list(out.events), reasoning_tokens=out.reasoning_tokens,
                          token_ids=token_ids if f.return_token_ids else None)
        if req.schema is not None and not job.cancelled:
            self._check_schema(req, rendered, content, finish)
        return summary, len(calls)

    # --- pieces -----------------------------------------------------------------------------------
    MAX_KEY_ENCODERS = 16  # API keys whose prompt encoders are kept (the least recently used one goes)

    def encoder_for(self, owner: str | None):
        """The prompt encoder of API key `owner`: the runner's own `encoder` for None (no key, or a shared
        cache), else one per key, so one key's remembered prompts and replies never shape another's ids."""
        if owner is None:
            return self.encoder
        with self._slots_cv:
            enc = self._encoders.pop(owner, None)
            if enc is None:
                e = self.encoder
                enc = type(e)(self.tokenizer, max_chars=e.max_chars, max_tokens=e.max_tokens,
                              chunk_chars=e.chunk_chars)
            self._encoders[owner] = enc
            while len(self._encoders) > self.MAX_KEY_ENCODERS:
                self._encoders.popitem(last=False)
            return enc

    def _controlled(self, req: ChatRequest, mask, done=()):
        """`mask` (the grammar's, or None) with the request's vLLM token controls on top (controls.py)."""
        from strata_lab.server.controls import TokenFilter, bad_word_ids

        c = req.features.controls
        if not c.active:
            return mask
        vocab = self.engine.vocab_size if self.engine is not None else self.tokenizer.vocab_size
        return TokenFilter(mask, vocab, c, end_ids=self.stop_ids + c.stop_token_ids,
                           words=bad_word_ids(self.tokenizer, c.bad_words), done=done)

    def _room(self, prompt_len: int, limit: int | None) -> int:
        room = max(0, self.max_context - prompt_len)
        return room if limit is None else min(limit, room)

    def _check_context(self, req: ChatRequest, prompt_ids: list[int]) -> None:
        n = len(prompt_ids)
        if n > self.max_context:
            raise RequestError("messages", f"the prompt is {n} tokens, over the context of {self.max_context} "
                               "tokens (assistant_prefix tokens count as prompt tokens)",
                               code="context_length_exceeded")
        if req.max_tokens is not None and n + req.max_tokens > self.max_context:
            raise RequestError(req.max_tokens_field, f"the prompt ({n} tokens) plus {req.max_tokens} tokens to "
                               f"generate exceed the context of {self.max_context} tokens",
                               code="context_length_exceeded")

    def call(self, job, slot, call: EngineCall, out: _Choice) -> CallOutcome:
        """One engine call on `slot`, fed to `out` id by id; stops at a stop sequence, at the thinking
        budget, or when the job is cancelled. The engine hands the call's record to its observers (the
        recorder among them) when it ends."""
        self.engine_calls += 1
        stream = slot.session.generate(call.prompt_ids, max_new_tokens=call.max_new, sampling=call.sampling,
                                       stop_ids=self.stop_ids + tuple(call.extra_stop),
                                       stop_latency=self.stop_latency,
                                       # a STOP counts from the last id read here, however busy the machine
                                       paced=True, record_meta=call.record_meta,
                                       # the chosen id's logprob always (the non-finite guard below)
                                       logprobs=call.logprobs if call.logprobs is not None else 0,
                                       token_mask=call.token_mask)
        consumed, thought = 0, 0
        hit_budget = stopped = non_finite = False
        for token in stream:
            if stopped:
                continue  # draining: the engine keeps these, result.drained_ids lists them
            if job.cancelled:
                stream.stop()
                stopped = True
                continue
            if not _finite(stream.logprobs[-1]):  # before the id reaches the output: nothing of it is sent
                stream.stop()  # NaN / infinite logits: the model is broken (its ids are garbage), a 503
                stopped = non_finite = True
                continue
            counts = out.parser.in_reasoning
            out.feed([token])
            consumed += 1
            if call.logprobs is not None and token not in self.stop_ids:  # streamed after the text it produced
                if out.index == 0:
                    job.emit("logprobs", stream.logprobs[-1])
                else:
                    job.emit("choice_logprobs", (out.index, stream.logprobs[-1]))
            if out.matcher.hit is not None or (out.one_call and out.calls):
                stream.stop(reason="stop")
                stopped = True
                continue
            if counts:
                thought += 1
                if call.budget is not None and thought >= call.budget and out.parser.in_reasoning:
                    stream.stop(reason="budget")
                    stopped = hit_budget = True
        out.reasoning_tokens += thought
        if non_finite:
            raise self._non_finite()
        return CallOutcome(result=stream.result, consumed=consumed, hit_budget=hit_budget)

    def _non_finite(self) -> RequestError:
        return RequestError(None, f"model {self.model_name!r} produced non-finite logits (NaN or infinity): its "
                            "weights are broken (load with --check-weights to refuse them at start)",
                            code="model_error", status=503)

    def _stats(self, call: int, prompt_ids, result) -> CallStats:
        reused = int(result.reused)
        _debug(f"prefill: call {call}: prompt {len(prompt_ids)} tokens, reused {reused}, "
               f"read {len(prompt_ids) - reused}, {result.prefill_ms:.1f} ms")
        return CallStats(len(prompt_ids), reused, len(result.gen_ids), float(result.prefill_ms),
                         float(result.decode_ms))

    def _check_schema(self, req: ChatRequest, rendered: RenderedPrompt, content: str, finish: str) -> None:
        import json

        import jsonschema

        from strata_lab.server.schemas import schema_validator

        # The logical reply is prefix + continuation: a prefix may open the JSON the model completes.
        text = (rendered.prefix_text or "") + content
        cut = " (the output was cut by the token limit)" if finish == "length" else ""
        try:
            value = json.loads(text)
            error = jsonschema.exceptions.best_match(schema_validator(req.schema).iter_errors(value))
            if error is not None:
                raise error
        except ValueError as exc:
            raise RequestError("response_format", f"the output is not valid JSON{cut}: {exc}",
                               code="structured_output_failed", status=422) from None
        except jsonschema.ValidationError as exc:
            raise RequestError("response_format", f"the output does not match the schema{cut}: {exc.message}",
                               code="structured_output_failed", status=422) from None
        except Exception as exc:  # the schema was checked at parse time; never a 500
            raise RequestError("response_format", f"the output could not be checked: {type(exc).__name__}",
                               code="structured_output_failed", status=422) from None
