"""Reading "strata-dump/1" files: stream records, or get a typed pandas frame with one row per call.

A line that is not a valid record (a torn last line after a crash, garbage, a foreign schema, a field
outside docs/DUMP_FORMAT.md: a negative or non-integer id, `reused` past the prompt, an unknown `finish`)
is skipped with a `DumpWarning` naming the file and line; unknown fields are kept as they are.
Files are read line by line, so a dump never has to fit in memory unless you ask for a frame.

>>> import os, tempfile
>>> from strata_lab.dump.writer import Recorder
>>> path = os.path.join(tempfile.mkdtemp(), "d.jsonl")
>>> with Recorder(path) as rec:
...     rec.write_call(session="s", prompt_ids=[1, 2], reused=0, gen_ids=[3], finish="stop", note="hi")
>>> d = load_dump(path)
>>> [(r["session"], r["prompt_ids"], r["note"]) for r in d]
[('s', [1, 2], 'hi')]
>>> d.to_frame()[["session", "prompt_len", "reused", "gen_len"]].values.tolist()
[['s', 2, 0, 1]]
"""
from __future__ import annotations

import math
import os
import warnings
from typing import TYPE_CHECKING, Iterable, Iterator

from strata_lab.dump.writer import FINISH_REASONS  # one list of finish reasons: the writer's

if TYPE_CHECKING:  # for the annotation only: load_dump imports the store module when it opens one
    from strata_lab.dump.store import Store

__all__ = ["Dump", "load_dump", "DumpWarning", "parse_line", "check_record"]

SCHEMA_PREFIX = "strata-dump/"
_MAX_WARNINGS_PER_FILE = 20

try:  # orjson parses id arrays several times faster than json; fall back only if it is missing
    from orjson import loads as _loads, JSONDecodeError as _DecodeError
except ImportError:  # pragma: no cover - orjson is a core dependency
    from json import loads as _loads, JSONDecodeError as _DecodeError


# Contract 4's fields and the older names a line may still carry them under
_REPORTED = (("reported_cached_tokens", "cached_tokens"), ("reported_cache_write_tokens", "reported_cache_creation_tokens"))

class DumpWarning(UserWarning):
    """A dump line was skipped."""


_DEFAULTS = (("gen_ids", list), ("drained_ids", list), ("checkpoints", list), ("timings", dict))


_ID_LIMIT = 2**31  # ids are int32 in the engine; a vocabulary, when given, is the tighter bound
_ID_LISTS = ("prompt_ids", "gen_ids", "drained_ids", "checkpoints")


def _check_ids(rec: dict, name: str, vocab_size: int | None) -> None:
    ids = rec[name]
    if not ids:
        return
    # every element, not just the ends: a float or a string inside would otherwise reach the replay
    if set(map(type, ids)) != {int}:
        bad = next(i for i, v in enumerate(ids) if type(v) is not int)
        raise ValueError(f"{name}[{bad}] must be an int, got {ids[bad]!r}")
    low, high = min(ids), max(ids)
    limit = _ID_LIMIT if vocab_size is None or name == "checkpoints" else vocab_size
    if low < 0 or high >= limit:
        bad = next(i for i, v in enumerate(ids) if not 0 <= v < limit)
        what = "a position" if name == "checkpoints" else "an id"
        raise ValueError(f"{name}[{bad}] = {ids[bad]} is not {what} in 0..{limit - 1}")


def parse_line(line: bytes | str, vocab_size: int | None = None) -> dict:
    """Parse one dump line into a record, or raise ValueError saying what is wrong.

    Every field is checked against docs/DUMP_FORMAT.md: id lists hold ints in 0..vocab_size-1 (0..2**31-1
    with no vocabulary), `reused` is an int in 0..len(prompt_ids), `finish` one of the documented
    reasons, `call` an int >= 0. Missing optional fields get defaults (empty id lists, session "default",
    call 0); unknown fields stay.

    >>> parse_line(b'{"prompt_ids": [1, 2], "x": 1}')["gen_ids"]
    []
    >>> parse_line(b'{"prompt_ids": "oops"}')
    Traceback (most recent call last):
    ...
    ValueError: prompt_ids must be a list of ints
    >>> parse_line(b'{"prompt_ids": [1, 2.5]}')
    Traceback (most recent call last):
    ...
    ValueError: prompt_ids[1] must be an int, got 2.5
    >>> parse_line(b'{"prompt_ids": [1, 2], "reused": 3}')
    Traceback (most recent call last):
    ...
    ValueError: reused must be an int in 0..2 (the prompt's length), got 3
    """
    try:
        rec = _loads(line)
    except _DecodeError as exc:
        raise ValueError(f"not valid JSON ({exc})") from None
    return check_record(rec, vocab_size)


