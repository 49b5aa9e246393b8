"""The one internal message shape every API dialect is converted into, and its validation.

OpenAI's shape: ``{"role", "content", "tool_calls", "tool_call_id", "reasoning_content"}``; content is a string
or a list of text parts. Every error names the message index and the field, so the server can answer 400.

>>> validate_messages([{"role": "assistant", "content": None, "reasoning": "r"}])
[{'role': 'assistant', 'reasoning': 'r', 'reasoning_content': 'r'}]
>>> validate_messages([{"role": "tool", "content": "x"}])
Traceback (most recent call last):
...
strata_lab.text.messages.TemplateInputError: messages[0].tool_call_id: must be a non-empty string
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Sequence

__all__ = ["TemplateInputError", "validate_messages", "validate_tools", "content_text",
           "structured_output_instruction", "with_instruction"]

ROLES = ("system", "user", "assistant", "tool")

class TemplateInputError(ValueError):
    """Bad input to `render`: names the message index and field, e.g. ``messages[2].tool_calls[0].id``."""

    def __init__(self, field: str, message: str, index: int | None = None):
        self.field = field
        self.index = index
        where = f"messages[{index}].{field}" if index is not None else field
        super().__init__(f"{where}: {message}")


# Validation returns fresh copies; the caller's messages are never edited.

def _check_text_content(content: Any, field: str, index: int | None) -> None:
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise TemplateInputError(field, f"must be a string or a list of text parts, got {type(content).__name__}",
                                 index)
    for j, part in enumerate(content):
        if not isinstance(part, Mapping):
            raise TemplateInputError(f"{field}[{j}]", "must be an object {'type': 'text', 'text': ...}", index)
        if part.get("type") != "text":
            raise TemplateInputError(f"{field}[{j}].type", f"only 'text' parts are supported, got "
                                     f"{part.get('type')!r}", index)
        if not isinstance(part.get("text"), str):
            raise TemplateInputError(f"{field}[{j}].text", "must be a string", index)


def content_text(content: Any) -> str:
    """The text of a message content: a string, or text parts joined without a separator (as our template does).

    >>> content_text([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}])
    'ab'
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part["text"] for part in content if part.get("type") == "text")


def _check_tool_calls(tool_calls: Any, index: int) -> list[dict]:
    if not isinstance(tool_calls, list):
        raise TemplateInputError("tool_calls", "must be a list", index)
    out = []
    for j, call in enumerate(tool_calls):
        field = f"tool_calls[{j}]"
        if not isinstance(call, Mapping):
            raise TemplateInputError(field, "must be an object {'id', 'type': 'function', 'function': {...}}",
                                     index)
        call = {k: v for k, v in call.items() if v is not None}
        if call.get("type", "function") != "function":
            raise TemplateInputError(f"{field}.type", f"must be 'function', got {call.get('type')!r}", index)
        if "id" in call and not isinstance(call["id"], str):
            raise TemplateInputError(f"{field}.id", "must be a string", index)
        fn = call.get("function")
        if not isinstance(fn, Mapping):
            raise TemplateInputError(f"{field}.function", "must be an object {'name', 'arguments'}", index)
        if not isinstance(fn.get("name"), str) or not fn.get("name"):
            raise TemplateInputError(f"{field}.function.name", "must be a non-empty string", index)
        args = fn.get("arguments")
        if not isinstance(args, (str, Mapping)):
            raise TemplateInputError(f"{field}.function.arguments",
                                     "must be a JSON string or an object", index)
        out.append({**call, "function": dict(fn)})
    return out


