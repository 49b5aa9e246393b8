"""One log file as readers see it: its lines (streamed, with a byte-progress bar), a JSON-array stream for logs
that are one big document (ShareGPT, HAR, OTLP dumps), and skip-with-warning naming ``file:line``.

>>> import tempfile, os, warnings
>>> path = os.path.join(tempfile.mkdtemp(), "x.jsonl")
>>> _ = open(path, "w").write('{"a": 1}\\nnot json\\n')
>>> src = Source(path)
>>> with warnings.catch_warnings(record=True) as w:
...     warnings.simplefilter("always")
...     print([rec for _, rec in src.json_lines()])
[{'a': 1}]
>>> str(w[0].message).endswith("x.jsonl:2: skipped: not valid JSON")
True
"""
from __future__ import annotations

import json
import re
import os
import warnings
from typing import Iterator

try:
    from orjson import JSONDecodeError as _DecodeError, loads
except ImportError:  # pragma: no cover - orjson is a core dependency
    from json import JSONDecodeError as _DecodeError, loads

__all__ = ["Source", "TraceWarning", "loads", "warn"]

MAX_WARNINGS_PER_FILE = 20
# a file forced onto a reader (--format) whose first this many records are skipped, with no call read, is
# checked against detection once: another reader that reads it is named, and its further warnings stop
FORCED_CHECK_AFTER = 3


_TOKEN = re.compile(r'["{}\[\]]')
_STRING_END = re.compile(r'(?:[^"\\]|\\.)*"', re.S)
_SCALAR_END = re.compile(r"[,\]]")


def _item_end(buf: str, pos: int) -> int:
    """Where the JSON array item starting at `pos` ends (brackets balanced outside strings), or -1 when the
    buffer does not hold all of it. Iterative: an item nested a million deep is still found.

    >>> _item_end('{"a": [1, "]"]}, 2', 0), _item_end('[[[', 0), _item_end('tru, 1', 0)
    (15, -1, 3)
    """
    if pos >= len(buf) or buf[pos] not in "[{":
        m = _SCALAR_END.search(buf, pos)
        return m.start() if m else -1
    depth, i = 0, pos
    while True:
        m = _TOKEN.search(buf, i)
        if m is None:
            return -1
        c, i = m.group(), m.end()
        if c == '"':
            m = _STRING_END.match(buf, i)
            if m is None:
                return -1
            i = m.end()
        elif c in "[{":
            depth += 1
        else:
            depth -= 1
            if depth == 0:
                return i


class TraceWarning(UserWarning):
    """A log record was skipped (or kept with a caveat); the message names file:line."""


def warn(text: str) -> None:
    """Issue a TraceWarning about the log (its message names file:line). Issued as if from the module
    ``strata_lab.traces`` (line 0): Python's default display then shows no line of our source, and each
    distinct message shows (no per-call-site de-duplication hides the second skipped record)."""
    warnings.warn_explicit(text, TraceWarning, "strata_lab.traces", 0, module="strata_lab.traces")


