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
from strata_lab.traces.source import Source, loads

__all__ = ["READERS", "detect_format", "TEXT_FORMATS"]

READERS = {m.NAME: m for m in (strata, openai, openai_batch, anthropic, proxy, otel, claude_code, codex, har,
                               vllm_log, sglang_log, llamacpp_log, sharegpt, mooncake, bailian,
                               swe_agent, mini_swe_agent, aider,
                               openhands, openhands_eval, langsmith, openai_responses,
                               gemini_cli, cline, managed_agents)}
# JSON-lines formats, most specific first (an Anthropic body also has "messages"; a proxy line has a request)
_JSON_ORDER = (bailian, mooncake, strata, gemini_cli, managed_agents, openhands_eval, langsmith, openai_responses, proxy, claude_code, codex,
               otel, openai_batch, sharegpt, anthropic, openai)
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
                return mod.NAME, f"first record's keys ({', '.join(list(first)[:6])})"
    if stripped.startswith(b"{"):  # one object over many lines (OTel's console exporter indents its spans)
        import json

        try:
            first, _ = json.JSONDecoder().raw_decode(src.head(1 << 22).decode("utf-8", "replace").lstrip())
        except ValueError:
            first = None
        if isinstance(first, dict) and otel.detect(first):
            return otel.NAME, "indented JSON span objects (console exporter)"
    raise ValueError(f"format: cannot tell the format of {src.path}; pass format= one of {', '.join(READERS)}")

def _first_item(src: Source):
    """The first item of a file that is one JSON array (read from its first 4 MiB), or None."""
    import json

    text = src.head(1 << 22).decode("utf-8", "replace").lstrip()[1:].lstrip()  # after the "["
    try:
        return json.JSONDecoder().raw_decode(text)[0]
    except ValueError:
        return None
