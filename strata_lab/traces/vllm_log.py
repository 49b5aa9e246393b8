"""vLLM server logs that carry prompt token ids: the request logger (``--enable-log-requests``; the ids are
printed at DEBUG since v0.16, at INFO up to v0.10) — ``Received request <id>: prompt: '…', params: …,
prompt_token_ids: [..]`` or ``Request <id> details: prompt: '…', prompt_token_ids: [..]`` — with
``--enable-log-outputs`` lines (``Generated response <id>: output: '…', output_token_ids: [..]``) joined by
request id; and JSON lines of responses made with ``return_token_ids`` (``prompt_token_ids``,
``choices[].token_ids``). Ids cut by ``--max-log-len`` cannot be told apart from a short prompt: set it high.

A request line whose ``prompt_token_ids`` is ``None`` but whose ``prompt: '…'`` text is there gives a call of
fidelity ``text``: the rendered prompt, encoded with the tokenizer at render time (noted; the text is cut by
``--max-log-len`` too). A default log (no request logging) has no per-request prompts or ids: it gives no calls,
and says what it does report (requests served, the engine-wide prefix cache hit rate).
"""
from __future__ import annotations

import re
from collections import OrderedDict
from datetime import datetime
from typing import Iterator

from strata_lab.traces import openai
from strata_lab.traces.log_calls import TEXT_SLACK, SessionChain, new_call
from strata_lab.traces.source import Source, loads

NAME = "vllm-log"
NO_CACHED = "the request log reports no cached-token count"
_REQUEST = re.compile(rb"(?:Received request|Request) (\S+?):? (?:details: )?prompt: .*?prompt_token_ids: \[([\d,\s]*)\]")
_REQUEST_TEXT = re.compile(rb"(?:Received request|Request) (\S+?):? (?:details: )?prompt: "
                           rb"('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\").*?prompt_token_ids: None")
_OUTPUT_TEXT = re.compile(rb"Generated response (\S+?):? output: ('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")")
_HIT_RATE = re.compile(rb"Prefix cache hit rate: ([\d.]+)%")
_ACCESS = re.compile(rb'"POST /v1/(?:chat/)?completions HTTP')
_ADDED = re.compile(rb"Added request (\S+?)\.?\s*$")
_OUTPUT = re.compile(rb"Generated response (\S+?):? .*?output_token_ids: \[([\d,\s]*)\]")
_STAMP = re.compile(rb"^\S*\s*(?:INFO|DEBUG)\s+(\d\d)-(\d\d) (\d\d:\d\d:\d\d)")
_MAX_PENDING = 4096  # requests waiting for their output line before they are emitted without it


def detect_head(head: bytes) -> bool:
    return (b"prompt_token_ids" in head and (b"Received request" in head or b"details: prompt" in head
                                             or b'"prompt_token_ids"' in head)) \
        or b"Avg prompt throughput" in head or b"Prefix cache hit rate" in head or b"vLLM API server version" in head


def not_this_reader(src: Source, what: str) -> str:
    """Why a file forced onto a reader gives no call when it is not that reader's kind of file at all: what it
    is not, and which reader detection picks for it (or what is in it)."""
    name, why = src.detected_as()
    if name is None:
        return (f"not {what}, and no other reader detects it: `strata-lab import --inspect {src.path}` shows what "
                "is in it")
    return f"not {what}; the {name} reader reads it ({why}): leave out --format, or pass --format {name}"


def _pystr(raw: bytes) -> str | None:
    """A Python string literal as vLLM's logger printed it (repr), or None if it does not parse."""
    import ast

    try:
        value = ast.literal_eval(raw.decode("utf-8", "replace"))
    except (ValueError, SyntaxError):
        return None
    return value if isinstance(value, str) else None


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
    text_chain = SessionChain(f"{src.stem}-text")
    pending: OrderedDict[str, dict] = OrderedDict()

    def ready(force: bool = False) -> Iterator[dict]:
        while pending:
            rid, call = next(iter(pending.items()))
            if not force and call["response_ids"] is None and len(pending) <= _MAX_PENDING:
                return
            del pending[rid]
            if call["fidelity"] == "text":  # chained on characters: the same prefix rule, on the text
                call["session"] = text_chain.session_of_ids(list(map(ord, call["prompt_text"])),
                                                            list(map(ord, call["response_text"] or "")),
                                                            slack=TEXT_SLACK)
            else:
                call["session"] = chain.session_of_ids(call["prompt_ids"], call["response_ids"] or ())
            yield call

    posts, added, rate, n_calls = 0, set(), None, 0
    for lineno, line in src.lines():
        if b"Prefix cache hit rate" in line:
            m = _HIT_RATE.search(line)
            rate = float(m[1]) if m else rate
            continue
        if _ACCESS.search(line):
            posts += 1
            continue
        if b"Added request" in line and (m := _ADDED.search(line.rstrip())) is not None:
            added.add(m[1])
            continue
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
                                    ts=_ts(line), prompt_ids=ids, prompt_len=len(ids), prompt_tokens=len(ids),
                                    notes=[NO_CACHED])
            n_calls += 1
            yield from ready()
            continue
        m = _REQUEST_TEXT.search(line)
        if m:
            text = _pystr(m[2])
            if not text:
                src.skip(lineno, "prompt_token_ids: None and the prompt text does not parse")
                continue
            rid = m[1].decode("utf-8", "replace")
            pending[rid] = new_call(format=NAME, fidelity="text", request_id=rid, source=src.where(lineno),
                                    ts=_ts(line), prompt_text=text,
                                    notes=["prompt_token_ids: None: the logged prompt text is encoded with the "
                                           "tokenizer (ids as that tokenizer gives them; cut if --max-log-len is)",
                                           NO_CACHED])
            n_calls += 1
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
        elif (m := _OUTPUT_TEXT.search(line)) is not None:
            call = pending.get(m[1].decode("utf-8", "replace"))
            if call is not None:
                call["response_text"] = _pystr(m[2])
                call["response_ids"] = []  # nothing more will come for it
            yield from ready()
    yield from ready(force=True)
    if posts or added:
        src.facts.append(f"{max(posts, len(added))} requests served (access / 'Added request' lines)")
    if rate is not None:
        src.facts.append(f"last engine-wide prefix cache hit rate {rate:g}% (not per request)")
    if not n_calls and not (posts or added or rate is not None or detect_head(src.head())):
        src.why_none = not_this_reader(src, "a vLLM log: none of its lines is a vLLM request, access or stats line")
    elif not n_calls:
        src.why_none = ("a default vLLM log: no per-request prompts or ids; start vLLM with --enable-log-requests "
                        "(the ids print at DEBUG from v0.16: VLLM_LOGGING_LEVEL=DEBUG) and --enable-log-outputs"
                        + (f"; it reports {'; '.join(src.facts)}" if src.facts else ""))
