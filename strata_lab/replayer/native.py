"""The store replay on the C++ core: whole batches of calls stepped without a Python object per call.

`replay_domain` reads a cache domain's rows as Arrow batches (partitions merged in seq order a batch at a
time) and hands each batch's flat buffers to `_ReplayCore` (the `strata_lab._replay` extension, no OpenMP), which keeps every session's
held ids, snapshots and segments, applies the state model's rules (state.py) and attributes every call
(`step.attribute_row`'s rule). A miss (the prompt leaves held) is explained in C++ with the tokenizer's bytes,
lent to the core at the domain's first stop: the divergence walk, the cause (`classify`) and the realigned
tail (`explain.realigned_tail`); Python only formats its context strings, a batch at a time. The core stops
at the calls that need Python:

- a line the columns do not describe alone (a raw line, extra fields, absent keys, a whole prompt);
- a parent that does not check out (the same error `fast.DomainSteps` raises);
- a miss, before the vocabulary is lent (or when the tokenizer cannot list its bytes: the Python walk).

Python steps that call on the same C++ state (`lcp_with`, `plan`, `advance`) with the same functions
`step` uses (`find_divergence`, `classify`, `attribute_row`), writes its row, and resumes the batch. The report's rows are
built column-wise from the batch's own columns and the core's outputs. Results are identical to
`fast.DomainSteps` (the Python reference the notebook pager still steps) and to the JSONL replay
(tests/test_replay_native.py).

Why one module: reading a domain's batches, handing their buffers to the core, stepping the calls it
leaves, and building the report's columns share one batch layout (`_ROW_COLUMNS` plus `_part`/`_row`, the
core's input and output arrays); split apart, each piece would restate it.
"""
from __future__ import annotations

import gc
import math
from array import array
from collections.abc import Sequence
from typing import Iterator

import numpy as np

from strata_lab import _native
from strata_lab.replayer.divergence import (Divergence, _assistant_id, classify, context_pair, find_divergence,
                                            set_id_contexts, set_text_contexts)
from strata_lab.replayer.fast import _ROW_COLUMNS, DeltaPrompt, _all_keys, _record, session_ends
from strata_lab.replayer.step import attribute_row, recorded_prefill_ms

__all__ = ["replay_store", "replay_domain", "domain_batches", "native_available"]

_INT_OUTS = ("prompt_len", "held_before", "lcp", "reused", "target", "reread", "snapshots", "index", "gen_len",
             "drained_len", "lcp_text", "restored")
_LIST_COLUMNS = ("suffix_ids", "gen_ids", "drained_ids", "checkpoints")
_SCALARS = [c for c in _ROW_COLUMNS if c not in _LIST_COLUMNS] + ["_part", "_row"]
_NO_PERM = np.zeros(0, dtype=np.int64)


def native_available() -> bool:
    """Whether the replay core is built (a source checkout without a build has not)."""
    return _native.replay_available()


def _cause_names(ext) -> list[str]:
    """The core's cause codes' names (`_replay.Cause`), indexed by code: causes cross by name."""
    members = ext.Cause.__members__
    names = [""] * len(members)
    for name, v in members.items():
        names[int(v)] = name
    return names


# the fields `_record` takes from a line for `step`: an `extra` that may hold one (a substring test, so
# conservative: a value that merely contains the quoted name also sends the row to Python)
_REPLAY_FIELDS = tuple(f'"{k}"' for k in ("session", "request_id", "ts", "call", "reused", "gen_ids",
                                          "drained_ids", "checkpoints", "timings", "prompt_ids"))


def _touches_replay(extra: str) -> bool:
    """Whether a row's extra fields may hold one `step` reads.

    >>> _touches_replay('{"replica":"r0"}'), _touches_replay('{"reused":true}')
    (False, True)
    """
    return any(k in extra for k in _REPLAY_FIELDS)


