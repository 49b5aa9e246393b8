"""vLLM server logs that carry prompt token ids: the request logger (``--enable-log-requests``; the ids are
printed at DEBUG since v0.16, at INFO up to v0.10) — ``Received request <id>: prompt: '…', params: …,
prompt_token_ids: [..]`` or ``Request <id> details: prompt: '…', prompt_token_ids: [..]`` — with
``--enable-log-outputs`` lines (``Generated response <id>: output: '…', output_token_ids: [..]``) joined by
request id; and JSON lines of responses made with ``return_token_ids`` (``prompt_token_ids``,
``choices[].token_ids``). Ids cut by ``--max-log-len`` cannot be told apart from a short prompt: set it high.
"""
from __future__ import annotations

import re
from collections import OrderedDict
from datetime import datetime
from typing import Iterator

from strata_lab.traces import openai
from strata_lab.traces.calls import SessionChain, new_call
from strata_lab.traces.source import Source, loads

NAME = "vllm-log"
_REQUEST = re.compile(rb"(?:Received request|Request) (\S+?):? (?:details: )?prompt: .*?prompt_token_ids: \[([\d,\s]*)\]")
_OUTPUT = re.compile(rb"Generated response (\S+?):? .*?output_token_ids: \[([\d,\s]*)\]")
_STAMP = re.compile(rb"^\S*\s*(?:INFO|DEBUG)\s+(\d\d)-(\d\d) (\d\d:\d\d:\d\d)")
_MAX_PENDING = 4096  # requests waiting for their output line before they are emitted without it


def detect_head(head: bytes) -> bool:
    return b"prompt_token_ids" in head and (b"Received request" in head or b"details: prompt" in head
                                            or b'"prompt_token_ids"' in head)


def _ids(raw: bytes) -> list[int]:
    return [int(x) for x in raw.split(b",") if x.strip()]


def _ts(line: bytes) -> float | None:
    m = _STAMP.search(line)
    if not m:
        return None
    # vLLM's stamp has no year; 2000 keeps the order and the gaps, which is what replay needs
    return datetime.strptime(f"2000-{m[1].decode()}-{m[2].decode()} {m[3].decode()}", "%Y-%m-%d %H:%M:%S").timestamp()


def read(src: Source) -> Iterator[dict]:
    chain = SessionChain(src.stem)
    pending: OrderedDict[str, dict] = OrderedDict()

    def ready(force: bool = False) -> Iterator[dict]:
        while pending:
            rid, call = next(iter(pending.items()))
            if not force and call["response_ids"] is None and len(pending) <= _MAX_PENDING:
                return
            del pending[rid]
            call["session"] = chain.session_of_ids(call["prompt_ids"], call["response_ids"] or ())
            yield call

    for lineno, line in src.lines():
        if line.lstrip().startswith(b"{"):
            try:
                rec = loads(line)
                call = openai.from_request(rec.get("request") or {"messages": [{"role": "user", "content": ""}]},
                                           rec.get("response", rec), fmt=NAME)
            except (ValueError, AttributeError) as exc:
                src.skip(lineno, f"JSON line: {exc}")
                continue
            if call["prompt_ids"] is None:
                src.skip(lineno, "JSON line without prompt_token_ids (ask with return_token_ids)")
                continue
            call.update(source=src.where(lineno), prompt_len=len(call["prompt_ids"]), fidelity="ids",
                        messages=call["messages"] if isinstance(rec.get("request"), dict) else None)
            call["session"] = chain.session_of_ids(call["prompt_ids"], call["response_ids"] or ())
            yield from ready(force=True)
            yield call
            continue
        m = _REQUEST.search(line)
        if m:
            ids = _ids(m[2])
            if not ids:
                src.skip(lineno, "empty prompt_token_ids")
                continue
            rid = m[1].decode("utf-8", "replace")
            pending[rid] = new_call(format=NAME, fidelity="ids", request_id=rid, source=src.where(lineno),
                                    ts=_ts(line), prompt_ids=ids, prompt_len=len(ids), prompt_tokens=len(ids))
            yield from ready()
            continue
        m = _OUTPUT.search(line)
        if m:
            call = pending.get(m[1].decode("utf-8", "replace"))
            if call is not None:
                call["response_ids"] = _ids(m[2])
                call["completion_tokens"] = len(call["response_ids"])
            yield from ready()
        elif b"prompt_token_ids: [" in line:
            src.skip(lineno, "prompt_token_ids list not closed on the line (cut by the logger?)")
    yield from ready(force=True)
