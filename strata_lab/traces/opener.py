"""`open_calls(path)`: any source of calls (a strata dump, a Parquet store, another tool's log) as one stream of
`CallRecord`s. The library's one dispatch on what a path holds; the CLI's commands use it too.

* a store directory (``day=*/replica=*`` partitions, `strata-lab convert`): read as it is (`Store`);
* strata-dump/1 files, or a directory of them: read as they are (`Dump`);
* any other log (OpenAI / Anthropic bodies, OTel, Claude Code, Codex, HAR, vLLM / SGLang / llama.cpp logs,
  ShareGPT, Mooncake / Bailian hash traces): imported (`Trace`) and rendered with `tokenizer` and `template`.

>>> import os, tempfile
>>> from strata_lab.dump.writer import Recorder
>>> path = os.path.join(tempfile.mkdtemp(), "d.jsonl")
>>> with Recorder(path) as rec:
...     rec.write_call(session="s", prompt_ids=[1, 2], reused=0, gen_ids=[3])
>>> calls = open_calls(path)
>>> calls.kind, [(r.session, r.prompt_ids, r.gen_ids) for r in calls]
('dump', [('s', [1, 2], [3])])
"""
from __future__ import annotations

import os
import warnings
from typing import Iterator

from strata_lab.dump import Dump, Store, is_store, load_dump
from strata_lab.dump.record import CallRecord

__all__ = ["open_calls", "open_source", "open_hash_trace", "CallSource"]

KINDS = ("store", "dump", "log")


class CallSource:
    """What `open_source` found: `kind` ("store", "dump" or "log") and the opened `source` (a `Store`, a
    `Dump` or a `Trace`). Iterating yields `CallRecord`s (a log's calls rendered with `tokenizer` and
    `template`)."""

    def __init__(self, kind: str, source, *, tokenizer="qwen3", template=None):
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        self.kind, self.source = kind, source
        self.tokenizer, self.template = tokenizer, template

    def records(self) -> Iterator[dict]:
        """The calls as strata-dump/1 line objects (dicts)."""
        if self.kind == "log":
            return self.source.dump_records(self.tokenizer, self.template)
        return iter(self.source)

    def __iter__(self) -> Iterator[CallRecord]:
        if self.kind == "log":
            return self.source.records(self.tokenizer, self.template)
        return (CallRecord.from_mapping(r) for r in self.records())

    def __repr__(self) -> str:
        return f"CallSource({self.kind!r}, {self.source!r})"


def open_source(path_or_paths, *, format: str | None = None, session_key: str | None = None,
                progress: bool = False, tokenizer="qwen3", template=None,
                messages_path: str | None = None) -> CallSource:
    """Find what `path_or_paths` holds (a store, strata dumps, or another tool's log) and open it; a `Store`,
    `Dump` or `Trace` object is taken as it is. A bad path or an undetectable format is a ValueError or
    FileNotFoundError naming it, before any work."""
    from strata_lab.traces.source import TraceWarning
    from strata_lab.traces.trace import Trace, load_trace

    src = path_or_paths
    kw = dict(tokenizer=tokenizer, template=template)
    if isinstance(src, Store):
        return CallSource("store", src, **kw)
    if isinstance(src, Dump):
        return CallSource("dump", src, **kw)
    if isinstance(src, Trace):
        return CallSource("log", src, **kw)
    if isinstance(src, (str, os.PathLike)):
        src = os.fspath(src)
        if is_store(src):
            return CallSource("store", load_dump(src), **kw)
    elif isinstance(src, (list, tuple)):
        src = [os.fspath(p) for p in src]
        if len(src) == 1:
            src = src[0]
    else:
        raise TypeError(f"path: a file, a directory, a list of files or a Store/Dump/Trace, got {type(src).__name__}")
    try:
        with warnings.catch_warnings():  # a dumps/ folder holds a README: only say so if it is not all dumps
            warnings.simplefilter("ignore", TraceWarning)
            trace = load_trace(src, format=format, progress=progress, session_key=session_key,
                               messages_path=messages_path)
    except ValueError:
        names = [src] if isinstance(src, str) else list(src)
        if format is not None or messages_path is not None or not all(str(n).endswith(".jsonl") for n in names):
            raise
        return CallSource("dump", load_dump(src), **kw)  # no format to detect (empty, no valid line): a dump
    if trace.formats == ["strata"]:
        return CallSource("dump", load_dump(src), **kw)
    return CallSource("log", trace, **kw)


def open_calls(path_or_paths, *, format: str | None = None, tokenizer="qwen3", template=None,
               session_key: str | None = None, progress: bool = False) -> CallSource:
    """Every call of a dump, a store or a log as `CallRecord`s (iterate the result; `.kind` says what was found,
    `.source` is the opened `Dump`, `Store` or `Trace`).

    Args:
        path_or_paths: a file, a list of files, a directory (of dumps, of logs, or a store), or a glob.
        format: a log reader's name (see `strata_lab.traces.READERS`); None detects each file's.
        tokenizer, template: what renders a log's calls to token ids (see `Trace.to_dump`).
        session_key: a dotted field naming each record's session in a log (see `load_trace`).
        progress: a progress bar while a log is read.
    """
    return open_source(path_or_paths, format=format, session_key=session_key, progress=progress,
                       tokenizer=tokenizer, template=template)


def open_hash_trace(path_or_paths, format: str | None = None, *, progress: bool = False):
    """The production hash trace (Mooncake / Bailian) `path_or_paths` names, loaded as columns
    (`strata_lab.traces.hashtrace.HashTrace`, the fast path of `sweep`, `export` and engine replays), or
    None when it is not one hash-trace file (or `format` names another reader)."""
    from strata_lab.traces.hashtrace import is_hash_trace, load_hash_trace

    paths = [path_or_paths] if isinstance(path_or_paths, (str, os.PathLike)) else list(path_or_paths)
    if len(paths) != 1 or format not in (None, "mooncake", "bailian") or not is_hash_trace(paths[0]):
        return None
    return load_hash_trace(paths[0], format, progress=progress)