def check_record(rec, vocab_size: int | None = None) -> dict:
    """Validate a parsed dump line and give it the defaults (in place); ValueError says what is wrong."""
    if not isinstance(rec, dict):
        raise ValueError(f"not a JSON object ({type(rec).__name__})")
    schema = rec.get("schema")
    if schema is not None and not (isinstance(schema, str) and schema.startswith(SCHEMA_PREFIX)):
        raise ValueError(f"schema {schema!r} is not {SCHEMA_PREFIX}N")
    if not isinstance(rec.get("prompt_ids"), list):
        raise ValueError("prompt_ids must be a list of ints")
    if not rec["prompt_ids"]:
        raise ValueError("prompt_ids must not be empty (every engine call reads a prompt)")
    ts = rec.get("ts")
    if ts is not None and (type(ts) not in (int, float) or not math.isfinite(ts) or ts < 0):
        raise ValueError(f"ts must be a finite number of seconds >= 0, got {ts!r}")
    for name in ("request_id", "replica", "model"):
        v = rec.get(name)
        if v is not None and not isinstance(v, str):
            raise ValueError(f"{name} must be a string, got {type(v).__name__}")
    session = rec.get("session")
    if session is not None and (isinstance(session, bool) or not isinstance(session, (str, int))):
        raise ValueError(f"session must be a string, got {type(session).__name__}")
    for name, kind in _DEFAULTS:
        v = rec.get(name)
        if v is None:
            rec[name] = kind()
        elif not isinstance(v, kind):
            raise ValueError(f"{name} must be a {kind.__name__}, got {type(v).__name__}")
    from strata_lab.limits import check_length

    for name in ("prompt_ids", "gen_ids", "drained_ids"):
        check_length(len(rec[name]), "call_tokens", f"{name}: a list of")
    # placeholder ids (`synthetic_ids`: a hash trace's blocks, a lengths-only call) belong to no vocabulary
    vocab = None if rec.get("synthetic_ids") is True else vocab_size
    for name in _ID_LISTS:
        _check_ids(rec, name, vocab)
    reused = rec.get("reused")
    n = len(rec["prompt_ids"])
    if reused is not None and (type(reused) is not int or not 0 <= reused <= n):
        raise ValueError(f"reused must be an int in 0..{n} (the prompt's length), got {reused!r}")
    finish = rec.get("finish")
    if finish is not None and finish not in FINISH_REASONS:
        raise ValueError(f"finish must be one of {', '.join(FINISH_REASONS)}, got {finish!r}")
    call = rec.setdefault("call", 0)
    if type(call) is not int or call < 0:
        raise ValueError(f"call must be an int >= 0, got {call!r}")
    rec.setdefault("session", "default")
    return rec


# one dump line (a 1M-token prompt is ~8 MB): longer is a bad line, never read whole (strata_lab.limits)
MAX_LINE_BYTES = __import__("strata_lab.limits").limits.limit("line_bytes")
_COMPRESSED = {".zst": "zstd", ".bz2": "bzip2", ".xz": "xz", ".lz4": "lz4", ".zip": "zip"}


def check_dump_path(path: str) -> None:
    """A dump path must be a regular file (a FIFO would hang the reader), plain JSONL or gzip (`.gz`)."""
    import stat

    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"dump file not found: {path}") from None
    except OSError as exc:
        raise ValueError(f"{path}: cannot read it ({exc.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{path}: not a regular file")
    for ext, name in _COMPRESSED.items():
        if path.endswith(ext):
            raise ValueError(f"{path}: {name}-compressed dumps are not read; decompress it first (gzip .gz is read)")


def open_dump(path: str):
    """A dump file opened for reading bytes: `.gz` through gzip, anything else as it is."""
    from strata_lab.limits import open_input

    check_dump_path(path)
    return open_input(path)   # gzip inflated as it is read, within the trace_bytes limit


def dump_lines(f) -> Iterator[bytes]:
    """The lines of an open dump; a line over MAX_LINE_BYTES is given as b"\0" (a bad line), never held whole."""
    while True:
        line = f.readline(MAX_LINE_BYTES)
        if not line:
            return
        if len(line) >= MAX_LINE_BYTES and not line.endswith(b"\n"):
            while True:  # skip the rest of the over-long line
                rest = f.readline(MAX_LINE_BYTES)
                if not rest or rest.endswith(b"\n"):
                    break
            yield b"\0"
            continue
        yield line


