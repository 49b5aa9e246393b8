"""The replay of a store, driven by its delta encoding: per-call work proportional to the new ids.

A store row holds a prompt as (parent_call, shared_len, suffix_ids) against the session's previous call.
After that call the session held exactly `previous prompt + gen + drained`, so the prompt's common
prefix with what the session holds is known without reading the prompt: `shared_len` when the prompt
leaves the previous prompt, else the previous prompt's length plus the common prefix of the suffix and
the previous reply. `DeltaPrompt` lets the Python side of the C++ replay core (`native`) see the prompt
without building it: the ids before `shared_len` are the session's own held ids. Here: the store's rows
merged in seq order (`domain_rows`), each as a record (`_record`), and what a replay reads once before
its first call (`scan_store`: the models, the cost model's samples and the session ends, one pass over the
store's scalar columns).
"""
from __future__ import annotations

from strata_lab.replayer.costs import CostModel

import functools
import heapq
from collections.abc import Sequence
from typing import Iterator

import orjson

from strata_lab.dump.store_codec import with_defaults
from strata_lab.replayer.step import recorded_prefill_ms

__all__ = ["DeltaPrompt", "domain_rows", "session_ends", "cost_samples", "fit_cost_store", "StoreScan",
           "scan_store"]

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


# fields of a line that our engine's recorder never writes: figures reported by another server, a log's format
_NOT_OURS = ("reported_", "cached_tokens", "cache_engine", "trace_format", "fidelity", "synthetic_ids")


def _ours(t) -> bool:
    """Whether every row of a segment's table is our engine's own line: none carries another server's
    reported figures or a field only other servers' lines and logs have."""
    import pyarrow.compute as pc

    if t["reported_cached_tokens"].null_count != t.num_rows or \
            t["reported_cache_write_tokens"].null_count != t.num_rows:
        return False
    for name in ("extra", "raw", "keys"):
        for v in pc.unique(t[name]).to_pylist():
            if v is not None and any(k in v for k in _NOT_OURS):
                return False
    return True


class _SessionEnds:
    """Session -> seq of its last call, a segment's table at a time (from two scalar columns)."""

    COLUMNS = ["session", "seq"]

    def __init__(self):
        self.tables: list = []

    def add(self, t) -> None:
        import pyarrow.compute as pc

        t = t.select(self.COLUMNS)
        self.tables.append(t.filter(pc.is_valid(t["session"])))

    def result(self) -> dict[str, int]:
        import pyarrow as pa

        if not self.tables:
            return {}
        g = pa.concat_tables(self.tables).group_by("session").aggregate([("seq", "max")])
        return dict(zip(g["session"].to_pylist(), g["seq_max"].to_pylist()))


class _CostSamples:
    """(read, reused, prefill_ms) of every call that has them, a segment's table at a time, in seq order at the
    end: what fit_cost reads. Only scalar columns (no id lists); rows whose fields all have their columns are
    taken column-wise, the rest (a raw line, extra fields) one by one."""

    COLUMNS = ["seq", "prompt_len", "reused", "prefill_ms", "extra", "raw"]

    def __init__(self):
        self.seqs: list = []
        self.reads: list = []
        self.starts: list = []
        self.times: list = []
        self.odd_rows: list = []  # (seq, read, reused, ms) of rows read one by one

    def add(self, t) -> None:
        import numpy as np
        import pyarrow.compute as pc

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
        self.seqs.append(plain["seq"].to_numpy())
        reused = plain["reused"].to_numpy()
        self.reads.append(plain["prompt_len"].to_numpy().astype(np.int64) - reused)
        self.starts.append(reused)
        self.times.append(plain["prefill_ms"].to_numpy())
        for row in t.select(self.COLUMNS).filter(odd).to_pylist():
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
                self.odd_rows.append((row["seq"], plen - reused, reused, ms))

    def result(self):
        import numpy as np

        seqs, reads, starts, times = list(self.seqs), list(self.reads), list(self.starts), list(self.times)
        if self.odd_rows:
            q, r, s_, m = zip(*self.odd_rows)
            seqs.append(np.array(q, np.int64))
            reads.append(np.array(r, np.int64))
            starts.append(np.array(s_, np.int64))
            times.append(np.array(m, np.float64))
        if not seqs:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float64)
        order = np.argsort(np.concatenate(seqs), kind="stable")
        return tuple(np.concatenate(x)[order] for x in (reads, starts, times))


def _tables(files: list[str], columns: list[str]) -> Iterator:
    from strata_lab.dump.store_check import open_segment

    for f in files:
        yield open_segment(f).read(columns=columns)


def _partition_files(partitions: list[str]) -> list[str]:
    from strata_lab.dump.store_writer import segment_files

    return [f for p in partitions for f in segment_files(p)]


def session_ends(partitions: list[str]) -> dict[str, int]:
    """Session -> seq of its last call (from two scalar columns): after it, its state can go."""
    acc = _SessionEnds()
    for t in _tables(_partition_files(partitions), acc.COLUMNS):
        acc.add(t)
    return acc.result()


def cost_samples(partitions: list[str]):
    """(read, reused, prefill_ms) arrays over every call that has them, in seq order: what fit_cost reads
    (`_CostSamples`)."""
    acc = _CostSamples()
    for t in _tables(_partition_files(partitions), acc.COLUMNS):
        acc.add(t)
    return acc.result()


def _fit(samples) -> CostModel | None:
    try:
        return CostModel.fit_arrays(*samples)
    except ValueError:
        return None


class StoreScan:
    """What the replay of a store of our engine's own lines reads before its first call, from one pass over
    the store's scalar columns (`scan_store`): `models` (the `model` names, what `strata.for_calls` reads),
    `ends` (session -> seq of its last call) and `cost_model` (fit_cost on the recorded calls, or None). The
    last two are finished when first asked for (a replay given a cost model, or on Dask, skips them)."""

    def __init__(self, store, models: list, cost: _CostSamples, ends: _SessionEnds):
        self.store, self.models = store, models
        self._cost, self._ends = cost, ends

    @functools.cached_property
    def ends(self) -> dict[str, int]:
        ends, self._ends = self._ends.result(), None
        return ends

    @functools.cached_property
    def cost_model(self) -> CostModel | None:
        fit, self._cost = _fit(self._cost.result()), None
        return fit


_SCAN_COLUMNS = sorted({"model", "extra", "raw", "keys", "reported_cached_tokens", "reported_cache_write_tokens",
                        *_SessionEnds.COLUMNS, *_CostSamples.COLUMNS})


def scan_store(store) -> StoreScan | None:
    """A store's `StoreScan`, each segment read once; None when a line was served elsewhere or carries another
    server's reported figures (those replay call by call: the scan stops there)."""
    import pyarrow.compute as pc

    models: set = set()
    ends, cost = _SessionEnds(), _CostSamples()
    for t in _tables(store.paths, _SCAN_COLUMNS):
        if not _ours(t):
            return None
        models.update(pc.unique(t["model"]).to_pylist())
        ends.add(t)
        cost.add(t)
    return StoreScan(store, sorted(models, key=str), cost, ends)


def fit_cost_store(store) -> CostModel | None:
    """fit_cost on a store, from its columns (no prompt is rebuilt)."""
    return _fit(cost_samples(store.partitions))
