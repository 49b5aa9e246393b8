"""Store, dump and trace files a careless user or an attacker could hand the readers (issue 34).

Each must be a clear error naming the file (and row and field where there is one), or a skipped line with
file:line, never a hang, a traceback, exhausted memory or wrong lines with exit 0.
"""
from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import warnings

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from strata_lab.dump import Store, convert_jsonl, load_dump
from strata_lab.dump.reader import DumpWarning
from strata_lab.dump.store_check import StoreError

LINES = [
    {"ts": 86400.5, "session": "s", "prompt_ids": [1, 2, 3], "gen_ids": [4], "replica": "a"},
    {"ts": 86401.5, "session": "s", "prompt_ids": [1, 2, 3, 4, 5], "gen_ids": [6], "replica": "a"},
    {"ts": 86402.5, "session": "t", "prompt_ids": [7, 8], "gen_ids": [9], "replica": "a"},
    {"ts": 86403.5, "session": "s", "prompt_ids": [1, 2, 3, 4, 5, 6, 10], "gen_ids": [11], "replica": "a"},
    {"ts": 86404.5, "session": "u", "prompt_ids": [3, 3], "gen_ids": [1], "replica": "b"},
]


@pytest.fixture()
def store(tmp_path):
    src = tmp_path / "d.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in LINES))
    convert_jsonl(src, tmp_path / "st")
    return tmp_path / "st"


def _seg(store, replica="a"):
    return store / "day=1970-01-02" / f"replica={replica}" / "seg-000000.parquet"


def _edit(path, column, fn):
    t = pq.read_table(path)
    i = t.schema.get_field_index(column)
    values = fn(t.column(column).to_pylist())
    t = t.set_column(i, pa.field(column, t.schema.field(i).type), pa.array(values, type=t.schema.field(i).type))
    pq.write_table(t, path)


def _read_all(store):
    return list(Store(store).lines())


def test_the_fixture_store_reads(store):
    assert len(_read_all(store)) == len(LINES)


@pytest.mark.parametrize("column, fn, message", [
    ("parent_call", lambda v: [v[0], -7] + v[2:], "parent_call must be -1 or a row number"),
    ("parent_call", lambda v: [v[0], v[1], v[2], 2], "parent_call 2 is not the previous row of session 's'"),
    ("shared_len", lambda v: [v[0], 9] + v[2:], "shared_len 9 is not within the parent's prompt"),
    ("shared_len", lambda v: [3] + v[1:], "shared_len 3 without a parent_call"),
    ("suffix_ids", lambda v: [[1, -2, 3]] + v[1:], "suffix_ids holds -2"),
    ("prompt_len", lambda v: [4] + v[1:], r"prompt_len 4 is not shared_len 0 \+ 3 suffix ids"),
    ("seq", lambda v: [v[0], v[0]] + v[2:], "seq 0 does not follow 0"),
    ("gen_ids", lambda v: [[-1]] + v[1:], "gen_ids holds -1"),
])
def test_bad_rows_name_file_row_and_field(store, column, fn, message):
    _edit(_seg(store), column, fn)
    with pytest.raises(StoreError, match=message) as err:
        _read_all(store)
    assert "seg-000000.parquet: row" in str(err.value)


def test_fifo_named_like_a_segment_is_refused_not_a_hang(store):
    os.mkfifo(_seg(store).with_name("seg-000001.parquet"))
    with pytest.raises(StoreError, match="seg-000001.parquet: not a regular file"):
        _read_all(store)


