"""Model calls from spans written under two attribute conventions besides OTel's GenAI one (the `otel` reader
picks the span, this module reads it): the Vercel AI SDK's ``ai.*`` attributes and OpenInference's ``llm.*``
ones. Both give a call dict as `strata_lab.traces.otel.from_span` does (session and source are set there).

>>> span = {"name": "ai.generateText.doGenerate", "attributes": {
...     "ai.prompt.messages": '[{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]',
...     "ai.response.text": "Hello", "ai.usage.promptTokens": 9}}
>>> call = from_ai_sdk(span, span["attributes"])
>>> call["messages"], call["response_text"], call["prompt_tokens"]
([{'role': 'user', 'content': 'Hi'}], 'Hello', 9)
"""
from __future__ import annotations

import json

from strata_lab.traces.claude_code import parse_ts
from strata_lab.traces.log_calls import image_placeholder, new_call, text_parts, tool_call
from strata_lab.traces.openai import convert_messages as openai_messages

__all__ = ["from_ai_sdk", "from_openinference", "ai_sdk_messages", "openinference_messages"]

_FILE_PARTS = ("image", "file", "image_url", "audio", "video")


def _json(value):
    """A JSON-text attribute parsed (None where it is not JSON); other values as they are."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return None
        except RecursionError:  # a value nested past the parser's stack: the span is skipped, named
            raise ValueError("a JSON attribute is nested too deeply") from None
    return value


def _int(value):
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def _first(attrs: dict, *keys):
    for k in keys:
        v = _int(attrs.get(k))
        if v is not None:
            return v
    return None


def _dumps(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _tool_output(part: dict) -> str:
    """A tool-result part's content: AI SDK 5+ ``output`` ({type: text|json|error-text|error-json|content, value}),
    or 4.x ``result`` (any JSON)."""
    out = part.get("output", part.get("result"))
    if isinstance(out, dict) and "type" in out and "value" in out:
        value = out["value"]
        if out["type"] == "content" and isinstance(value, list):
            return "".join(str(v.get("text", "")) for v in value if isinstance(v, dict) and v.get("type") == "text")
        return _dumps(value)
    return _dumps(out)


def ai_sdk_messages(messages, notes: list) -> list[dict]:
    """The AI SDK's prompt messages (``LanguageModelV1/V2Prompt``, ``ModelMessage``) in the internal shape."""
    if not isinstance(messages, list):
        raise ValueError("ai.prompt.messages: not a list of messages")
    out: list = []
    for m in messages:
        if not isinstance(m, dict):
            raise ValueError(f"ai.prompt.messages: a message must be an object, got {type(m).__name__}")
        role, content = m.get("role"), m.get("content")
        if isinstance(content, str) or content is None:
            out.append({"role": role if role in ("system", "user", "assistant") else "user",
                        "content": content or ""})
            continue
        text, reasoning, calls = [], [], []
        for p in content if isinstance(content, list) else [content]:
            kind = p.get("type") if isinstance(p, dict) else None
            if kind == "text":
                text.append(str(p.get("text", "")))
            elif kind in ("reasoning", "redacted-reasoning"):
                reasoning.append(str(p.get("text", "")))
            elif kind == "tool-call":
                calls.append(tool_call(p.get("toolCallId"), p.get("toolName"),
                                       p.get("input", p.get("args"))))
            elif kind == "tool-result":
                out.append({"role": "tool", "tool_call_id": str(p.get("toolCallId") or "call"),
                            "content": _tool_output(p)})
            elif kind in _FILE_PARTS:
                text.append(image_placeholder(notes)["text"])
        if role == "tool":
            continue  # its results were emitted above, one message each
        msg = {"role": role if role in ("system", "user", "assistant") else "user", "content": "".join(text)}
        if msg["role"] == "assistant":
            if reasoning:
                msg["reasoning_content"] = "".join(reasoning)
            if calls:
                msg["tool_calls"] = calls
        out.append(msg)
    return out


def _ai_prompt(value, notes: list) -> list[dict]:
    """``ai.prompt`` (the outer call's arguments: ``{system, prompt, messages}``) as messages."""
    obj = _json(value)
    if not isinstance(obj, dict):
        raise ValueError("ai.prompt: not a JSON object")
    out = [{"role": "system", "content": obj["system"]}] if isinstance(obj.get("system"), str) else []
    if isinstance(obj.get("messages"), list):
        out += ai_sdk_messages(obj["messages"], notes)
    if isinstance(obj.get("prompt"), str):
        out.append({"role": "user", "content": obj["prompt"]})
    elif isinstance(obj.get("prompt"), list):
        out += ai_sdk_messages(obj["prompt"], notes)
    return out


