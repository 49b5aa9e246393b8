"""The readers, by format name, and format detection from a file's first bytes and first records.

>>> sorted(READERS)[:4]
['aider', 'anthropic', 'bailian', 'claude-code']
"""
from __future__ import annotations

from strata_lab.traces import (anthropic, bailian, claude_code, codex, har, llamacpp_log, mooncake, openai,
                               openai_batch, otel, proxy,
                               sglang_log, sharegpt, strata, vllm_log)
from strata_lab.traces import aider, mini_swe_agent, swe_agent
from strata_lab.traces import langsmith, openai_responses, openhands, openhands_eval
from strata_lab.traces import cline, gemini_cli, managed_agents
from strata_lab.traces import generic
from strata_lab.traces.source import Source, loads

__all__ = ["READERS", "detect_format", "TEXT_FORMATS"]

READERS = {m.NAME: m for m in (strata, openai, openai_batch, anthropic, proxy, otel, claude_code, codex, har,
                               vllm_log, sglang_log, llamacpp_log, sharegpt, mooncake, bailian,
                               swe_agent, mini_swe_agent, aider,
                               openhands, openhands_eval, langsmith, openai_responses,
                               gemini_cli, cline, managed_agents, generic)}
# JSON-lines formats, most specific first (an Anthropic body also has "messages"; a proxy line has a request)
_JSON_ORDER = (bailian, mooncake, strata, gemini_cli, managed_agents, openhands_eval, langsmith, openai_responses, proxy, claude_code, codex,
               otel, openai_batch, sharegpt, anthropic, openai, generic)  # generic: any message list, last
_TEXT_ORDER = (vllm_log, sglang_log, llamacpp_log)
TEXT_FORMATS = tuple(m.NAME for m in _TEXT_ORDER)  # no records, so no --session-key


def detect_format(src: Source) -> tuple[str, str]:
    """(format name, why) for one file; ValueError naming the file when nothing matches."""
    head = src.head()
    stripped = head.lstrip()
    # agent trajectories, told by how the file starts (first: their messages may quote any log's markers)
    if swe_agent.detect_head(head):
        return swe_agent.NAME, "a SWE-agent trajectory object (trajectory / history / attempts)"
    if mini_swe_agent.detect_source(src, head):
        return mini_swe_agent.NAME, "a mini-swe-agent trajectory object (info, messages, trajectory_format)"
    if aider.detect_head(head):
        return aider.NAME, "aider's LLM history (TO LLM / LLM RESPONSE sections)"
    if gemini_cli.detect_head(head):
        return gemini_cli.NAME, "a Gemini CLI ConversationRecord (sessionId, projectHash, messages)"
    if cline.detect_head(src.path, head):
        return cline.NAME, "a Cline / Roo Code task file (api_conversation_history.json / ui_messages.json)"
    if src.path.endswith(".har") or (stripped.startswith(b"{") and har.detect_head(head)):
        return har.NAME, "a HAR document (log.entries)"
    for mod in _TEXT_ORDER:  # text logs may hold JSON lines too; their markers decide first
        if mod.detect_head(head):
            return mod.NAME, "server log markers in the first 64 KiB"
    if stripped.startswith(b"["):
        first = _first_item(src)
        if openhands.detect_event(first):
            return openhands.NAME, "a JSON array of OpenHands events (source, action / observation)"
        if isinstance(first, dict) and langsmith.detect(first):
            return langsmith.NAME, "a JSON array of LangSmith runs (run_type, inputs)"
        if b'"conversations"' in head:
            return sharegpt.NAME, "a JSON array of conversations"
        if b"gen_ai." in head:
            return otel.NAME, "a JSON array of spans with gen_ai attributes"
        if b'"messages"' in head and b'"role"' in head:
            return sharegpt.NAME, "a JSON array of conversations (messages / role / content)"
        if isinstance(first, dict) and generic.detect(first):
            return generic.NAME, _generic_why(first, "[*].")
    for line in head.split(b"\n")[:50]:
        line = line.strip()
        if not line.startswith(b"{"):
            continue
        try:
            first = loads(line)
        except ValueError:
            continue
        if not isinstance(first, dict):
            continue
        for mod in _JSON_ORDER:
            if mod.detect(first):
                return mod.NAME, (f"first record's keys ({', '.join(list(first)[:6])})" if mod is not generic
                                  else _generic_why(first))
    if stripped.startswith(b"{"):  # one object over many lines (OTel's console exporter indents its spans)
        import json

        try:
            first, _ = json.JSONDecoder().raw_decode(src.head(1 << 22).decode("utf-8", "replace").lstrip())
        except ValueError:
            first = None
        if isinstance(first, dict) and otel.detect(first):
            return otel.NAME, "indented JSON span objects (console exporter)"
        if isinstance(first, dict) and generic.detect(first):
            return generic.NAME, _generic_why(first, "")
    raise ValueError(cannot_tell(src, head))


