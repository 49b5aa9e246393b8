"""Dumps: one strata-dump/1 record per engine call (docs/DUMP_FORMAT.md).

`writer` appends JSONL lines (`Recorder`) or Parquet row groups (`StoreRecorder`); `reader` reads JSONL
(`load_dump`, which also opens a store directory); the columnar store is `store` (read), `store_writer`,
`store_codec` (delta-encoded prompts) and `convert` (JSONL -> Parquet). `record.CallRecord` is the one typed
call record; `writer` also holds the one file writer (0600, no symbolic link) every dump and store goes through.
`strata_lab.traces.opener.open_calls` opens any dump, store or log as `CallRecord`s.
"""
from __future__ import annotations

from strata_lab.dump.convert import convert_jsonl
from strata_lab.dump.reader import Dump, DumpWarning, load_dump, parse_line
from strata_lab.dump.record import CallRecord
from strata_lab.dump.store import Store, is_store
from strata_lab.dump.store_writer import StoreWarning, StoreWriter
from strata_lab.dump.writer import Recorder, StoreRecorder

__all__ = ["Dump", "DumpWarning", "load_dump", "parse_line", "Recorder", "StoreRecorder", "Store",
           "is_store", "StoreWriter", "StoreWarning", "convert_jsonl", "CallRecord"]