def from_ai_sdk(span: dict, attrs: dict) -> dict:
    """One call from an AI SDK model-call span (``ai.generateText.doGenerate`` and its kin)."""

    notes: list = []
    if "ai.prompt.messages" in attrs:
        raw = _json(attrs["ai.prompt.messages"])
        if raw is None:
            raise ValueError("ai.prompt.messages: not JSON")
        messages = ai_sdk_messages(raw, notes)
    elif "ai.prompt" in attrs:
        messages = _ai_prompt(attrs["ai.prompt"], notes)
    else:
        messages = []  # recordInputs: false
    calls = []
    for c in _json(attrs.get("ai.response.toolCalls")) or ():
        if isinstance(c, dict):
            args = c.get("input", c.get("args"))
            parsed = _json(args)  # JSON text here, an object in the next step's prompt: one shape for both
            calls.append(tool_call(c.get("toolCallId"), c.get("toolName"),
                                   parsed if isinstance(parsed, dict) else args))
    text = attrs.get("ai.response.text", attrs.get("ai.result.text"))
    prompt = _first(attrs, "gen_ai.usage.input_tokens", "ai.usage.inputTokens", "ai.usage.promptTokens")
    read = _first(attrs, "ai.usage.inputTokenDetails.cacheReadTokens", "ai.usage.cachedInputTokens")
    write = _first(attrs, "ai.usage.inputTokenDetails.cacheWriteTokens")
    provider = str(attrs.get("ai.model.provider") or attrs.get("gen_ai.system") or "")
    if prompt is not None and "ai.usage.inputTokenDetails.cacheReadTokens" not in attrs and \
            provider.startswith("anthropic"):
        # AI SDK 5 passes Anthropic's input_tokens through: the tokens after the last cache breakpoint only
        meta = _json(attrs.get("ai.response.providerMetadata"))
        meta = meta.get("anthropic") if isinstance(meta, dict) else None
        if write is None and isinstance(meta, dict):
            write = _int(meta.get("cacheCreationInputTokens"))
        prompt += (read or 0) + (write or 0)
        notes.append("Anthropic input tokens plus the cache read and write buckets (AI SDK 5 reports them apart)")
    elif prompt is not None and read is not None and read > prompt:
        prompt += read + (write or 0)
        notes.append("input tokens reported without the cached ones: added")
    finish = attrs.get("ai.response.finishReason", attrs.get("ai.finishReason"))
    call = new_call(format="otel", fidelity="messages", notes=notes, messages=messages,
                    model=attrs.get("ai.response.model") or attrs.get("gen_ai.response.model")
                    or attrs.get("ai.model.id") or attrs.get("gen_ai.request.model"),
                    request_id=attrs.get("ai.response.id") or attrs.get("gen_ai.response.id") or span_id(span),
                    response_text=text if isinstance(text, str) else None,
                    response_reasoning=attrs.get("ai.response.reasoning") if isinstance(
                        attrs.get("ai.response.reasoning"), str) else None,
                    response_tool_calls=calls or None, prompt_tokens=prompt,
                    completion_tokens=_first(attrs, "gen_ai.usage.output_tokens", "ai.usage.outputTokens",
                                             "ai.usage.completionTokens"),
                    cached_tokens=read, cache_read_tokens=read, cache_creation_tokens=write,
                    finish=finish if isinstance(finish, str) else None)
    call["session"] = attrs.get("ai.telemetry.metadata.sessionId") or attrs.get("gen_ai.conversation.id")
    return _finish(call, span, "ai.prompt.messages")


def _items(d: dict, key: str) -> list[dict]:
    """The list at `key`: nested (Phoenix's export: a list of objects) or flattened (``key.N.rest`` keys)."""
    got = d.get(key)
    if isinstance(got, list):
        return [x for x in got if isinstance(x, dict)]
    out: dict[int, dict] = {}
    head = key + "."
    for k, v in d.items():
        if isinstance(k, str) and k.startswith(head):
            idx, _, rest = k[len(head):].partition(".")
            if idx.isdigit() and rest:
                out.setdefault(int(idx), {})[rest] = v
    return [out[i] for i in sorted(out)]


