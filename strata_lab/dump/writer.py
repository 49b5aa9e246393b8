"""The recorder: one "strata-dump/1" JSON line per engine call (Contract 2; docs/DUMP_FORMAT.md).

A recorder is an observer of engine calls (`recorder(call_record)` writes its line): attached to an engine
(`engine.add_observer(recorder)`), or to every engine of the process by `strata_lab.recording` (`record_to`,
`STRATA_PROMPT_DUMP`). Nothing records unless one is attached.

Each line is written with a single `os.write` on a descriptor opened with O_APPEND, under a lock, so
concurrent writers in one process never interleave and a crash leaves at most one torn last line
(readers skip it). Files are created with mode 0600: they hold the token ids of private conversations; an
existing file is opened without following a symbolic link, must be a regular file, and is narrowed to 0600.

It is also the one writer of whole dumps: `write_records` / `write_lines` (a new file, or appended) write
every dump the library makes (imported traces, `lint --fix`, `Store.to_jsonl`, exports) with these rules,
whole lines gathered into one `os.writev` per 64 lines. The file rules themselves are `strata_lab.dump.files`.

>>> import os, tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "calls.jsonl")
>>> with Recorder(path) as rec:
...     rec.write_call(session="s0", prompt_ids=[1, 2, 3], reused=0, gen_ids=[4], finish="stop")
>>> oct(os.stat(path).st_mode & 0o777)
'0o600'
"""
from __future__ import annotations

import errno
import os
import sys
import threading
import time
import uuid
from typing import Any, Mapping, Sequence

from strata_lab.dump.files import _open_dump, open_private, private_dir, write_private_file

__all__ = ["Recorder", "StoreRecorder", "open_recorder", "SCHEMA", "ENV_VAR", "FINISH_REASONS",
           "write_records", "write_lines", "open_private", "private_dir", "write_private_file"]

SCHEMA = "strata-dump/1"
ENV_VAR = "STRATA_PROMPT_DUMP"
FINISH_REASONS = ("stop", "length", "budget", "cancelled", "error")



def _dumps(obj) -> bytes:
    try:
        import orjson
    except ImportError:  # pragma: no cover - orjson is a core dependency
        import json

        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
    return orjson.dumps(obj)


def _ids(name: str, ids: Sequence[int]) -> list[int]:
    try:
        out = [int(i) for i in ids]
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a sequence of ints, got {type(ids).__name__}") from None
    if any(i < 0 for i in out):
        raise ValueError(f"{name} holds a negative id")
    return out


