"""Recording, attached above the engine: a `Recorder` is an observer of engine calls.

The engine facade hands each ended call's `CallRecord` to the observers the call started with and knows
nothing of dumps (strata_lab/engine.py). One route records: a recorder observes the calls.

- ``engine.add_observer(Recorder(path))``: that engine's calls (what ``strata-lab serve --dump`` does);
- ``with record_to(path):``: every call, of any engine of this process, that starts while the block runs
  (nested blocks: the innermost records);
- ``STRATA_PROMPT_DUMP=path`` in the environment when strata_lab is imported: every call of the process that
  starts outside a ``record_to`` block (the file is opened on the first call; `start_env_recording` turns it
  on later, `stop_env_recording` off, as a server does that records through its own recorder).

At most one of the last two is a process observer (`strata_lab.engine.add_process_observer`) at a time:
`active()` names it.

>>> import os, tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "calls.jsonl")
>>> with record_to(path) as rec:
...     active() is rec
True
>>> active() is None, rec.closed
(True, True)
"""
from __future__ import annotations

import contextlib
import os
import threading
from typing import Iterator

from strata_lab.dump.writer import ENV_VAR, Recorder, open_recorder
from strata_lab.engine import add_process_observer, remove_process_observer

__all__ = ["record_to", "active", "start_env_recording", "stop_env_recording"]

_lock = threading.RLock()
_installed: list[Recorder] = []       # record_to() stack; the innermost is the process observer
_env: "_EnvRecorder | None" = None    # $STRATA_PROMPT_DUMP recording, when on


class _EnvRecorder:
    """The observer that records to $STRATA_PROMPT_DUMP: its recorder is opened on the first call (again when
    the variable names another path); unset or empty, it records nothing."""

    def __init__(self):
        self._rec: Recorder | None = None
        self._lock = threading.Lock()

    def recorder(self) -> Recorder | None:
        path = os.environ.get(ENV_VAR, "")
        if not path:
            return None
        with self._lock:
            if self._rec is None or self._rec.path != path or self._rec.closed:
                if self._rec is not None:
                    self._rec.close()
                self._rec = open_recorder(path)
            return self._rec

    def __call__(self, record) -> None:
        rec = self.recorder()
        if rec is not None:
            rec(record)

    def close(self) -> None:
        with self._lock:
            if self._rec is not None:
                self._rec.close()
                self._rec = None


def _observer():
    """The process observer recording now (under _lock)."""
    return _installed[-1] if _installed else _env


def _switch(before, after) -> None:
    """Make `after` the process observer in place of `before` (under _lock)."""
    if before is after:
        return
    if before is not None:
        remove_process_observer(before)
    if after is not None:
        add_process_observer(after)


def active() -> Recorder | None:
    """The recorder that calls starting now are written to, or None (recording off): the innermost
    `record_to` block's, else $STRATA_PROMPT_DUMP's when env recording is on."""
    with _lock:
        if _installed:
            return _installed[-1]
        return _env.recorder() if _env is not None else None


@contextlib.contextmanager
def record_to(path: str | os.PathLike) -> Iterator[Recorder]:
    """Record every engine call of this process that starts while the block runs to `path` (a directory: a
    Parquet store, see `strata_lab.dump.writer.StoreRecorder`). The recorder is detached and closed in
    `finally`, also when the block raises."""
    rec = open_recorder(path)
    with _lock:
        before = _observer()
        _installed.append(rec)
        _switch(before, rec)
    try:
        yield rec
    finally:
        try:
            with _lock:
                _installed.remove(rec)
                _switch(rec, _observer())
        finally:
            rec.close()


def start_env_recording() -> None:
    """Record calls that start outside `record_to` blocks to $STRATA_PROMPT_DUMP (strata_lab's import does
    this when the variable is set)."""
    global _env
    with _lock:
        if _env is None:
            before = _observer()
            _env = _EnvRecorder()
            _switch(before, _observer())


def stop_env_recording() -> None:
    """Stop recording to $STRATA_PROMPT_DUMP (closes its file); `record_to` blocks are untouched."""
    global _env
    with _lock:
        if _env is not None:
            env, _env = _env, None
            if not _installed:  # it was the process observer
                remove_process_observer(env)
            env.close()
