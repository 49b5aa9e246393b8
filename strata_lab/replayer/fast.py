"""The replay of a store, driven by its delta encoding: per-call work proportional to the new ids.

A store row holds a prompt as (parent_call, shared_len, suffix_ids) against the session's previous call.
After that call the session held exactly `previous prompt + gen + drained`, so the prompt's common
prefix with what the session holds is known without reading the prompt: `shared_len` when the prompt
leaves the previous prompt, else the previous prompt's length plus the common prefix of the suffix and
the previous reply. `DeltaPrompt` lets the ordinary `step` (the same code `replay` runs on a JSONL dump,
hence the same results) see the prompt without building it: the ids before `shared_len` are the
session's own held ids.
"""
from __future__ import annotations

from strata_lab.replayer.costs import CostModel

import gc
import heapq
from array import array
from collections.abc import Sequence
from typing import Iterator

import orjson

from strata_lab.dump.store_codec import with_defaults
from strata_lab.replayer.state import lcp_len
from strata_lab.replayer.step import recorded_prefill_ms, step

__all__ = ["DeltaPrompt", "DomainSteps", "replay_domain", "domain_rows", "session_ends", "cost_samples"]

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


class DomainSteps:
    """The replay of one cache domain as a stream: iterating yields (seq, CallRow) in store order.

    With `show` set (a function), each call's (held ids before, prompt ids, held segments) are copied and
    handed to it first: what a viewer draws; off by default (no copies: work stays ~ the new ids).
    `peak_bytes` (summed over sessions) and `recorded_ms` are complete once the stream ends.
    """

    def __init__(self, partitions: list[str], opts, tok, cost_model, *, show=None):
        if opts.policy.changes_prompts:
            raise ValueError("the delta replay serves prompt-keeping policies; rewrite policies replay records")
        self.partitions, self.opts, self.tok, self.cost_model, self.show = partitions, opts, tok, cost_model, show
        self.peak: dict = {}
        self.recorded_ms = None

    @property
    def peak_bytes(self) -> int:
        return sum(self.peak.values())

    def __iter__(self):
        opts, tok, cost_model, peak = self.opts, self.tok, self.cost_model, self.peak
        states: dict = {}
        last: dict = {}       # session -> (partition, row, prompt_len) of its previous call
        recorded_ckpts = opts.recorded_checkpoints
        ends = session_ends(self.partitions)
        for k, n, row in domain_rows(self.partitions):
            rec = _record(row)
            sid = str(rec["session"])
            st = states.get(sid)
            first = st is None
            if first:
                st = states[sid] = opts.new_state()
                peak[sid] = 0
            held = st.held
            parent, shared, suffix, plen_col = row[_PARENT], row[_SHARED], row[_SUFFIX], row[_PROMPT_LEN]
            if plen_col is None or plen_col < 0:
                prompt = rec["prompt_ids"]  # not delta-encoded (kept whole in the line)
                lcp = lcp_len(prompt, held)
            elif parent < 0:
                prompt = suffix
                lcp = lcp_len(prompt, held)
            else:
                prev = last.get(sid)
                if prev is None or prev[0] != k or prev[1] != parent:
                    raise ValueError(f"store row seq {row[_SEQ]}: parent_call {parent} is not session {sid!r}'s "
                                     "previous call in its partition")
                prompt = DeltaPrompt(held, shared, suffix)
                plen = prev[2]
                lcp = shared if shared < plen else plen + lcp_len(suffix, held[plen:])
            if self.show is not None:
                self.show(list(held), list(prompt), list(st.segments))
            r = step(st, prompt, rec, tok=tok, first=first, recorded_checkpoints=recorded_ckpts,
                     cost_model=cost_model, context_chars=opts.context_chars, lcp=lcp)
            last[sid] = (k, n, r.prompt_len)
            b = st.snapshot_bytes()
            if b > peak[sid]:
                peak[sid] = b
            t = r.prefill_ms  # the recorded prefill_ms (NaN: none)
            if t == t:
                self.recorded_ms = (self.recorded_ms or 0.0) + t
            if ends.get(row[_SESSION]) == row[_SEQ]:  # the session's last call: free its held ids
                del states[sid], last[sid]
            yield row[_SEQ], r


def replay_domain(partitions: list[str], opts, tok, cost_model, progress=None):
    """Replay one cache domain (its partitions merged in seq order).

    Returns (seqs, rows (a list of `step.CallRow`), peak snapshot bytes summed over sessions, recorded prefill ms
    or None). The Python reference the C++ core (`native.replay_domain`) is timed against (benchmarks/replay.py).
    """
    steps = DomainSteps(partitions, opts, tok, cost_model)
    seqs = array("q")  # 8 bytes a call
    rows = []
    # the loop allocates many small objects and frees few: the cyclic GC would rescan the growing rows
    # and states again and again (measured: ~30% of the time). Nothing here makes cycles.
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        for seq, r in steps:
            seqs.append(seq)
            rows.append(r)
            if progress is not None:
                progress.update(1)
    finally:
        if gc_was_on:
            gc.enable()
    return seqs, rows, steps.peak_bytes, steps.recorded_ms


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
