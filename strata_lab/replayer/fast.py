"""The replay of a store, driven by its delta encoding: per-call work proportional to the new ids.

A store row holds a prompt as (parent_call, shared_len, suffix_ids) against the session's previous call.
After that call the session held exactly `previous prompt + gen + drained`, so the prompt's common
prefix with what the session holds is known without reading the prompt: `shared_len` when the prompt
leaves the previous prompt, else the previous prompt's length plus the common prefix of the suffix and
the previous reply. `DeltaPrompt` lets the Python side of the C++ replay core (`native`) see the prompt
without building it: the ids before `shared_len` are the session's own held ids. Here: the store's rows
merged in seq order (`domain_rows`), each as a record (`_record`), and the cost model's samples.
"""
from __future__ import annotations

from strata_lab.replayer.costs import CostModel

import heapq
from collections.abc import Sequence
from typing import Iterator

import orjson

from strata_lab.dump.store_codec import with_defaults
from strata_lab.replayer.step import recorded_prefill_ms

__all__ = ["DeltaPrompt", "domain_rows", "session_ends", "cost_samples", "fit_cost_store"]

_ROW_COLUMNS = ["seq", "session", "request_id", "ts", "call", "parent_call", "shared_len", "suffix_ids",
                "prompt_len", "reused", "gen_ids", "drained_ids", "checkpoints", "prefill_ms", "decode_ms",
                "keys", "extra", "raw"]


class DeltaPrompt(Sequence):
    """A prompt = held[:base] + tail, read without copying held (valid while held[:base] is unchanged).

    >>> p = DeltaPrompt([1, 2, 3, 9], 3, [4, 5])
    >>> len(p), p[2], p[3], p[2:5], list(p)
    (5, 3, 4, [3, 4, 5], [1, 2, 3, 4, 5])
    """

    __slots__ = ("held", "base", "tail")

    def __init__(self, held: list, base: int, tail: list):
        self.held, self.base, self.tail = held, base, tail

    def __len__(self):
        return self.base + len(self.tail)

    def __getitem__(self, i):
        base = self.base
        if isinstance(i, slice):
            start, stop, stride = i.indices(base + len(self.tail))
            if stride != 1:
                return [self[k] for k in range(start, stop, stride)]
            if start >= base:
                return self.tail[start - base:stop - base]
            return self.held[start:min(stop, base)] + self.tail[:max(stop - base, 0)]
        if i < 0:
            i += base + len(self.tail)
        return self.tail[i - base] if i >= base else self.held[i]


# column positions in the row tuples domain_rows yields
(_SEQ, _SESSION, _REQUEST_ID, _TS, _CALL, _PARENT, _SHARED, _SUFFIX, _PROMPT_LEN, _REUSED, _GEN, _DRAINED,
 _CKPTS, _PREFILL_MS, _DECODE_MS, _KEYS, _EXTRA, _RAW) = range(len(_ROW_COLUMNS))


def _lazy_lists(col) -> Iterator[list | None]:
    """The lists of an Arrow list column one row at a time, from its flat numpy buffers: a batch holds
    4 bytes an id, not a Python int each (a batch of long prompts as Python lists is tens of MB)."""
    offs = col.offsets.to_numpy()
    vals = col.values.to_numpy(zero_copy_only=False)
    if col.null_count:
        nulls = col.is_null().to_pylist()
        for i in range(len(col)):
            yield None if nulls[i] else vals[offs[i]:offs[i + 1]].tolist()
    else:
        for i in range(len(col)):
            yield vals[offs[i]:offs[i + 1]].tolist()


def _partition_tuples(partition: str, batch_rows: int) -> Iterator[tuple]:
    """The rows of one partition as tuples in `_ROW_COLUMNS` order: scalar columns converted a batch at a
    time (one C-level call per column), id lists a row at a time from the batch's flat buffers."""
    import pyarrow.parquet as pq
    import pyarrow.types as pt

    from strata_lab.dump.store_check import check_partition, open_segment

    for f in check_partition(partition):  # files and rows checked first (StoreError names file, row, field)
        for batch in open_segment(f).iter_batches(batch_size=batch_rows, columns=_ROW_COLUMNS):
            yield from zip(*(_lazy_lists(c) if pt.is_list(c.type) else c.to_pylist() for c in batch.columns))


def domain_rows(partitions: list[str], batch_rows: int = 1024) -> Iterator[tuple[int, int, tuple]]:
    """(partition index, row number in its partition, row tuple in `_ROW_COLUMNS` order) of a cache
    domain, in seq order."""
    if len(partitions) == 1:
        for n, row in enumerate(_partition_tuples(partitions[0], batch_rows)):
            yield 0, n, row
        return

    def one(k, part):
        for n, row in enumerate(_partition_tuples(part, batch_rows)):
            yield row[_SEQ], k, n, row

    for _seq, k, n, row in heapq.merge(*(one(k, p) for k, p in enumerate(partitions)), key=lambda t: t[0]):
        yield k, n, row


_NEEDED_KEYS = ("session", "call", "ts", "request_id", "reused")
_FULL_KEYS: dict[str, bool] = {}  # a line's key list -> whether it names every field of _NEEDED_KEYS


