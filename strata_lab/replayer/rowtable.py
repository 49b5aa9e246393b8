"""A replay's per-call rows, kept column-wise: what lets a replay of millions of calls stay small.

A `CallRow` is a Python object graph (~1 KB a call with its strings and boxed numbers). `RowTable` takes
rows one at a time and, every `chunk` rows, packs them into one Arrow record batch (numbers 8 bytes each,
strings in one buffer, the cause dictionary-coded) kept zstd-compressed, ~50-100 bytes a call. It reads
like a list of CallRows (len, index, slice, iterate: rows are rebuilt on access, a chunk at a time) and gives
its columns to the report's totals, `to_frame()` and the worst calls without rebuilding every row.

>>> from strata_lab.replayer.step import CallRow
>>> def row(i):
...     return CallRow(session="s", turn=i, request_id=None, call=0, ts=None, prompt_len=10 + i,
...                    held_before=i, lcp_ids=i, lcp_text=i, reused=i, recorded_reused=None, read=10,
...                    reread=0, cause="none", checkpoint_gap=0, snapshots=1, snapshot_mib=0.5, gen_len=3,
...                    drained_len=0, prefill_ms=1.0, prefill_s=0.1, reread_s=0.0)
>>> t = RowTable(chunk=2)
>>> for i in range(5):
...     t.append(row(i))
>>> len(t), t[3].prompt_len, [r.turn for r in t[1:4]], t.column("reused")
(5, 13, [1, 2, 3], [0, 1, 2, 3, 4])
>>> t[-1] == row(4)
True
"""
from __future__ import annotations

import bisect
import operator
from collections.abc import Sequence
from typing import Iterable, Iterator

from strata_lab.replayer.step import COLUMNS, CallRow

__all__ = ["RowTable"]

_TUPLE_COLUMNS = frozenset(c for c, d in CallRow.DTYPES.items() if d == "object")
_CAUSE = COLUMNS.index("cause")
_ROW_VALUES = operator.attrgetter(*COLUMNS)


def _arrow_types() -> dict:
    import pyarrow as pa

    kinds = {"string": pa.string(), "category": pa.string(), "int64": pa.int64(), "Int64": pa.int64(),
             "float64": pa.float64(), "object": pa.list_(pa.int64())}
    return {c: kinds[d] for c, d in CallRow.DTYPES.items()}


def _compress(batch):
    """A record batch as a zstd-compressed Arrow IPC stream (report rows compress ~5x: repeated sessions,
    causes, small counts)."""
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as w:
        w.write_batch(batch)
    return sink.getvalue()


def _decompress(buf):
    import pyarrow as pa

    return pa.ipc.open_stream(buf).read_next_batch()