def openinference_messages(items: list[dict], notes: list) -> list[dict]:
    """OpenInference ``message.*`` objects (``llm.input_messages`` / ``llm.output_messages``) as OpenAI ones."""
    wire = []
    for m in items:
        role = m.get("message.role") or "user"
        content = m.get("message.content")
        text, reasoning = [], []
        for part in _items(m, "message.contents"):
            kind = part.get("message_content.type")
            if kind == "text":
                text.append(str(part.get("message_content.text") or ""))
            elif kind == "reasoning":
                reasoning.append(str(part.get("message_content.text") or ""))
            elif kind in _FILE_PARTS:
                text.append(image_placeholder(notes)["text"])
        msg: dict = {"role": role, "content": content if isinstance(content, str) else "".join(text)}
        if reasoning and role == "assistant":
            msg["reasoning_content"] = "".join(reasoning)
        calls = [{"id": tc.get("tool_call.id"), "type": "function",
                  "function": {"name": tc.get("tool_call.function.name"),
                               "arguments": tc.get("tool_call.function.arguments") or "{}"}}
                 for tc in _items(m, "message.tool_calls")]
        if calls:
            msg["tool_calls"] = calls
        if m.get("message.tool_call_id") is not None:
            msg["tool_call_id"] = m["message.tool_call_id"]
        elif role == "tool" and m.get("message.name"):
            msg["name"] = m["message.name"]
        wire.append(msg)
    return openai_messages(wire, notes)


def from_openinference(span: dict, attrs: dict) -> dict:
    """One call from an OpenInference LLM span."""

    notes: list = []
    messages = openinference_messages(_items(attrs, "llm.input_messages"), notes)
    output = openinference_messages(_items(attrs, "llm.output_messages"), notes)
    reply = next((m for m in output if m.get("role") == "assistant"), None) or {}
    tools = []
    for t in _items(attrs, "llm.tools"):
        schema = _json(t.get("tool.json_schema"))
        if isinstance(schema, dict):
            tools.append(schema if "function" in schema else {"type": "function", "function": schema})
    content = reply.get("content")
    read = _first(attrs, "llm.token_count.prompt_details.cache_read")
    write = _first(attrs, "llm.token_count.prompt_details.cache_write")
    prompt = _first(attrs, "llm.token_count.prompt")
    if prompt is not None and read is not None and read > prompt:
        prompt += read + (write or 0)
        notes.append("input tokens reported without the cached ones: added")
    call = new_call(format="otel", fidelity="messages", notes=notes, messages=messages, tools=tools or None,
                    model=attrs.get("llm.response.model_name") or attrs.get("llm.model_name")
                    or attrs.get("llm.request.model_name"),
                    request_id=span_id(span),
                    response_text=content if isinstance(content, str) else text_parts_text(content),
                    response_reasoning=reply.get("reasoning_content"),
                    response_tool_calls=reply.get("tool_calls"), prompt_tokens=prompt,
                    completion_tokens=_first(attrs, "llm.token_count.completion"),
                    cached_tokens=read, cache_read_tokens=read, cache_creation_tokens=write,
                    finish=attrs.get("llm.finish_reason") if isinstance(attrs.get("llm.finish_reason"), str)
                    else None)
    call["session"] = attrs.get("session.id")
    return _finish(call, span, "llm.input_messages")


def _finish(call: dict, span: dict, where: str) -> dict:

    call["ts"] = span_ts(span)
    if not call["messages"]:
        if not isinstance(call["prompt_tokens"], int):
            raise ValueError(f"span has neither {where} nor a prompt token count")
        call.update(fidelity="lengths", messages=None, prompt_len=call["prompt_tokens"])
        call["notes"].append("no message content captured: lengths and usage only")
    return call


def span_id(span: dict):
    for key in ("spanContext", "_spanContext", "context"):
        ctx = span.get(key)
        if isinstance(ctx, dict) and (ctx.get("spanId") or ctx.get("span_id")):
            return ctx.get("spanId") or ctx.get("span_id")
    return span.get("spanId") or span.get("span_id") or span.get("id")


def span_ts(span: dict) -> float | None:
    """Start time in seconds: OTLP nanoseconds, Python's ISO string, the JS exporter's microseconds
    (``timestamp``) or the JS span object's ``startTime`` ([seconds, nanoseconds])."""
    start = span.get("startTimeUnixNano") or span.get("start_time")
    if start is not None:
        return int(start) / 1e9 if isinstance(start, (int, str)) and str(start).isdigit() else parse_ts(start)
    hr = span.get("startTime")
    if isinstance(hr, list) and len(hr) == 2 and all(isinstance(x, (int, float)) for x in hr):
        return hr[0] + hr[1] / 1e9
    micros = span.get("timestamp")
    if isinstance(micros, (int, float)) and not isinstance(micros, bool):
        return micros / 1e6
    return parse_ts(micros)


def text_parts_text(content) -> str | None:
    if content is None:
        return None
    return "".join(p.get("text", "") for p in text_parts(content, []) or ())