def _generic_why(first: dict, lead: str = "lines[*].") -> str:
    path, kind, _ = generic.find_lists(first)[0]
    return f"message lists at {lead}{path} ({kind}); no specific reader's keys"


# the keys that mark each JSON reader's records: which reader a file that none detects comes nearest to
_MARKS = {"openai": ("model", "messages", "request", "response", "choices", "body", "tools"),
          "anthropic": ("system", "messages", "max_tokens", "content", "stop_reason", "model"),
          "otel": ("resourceSpans", "spans", "attributes", "traceId", "spanId", "context", "name"),
          "claude-code": ("sessionId", "uuid", "parentUuid", "type", "message", "isSidechain"),
          "codex": ("type", "payload", "timestamp"), "sharegpt": ("conversations", "from", "value", "id"),
          "openai-batch": ("custom_id", "response", "error", "id"), "proxy": ("request", "response", "url"),
          "har": ("log", "entries"), "mooncake": ("hash_ids", "input_length", "output_length", "timestamp"),
          "bailian": ("hash_ids", "parent_chat_id", "chat_id", "turn")}


def cannot_tell(src: Source, head: bytes) -> str:
    """The one-line error for a file no reader detects: what was seen (the first record's keys, or the first
    bytes), the nearest reader, and the options that go on."""
    import json

    first = None
    text = head.decode("utf-8", "replace").lstrip()
    for line in head.split(b"\n")[:50]:
        try:
            rec = loads(line.strip())
        except ValueError:
            continue
        if isinstance(rec, dict):
            first = rec
            break
    if first is None and text[:1] in "{[":
        try:
            doc = json.JSONDecoder().raw_decode(src.head(1 << 22).decode("utf-8", "replace").lstrip())[0]
        except (ValueError, RecursionError):
            doc = None
        first = doc[0] if isinstance(doc, list) and doc and isinstance(doc[0], dict) else doc
    if isinstance(first, dict):
        keys = list(first)
        seen = f"its first record's keys are {', '.join(keys[:8])}" + (" ..." if len(keys) > 8 else "")
        best = max(_MARKS, key=lambda n: len(set(keys) & set(_MARKS[n])))
        common = sorted(set(keys) & set(_MARKS[best]))
        near = f"the nearest reader is {best} (shares {', '.join(common)})" if common else \
            "no reader knows these keys"
    else:
        snippet = text[:40].split("\n")[0]
        seen = f"it starts {snippet!r}" if snippet else "it is empty"
        near = "text logs are read by " + ", ".join(TEXT_FORMATS) + " (server logs with request logging on)"
    return (f"format: cannot tell the format of {src.path}: {seen}; {near}. Pass --format NAME (one of "
            f"{', '.join(READERS)}), --messages-path PATH to read its message lists, or see what is in it with "
            f"`strata-lab import --inspect {src.path}`")


def _first_item(src: Source):
    """The first item of a file that is one JSON array (read from its first 4 MiB), or None."""
    import json

    text = src.head(1 << 22).decode("utf-8", "replace").lstrip()[1:].lstrip()  # after the "["
    try:
        return json.JSONDecoder().raw_decode(text)[0]
    except ValueError:
        return None
