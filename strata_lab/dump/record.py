"""`CallRecord`: one engine call, the one record type dumps, stores, traces, cache models and the server share.

Its fields are the store's columns (strata_lab.dump.store_codec.COLUMNS) with the prompt whole instead of
delta-encoded: what a call was asked (`session`, `call`, `ts`, `prompt_ids`), what the engine did (`reused`,
`gen_ids`, `drained_ids`, `checkpoints`, `finish`, `prefill_ms`, `decode_ms`), what a serving engine or API
reported (`reported_cached_tokens`, `reported_cache_write_tokens`), and every other field of the line in
`extra` (kept, in order). `to_dict()` is the strata-dump/1 line (docs/DUMP_FORMAT.md); `from_mapping` reads
one (a `Dump` or `Store` record, a `Trace`'s rendered record). A record also reads like the line's dict
(`rec["prompt_ids"]`, `rec.get("model")`), so code written for dump dicts takes records unchanged.

>>> r = CallRecord.from_mapping({"session": "s", "prompt_ids": [1, 2], "gen_ids": [3], "note": "hi"})
>>> r.session, r.prompt_ids, r.extra, r["note"]
('s', [1, 2], {'note': 'hi'}, 'hi')
>>> CallRecord.from_mapping(r.to_dict()) == r
True
>>> CallRecord.from_mapping({"prompt_ids": [1], "timings": {}}).to_dict()  # a short line: the readers' defaults
{'session': 'default', 'call': 0, 'prompt_ids': [1], 'gen_ids': [], 'drained_ids': [], 'checkpoints': [], 'timings': {}}
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Iterator

__all__ = ["CallRecord", "RECORD_FIELDS"]

SCHEMA = "strata-dump/1"


@dataclass(eq=True)
class CallRecord(Mapping):
    """One engine call (see the module doc). None: the line does not carry the field."""

    session: str = "default"
    prompt_ids: list = field(default_factory=list)
    call: int = 0
    ts: float | None = None
    request_id: str | None = None
    reused: int | None = None
    gen_ids: list = field(default_factory=list)
    drained_ids: list = field(default_factory=list)
    checkpoints: list = field(default_factory=list)
    finish: str | None = None
    prefill_ms: float | None = None
    decode_ms: float | None = None
    schema: str | None = SCHEMA
    model: str | None = None
    reported_cached_tokens: int | None = None
    reported_cache_write_tokens: int | None = None
    extra: dict = field(default_factory=dict)

    # --- the dump line ------------------------------------------------------------------------------
    @classmethod
    def from_mapping(cls, rec: Mapping) -> "CallRecord":
        """A record from a dump line's object (any other field goes to `extra`, in order)."""
        if isinstance(rec, CallRecord):
            return rec
        if not isinstance(rec, Mapping):
            raise ValueError(f"a call record must be a mapping, got {type(rec).__name__}")
        kw: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for k, v in rec.items():
            if k in _COLUMN_NAMES:
                if v is not None or k in _OPTIONAL:
                    kw[k] = v
            elif k == "timings" and isinstance(v, Mapping) and list(v) == ["prefill_ms", "decode_ms"]:
                # the store's rule: exactly these two become columns; any other timings stay as they are
                kw["prefill_ms"], kw["decode_ms"] = v.get("prefill_ms"), v.get("decode_ms")
            else:
                extra[k] = v
        if "schema" not in rec:
            kw["schema"] = None
        if "session" in kw:
            kw["session"] = str(kw["session"])
        return cls(**kw, extra=extra)

    def to_dict(self) -> dict:
        """The strata-dump/1 line's object (the `Recorder`'s key order; fields that are None left out)."""
        out: dict[str, Any] = {}
        for k in _LINE_ORDER:
            if k == "timings":
                if self.prefill_ms is not None or self.decode_ms is not None:
                    out["timings"] = {"prefill_ms": self.prefill_ms, "decode_ms": self.decode_ms}
                continue
            v = getattr(self, k)
            if v is not None:
                out[k] = v
        for k, v in self.extra.items():
            out.setdefault(k, v)
        return out

    # --- read like the line's dict ------------------------------------------------------------------
    def __getitem__(self, key: str) -> Any:
        d = self.to_dict()
        return d[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.to_dict())

    __hash__ = None  # mutable, like the dict it stands for


_COLUMN_NAMES = tuple(f.name for f in fields(CallRecord) if f.name != "extra")
_OPTIONAL = ("ts", "request_id", "reused", "finish", "prefill_ms", "decode_ms", "schema", "model",
             "reported_cached_tokens", "reported_cache_write_tokens")
# the Recorder's key order (strata_lab.dump.writer.Recorder.write_call)
_LINE_ORDER = ("schema", "ts", "request_id", "session", "call", "prompt_ids", "reused", "gen_ids", "drained_ids",
               "finish", "timings", "checkpoints", "model", "reported_cached_tokens", "reported_cache_write_tokens")
RECORD_FIELDS = _COLUMN_NAMES + ("extra",)
