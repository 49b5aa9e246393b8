"""The columnar trace store: dumps as Parquet, partitioned by day and replica, prompts delta-encoded.

`convert_jsonl(dump, out)` (CLI: ``strata-lab convert dump.jsonl --out dir/``), `Store(dir)` (or
`strata_lab.load_dump(dir)`), `StoreWriter` / `StoreRecorder` to write one directly.
"""
from __future__ import annotations

from strata_lab.store.convert import convert_jsonl
from strata_lab.store.reader import Store, is_store
from strata_lab.store.writer import StoreWarning, StoreWriter

__all__ = ["Store", "is_store", "StoreWriter", "StoreWarning", "convert_jsonl"]
