"""Production hash-block traces (Mooncake, Qwen-Bailian): readers on hand-written fixtures, synthetic ids,
every cache model on them, the vLLM block-level path against the id-level one, the done-when checks against
an independent LRU over the hash ids, and time/concurrency in the replay."""
from __future__ import annotations

import dataclasses
import glob
import json
import warnings
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest

import strata_lab as sl
from strata_lab.caches.call_ids import Call, as_ids, calls_from_dump, calls_from_hash_trace
from strata_lab.traces import TraceWarning
from strata_lab.traces.hashtrace import MooncakeShape, generate_mooncake, load_hash_trace, write_hash_trace

FIX = Path(__file__).parent / "fixtures" / "traces"
ROOT = Path(__file__).parent.parent
ENGINES = ["vllm", "sglang", "llama.cpp", "trtllm", "openai", "anthropic", "gemini"]

pytestmark = pytest.mark.filterwarnings("ignore::strata_lab.traces.source.TraceWarning")


def lru_reference(trace, capacity_tokens):
    """The done-when's independent LRU over hash ids: leading cached blocks x T, capped at input_length; a
    request's blocks are touched tail first (its prefix stays longest)."""
    T = trace.block
    cap = None if capacity_tokens is None else capacity_tokens // T
    cache: OrderedDict = OrderedDict()
    hit = 0
    for r in trace.records:
        k = 0
        for h in r["hash_ids"]:
            if h not in cache:
                break
            k += 1
        hit += min(k * T, r["input_length"])
        for h in reversed(r["hash_ids"]):
            cache[h] = None
            cache.move_to_end(h)
        while cap is not None and len(cache) > cap:
            cache.popitem(last=False)
    return hit / trace.prompt_tokens


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    path = tmp_path_factory.mktemp("hash") / "mooncake.jsonl"
    write_hash_trace(generate_mooncake(MooncakeShape(requests=1500, seed=3)), path, "mooncake")
    return load_hash_trace(path)


# -- readers -----------------------------------------------------------------------------------------------
def test_detection_and_skips_name_file_and_line():
    for name in ("mooncake", "bailian"):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            trace = sl.load_trace(FIX / f"{name}.jsonl")
            calls = trace.calls()
        assert trace.detected[str(FIX / f"{name}.jsonl")][0] == name
        assert len(calls) == 6
        msgs = [str(x.message) for x in w if issubclass(x.category, TraceWarning)]
        assert msgs and all(f"{name}.jsonl:" in m for m in msgs)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        load_hash_trace(FIX / "mooncake.jsonl")
    text = " ".join(str(x.message) for x in w)
    assert "mooncake.jsonl:5" in text and "input_length 1300 needs 3 blocks" in text
    assert "mooncake.jsonl:8" in text and "torn" in text


def test_mooncake_ids_blocks_partial_and_outputs():
    t = load_hash_trace(FIX / "mooncake.jsonl")
    assert t.format == "mooncake" and t.block == 512
    calls = calls_from_hash_trace(t)
    assert [c.prompt_len for c in calls] == [1300, 1536, 700, 2100, 1300, 512]
    assert [len(c.output) for c in calls] == [40, 12, 5, 80, 33, 1]
    assert [c.ts for c in calls] == [0.0, 0.25, 0.9, 1.2, 1.85, 2.4]     # ms -> s
    a, b, d, e = calls[0], calls[1], calls[3], calls[4]
    # equal leading hashes: equal ids; the first different block shares nothing
    assert (a.prompt[:1024] == b.prompt[:1024]).all() and not np.isin(b.prompt[1024:], a.prompt[1024:]).any()
    assert (d.prompt[:1536] == b.prompt).all()
    # the exact repeat: same ids, including its partial last block (truncated to input_length)
    assert (e.prompt == a.prompt).all()
    # collision-free: distinct blocks share no id; outputs are fresh (held by no prompt nor other output)
    everything = np.concatenate([c.prompt for c in calls] + [c.output for c in calls])
    blocks = {}
    for c, r in zip(calls, t.records):
        for i, h in enumerate(r["hash_ids"]):
            blocks.setdefault(h, set()).update(c.prompt[i * 512:(i + 1) * 512].tolist())
    ids = list(blocks.values())
    assert all(not (x & y) for i, x in enumerate(ids) for y in ids[i + 1:])
    outs = np.concatenate([c.output for c in calls])
    assert len(set(outs.tolist())) == len(outs)
    assert not np.isin(outs, np.concatenate([c.prompt for c in calls])).any()
    assert everything.dtype == np.int32 and everything.min() >= 0