# --- reading: a domain's rows as Arrow batches in seq order ---------------------------------------
def _partition_batches(partition: str, k: int, batch_rows: int):
    """One partition's rows as record batches with `_part` (k) and `_row` (row number in the partition)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from strata_lab.dump.store_check import check_partition, open_segment

    n = 0
    for f in check_partition(partition):  # files and rows checked first (StoreError names file, row, field)
        for b in open_segment(f).iter_batches(batch_size=batch_rows, columns=_ROW_COLUMNS):
            m = b.num_rows
            if not m:
                continue
            b = b.append_column("_part", pa.array(np.full(m, k, dtype=np.int64)))
            b = b.append_column("_row", pa.array(np.arange(n, n + m, dtype=np.int64)))
            n += m
            yield b


def domain_batches(partitions: list[str], batch_rows: int = 1024) -> Iterator:
    """A cache domain's rows as record batches in seq order (`_ROW_COLUMNS` plus `_part`, `_row`)."""
    for b, perm in _domain_pieces(partitions, batch_rows):
        yield b if perm is None else b.take(perm)


def _domain_pieces(partitions: list[str], batch_rows: int = 1024) -> Iterator:
    """(batch, perm): a cache domain's rows a batch at a time; row perm[i] of the batch is its i-th in seq
    order (perm None: the batch is in order). Several partitions (a replica's days, or a whole store) are
    merged a batch at a time: each round takes, from every partition's current batch, the rows up to the
    smallest of their last seqs (no row later in any partition can come before them). The order is stable
    (ties keep partition order, as `fast.domain_rows`' heap merge does); the batch is not gathered (its id
    lists are large), only ordered.
    """
    import pyarrow as pa

    if len(partitions) == 1:
        for b in _partition_batches(partitions[0], 0, batch_rows):
            yield b, None
        return
    its = [_partition_batches(p, k, batch_rows) for k, p in enumerate(partitions)]
    heads: list = [next(it, None) for it in its]
    while True:
        live = [k for k, h in enumerate(heads) if h is not None]
        if not live:
            return
        seqs = {k: heads[k].column("seq").to_numpy() for k in live}
        bound = min(seqs[k][-1] for k in live)
        pieces = []
        for k in live:
            cut = int(np.searchsorted(seqs[k], bound, side="right"))
            pieces.append(heads[k].slice(0, cut))
            rest = heads[k].slice(cut)
            heads[k] = rest if rest.num_rows else next(its[k], None)
        pieces = [p for p in pieces if p.num_rows]
        if len(pieces) == 1:  # one partition's rows only (a replica's days follow each other)
            yield pieces[0], None
            continue
        t = pa.Table.from_batches(pieces).combine_chunks()
        b = t.to_batches()[0]
        s = b.column("seq").to_numpy()
        perm = np.argsort(s, kind="stable")
        yield b, (None if (np.diff(s) >= 0).all() else perm)


def _read_ahead(batches: Iterator, depth: int = 2) -> Iterator:
    """`batches`, read up to `depth` ahead on a thread: Parquet decoding (which releases the GIL) overlaps
    the replay of the batch before. Errors are raised here, in order; closing the iterator stops the reader."""
    import queue
    import threading

    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def reader():
        try:
            for b in batches:
                if not put((b, None)):
                    return
            put((done, None))
        except BaseException as exc:  # handed to the consumer, raised there
            put((None, exc))

    t = threading.Thread(target=reader, name="strata-replay-read", daemon=True)
    t.start()
    try:
        while True:
            item, exc = q.get()
            if exc is not None:
                raise exc
            if item is done:
                return
            yield item
    finally:
        stop.set()
        t.join()


# --- one batch's inputs for the core ---------------------------------------------------------------
def _list_buffers(col):
    """(offsets int32, values int32) of an Arrow list<int32> column (values: the whole child buffer)."""
    offs = col.offsets.to_numpy()
    vals = col.values.to_numpy(zero_copy_only=False)
    if offs.dtype != np.int32:
        offs = offs.astype(np.int32)
    if vals.dtype != np.int32:
        vals = vals.astype(np.int32)
    return np.ascontiguousarray(offs), np.ascontiguousarray(vals)


