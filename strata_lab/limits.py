"""The size limits on what strata_lab reads: one table, checked before any array of that size is made.

A trace, dump or store may come from anywhere, and a few bytes can claim gigabytes (a 90-byte Mooncake line
with ``"output_length": 2000000000``, a 42 KB Parquet segment declaring 300 M ids, a gzip bomb). Every reader
checks the lengths a file declares against these limits first and refuses the file (or skips the line, naming
file:line) with the limit's name; nothing is allocated for a length over its limit.

Each limit can be changed for a run with the environment variable ``STRATA_LIMIT_<NAME>`` (upper case), e.g.
``STRATA_LIMIT_CALL_TOKENS=50000000`` for a trace of 50 M-token prompts. docs/SECURITY.md lists them.

>>> limit("call_tokens")
16777216
>>> limit("call_tokens", {"STRATA_LIMIT_CALL_TOKENS": "1000"})
1000
"""
from __future__ import annotations

import io
import os
from typing import Mapping

__all__ = ["LIMITS", "limit", "check_length", "open_input", "is_gzip"]

# name -> (default, what it bounds)
LIMITS: dict[str, tuple[int, str]] = {
    "call_tokens": (1 << 24, "prompt or output tokens of one call: a hash trace line's input_length and "
                             "output_length, a dump line's id lists, a store row's prompt_len"),
    "trace_tokens": (1 << 28, "prompt + output tokens of one hash trace in all (what import and replay "
                              "synthesise as ids; about 2 GB of JSONL once imported)"),
    "trace_bytes": (8 << 30, "decompressed bytes of one compressed (.gz) trace or log, checked while "
                             "inflating"),
    "text_chars": (4 << 20, "characters of one message's text in a log (a ShareGPT turn, a chat message) "
                            "before it is rendered and tokenized"),
    "segment_ids": (1 << 26, "ids (list values) in one store segment, from its Parquet metadata; the store "
                             "writer starts a new segment before one would hold more"),
    "line_bytes": (256 << 20, "bytes of one JSONL dump line (a longer line is a bad line, never read whole)"),
}


def limit(name: str, environ: Mapping[str, str] | None = None) -> int:
    """The limit `name` (a key of LIMITS): $STRATA_LIMIT_<NAME> when set to a positive int, else the default."""
    default, _ = LIMITS[name]
    env = (os.environ if environ is None else environ).get(f"STRATA_LIMIT_{name.upper()}")
    if env is None or env == "":
        return default
    try:
        value = int(env)
    except ValueError:
        raise ValueError(f"STRATA_LIMIT_{name.upper()} must be a positive int, got {env[:40]!r}") from None
    if value < 1:
        raise ValueError(f"STRATA_LIMIT_{name.upper()} must be a positive int, got {value}")
    return value


def check_length(value: int, name: str, what: str) -> int:
    """`value` when it is within the limit `name`, else a ValueError naming `what`, the value and the limit.

    >>> check_length(2_000_000_000, "call_tokens", "output_length")
    Traceback (most recent call last):
    ...
    ValueError: output_length 2000000000 is over the limit of 16777216 (call_tokens; set STRATA_LIMIT_CALL_TOKENS to change it)
    """
    top = limit(name)
    if value > top:
        raise ValueError(f"{what} {value} is over the limit of {top} ({name}; set STRATA_LIMIT_{name.upper()} to "
                         "change it)")
    return value


GZIP_MAGIC = b"\x1f\x8b"


def is_gzip(path: str) -> bool:
    """Whether the file at `path` is gzip data (its first two bytes), whatever its name."""
    try:
        with open(path, "rb") as f:
            return f.read(2) == GZIP_MAGIC
    except OSError:
        return False


class _Inflated(io.RawIOBase):
    """A gzip stream's decompressed bytes, refused (ValueError naming the file) once past `top` bytes."""

    def __init__(self, path: str, top: int):
        import gzip

        self._gz = gzip.GzipFile(path, "rb")
        self.path, self.top, self.total = path, top, 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        import gzip
        import zlib

        try:
            n = self._gz.readinto(b)
        except (EOFError, zlib.error) as exc:   # truncated or corrupt: an OSError, as gzip's own BadGzipFile
            raise gzip.BadGzipFile(f"{self.path}: not readable gzip data ({exc})") from None
        self.total += n
        if self.total > self.top:
            raise ValueError(f"{self.path}: decompresses to over {self.top} bytes, over the limit (trace_bytes; set "
                             "STRATA_LIMIT_TRACE_BYTES to change it)")
        return n

    def close(self) -> None:
        self._gz.close()
        super().close()


def open_input(path: str | os.PathLike, *, buffering: int = 1 << 20):
    """A trace, log or dump opened for reading bytes: gzip data (named .gz or not) inflated as it is read,
    streamed, its decompressed size checked against `trace_bytes` while inflating; anything else as it is.

    >>> import gzip, os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "t.jsonl.gz")
    >>> with gzip.open(path, "wb") as f:
    ...     _ = f.write(b'{"a": 1}\\n')
    >>> with open_input(path) as f:
    ...     f.read()
    b'{"a": 1}\\n'
    """
    p = os.fspath(path)
    if is_gzip(p):
        return io.BufferedReader(_Inflated(p, limit("trace_bytes")), buffer_size=buffering)
    return open(p, "rb", buffering=buffering)