def test_bailian_sessions_from_chat_chains():
    t = load_hash_trace(FIX / "bailian.jsonl")
    assert t.format == "bailian" and t.block == 16
    assert t.session == ["chat-101", "chat-102", "chat-101", "chat-101", "chat-99", "chat-107"]
    df = t.to_frame()
    assert df["type"].tolist() == ["text", "search", "text", "text", "image", "file"]
    calls = calls_from_hash_trace(t)
    # chat 103 continues 101: two shared blocks of 16
    assert (calls[2].prompt[:32] == calls[0].prompt[:32]).all() and calls[2].prompt[32] != calls[0].prompt[32]
    frame = sl.load_trace(FIX / "bailian.jsonl").to_frame()
    assert frame["session"].tolist() == t.session
    assert frame["call"].tolist() == [0, 0, 1, 2, 0, 0]


def test_trace_table_and_dump_keep_the_ids(tmp_path):
    trace = sl.load_trace(FIX / "mooncake.jsonl")
    dump = trace.to_dump(out=tmp_path / "d.jsonl")
    recs = dump.records()
    direct = calls_from_hash_trace(load_hash_trace(FIX / "mooncake.jsonl"))
    assert [r["prompt_ids"] for r in recs] == [c.prompt.tolist() for c in direct]
    assert [r["gen_ids"] for r in recs] == [c.output.tolist() for c in direct]
    assert all(r["trace_format"] == "mooncake" for r in recs)


@pytest.mark.parametrize("name", ["mooncake", "bailian"])
def test_every_engine_model_runs_unchanged(name):
    engines = ENGINES + ["anthropic:min_tokens=16", "openai:min_tokens=16,granularity=16", "llama.cpp:slots=2",
                         "sglang:page_size=16", "vllm:model=qwen3-next-80b-a3b"]
    rep = sl.replay_engines(FIX / f"{name}.jsonl", engines)
    s = rep.summary()
    assert len(s) == len(engines) and (s["calls"] == 6).all()
    assert (s["reused"] <= s["prompt_tokens"]).all()
    by = dict(zip(s["spec"], s["reused"]))
    # block pools find the shared prefixes: mooncake calls 1, 3 and 4 share 2, 3 and 2 full blocks
    if name == "mooncake":
        frame = rep.frame()
        v = frame[frame["engine"] == "vllm"]["reused"].tolist()
        assert v[:2] == [0, 1024] and v[3] == 1536 and v[4] >= 1024
    assert by["sglang@0.5"] > 0 and by["trtllm@1.0"] > 0


# -- the block-level path gives the id-level numbers ---------------------------------------------------------
@pytest.mark.parametrize("spec", ["vllm", "vllm:block_size=512", "vllm:block_size=32,kv_tokens=3000000",
                                  "vllm:kv_tokens=400000", "vllm:kv_tokens=1000000,cache_output=false"])
def test_vllm_block_keys_equal_id_keys(generated, spec):
    calls = calls_from_hash_trace(generated)[:600]
    plain = [dataclasses.replace(c, blocks=None) for c in calls]
    a = sl.replay_engines(calls, [spec]).frame()
    b = sl.replay_engines(plain, [spec]).frame()
    assert a["reused"].tolist() == b["reused"].tolist()
    assert a["cause"].astype(str).tolist() == b["cause"].astype(str).tolist()
    assert a["reused"].sum() > 0


def test_vllm_refuses_mixed_keying():
    t = calls_from_hash_trace(load_hash_trace(FIX / "mooncake.jsonl"))
    other = Call(99, "x", as_ids(range(40)))
    with pytest.raises(ValueError, match="cannot share one vLLM replay"):
        sl.replay_engines(t + [other], ["vllm"])


# -- done when: equal to an independent LRU over the hash ids ----------------------------------------------
def test_unbounded_hit_rate_equals_lru_over_hash_ids(generated):
    ref = lru_reference(generated, None)
    for spec in ("vllm", "vllm:block_size=512"):
        hit = float(sl.replay_engines(generated, [spec]).summary()["hit_rate"].iloc[0])
        assert abs(hit - ref) < 0.01, (spec, hit, ref)
    assert 0.2 < ref < 0.9


