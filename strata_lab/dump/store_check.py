"""Checking a store's files before anything decodes them: every reader (Store, the fast and native replays)
takes a partition's segments from `check_partition`.

A store directory may come from anywhere (copied, hand-edited, crafted). Before its rows are used:

* partitions are real directories of the store (a symlink, a partition linked in twice, is refused) and
  segments are regular files (a FIFO named like one would hang the reader);
* a segment's metadata is within bounds before any page is decompressed: at most `MAX_SEGMENT_BYTES`
  decompressed (a 5 KB file may claim to inflate to gigabytes; dictionary-encoded strings, a tiny dictionary
  referenced by many rows, are counted at their expanded size from the dictionary and its indices, before
  any string is expanded) and `MAX_SEGMENT_ROWS` rows, with the store's column types (a string `seq` is
  refused, not a traceback);
* every row holds together: `seq` unique and increasing, `parent_call` -1 or an earlier row of the same
  session, `shared_len` within the parent's prompt, `prompt_len` = `shared_len` + len(`suffix_ids`), ids
  non-negative (below `vocab_size` when given), and the row belongs to its partition (its `ts` day and
  `replica` name the directory it sits in: a segment copied from another replica is refused).

With a vocabulary (`Store(root, vocab_size=N)` or `tokenizer=`, `replay --tokenizer`, `convert --tokenizer`),
`check_vocabulary` checks every segment before any row is used: ids in 0..N-1, from the id columns'
min/max statistics where the segment has them (the rows are read only where they do not settle it), and
each model the `model` column names of the tokenizer's family (`Tokenizer.check_model`).

Errors are `StoreError` (a ValueError) naming the file, the row and the field.
"""
from __future__ import annotations

import os

from strata_lab.dump.store_codec import StoreError, check_segment_file

__all__ = ["StoreError", "check_partition", "check_segment_file", "check_vocabulary", "open_segment", "MAX_SEGMENT_BYTES",
           "MAX_SEGMENT_ROWS"]

MAX_SEGMENT_BYTES = 4 << 30     # decompressed bytes of one segment (the writer's are a few MB to ~100 MB)
MAX_SEGMENT_ROWS = 50_000_000
_REQUIRED = ("seq", "parent_call", "shared_len", "suffix_ids", "prompt_len", "keys")


def _check_metadata(path: str, pf) -> None:
    from strata_lab.dump.store_codec import arrow_schema

    md = pf.metadata
    if md.num_rows > MAX_SEGMENT_ROWS:
        raise StoreError(f"{path}: {md.num_rows} rows, over the limit of {MAX_SEGMENT_ROWS} for one segment")
    from strata_lab.limits import limit

    ids, top = 0, limit("segment_ids")
    for i in range(md.num_row_groups):   # the ids the id columns declare, before any page is read
        rg = md.row_group(i)
        ids += sum(rg.column(j).num_values for j in range(rg.num_columns)
                   if rg.column(j).path_in_schema.split(".", 1)[0] in _ID_COLUMNS + ("checkpoints",))
    if ids > top:
        raise StoreError(f"{path}: declares {ids} ids, over the limit of {top} for one segment (segment_ids; set "
                         "STRATA_LIMIT_SEGMENT_IDS to change it)")
    total = 0
    for i in range(md.num_row_groups):
        rg = md.row_group(i)
        # encoded bytes, plus 8 bytes a value: run-length or dictionary encoding may write millions of values
        # in a few bytes, but they take their full size once read
        total += max(rg.total_byte_size, sum(rg.column(j).total_uncompressed_size for j in range(rg.num_columns)))
        total += 8 * sum(rg.column(j).num_values for j in range(rg.num_columns))
    if total > MAX_SEGMENT_BYTES:
        raise StoreError(f"{path}: decompresses to {total} bytes, over the limit of {MAX_SEGMENT_BYTES} for one "
                         "segment (a decompression bomb?)")
    total += _dictionary_strings(path, pf, MAX_SEGMENT_BYTES - total)
    want = arrow_schema()
    have = pf.schema_arrow
    for name in _REQUIRED:
        if have.get_field_index(name) < 0:
            raise StoreError(f"{path}: no {name!r} column (not a strata store segment)")
    for field in have:
        i = want.get_field_index(field.name)
        if i < 0:
            raise StoreError(f"{path}: unknown column {field.name!r}")
        if not field.type.equals(want.field(i).type):
            raise StoreError(f"{path}: column {field.name!r} is {field.type}, the store writes {want.field(i).type}")


