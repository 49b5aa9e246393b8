"""Reading a store: records in their original order, one partition (cache domain) at a time, or as lines.

`Store` reads like `strata_lab.dump.Dump` (iterate records, `records()`, `sessions()`), streaming a row
group at a time, so a store never has to fit in memory. `Store.lines()` gives back the original JSONL
lines, byte for byte.

>>> import tempfile
>>> from strata_lab.dump.store_writer import StoreWriter
>>> d = tempfile.mkdtemp()
>>> with StoreWriter(d) as w:
...     for p in ([1, 2], [1, 2, 3, 4]):
...         w.write({"ts": 1.0, "session": "s", "prompt_ids": p, "gen_ids": [3]})
>>> [r["prompt_ids"] for r in Store(d)]
[[1, 2], [1, 2, 3, 4]]
"""
from __future__ import annotations

import heapq
import os
from typing import Iterator

from strata_lab.dump.store_codec import RowDecoder, with_defaults
from strata_lab.dump.store_writer import check_open_markers, partitions, segment_files

__all__ = ["Store", "is_store"]


def is_store(path) -> bool:
    """Whether `path` is a store directory (holds ``day=*`` partitions)."""
    p = os.fspath(path)
    return os.path.isdir(p) and any(n.startswith("day=") for n in os.listdir(p))


def iter_partition_rows(partition: str, *, columns=None, batch_rows: int = 2048,
                        vocab_size: int | None = None) -> Iterator[dict]:
    """The rows of one partition, in order, a batch at a time (each row a dict of column values), after
    store_check.check_partition has checked its files and rows (StoreError naming file, row and field;
    with `vocab_size`, ids at or past it too)."""
    from strata_lab.dump.store_check import check_partition, open_segment

    for f in check_partition(partition, vocab_size=vocab_size):
        pf = open_segment(f)
        for batch in pf.iter_batches(batch_size=batch_rows, columns=columns):
            yield from batch.to_pylist()


def _int_or_none(v):
    return v if type(v) is int else None