def _ints(col, null: int) -> np.ndarray:
    import pyarrow.compute as pc

    return pc.fill_null(col, null).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


_VOCABS: dict = {}  # id(tokenizer) -> (tokenizer, its _ReplayVocab): built once per tokenizer and process


def _native_vocab(tok):
    """The core's copy of `tok`'s bytes per id (None: the tokenizer cannot list them)."""
    hit = _VOCABS.get(id(tok))
    if hit is not None and hit[0] is tok:
        return hit[1]
    vb = getattr(tok, "vocab_bytes", None)
    if vb is None:
        return None
    blob, offsets = vb()
    im_start = getattr(tok, "im_start_id", None)
    assistant = _assistant_id(tok)
    vocab = _native.replay()._ReplayVocab(blob, np.asarray(offsets, dtype=np.int64), -1 if im_start is None else im_start,
                                 -1 if assistant is None else assistant)
    if len(_VOCABS) >= 4:
        _VOCABS.clear()
    _VOCABS[id(tok)] = (tok, vocab)
    return vocab


class _Domain:
    """The replay of one cache domain on the C++ core (see the module docstring)."""

    def __init__(self, partitions: list[str], opts, tok, cost_model, spec: str = "strata", ends=None):
        ext = _native.replay()
        self.spec = spec   # the engine spec the report's rows name
        if opts.policy.changes_prompts:
            raise ValueError("the delta replay serves prompt-keeping policies; rewrite policies replay records")
        self.partitions, self.opts, self.tok, self.cost_model = partitions, opts, tok, cost_model
        st = opts.new_state()  # the validated rules, read back for the core
        p = st.policy
        self.core = ext._ReplayCore(
            hybrid=st.model == "hybrid", full_hit=ext.FullHit.__members__[st.full_hit], policy=p._native(ext),
            capacity=-1 if st.capacity is None else int(st.capacity), bytes_per_snapshot=int(st.bytes_per_snapshot),
            recorded_checkpoints=opts.recorded_checkpoints)
        # the `cause` output codes' names: the core's, then any cause only Python's classify gives
        self.cause_names = _cause_names(ext)
        self.cause_codes = {c: i for i, c in enumerate(self.cause_names)}
        self.bytes_per_snapshot = st.bytes_per_snapshot
        self.codes: dict[str, int] = {}   # session -> the core's code
        self.ends = session_ends(partitions) if ends is None else ends
        self._has_vocab: bool | None = None
        self._py: _PyRows | None = None   # the batch's rows as Python values, made at its first call Python steps

    def _vocab(self) -> bool:
        """Whether the core can walk a miss with the tokenizer's bytes (built at the first call the core stops
        at: a replay the core steps alone never pays it; the core keeps it from then on, `_batch`)."""
        if self._has_vocab is None:
            self._vocab_obj = _native_vocab(self.tok)
            self._has_vocab = self._vocab_obj is not None
        return self._has_vocab

    def _cause_code(self, cause: str) -> int:
        """The `cause` output code of a cause name (a name the core does not know gets a code of its own)."""
        c = self.cause_codes.get(cause)
        if c is None:
            c = self.cause_codes[cause] = len(self.cause_names)
            self.cause_names.append(cause)
        return c

    def _code(self, sid: str) -> int:
        c = self.codes.get(sid)
        if c is None:
            c = self.codes[sid] = len(self.codes)
        return c

    def batches(self, progress=None) -> Iterator[tuple[np.ndarray, object]]:
        """(seqs, report rows as a record batch) per input batch."""
        for b, perm in _read_ahead(_domain_pieces(self.partitions)):
            out = self._batch(b, perm)
            if progress is not None:
                progress.update(b.num_rows)
            yield out

    def _batch(self, lb, perm):
        import pyarrow.compute as pc

        n = lb.num_rows
        # b: the scalar columns in seq order; lb: the id lists where they were read (row perm[i] is row i's)
        b = lb if perm is None else lb.select(_SCALARS).take(perm)
        col = b.column
        seq = col("seq").to_numpy()
        # sessions: codes through the batch's dictionary (a handful of distinct sessions per batch)
        enc = col("session").dictionary_encode()
        names = enc.dictionary.to_pylist()
        idx = enc.indices.to_numpy(zero_copy_only=False)
        null_session = enc.indices.is_null().to_numpy(zero_copy_only=False) if enc.null_count else None
        idx = np.nan_to_num(idx, nan=0).astype(np.int64) if null_session is not None else idx.astype(np.int64)
        u_code = np.array([self._code(s) for s in names] or [0], dtype=np.int64)
        u_end = np.array([self.ends.get(s, -1) for s in names] or [-1], dtype=np.int64)
        code = u_code[idx]
        last = (seq == u_end[idx]).astype(np.uint8)
        # rows Python reads: a raw line, extra fields, keys missing, no session column value
        kenc = col("keys").dictionary_encode()
        kfull = np.array([_all_keys(k) for k in kenc.dictionary.to_pylist()] or [False], dtype=bool)
        kidx = kenc.indices
        keys_ok = np.zeros(n, dtype=bool) if kidx.null_count == n else \
            kfull[pc.fill_null(kidx, 0).to_numpy(zero_copy_only=False)] & kidx.is_valid().to_numpy(zero_copy_only=False)
        # extra fields (a replica, ...) leave a row to the core unless they may name a field the replay reads
        xenc = col("extra").dictionary_encode()
        xidx = xenc.indices
        touches = np.array([_touches_replay(x) for x in xenc.dictionary.to_pylist()] or [False], dtype=bool)
        extra_slow = touches[pc.fill_null(xidx, 0).to_numpy(zero_copy_only=False)] & \
            xidx.is_valid().to_numpy(zero_copy_only=False)
        slow = ~keys_ok | col("raw").is_valid().to_numpy(zero_copy_only=False) | extra_slow
        if null_session is not None:
            slow |= null_session
        lists = [_list_buffers(lb.column(c)) for c in _LIST_COLUMNS]
        prefill = pc.fill_null(col("prefill_ms"), math.nan).to_numpy(zero_copy_only=False)
        ins = (code, slow.astype(np.uint8), last, col("_part").to_numpy(), col("_row").to_numpy(),
               _ints(col("parent_call"), -1), _ints(col("shared_len"), 0), _ints(col("prompt_len"), -1),
               *lists[0], *lists[1], *lists[2], *lists[3], np.ascontiguousarray(prefill, dtype=np.float64),
               _NO_PERM if perm is None else perm.astype(np.int64, copy=False))
        outs = {k: np.zeros(n, dtype=np.int64) for k in _INT_OUTS}
        outs["cause"] = np.zeros(n, dtype=np.int8)
        # the divergence (its cause code; -1: none / new_session by held) and the re-read's split
        outs["divergence"] = np.full(n, -1, dtype=np.int64)
        outs["divergence_reread"] = np.zeros(n, dtype=np.int64)
        outs["engine_reread"] = np.zeros(n, dtype=np.int64)
        out_tuple = tuple(outs[k] for k in (*_INT_OUTS, "cause", "divergence", "divergence_reread", "engine_reread"))
        over: dict[int, dict] = {}  # row -> values of the rows Python stepped, or a miss's context strings
        core = self.core
        # the core attributes every row it steps (`step.attribute_row`) and explains its misses itself (the walk,
        # the cause, the realigned tail) once it holds the vocabulary, lent at the domain's first stop
        i = core.run(0, ins, out_tuple)
        while i < n:
            if not core.has_vocab and self._vocab():
                core.set_vocab(self._vocab_obj)
                i = core.run(i, ins, out_tuple)
                continue
            if self._py is None:
                self._py = _PyRows(b, lb, dict(zip(_LIST_COLUMNS, lists)), perm)
            over[i] = self._slow(b, i, outs)
            i = core.run(i + 1, ins, out_tuple)
        self._py = None
        self._miss_contexts(outs, over)
        return seq, self._rows(b, outs, over)

    def _miss_contexts(self, outs, over: dict) -> None:
        """The context strings of the misses the core explained in this batch (a prompt that stops inside held
        parts from nothing: none)."""
        lcp, plen, width = outs["lcp"], outs["prompt_len"], self.opts.context_chars
        for m in self.core.take_misses():
            i = m[0]
            if lcp[i] < plen[i]:   # the windows as `_miss_divergence` shows them
                ih, ip = context_pair(m[6], m[7], m[8], width)
                th, tp = ("", "") if m[11] is None else context_pair(*m[11], width)
                over[i] = dict(id_context_held=ih, id_context_prompt=ip, text_context_held=th, text_context_prompt=tp)

    def _put_attribution(self, outs, i: int, a) -> None:
        """Row i's (cause, reread, divergence, divergence_reread, engine_reread) into the outputs."""
        cause, reread, div, div_rr, eng_rr = a
        outs["cause"][i] = self._cause_code(cause)
        outs["reread"][i] = reread
        outs["divergence"][i] = self._cause_code(div) if div not in ("none", "new_session") else -1
        outs["divergence_reread"][i] = div_rr
        outs["engine_reread"][i] = eng_rr

    # --- a call Python steps ------------------------------------------------------------------------
    def _slow(self, b, i: int, outs) -> dict:
        """Step row i in Python on the core's state (what fast.DomainSteps does for every row)."""
        row = self._py.row(i)
        part, n_row = self._py.part[i], self._py.rownum[i]
        seq_i, parent, shared, suffix, plen_col = row[0], row[5], row[6], row[7], row[8]
        rec = _record(row)
        sid = str(rec["session"])
        code = self._code(sid)
        core, tok, opts = self.core, self.tok, self.opts
        first = not core.has(code)
        if first:
            core.open(code)
        held_before = core.held_len(code)
        held = _LazyHeld(core, code, held_before)
        if plen_col is None or plen_col < 0:
            prompt = rec["prompt_ids"]  # not delta-encoded (kept whole in the line)
            lcp = core.lcp_with(code, 0, prompt)
        elif parent < 0:
            prompt = suffix
            lcp = core.lcp_with(code, 0, prompt)
        else:
            prev = None if first else core.last(code)
            if prev is None or prev[0] != part or prev[1] != parent:
                raise ValueError(f"store row seq {seq_i}: parent_call {parent} is not session {sid!r}'s "
                                 "previous call in its partition")
            prompt = DeltaPrompt(held, shared, suffix)
            plen = prev[2]
            lcp = shared if shared < plen else plen + core.lcp_with(code, plen, suffix)
        target, reused, restored = core.plan(code, len(prompt), lcp)
        tail = prompt[lcp:]  # a list (DeltaPrompt slices are lists)
        if lcp >= held_before:  # extends held (or the session held nothing): no divergence to explain
            div = None
            cause = classify(held=held, prompt=prompt, segments=(), div=None, reused=reused, target=target, tok=tok,
                             first_call=first, lcp_ids=lcp)
        elif self._vocab():  # the walk and the cause in C++ (the core holds the vocabulary), the context strings here
            m = core.explain(code, lcp, tail, reused, target)
            div = _miss_divergence(m, lcp, opts.context_chars)
            cause = m[5]  # the core gives the cause by name
        else:  # a tokenizer without vocab_bytes: the Python walk
            div = find_divergence(held, prompt, tok, lcp_ids=lcp, context_chars=opts.context_chars)
            cause = classify(held=held, prompt=prompt, segments=core.segments(code), div=div, reused=reused,
                             target=target, tok=tok, first_call=first, lcp_ids=lcp)
        gen, drained = rec["gen_ids"], rec["drained_ids"]
        ckpts = None
        if opts.recorded_checkpoints:
            ckpts = [int(c) for c in rec["checkpoints"]]
            h_after = len(prompt) + len(gen) + len(drained)
            ckpts = [c for c in ckpts if 0 < c <= h_after]
        lcp_text = div.lcp_text if div is not None else held_before
        # the one definition of re-read, on the held ids before the call (advance replaces them)
        self._put_attribution(outs, i, attribute_row(opts.model, held, prompt, held_before=held_before, lcp=lcp,
                                                     lcp_text=lcp_text, cause=cause, reused=reused))
        _hb, _l, reused, target, snaps, index, restored = core.advance(code, len(prompt), lcp, tail, gen, drained,
                                                                      ckpts, part, n_row)   # the same plan as above
        plen = len(prompt)
        for name, v in (("prompt_len", plen), ("held_before", held_before), ("lcp", lcp), ("reused", reused),
                        ("target", target), ("snapshots", snaps), ("index", index), ("gen_len", len(gen)),
                        ("drained_len", len(drained)), ("lcp_text", lcp_text),
                        ("restored", -1 if restored is None else restored)):
            outs[name][i] = v
        t = recorded_prefill_ms(rec)
        if t is not None:
            core.add_recorded_ms(t)
        rr = rec.get("reused")
        ts = rec.get("ts")
        o = {"session": sid, "request_id": rec.get("request_id"),
             "ts": float(ts) if isinstance(ts, (int, float)) and not isinstance(ts, bool) and math.isfinite(ts)
             else math.nan,
             "reported": rr if isinstance(rr, int) and not isinstance(rr, bool) else None}
        if div is not None and lcp < plen:   # a prompt that stops inside held parts from nothing: no context
            o.update(id_context_held=div.id_context_held, id_context_prompt=div.id_context_prompt,
                     text_context_held=div.text_context_held, text_context_prompt=div.text_context_prompt)
        if self.ends.get(row[1]) == seq_i:  # the session's last call: free its held ids
            core.close(code)
        return o

    # --- the report's rows for one batch, column-wise ------------------------------------------------
    def _rows(self, b, outs, over: dict):
        """The batch's rows as the replay report's columns (docs/CONTRACTS.md, Contract 3; engine strata):
        `index` is left 0 here (the driver numbers the rows in store order)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        n = b.num_rows
        col = b.column
        own = {i: o for i, o in over.items() if "session" in o}   # rows stepped in Python: their own values
        ctx_rows = sorted(i for i, o in over.items() if "id_context_held" in o)   # rows with divergence contexts

        def patched(name, base, typ):
            if not own:
                return base
            vals = base.to_pylist() if isinstance(base, (pa.Array, pa.ChunkedArray)) else list(base)
            for i, o in own.items():
                vals[i] = o[name]
            return pa.array(vals, type=typ)

        empty = pa.array([""] * n, type=pa.string())

        def contexts(name):   # "" except on the misses
            if not ctx_rows:
                return empty
            vals = [""] * n
            for i in ctx_rows:
                vals[i] = over[i][name]
            return pa.array(vals, type=pa.string())

        reused, plen, held = outs["reused"], outs["prompt_len"], outs["held_before"]
        read = plen - reused
        reread = outs["reread"]
        lcp = outs["lcp"]
        names = np.asarray(self.cause_names, dtype=object)
        cause = names[outs["cause"]]   # codes -> names (`_cause_code`)
        div = np.where(outs["divergence"] >= 0, names[np.maximum(outs["divergence"], 0)],
                       np.where(held == 0, "new_session", "none"))
        eng_rr = outs["engine_reread"]
        cm = self.cost_model
        if cm is not None:
            prefill_s, reread_s = cm.seconds(read, reused), cm.seconds(reread, reused)
        else:
            prefill_s = reread_s = np.full(n, math.nan)
        restored = outs["restored"]
        unit = np.where(restored >= 0, np.char.add("checkpoint ", restored.astype(str)),
                        np.where(reused > 0, "session state", ""))
        reported = patched("reported", col("reused"), pa.int64())
        rep = pc.cast(reported, pa.int64()).to_numpy(zero_copy_only=False)   # float, NaN where none
        has = ~np.isnan(rep)
        rep_i = np.where(has, rep, 0).astype(np.int64)
        diff = reused - rep_i
        base = np.maximum(plen, rep_i)
        with np.errstate(divide="ignore", invalid="ignore"):
            pct = np.where(has & (base > 0), 100.0 * diff / np.where(base > 0, base, 1), math.nan)
        agrees = np.where(base > 0, np.abs(diff) <= 5.0 / 100.0 * base, diff == 0)
        none_i = pa.nulls(n, pa.int64())
        ts = pc.fill_null(col("ts"), math.nan)
        data = {
            "engine": pa.array(np.full(n, "strata", dtype=object), pa.string()),
            "spec": pa.array(np.full(n, self.spec, dtype=object), pa.string()),
            "replica": np.zeros(n, np.int64), "index": np.zeros(n, np.int64), "turn": outs["index"],
            "session": patched("session", col("session"), pa.string()),
            "request_id": patched("request_id", col("request_id"), pa.string()),
            "ts": patched("ts", ts, pa.float64()), "prompt_len": plen, "held_before": held, "lcp_ids": lcp,
            "lcp_text": outs["lcp_text"], "exact": np.minimum(lcp, np.maximum(plen - 1, 0)), "reused": reused,
            "read": read, "reread": reread, "cause": pa.array(cause, pa.string()),
            "divergence": pa.array(div.astype(object), pa.string()),
            "divergence_reread": outs["divergence_reread"], "engine_reread": eng_rr,
            "unit": pa.array(unit.astype(object), pa.string()), "source": none_i, "written": np.zeros(n, np.int64),
            "prefill_s": prefill_s, "reread_s": reread_s, "dollars": np.full(n, math.nan), "reported": reported,
            "reported_by": pa.array(np.where(has, "strata", None), pa.string()),
            "reported_diff": pa.array(diff, pa.int64(), mask=~has), "reported_diff_pct": pct,
            "reported_write": none_i, "reported_prompt": none_i,
            "reported_agrees": pa.array(agrees, pa.bool_(), mask=~has),
            "id_context_held": contexts("id_context_held"), "id_context_prompt": contexts("id_context_prompt"),
            "text_context_held": contexts("text_context_held"),
            "text_context_prompt": contexts("text_context_prompt"),
        }
        arrays = [v if isinstance(v, (pa.Array, pa.ChunkedArray)) else pa.array(v) for v in data.values()]
        arrays = [a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a for a in arrays]
        return pa.RecordBatch.from_arrays(arrays, names=list(data))


def _miss_divergence(m: tuple, lcp: int, width: int) -> Divergence:
    """A Divergence from the core's explanation of a miss (`explain`)."""
    _row, lcp_text, in_token, _read, retok, _cause, before, held_after, prompt_after, held_at, prompt_at, text = m
    d = Divergence(lcp_ids=lcp, lcp_text=lcp_text, byte_in_token=in_token, retokenized=retok)
    set_id_contexts(d, before, held_after, prompt_after, width)
    d.held_ids_at, d.prompt_ids_at = held_at, prompt_at
    if text is not None:
        set_text_contexts(d, *text, width)
    return d


