"""The Gemini message dialect, converted once for every Gemini-shaped reader: ``contents`` (``{"role": "user" |
"model", "parts": [...]}``) with text, ``functionCall``, ``functionResponse``, thought (``"thought": true``) and
``inlineData`` / ``fileData`` parts, plus ``systemInstruction``, ``tools[].functionDeclarations`` and
``usageMetadata``, into the OpenAI-shaped messages the renderer takes.

>>> notes = []
>>> msgs = convert_contents([
...     {"role": "user", "parts": [{"text": "Weather?"}, {"inlineData": {"mimeType": "image/png", "data": "..."}}]},
...     {"role": "model", "parts": [{"text": "plan", "thought": True},
...                                 {"functionCall": {"id": "c1", "name": "get", "args": {"city": "Oslo"}}}]},
...     {"role": "user", "parts": [{"functionResponse": {"id": "c1", "name": "get", "response": {"output": "4C"}}}]},
...     {"role": "model", "parts": [{"text": "4C in Oslo."}]}], notes)
>>> [m["role"] for m in msgs], msgs[1]["reasoning_content"], msgs[1]["tool_calls"][0]["function"]["arguments"]
(['user', 'assistant', 'tool', 'assistant'], 'plan', {'city': 'Oslo'})
>>> msgs[2]["tool_call_id"], msgs[2]["content"], notes
('c1', '{"output": "4C"}', ['image placeholder'])
>>> system_text({"parts": [{"text": "Be brief."}, {"text": "Use tools."}]})
'Be brief.\\nUse tools.'
"""
from __future__ import annotations

import json
from typing import Any

from strata_lab.traces.log_calls import image_placeholder, tool_call

__all__ = ["parts_of", "system_text", "convert_contents", "convert_tools", "apply_usage", "response_json"]

_MEDIA = ("inlineData", "inline_data", "fileData", "file_data")


def parts_of(content: Any) -> list[dict]:
    """A Gemini ``PartListUnion`` as a list of part objects: a string is one text part, a part alone a list of
    one, string items text parts; other values are not parts (left out)."""
    if content is None:
        return []
    if isinstance(content, str):
        return [{"text": content}] if content else []
    if isinstance(content, dict):  # a Content ({"role", "parts"}) or one Part
        return parts_of(content["parts"]) if isinstance(content.get("parts"), list) else [content]
    if isinstance(content, list):
        return [{"text": p} if isinstance(p, str) else p for p in content if isinstance(p, (str, dict))]
    return []


def system_text(instruction: Any) -> str | None:
    """``systemInstruction`` (a string, a part list or a content with parts) as one text; None when empty."""
    texts = [p["text"] for p in parts_of(instruction) if isinstance(p.get("text"), str)]
    return "\n".join(texts) or None


def response_json(response: Any) -> str:
    """A ``functionResponse.response`` as the tool message's text: the JSON object the model was given."""
    return response if isinstance(response, str) else json.dumps(response, ensure_ascii=False)


def convert_contents(contents: list, notes: list) -> list[dict]:
    """Gemini ``contents`` into OpenAI-shaped messages: user text (and media as ``[image]``), model text,
    thought parts as ``reasoning_content``, ``functionCall`` as tool calls and ``functionResponse`` as tool
    messages (before the user's own text in the same turn). Role ``function`` (the older API's role for tool
    results) reads as ``user``; any other role is a ValueError naming ``contents[i].role``."""
    out: list[dict] = []
    for i, c in enumerate(contents):
        if not isinstance(c, dict):
            raise ValueError(f"contents[{i}]: not an object")
        role = c.get("role") or "user"
        if role not in ("user", "model", "function"):
            raise ValueError(f"contents[{i}].role: must be user or model, not {role!r}")
        parts, calls, reasoning, results = [], [], [], []
        for p in parts_of(c.get("parts")):
            if isinstance(p.get("text"), str):
                if p.get("thought"):
                    reasoning.append(p["text"])
                else:
                    parts.append({"type": "text", "text": p["text"]})
            elif isinstance(p.get("functionCall"), dict):
                fc = p["functionCall"]
                calls.append(tool_call(fc.get("id") or fc.get("name"), fc.get("name"), fc.get("args")))
            elif isinstance(p.get("functionResponse"), dict):
                fr = p["functionResponse"]
                results.append({"role": "tool", "tool_call_id": str(fr.get("id") or fr.get("name") or "call"),
                                "content": response_json(fr.get("response"))})
            elif any(k in p for k in _MEDIA):
                parts.append(image_placeholder(notes))
            elif "executableCode" in p or "codeExecutionResult" in p:
                body = p.get("executableCode") or p.get("codeExecutionResult") or {}
                parts.append({"type": "text", "text": str(body.get("code") or body.get("output") or "")})
        content = parts[0]["text"] if len(parts) == 1 else parts
        if role == "model":
            msg: dict = {"role": "assistant", "content": content or ""}
            if reasoning:
                msg["reasoning_content"] = "".join(reasoning)
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
        else:
            out.extend(results)
            if parts or not results:
                out.append({"role": "user", "content": content if parts else ""})
    return out


def convert_tools(tools: Any) -> list[dict] | None:
    """``tools[].functionDeclarations`` as OpenAI function tools (built-in tools such as ``googleSearch`` have
    no declaration to render and are left out)."""
    out = []
    for t in tools or ():
        for d in (t.get("functionDeclarations") or t.get("function_declarations") or ()) if isinstance(t, dict) else ():
            if isinstance(d, dict) and d.get("name"):
                fn = {"name": d["name"]}
                if "description" in d:
                    fn["description"] = d["description"]
                fn["parameters"] = d.get("parameters") or d.get("parametersJsonSchema") or {"type": "object",
                                                                                            "properties": {}}
                out.append({"type": "function", "function": fn})
    return out or None


def apply_usage(call: dict, usage: Any) -> None:
    """``usageMetadata``: ``promptTokenCount`` is the whole prompt, cached content included
    (``cachedContentTokenCount``, the cache read); ``candidatesTokenCount`` the reply (thoughts apart)."""
    if not isinstance(usage, dict):
        return
    prompt = usage.get("promptTokenCount")
    cached = usage.get("cachedContentTokenCount")
    if isinstance(prompt, int):
        call["prompt_tokens"] = prompt
    if isinstance(cached, int):
        call["cached_tokens"] = call["cache_read_tokens"] = cached
    if isinstance(usage.get("candidatesTokenCount"), int):
        call["completion_tokens"] = usage["candidatesTokenCount"]