def _dictionary_strings(path: str, pf, room: int) -> int:
    """The bytes the dictionary-encoded string columns of a segment take once read, when they may not fit `room`.

    A dictionary page holds each distinct string once and the data pages only small indices into it: a
    1 MB string referenced by a million rows is a few KB on disk and in the metadata's sizes, and a
    terabyte read. A column's worst case is rows x its dictionary's size (the dictionary is within the
    column chunk's uncompressed size); when that may not fit, the column is read dictionary-encoded (the
    dictionary once, an int32 index a row: bounded by the sizes checked above) and the strings' lengths
    are summed over the indices, before any string is expanded (StoreError over the limit)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    md = pf.metadata
    strings = {f.name for f in pf.schema_arrow if pa.types.is_string(f.type) or pa.types.is_binary(f.type)}
    worst, risky = 0, set()
    for i in range(md.num_row_groups):
        rg = md.row_group(i)
        for j in range(rg.num_columns):
            col = rg.column(j)
            if col.path_in_schema in strings and col.has_dictionary_page:
                worst += col.num_values * col.total_uncompressed_size
                risky.add(col.path_in_schema)
    if worst <= room:
        return 0
    try:  # a segment checked before, unchanged since (readers open each segment more than once)
        st = os.stat(path)
        seen = (os.path.realpath(path), st.st_ino, st.st_size, st.st_mtime_ns, room)
    except OSError:
        seen = None
    if seen is not None and seen in _DICTIONARY_CHECKED:
        return _DICTIONARY_CHECKED[seen]
    import pyarrow.parquet as pq

    names = sorted(risky)
    try:
        dict_pf = pq.ParquetFile(path, read_dictionary=names)
        total = 0
        for i in range(md.num_row_groups):
            table = dict_pf.read_row_group(i, columns=names)
            for name in names:
                for chunk in table.column(name).chunks:
                    if not isinstance(chunk, pa.DictionaryArray):
                        total += chunk.nbytes
                        continue
                    lengths = pc.binary_length(chunk.dictionary)
                    total += pc.sum(pc.take(lengths, chunk.indices)).as_py() or 0
            if total > room:
                break
    except (OSError, pa.ArrowException) as exc:
        raise StoreError(f"{path}: not a Parquet segment ({' '.join(str(exc).split())[:200]})") from None
    if total > room:
        raise StoreError(f"{path}: its dictionary-encoded strings ({', '.join(names)}) expand to over {room} "
                         f"bytes, over the limit of {MAX_SEGMENT_BYTES} for one segment (a decompression bomb?)")
    if seen is not None:
        if len(_DICTIONARY_CHECKED) >= 4096:
            _DICTIONARY_CHECKED.pop(next(iter(_DICTIONARY_CHECKED)))
        _DICTIONARY_CHECKED[seen] = total
    return total


_DICTIONARY_CHECKED: dict[tuple, int] = {}  # (path, inode, size, mtime, room) -> expanded bytes, of segments within


def _partition_key(partition: str) -> tuple[str, str]:
    day = os.path.basename(os.path.dirname(partition))[len("day="):]
    return day, os.path.basename(partition)[len("replica="):]


def check_partition(partition: str, *, vocab_size: int | None = None, seen_roots: dict | None = None) -> list[str]:
    """The partition's segment files, in order, after checking them (StoreError on the first problem)."""
    import orjson

    from strata_lab.dump.store_writer import segment_files

    if os.path.islink(partition) or not os.path.isdir(partition):
        raise StoreError(f"{partition}: a partition must be a directory of the store, not a link")
    if seen_roots is not None:
        real = os.path.realpath(partition)
        if real in seen_roots:
            raise StoreError(f"{partition}: the same directory as {seen_roots[real]}")
        seen_roots[real] = partition
    day, replica = _partition_key(partition)
    limit = vocab_size if vocab_size is not None else 2**31
    files = segment_files(partition)
    row = 0
    last_seq = None
    latest: dict = {}          # session -> (row, prompt_len) of its latest row
    cols = ["seq", "session", "ts", "parent_call", "shared_len", "suffix_ids", "prompt_len", "gen_ids",
            "drained_ids", "keys", "extra", "raw", "reused"]
    from strata_lab.limits import limit as size_limit

    max_call = size_limit("call_tokens")
    for f in files:
        pf = open_segment(f)
        present = [c for c in cols if pf.schema_arrow.get_field_index(c) >= 0]
        for i_file, batch in _batches(pf, present):
            data = {c: batch.column(c).to_pylist() if c not in ("suffix_ids", "gen_ids", "drained_ids")
                    else batch.column(c) for c in present}
            for name in ("suffix_ids", "gen_ids", "drained_ids"):
                if name in data:
                    _check_ids(f, i_file, data[name], name, limit)
            for j in range(batch.num_rows):
                at = f"{f}: row {i_file + j}"
                raw, extra = data["raw"][j] if "raw" in data else None, data["extra"][j] if "extra" in data else None
                ts = data["ts"][j] if "ts" in data else None
                rep = None
                if raw is not None or (extra is not None and '"replica"' in extra) or \
                        (ts is None and "ts" in (data["keys"][j] or "").split(",")):
                    try:
                        rec = orjson.loads(raw if raw is not None else extra)
                    except orjson.JSONDecodeError:
                        raise StoreError(f"{at}: {'raw' if raw is not None else 'extra'} is not JSON") from None
                    if not isinstance(rec, dict):
                        raise StoreError(f"{at}: {'raw' if raw is not None else 'extra'} is not a JSON object")
                    rep = rec.get("replica")
                    if ts is None:
                        ts = rec.get("ts")
                from strata_lab.dump.store_codec import partition_of

                where = partition_of({"ts": ts, "replica": rep})
                if where != (day, replica):
                    raise StoreError(f"{at}: the row belongs to day={where[0]}/replica={where[1]}, not this "
                                     f"partition (a segment copied from elsewhere?)")
                seq = data["seq"][j]
                if seq is None or seq < 0:
                    raise StoreError(f"{at}: seq must be an int >= 0, got {seq!r}")
                if last_seq is not None and seq <= last_seq:
                    raise StoreError(f"{at}: seq {seq} does not follow {last_seq} (seqs are unique and increasing)")
                last_seq = seq
                sid = data["session"][j] if "session" in data else None
                parent, shared, plen = data["parent_call"][j], data["shared_len"][j], data["prompt_len"][j]
                suffix = data["suffix_ids"][j]
                n_suffix = None if not suffix.is_valid else len(suffix)
                if plen is None or plen < -1:
                    raise StoreError(f"{at}: prompt_len must be -1 or >= 0, got {plen!r}")
                if plen > max_call:
                    raise StoreError(f"{at}: prompt_len {plen} is over the limit of {max_call} (call_tokens; set "
                                     "STRATA_LIMIT_CALL_TOKENS to change it)")
                if plen >= 0:
                    if parent is None or parent < -1:
                        raise StoreError(f"{at}: parent_call must be -1 or a row number, got {parent!r}")
                    if shared is None or shared < 0:
                        raise StoreError(f"{at}: shared_len must be >= 0, got {shared!r}")
                    if n_suffix is None:
                        raise StoreError(f"{at}: suffix_ids is missing for a prompt of {plen} ids")
                    if plen == 0:
                        raise StoreError(f"{at}: prompt_len 0: an empty prompt is not a call")
                    if parent == -1:
                        if shared != 0:
                            raise StoreError(f"{at}: shared_len {shared} without a parent_call")
                    else:
                        held = latest.get(sid)
                        if held is None or held[0] != parent:
                            raise StoreError(f"{at}: parent_call {parent} is not the previous row of session "
                                             f"{sid!r} in this partition")
                        if not 0 < shared <= held[1]:
                            raise StoreError(f"{at}: shared_len {shared} is not within the parent's prompt of "
                                             f"{held[1]} ids")
                    if plen != shared + n_suffix:
                        raise StoreError(f"{at}: prompt_len {plen} is not shared_len {shared} + {n_suffix} suffix ids")
                    if sid is not None:
                        latest[sid] = (row, plen)
                _agree(at, data, j, plen, raw, rec if raw is not None else None)
                row += 1
    return files