@pytest.mark.parametrize("capacity", [3_000_000, 50_000_000, 1_000_000])
def test_bounded_hit_rate_within_2pp_of_lru(generated, capacity):
    ref = lru_reference(generated, capacity)
    hit = float(sl.replay_engines(generated, [f"vllm:kv_tokens={capacity}"]).summary()["hit_rate"].iloc[0])
    assert abs(hit - ref) < 0.02, (capacity, hit, ref)
    if capacity < generated.prompt_tokens:   # the bound bites: a real eviction test, not the unbounded case
        assert ref < lru_reference(generated, None) - 0.02


# -- time and concurrency --------------------------------------------------------------------------------
@pytest.mark.parametrize("dump", sorted(glob.glob(str(ROOT / "dumps" / "*.jsonl"))))
def test_sequential_replay_unchanged_by_the_time_machinery(dump):
    engines = ENGINES + ["strata", "vllm:kv_tokens=256", "sglang:max_total_tokens=300", "trtllm:kv_tokens=512",
                         "llama.cpp:slots=2", "sglang:model=qwen3-next-80b-a3b,mamba_slots=2"]
    seq = sl.replay_engines(dump, engines)
    # the pre-existing protocol, by hand: advance, plan, admit per call in arrival order
    calls = calls_from_dump(dump)
    by_hand = []
    from strata_lab.caches.replay import _order, explain_calls
    order = _order(calls)
    hints = explain_calls(calls, None, order)
    for e in engines:
        m = sl.parse_engine(e).build()
        by_hand += [m.step(calls[i], hints[i][0]).reused for i in order]
    assert seq.frame()["reused"].tolist() == by_hand
    # with time: calls that end the instant they start replay exactly as sequential ones
    if all(c.ts is not None for c in calls):
        inst = sl.replay_engines(dump, engines, concurrency=True, tokens_per_s=float("inf"))
        assert inst.to_json() == seq.to_json()


def _pin_calls():
    a = Call(0, "a", as_ids(range(12)), as_ids([500]), ts=0.0)
    b = Call(1, "b", as_ids(range(100, 108)), as_ids([501]), ts=1.0)
    c = Call(2, "c", as_ids(list(range(12)) + [7]), as_ids([502]), ts=50.0)
    return [a, b, c]


def test_in_flight_blocks_are_pinned_vllm():
    spec = "vllm:block_size=4,kv_blocks=5"   # 4 usable blocks: vLLM keeps one as its null block
    seq = sl.replay_engines(_pin_calls(), [spec]).frame()["reused"].tolist()
    conc = sl.replay_engines(_pin_calls(), [spec], concurrency=True, tokens_per_s=(1.0, 1.0)).frame()
    # sequentially b evicts a's tail block; with a still running (12 s of prefill) b cannot, so c finds all of a
    assert seq == [0, 0, 8]
    assert conc["reused"].tolist() == [0, 0, 12]


@pytest.mark.parametrize("spec", ["sglang:max_total_tokens=16", "trtllm:tokens_per_block=2,kv_blocks=8"])
def test_in_flight_paths_are_locked_sglang_trtllm(spec):
    x = list(range(10))
    calls = [Call(0, "0", as_ids(x), as_ids([500]), ts=0.0),
             Call(1, "a", as_ids(x + [20]), as_ids(range(600, 650)), ts=20.0),    # hits x, then decodes 50 s
             Call(2, "b", as_ids(range(100, 108)), as_ids([501]), ts=21.0),       # done at 30 s: needs room
             Call(3, "c", as_ids(x + [30]), ts=200.0)]
    seq = sl.replay_engines(calls, [spec]).frame()["reused"].tolist()
    conc = sl.replay_engines(calls, [spec], concurrency=True, tokens_per_s=(1.0, 1.0)).frame()["reused"].tolist()
    # sequentially b evicts x once a is done; while a runs, the path it reuses is locked: x survives b
    assert seq[1] == conc[1] == 10 and seq[3] < 10
    assert conc[3] == 10