def _iter_file(path: str, vocab_size: int | None = None) -> Iterator[dict]:
    import zlib

    skipped = 0
    lineno = 0
    with open_dump(path) as f:
        lines = enumerate(dump_lines(f), 1)
        while True:
            try:
                lineno, line = next(lines)
            except StopIteration:
                break
            except (OSError, EOFError, zlib.error) as exc:  # a corrupt or truncated .gz (gzip.BadGzipFile too)
                raise ValueError(f"{path}: cannot be read past line {lineno}: {exc}") from None
            if not line.strip():
                continue
            try:
                yield parse_line(line, vocab_size)
            except ValueError as exc:
                skipped += 1
                torn = not line.endswith(b"\n")
                if skipped <= _MAX_WARNINGS_PER_FILE:
                    what = "torn last line" if torn else "bad line"
                    warnings.warn(f"{path}:{lineno}: skipped {what}: {exc}", DumpWarning, stacklevel=3)
    if skipped > _MAX_WARNINGS_PER_FILE:
        warnings.warn(f"{path}: skipped {skipped} bad lines in all", DumpWarning, stacklevel=3)


class Dump:
    """Records from one or more dump files, in file order. Iterating streams; nothing is cached.

    Lines of one session must be in call order (the recorder writes them so); with several files,
    pass them in time order.
    """

    def __init__(self, paths: Iterable[str | os.PathLike], *, vocab_size: int | None = None):
        self.paths = [os.fspath(p) for p in paths]
        if vocab_size is not None and (type(vocab_size) is not int or vocab_size < 1):
            raise ValueError(f"vocab_size must be a positive int or None, got {vocab_size!r}")
        self.vocab_size = vocab_size  # ids at or past it make a line bad (None: only the int32 bound)
        if not self.paths:
            raise ValueError("paths must name at least one dump file")
        for p in self.paths:
            check_dump_path(p)  # regular files only; compressed ones other than .gz refused by name

    def __iter__(self) -> Iterator[dict]:
        for p in self.paths:
            yield from _iter_file(p, self.vocab_size)

    def records(self) -> list[dict]:
        """All records as a list (reads the files)."""
        return list(self)

    def sessions(self) -> dict[str, list[dict]]:
        """Records grouped by session, sessions in order of first appearance."""
        out: dict[str, list[dict]] = {}
        for rec in self:
            out.setdefault(str(rec["session"]), []).append(rec)
        return out

    @property
    def nbytes(self) -> int:
        return sum(os.path.getsize(p) for p in self.paths)

    def to_frame(self):
        """A pandas DataFrame, one row per engine call, with typed columns.

        Scalar columns: ts (float64), request_id, session (string), call, prompt_len, gen_len,
        drained_len, n_checkpoints (int64), reused (Int64, nullable), finish (category), prefill_ms,
        decode_ms (float64), encoder_kept_ids (Int64), model (string), reported_cached_tokens and
        reported_cache_write_tokens (Int64: what the serving engine reported, Contract 4; an older line's
        `cached_tokens` / `reported_cache_creation_tokens` fill them). The id lists stay as object
        columns (prompt_ids, gen_ids, drained_ids, checkpoints); unknown fields follow as object columns.
        """
        import pandas as pd

        known = {"schema", "ts", "request_id", "session", "call", "prompt_ids", "reused", "gen_ids",
                 "drained_ids", "finish", "timings", "checkpoints", "encoder", "model", "reported_cached_tokens",
                 "reported_cache_write_tokens"}
        cols: dict[str, list] = {k: [] for k in (
            "file", "ts", "request_id", "session", "call", "prompt_len", "reused", "gen_len", "drained_len",
            "finish", "prefill_ms", "decode_ms", "n_checkpoints", "encoder_kept_ids", "model",
            "reported_cached_tokens", "reported_cache_write_tokens", "prompt_ids", "gen_ids", "drained_ids", "checkpoints")}
        extra: dict[str, list] = {}
        n = 0
        for p in self.paths:
            for rec in _iter_file(p, self.vocab_size):
                t = rec["timings"]
                enc = rec.get("encoder")
                cols["file"].append(p)
                cols["ts"].append(rec.get("ts"))
                cols["request_id"].append(rec.get("request_id"))
                cols["session"].append(str(rec["session"]))
                cols["call"].append(rec["call"])
                cols["prompt_len"].append(len(rec["prompt_ids"]))
                cols["reused"].append(rec.get("reused"))
                cols["gen_len"].append(len(rec["gen_ids"]))
                cols["drained_len"].append(len(rec["drained_ids"]))
                cols["finish"].append(rec.get("finish"))
                cols["prefill_ms"].append(t.get("prefill_ms"))
                cols["decode_ms"].append(t.get("decode_ms"))
                cols["n_checkpoints"].append(len(rec["checkpoints"]))
                cols["encoder_kept_ids"].append(enc.get("kept_ids") if isinstance(enc, dict) else None)
                cols["model"].append(rec.get("model"))
                for k, old in _REPORTED:
                    v = rec.get(k, rec.get(old))
                    cols[k].append(v if type(v) is int else None)
                for k in ("prompt_ids", "gen_ids", "drained_ids", "checkpoints"):
                    cols[k].append(rec[k])
                for k, v in rec.items():
                    if k not in known:
                        extra.setdefault(k, [None] * n).append(v)
                n += 1
                for k, lst in extra.items():  # fields a record lacks stay None
                    if len(lst) < n:
                        lst.append(None)
        df = pd.DataFrame({
            "file": pd.Series(cols["file"], dtype="string"),
            "ts": pd.Series(cols["ts"], dtype="float64"),
            "request_id": pd.Series(cols["request_id"], dtype="string"),
            "session": pd.Series(cols["session"], dtype="string"),
            "call": pd.Series(cols["call"], dtype="int64"),
            "prompt_len": pd.Series(cols["prompt_len"], dtype="int64"),
            "reused": pd.Series(cols["reused"], dtype="Int64"),
            "gen_len": pd.Series(cols["gen_len"], dtype="int64"),
            "drained_len": pd.Series(cols["drained_len"], dtype="int64"),
            "finish": pd.Series(cols["finish"], dtype="category"),
            "prefill_ms": pd.Series(cols["prefill_ms"], dtype="float64"),
            "decode_ms": pd.Series(cols["decode_ms"], dtype="float64"),
            "n_checkpoints": pd.Series(cols["n_checkpoints"], dtype="int64"),
            "encoder_kept_ids": pd.Series(cols["encoder_kept_ids"], dtype="Int64"),
            "model": pd.Series(cols["model"], dtype="string"),
            **{k: pd.Series(cols[k], dtype="Int64") for k, _ in _REPORTED},
            **{k: pd.Series(cols[k], dtype="object") for k in ("prompt_ids", "gen_ids", "drained_ids", "checkpoints")},
            **{k: pd.Series(v, dtype="object") for k, v in extra.items()},
        })
        return df

    def __repr__(self) -> str:
        return f"Dump({self.paths!r})"


