"""The calls a cache model replays: one `Call` per engine call, taken from a strata-dump/1 `Dump`.

This is the only place that reads dump records into the cache models' form: every source
(`strata_lab.traces.opener.open_calls`: a dump, a store, any log) yields `strata_lab.dump.record.CallRecord`s,
and `calls_from_records` turns those (or their dicts) into `Call`s. Ids become numpy int32 arrays once, so every cache model
compares and hashes them with vectorised operations.

Optional per-call fields read from a dump line (all absent in our own dumps):

| field | meaning |
|---|---|
| `reported_cached_tokens` | what the serving engine reported it served from its cache (docs/CONTRACTS.md, "Reported cache figures"; vLLM `num_cached_tokens`, SGLang `meta_info.cached_tokens`, llama.cpp `timings.cache_n`, OpenAI `cached_tokens`, Anthropic `cache_read_input_tokens`). Older dumps' `cached_tokens` reads the same |
| `reported_cache_write_tokens` | what a hosted API reported it wrote to its cache (Anthropic `cache_creation_input_tokens`); older dumps' `reported_cache_creation_tokens` reads the same |
| `reported_prompt_tokens` | the prompt tokens the log reported for the call (OpenAI `prompt_tokens`; Anthropic input + cache read + cache creation): what the reported figures are a share of |
| `cache_engine` | which engine reported them (`vllm`, `sglang`, `llama.cpp`, `openai`, `anthropic`, ...); a label, shown in `reported_by` |
| `cache_control` | Anthropic breakpoints: token positions where a `cache_control` block ends (the prefix `prompt_ids[:p]`) |
| `content_blocks` | token positions where content blocks end (Anthropic look-back counts these) |
| `cache_salt` | vLLM/SGLang `cache_salt` (or a LoRA name): requests with different salts share nothing |

Without a reported figure, our own dumps' `reused` is the report (engine `strata`).

>>> c = Call(index=0, session="s", prompt=as_ids([1, 2, 3]), output=as_ids([4]))
>>> c.prompt_len, c.sequence().tolist()
(3, [1, 2, 3, 4])
>>> lcp(as_ids([1, 2, 3]), as_ids([1, 2, 9, 9]))
2
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Sequence

import numpy as np

__all__ = ["Call", "calls_from_dump", "calls_from_records", "calls_from_hash_trace", "reported_usage", "as_ids", "lcp",
           "lcp_call", "write_calls", "call_records", "HashBlocks"]

_EMPTY = np.zeros(0, dtype=np.int32)


def as_ids(ids: Sequence[int] | np.ndarray) -> np.ndarray:
    """Token ids as a read-only int32 array (shared, never copied again)."""
    a = np.asarray(ids, dtype=np.int32) if len(ids) else _EMPTY
    a.flags.writeable = False
    return a


def lcp(a: np.ndarray, b: np.ndarray) -> int:
    """Longest common prefix of two id arrays: vectorised, in chunks so an early mismatch stops early."""
    n = min(len(a), len(b))
    i = 0
    step = 4096
    while i < n:
        j = min(i + step, n)
        ne = a[i:j] != b[i:j]
        if ne.any():
            return i + int(ne.argmax())
        i = j
        step *= 4
    return n


def lcp_call(ids: np.ndarray, call: "Call") -> int:
    """Common prefix of `ids` and what `call` left (prompt + output), without concatenating them."""
    n = lcp(ids, call.prompt)
    if n == len(call.prompt) and len(call.output) and n < len(ids):
        n += lcp(ids[n:], call.output)
    return n


@dataclass(eq=False, slots=True)
class Call:
    """One engine call: who sent it, when, the exact prompt ids and the ids the call left behind."""

    index: int                     # position in the trace (file order)
    session: str
    prompt: np.ndarray             # int32 prompt ids
    output: np.ndarray = field(default_factory=lambda: _EMPTY)  # generated + drained ids, in order
    ts: float | None = None        # arrival time, seconds
    done_ts: float | None = None   # when the reply was complete, same clock as ts (the call held its slot till then)
    reported: int | None = None    # cached tokens the serving engine reported for this call
    reported_by: str | None = None  # which engine reported it ("strata" for our dumps' `reused`)
    reported_write: int | None = None  # cache-write tokens a hosted API reported for this call
    reported_prompt: int | None = None  # prompt tokens the log reported for this call (its `reported_prompt_tokens`)
    breakpoints: tuple | None = None  # Anthropic cache_control positions (None: automatic / not given)
    content_blocks: tuple | None = None  # content-block end positions (None: derive from the ids)
    cache_salt: str | None = None
    request_id: str | None = None
    call: int = 0
    prefill_ms: float | None = None
    record: dict | None = None     # the dump line (the strata model replays it)
    memo: np.ndarray | None = field(default=None, repr=False)  # sequence(), built once
    # hash-trace calls: (`HashBlocks` of the trace, this call's row in it); the ids are a function of the
    # trace's blocks, so a block pool may key whole blocks instead of hashing every id
    blocks: tuple | None = field(default=None, repr=False)

    @property
    def prompt_len(self) -> int:
        return len(self.prompt)

    @property
    def held_len(self) -> int:
        """Ids the call leaves in a session's state: prompt + output."""
        return len(self.prompt) + len(self.output)

    def tail(self, start: int) -> np.ndarray:
        """`sequence()[start:]` without building the whole sequence (the output is short, the prompt long)."""
        P = len(self.prompt)
        if start >= P:
            return self.output[start - P:]
        return np.concatenate([self.prompt[start:], self.output]) if len(self.output) else self.prompt[start:]

    def sequence(self) -> np.ndarray:
        """prompt + output: every id the call leaves in a session's state."""
        if self.memo is None:
            self.memo = np.concatenate([self.prompt, self.output]) if len(self.output) else self.prompt
        return self.memo


