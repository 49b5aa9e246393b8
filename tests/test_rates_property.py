"""Issue 52: no rate outside [0, 1], no reused past the prompt, for any dump or hash trace: prompts shorter than
a block, blocks larger than any prompt, empty prompts in traces; every sweep policy and replay engine
(hypothesis, few small examples: fast)."""
from __future__ import annotations

import json
import math
import os
import tempfile

from hypothesis import HealthCheck, given, settings, strategies as st

from strata_lab.caches.capacity import sweep
from strata_lab.caches.call_ids import calls_from_dump
from strata_lab.caches.presets import parse_engine
from strata_lab.caches.replay import replay_engines
from strata_lab.dump import load_dump
from strata_lab.dump.writer import write_records

ENGINES = ["vllm", "sglang", "llama.cpp", "trtllm", "openai", "anthropic", "gemini", "strata"]
BLOCK_POLICIES = ["lru", "lfu", "fifo", "atc25"]
FAST = settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))

# sessions of calls whose prompts grow from a short shared start (often shorter than one block)
sessions = st.lists(st.lists(st.integers(1, 40), min_size=1, max_size=3), min_size=1, max_size=3)


def _write(tmp: str, spec) -> str:
    recs = []
    for s, lengths in enumerate(spec):
        for c, n in enumerate(lengths):
            recs.append({"session": f"s{s}", "call": c, "ts": float(10 * s + c), "prompt_ids": list(range(1, n + 1)),
                         "reused": 0, "gen_ids": [5]})
    path = os.path.join(tmp, "d.jsonl")
    write_records(recs, path)
    return path


def _check_rows(df):
    for _, row in df.iterrows():
        assert 0 <= row["reused"] <= row["prompt_tokens"], row.to_dict()
        assert math.isnan(row["hit_rate"]) or 0.0 <= row["hit_rate"] <= 1.0, row.to_dict()


@FAST
@given(spec=sessions, block=st.sampled_from([1, 4, 16, 65536]))
def test_sweep_rates_stay_in_range_on_dumps(spec, block):
    with tempfile.TemporaryDirectory() as tmp:
        df = sweep(_write(tmp, spec), capacities=[16, None], policies=BLOCK_POLICIES + ["vllm", "sglang"],
                   block=block)
    _check_rows(df)
    assert ((df["tier2_hit_rate"] >= 0) & (df["tier2_hit_rate"] <= 1)).all()


@FAST
@given(spec=sessions)
def test_replay_reuse_is_within_every_prompt(spec):
    with tempfile.TemporaryDirectory() as tmp:
        calls = calls_from_dump(load_dump(_write(tmp, spec)))
    report = replay_engines(calls, [parse_engine(e) for e in ENGINES])
    summary = report.summary()
    _check_rows(summary)
    frame = report.frame()
    assert (frame["reused"] >= 0).all() and (frame["reused"] <= frame["prompt_len"]).all()


# hash trace lines: input lengths from 0 (no block) to a few blocks, hashes sharing a prefix
lines = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 3), st.integers(0, 5)), min_size=1, max_size=6)


@FAST
@given(rows=lines, block=st.sampled_from([4, 16, 512]))
def test_hash_trace_rates_stay_in_range(rows, block):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "t.jsonl")
        with open(path, "w") as f:
            for i, (n, fork, out) in enumerate(rows):
                blocks = -(-n // block)
                hashes = [b if b < fork else 1000 * (i + 1) + b for b in range(blocks)]
                f.write(json.dumps({"timestamp": i, "input_length": n, "output_length": out, "hash_ids": hashes,
                                    "block_tokens": block}) + "\n")
        df = sweep(path, capacities=[8, None], policies=BLOCK_POLICIES + ["vllm"])
    _check_rows(df)
