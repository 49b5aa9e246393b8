"""Dumps: one strata-dump/1 line per engine call (docs/DUMP_FORMAT.md), written by `writer`, read by `reader`."""
from __future__ import annotations

from strata_lab.dump.reader import Dump, DumpWarning, load_dump, parse_line
from strata_lab.dump.writer import Recorder, record_to

__all__ = ["Dump", "DumpWarning", "load_dump", "parse_line", "Recorder", "record_to"]