def _int_tuple(v, name: str, index: int) -> tuple | None:
    if v is None:
        return None
    if not isinstance(v, list) or any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in v):
        raise ValueError(f"call {index}: {name} must be a list of non-negative ints, got {v!r}")
    return tuple(sorted(set(v)))


def _count(rec: dict, names: tuple, index: int) -> int | None:
    for name in names:
        v = rec.get(name)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"call {index}: {name} must be a non-negative int, got {v!r}")
        return v
    return None


def reported_usage(rec: dict, index: int = 0) -> tuple[int | None, str | None, int | None]:
    """(reported cached tokens, who reported them, reported cache-write tokens) of one dump line.

    `reported_cached_tokens` is the field (Contract 4); a line without it falls back to the older
    `cached_tokens`, then to our engine's own `reused` (reported by "strata"). The write figure is
    `reported_cache_write_tokens`, or the older `reported_cache_creation_tokens`.

    >>> reported_usage({"reported_cached_tokens": 64}), reported_usage({"cached_tokens": 3, "cache_engine": "vllm"})
    ((64, None, None), (3, 'vllm', None))
    >>> reported_usage({"reused": 5}), reported_usage({"reported_cache_creation_tokens": 9})
    ((5, 'strata', None), (None, None, 9))
    """
    by = rec.get("cache_engine") if isinstance(rec.get("cache_engine"), str) else None
    reported = _count(rec, ("reported_cached_tokens", "cached_tokens"), index)
    write = _count(rec, ("reported_cache_write_tokens", "reported_cache_creation_tokens"), index)
    if reported is None:
        reused = rec.get("reused")
        if isinstance(reused, int) and not isinstance(reused, bool):
            reported, by = reused, "strata"
    return reported, by, write


def calls_from_records(records: Iterable[dict]) -> Iterator[Call]:
    """`Call`s from strata-dump/1 records (dicts as `Dump` yields them, or `CallRecord`s), in the given order."""
    for i, rec in enumerate(records):
        if not isinstance(rec, dict) and callable(getattr(rec, "to_dict", None)):
            rec = rec.to_dict()  # a CallRecord: its line, once (not a dict built per field read)
        prompt = as_ids(rec["prompt_ids"])
        gen, drained = rec.get("gen_ids") or [], rec.get("drained_ids") or []
        output = as_ids(list(gen) + list(drained)) if gen or drained else _EMPTY
        ts = rec.get("ts")
        ts = float(ts) if isinstance(ts, (int, float)) and not isinstance(ts, bool) and math.isfinite(ts) else None
        done = rec.get("done_ts")
        done = float(done) if isinstance(done, (int, float)) and not isinstance(done, bool) and math.isfinite(done) \
            else None
        if done is not None and (ts is None or done < ts):
            raise ValueError(f"call {i}: done_ts {done} needs a ts at or before it (ts {ts})")
        reported, by, write = reported_usage(rec, i)
        asked = _count(rec, ("reported_prompt_tokens",), i) if reported is not None else None
        t = rec.get("timings") if isinstance(rec.get("timings"), dict) else {}
        ms = t.get("prefill_ms")
        bps = _int_tuple(rec.get("cache_control"), "cache_control", i)
        blocks = _int_tuple(rec.get("content_blocks"), "content_blocks", i)
        for name, pos in (("cache_control", bps), ("content_blocks", blocks)):
            if pos and pos[-1] > len(prompt):
                raise ValueError(f"call {i}: {name} position {pos[-1]} is past the prompt ({len(prompt)} ids)")
        salt = rec.get("cache_salt")
        yield Call(index=i, session=str(rec.get("session", "default")), prompt=prompt, output=output, ts=ts,
                   done_ts=done, reported=reported, reported_by=by, reported_write=write, reported_prompt=asked,
                   breakpoints=bps, content_blocks=blocks,
                   cache_salt=salt if isinstance(salt, str) else None, request_id=rec.get("request_id"),
                   call=int(rec.get("call") or 0),
                   prefill_ms=float(ms) if isinstance(ms, (int, float)) and not isinstance(ms, bool) else None,
                   record=rec)