class Recorder:
    """Append-only writer of dump lines. Thread-safe; use as a context manager or call `close()`.

    >>> import tempfile, os
    >>> rec = Recorder(os.path.join(tempfile.mkdtemp(), "d.jsonl"))
    >>> rec.write_call(session="a", prompt_ids=[5, 6], reused=0, gen_ids=[7], finish="stop")
    >>> rec.lines
    1
    >>> rec.close()
    """

    def __init__(self, path: str | os.PathLike, *, on_error: str = "raise", truncate: bool = False):
        self.path = os.fspath(path)
        if not self.path:
            raise ValueError("path must be a non-empty file name")
        if on_error not in ("raise", "count"):
            raise ValueError(f"on_error must be 'raise' or 'count', got {on_error!r}")
        self.on_error = on_error  # "count": a failed write is counted in `lost` and logged, never raised
        # truncate=True: the file is emptied once opened (a new dump written whole), else appended to
        self._fd: int | None = _open_dump(self.path, truncate=truncate)
        self._lock = threading.Lock()
        self.lines = 0
        self.lost = 0              # lines a failed write lost (on_error="count")
        self._torn = False         # the last write stopped mid-line
        self.last_error: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *, on_error: str = "raise") -> "Recorder | None":
        """A recorder for `$STRATA_PROMPT_DUMP`, or None when it is unset or empty."""
        path = (os.environ if environ is None else environ).get(ENV_VAR, "")
        return cls(path, on_error=on_error) if path else None

    # --- writing ----------------------------------------------------------------------------------
    def write(self, record: Mapping[str, Any]) -> None:
        """Append one record (a dict or a `CallRecord`) as one line (flushed: a single unbuffered write)."""
        if not isinstance(record, Mapping):
            raise ValueError(f"record must be a mapping, got {type(record).__name__}")
        self._write_bytes(_dumps(_as_dict(record)) + b"\n", 1)

    def __call__(self, record) -> None:
        """The recorder as an engine observer (`Engine.add_observer`): one validated line per `CallRecord`."""
        from strata_lab.dump.record import CallRecord

        if not isinstance(record, CallRecord):
            raise TypeError(f"an observer gets a CallRecord, got {type(record).__name__}")
        kw = {k: getattr(record, k) for k in ("session", "prompt_ids", "reused", "gen_ids", "drained_ids", "finish",
                                             "prefill_ms", "decode_ms", "checkpoints", "request_id", "call", "ts",
                                             "model") if getattr(record, k) is not None}
        if record.reused is None:
            raise ValueError("an engine call's record must say how many prompt ids were reused (reused is None); "
                             "write other records with write()")
        self.write_call(**kw, **record.extra)

    def write_many(self, records) -> int:
        """Append records (dicts or `CallRecord`s), whole lines gathered into one `os.writev` per 64 lines
        (each system call holds only complete lines: a crash leaves at most one torn last line). Returns lines."""
        return self.write_lines(_dumps(_as_dict(r)) for r in records)

    def write_lines(self, lines) -> int:
        """Append already serialised lines (bytes without a newline) as `write_many` does. Returns lines.
        (A gathered write of whole lines, not a joined buffer: joining 1 MB batches measured 1.5-2x slower
        than a buffered file, writev of 64 lines as fast.)"""
        batch: list[bytes] = []
        n = 0
        for line in lines:
            if b"\n" in line:
                raise ValueError(f"dump {self.path}: a line to write holds a newline")
            batch.append(line + b"\n")
            if len(batch) == 64:
                self._write_bytes(batch, len(batch))
                n += len(batch)
                batch = []
        if batch:
            self._write_bytes(batch, len(batch))
            n += len(batch)
        return n

    def _write_bytes(self, line: bytes | list, nlines: int) -> None:
        """Write one line (bytes) or several whole lines (a list, gathered into one writev)."""
        with self._lock:
            if self._fd is None:
                raise ValueError(f"recorder for {self.path} is closed")
            parts = line if isinstance(line, list) else [line]
            if self._torn:  # the last write stopped mid-line: end that torn line so this one reads clean
                parts = [b"\n"] + parts
            try:
                n = os.writev(self._fd, parts) if len(parts) > 1 else os.write(self._fd, parts[0])
                total = sum(map(len, parts))
                self._torn = n < total
                if n < total:  # a regular file takes it all at once; finish the rest only for exotic targets
                    view = memoryview(b"".join(parts))[n:]
                    while view:
                        k = os.write(self._fd, view)
                        view = view[k:]
                        self._torn = bool(view)
            except OSError as exc:  # disk full, quota, file size limit: the caller's work is not lost
                if self.on_error == "raise":
                    raise
                before, self.lost = self.lost, self.lost + nlines
                self.last_error = f"{type(exc).__name__}: {exc.strerror or exc}"
                if before == 0 or before // 100 != self.lost // 100:  # a full disk must not flood the log either
                    print(f"strata-lab: dump {self.path}: lost {self.lost} line(s) so far ({self.last_error})",
                          file=sys.stderr, flush=True)
                return
            self.lines += nlines

    def check_writable(self, min_free_bytes: int = 1 << 20) -> None:
        """Raise OSError unless the dump's file system has room (`min_free_bytes`): a start-up check."""
        with self._lock:
            if self._fd is None:
                raise ValueError(f"recorder for {self.path} is closed")
            st = os.fstatvfs(self._fd)
        free = st.f_bavail * st.f_frsize
        if free < min_free_bytes:
            raise OSError(errno.ENOSPC, f"dump {self.path}: only {free} bytes free on its file system")

    def write_call(self, *, session: str, prompt_ids: Sequence[int], reused: int,
                   gen_ids: Sequence[int] = (), drained_ids: Sequence[int] = (), finish: str = "stop",
                   prefill_ms: float = 0.0, decode_ms: float = 0.0, checkpoints: Sequence[int] = (),
                   request_id: str | None = None, call: int = 0, ts: float | None = None,
                   encoder: Mapping | None = None, model: str | None = None, **extra: Any) -> None:
        """Validate and append one Contract 2 line for an engine call."""
        prompt = _ids("prompt_ids", prompt_ids)
        if not isinstance(reused, int) or not 0 <= reused <= len(prompt):
            raise ValueError(f"reused must be an int in 0..{len(prompt)}, got {reused!r}")
        if finish not in FINISH_REASONS:
            raise ValueError(f"finish must be one of {FINISH_REASONS}, got {finish!r}")
        if not isinstance(call, int) or call < 0:
            raise ValueError(f"call must be a non-negative int, got {call!r}")
        rec = {
            "schema": SCHEMA,
            "ts": time.time() if ts is None else float(ts),
            "request_id": request_id or uuid.uuid4().hex,
            "session": str(session),
            "call": call,
            "prompt_ids": prompt,
            "reused": reused,
            "gen_ids": _ids("gen_ids", gen_ids),
            "drained_ids": _ids("drained_ids", drained_ids),
            "finish": finish,
            "timings": {"prefill_ms": float(prefill_ms), "decode_ms": float(decode_ms)},
            "checkpoints": _ids("checkpoints", checkpoints),
        }
        if encoder is not None:
            rec["encoder"] = dict(encoder)
        if model is not None:
            rec["model"] = str(model)
        rec.update(extra)
        self.write(rec)

    # --- lifetime ---------------------------------------------------------------------------------
    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    @property
    def closed(self) -> bool:
        return self._fd is None

    def __enter__(self) -> "Recorder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        return f"Recorder({self.path!r}, lines={self.lines})"