class _PyRows:
    """A batch's rows as `_ROW_COLUMNS` tuples for the calls Python steps: scalar columns converted once per
    batch, id lists sliced from the batch's flat buffers (numpy int32; the suffix, which the walk slices,
    as a list)."""

    def __init__(self, b, lb, lists: dict, perm):
        self.cols = [None if c in lists else b.column(c).to_pylist() for c in _ROW_COLUMNS]
        self.lists = {_ROW_COLUMNS.index(c): v for c, v in lists.items()}
        self.valid = {_ROW_COLUMNS.index(c): lb.column(c).is_valid().to_numpy(zero_copy_only=False)
                      for c in lists}
        self.part = b.column("_part").to_pylist()
        self.rownum = b.column("_row").to_pylist()
        self.perm = perm

    def row(self, i: int) -> tuple:
        r = i if self.perm is None else int(self.perm[i])  # the id lists' row
        out = []
        for j, c in enumerate(self.cols):
            if c is not None:
                out.append(c[i])
            elif not self.valid[j][r]:
                out.append(None)
            else:
                offs, vals = self.lists[j]
                v = vals[offs[r]:offs[r + 1]]
                out.append(v.tolist() if j == _SUFFIX else v)
        return tuple(out)


_SUFFIX = _ROW_COLUMNS.index("suffix_ids")