def load_dump(path_or_paths, *, vocab_size: int | None = None) -> Dump | Store:
    """Open one dump file, several, a directory of `*.jsonl` files (sorted by name), or a Parquet store
    (a directory with ``day=*/replica=*`` partitions; returns a `strata_lab.dump.Store`).

    Args:
        path_or_paths: a dump file, a list of them, a directory of `*.jsonl` files, or a store directory.
        vocab_size: makes a line whose ids reach past the vocabulary a bad line (skipped with a warning);
            a store with such ids is refused when opened (StoreError naming file, row and field).

    >>> load_dump("/nonexistent.jsonl")
    Traceback (most recent call last):
    ...
    FileNotFoundError: dump file not found: /nonexistent.jsonl
    """
    if isinstance(path_or_paths, Dump):
        return path_or_paths
    from strata_lab.dump.store import Store

    if isinstance(path_or_paths, Store):
        return path_or_paths
    if isinstance(path_or_paths, (str, os.PathLike)):
        p = os.fspath(path_or_paths)
        if os.path.isdir(p) and any(n.startswith("day=") for n in os.listdir(p)):
            from strata_lab.dump.store import Store  # a Parquet store (strata-lab convert, StoreRecorder)

            return Store(p, vocab_size=vocab_size)
        if os.path.isdir(p):
            names = sorted(n for n in os.listdir(p) if n.endswith((".jsonl", ".jsonl.gz")))
            if not names:
                raise FileNotFoundError(f"no *.jsonl or *.jsonl.gz dump files in {p}")
            return Dump((os.path.join(p, n) for n in names), vocab_size=vocab_size)
        return Dump([p], vocab_size=vocab_size)
    return Dump(path_or_paths, vocab_size=vocab_size)