_ID_COLUMNS = ("suffix_ids", "gen_ids", "drained_ids")


def _agree(at: str, data: dict, j: int, plen: int, raw, rec: dict | None) -> None:
    """The columns of one row agree with each other: `reused` within the prompt, `keys` naming the fields the
    row has, and a `raw` line (the row's record as written) holding the same keys, prompt and `reused` as the
    columns (readers take some fields from the columns and some from `raw`: where they differ, the numbers
    would mix two calls, e.g. a negative read)."""
    reused = data["reused"][j] if "reused" in data else None
    keys = data["keys"][j]
    names = keys.split(",") if keys else []
    if reused is not None and plen >= 0 and not 0 <= reused <= plen:
        raise StoreError(f"{at}: reused {reused} is not within the prompt of {plen} ids")
    if raw is None:
        if plen >= 0 and "prompt_ids" not in names:
            raise StoreError(f"{at}: keys {keys!r} do not name prompt_ids, though the row holds a prompt")
        if reused is not None and "reused" not in names:
            raise StoreError(f"{at}: keys {keys!r} do not name reused, though the row's reused column is set")
        return
    if (keys or "") != ",".join(rec):
        raise StoreError(f"{at}: keys {keys!r} are not the keys of its raw line (columns inconsistent)")
    prompt = rec.get("prompt_ids")
    if plen >= 0:
        suffix = data["suffix_ids"][j]
        shared = data["shared_len"][j] or 0
        if not isinstance(prompt, list) or len(prompt) != plen or prompt[shared:] != suffix.as_py():
            raise StoreError(f"{at}: the raw line's prompt_ids are not the {plen} ids of prompt_len / suffix_ids "
                             "(columns inconsistent)")
    if reused is not None and rec.get("reused") != reused:
        raise StoreError(f"{at}: the raw line's reused {rec.get('reused')!r} is not the reused column's {reused} "
                         "(columns inconsistent)")
    r = rec.get("reused")
    n = len(prompt) if isinstance(prompt, list) else plen
    if isinstance(r, int) and not isinstance(r, bool) and n >= 0 and not 0 <= r <= n:
        raise StoreError(f"{at}: the raw line's reused {r} is not within its prompt of {n} ids")