def test_ttl_runs_on_the_trace_clock_from_the_end_of_the_call():
    ids = list(range(1300))
    calls = [Call(0, "s", as_ids(ids), as_ids([1]), ts=0.0), Call(1, "s", as_ids(ids + [5]), ts=650.0)]
    seq = sl.replay_engines(calls, ["openai"]).frame()
    conc = sl.replay_engines(calls, ["openai"], concurrency=True, tokens_per_s=(13.0, 1.0)).frame()
    assert seq["reused"].tolist() == [0, 0] and seq["cause"].astype(str).tolist()[1] == "expired"
    assert conc["reused"].tolist() == [0, 1280]   # written when the call ended (t=101 s): alive until 701 s


def test_concurrency_needs_times_and_a_speed():
    with pytest.raises(ValueError, match="has no ts"):
        sl.replay_engines([Call(0, "s", as_ids([1, 2]))], ["vllm"], concurrency=True, tokens_per_s=10)
    with pytest.raises(ValueError, match="give tokens_per_s"):
        sl.replay_engines([Call(0, "s", as_ids([1, 2]), ts=0.0)], ["vllm"], concurrency=True)
    with pytest.raises(ValueError, match="only used with concurrency"):
        sl.replay_engines([Call(0, "s", as_ids([1, 2]), ts=0.0)], ["vllm"], tokens_per_s=10)
    with pytest.raises(ValueError, match="tokens_per_s must be"):
        sl.replay_engines([Call(0, "s", as_ids([1, 2]), ts=0.0)], ["vllm"], concurrency=True, tokens_per_s=0)


# -- export: anonymous hash traces that round-trip ------------------------------------------------------------
DUMPS = sorted(glob.glob(str(ROOT / "dumps" / "*.jsonl")))


@pytest.mark.parametrize("fmt", ["mooncake", "bailian"])
@pytest.mark.parametrize("dump", DUMPS)
def test_export_round_trips_exactly_under_vllm(tmp_path, dump, fmt):
    out = tmp_path / f"{fmt}.jsonl"
    for block, extra in ((16, ""), (4, ",kv_tokens=300"), (32, ",kv_tokens=600")):
        n = sl.export_trace(dump, out, format=fmt, block=block, min_sessions=1)   # k = 1: every block's reuse
        assert n == len(calls_from_dump(dump))
        spec = f"vllm:block_size={block}{extra}"
        orig = sl.replay_engines(dump, [spec]).frame()["reused"].tolist()
        again = sl.replay_engines(load_hash_trace(out, block=block), [spec]).frame()["reused"].tolist()
        assert again == orig
        assert sum(orig) > 0 or block == 32
    # the reader detects the export by itself (its block is the format's default)
    sl.export_trace(dump, out, format=fmt)
    assert load_hash_trace(out).format == fmt


def _relabel(dump, tmp_path):
    """The same dump with every token id replaced through a bijection (same structure, other ids)."""
    calls = calls_from_dump(dump)
    ids = np.unique(np.concatenate([c.sequence() for c in calls]))
    perm = dict(zip(ids.tolist(), (ids[::-1] + 7).tolist()))
    return [dataclasses.replace(c, prompt=as_ids([perm[x] for x in c.prompt.tolist()]),
                                output=as_ids([perm[x] for x in c.output.tolist()]), memo=None) for c in calls]


