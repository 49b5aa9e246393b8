"""The replay's C++ core (`_ReplayCore` in strata_lab._replay) against the Python code it mirrors: the state model
(SessionState), the divergence walk and classify, and the whole store replay (against the one driver's
call-by-call replay of the same lines, every column), on generated sessions that extend, retry, edit, drop drained ids and re-encode replies."""
from __future__ import annotations

import os
import random
import tempfile

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from strata_lab import _native
from strata_lab.dump import Store, convert_jsonl
from strata_lab.replayer import native
from strata_lab.replayer.core import resolve_options
from strata_lab.replayer.divergence import classify, find_divergence
from strata_lab.replayer.state import FULL_HIT_RULES, SessionState
from strata_lab.rules import parse_checkpoint_policy
from strata_lab.text.ids import lcp_len

pytestmark = pytest.mark.skipif(not native.native_available(), reason="needs the compiled engine")

WORDS = ["the", " cat", " öğrenci", " naïve", "\n\n", " 東京", "<think>", "</think>", " is", " here", "!!", " 123",
         "ab", " café", "\n", " ", "--", " résumé", "x", " 🙂", "<|im_start|>assistant\n", "<|im_start|>user\n",
         "<|im_end|>\n"]
POLICIES = ["turn", "none", "every:4", "at:3,9,20", "budget:3:3", "budget:2", "header", "every:8,header"]
HYPO = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def pieces(tok, words, rng):
    """Words as ids; some split into per-character ids (a reply's own pieces, not BPE's)."""
    out = []
    for w in words:
        ids = tok.encode(w)
        if rng.random() < 0.3 and len(w) > 1 and not w.startswith("<"):
            ids = [i for ch in w for i in tok.encode(ch)]
        out += ids
    return out


def new_core(model, spec, full_hit, *, bytes_per_snapshot=2**20, recorded=False):
    ext = _native.replay()
    st_ = SessionState(model=model, policy=parse_checkpoint_policy(spec), full_hit=full_hit,
                       bytes_per_snapshot=bytes_per_snapshot)
    core = ext._ReplayCore(hybrid=model == "hybrid", full_hit=ext.FullHit.__members__[full_hit],
                           policy=st_.policy._native(ext), capacity=-1 if st_.capacity is None else st_.capacity,
                           bytes_per_snapshot=bytes_per_snapshot, recorded_checkpoints=recorded)
    return core, st_


# --- the state model ------------------------------------------------------------------------------
@HYPO
@given(model=st.sampled_from(["hybrid", "attention"]), spec=st.sampled_from(POLICIES),
       full_hit=st.sampled_from(FULL_HIT_RULES),
       calls=st.lists(st.tuples(st.floats(0, 1.2), st.lists(st.sampled_from([5, 6, 7, 151644, 9]), max_size=12),
                                st.integers(0, 6), st.integers(0, 2)), min_size=1, max_size=12))
def test_core_steps_like_the_state_model(model, spec, full_hit, calls):
    core, ref = new_core(model, spec, full_hit)
    core.open(0)
    peak = 0
    for n, (keep, new, ngen, ndrained) in enumerate(calls):
        held = list(ref.held)
        cut = min(int(keep * len(held)), len(held))
        prompt = held[:cut] + new
        lcp = lcp_len(prompt, held)
        pred = ref.plan(prompt)
        assert core.plan(0, len(prompt), lcp) == (pred.target, pred.reused, pred.restored_checkpoint)
        ref.apply(prompt, pred)
        gen, drained = [11] * ngen, [12] * ndrained
        ref.finish(gen, drained)
        out = core.advance(0, len(prompt), lcp, prompt[lcp:], gen, drained, None, 0, n)
        assert out == (len(held), lcp, pred.reused, pred.target, len(ref.checkpoints), n, pred.restored_checkpoint)
        assert core.held(0).tolist() == ref.held
        assert core.checkpoints(0) == list(ref.checkpoints)  # the LRU order too
        assert core.segments(0) == ref.segments
        assert core.calls(0) == ref.calls == n + 1
        peak = max(peak, ref.snapshot_bytes())
    assert core.peak_bytes == peak