def test_garbage_segment_is_named(store):
    _seg(store).with_name("seg-000001.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(StoreError, match="seg-000001.parquet: not a Parquet segment"):
        _read_all(store)


def test_string_seq_is_refused_by_type(store):
    t = pq.read_table(_seg(store))
    t = t.set_column(0, "seq", pa.array([str(x) for x in t.column("seq").to_pylist()]))
    pq.write_table(t, _seg(store))
    with pytest.raises(StoreError, match="column 'seq' is string"):
        _read_all(store)


def test_decompression_bomb_is_refused_before_decoding(store, monkeypatch):
    from strata_lab.dump import store_check
    from strata_lab.dump.store_codec import COLUMNS, arrow_schema

    row = dict.fromkeys(COLUMNS)
    row.update(seq=99, session="z", ts=86405.0, call=0, parent_call=-1, shared_len=0, suffix_ids=[0] * 2_000_000,
               prompt_len=2_000_000, keys="ts,session,prompt_ids")
    bomb = _seg(store, "b").with_name("seg-000001.parquet")
    pq.write_table(pa.Table.from_pylist([row], schema=arrow_schema()), bomb, compression="zstd")
    assert bomb.stat().st_size < 50_000  # small on disk, 8 MB decompressed
    monkeypatch.setattr(store_check, "MAX_SEGMENT_BYTES", 4 << 20)
    with pytest.raises(StoreError, match="seg-000001.parquet: decompresses to .*decompression bomb"):
        _read_all(store)


def test_dictionary_string_bomb_is_refused_before_decoding(store, monkeypatch):
    """A tiny dictionary page (one 256 KB string) referenced by every row: small on disk and in the column
    sizes of the metadata, 16 MB once the strings are read."""
    from strata_lab.dump import store_check
    from strata_lab.dump.store_codec import COLUMNS, arrow_schema

    rows = []
    for k in range(64):
        row = dict.fromkeys(COLUMNS)
        row.update(seq=99 + k, session=f"z{k}", request_id="r" * 262_144, ts=86405.0, call=0, parent_call=-1,
                   shared_len=0, suffix_ids=[1], prompt_len=1, gen_ids=[2], extra='{"replica":"b"}',
                   keys="ts,session,request_id,prompt_ids,gen_ids,replica")
        rows.append(row)
    bomb = _seg(store, "b").with_name("seg-000001.parquet")
    pq.write_table(pa.Table.from_pylist(rows, schema=arrow_schema()), bomb, compression="zstd",
                   use_dictionary=["request_id"])
    md = pq.ParquetFile(bomb).metadata
    rg = md.row_group(0)
    col = next(rg.column(j) for j in range(rg.num_columns) if rg.column(j).path_in_schema == "request_id")
    assert col.has_dictionary_page and col.total_uncompressed_size < 300_000 and bomb.stat().st_size < 20_000
    monkeypatch.setattr(store_check, "MAX_SEGMENT_BYTES", 4 << 20)  # 16 MB of strings: over a 4 MB limit
    with pytest.raises(StoreError, match=r"seg-000001.parquet: its dictionary-encoded strings \(request_id\) "
                       r"expand to over .*decompression bomb"):
        _read_all(store)
    monkeypatch.setattr(store_check, "MAX_SEGMENT_BYTES", 64 << 20)  # within the limit: the rows read
    assert len(_read_all(store)) == len(LINES) + 64


def test_segment_copied_from_another_replica_is_refused(store):
    shutil.copy(_seg(store, "a"), _seg(store, "b").with_name("seg-000001.parquet"))
    with pytest.raises(StoreError, match="belongs to day=1970-01-02/replica=a, not this partition"):
        _read_all(store)


def test_partition_linked_twice_is_refused(store):
    os.symlink(_seg(store, "a").parent, _seg(store, "a").parent.with_name("replica=c"))
    with pytest.raises(StoreError, match="replica=c: a partition must be a directory of the store, not a link"):
        Store(store)


def test_replay_cli_on_a_bad_store_is_one_line(store):
    from strata_lab._spawn import child_process_args

    _edit(_seg(store), "parent_call", lambda v: [v[0], -7] + v[2:])
    r = subprocess.run(**child_process_args(["replay", str(store)]), capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "seg-000000.parquet: row 1: parent_call" in r.stderr


# --- vocabulary: a store read with a tokenizer -------------------------------------------------------------------
@pytest.mark.parametrize("statistics", [True, False])
def test_ids_past_the_vocabulary_refuse_the_store_when_opened(store, statistics):
    """vocab_size 5: row 1's suffix [4, 5] holds 5. Found from the min/max statistics, or, in a segment
    written without them, from the rows; either way when the store is opened, before any record is read."""
    t = pq.read_table(_seg(store))
    pq.write_table(t, _seg(store), write_statistics=statistics)
    with pytest.raises(StoreError, match=r"seg-000000.parquet: row 1: suffix_ids holds 5, not a vocabulary id "
                                         r"in 0\.\.4"):
        Store(store, vocab_size=5)
    with pytest.raises(StoreError, match="row 1: suffix_ids holds 5"):
        load_dump(store, vocab_size=5)  # load_dump hands its vocab_size to a store too
    assert len(Store(store, vocab_size=12).records()) == len(LINES)  # ids 0..11: all within


def test_gen_ids_past_the_vocabulary_name_their_field(store):
    _edit(_seg(store), "gen_ids", lambda v: v[:2] + [[151_936]] + v[3:])
    from strata_lab.text.tokenizer import load_tokenizer

    tok = load_tokenizer("qwen3")
    with pytest.raises(StoreError, match=rf"seg-000000.parquet: row 2: gen_ids holds 151936, not a vocabulary id "
                                         rf"in 0\.\.{tok.embedding_rows - 1}"):
        Store(store, tokenizer=tok)
    assert len(_read_all(store)) == len(LINES)  # without a vocabulary: only the int32 bound


def test_a_model_of_another_family_refuses_the_store(store):
    from strata_lab.text.tokenizer import load_tokenizer

    _edit(_seg(store), "model", lambda v: [None, None, "deepseek-ai/DeepSeek-V3.1", None])
    with pytest.raises(StoreError, match=r"seg-000000.parquet: row 2: model: the store names model "
                                         r"'deepseek-ai/DeepSeek-V3.1' \(deepseek ids\) but the tokenizer is qwen3"):
        Store(store, tokenizer=load_tokenizer("qwen3"))
    _edit(_seg(store), "model", lambda v: ["Qwen/Qwen3-8B"] * 4)
    assert len(Store(store, tokenizer=load_tokenizer("qwen3")).records()) == len(LINES)


def test_replay_and_convert_check_a_store_against_tokenizer(store, tmp_path):
    from strata_lab._spawn import child_process_args

    _edit(_seg(store), "suffix_ids", lambda v: [v[0], [4, 200_000]] + v[2:])
    for argv in (["replay", str(store), "--tokenizer", "qwen3"],
                 ["convert", str(store), "--to-jsonl", "--out", str(tmp_path / "back.jsonl"), "--tokenizer", "qwen3"]):
        r = subprocess.run(**child_process_args(argv), capture_output=True, text=True, timeout=300)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
        assert "seg-000000.parquet: row 1: suffix_ids holds 200000, not a vocabulary id" in r.stderr, r.stderr
        assert not (tmp_path / "back.jsonl").exists()
    r = subprocess.run(**child_process_args(["convert", str(store), "--to-jsonl", "--out", str(tmp_path / "b.jsonl")]),
                       capture_output=True, text=True, timeout=300)
    # no --tokenizer: ids only within int32, but the edited row's raw line (the fixture's lines are not orjson's
    # writing, so each row keeps it) no longer agrees with its columns: refused, not read two ways (issue 52)
    assert r.returncode == 2 and "columns inconsistent" in r.stderr, r.stderr


def test_convert_with_a_vocabulary_skips_jsonl_lines_past_it(tmp_path):
    src = tmp_path / "d.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in LINES))
    with pytest.warns(DumpWarning, match=r"d.jsonl:4: skipped line: prompt_ids\[6\] = 10 is not an id in 0\.\.9"):
        info = convert_jsonl(src, tmp_path / "st", vocab_size=10)
    assert info["lines"] == len(LINES) - 1 and info["skipped"] == 1
    assert [len(r["prompt_ids"]) for r in Store(tmp_path / "st", vocab_size=10)] == [3, 5, 2, 2]


# --- JSONL dumps ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("edit, message", [
    ({"ts": "yesterday"}, "ts must be a finite number"),
    ({"request_id": 47}, "request_id must be a string"),
    ({"prompt_ids": []}, "prompt_ids must not be empty"),
    ({"replica": ["a"]}, "replica must be a string"),
])
def test_bad_dump_fields_are_skipped_with_file_and_line(tmp_path, edit, message):
    f = tmp_path / "d.jsonl"
    f.write_text(json.dumps(LINES[0]) + "\n" + json.dumps({**LINES[1], **edit}) + "\n")
    with pytest.warns(Warning, match=f"d.jsonl:2: skipped bad line: {message}"):
        assert len(load_dump(f).records()) == 1