def open_recorder(path: str | os.PathLike) -> Recorder:
    """A JSONL `Recorder`, or a Parquet `StoreRecorder` when `path` ends in "/" or is a directory."""
    p = os.fspath(path)
    if p.endswith(("/", os.sep)) or os.path.isdir(p):
        return StoreRecorder(p)
    return Recorder(p)
def _as_dict(record) -> dict:
    if type(record) is dict:
        return record  # serialised as it is (never changed)
    to_dict = getattr(record, "to_dict", None)  # a CallRecord: its dump line
    return to_dict() if callable(to_dict) else dict(record)



class StoreRecorder(Recorder):
    """`Recorder` (same `write_call` validation) whose lines go to a Parquet store's row groups.

    A recorder that writes a Parquet store directly (the JSONL `Recorder`'s API, row groups on disk).

    `strata_lab.record_to("calls/")` or `STRATA_PROMPT_DUMP=calls/` (a path ending in "/" or an existing directory)
    records this way. Calls are buffered per partition and written `row_group_rows` at a time, each row
    group as a whole file: a killed process loses at most the row groups it held open, and the next reader
    or writer says so (`StoreWarning`).

    >>> import tempfile
    >>> from strata_lab.dump import load_dump
    >>> d = tempfile.mkdtemp()
    >>> with StoreRecorder(d) as rec:
    ...     rec.write_call(session="s", prompt_ids=[1, 2], reused=0, gen_ids=[3], ts=1.7e9)
    >>> [r["prompt_ids"] for r in load_dump(d)]
    [[1, 2]]
    """

    def __init__(self, root: str | os.PathLike, *, row_group_rows: int = 256):
        self.path = os.fspath(root)
        if not self.path:
            raise ValueError("path must be a non-empty directory name")
        self._lock = threading.Lock()
        from strata_lab.dump.store_writer import StoreWriter

        self._writer = StoreWriter(self.path, row_group_rows=row_group_rows)
        self._fd = None
        self.lines = 0

    def write(self, record: Mapping) -> None:
        if not isinstance(record, Mapping):
            raise ValueError(f"record must be a mapping, got {type(record).__name__}")
        with self._lock:
            if self._writer is None:
                raise ValueError(f"recorder for {self.path} is closed")
            self._writer.write(dict(record))
            self.lines += 1

    def flush(self) -> None:
        """Write the open row groups now."""
        with self._lock:
            if self._writer is not None:
                self._writer.flush()

    def close(self) -> None:
        with self._lock:
            if self._writer is not None:
                self._writer.close()
                self._writer = None

    @property
    def closed(self) -> bool:
        return self._writer is None

    def __repr__(self) -> str:
        return f"StoreRecorder({self.path!r}, lines={self.lines})"


# --- the one writer behind every dump, store and trace file -------------------------------------------------
# Every path that writes call records (a dump, a store, a rendered trace, a fixed dump, an export) goes
# through these: files 0600 (an existing one narrowed), never through a symbolic link (O_NOFOLLOW), only a
# regular file; JSONL written one whole line per write; directories 0700.

def write_records(records, path: str | os.PathLike, *, append: bool = False) -> int:
    """Write records (dicts or `CallRecord`s) as strata-dump/1 lines to `path` (a new file's content unless
    `append`), through the `Recorder`'s safety rules; returns the number of lines."""
    with Recorder(path, truncate=not append) as rec:
        return rec.write_many(records)


def write_lines(lines, path: str | os.PathLike, *, append: bool = False) -> int:
    """Write serialised lines (bytes, no newline) to `path` as `write_records` does; returns their number."""
    with Recorder(path, truncate=not append) as rec:
        return rec.write_lines(lines)