# --- the divergence walk and the cause ---------------------------------------------------------------
@HYPO
@given(words=st.lists(st.sampled_from(WORDS), min_size=1, max_size=30), reply=st.lists(st.sampled_from(WORDS), max_size=12),
       drained=st.lists(st.sampled_from(WORDS), max_size=3), cut=st.floats(0, 1),
       edit=st.lists(st.sampled_from(WORDS), max_size=4), tail=st.lists(st.sampled_from(WORDS), max_size=12),
       rebpe=st.booleans(), seed=st.integers(0, 2**16))
def test_explain_matches_find_divergence_and_classify(qwen3, words, reply, drained, cut, edit, tail, rebpe, seed):
    rng = random.Random(seed)
    core, ref = new_core("hybrid", "turn", "held_logits")
    core.set_vocab(native._native_vocab(qwen3))
    core.open(0)
    p1, gen, dr = pieces(qwen3, words, rng), pieces(qwen3, reply, rng), pieces(qwen3, drained, rng)
    ref.call(p1)
    ref.finish(gen, dr)
    core.advance(0, len(p1), 0, p1, gen, dr, None, 0, 0)
    text = words + reply + drained
    k = int(cut * len(text))
    new_words = text[:k] + edit + text[k:] + tail
    prompt = qwen3.encode("".join(new_words)) if rebpe else pieces(qwen3, new_words, rng)
    held = ref.held
    lcp = lcp_len(prompt, held)
    if lcp >= len(held):
        return
    pred = ref.plan(prompt)
    want = find_divergence(held, prompt, qwen3, lcp_ids=lcp)
    cause = classify(held=held, prompt=prompt, segments=ref.segments, div=want, reused=pred.reused,
                     target=pred.target, tok=qwen3, first_call=False, lcp_ids=lcp)
    m = core.explain(0, lcp, prompt[lcp:], pred.reused, pred.target)
    assert native._miss_divergence(m, lcp, 40) == want
    assert m[5] == cause  # the core names its cause


@HYPO
@given(blocks=st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=12), min_size=1, max_size=8),
       held_at=st.lists(st.integers(0, 7), max_size=14), prompt_at=st.lists(st.integers(0, 7), max_size=14),
       noise=st.lists(st.integers(0, 5), max_size=10))
def test_realigned_tail_matches_explain(blocks, held_at, prompt_at, noise):
    """The core's realigned tail is explain.realigned_tail's: blocks of a few ids recur in both sides in other
    orders, so grams repeat (a gram found again later, the look-ahead past a run that skipped prompt ids)."""
    from strata_lab.replayer.explain import realigned_tail

    def seq(order):
        out = []
        for k in order:
            out += blocks[k % len(blocks)] + [100 + k]
        return out

    held = seq(held_at) + noise
    prompt = noise + seq(prompt_at)
    assert _native.replay().realigned_tail(held, prompt) == realigned_tail(held, prompt, 0, 0)