def test_gzip_dump_reads_like_the_plain_one(tmp_path):
    plain = tmp_path / "d.jsonl"
    plain.write_text("".join(json.dumps(r) + "\n" for r in LINES))
    gz = tmp_path / "z" / "d.jsonl.gz"
    gz.parent.mkdir()
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    assert load_dump(gz).records() == load_dump(plain).records()
    assert load_dump(gz.parent).records() == load_dump(plain).records()  # a folder's .jsonl.gz too
    convert_jsonl(gz, tmp_path / "st")
    assert len(_read_all(tmp_path / "st")) == len(LINES)


def test_other_compressions_and_fifos_are_refused_by_name(tmp_path):
    z = tmp_path / "d.jsonl.zst"
    z.write_bytes(b"\x28\xb5\x2f\xfd")
    with pytest.raises(ValueError, match="d.jsonl.zst: zstd-compressed dumps are not read"):
        load_dump(z)
    fifo = tmp_path / "f.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="f.jsonl: not a regular file"):
        load_dump(fifo)
    with pytest.raises(ValueError, match="not a regular file"):
        convert_jsonl(fifo, tmp_path / "st")


def test_truncated_gzip_is_an_error_naming_the_file(tmp_path):
    gz = tmp_path / "d.jsonl.gz"
    gz.write_bytes(gzip.compress(b"".join(json.dumps(r).encode() + b"\n" for r in LINES * 50))[:-30])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match="d.jsonl.gz: cannot be read past line"):
            load_dump(gz).records()