class Source:
    """A log file being read: `lines()` streams (lineno, bytes); `skip(lineno, why)` warns."""

    def __init__(self, path: str | os.PathLike, *, progress: bool = False, session_key: str | None = None):
        self.path = os.fspath(path)
        if not os.path.isfile(self.path):
            raise FileNotFoundError(f"path: no such log file {self.path}")
        self.progress = progress
        self.skipped = 0
        self.size = os.path.getsize(self.path)
        self.session_key = session_key  # --session-key FIELD.PATH, looked up in each record
        self.key_missing = 0            # records without it (chained instead)
        self.facts: list[str] = []      # what the log reports beyond its calls (aggregate counters)
        self.why_none: str | None = None  # a reader's reason when the file can give no calls
        self.batch: dict | None = None  # OpenAI Batch output responses by custom_id (joined to input lines)
        self.companions: list[str] = []  # files read with this one (a Cline task folder's ui_messages.json)
        self.reader: str | None = None  # the reader's name (`Trace` sets it), for messages that name it
        self.forced = False             # the reader was given (--format), not detected (`Trace` sets it)
        self.calls = 0                  # calls read from the file so far (`Trace` counts them)
        self._quiet = False             # a forced file's warnings stopped once the reader that reads it is named
        # format detection (`Trace` sets registry.detect_format): a file forced onto the wrong reader is told
        # which reader reads it; the readers sit below the registry, so they are handed it, never import it
        self.detect = None
        self.messages_path: str | None = None  # --messages-path: where the generic reader finds message lists
        self._doc_checked = False  # whether a line that is not JSON made us look for one multi-line document

    def detected_as(self) -> tuple[str | None, str | None]:
        """(format, why) that detection gives this file, or (None, None) where it gives none or none was set."""
        if self.detect is None:
            return None, None
        try:
            return self.detect(self)
        except ValueError:
            return None, None

    def session_of(self, rec) -> str | None:
        """The `--session-key` field of a record (None: no key given, or the record lacks it)."""
        if self.session_key is None:
            return None
        from strata_lab.traces.log_calls import field_path

        value = field_path(rec, self.session_key)
        if value is None or value == "":
            self.key_missing += 1
            return None
        return str(value)

    @property
    def stem(self) -> str:
        """The file name without its suffix: the prefix of session keys derived by prefix-chaining."""
        name = os.path.basename(self.path)
        return os.path.splitext(name[:-3] if name.endswith(".gz") else name)[0]

    def elsewhere(self) -> str:
        """For a file forced onto a reader (--format): which reader detection picks instead, as advice to follow
        a line that says its records were skipped ("" when detection picks none or the same one)."""
        if not self.forced:
            return ""
        name, why = self.detected_as()
        if name is None or name == self.reader:
            return ""
        return f"the {name} reader reads it ({why}): leave out --format, or pass --format {name}"

    def skip(self, lineno: int | None, why: str) -> None:
        self.skipped += 1
        if self._quiet:
            return
        if self.skipped <= MAX_WARNINGS_PER_FILE:
            at = f"{self.path}:{lineno}" if lineno is not None else self.path
            warn(f"{at}: skipped: {why}")
        elif self.skipped == MAX_WARNINGS_PER_FILE + 1:
            warn(f"{self.path}: more records skipped; warnings stop here")
        if self.skipped == FORCED_CHECK_AFTER and not self.calls:
            advice = self.elsewhere()
            if advice:
                self._quiet = True
                warn(f"{self.path}: its first {FORCED_CHECK_AFTER} records do not fit the {self.reader} reader; "
                     f"{advice} (no further warnings for this file)")

    def note(self, lineno: int | None, what: str) -> None:
        """A record kept with a caveat the user should know about (e.g. truncated ids)."""
        warn(f"{self.where(lineno)}: {what}")

    def json_objects(self) -> Iterator[tuple[int, dict]]:
        """(line number, object) for a stream of JSON objects written one after another, each over many lines
        (OTel's Python console exporter prints indented spans), read in 1 MiB windows."""
        decoder = json.JSONDecoder()
        bar = self._bar()
        with self.open_text() as f:
            buf, pos, lineno, eof = "", 0, 1, False
            try:
                while True:
                    while pos < len(buf) and buf[pos] in " \t\r\n,":
                        lineno += buf[pos] == "\n"
                        pos += 1
                    if pos >= len(buf):
                        chunk = f.read(1 << 20)
                        if bar is not None:
                            bar.update(len(chunk.encode("utf-8", "replace")))
                        if not chunk:
                            return
                        buf, pos = buf[pos:] + chunk, 0
                        continue
                    try:
                        obj, end = decoder.raw_decode(buf, pos)
                    except RecursionError:  # nested past the parser's stack: skipped, named, not a traceback
                        self.skip(lineno, "not read: nested too deeply")
                        nl = buf.find("\n{", pos + 1)
                        while nl < 0 and not eof:   # resync at the next object that starts a line
                            chunk = f.read(1 << 20)
                            if bar is not None:
                                bar.update(len(chunk.encode("utf-8", "replace")))
                            eof = not chunk
                            buf = buf + chunk
                            nl = buf.find("\n{", pos + 1)
                        if nl < 0:
                            return
                        lineno += buf.count("\n", pos, nl + 1)
                        pos = nl + 1
                        continue
                    except json.JSONDecodeError as exc:
                        chunk = "" if eof else f.read(1 << 20)
                        if bar is not None:
                            bar.update(len(chunk.encode("utf-8", "replace")))
                        if chunk:
                            buf, pos = buf[pos:] + chunk, 0
                            continue
                        eof = True
                        nl = buf.find("\n{", pos + 1)  # resync at the next object that starts a line
                        self.skip(lineno, f"not valid JSON ({exc.msg})")
                        if nl < 0:
                            return
                        lineno += buf.count("\n", pos, nl + 1)
                        pos = nl + 1
                        continue
                    start = lineno
                    lineno += buf.count("\n", pos, end)
                    pos = end
                    if isinstance(obj, dict):
                        yield start, obj
                    else:
                        self.skip(start, f"not a JSON object ({type(obj).__name__})")
            finally:
                if bar is not None:
                    bar.close()

    def where(self, lineno: int | None) -> str:
        return f"{self.path}:{lineno}" if lineno is not None else self.path

    def _bar(self):
        if not self.progress:
            return None
        from strata_lab.progress import progress_bar

        return progress_bar(total=self.size, unit="B", unit_scale=True, desc=os.path.basename(self.path), leave=False)

    def lines(self) -> Iterator[tuple[int, bytes]]:
        """(line number, raw line) for every non-blank line, streamed with a 1 MiB buffer."""
        bar = self._bar()
        try:
            with self.open_binary() as f:
                for lineno, line in enumerate(f, 1):
                    if bar is not None:
                        bar.update(len(line))
                    if line and not line.isspace():  # (strip() would copy every line)
                        yield lineno, line
        finally:
            if bar is not None:
                bar.close()

    def json_lines(self) -> Iterator[tuple[int, dict]]:
        """(line number, object) for each line that is a JSON object; other lines are skipped with a warning."""
        for lineno, line in self.lines():
            rec = self.json_object(lineno, line)
            if rec is not None:
                yield lineno, rec

    def json_object(self, lineno: int, line: bytes) -> dict | None:
        """The line parsed whole, or None when it is not a JSON object (skipped with a warning)."""
        try:
            rec = loads(line)
        except _DecodeError:
            if not self._doc_checked:
                self._doc_checked = True
                self.not_json_lines()
            self.skip(lineno, "not valid JSON" + ("" if line.endswith(b"\n") else " (torn last line)"))
            return None
        if not isinstance(rec, dict):
            self.skip(lineno, f"not a JSON object ({type(rec).__name__})")
            return None
        return rec

    def not_json_lines(self) -> None:
        """A ValueError in one line when the file is one JSON document over many lines (pretty-printed, or an
        array) rather than a JSON object a line: which reader reads it instead, not a warning per line."""
        head = self.head(1 << 22)
        body = head.lstrip()
        if not body.startswith((b"{", b"[")):
            return
        first = body.split(b"\n", 1)[0].strip()
        try:
            loads(first)
            return  # the first line is a whole record: JSON lines with a bad line further on
        except _DecodeError:
            pass
        try:
            json.JSONDecoder().raw_decode(head.decode("utf-8", "replace").lstrip())
        except (ValueError, RecursionError):
            if len(head) == self.size or first not in (b"{", b"[", b"[{"):
                return
        kind = "an array" if body.startswith(b"[") else "one object"
        name, why = self.detected_as()
        reader = f"the {self.reader} reader" if self.reader else "this reader"
        if name is not None and name != self.reader:
            advice = f"the {name} reader reads it ({why}): leave out --format, or pass --format {name}"
        else:
            advice = ("no reader reads it as it is; `strata-lab import --inspect FILE` shows what is in it, and "
                      "--messages-path PATH picks its message lists")
        raise ValueError(f"{self.path}: the file is one JSON document ({kind} over many lines), not a JSON "
                         f"object a line as {reader} reads; {advice}")

    def head(self, n: int = 65536) -> bytes:
        with self.open_binary() as f:
            return f.read(n)

    def open_binary(self):
        """The file's bytes, streamed: gzip data (a `.gz` trace) inflated as it is read, its decompressed size
        checked against the `trace_bytes` limit while inflating (strata_lab.limits.open_input)."""
        from strata_lab.limits import open_input

        return open_input(self.path)

    def open_text(self):
        """`open_binary` decoded as UTF-8 (undecodable bytes replaced)."""
        import io

        return io.TextIOWrapper(self.open_binary(), encoding="utf-8", errors="replace")

    def array_items(self, key: str | None = None) -> Iterator[tuple[int, object]]:
        """Stream the items of a top-level JSON array (or of the array under `key`, found by text search, as in
        a HAR's ``"entries"``) without loading the document: (line number of the item's start, item)."""
        decoder = json.JSONDecoder()
        bar = self._bar()
        with self.open_text() as f:
            buf, pos, lineno, eof = "", 0, 1, False

            def more() -> bool:
                nonlocal buf, pos, eof
                chunk = f.read(1 << 20)
                if bar is not None:
                    bar.update(len(chunk.encode("utf-8", "replace")))
                if not chunk:
                    eof = True
                    return False
                buf = buf[pos:] + chunk
                pos = 0
                return True

            def skip_ws(chars: str) -> None:
                nonlocal pos, lineno
                while True:
                    while pos < len(buf) and buf[pos] in chars:
                        lineno += buf[pos] == "\n"
                        pos += 1
                    if pos < len(buf) or not more():
                        return

            try:
                more()
                if key is not None:  # find '"key"' then its '['
                    needle = json.dumps(key)
                    while True:
                        i = buf.find(needle, pos)
                        if i >= 0:
                            lineno += buf.count("\n", pos, i)
                            pos = i + len(needle)
                            break
                        keep = len(buf) - len(needle)
                        lineno += buf.count("\n", pos, max(keep, pos))
                        pos = max(keep, pos)
                        if not more():
                            return
                    skip_ws(" \t\r\n:")
                else:
                    skip_ws(" \t\r\n")
                if pos >= len(buf) or buf[pos] != "[":
                    self.skip(lineno, "expected a JSON array" + (f" under {key!r}" if key else ""))
                    return
                pos += 1
                while True:
                    skip_ws(" \t\r\n,")
                    if pos >= len(buf) or buf[pos] == "]":
                        return
                    bad = None
                    while True:
                        try:
                            item, end = decoder.raw_decode(buf, pos)
                            break
                        except (json.JSONDecodeError, RecursionError) as exc:
                            why = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
                            end = _item_end(buf, pos)
                            if end >= 0:  # the whole item is here and is not JSON: skip it, read on
                                bad = why
                                break
                            if eof or not more():
                                self.skip(lineno, f"not valid JSON ({why})")
                                return
                    start = lineno
                    if bad is not None:
                        self.skip(start, f"not valid JSON ({bad}); the items after it are still read")
                        lineno += buf.count("\n", pos, end)
                        pos = end
                        continue
                    lineno += buf.count("\n", pos, end)
                    pos = end
                    yield start, item
            finally:
                if bar is not None:
                    bar.close()