def calls_from_dump(dump, *, progress: bool = False) -> list[Call]:
    """All calls of a dump (a `Dump`, a path, or paths), in file order; `progress`: a bar over the calls read.

    >>> import os, tempfile
    >>> from strata_lab.dump.writer import Recorder
    >>> path = os.path.join(tempfile.mkdtemp(), "d.jsonl")
    >>> with Recorder(path) as rec:
    ...     rec.write_call(session="s", prompt_ids=[1, 2], reused=0, gen_ids=[3], finish="stop")
    >>> [(c.session, c.prompt.tolist(), c.output.tolist(), c.reported_by) for c in calls_from_dump(path)]
    [('s', [1, 2], [3], 'strata')]
    """
    if isinstance(dump, (list, tuple)) and dump and isinstance(dump[0], Call):
        return list(dump)
    from strata_lab.traces.hashtrace import HashTrace, is_hash_trace, load_hash_trace

    if isinstance(dump, HashTrace):
        return calls_from_hash_trace(dump, progress=progress)
    if isinstance(dump, (str, os.PathLike)) and is_hash_trace(dump):  # a Mooncake / Bailian trace
        return calls_from_hash_trace(load_hash_trace(dump, progress=progress), progress=progress)
    from strata_lab.dump import Dump, load_dump
    from strata_lab.progress import progress_bar

    d = dump if isinstance(dump, Dump) else load_dump(dump)
    return list(progress_bar(calls_from_records(d), enabled=progress, desc="read calls", unit="call"))


class HashBlocks:
    """The blocks of every call of one hash trace, for block pools that key them all at once: per call the
    dense block indexes of prompt + output (`seqs`), the positions they cover (`covered`, the rest are fresh
    output ids) and the ids held (`lengths`, prompt + output); `T` tokens per block. `keys` caches what a
    pool computes from them, per block size."""

    def __init__(self, seqs: list, T: int, covered: np.ndarray, lengths: np.ndarray):
        self.seqs, self.T, self.covered, self.lengths = seqs, T, covered, lengths
        self.keys: dict = {}


def calls_from_hash_trace(trace, *, progress: bool = False) -> list[Call]:
    """`Call`s of a `strata_lab.traces.hashtrace.HashTrace`: synthetic ids as int32 arrays, arrival times,
    sessions, and the blocks (`Call.blocks`) that let block pools key whole blocks."""
    from strata_lab.progress import progress_bar

    it = progress_bar(trace.synth(), enabled=progress, total=len(trace), desc="hash trace", unit="call")
    out, seqs, covered = [], [], []
    ctx = HashBlocks(seqs, trace.block, np.zeros(0, np.int64), np.zeros(0, np.int64))
    for i, (prompt, output, seq, cov) in enumerate(it):
        prompt.flags.writeable = False
        output.flags.writeable = False
        seqs.append(seq)
        covered.append(cov)
        out.append(Call(index=i, session=trace.session[i], prompt=prompt, output=output, ts=float(trace.ts[i]),
                        blocks=(ctx, i)))
    ctx.covered = np.array(covered, np.int64)
    ctx.lengths = np.array([c.held_len for c in out], np.int64)
    return out


def call_records(calls: Iterable[Call]) -> Iterator[dict]:
    """strata-dump/1 line objects of `calls`: a call read from a dump keeps its other fields; the prompt,
    breakpoints and output are the call's own."""
    for c in calls:
        rec = dict(c.record or {})
        rec.update(schema="strata-dump/1", session=c.session, prompt_ids=c.prompt.tolist())
        if c.record is None:
            rec["gen_ids"] = c.output.tolist()
        if c.ts is not None:
            rec["ts"] = c.ts
        if c.done_ts is not None:
            rec["done_ts"] = c.done_ts
        if c.breakpoints is not None:
            rec["cache_control"] = list(c.breakpoints)
        if c.content_blocks is not None:
            rec["content_blocks"] = list(c.content_blocks)
        yield rec


def write_calls(calls: Iterable[Call], path) -> None:
    """Write calls as strata-dump/1 lines through the one dump writer (`strata_lab.dump.writer.write_records`:
    mode 0600, no symbolic link; they hold token ids of private conversations)."""
    from strata_lab.dump.writer import write_records

    write_records(call_records(calls), path)
