"""Dump records <-> columnar rows: prompts delta-encoded against the session's previous call, lossless.

A row keeps the fields every dump line has in typed columns, and the prompt as (`parent_call`,
`shared_len`, `suffix_ids`): `parent_call` is the row number, within the partition (its files in name
order), of the session's previous call, -1 for a full prompt; the prompt is the parent's first `shared_len` ids followed by `suffix_ids`. So a
session's storage grows with its new tokens, not with the square of its length.

Nothing is lost: `keys` keeps the line's key order, `extra` (JSON) every field without a column or whose
value does not have the column's exact type, and `raw` the whole line when orjson would not write it back
byte for byte (other whitespace, escapes); `decode_line(encode(...))` is the original line.

>>> enc = RowEncoder()
>>> line = b'{"session":"s","prompt_ids":[1,2,3],"gen_ids":[4],"note":"hi"}'
>>> row = enc.encode(line, parse(line), seq=0)
>>> row["shared_len"], row["suffix_ids"], row["extra"]
(0, [1, 2, 3], '{"note":"hi"}')
>>> line2 = b'{"session":"s","prompt_ids":[1,2,3,4,5],"gen_ids":[]}'
>>> row2 = enc.encode(line2, parse(line2), seq=1)
>>> row2["parent_call"], row2["shared_len"], row2["suffix_ids"]
(0, 3, [4, 5])
>>> dec = RowDecoder()
>>> [dec.line(r) for r in (row, row2)] == [line, line2]
True
"""
from __future__ import annotations

import datetime as _dt
from array import array
import functools

import orjson

from strata_lab.text.ids import lcp_len

__all__ = ["StoreError", "check_segment_file", "arrow_schema", "COLUMNS", "RowEncoder", "RowDecoder", "parse", "partition_of", "with_defaults"]

_INT32 = 2**31 - 1
# columns: name -> (arrow type name, how a value qualifies)
_ID_LISTS = ("gen_ids", "drained_ids", "checkpoints")
_TYPED = {"session": str, "request_id": str, "finish": str, "schema": str, "model": str}
COLUMNS = ("seq", "session", "request_id", "ts", "call", "parent_call", "shared_len", "suffix_ids", "prompt_len",
           "reused", "gen_ids", "drained_ids", "checkpoints", "finish", "prefill_ms", "decode_ms", "schema", "model",
           "reported_cached_tokens", "reported_cache_write_tokens", "keys", "extra", "raw")
# Contract 4's reported cache figures get int64 columns (a store written before them reads as before: the
# fields are then in `extra`)
_REPORTED = ("reported_cached_tokens", "reported_cache_write_tokens")


@functools.lru_cache(maxsize=None)
def arrow_schema():
    """The Arrow schema of a store file (pyarrow is imported on first use)."""
    import pyarrow as pa

    ids = pa.list_(pa.int32())
    return pa.schema([
        ("seq", pa.int64()), ("session", pa.string()), ("request_id", pa.string()), ("ts", pa.float64()),
        ("call", pa.int64()), ("parent_call", pa.int64()), ("shared_len", pa.int32()), ("suffix_ids", ids),
        ("prompt_len", pa.int32()), ("reused", pa.int64()), ("gen_ids", ids), ("drained_ids", ids),
        ("checkpoints", ids), ("finish", pa.string()), ("prefill_ms", pa.float64()), ("decode_ms", pa.float64()),
        ("schema", pa.string()), ("model", pa.string()), ("reported_cached_tokens", pa.int64()),
        ("reported_cache_write_tokens", pa.int64()), ("keys", pa.string()), ("extra", pa.string()),
        ("raw", pa.string()),
    ])


class StoreError(ValueError):
    """A store file that is not what the writer writes: names the file, row and field."""


