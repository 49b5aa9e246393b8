"""The readers, by format name, and format detection from a file's first bytes and first records.

>>> sorted(READERS)[:4]
['anthropic', 'bailian', 'claude-code', 'codex']
"""
from __future__ import annotations

from strata_lab.traces import (anthropic, bailian, claude_code, codex, har, llamacpp_log, mooncake, openai, otel,
                               sglang_log, sharegpt, strata, vllm_log)
from strata_lab.traces.source import Source, loads

__all__ = ["READERS", "detect_format"]

READERS = {m.NAME: m for m in (strata, openai, anthropic, otel, claude_code, codex, har, vllm_log, sglang_log,
                               llamacpp_log, sharegpt, mooncake, bailian)}
# JSON-lines formats, most specific first (an Anthropic body also has "messages")
_JSON_ORDER = (bailian, mooncake, strata, claude_code, codex, otel, sharegpt, anthropic, openai)
_TEXT_ORDER = (vllm_log, sglang_log, llamacpp_log)


def detect_format(src: Source) -> tuple[str, str]:
    """(format name, why) for one file; ValueError naming the file when nothing matches."""
    head = src.head()
    stripped = head.lstrip()
    if src.path.endswith(".har") or (stripped.startswith(b"{") and har.detect_head(head)):
        return har.NAME, "a HAR document (log.entries)"
    for mod in _TEXT_ORDER:  # text logs may hold JSON lines too; their markers decide first
        if mod.detect_head(head):
            return mod.NAME, "server log markers in the first 64 KiB"
    if stripped.startswith(b"["):
        if b'"conversations"' in head:
            return sharegpt.NAME, "a JSON array of conversations"
        if b"gen_ai." in head:
            return otel.NAME, "a JSON array of spans with gen_ai attributes"
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
    raise ValueError(f"format: cannot tell the format of {src.path}; pass format= one of {', '.join(READERS)}")