# --- the whole store replay -------------------------------------------------------------------------
def _agent_dump(path, tok, rng, *, sessions=4, calls=14, replicas=2, odd=True):
    """Sessions over two days and several replicas: turns that extend, re-encode the reply, edit history,
    retry, drop drained ids; a few lines the columns cannot hold alone (extra fields, spaced JSON)."""
    held: dict = {}
    texts: dict = {}
    lines = []
    for i in range(sessions * calls):
        sid = rng.randrange(sessions)
        words = texts.get(sid, [])
        h = held.get(sid, [])
        op = rng.random()
        if op < 0.45 or not h:      # the next turn: held as the model wrote it, plus new words
            prompt = h + pieces(tok, [rng.choice(WORDS) for _ in range(rng.randrange(1, 8))], rng)
        elif op < 0.65:             # the client re-encodes the whole conversation (BPE pieces)
            prompt = tok.encode("".join(words)) + tok.encode(rng.choice(WORDS))
        elif op < 0.8:              # history edited somewhere
            k = rng.randrange(len(words) + 1)
            prompt = pieces(tok, words[:k] + [rng.choice(WORDS)] + words[k:], rng)
        else:                       # a retry of an earlier prefix
            prompt = h[:rng.randrange(len(h) + 1)]
        reply_words = [rng.choice(WORDS) for _ in range(rng.randrange(0, 6))]
        gen = pieces(tok, reply_words, rng)
        drained = pieces(tok, [rng.choice(WORDS)], rng) if rng.random() < 0.2 else []
        rec = {"schema": "strata-dump/1", "ts": 1.7e9 + i * 700.0, "request_id": f"q{i}", "session": f"s{sid}",
               "call": 0, "prompt_ids": prompt, "reused": 0, "gen_ids": gen, "drained_ids": drained,
               "finish": "stop", "timings": {"prefill_ms": 1.0 + 0.01 * len(prompt), "decode_ms": 2.0},
               "checkpoints": [len(prompt)], "replica": f"r{sid % replicas}"}
        line = orjson.dumps(rec)
        if odd and rng.random() < 0.08:
            line = orjson.dumps({**rec, "ts": int(rec["ts"])})                      # an int ts: an extra field
        elif odd and rng.random() < 0.05:
            line = line.replace(b'","', b'", "', 1)                                 # not orjson's writing: raw
        lines.append(line)
        held[sid] = prompt + gen + drained
        texts[sid] = [tok.decode([t]) for t in held[sid]]
    with open(path, "wb") as f:
        f.write(b"\n".join(lines) + b"\n")


def _same_domain_replay(store, jsonl, tok, model="hybrid", checkpoint_policy=None):
    """The store on the C++ core gives the rows the one driver gives the JSONL lines call by call (every column),
    for the whole store and for each of its cache domains alone."""
    import strata_lab as sl
    from strata_lab.caches.report import ReplayReport

    one = sl.replay(jsonl, f"strata:kind={model},checkpoints={checkpoint_policy or 'turn'}", tokenizer=tok)
    opts = resolve_options(model=model, checkpoint_policy=checkpoint_policy)
    spec = one.specs[0]
    want = one.frame().sort_values("index", kind="stable").reset_index(drop=True)
    table = native.replay_store(store, opts, tok, one.cost_model, spec=spec)
    got = ReplayReport.from_table(table, one.presets, {}, one.cost_model).frame()
    for col in want.columns:
        assert got[col].equals(want[col]), (col, got[col].tolist(), want[col].tolist())
    rows = 0
    for parts in store.domains().values():   # a domain alone: its sessions' rows as in the whole store
        _seqs, batches, _snap, _ms = native.replay_domain(parts, opts, tok, one.cost_model, spec=spec)
        rows += sum(b.num_rows for b in batches)
    assert rows == len(want)
    return got


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**20), model=st.sampled_from(["hybrid", "attention"]),
       checkpoints=st.sampled_from([None, "every:16", "header", "recorded", "budget:300:32"]))
def test_store_replay_on_the_core_equals_the_python_reference(qwen3, seed, model, checkpoints):
    with tempfile.TemporaryDirectory() as d:
        _agent_dump(os.path.join(d, "a.jsonl"), qwen3, random.Random(seed))
        convert_jsonl(os.path.join(d, "a.jsonl"), os.path.join(d, "s"), row_group_rows=16)
        _same_domain_replay(Store(os.path.join(d, "s")), os.path.join(d, "a.jsonl"), qwen3, model=model,
                            checkpoint_policy=checkpoints)


class _NoBytesTable:
    """A tokenizer that cannot list every id's bytes at once (only token_bytes, one id at a time)."""

    def __init__(self, tok):
        self._tok = tok

    def __getattr__(self, name):
        if name == "vocab_bytes":
            raise AttributeError(name)
        return getattr(self._tok, name)


def test_generated_fleet_replays_the_same_on_the_core(qwen3, tmp_path):
    from strata_lab.fleet import FleetConfig, write_fleet

    write_fleet(tmp_path / "f.jsonl", FleetConfig(sessions=10, replicas=2, seed=5), tokenizer=qwen3)
    convert_jsonl(tmp_path / "f.jsonl", tmp_path / "s")
    store = Store(tmp_path / "s")
    got = _same_domain_replay(store, tmp_path / "f.jsonl", qwen3)
    _same_domain_replay(store, tmp_path / "f.jsonl", _NoBytesTable(qwen3))  # no vocab_bytes: the Python walk
    causes = set(got["cause"].astype(str))
    assert {"retokenized_reply", "template_rewrite"} <= causes or {"history_edit"} <= causes, causes