def check_vocabulary(files, vocab_size: int, *, check_model=None) -> None:
    """Every id of the id columns of `files` in 0..vocab_size-1 and, with `check_model` (a callable raising
    ValueError, like Tokenizer.check_model(model, what=...)), every model the rows name agreeing with it
    (StoreError naming the file, row and field, on the first that does not)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    if type(vocab_size) is not int or vocab_size < 1:
        raise ValueError(f"vocab_size must be a positive int, got {vocab_size!r}")
    for f in files:
        pf = open_segment(f)
        md = pf.metadata
        names = [c for c in _ID_COLUMNS if pf.schema_arrow.get_field_index(c) >= 0]
        unsettled = []
        for name in names:  # min/max statistics of the list's elements: no row read when they are within
            for i in range(md.num_row_groups):
                rg = md.row_group(i)
                col = next((rg.column(j) for j in range(rg.num_columns)
                            if rg.column(j).path_in_schema.split(".", 1)[0] == name), None)
                st = col.statistics if col is not None else None
                if col is None or col.num_values == 0:
                    continue
                if st is None or not st.has_min_max or st.min < 0 or st.max >= vocab_size:
                    unsettled.append(name)
                    break
        if unsettled:
            for first, batch in _batches(pf, unsettled):
                for name in unsettled:
                    _check_ids(f, first, batch.column(name), name, vocab_size)
        if check_model is None or pf.schema_arrow.get_field_index("model") < 0:
            continue
        try:
            models = pq.ParquetFile(f, read_dictionary=["model"])
            first = 0
            for i in range(md.num_row_groups):
                for chunk in models.read_row_group(i, columns=["model"]).column("model").chunks:
                    if not isinstance(chunk, pa.DictionaryArray):
                        chunk = pc.dictionary_encode(chunk)
                    for k, model in enumerate(chunk.dictionary.to_pylist()):
                        at = pc.index(chunk.indices, k).as_py()
                        if model is None or at < 0:
                            continue
                        try:
                            check_model(model, what="the store")
                        except ValueError as exc:
                            raise StoreError(f"{f}: row {first + at}: {exc}") from None
                    first += len(chunk)
        except (OSError, pa.ArrowException) as exc:
            raise StoreError(f"{f}: not a Parquet segment ({' '.join(str(exc).split())[:200]})") from None


def open_segment(path: str):
    """A checked segment's ParquetFile (regular file, metadata within bounds, the store's column types)."""
    import pyarrow.parquet as pq

    check_segment_file(path)
    try:
        pf = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow's ArrowInvalid and the like: not a Parquet file
        raise StoreError(f"{path}: not a Parquet segment ({' '.join(str(exc).split())[:200]})") from None
    _check_metadata(path, pf)
    return pf


def _batches(pf, columns, batch_rows: int = 4096):
    n = 0
    for batch in pf.iter_batches(batch_size=batch_rows, columns=columns):
        yield n, batch
        n += batch.num_rows


def _check_ids(path: str, first: int, column, name: str, limit: int) -> None:
    """Every id of a list column in 0..limit-1 (vectorised over the batch)."""
    import pyarrow.compute as pc

    flat = pc.list_flatten(column)
    if not len(flat):
        return
    mm = pc.min_max(flat).as_py()
    if mm["min"] is not None and (mm["min"] < 0 or mm["max"] >= limit):
        bad = pc.or_(pc.less(flat, 0), pc.greater_equal(flat, limit))
        parents = pc.list_parent_indices(column)
        k = pc.index(bad, True).as_py()
        r = parents[k].as_py()
        what = "a vocabulary id" if limit != 2**31 else "an id"
        raise StoreError(f"{path}: row {first + r}: {name} holds {flat[k].as_py()}, not {what} in 0..{limit - 1}")
