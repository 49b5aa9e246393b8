"""A recorder that writes a Parquet store directly (the JSONL `Recorder`'s API, row groups on disk).

`record_to("calls/")` or `STRATA_PROMPT_DUMP=calls/` (a path ending in "/" or an existing directory)
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
from __future__ import annotations

import os
import threading
from collections.abc import Mapping

from strata_lab.dump.writer import Recorder
from strata_lab.store.writer import StoreWriter

__all__ = ["StoreRecorder"]


class StoreRecorder(Recorder):
    """`Recorder` (same `write_call` validation) whose lines go to a store's row groups."""

    def __init__(self, root: str | os.PathLike, *, row_group_rows: int = 256):
        self.path = os.fspath(root)
        if not self.path:
            raise ValueError("path must be a non-empty directory name")
        self._lock = threading.Lock()
        self._writer: StoreWriter | None = StoreWriter(self.path, row_group_rows=row_group_rows)
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
