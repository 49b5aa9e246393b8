"""OpenTelemetry GenAI spans exported as JSON: OTLP-JSON (``{"resourceSpans": [...]}`` one request per line, as
the collector's file exporter writes), one span object per line (the Python console exporter), or a JSON array
of spans. Messages come from ``gen_ai.input.messages`` / ``gen_ai.output.messages`` / ``gen_ai.system_instructions``
(parts: text, tool_call, tool_call_response, reasoning, blobs), or the older ``gen_ai.content.prompt`` /
``gen_ai.content.completion`` events (``gen_ai.prompt`` / ``gen_ai.completion`` JSON) and indexed
``gen_ai.prompt.N.role``/``content`` attributes. Usage: ``gen_ai.usage.input_tokens`` (includes the cache
buckets), ``gen_ai.usage.cache_read.input_tokens``, ``gen_ai.usage.cache_creation.input_tokens`` (or
OpenLLMetry's ``gen_ai.usage.prompt_tokens`` / ``completion_tokens`` / ``cache_read_input_tokens`` /
``cache_creation_input_tokens``). A model span without content (capture off) is a length-only call. Session:
``gen_ai.conversation.id``, else prefix-chaining within the span's trace (independent traces never share a
session).

The JS SDKs' spans (the span object as JSON: ``{"name", "spanContext" | "_spanContext": {"traceId", "spanId"},
"attributes"}``, or the console exporter's ``{"traceId", "id", "timestamp"}``) are read too. Vercel AI SDK
(``ai.*`` attributes): only its model-call spans (``ai.generateText.doGenerate``, ``ai.streamText.doStream``,
``ai.generateObject.doGenerate``, ``ai.streamObject.doStream``) are calls; the prompt is ``ai.prompt.messages``
(the SDK's own messages: ``text``, ``reasoning``, ``tool-call`` with ``input``/``args``, ``tool-result`` with
``output``/``result`` parts), else ``ai.prompt`` (``{system, prompt, messages}``); the reply
``ai.response.text`` / ``ai.response.reasoning`` / ``ai.response.toolCalls``; usage ``gen_ai.usage.input_tokens``
/ ``ai.usage.inputTokens`` / ``ai.usage.promptTokens``, cached ``ai.usage.inputTokenDetails.cacheReadTokens`` /
``ai.usage.cachedInputTokens`` (an Anthropic model under AI SDK 5 reports input tokens without the cache
buckets: they are added, noted). OpenInference (Arize Phoenix; ``openinference.span.kind`` = ``LLM``, other
kinds are no calls): ``llm.input_messages.N.message.role`` / ``content`` / ``contents`` / ``tool_calls`` /
``tool_call_id``, flattened or as nested lists, ``llm.output_messages``, ``llm.token_count.prompt`` /
``completion`` / ``prompt_details.cache_read`` / ``cache_write``, ``llm.tools``, ``session.id``.
"""
from __future__ import annotations

import json
from collections import OrderedDict
from typing import Iterator

from strata_lab.traces.log_calls import SessionChain, image_placeholder, new_call, text_parts, tool_call
from strata_lab.traces.claude_code import parse_ts
from strata_lab.traces.openai import convert_messages as openai_messages, reply_message
from strata_lab.traces.otel_conventions import _json, span_id, span_ts, text_parts_text
from strata_lab.traces.source import Source

NAME = "otel"
_MODEL_OPS = ("chat", "text_completion", "generate_content", "completion")
# the Vercel AI SDK's spans that are one model request each (the others wrap them, or run tools, or embed)
AI_SDK_CALLS = ("ai.generateText.doGenerate", "ai.streamText.doStream", "ai.generateObject.doGenerate",
                "ai.streamObject.doStream")
SESSION_KEY = True  # --session-key names a field of each record
MAX_OPEN_TRACES = 4096  # traces whose chains are kept at once (a span of an older trace starts a new session)


def detect(first: dict) -> bool:
    if "resourceSpans" in first:
        return True
    attrs = first.get("attributes")
    return isinstance(attrs, (dict, list)) and ("span_id" in first or "spanId" in first or "context" in first
                                                or "traceId" in first or "spanContext" in first
                                                or "_spanContext" in first)


def trace_id(span: dict):
    """The span's trace id, in any of the exporters' shapes (OTLP, Python's ``context``, the JS span object's
    ``spanContext`` / ``_spanContext``), or None."""
    for key in ("spanContext", "_spanContext", "context"):
        ctx = span.get(key)
        if isinstance(ctx, dict) and (ctx.get("traceId") or ctx.get("trace_id")):
            return ctx.get("traceId") or ctx.get("trace_id")
    return span.get("traceId") or span.get("trace_id")


