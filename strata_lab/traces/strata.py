"""Our own dumps (strata-dump/1): ids-level calls; every field of the line rides along in `extra` so a dump
imported and written back keeps reused, drained ids, checkpoints and timings."""
from __future__ import annotations

from typing import Iterator

from strata_lab.dump import parse_line
from strata_lab.traces.log_calls import new_call
from strata_lab.traces.source import Source

NAME = "strata"


def detect(first: dict) -> bool:
    return str(first.get("schema", "")).startswith("strata-dump/") or (
        isinstance(first.get("prompt_ids"), list) and "reused" in first)


def read(src: Source) -> Iterator[dict]:
    for lineno, line in src.lines():
        try:
            rec = parse_line(line)
        except ValueError as exc:
            src.skip(lineno, str(exc))
            continue
        usage = rec.get("usage") or {}
        yield new_call(format=NAME, fidelity="ids", ts=rec.get("ts"), session=str(rec["session"]),
                       source=src.where(lineno), model=rec.get("model"), request_id=rec.get("request_id"),
                       prompt_ids=rec["prompt_ids"], prompt_len=len(rec["prompt_ids"]),
                       response_ids=rec["gen_ids"], finish=rec.get("finish"),
                       prompt_tokens=usage.get("prompt_tokens"), cached_tokens=rec.get("reused"),
                       extra={k: v for k, v in rec.items() if k not in ("prompt_ids", "gen_ids", "session", "ts",
                                                                         "model", "request_id", "schema")})
