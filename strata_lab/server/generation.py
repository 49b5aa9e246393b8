"""The work of one chat request on the engine: encode, generate, budget wrap-up, record, remember.

`ChatRunner.run(job, req, plan)` runs on the engine worker's thread (one request at a time). It emits
("start", info), then ("event", output.Event) as text arrives, then ("done", Summary) or ("error", exc).

Thinking budget (pr-1536): while the output is inside `<think>`, generated ids are counted; at the budget
the runner calls `stream.stop()`. Ids the engine drained after the STOP are in its state: the leading run
of plain-text ones (no stop id, no `<`, no split character) joins the thinking, the rest is dropped from
the text (they stay in the dump). A wrap-up closes the reasoning and a second engine call continues with
prompt = first prompt + thought ids + kept drained ids + wrap-up ids, so the engine reuses all it holds.
"""
from __future__ import annotations

import os
import sys
import uuid
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any, Sequence

from strata_lab.text.stream import plain_drained
from strata_lab.server.errors import RequestError
from strata_lab.server.output import Event, OutputParser, StopMatcher, TextStream
from strata_lab.server.request import ChatRequest

__all__ = ["ChatRunner", "Plan", "Summary", "WRAP_UP", "plain_drained"]

# Qwen's own wording for closing a reasoning cut short by a budget.
WRAP_UP = ("\n\nConsidering the limited time by the user, I have to give the solution based on the "
           "thinking directly now.\n</think>\n\n")


@dataclass
class Plan:
    """What the HTTP side prepared before queueing: the rendered prompt and where the assistant turn starts."""

    prompt_text: str
    assistant_text: str          # the rendered assistant turn so far (after its header): primes the parser
    prefix_text: str | None      # the assistant prefix as appended (for the debug accounting)
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)


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

    def timings(self) -> dict:
        """llama.cpp-style timings summed over the request's engine calls."""
        prompt_n = sum(c.prompt_len - c.reused for c in self.calls)
        prompt_ms = sum(c.prefill_ms for c in self.calls)
        predicted_ms = sum(c.decode_ms for c in self.calls)
        return {"prompt_n": prompt_n, "cache_n": sum(c.reused for c in self.calls), "prompt_ms": prompt_ms,
                "prompt_per_second": prompt_n / prompt_ms * 1000 if prompt_ms > 0 else 0.0,
                "predicted_n": self.completion_tokens, "predicted_ms": predicted_ms,
                "predicted_per_second": self.completion_tokens / predicted_ms * 1000 if predicted_ms > 0 else 0.0}


def _stats_dict(stats: Any) -> dict | None:
    if stats is None:
        return None
    if is_dataclass(stats):
        return asdict(stats)
    if isinstance(stats, dict):
        return dict(stats)
    return {k: v for k, v in vars(stats).items() if not k.startswith("_")}


def _debug(line: str) -> None:
    if os.environ.get("STRATA_DEBUG", "") not in ("", "0"):
        print(f"[strata] {line}", file=sys.stderr, flush=True)