def _value(v):
    if not isinstance(v, dict):
        return v
    for key in ("stringValue", "boolValue", "doubleValue"):
        if key in v:
            return v[key]
    if "intValue" in v:
        return int(v["intValue"])
    if "arrayValue" in v:
        return [_value(x) for x in (v["arrayValue"].get("values") or ())]
    return None


def _attrs(raw) -> dict:
    if isinstance(raw, dict):
        return raw
    return {a.get("key"): _value(a.get("value")) for a in raw or () if isinstance(a, dict)}


def _spans(rec: dict) -> Iterator[dict]:
    if "resourceSpans" in rec:
        for rs in rec.get("resourceSpans") or ():
            for ss in rs.get("scopeSpans") or rs.get("instrumentationLibrarySpans") or ():
                yield from ss.get("spans") or ()
    else:
        yield rec


def _from_parts(messages: list, notes: list) -> list[dict]:
    """Semconv messages (role + parts) into the internal shape."""
    out = []
    for m in messages:
        if not isinstance(m, dict):
            continue
        if "parts" not in m:  # already chat-shaped (some instrumentations)
            out.extend(openai_messages([m], notes))
            continue
        role = m.get("role", "user")
        text, calls, reasoning = [], [], []
        for p in m.get("parts") or ():
            kind = p.get("type")
            if kind == "text":
                text.append(str(p.get("content", "")))
            elif kind == "reasoning":
                reasoning.append(str(p.get("content", "")))
            elif kind == "tool_call":
                calls.append(tool_call(p.get("id"), p.get("name"), p.get("arguments")))
            elif kind == "tool_call_response":
                resp = p.get("response", p.get("result"))
                out.append({"role": "tool", "tool_call_id": str(p.get("id") or "call"),
                            "content": resp if isinstance(resp, str) else json.dumps(resp, ensure_ascii=False)})
            elif kind in ("blob", "uri", "file", "image"):
                text.append(image_placeholder(notes)["text"])
        if role == "tool" and not text:
            continue  # the tool messages were emitted above
        msg = {"role": role if role in ("system", "user", "assistant") else "user", "content": "".join(text)}
        if reasoning and msg["role"] == "assistant":
            msg["reasoning_content"] = "".join(reasoning)
        if calls and msg["role"] == "assistant":
            msg["tool_calls"] = calls
        out.append(msg)
    return out


def _indexed(attrs: dict, prefix: str) -> list[dict]:
    out, i = [], 0
    while f"{prefix}.{i}.role" in attrs or f"{prefix}.{i}.content" in attrs:
        out.append({"role": attrs.get(f"{prefix}.{i}.role", "assistant"), "content": attrs.get(f"{prefix}.{i}.content")})
        i += 1
    return out


