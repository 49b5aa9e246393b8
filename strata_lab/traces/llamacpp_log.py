"""llama.cpp server logs (``llama-server -v`` / ``--log-file``): per slot and task, the prompt length
(``task.n_tokens`` / ``n_prompt_tokens``), ``n_past`` after the cache lookup, ``restored context checkpoint``,
``forcing full prompt re-processing``, and ``prompt eval time = … / N tokens`` (what was actually read); and
JSON responses carrying ``timings`` (``cache_n``, ``prompt_n``, ``predicted_n``). No token ids: calls have
fidelity ``lengths`` with the engine's own cache ground truth (``cached_tokens`` = prompt − tokens evaluated).
"""
from __future__ import annotations

import re
from typing import Iterator

from strata_lab.traces.log_calls import new_call
from strata_lab.traces.source import Source, loads

NAME = "llama.cpp-log"
_SLOT = re.compile(rb"slot\s+\w+: id\s+(\d+) \| task (\d+) \|")
_NPROMPT = re.compile(rb"(?:task\.n_tokens|n_prompt_tokens) = (\d+)")
_NPAST = re.compile(rb"\bn_past = (\d+)")
# newer servers: the cache lookup's result is where the slot's memory is cut (`n_tokens = N, memory_seq_rm [N, end)`,
# older `kv cache rm [N, end)`): the prompt's cached prefix, logged before any timing line (a cancelled task has none)
_SEQ_RM = re.compile(rb"(?:memory_seq_rm|kv cache rm) \[(\d+), end\)")
_PROMPT_EVAL = re.compile(rb"^\s*prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens")
_EVAL = re.compile(rb"^\s*eval time =\s*([\d.]+) ms /\s*(\d+) tokens")


def detect_head(head: bytes) -> bool:
    return (b"slot " in head and (b"n_past" in head or b"prompt eval time" in head or b"n_prompt_tokens" in head
                                  or b"task.n_tokens" in head or b"memory_seq_rm" in head)) or b'"cache_n"' in head


def _emit(task: dict, src: Source) -> dict | None:
    if task.get("n_prompt") is None:
        src.skip(task["line"], f"task {task['task']}: no prompt length logged")
        return None
    notes = []
    if task.get("restored"):
        notes.append("restored context checkpoint")
    if task.get("forced"):
        notes.append("forced full prompt re-processing")
    cached = task["n_prompt"] - task["prompt_n"] if task.get("prompt_n") is not None else task.get("n_past")
    if task.get("prompt_n") is None:
        notes.append("no timing line (cancelled?): cached prefix from the cache lookup, no completion count"
                     if cached is not None else "no timing line and no cache lookup logged: cached tokens unknown")
    return new_call(format=NAME, fidelity="lengths", session=f"slot-{task['slot']}", source=src.where(task["line"]),
                    request_id=f"task-{task['task']}", prompt_len=task["n_prompt"], prompt_tokens=task["n_prompt"],
                    cached_tokens=cached, completion_tokens=task.get("predicted_n"), notes=notes)


def read(src: Source) -> Iterator[dict]:
    tasks: dict[bytes, dict] = {}
    current = None  # the task print_timing talks about
    for lineno, line in src.lines():
        if line.lstrip().startswith(b"{"):
            try:
                rec = loads(line)
            except ValueError as exc:
                src.skip(lineno, f"JSON line: {exc}")
                continue
            t = rec.get("timings") if isinstance(rec, dict) else None
            if not isinstance(t, dict) or not isinstance(t.get("prompt_n"), int):
                src.skip(lineno, "JSON line without timings.prompt_n")
                continue
            cache_n = int(t.get("cache_n") or 0)
            yield new_call(format=NAME, fidelity="lengths", session=f"slot-{rec.get('id_slot', 0)}",
                           source=src.where(lineno), model=rec.get("model"), prompt_len=cache_n + t["prompt_n"],
                           prompt_tokens=cache_n + t["prompt_n"], cached_tokens=cache_n,
                           completion_tokens=t.get("predicted_n"))
            continue
        m = _SLOT.search(line)
        if m:
            key = m[2]
            task = tasks.setdefault(key, {"slot": int(m[1]), "task": int(m[2]), "line": lineno})
            current = task
            if (n := _NPROMPT.search(line)) is not None:
                task["n_prompt"] = int(n[1])
            if b"stop processing" in line:
                done = _emit(tasks.pop(key), src)
                if done is not None:
                    yield done
            elif (n := _NPAST.search(line)) is not None and "prompt_n" not in task:
                task["n_past"] = int(n[1])
            elif (n := _SEQ_RM.search(line)) is not None and "prompt_n" not in task and "n_past" not in task:
                task["n_past"] = int(n[1])
            if b"restored context checkpoint" in line:
                task["restored"] = True
            if b"forcing full prompt re-processing" in line:
                task["forced"] = True
            continue
        if current is not None:
            if (m := _PROMPT_EVAL.search(line)) is not None:
                current["prompt_n"] = int(m[2])
            elif (m := _EVAL.search(line)) is not None:
                current["predicted_n"] = int(m[2])
    for task in tasks.values():
        done = _emit(task, src)
        if done is not None:
            yield done