def validate_messages(messages: Any) -> list[dict]:
    """Check messages and return normalized copies (None values dropped, `reasoning` copied to
    `reasoning_content`; it stays too, as transformers passes it, for the templates that read vLLM's name)."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise TemplateInputError("messages", "must be a list of message objects")
    if not messages:
        raise TemplateInputError("messages", "must not be empty")
    out: list[dict] = []
    call_ids: set[str] = set()  # ids of the most recent assistant tool calls, for tool_call_id checks
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise TemplateInputError("role", f"message must be an object with 'role' and 'content', got "
                                     f"{type(message).__name__}", i)
        # None means absent (OpenAI sends content=None beside tool_calls); templates handle absent keys.
        m = {k: v for k, v in message.items() if v is not None}
        role = m.get("role")
        if role not in ROLES:
            raise TemplateInputError("role", f"must be one of {', '.join(ROLES)}; got {role!r}", i)
        if "content" in m:
            _check_text_content(m["content"], "content", i)
        elif role != "assistant":
            raise TemplateInputError("content", f"is required for a {role} message", i)
        if "name" in m and not isinstance(m["name"], str):
            raise TemplateInputError("name", "must be a string", i)
        for key in ("reasoning_content", "reasoning"):
            if key in m and role != "assistant":
                raise TemplateInputError(key, "is only allowed on assistant messages", i)
            if key in m and not isinstance(m[key], str):
                raise TemplateInputError(key, "must be a string", i)
        if "reasoning" in m:  # one internal name: reasoning_content
            reasoning = m["reasoning"]
            if m.setdefault("reasoning_content", reasoning) != reasoning:
                raise TemplateInputError("reasoning", "differs from reasoning_content; send one of them", i)
        if "tool_calls" in m:
            if role != "assistant":
                raise TemplateInputError("tool_calls", "is only allowed on assistant messages", i)
            m["tool_calls"] = _check_tool_calls(m["tool_calls"], i)
            if not m["tool_calls"]:
                del m["tool_calls"]
        if role == "assistant":
            call_ids = {c["id"] for c in m.get("tool_calls", ()) if "id" in c}
        if role == "tool":
            call_id = m.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                raise TemplateInputError("tool_call_id", "must be a non-empty string", i)
            if call_ids and call_id not in call_ids:
                raise TemplateInputError("tool_call_id", f"{call_id!r} does not match a tool call of the "
                                         f"preceding assistant message ({', '.join(sorted(call_ids))})", i)
        elif "tool_call_id" in m:
            raise TemplateInputError("tool_call_id", "is only allowed on tool messages", i)
        out.append(m)
    return out


def validate_tools(tools: Any) -> list[dict] | None:
    """Check OpenAI tool definitions ``[{"type": "function", "function": {"name", ...}}]``; return copies."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise TemplateInputError("tools", "must be a list of {'type': 'function', 'function': {...}}")
    for j, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            raise TemplateInputError(f"tools[{j}]", "must be an object")
        if tool.get("type") != "function":
            raise TemplateInputError(f"tools[{j}].type", f"must be 'function', got {tool.get('type')!r}")
        fn = tool.get("function")
        if not isinstance(fn, Mapping):
            raise TemplateInputError(f"tools[{j}].function", "must be an object {'name', 'description', "
                                     "'parameters'}")
        if not isinstance(fn.get("name"), str) or not fn.get("name"):
            raise TemplateInputError(f"tools[{j}].function.name", "must be a non-empty string")
        if "description" in fn and fn["description"] is not None and not isinstance(fn["description"], str):
            raise TemplateInputError(f"tools[{j}].function.description", "must be a string")
        if "parameters" in fn and fn["parameters"] is not None and not isinstance(fn["parameters"], Mapping):
            raise TemplateInputError(f"tools[{j}].function.parameters", "must be a JSON schema object")
    return [dict(tool) for tool in tools]


def structured_output_instruction(response_format: Any) -> str | None:
    """The system-prompt instruction for an OpenAI ``response_format`` (None for plain text).

    >>> structured_output_instruction({"type": "json_object"})
    'Respond with a single valid JSON object and nothing else.'
    >>> structured_output_instruction(None) is None
    True
    """
    if response_format is None:
        return None
    if not isinstance(response_format, Mapping):
        raise TemplateInputError("response_format", "must be an object with a 'type'")
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return "Respond with a single valid JSON object and nothing else."
    if kind != "json_schema":
        raise TemplateInputError("response_format.type",
                                 f"must be 'text', 'json_object' or 'json_schema', got {kind!r}")
    spec = response_format.get("json_schema")
    if not isinstance(spec, Mapping):
        raise TemplateInputError("response_format.json_schema", "must be an object {'name', 'schema'}")
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise TemplateInputError("response_format.json_schema.name", "must be a non-empty string")
    schema = spec.get("schema")
    if not isinstance(schema, Mapping):
        raise TemplateInputError("response_format.json_schema.schema", "must be a JSON schema object")
    return (f"Respond with a single JSON object that conforms to the JSON schema {name!r} below, "
            f"and nothing else.\n<schema>\n{json.dumps(schema, ensure_ascii=False)}\n</schema>")


def with_instruction(messages: list[dict], instruction: str) -> list[dict]:
    """Append `instruction` to the leading system message, or add one."""
    # Append to the leading system message (or add one), so it sits before every assistant turn and stays
    # put from turn to turn.
    if messages[0]["role"] == "system":
        first = dict(messages[0])
        content = first.get("content", "")
        if isinstance(content, list):
            first["content"] = content + [{"type": "text", "text": "\n\n" + instruction}]
        else:
            first["content"] = (content + "\n\n" if content else "") + instruction
        return [first] + messages[1:]
    return [{"role": "system", "content": instruction}] + messages