@pytest.mark.parametrize("fmt", ["mooncake", "bailian"])
def test_export_holds_no_text_and_no_ids(tmp_path, fmt):
    dump = str(ROOT / "dumps" / "agent.jsonl")
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    sl.export_trace(dump, a, format=fmt, salt="k", min_sessions=1)
    sl.export_trace(_relabel(dump, tmp_path), b, format=fmt, salt="k", min_sessions=1)
    # any other ids with the same prefix structure give the same trace up to the hash integers, which are
    # keyed hashes (52-bit): the file holds the structure, not the ids
    rows = [json.loads(line) for line in a.read_text().splitlines()]
    other = [json.loads(line) for line in b.read_text().splitlines()]

    def shape(rs):
        first: dict = {}
        return [{**r, "hash_ids": [first.setdefault(h, len(first)) for h in r["hash_ids"]],
                 "output_hash_ids": [first.setdefault(h, len(first)) for h in r["output_hash_ids"]]} for r in rs]

    assert shape(rows) == shape(other)
    allowed = {"timestamp", "input_length", "output_length", "hash_ids", "output_hash_ids"} | (
        {"chat_id", "parent_chat_id", "type", "turn"} if fmt == "bailian" else set())
    assert all(set(r) == allowed for r in rows)
    recs = sl.load_dump(dump).records()
    assert all(r["session"] not in a.read_text() for r in recs)
    assert rows[0]["timestamp"] == 0
    hashes = {h for r in rows for h in r["hash_ids"] + r["output_hash_ids"]}
    assert all(0 <= h < 2**52 for h in hashes)   # exact in any JSON reader
    # a fresh random salt per export: two exports of one dump share no hash integer (issue 52)
    c, e = tmp_path / "c.jsonl", tmp_path / "e.jsonl"
    sl.export_trace(dump, c, format=fmt, min_sessions=1)
    sl.export_trace(dump, e, format=fmt, min_sessions=1)
    assert c.read_bytes() != e.read_bytes()
    assert not hashes & {h for line in c.read_text().splitlines() for h in json.loads(line)["hash_ids"]}
    assert shape(json.loads(line) for line in c.read_text().splitlines()) == shape(rows)
    if fmt == "bailian":
        assert [r["turn"] for r in rows] == list(range(1, len(rows) + 1))
        assert [r["parent_chat_id"] for r in rows] == [-1] + [r["chat_id"] for r in rows[:-1]]


def test_export_from_a_store_and_bad_options(tmp_path):
    store = tmp_path / "store"
    sl.convert_jsonl([str(ROOT / "dumps" / "webui.jsonl")], str(store))
    out = tmp_path / "s.jsonl"
    assert sl.export_trace(str(store), out, format="mooncake", block=16, min_sessions=1) == \
        len(calls_from_dump(str(store)))
    orig = sl.replay_engines(str(store), ["vllm"]).frame()["reused"].tolist()
    assert sl.replay_engines(load_hash_trace(out, block=16), ["vllm"]).frame()["reused"].tolist() == orig
    with pytest.raises(ValueError, match="format must be one of"):
        sl.export_trace(str(store), out, format="sharegpt")
    with pytest.raises(ValueError, match="block must be a positive int"):
        sl.export_trace(str(store), out, format="bailian", block=0)
    with pytest.raises(ValueError, match="salt must be 1 to 64 bytes"):
        sl.export_trace(str(store), out, format="bailian", salt="")
    # calls without times keep their order: each one's position is its time
    untimed = [dataclasses.replace(c, ts=None) for c in calls_from_dump(str(ROOT / "dumps" / "agent.jsonl"))]
    sl.export_trace(untimed, out, format="mooncake", block=16, min_sessions=1)
    assert [json.loads(x)["timestamp"] for x in out.read_text().splitlines()] == \
        [1000 * i for i in range(len(untimed))]
    assert sl.replay_engines(load_hash_trace(out, block=16), ["vllm"]).frame()["reused"].tolist() == \
        sl.replay_engines(untimed, ["vllm"]).frame()["reused"].tolist()


# -- sweeps -----------------------------------------------------------------------------------------------
def test_sweep_curve_policies_tier2_and_fleet(generated):
    caps = [10**4, 10**5, 10**6, 3 * 10**6, 10**7, 10**8, 10**9, None]
    df = sl.sweep(generated, capacities=caps, policies=["lru", "lfu", "fifo", "atc25"])
    assert len(df) == 4 * len(caps)
    lru = df[df["policy"] == "lru"]["hit_rate"].tolist()
    assert lru == sorted(lru) and lru[0] < 0.05 and lru[-1] == lru[-2]
    # the block LRU is the done-when's reference LRU
    assert abs(lru[3] - lru_reference(generated, 3 * 10**6)) < 1e-12
    assert abs(lru[-1] - lru_reference(generated, None)) < 1e-12
    # a second tier only adds hits, and says how many came from it
    t2 = sl.sweep(generated, capacities=[10**6], policies=["lru"], tier2=10**7)
    assert t2["hit_rate"].iloc[0] > lru[2] and t2["tier2_hit_rate"].iloc[0] > 0
    # per-replica caches of capacity / K lose to one shared pool of the same size
    fleet = sl.sweep(generated, capacities=[3 * 10**6], policies=["lru", "vllm"], replicas=4)
    for pol, g in fleet.groupby("policy"):
        shared = g[g["layout"] == "shared"]["hit_rate"].iloc[0]
        split = g[g["layout"] == "per-replica"]["hit_rate"].iloc[0]
        assert split < shared, pol


