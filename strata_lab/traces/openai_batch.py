"""OpenAI Batch API *output* files: one ``{"id", "custom_id", "response": {"status_code", "request_id", "body":
chat.completion}, "error"}`` per line. An output line says nothing of the prompt: given together with the batch's
input file (``{"custom_id", "method", "url", "body"}`` lines, read by the ``openai`` reader), each input line is
joined to its output on ``custom_id`` (usage, reply, request id). Output lines whose input is not among the files
become length-only calls (``prompt_tokens``, cached tokens, the reply), noted; failed lines are skipped.
"""
from __future__ import annotations

from typing import Iterator

from strata_lab.traces import openai
from strata_lab.traces.log_calls import new_call
from strata_lab.traces.dialect import http_error
from strata_lab.traces.source import Source

NAME = "openai-batch"
SESSION_KEY = True


def detect(first: dict) -> bool:
    resp = first.get("response")
    return "custom_id" in first and "body" not in first and "method" not in first and (
        resp is None or isinstance(resp, dict) and ("body" in resp or "status_code" in resp))


def load(src: Source, into: dict) -> None:
    """Read an output file into ``custom_id -> (response, where)`` for the input reader; errors are skipped."""
    for lineno, rec in src.json_lines():
        cid = rec.get("custom_id")
        resp = rec.get("response")
        if cid is None:
            src.skip(lineno, "output line without custom_id")
            continue
        err = rec.get("error")
        detail = err.get("message", err.get("code")) if isinstance(err, dict) else err
        refused = http_error(resp) or (f"error ({detail})" if err else None) \
            or (None if isinstance(resp, dict) else "no response")
        # a failed request is no model call: kept as (None, where, reason) so its input line is skipped too
        into[str(cid)] = (resp, src.where(lineno), src.session_of(rec)) if refused is None else \
            (None, src.where(lineno), refused)


def read(src: Source) -> Iterator[dict]:
    """Output lines not joined to an input line: length-only calls with their usage, in one session per file
    (the requests of a batch share what the hosted cache reports; which one shares what is not logged)."""
    if src.batch is None:
        table: dict = {}
        load(src, table)
    else:  # `Trace` read the output files first; the input lines took theirs
        table = {k: v for k, v in src.batch.items() if v[1].startswith(src.path + ":")}
    for cid, (resp, where, sid) in table.items():
        if resp is None:
            src.skip(int(where.rsplit(":", 1)[1]), f"custom_id {cid!r} failed ({sid}): not a model call")
            continue
        body = resp.get("body") if isinstance(resp.get("body"), dict) else resp
        call = new_call(format=NAME, fidelity="lengths", source=where,
                        notes=["prompt not in the log (pass the batch input file too): lengths only"])
        openai.apply_response(call, body)
        call["request_id"] = cid
        if not isinstance(call["prompt_tokens"], int):
            src.skip(int(where.rsplit(":", 1)[1]), f"custom_id {cid!r}: no usage.prompt_tokens")
            continue
        call["prompt_len"] = call["prompt_tokens"]
        call["session"] = sid or src.stem
        yield call