class _LazyHeld(Sequence):
    """A session's held ids read from the core slice by slice (the context strings read a few windows)."""

    __slots__ = ("core", "code", "n")

    def __init__(self, core, code: int, n: int):
        self.core, self.code, self.n = core, code, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if isinstance(i, slice):
            start, stop, stride = i.indices(self.n)
            if stride != 1:
                return self.core.held_slice(self.code, 0, self.n)[i]
            return self.core.held_slice(self.code, start, stop)
        if i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError("held index out of range")
        return self.core.held_slice(self.code, i, i + 1)[0]


def replay_domain(partitions: list[str], opts, tok, cost_model, progress=None, spec: str = "strata",
                  ends: dict[str, int] | None = None):
    """Replay one cache domain on the C++ core: (seqs, the report's rows as record batches in seq order, peak
    snapshot bytes summed over sessions, recorded prefill ms or None). `ends`: the domain's
    `fast.session_ends` where the caller has them already (None: read here)."""
    dom = _Domain(partitions, opts, tok, cost_model, spec, ends)
    seqs = array("q")
    batches = []
    gc_was_on = gc.isenabled()
    gc.disable()  # the loop makes many small objects and no cycles: the cyclic GC would only rescan them
    try:
        for s, batch in dom.batches(progress):
            seqs.extend(s.tolist())
            batches.append(batch)
    finally:
        if gc_was_on:
            gc.enable()
    return seqs, batches, dom.core.peak_bytes, dom.core.recorded_ms


def numbered(batches):
    """The rows as one table, `index` numbering them in the order given (store order); None: no row."""
    import pyarrow as pa

    if not batches:
        return None
    t = pa.Table.from_batches(batches)
    return t.set_column(t.schema.get_field_index("index"), "index", pa.array(np.arange(t.num_rows, dtype=np.int64)))


def replay_store(store, opts, tok, cost_model, *, spec: str, progress: bool = False,
                 ends: dict[str, int] | None = None):
    """Our engine's replay of a store on the C++ core, in-process (on Dask: `distributed.replay_on_cluster`):
    its rows as the replay report's columns (an Arrow table, in store order; None: no row). `ends`: the
    store's `fast.session_ends` where the caller has them already (`fast.scan_store`; None: read here)."""
    bar = None
    if progress:
        from strata_lab.progress import progress_bar

        bar = progress_bar(total=store.num_rows, desc=f"replay {spec}", unit="call")
    try:
        _seqs, batches, _snap, _ms = replay_domain(store.partitions, opts, tok, cost_model, bar, spec, ends)
    finally:
        if bar is not None:
            bar.close()
    return numbered(batches)
