"""The on-disk cache of a tokenizer's byte table (issue 31: start-up reads the table instead of rebuilding it).

Building the table (each id's exact bytes) walks the whole vocabulary in Python: over a second for Qwen's
151K ids. `load_tokenizer` gives each tokenizer the path of its cache file; `Tokenizer._bytes_table` reads
it back, or builds the table and writes it once. The file is keyed by the tokenizer file (path, size,
mtime) and by the module that builds tables (vocab.py), so a change to how tables are built never serves a stale one.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

__all__ = ["bytes_cache_path", "cached_table", "read_bytes_cache", "write_bytes_cache"]


def cached_table(tokenizer, path: Path) -> list:
    """`tokenizer`'s byte table from `path`, else built (its `_bytes_table`, with no cache path set) and written."""
    table = read_bytes_cache(path, tokenizer.embedding_rows)
    if table is None:
        table = tokenizer._bytes_table()
        write_bytes_cache(path, table)
    return table


def bytes_cache_path(tokenizer_file: Path, cache_dir: Path, code: Path) -> Path:
    """Where the byte table of `tokenizer_file` is cached in `cache_dir`, keyed by that file and by `code`
    (the module that builds tables)."""
    me, st = Path(code).stat(), Path(tokenizer_file).stat()
    key = hashlib.sha256(f"{Path(tokenizer_file).resolve()}|{st.st_size}|{st.st_mtime_ns}|{me.st_size}|"
                         f"{me.st_mtime_ns}".encode()).hexdigest()[:16]
    return Path(cache_dir) / f"bytes-{key}.npz"


def read_bytes_cache(path: Path, rows: int) -> list | None:
    """The cached table (a list of `rows` bytes), or None when the file is missing, damaged or another size."""
    import numpy as np

    try:
        with np.load(path) as z:
            blob, offs = z["blob"].tobytes(), z["offsets"]
    except (OSError, ValueError, KeyError, EOFError):
        return None
    if len(offs) != rows + 1 or int(offs[-1]) != len(blob):
        return None
    o = offs.tolist()
    return [blob[o[i]:o[i + 1]] for i in range(rows)]


def write_bytes_cache(path: Path, table: list) -> None:
    """Write `table` atomically; a cache dir that cannot be written only costs the rebuild next time."""
    import numpy as np
    from itertools import accumulate

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.stem}.{os.getpid()}.part.npz")
        np.savez(tmp, blob=np.frombuffer(b"".join(table), dtype=np.uint8),
                 offsets=np.fromiter(accumulate(map(len, table), initial=0), dtype=np.int64, count=len(table) + 1))
        os.replace(tmp, path)  # atomic: a concurrent reader never sees half a file
    except OSError:
        pass