class Store:
    """A Parquet trace store (see strata_lab.dump.store_writer for the layout).

    With `vocab_size` (or a `tokenizer`: its embedding rows, and the family of each model the rows name,
    as `Tokenizer.check_model`), every segment's ids are checked against the vocabulary when the store is
    opened, before any record is read (StoreError naming file, row and field), as `load_dump(...,
    vocab_size=)` does for JSONL dumps (which skips such lines with a warning: a store's rows are not
    skipped, the store is refused)."""

    def __init__(self, root: str | os.PathLike, *, vocab_size: int | None = None, tokenizer=None):
        if vocab_size is not None and (type(vocab_size) is not int or vocab_size < 1):
            raise ValueError(f"vocab_size must be a positive int or None, got {vocab_size!r}")
        if tokenizer is not None:
            rows = tokenizer.embedding_rows
            vocab_size = rows if vocab_size is None else min(vocab_size, rows)
        self.vocab_size = vocab_size
        self.root = os.fspath(root)
        if not os.path.isdir(self.root):
            raise FileNotFoundError(f"store not found: {self.root}")
        self.partitions = partitions(self.root)
        if not self.partitions:
            raise FileNotFoundError(f"no day=*/replica=* partitions in store {self.root}")
        check_open_markers(self.root)
        from strata_lab.dump.store_check import StoreError

        seen: dict[str, str] = {}
        for p in self.partitions:  # each partition once, a directory of this store (not a link to another)
            if os.path.islink(p):
                raise StoreError(f"{p}: a partition must be a directory of the store, not a link")
            real = os.path.realpath(p)
            if real in seen:
                raise StoreError(f"{p}: the same directory as {seen[real]}")
            seen[real] = p
        self.paths = segment_files(self.root)
        if vocab_size is not None:
            from strata_lab.dump.store_check import check_vocabulary

            check_vocabulary(self.paths, vocab_size,
                             check_model=None if tokenizer is None else tokenizer.check_model)

    # --- cache domains ------------------------------------------------------------------------------
    def domains(self) -> dict[str, list[str]]:
        """Replica -> its partitions (all days, in order): a replica's calls share one cache and are
        replayed in order on one worker; replicas are independent."""
        out: dict[str, list[str]] = {}
        for p in self.partitions:
            out.setdefault(os.path.basename(p)[len("replica="):], []).append(p)
        return dict(sorted(out.items()))

    # --- records --------------------------------------------------------------------------------------
    def iter_partition(self, partition: str, *, raw: bool = False) -> Iterator[tuple[int, dict | bytes]]:
        """(seq, record) of one partition in order; with raw=True, (seq, original line bytes)."""
        dec = RowDecoder()
        for row in iter_partition_rows(partition, vocab_size=self.vocab_size):
            yield row["seq"], (dec.line(row) if raw else with_defaults(dec.record(row)))

    def iter_domain(self, domain: str, *, raw: bool = False) -> Iterator[tuple[int, dict | bytes]]:
        """(seq, record) of one cache domain (a replica, all days), in the original order."""
        parts = self.domains()[domain]
        yield from heapq.merge(*(self.iter_partition(p, raw=raw) for p in parts), key=lambda t: t[0])

    def _merged(self, raw: bool):
        return heapq.merge(*(self.iter_partition(p, raw=raw) for p in self.partitions), key=lambda t: t[0])

    def __iter__(self) -> Iterator[dict]:
        for _seq, rec in self._merged(False):
            yield rec

    def records(self) -> list[dict]:
        """All records as a list (reads the whole store)."""
        return list(self)

    def sessions(self) -> dict[str, list[dict]]:
        out: dict[str, list[dict]] = {}
        for rec in self:
            out.setdefault(str(rec["session"]), []).append(rec)
        return out

    def lines(self) -> Iterator[bytes]:
        """The original JSONL lines (without newline), in the original order."""
        for _seq, line in self._merged(True):
            yield line

    def to_jsonl(self, path: str | os.PathLike) -> int:
        """Write the original JSONL dump back; returns the number of lines."""
        from strata_lab.dump.writer import write_lines

        return write_lines(self.lines(), path)  # the one dump writer: 0600, no symbolic link

    @property
    def num_rows(self) -> int:
        import pyarrow.parquet as pq

        from strata_lab.dump.store_check import open_segment

        return sum(open_segment(f).metadata.num_rows for f in self.paths)

    @property
    def nbytes(self) -> int:
        return sum(os.path.getsize(p) for p in self.paths)

    def to_frame(self):
        """A pandas DataFrame, one row per call (like Dump.to_frame; reads the whole store)."""
        import pandas as pd

        recs = self.records()
        return pd.DataFrame({
            "ts": pd.Series([r.get("ts") for r in recs], dtype="float64"),
            "request_id": pd.Series([r.get("request_id") for r in recs], dtype="string"),
            "session": pd.Series([str(r["session"]) for r in recs], dtype="string"),
            "call": pd.Series([r["call"] for r in recs], dtype="int64"),
            "prompt_len": pd.Series([len(r["prompt_ids"]) for r in recs], dtype="int64"),
            "reused": pd.Series([r.get("reused") for r in recs], dtype="Int64"),
            "gen_len": pd.Series([len(r["gen_ids"]) for r in recs], dtype="int64"),
            "drained_len": pd.Series([len(r["drained_ids"]) for r in recs], dtype="int64"),
            **{k: pd.Series([_int_or_none(r.get(k, r.get(old))) for r in recs], dtype="Int64")
               for k, old in (("reported_cached_tokens", "cached_tokens"),
                              ("reported_cache_write_tokens", "reported_cache_creation_tokens"))},
        })

    def __repr__(self) -> str:
        return f"Store({self.root!r}, partitions={len(self.partitions)})"