class ChatRunner:
    """Owns the engine session, the prompt encoder and the recorder; runs requests one at a time."""

    def __init__(self, *, tokenizer, session, session_name: str, encoder, max_context: int,
                 recorder=None, reply_reuse: bool = True, model_name: str = "strata", stop_latency: int = 0,
                 max_tokens_default: int | None = None):
        self.tokenizer = tokenizer
        self.session = session
        self.session_name = session_name
        self.encoder = encoder
        self.max_context = max_context
        self.recorder = recorder
        self.reply_reuse = reply_reuse
        self.model_name = model_name
        self.stop_ids = tuple(i for i in (tokenizer.im_end_id, tokenizer.eos_id) if i is not None)
        self.stop_latency = stop_latency  # engine steps before a STOP takes effect (models a late STOP)
        self.engine_calls = 0
        self.max_tokens_default = max_tokens_default  # the cap of a request that names none (None: the context)

    # --- one request ------------------------------------------------------------------------------
    def run(self, job, req: ChatRequest, plan: Plan) -> None:
        from strata_lab.engine import Sampling

        prompt_ids = list(self.encoder.encode(plan.prompt_text))
        encoder_stats = _stats_dict(getattr(self.encoder, "last_stats", None))
        self._check_context(req, prompt_ids)
        if plan.prefix_text:
            base = plan.prompt_text[:len(plan.prompt_text) - len(plan.prefix_text)]
            x = len(self.tokenizer.encode(base))
            z = len(prompt_ids)
            _debug(f"assistant prefill: {z - x} tokens (prompt {x} -> {z}, generation starts at position {z})")
        # the reuse the engine will apply (Contract 1's rule, the same the call follows): message_start's usage
        cached = int(self.session.plan(prompt_ids)["reused"])
        job.emit("start", {"prompt_tokens": len(prompt_ids), "cached_tokens": cached})

        sampling = Sampling(temperature=req.temperature, top_p=req.top_p, top_k=req.top_k,
                            seed=req.seed if req.seed is not None else 0)
        parser = OutputParser()
        parser.prime(plan.assistant_text)
        text = TextStream(self.tokenizer)
        matcher = StopMatcher(req.stop)  # stop sequences: the text ends before the first one
        events: list[Event] = []

        def feed(ids: Sequence[int]) -> None:
            for i in ids:
                if i in self.stop_ids:  # the end of the turn is not text
                    continue
                for ev in parser.feed(matcher.push(text.push(i))):
                    events.append(ev)
                    job.emit("event", ev)

        budget = req.thinking_budget
        calls: list[CallStats] = []
        limit = req.max_tokens if req.max_tokens is not None else self.max_tokens_default
        max_new = self._room(len(prompt_ids), limit)
        meta = {"request_id": plan.request_id, "call": 0, "encoder": encoder_stats, "model": self.model_name}
        consumed, hit_budget, thought = self._generate(job, prompt_ids, max_new, sampling, feed, parser, budget,
                                                       meta, matcher)
        result = consumed["result"]
        gen_ids = list(result.gen_ids)
        drained = list(result.drained_ids)
        feed(gen_ids[consumed["n"]:])  # ids the engine passed on after we stopped reading
        finish = ("cancelled" if job.cancelled else "stop" if matcher.hit is not None else
                  "budget" if hit_budget else result.finish)
        calls.append(self._stats(0, prompt_ids, result))
        reply_ids = gen_ids + plain_drained(self.tokenizer, drained, self.stop_ids, mid_character=text.mid_character)
        completion = len(reply_ids)

        if hit_budget and not job.cancelled and matcher.hit is None:
            kept = reply_ids[len(gen_ids):]
            feed(kept)
            wrap_ids = self.tokenizer.encode(WRAP_UP) if parser.in_reasoning else []
            feed(wrap_ids)
            prompt2 = prompt_ids + gen_ids + kept + wrap_ids
            remaining = None if limit is None else max(0, limit - completion)
            if len(prompt2) <= self.max_context:
                max_new2 = self._room(len(prompt2), remaining)
                meta2 = {"request_id": plan.request_id, "call": 1, "model": self.model_name}
                consumed2, _, _ = self._generate(job, prompt2, max_new2, sampling, feed, parser, None, meta2,
                                                 matcher)
                result = consumed2["result"]
                gen2 = list(result.gen_ids)
                feed(gen2[consumed2["n"]:])
                finish = ("cancelled" if job.cancelled else "stop" if matcher.hit is not None else
                          result.finish)
                calls.append(self._stats(1, prompt2, result))
                more = gen2 + plain_drained(self.tokenizer, result.drained_ids, self.stop_ids,
                                            mid_character=text.mid_character)
                reply_ids = gen_ids + kept + wrap_ids + more
                completion += len(more)
            else:
                finish = "length"

        tail = matcher.push(text.flush()) + matcher.flush()
        for ev in parser.feed(tail) + parser.finish() if tail else parser.finish():
            events.append(ev)
            job.emit("event", ev)
        if self.reply_reuse:
            self.encoder.remember_reply(prompt_ids, reply_ids)

        from strata_lab.server.output import collect

        reasoning, content, tool_calls = collect(events)
        if finish == "budget":
            finish = "length"
        summary = Summary(finish=finish, prompt_tokens=len(prompt_ids), completion_tokens=completion,
                          cached_tokens=calls[0].reused, calls=calls, reasoning=reasoning, content=content,
                          tool_calls=tool_calls, stop_sequence=matcher.hit)
        if req.schema is not None and not job.cancelled:
            self._check_schema(req, plan, content)
        job.emit("done", summary)

    # --- pieces -----------------------------------------------------------------------------------
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

    def _generate(self, job, prompt_ids, max_new, sampling, feed, parser, budget, record_meta, matcher):
        """One engine call, fed token by token; stops at a stop sequence, at the budget, or when the job is
        cancelled.

        The engine writes the call's dump line (with `record_meta`) when the call ends."""
        self.engine_calls += 1
        stream = self.session.generate(prompt_ids, max_new_tokens=max_new, sampling=sampling,
                                       stop_ids=self.stop_ids, stop_latency=self.stop_latency,
                                       record=self.recorder or False, record_meta=record_meta)
        n = 0
        thought = 0
        hit_budget = False
        stopped = False
        for token in stream:
            if stopped:
                continue  # draining: the engine keeps these, result.drained_ids lists them
            if job.cancelled:
                stream.stop()
                stopped = True
                continue
            counts = parser.in_reasoning
            feed([token])
            n += 1
            if matcher.hit is not None:
                stream.stop(reason="stop")
                stopped = True
                continue
            if counts:
                thought += 1
                if budget is not None and thought >= budget and parser.in_reasoning:
                    stream.stop(reason="budget")
                    stopped = hit_budget = True
        return {"result": stream.result, "n": n}, hit_budget, thought

    def _stats(self, call: int, prompt_ids, result) -> CallStats:
        reused = int(result.reused)
        _debug(f"prefill: call {call}: prompt {len(prompt_ids)} tokens, reused {reused}, "
               f"read {len(prompt_ids) - reused}, {result.prefill_ms:.1f} ms")
        return CallStats(len(prompt_ids), reused, len(result.gen_ids), float(result.prefill_ms),
                         float(result.decode_ms))

    def _check_schema(self, req: ChatRequest, plan: Plan, content: str) -> None:
        import json

        import jsonschema

        from strata_lab.server.schemas import schema_validator

        # The logical reply is prefix + continuation: a prefix may open the JSON the model completes.
        text = (plan.prefix_text or "") + content
        try:
            value = json.loads(text)
            error = jsonschema.exceptions.best_match(schema_validator(req.schema).iter_errors(value))
            if error is not None:
                raise error
        except ValueError as exc:
            raise RequestError("response_format", f"the output is not valid JSON: {exc}",
                               code="structured_output_failed", status=422) from None
        except jsonschema.ValidationError as exc:
            raise RequestError("response_format", f"the output does not match the schema: {exc.message}",
                               code="structured_output_failed", status=422) from None
        except Exception as exc:  # the schema was checked at parse time; never a 500
            raise RequestError("response_format", f"the output could not be checked: {type(exc).__name__}",
                               code="structured_output_failed", status=422) from None