def check_segment_file(path: str) -> None:
    """A segment path must be a regular file (not a FIFO, device or directory)."""
    import os
    import stat

    try:
        st = os.stat(path)
    except OSError as exc:
        raise StoreError(f"{path}: cannot read it ({exc.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise StoreError(f"{path}: not a regular file")


def parse(line: bytes):
    """The JSON object of a line (no validation: see strata_lab.dump.parse_line)."""
    return orjson.loads(line)


def _int(v) -> bool:
    return type(v) is int


def _ids_ok(v) -> bool:
    """A list of ints in 0..2**31-1 (checked in C: array('i') rejects floats and overflows)."""
    if type(v) is not list:
        return False
    if not v:
        return True
    try:
        a = array("i", v)
    except (TypeError, OverflowError):
        return False
    return min(a) >= 0 and type(v[0]) is not bool  # (a bool past the first id would read back as an int)


def _float(v) -> bool:
    return type(v) is float


def partition_of(rec: dict) -> tuple[str, str]:
    """(day, replica) of a record: the UTC date of `ts` ("unknown" without one) and the `replica` field
    ("default" without one).

    >>> partition_of({"ts": 0.0, "replica": "r1"}), partition_of({})
    (('1970-01-01', 'r1'), ('unknown', 'default'))
    """
    ts = rec.get("ts")
    day = "unknown"
    if type(ts) in (int, float) and 0 <= ts < 1e11:
        day = _dt.datetime.fromtimestamp(ts, _dt.timezone.utc).strftime("%Y-%m-%d")
    rep = rec.get("replica")
    replica = rep if isinstance(rep, str) and rep and "/" not in rep and rep not in (".", "..") else "default"
    return day, replica


class RowEncoder:
    """Encodes the records of one file in order; remembers each session's previous prompt there."""

    def __init__(self, first_row: int = 0):
        self.rows = first_row
        self._last: dict[str, tuple[int, list]] = {}  # session -> (row, prompt ids)

    def encode(self, line: bytes, rec: dict, *, seq: int) -> dict:
        line = line.rstrip(b"\r\n")
        row = dict.fromkeys(COLUMNS)
        row["seq"] = seq
        extra = {}
        for k, v in rec.items():
            if k in _TYPED and type(v) is _TYPED[k]:
                row[k] = v
            elif k == "ts" and _float(v):
                row[k] = v
            elif k in ("call", "reused", *_REPORTED) and _int(v) and abs(v) <= 2**62:
                row[k] = v
            elif k in _ID_LISTS and _ids_ok(v):
                row[k] = v
            elif k == "timings" and type(v) is dict and list(v) == ["prefill_ms", "decode_ms"] \
                    and _float(v["prefill_ms"]) and _float(v["decode_ms"]):
                row["prefill_ms"], row["decode_ms"] = v["prefill_ms"], v["decode_ms"]
            elif k == "prompt_ids" and type(v) is list:
                pass  # delta-encoded below (its new ids checked there)
            else:
                extra[k] = v
        row["keys"] = ",".join(rec)
        if any("," in k for k in rec):
            row["raw"] = line.decode("utf-8")
        prompt = rec.get("prompt_ids")
        sid = row["session"]
        row["parent_call"], row["shared_len"], row["prompt_len"] = -1, 0, -1
        if "prompt_ids" not in extra and prompt is not None:
            prev = self._last.get(sid) if sid is not None else None
            shared = 0
            if prev is not None:
                shared = lcp_len(prompt, prev[1])  # the parent's ids were checked when it was encoded
            suffix = prompt[shared:] if shared > 0 else prompt
            if _ids_ok(suffix):
                row["parent_call"] = prev[0] if shared > 0 else -1
                row["shared_len"] = shared
                row["suffix_ids"] = suffix
                row["prompt_len"] = len(prompt)
                if sid is not None:
                    self._last[sid] = (self.rows, prompt)
            else:
                extra["prompt_ids"] = prompt  # not ids the columns hold: kept as they are
        row["extra"] = orjson.dumps(extra).decode() if extra else None
        if row["raw"] is None and orjson.dumps(rec) != line:
            row["raw"] = line.decode("utf-8")  # not orjson's own writing: keep the bytes
        self.rows += 1
        return row


class RowDecoder:
    """Decodes the rows of one file in order (parents come before their children)."""

    def __init__(self):
        self._prompts: dict[int, list] = {}   # row -> prompt, for rows a later row may name as parent
        self._session_row: dict[str, int] = {}
        self.rows = 0   # rows of the partition decoded so far

    def prompt(self, row: dict) -> list | None:
        if row["prompt_len"] is None or row["prompt_len"] < 0:
            return None
        p = row["parent_call"]
        prompt = row["suffix_ids"] if p < 0 else self._prompts[p][:row["shared_len"]] + row["suffix_ids"]
        sid = row["session"]
        if sid is not None:  # only a session's latest prompt can be a parent: keep just that one
            old = self._session_row.get(sid)
            if old is not None:
                self._prompts.pop(old, None)
            self._session_row[sid] = self.rows
            self._prompts[self.rows] = prompt
        return prompt

    def record(self, row: dict) -> dict:
        """The line's JSON object, keys in their original order."""
        prompt = self.prompt(row)
        self.rows += 1
        if row["raw"] is not None:
            return orjson.loads(row["raw"])
        extra = orjson.loads(row["extra"]) if row["extra"] else {}
        rec = {}
        for k in row["keys"].split(",") if row["keys"] else ():
            if k in extra:
                rec[k] = extra[k]
            elif k == "prompt_ids":
                rec[k] = prompt
            elif k == "timings":
                rec[k] = {"prefill_ms": row["prefill_ms"], "decode_ms": row["decode_ms"]}
            else:
                rec[k] = row.get(k)
        return rec

    def line(self, row: dict) -> bytes:
        rec = self.record(row)
        return row["raw"].encode("utf-8") if row["raw"] is not None else orjson.dumps(rec)


_DEFAULTS = (("gen_ids", list), ("drained_ids", list), ("checkpoints", list), ("timings", dict))


def with_defaults(rec: dict) -> dict:
    """The defaults strata_lab.dump.parse_line gives a record (empty id lists, session "default", call 0)."""
    for name, kind in _DEFAULTS:
        if rec.get(name) is None:
            rec[name] = kind()
    rec.setdefault("session", "default")
    rec.setdefault("call", 0)
    return rec
