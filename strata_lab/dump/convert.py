"""JSONL dumps -> a Parquet store, and back.

>>> import os, tempfile
>>> d = tempfile.mkdtemp()
>>> src = os.path.join(d, "d.jsonl")
>>> with open(src, "wb") as f:
...     _ = f.write(b'{"session":"s","prompt_ids":[1,2]}\\n{"session":"s","prompt_ids":[1,2,5]}\\n')
>>> convert_jsonl(src, os.path.join(d, "store"))["lines"]
2
>>> from strata_lab.dump import Store
>>> list(Store(os.path.join(d, "store")).lines())
[b'{"session":"s","prompt_ids":[1,2]}', b'{"session":"s","prompt_ids":[1,2,5]}']
"""
from __future__ import annotations

import os
import time
import warnings

import orjson

from strata_lab.dump.store_writer import StoreWriter

__all__ = ["convert_jsonl"]


def convert_jsonl(paths, out: str | os.PathLike, *, row_group_rows: int = 8192, progress: bool = False,
                  vocab_size: int | None = None) -> dict:
    """Convert JSONL dump file(s) to a store at `out`; lines the dump reader would skip (torn, not a
    dump line) are skipped with the same `DumpWarning`. Returns lines, skipped, bytes in and out, seconds.

    Args:
        paths: a JSONL dump file or a list of them, in time order.
        out: the store directory to write.
        row_group_rows: calls per Parquet row group.
        progress: show a progress bar.
        vocab_size: lines with ids at or past it are skipped (as the dump reader does with it).
    """
    from strata_lab.dump.reader import DumpWarning, check_dump_path, check_record, dump_lines, open_dump

    if vocab_size is not None and (type(vocab_size) is not int or vocab_size < 1):
        raise ValueError(f"vocab_size must be a positive int or None, got {vocab_size!r}")
    paths = [os.fspath(paths)] if isinstance(paths, (str, os.PathLike)) else [os.fspath(p) for p in paths]
    for p in paths:
        check_dump_path(p)  # regular files only (a FIFO would hang), .gz read, other compressions refused
    t0 = time.perf_counter()
    total = sum(os.path.getsize(p) for p in paths)
    bar = None
    if progress:
        from strata_lab.progress import progress_bar

        bar = progress_bar(total=total, unit="B", unit_scale=True, desc="convert")
    lines = skipped = 0
    with StoreWriter(out, row_group_rows=row_group_rows) as w:
        for p in paths:
            with open_dump(p) as f:
                for lineno, line in enumerate(dump_lines(f), 1):
                    if bar is not None:
                        bar.update(len(line))
                    if not line.strip():
                        continue
                    try:
                        rec = orjson.loads(line)
                        check_record(dict(rec) if isinstance(rec, dict) else rec, vocab_size)
                    except (ValueError, orjson.JSONDecodeError) as exc:
                        skipped += 1
                        warnings.warn(f"{p}:{lineno}: skipped line: {exc}", DumpWarning, stacklevel=2)
                        continue
                    w.write_line(line, rec)
                    lines += 1
    if bar is not None:
        bar.close()
    from strata_lab.dump.store_writer import segment_files

    out_bytes = sum(os.path.getsize(f) for f in segment_files(os.fspath(out)))
    return {"lines": lines, "skipped": skipped, "bytes_in": total, "bytes_out": out_bytes,
            "seconds": time.perf_counter() - t0}