def test_one_scan_gives_what_the_separate_reads_give(qwen3, tmp_path):
    """`scan_store` reads each segment once for the models, the session ends and the cost fit: the values
    `session_ends` and `fit_cost_store` read alone (odd lines included); a line with another server's
    reported figures makes it None (that store replays call by call)."""
    from strata_lab.replayer.fast import fit_cost_store, scan_store, session_ends

    _agent_dump(tmp_path / "a.jsonl", qwen3, random.Random(7))
    convert_jsonl(tmp_path / "a.jsonl", tmp_path / "s", row_group_rows=16)
    store = Store(tmp_path / "s")
    scan = scan_store(store)
    assert scan.store is store and scan.models == [None]
    assert scan.ends == session_ends(store.partitions) and len(scan.ends) > 1
    assert scan.cost_model == fit_cost_store(store) and scan.cost_model is not None
    lines = (tmp_path / "a.jsonl").read_bytes().splitlines()
    lines[0] = orjson.dumps({**orjson.loads(lines[0]), "reported_cached_tokens": 3})   # a call with a prompt
    (tmp_path / "b.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    convert_jsonl(tmp_path / "b.jsonl", tmp_path / "t")
    assert scan_store(Store(tmp_path / "t")) is None


def test_core_refuses_bad_batches_naming_the_field():
    core, _ = new_core("hybrid", "turn", "held_logits")
    n = 3
    i64 = np.zeros(n, dtype=np.int64)
    offs = np.zeros(n + 1, dtype=np.int32)
    vals = np.zeros(0, dtype=np.int32)
    ins = [i64, np.zeros(n, np.uint8), np.zeros(n, np.uint8), i64, i64, i64 - 1, i64, i64, offs, vals, offs, vals,
           offs, vals, offs, vals, np.zeros(n), np.zeros(0, np.int64)]
    outs = tuple([np.zeros(n, np.int64) for _ in range(12)] + [np.zeros(n, np.int8)] +
                 [np.zeros(n, np.int64) for _ in range(3)])
    assert core.run(0, tuple(ins), outs) == n  # empty prompts: valid
    bad = list(ins)
    bad[6] = i64.astype(np.int32)
    with pytest.raises(ValueError, match="shared"):
        core.run(0, tuple(bad), outs)
    bad = list(ins)
    bad[8] = np.array([0, 5, 5, 5], np.int32)  # offsets past the values
    with pytest.raises(ValueError, match="suffix offsets"):
        core.run(0, tuple(bad), outs)
    with pytest.raises(ValueError, match="cause"):
        core.run(0, tuple(ins), outs[:12] + (np.zeros(n, np.int64),) + outs[13:])
    bad = list(ins)
    bad[17] = np.array([0, 1, 3])  # a perm must stay inside the batch
    with pytest.raises(ValueError, match="perm"):
        core.run(0, tuple(bad), outs)
    with pytest.raises(ValueError, match="18 arrays"):
        core.run(0, tuple(ins[:-1]), outs)
    with pytest.raises(IndexError):
        core.held(99)
    with pytest.raises(ValueError, match="offsets"):
        _native.replay()._ReplayVocab(b"abc", np.array([0, 2], np.int64), -1, -1)


def test_read_ahead_keeps_order_raises_in_order_and_stops_when_closed():
    import threading

    def gen(n, fail_at=None):
        for i in range(n):
            if i == fail_at:
                raise OSError("disk gone")
            yield i

    assert list(native._read_ahead(gen(50))) == list(range(50))
    it = native._read_ahead(gen(10, fail_at=4))
    assert [next(it) for _ in range(4)] == [0, 1, 2, 3]
    with pytest.raises(OSError, match="disk gone"):
        next(it)
    it = native._read_ahead(gen(10**6))
    assert next(it) == 0
    it.close()  # the reader thread is joined, not left reading a million items
    assert not any(t.name == "strata-replay-read" for t in threading.enumerate())