def from_span(span: dict) -> dict | None:
    """One call from a GenAI span, or None when the span is not a model call."""
    attrs = _attrs(span.get("attributes"))
    op = attrs.get("ai.operationId") or span.get("name")
    if op in AI_SDK_CALLS:
        from strata_lab.traces.otel_conventions import from_ai_sdk

        return from_ai_sdk(span, attrs)
    if isinstance(op, str) and op.startswith("ai.") and "ai.operationId" in attrs or any(
            isinstance(k, str) and k.startswith("ai.prompt") for k in attrs):
        return None  # the AI SDK's other spans: the run around the steps, tool calls, embeddings
    kind = attrs.get("openinference.span.kind") or span.get("span_kind")
    if kind is not None:
        if str(kind).upper() != "LLM":
            return None  # OpenInference chains, agents, tools, retrievers: no model request of their own
        from strata_lab.traces.otel_conventions import from_openinference

        return from_openinference(span, attrs)
    events = {e.get("name"): _attrs(e.get("attributes")) for e in span.get("events") or () if isinstance(e, dict)}
    notes: list = []
    if "gen_ai.input.messages" in attrs:
        messages = _from_parts(_json(attrs["gen_ai.input.messages"]) or [], notes)
        output = _from_parts(_json(attrs.get("gen_ai.output.messages")) or [], notes)
    elif "gen_ai.content.prompt" in events:
        messages = openai_messages(_json(events["gen_ai.content.prompt"].get("gen_ai.prompt")) or [], notes)
        output = openai_messages(_json((events.get("gen_ai.content.completion") or {}).get("gen_ai.completion"))
                                 or [], notes)
    elif "gen_ai.prompt.0.content" in attrs:
        messages = openai_messages(_indexed(attrs, "gen_ai.prompt"), notes)
        output = openai_messages(_indexed(attrs, "gen_ai.completion"), notes)
    elif attrs.get("gen_ai.operation.name") in _MODEL_OPS or (
            "gen_ai.request.model" in attrs and "gen_ai.operation.name" not in attrs):
        messages, output = [], []  # a model call recorded without its content
    else:
        return None
    system = _json(attrs.get("gen_ai.system_instructions"))
    if isinstance(system, list):
        system = "".join(p.get("content", "") for p in system if isinstance(p, dict) and p.get("type") == "text")
    tools = _json(attrs.get("gen_ai.tool.definitions"))
    if isinstance(tools, list):
        tools = [t if "function" in t else {"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}
                 for t in tools if isinstance(t, dict)] or None
    reply = next((m for m in output if m.get("role") == "assistant"), None) or {}
    content = reply.get("content")
    call = new_call(format=NAME, fidelity="messages", notes=notes, messages=messages,
                    system=system if isinstance(system, str) and system else None,
                    tools=tools if isinstance(tools, list) else None,
                    model=attrs.get("gen_ai.response.model") or attrs.get("gen_ai.request.model"),
                    request_id=attrs.get("gen_ai.response.id") or span_id(span),
                    response_text=content if isinstance(content, str) else text_parts_text(content),
                    response_reasoning=reply.get("reasoning_content"),
                    response_tool_calls=reply.get("tool_calls"),
                    prompt_tokens=attrs.get("gen_ai.usage.input_tokens", attrs.get("gen_ai.usage.prompt_tokens")),
                    completion_tokens=attrs.get("gen_ai.usage.output_tokens",
                                                attrs.get("gen_ai.usage.completion_tokens")),
                    # semconv names, then OpenLLMetry's older ones
                    cache_read_tokens=attrs.get("gen_ai.usage.cache_read.input_tokens",
                                                attrs.get("gen_ai.usage.cache_read_input_tokens")),
                    cache_creation_tokens=attrs.get("gen_ai.usage.cache_creation.input_tokens",
                                                    attrs.get("gen_ai.usage.cache_creation_input_tokens")))
    call["cached_tokens"] = call["cache_read_tokens"]
    reasons = attrs.get("gen_ai.response.finish_reasons")
    call["finish"] = reasons[0] if isinstance(reasons, list) and reasons else None
    call["ts"] = span_ts(span)
    call["session"] = attrs.get("gen_ai.conversation.id")
    if not messages:
        if not isinstance(call["prompt_tokens"], int):
            raise ValueError("span has neither input messages nor gen_ai.usage.input_tokens")
        # content capture off (OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT unset): the usage is all there is
        call.update(fidelity="lengths", messages=None, prompt_len=call["prompt_tokens"], system=None)
        notes.append("no message content captured: lengths and usage only")
    return call


def _records(src: Source) -> Iterator[tuple[int, dict]]:
    head = src.head(4096).lstrip()
    if head.startswith(b"["):
        for lineno, item in src.array_items():
            if isinstance(item, dict):
                yield lineno, item
    elif head.startswith(b"{") and not head.split(b"\n", 1)[0].rstrip().endswith(b"}"):
        yield from src.json_objects()  # the console exporter: indented objects, one after another
    else:
        yield from src.json_lines()


def read(src: Source) -> Iterator[dict]:
    chain = SessionChain(src.stem)
    traces: OrderedDict = OrderedDict()  # trace id -> its own chain (the most recently active last)
    for lineno, rec in _records(src):
        for span in _spans(rec):
            try:
                call = from_span(span)
            except (ValueError, TypeError, AttributeError, RecursionError) as exc:
                src.skip(lineno, f"span {span.get('name')!r}: "
                                 f"{'nested too deeply' if isinstance(exc, RecursionError) else exc}")
                continue
            if call is None:
                continue  # not a GenAI model call (tool spans, HTTP spans ...)
            call["source"] = src.where(lineno)
            tid = trace_id(span)
            if call["fidelity"] == "lengths":  # no content to chain on: the conversation id, else the trace
                if src.session_key:
                    call["session"] = src.session_of(span)
                call["session"] = str(call["session"] or (f"{src.stem}-trace-{tid}" if tid else src.stem))
                yield call
                continue
            head = [{"role": "system", "content": call["system"]}] if call["system"] else []
            own = chain
            if tid:  # chained within its trace only: independent traces never share a session
                own = traces.get(tid)
                if own is None:
                    own = traces[tid] = SessionChain(f"{src.stem}-trace-{tid}")
                    if len(traces) > MAX_OPEN_TRACES:
                        traces.popitem(last=False)
                else:
                    traces.move_to_end(tid)
            if src.session_key:
                call["session"] = src.session_of(span)
            call["session"] = str(call["session"]) if call["session"] else own.session_of_messages(
                head + call["messages"], reply_message(call))
            yield call