class RowTable(Sequence):
    """CallRows in chunks of Arrow record batches (see the module docstring). Append-only."""

    def __init__(self, rows: Iterable[CallRow] = (), *, chunk: int = 4096):
        if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1:
            raise ValueError(f"chunk must be a positive int, got {chunk!r}")
        self.chunk = chunk
        self._batches: list = []          # zstd-compressed Arrow IPC streams, one record batch of `chunk` rows each
        self._ends: list[int] = []        # cumulative row count after each batch
        self._pending: list[CallRow] = []
        self._pending_batches: list = []  # record batches appended whole (append_batch), not packed yet
        self._pending_batch_rows = 0
        self.extend(rows)

    # --- writing ------------------------------------------------------------------------------------
    def append(self, row: CallRow) -> None:
        if self._pending_batches:
            self._pack()
        self._pending.append(row)
        if len(self._pending) >= self.chunk:
            self._pack()

    def extend(self, rows: Iterable[CallRow]) -> None:
        for r in rows:
            self.append(r)

    def append_batch(self, batch) -> None:
        """Append rows given column-wise: a record batch with CallRow's columns and types (`cause` plain
        strings). Batches are packed together into chunks of about `chunk` rows."""
        if tuple(batch.schema.names) != tuple(COLUMNS):
            raise ValueError(f"batch: columns must be CallRow's {COLUMNS}, got {batch.schema.names}")
        if self._pending:
            self._pack()
        if batch.num_rows:
            self._pending_batches.append(batch)
            self._pending_batch_rows += batch.num_rows
            if self._pending_batch_rows >= self.chunk:
                self._pack()

    def _pack(self) -> None:
        import pyarrow as pa

        if self._pending_batches:
            t = pa.Table.from_batches(self._pending_batches).combine_chunks()
            cause = t.column(_CAUSE).combine_chunks()
            t = t.set_column(_CAUSE, COLUMNS[_CAUSE], cause.dictionary_encode())
            batch = t.to_batches()[0] if t.num_rows else None
            n = self._pending_batch_rows
            self._pending_batches, self._pending_batch_rows = [], 0
            if batch is not None:
                assert batch.num_rows == n
                self._batches.append(_compress(batch))
                self._ends.append((self._ends[-1] if self._ends else 0) + n)
        rows = self._pending
        if not rows:
            return
        types = _arrow_types()
        columns = zip(*map(_ROW_VALUES, rows))  # one C-level attrgetter call a row, then columns
        arrays = [pa.array(col, type=types[c]) for c, col in zip(COLUMNS, columns)]
        arrays[_CAUSE] = arrays[_CAUSE].dictionary_encode()  # a handful of distinct causes: 1-byte codes
        self._batches.append(_compress(pa.RecordBatch.from_arrays(arrays, names=COLUMNS)))
        self._ends.append((self._ends[-1] if self._ends else 0) + len(rows))
        self._pending = []

    @classmethod
    def from_batches(cls, batches: Iterable, *, chunk: int = 4096) -> "RowTable":
        """A table over record batches with CallRow's columns (as `batches()` gives them)."""
        t = cls(chunk=chunk)
        for b in batches:
            if b.num_rows:
                t._batches.append(_compress(b))
                t._ends.append((t._ends[-1] if t._ends else 0) + b.num_rows)
        return t

    # --- reading ------------------------------------------------------------------------------------
    def batches(self) -> list:
        """Every row as Arrow record batches (packs the rows not packed yet)."""
        self._pack()
        return [_decompress(b) for b in self._batches]

    def table(self):
        """All rows as one pyarrow.Table with CallRow's columns."""
        import pyarrow as pa

        batches = self.batches()
        if not batches:
            types = _arrow_types()
            return pa.table({c: pa.array([], type=types[c]) for c in COLUMNS})
        return pa.Table.from_batches(batches)

    def column(self, name: str) -> list:
        """One column's values in row order (a list of Python values)."""
        if name not in CallRow.DTYPES:
            raise KeyError(name)
        self._pack()
        out: list = []
        for b in self._batches:
            out.extend(_decompress(b).column(name).to_pylist())
        if name in _TUPLE_COLUMNS:
            out = [tuple(v) for v in out]
        return out

    def iter_batches(self) -> Iterator:
        """The rows as Arrow record batches, one chunk decompressed at a time (packs pending rows first)."""
        self._pack()
        for b in self._batches:
            yield _decompress(b)

    def iter_columns(self, names: Sequence[str]) -> Iterator[list[list]]:
        """The named columns a chunk at a time (lists of Python values, one list per name): totals over
        millions of rows without holding a whole column as Python objects."""
        for name in names:
            if name not in CallRow.DTYPES:
                raise KeyError(name)
        self._pack()
        for b in self._batches:
            b = _decompress(b)
            cols = [b.column(name).to_pylist() for name in names]
            yield [[tuple(v) for v in c] if name in _TUPLE_COLUMNS else c for name, c in zip(names, cols)]

    def __len__(self) -> int:
        return (self._ends[-1] if self._ends else 0) + len(self._pending) + self._pending_batch_rows

    @staticmethod
    def _rows_of(batch) -> list[CallRow]:
        cols = []
        for name, col in zip(COLUMNS, batch.columns):
            vals = col.to_pylist()
            cols.append([tuple(v) for v in vals] if name in _TUPLE_COLUMNS else vals)
        return [CallRow(*vals) for vals in zip(*cols)]

    def __iter__(self) -> Iterator[CallRow]:
        if self._pending_batches:
            self._pack()
        for b in list(self._batches):
            yield from self._rows_of(_decompress(b))
        yield from list(self._pending)

    def __getitem__(self, i):
        n = len(self)
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(n))]
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("RowTable index out of range")
        if self._pending_batches:
            self._pack()
        packed = self._ends[-1] if self._ends else 0
        if i >= packed:
            return self._pending[i - packed]
        k = bisect.bisect_right(self._ends, i)
        start = self._ends[k - 1] if k else 0
        return self._rows_of(_decompress(self._batches[k]).slice(i - start, 1))[0]

    def __repr__(self) -> str:
        return f"RowTable({len(self)} rows in {len(self._batches)} packed chunks)"
