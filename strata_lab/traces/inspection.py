"""`strata-lab import --inspect FILE`: what a file holds before anything is imported (its shape, its records'
keys, the message lists the generic reader would find, usage-like fields, and the reader detection picks).
It sits above the registry (it asks detection), beside the generic reader whose walk it reuses."""
from __future__ import annotations

from typing import Any

from strata_lab.traces.generic import MAX_DEPTH, MAX_FIRST, _records, _usage, find_lists, layout
from strata_lab.traces.registry import detect_format
from strata_lab.traces.source import Source

__all__ = ["inspect_file"]


def _leaf_paths(rec: Any, path: str = "", depth: int = 0, out: list | None = None) -> list[str]:
    """Paths of the number fields whose names speak of tokens or usage (``usage.prompt_tokens``)."""
    out = [] if out is None else out
    if depth > MAX_DEPTH or len(out) > 40:
        return out
    if isinstance(rec, dict):
        for k, v in rec.items():
            sub = f"{path}.{k}" if path else str(k)
            if isinstance(v, (dict, list)):
                _leaf_paths(v, sub, depth + 1, out)
            elif isinstance(v, (int, float)) and not isinstance(v, bool) and any(
                    w in str(k).lower() for w in ("token", "cache", "usage")):
                out.append(sub)
    elif isinstance(rec, list) and rec:
        _leaf_paths(rec[0], f"{path}[*]", depth + 1, out)
    return out


def inspect_file(path: str) -> list[str]:
    """What `strata-lab import --inspect` prints: the file's shape, its records' top-level keys, the message
    lists found (path, dialect, how many records hold them), usage-like fields, and the reader detection picks
    and why (or why none does). Reads at most the first `MAX_FIRST` records; imports nothing."""
    import warnings
    from collections import Counter


    src = Source(path)
    head = src.head(4096).lstrip()
    records: list = []
    shape = "text (not JSON)"
    if head.startswith((b"{", b"[")):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for n, (_, rec) in enumerate(_records(src)):
                    records.append(rec)
                    if n + 1 >= MAX_FIRST:
                        break
            first_line = head.split(b"\n", 1)[0].strip()
            shape = ("a JSON array" if head.startswith(b"[") else "one JSON document (an object over many lines)"
                     if len(records) == 1 and first_line in (b"{", b"{}") or not first_line.endswith(b"}")
                     else "JSON lines")
        except ValueError as exc:
            shape = f"not readable as JSON ({exc})"
    out = [f"{path}: {src.size} bytes, {shape}" + (f"; {len(records)} records looked at" if records else "")]
    dicts = [r for r in records if isinstance(r, dict)]
    if dicts:
        keys = Counter(k for r in dicts for k in r)
        out.append("  record keys: " + ", ".join(f"{k} ({n})" for k, n in keys.most_common(15))
                   + (" ..." if len(keys) > 15 else ""))
    lists: dict = {}
    for r in records:
        for p, kind, count in find_lists(r):
            got = lists.setdefault((p, kind), [0, 0])
            got[0] += 1
            got[1] += count
    if lists:
        for (p, kind), (recs, msgs) in sorted(lists.items(), key=lambda kv: -kv[1][1]):
            out.append(f"  message list: {layout(src)}{p} ({kind}): in {recs} of {len(records)} records, "
                       f"{msgs} messages")
    elif records:
        out.append("  message list: none found (OpenAI, Anthropic or Gemini shaped)")
    usage = sorted({p for r in records for p in _leaf_paths(r)})
    if usage:
        out.append("  usage-like fields: " + ", ".join(usage[:12]) + (" ..." if len(usage) > 12 else ""))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            name, why = detect_format(src)
        out.append(f"  reader: {name} ({why})")
    except ValueError as exc:
        out.append(f"  reader: none; {str(exc).split(': ', 1)[-1].split('. Pass --format')[0]}")
    return out