def test_atc25_uses_categories_and_time():
    # two categories: a block class reused quickly (search) and one never reused (file); under pressure
    # the workload-aware policy keeps the reused class where LRU evicts by recency alone
    from strata_lab.caches.capacity import BlockStream, simulate

    keys, ts, cat = [], [], []
    for i in range(200):
        keys.append([1000, 1001]) if i % 2 == 0 else keys.append([10_000 + i])
        cat.append("search/first" if i % 2 == 0 else "file/first")
        ts.append(float(i))
    for i in range(0, 200, 10):   # bursts of one-off files between the search reuses
        keys[i + 1] = [20_000 + 3 * i, 20_001 + 3 * i, 20_002 + 3 * i]
    n = len(keys)
    s = BlockStream(keys, np.full(n, 16), np.array([16 * len(k) for k in keys]), np.array(ts), [str(i) for i in
                    range(n)], cat, 16)
    lru = simulate(s, "lru", 3 * 16)["hit_rate"]
    atc = simulate(s, "atc25", 3 * 16)["hit_rate"]
    assert atc > lru


def test_sweep_errors_before_work(generated):
    with pytest.raises(ValueError, match="policies: nope|engine must be one of"):
        sl.sweep(generated, capacities=[10**4], policies=["lru", "nope"])
    with pytest.raises(ValueError, match="tier2: a second tier"):
        sl.sweep(generated, capacities=[10**4], policies=["vllm"], tier2=10**5)
    with pytest.raises(ValueError, match="capacities must be positive"):
        sl.sweep(generated, capacities=[0], policies=["lru"])
    with pytest.raises(ValueError, match="has no token capacity"):
        sl.sweep(generated, capacities=[10**4], policies=["openai"])


def test_sweep_on_dask_equals_local(generated):
    pytest.importorskip("distributed")
    small = [10**5, 10**7]
    local = sl.sweep(generated, capacities=small, policies=["lru", "atc25"])
    dist = sl.sweep(generated, capacities=small, policies=["lru", "atc25"], dask="local:2")
    assert dist.to_dict("records") == local.to_dict("records")


def test_sweep_and_export_cli(tmp_path, capsys):
    from strata_lab.cli import main

    png, csv = tmp_path / "s.png", tmp_path / "s.csv"
    assert main(["sweep", str(FIX / "mooncake.jsonl"), "--capacity", "1e3", "--capacity", "unbounded",
                 "--policy", "lru", "--policy", "vllm", "--png", str(png), "--csv", str(csv), "-q"]) == 0
    assert png.stat().st_size > 1000 and len(csv.read_text().splitlines()) == 5
    out = tmp_path / "e.jsonl"
    assert main(["export", str(ROOT / "dumps" / "thinking.jsonl"), "--format", "bailian", "--out", str(out),
                 "--block", "16", "--salt", "s", "-q"]) == 0
    assert load_hash_trace(out).format == "bailian"
    # any log `import` reads: rendered with the tokenizer, then exported
    assert main(["export", str(FIX / "openai.jsonl"), "--format", "mooncake", "--out", str(out), "-q"]) == 0
    assert len(load_hash_trace(out)) == len(sl.load_trace(FIX / "openai.jsonl").calls())
    assert main(["sweep", str(FIX / "mooncake.jsonl"), "--capacity", "lots", "-q"]) == 2
    assert "--capacity must be tokens" in capsys.readouterr().err
    # replay --engine reads a hash trace directly (no tokenizer), with the same numbers as the API
    js = tmp_path / "r.json"
    assert main(["replay", str(FIX / "bailian.jsonl"), "--engine", "vllm", "--json", str(js), "-q"]) == 0
    assert json.loads(js.read_text())["engines"][0]["reused"] == \
        int(sl.replay_engines(FIX / "bailian.jsonl", ["vllm"]).summary()["reused"].iloc[0])
    assert sl.replay_engines(FIX / "bailian.jsonl", ["vllm"], tokenizer="qwen3").summary()["reused"].iloc[0] > 0
