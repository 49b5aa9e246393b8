"""SGLang request logs (``--log-requests --log-requests-level 3``): ``Finish: obj=GenerateReqInput(rid='…', …,
input_ids=[…], …), out={'text': …, 'output_ids': […], 'meta_info': {'prompt_tokens': …, 'cached_tokens': …}}``
in text mode, or a JSON object with ``obj`` / ``out`` per line (``--log-requests-format json``). Level 2 cuts id
lists to ``[head] ... [tail]``: such calls keep only their lengths (fidelity ``lengths``) and say so.

A default log (no ``--log-requests``) has no request ids or content; what it reports per prefill batch is
``Prefill batch. #new-seq: N, #new-token: T, #cached-token: C``. A batch of one new sequence is read as one
length-only call (prompt T + C tokens, C cached), all in one session per file (which request continues which is
not logged); batches of several sequences cannot be split per request and are counted, not read. A prompt
longer than ``--chunked-prefill-size`` is prefilled in chunks, one line each: each chunk reads as a call.
"""
from __future__ import annotations

import re
from typing import Iterator

from strata_lab.traces.log_calls import SessionChain, new_call
from strata_lab.traces.source import Source, loads

NAME = "sglang-log"
_RID = re.compile(rb"rid='([^']*)'")
_INPUT = re.compile(rb"input_ids=\[([\d,\s]*)\](\s*\.\.\.\s*\[)?")
_OUTPUT = re.compile(rb"'output_ids': \[([\d,\s]*)\](\s*\.\.\.\s*\[)?")
_META = {k: re.compile(rb"'" + k.encode() + rb"': (\d+)") for k in ("prompt_tokens", "completion_tokens",
                                                                    "cached_tokens")}


_PREFILL = re.compile(rb"Prefill batch[.,]?\s*#new-seq: (\d+), #new-token: (\d+), #cached-token: (\d+)")
_STAMP = re.compile(rb"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")


def detect_head(head: bytes) -> bool:
    return b"GenerateReqInput(" in head or (b'"input_ids"' in head and b'"meta_info"' in head) \
        or (b"Prefill batch" in head and b"#new-seq" in head) or b"server_args=ServerArgs(" in head


def _prefill(src: Source, lineno: int, line: bytes, m, counts: list) -> dict | None:
    seqs, new, cached = int(m[1]), int(m[2]), int(m[3])
    if seqs != 1:
        counts[0] += 1
        counts[1] += seqs
        return None
    ts = None
    if (t := _STAMP.search(line)) is not None:
        from datetime import datetime

        ts = datetime.strptime(t[1].decode(), "%Y-%m-%d %H:%M:%S").timestamp()
    return new_call(format=NAME, fidelity="lengths", source=src.where(lineno), ts=ts, session=f"{src.stem}-batches",
                    prompt_len=new + cached, prompt_tokens=new + cached, cached_tokens=cached,
                    notes=["default log (no --log-requests): lengths from the prefill batch line; no request id, "
                           "content or completion count; one session per file"])


def _ids(raw: bytes) -> list[int]:
    return [int(x) for x in raw.split(b",") if x.strip()]


def _parse(line: bytes):
    """(rid, input ids, cut?, output ids, meta) from a text or JSON line, or None."""
    if line.lstrip().startswith(b"{"):
        rec = loads(line)
        obj, out = rec.get("obj") or {}, rec.get("out") or {}
        ids, outs = obj.get("input_ids"), out.get("output_ids")
        if not isinstance(ids, list):
            return None
        return str(obj.get("rid") or rec.get("rid")), ids, False, outs or [], out.get("meta_info") or {}
    if b"Finish:" not in line:
        return None
    m = _INPUT.search(line)
    if not m:
        return None
    o = _OUTPUT.search(line)
    rid = _RID.search(line)
    meta = {k: int(r[1]) for k, r in ((k, p.search(line)) for k, p in _META.items()) if r}
    cut = bool(m[2]) or bool(o and o[2])
    return (rid[1].decode() if rid else None), _ids(m[1]), cut, _ids(o[1]) if o else [], meta


def read(src: Source) -> Iterator[dict]:
    chain = SessionChain(src.stem)
    counts = [0, 0]  # prefill batches of several sequences, and their sequences
    head = src.head()
    batches = not (b"GenerateReqInput(" in head or b'"meta_info"' in head)  # request lines win when logged
    n_calls = 0
    for lineno, line in src.lines():
        if batches and b"Prefill batch" in line and (m := _PREFILL.search(line)) is not None:
            call = _prefill(src, lineno, line, m, counts)
            if call is not None:
                n_calls += 1
                yield call
            continue
        try:
            got = _parse(line)
        except ValueError as exc:
            src.skip(lineno, str(exc))
            continue
        if got is None:
            continue  # Receive: lines and other log output
        rid, ids, cut, out, meta = got
        call = new_call(format=NAME, request_id=rid, source=src.where(lineno),
                        prompt_tokens=meta.get("prompt_tokens"), cached_tokens=meta.get("cached_tokens"),
                        completion_tokens=meta.get("completion_tokens"))
        if cut:
            if not isinstance(meta.get("prompt_tokens"), int):
                src.skip(lineno, "ids cut by --log-requests-level 2 and no prompt_tokens")
                continue
            call.update(fidelity="lengths", prompt_len=meta["prompt_tokens"], session=f"{NAME}-cut",
                        notes=["ids cut by --log-requests-level 2 (use level 3)"])
        else:
            call.update(fidelity="ids", prompt_ids=ids, prompt_len=len(ids), response_ids=out,
                        session=chain.session_of_ids(ids, out))
        n_calls += 1
        yield call
    if counts[0]:
        src.facts.append(f"{counts[0]} prefill batches held several new sequences ({counts[1]} requests): their "
                         "#cached-token cannot be split per request, so they are not read as calls")
    if not n_calls:
        src.why_none = ("an SGLang log with no finished request (--log-requests) and no single-sequence prefill "
                        "batch line" + (f"; {src.facts[-1]}" if src.facts else ""))