# --- trace files: deep nesting and one bad entry ------------------------------------------------------------
FIX = __import__("pathlib").Path(__file__).parent / "fixtures" / "traces"


def _trace_calls(path, fmt):
    from strata_lab import load_trace

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        calls = load_trace(path, format=fmt).calls()
    return calls, [str(w.message) for w in caught]


def _deep(n=100_000):
    return "[" * n + "]" * n


def test_malformed_har_entry_does_not_drop_the_later_ones(tmp_path):
    har = json.loads((FIX / "capture.har").read_text())
    entries = har["log"]["entries"]
    good, _ = _trace_calls(FIX / "capture.har", "har")
    text = json.dumps(har)
    first = json.dumps(entries[1])
    # entry 1 becomes invalid JSON (a bare word inside it); 2.. stay valid
    broken = text.replace(first, first[:-1] + ', "x": nonsense}', 1)
    f = tmp_path / "broken.har"
    f.write_text(broken)
    calls, notes = _trace_calls(f, "har")
    assert any("not valid JSON" in n and "still read" in n for n in notes), notes
    lost = 1 if entries[1]["request"]["method"] == "POST" and "answered HTTP" not in str(entries[1]) else 0
    assert len(calls) >= len(good) - lost and len(calls) > 0, (len(calls), len(good), notes)


@pytest.mark.parametrize("fmt", ["har", "sharegpt", "otel"])
def test_deep_nesting_is_skipped_not_a_traceback(tmp_path, fmt):
    if fmt == "har":
        har = json.loads((FIX / "capture.har").read_text())
        deep_entry = '{"request": {"method": "POST", "postData": {"text": ' + json.dumps(_deep(5000)) + '}}, "x": ' \
                     + _deep() + "}"
        text = json.dumps(har).replace('"entries": [', '"entries": [' + deep_entry + ", ", 1)
        f = tmp_path / "deep.har"
    elif fmt == "sharegpt":
        text = "[" + _deep() + ", " + (FIX / "sharegpt.json").read_text().strip()[1:]
        f = tmp_path / "deep.json"
    else:
        text = '{"resourceSpans": ' + _deep() + "}\n" + (FIX / "otel-spans.jsonl").read_text()
        f = tmp_path / "deep.jsonl"
    f.write_text(text)
    calls, notes = _trace_calls(f, fmt)
    good, _ = _trace_calls(FIX / {"har": "capture.har", "sharegpt": "sharegpt.json",
                                  "otel": "otel-spans.jsonl"}[fmt], fmt)
    assert len(calls) == len(good), notes
    assert any("skipped" in n for n in notes), notes