def _all_keys(keys: str | None) -> bool:
    ok = _FULL_KEYS.get(keys)
    if ok is None:
        names = set(keys.split(",")) if keys else set()
        ok = _FULL_KEYS[keys] = all(k in names for k in _NEEDED_KEYS)
        if len(_FULL_KEYS) > 4096:
            _FULL_KEYS.clear()
    return ok


def _record(row: tuple) -> dict:
    """The fields `step` reads, from a row's columns (with the line's own values where they had none)."""
    raw, extra, keys = row[_RAW], row[_EXTRA], row[_KEYS]
    if raw is not None:
        return with_defaults(orjson.loads(raw))
    pm = row[_PREFILL_MS]
    rec = {"session": row[_SESSION], "request_id": row[_REQUEST_ID], "ts": row[_TS], "call": row[_CALL],
           "reused": row[_REUSED], "gen_ids": row[_GEN], "drained_ids": row[_DRAINED], "checkpoints": row[_CKPTS],
           "timings": {"prefill_ms": pm, "decode_ms": row[_DECODE_MS]} if pm is not None else {}}
    if not _all_keys(keys):  # fields absent from the line stay absent, as the reader has them
        names = keys.split(",") if keys else ()
        for k in _NEEDED_KEYS:
            if k not in names:
                rec.pop(k)
    if extra:
        rec.update(orjson.loads(extra))  # fields without a column (a replica), or values of another type
    return with_defaults(rec)


def session_ends(partitions: list[str]) -> dict[str, int]:
    """Session -> seq of its last call (from two scalar columns): after it, its state can go."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from strata_lab.dump.store_check import open_segment
    from strata_lab.dump.store_writer import segment_files

    tables = [open_segment(f).read(columns=["session", "seq"]) for p in partitions for f in segment_files(p)]
    if not tables:
        return {}
    t = pa.concat_tables(tables)
    t = t.filter(pc.is_valid(t["session"]))
    g = t.group_by("session").aggregate([("seq", "max")])
    return dict(zip(g["session"].to_pylist(), g["seq_max"].to_pylist()))


def cost_samples(partitions: list[str]):
    """(read, reused, prefill_ms) arrays over every call that has them, in seq order: what fit_cost reads. Only the
    scalar columns are read (no id lists); rows whose fields all have their columns are taken column-wise,
    the rest (a raw line, extra fields) one by one."""
    import numpy as np
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from strata_lab.dump.store_check import open_segment
    from strata_lab.dump.store_writer import segment_files

    cols = ["seq", "prompt_len", "reused", "prefill_ms", "keys", "extra", "raw"]
    seqs, reads, starts, times = [], [], [], []
    odd_rows: list = []  # (seq, read, reused, ms) of rows read one by one
    for f in (f for part in partitions for f in segment_files(part)):
        t = open_segment(f).read(columns=cols)
        extra = t["extra"]
        # extra fields (a replica, ...) leave these columns as they are unless they name one of the fields
        # read here (the substring test is conservative: such a row is read one by one)
        touches = pc.fill_null(pc.or_(pc.or_(pc.match_substring(extra, '"reused"'),
                                             pc.match_substring(extra, '"timings"')),
                                      pc.match_substring(extra, '"prompt_ids"')), False)
        odd = pc.or_(pc.is_valid(t["raw"]), touches)
        known = pc.and_(pc.and_(pc.is_valid(t["reused"]), pc.is_valid(t["prefill_ms"])),
                        pc.and_(pc.is_valid(t["prompt_len"]), pc.greater_equal(t["prompt_len"], 0)))
        plain = t.filter(pc.and_(pc.invert(odd), known))
        seqs.append(plain["seq"].to_numpy())
        reused = plain["reused"].to_numpy()
        reads.append(plain["prompt_len"].to_numpy().astype(np.int64) - reused)
        starts.append(reused)
        times.append(plain["prefill_ms"].to_numpy())
        for row in t.filter(odd).to_pylist():
            rec = orjson.loads(row["raw"]) if row["raw"] is not None else None
            if rec is None:
                rec = {"reused": row["reused"], "timings": {"prefill_ms": row["prefill_ms"]}
                       if row["prefill_ms"] is not None else {}}
                rec.update(orjson.loads(row["extra"]))
            reused, plen = rec.get("reused"), row["prompt_len"]
            if plen is None or plen < 0:
                plen = len(rec.get("prompt_ids") or [])
            ms = recorded_prefill_ms({"timings": rec.get("timings") if isinstance(rec.get("timings"), dict)
                                      else {}})
            if isinstance(reused, int) and ms is not None:
                odd_rows.append((row["seq"], plen - reused, reused, ms))
    if odd_rows:
        q, r, s_, m = zip(*odd_rows)
        seqs.append(np.array(q, np.int64))
        reads.append(np.array(r, np.int64))
        starts.append(np.array(s_, np.int64))
        times.append(np.array(m, np.float64))
    if not seqs:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float64)
    order = np.argsort(np.concatenate(seqs), kind="stable")
    return tuple(np.concatenate(x)[order] for x in (reads, starts, times))


def fit_cost_store(store) -> CostModel | None:
    """fit_cost on a store, from its columns (no prompt is rebuilt)."""
    try:
        return CostModel.fit_arrays(*cost_samples(store.partitions))
    except ValueError:
        return None
