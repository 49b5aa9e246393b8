"""Each engine's cache model against its documented behaviour, with hand-computed expectations.

The rules come from the research note (docs/research/cache-policies-and-logs.md, section 1) and the
engine code it cites; each test names the rule it checks.
"""
from pathlib import Path

import pytest

from strata_lab.caches.base import Hint
from strata_lab.caches.call_ids import Call, as_ids, lcp_call
from strata_lab.caches.presets import parse_engine


class Driver:
    """Steps one model with the session view the replay computes (what the session's last call left)."""

    def __init__(self, spec):
        self.model = parse_engine(spec).build()
        self.last = {}
        self.n = 0

    def __call__(self, session, prompt, output=(), ts=None, **kw):
        prompt = as_ids(list(prompt))
        prev = self.last.get(session)
        if prev is None:
            hint = Hint(None, 0, 0)
        else:
            n = lcp_call(prompt, prev)
            hint = Hint(prev, n, min(n, len(prompt) - 1))
        c = Call(self.n, session, prompt, as_ids(list(output)), ts=ts, **kw)
        self.n += 1
        plan = self.model.step(c, hint)
        self.last[session] = c
        return plan


# --- vLLM -------------------------------------------------------------------------------------------
def test_vllm_full_blocks_only_and_block_rounding():
    d = Driver("vllm:block_size=4")
    d("a", range(10))                                   # blocks [0-3], [4-7] cached; 8, 9 are a partial block
    p = d("b", list(range(10)) + [99])
    assert (p.reused, p.unit, p.source) == (8, "blocks 0-1", 0)
    p = d("b", list(range(9)))                          # shares 9 ids: floored to 2 blocks
    assert p.reused == 8


def test_vllm_caps_a_full_repeat_at_len_minus_one_then_floors_a_block():
    d = Driver("vllm:block_size=4")
    d("a", range(8))
    p = d("b", range(8))                                # 100% repeat: min(8, 8 - 1) = 7 -> one block
    assert p.reused == 4


def test_vllm_chained_keys_diverge_at_one_token():
    d = Driver("vllm:block_size=4")
    base = list(range(16))
    d("a", base)
    changed = base.copy()
    changed[5] = 999                                    # block 1 differs; blocks 2 and 3 are identical ids...
    assert d("b", changed + [1]).reused == 4            # ...but their keys chain through block 1: no hit
    changed = base.copy()
    changed[0] = 999
    assert d("c", changed + [1]).reused == 0


def test_vllm_cache_salt_only_keys_the_first_block():
    d = Driver("vllm:block_size=4")
    d("a", range(12), cache_salt="tenant-1")
    assert d("b", list(range(12)) + [1], cache_salt="tenant-2").reused == 0
    assert d("c", list(range(12)) + [1], cache_salt="tenant-1").reused == 12


def test_vllm_generated_ids_are_cached_as_their_blocks_fill():
    d = Driver("vllm:block_size=4")
    d("a", range(6), output=[50, 51, 52, 53])           # computed: 6 + 3 fed outputs = 9 ids -> 2 blocks
    assert d("a", list(range(6)) + [50, 51, 52, 53, 7]).reused == 8


def test_vllm_eviction_order_under_a_tiny_pool():
    # 5 blocks logged, one the null block: 4 of 2 ids. A's blocks go back to the queue tail-first: [a1, a0];
    # B's next: [a1, a0, b1, b0] (vLLM 0.32's KVCacheManager gives the same, tests/test_fidelity.py)
    d = Driver("vllm:block_size=2,kv_blocks=5")
    d("A", [1, 2, 3, 4])
    d("B", [5, 6, 7, 8])                                # takes the 2 never-used blocks first
    d("C", [9, 10, 11, 12, 13, 14])                     # needs 3: pops a1, a0, then b1
    p = d("B", [5, 6, 7, 8, 0])                         # b0 survived, b1 did not
    assert (p.reused, p.cause) == (2, "evicted")
    p = d("A", [1, 2, 3, 4, 0])
    assert (p.reused, p.cause) == (0, "evicted")


def test_vllm_evict_to_a_budget_follows_the_free_queue():
    d = Driver("vllm:block_size=2,kv_blocks=9")
    d("A", [1, 2, 3, 4, 0])
    d("B", [5, 6, 7, 8, 0])
    assert d.model.evict(2) == 2                        # A's blocks were freed first
    assert d("B", [5, 6, 7, 8, 1]).reused == 4
    assert d("A", [1, 2, 3, 4, 1]).reused == 0


@pytest.mark.parametrize("stored", [1, 64, 700])
def test_vllm_pool_stored_as_reached_equals_the_whole_pool(monkeypatch, stored):
    """A bounded pool stores its never-used blocks only as the free queue reaches them (a capacity far past
    the trace costs nothing): every plan and eviction equals the pool stored whole up front, through
    evictions, blocks freed to the head and requests that pin blocks."""
    import random

    from strata_lab.caches import vllm

    def run(first):
        monkeypatch.setattr(vllm.Model, "stored_first", first)
        d, rng, out = Driver("vllm:block_size=2,kv_blocks=801"), random.Random(7), []
        base = {s: [rng.randrange(50) for _ in range(rng.randrange(1, 400))] for s in range(12)}
        for _ in range(160):
            s = rng.randrange(12)
            prompt = base[s] + [rng.randrange(50) for _ in range(rng.randrange(1, 60))]
            if rng.random() < 0.3:
                base[s] = prompt
            p = d(s, prompt, output=[rng.randrange(50) for _ in range(rng.randrange(0, 9))])
            out.append((p.reused, p.cause, d.model.evictions))
        return out, len(d.model.blk_hash)

    whole, n = run(10**6)
    part, m = run(stored)
    assert part == whole and whole[-1][2] > 100 and n >= 800
    big = Driver("vllm:block_size=16,kv_tokens=1000000000")   # 62.5 M blocks: stored as used
    big("a", range(100))
    assert big("a", list(range(100)) + [1]).reused == 96 and len(big.model.blk_hash) <= 1024


def test_vllm_capacity_in_tokens_and_bytes():
    assert parse_engine("vllm:kv_tokens=1600").capacity_blocks() == 100
    # qwen3-8b: 2 x 36 layers x 8 kv heads x 128 x 2 bytes = 147456 B/token; x16 per block
    assert parse_engine("vllm:kv_bytes=2359296").capacity_blocks() == 1
    # hybrid model: blocks inflate to hybrid_block_size
    assert parse_engine("vllm:model=qwen3-next-80b-a3b,kv_tokens=5280").capacity_blocks() == 10


def test_vllm_hybrid_align_keeps_states_only_at_step_ends_on_block_boundaries():
    hyb = "vllm:model=qwen3-next-80b-a3b,hybrid_block_size=4,max_num_batched_tokens=6"
    # prefill steps end at 6 and 10: neither on a block boundary (4, 8) -> no state inside the prompt
    d = Driver(hyb)
    d("a", range(10))
    p = d("a", list(range(10)) + [1, 2])
    assert (p.reused, p.cause) == (0, "no_state_checkpoint")
    d = Driver(hyb.replace("align", "all") + ",mamba_cache_mode=all")
    d("a", range(10))
    assert d("a", list(range(10)) + [1, 2]).reused == 8
    d = Driver(hyb + ",mamba_cache_mode=none")
    d("a", range(10))
    assert d("a", list(range(10)) + [1, 2]).reused == 0
    # decode steps are one token: every block boundary reached while decoding keeps a state
    d = Driver(hyb)
    d("a", range(10), output=list(range(100, 107)))    # computed 16: states at 12 and 16
    assert d("a", list(range(10)) + list(range(100, 107)) + [5]).reused == 16
    assert d("b", list(range(10)) + [100, 101, 102, 999]).reused == 12


def test_vllm_hybrid_prompt_under_one_inflated_block_never_hits():
    d = Driver("vllm:model=qwen3-next-80b-a3b")       # 528-token blocks (vllm#40696)
    d("a", range(500))
    p = d("a", list(range(500)) + [1])
    assert (p.reused, p.cause) == (0, "block_rounding")


# --- SGLang -----------------------------------------------------------------------------------------
def test_sglang_caps_at_input_minus_one_and_pages():
    d = Driver("sglang")
    d("a", range(10))
    assert d("b", range(10)).reused == 9
    d = Driver("sglang:page_size=4")
    d("a", range(10))                                   # inserted: 8 ids (whole pages)
    assert d("b", list(range(9)) + [77]).reused == 8
    assert d("c", list(range(7)) + [77]).reused == 4    # 7 shared -> one whole page


def test_sglang_inserts_generated_ids_at_request_end():
    d = Driver("sglang")
    d("a", [1, 2, 3], output=[4, 5, 6])                 # (input + output)[:committed] = [1..5]
    p = d("a", [1, 2, 3, 4, 5, 6, 7])
    assert (p.reused, p.source) == (5, 0)


def test_sglang_evicts_the_least_recently_used_unreferenced_leaf():
    d = Driver("sglang:max_total_tokens=8")
    d("A", [1, 2, 3, 4])
    d("B", [5, 6, 7, 8])
    assert d("A", [1, 2, 3, 4, 9]).reused == 4          # touches A; inserting 1 id evicts B (older leaf)
    p = d("B", [5, 6, 7, 8, 1])
    assert (p.reused, p.cause) == (0, "evicted")
    d = Driver("sglang:max_total_tokens=8")
    d("A", [1, 2, 3, 4])
    d("B", [5, 6, 7, 8])
    d("C", [9, 9])                                      # needs 2: A's leaf (least recent) goes whole
    assert d("B", [5, 6, 7, 8, 1]).reused == 4
    p = d("A", [1, 2, 3, 4, 1])
    assert (p.reused, p.cause) == (0, "evicted")


def test_sglang_mamba_radix_cache_needs_a_node_with_a_state():
    d = Driver("sglang:model=qwen3-next-80b-a3b")
    d("a", [1, 2, 3, 4, 5, 6], output=[7, 8])          # state at the end of [1..7]
    assert d("a", [1, 2, 3, 4, 5, 6, 7, 9]).reused == 7
    p = d("a", [1, 2, 3, 4, 5, 6])                     # a prefix again: capped at 5, split node has no state
    assert (p.reused, p.cause) == (0, "no_state_checkpoint")


# --- llama.cpp --------------------------------------------------------------------------------------
def test_llamacpp_always_evaluates_the_last_prompt_token():
    d = Driver("llama.cpp")
    d("a", [1, 2, 3, 4])
    assert d("a", [1, 2, 3, 4]).reused == 3


def test_llamacpp_slot_by_similarity_and_slot_stealing():
    d = Driver("llama.cpp:slots=2,cache_ram_mib=0")
    d("A", [1, 2, 3, 4])                                # LRU, ties to the last: slot 1 (`t_last_used <= t_last`)
    d("B", [5, 6, 7, 8])                                # no similar slot: LRU -> slot 0
    p = d("A", [1, 2, 3, 4, 9])
    assert (p.reused, p.unit) == (4, "slot 1")
    d = Driver("llama.cpp:slots=1,cache_ram_mib=0")
    d("A", [1, 2, 3, 4])
    d("B", [5, 6, 7, 8])                                # takes A's only slot
    p = d("A", [1, 2, 3, 4, 9])
    assert (p.reused, p.cause) == (0, "slot_stolen")


def test_llamacpp_host_prompt_cache_restores_a_stolen_prompt():
    d = Driver("llama.cpp:slots=1")
    d("A", [1, 2, 3, 4])
    d("B", [5, 6, 7, 8])                                # keeps < 50% of A's tokens: A saved to RAM first
    p = d("A", [1, 2, 3, 4, 9])
    assert (p.reused, p.unit, p.source) == (4, "ram 0", 0)


def test_llamacpp_cache_reuse_shifts_chunks():
    d = Driver("llama.cpp:cache_reuse=4")
    d("a", list(range(1, 21)))
    p = d("a", [1, 2, 3, 4, 5] + list(range(11, 21)) + [99])   # 6..10 dropped: 11..20 shifted back
    assert p.reused == 15
    d = Driver("llama.cpp")
    d("a", list(range(1, 21)))
    assert d("a", [1, 2, 3, 4, 5] + list(range(11, 21)) + [99]).reused == 5


def test_llamacpp_hybrid_checkpoint_restore_vs_forced_reprocessing():
    spec = "llama.cpp:model=qwen3-next-80b-a3b,n_ubatch=8,checkpoint_min_step=2"
    prompt = list(range(1000, 1100))                    # checkpoints at 100-4-8 = 88 and 100-4 = 96
    d = Driver(spec)
    d("a", prompt, output=[7] * 10)
    p = d("a", prompt[:92] + [5, 5, 5])                 # parts at 92: restore the newest <= 92
    assert (p.reused, p.unit) == (88, "slot 0 ckpt@88")
    d = Driver(spec)
    d("a", prompt, output=[7] * 10)
    p = d("a", prompt[:50] + [5, 5, 5])                 # nothing at or before 50
    assert (p.reused, p.cause) == (0, "no_state_checkpoint")
    d = Driver(spec + ",ctx_checkpoints=1")             # only the newest (96) is kept
    d("a", prompt, output=[7] * 10)
    assert d("a", prompt[:92] + [5, 5, 5]).reused == 0
    d = Driver(spec)                                    # extends everything held: no cut, no restore
    d("a", prompt, output=[7] * 10)
    assert d("a", prompt + [7] * 9 + [1]).reused == 109


# --- TensorRT-LLM -----------------------------------------------------------------------------------
def test_trtllm_partial_block_reuse_by_copy():
    d = Driver("trtllm:tokens_per_block=4")
    d("a", range(12))
    assert d("b", [0, 1, 2, 3, 4, 5, 99]).reused == 6           # 1 block + 2 ids copied from the next
    d = Driver("trtllm:tokens_per_block=4,partial_reuse=false")
    d("a", range(12))
    assert d("b", [0, 1, 2, 3, 4, 5, 99]).reused == 4


def test_trtllm_evicts_leaf_blocks_lru():
    d = Driver("trtllm:tokens_per_block=2,kv_blocks=4")
    d("A", [1, 2, 3, 4, 0])                             # blocks (1,2) -> (3,4)
    d("B", [5, 6, 7, 8, 0])                             # pool full
    d("A", [1, 2, 3, 4, 0])                             # touches A
    d("C", [9, 10, 0])                                  # one more block: B's leaf (7,8) goes, not A's (3,4)
    assert d("A", [1, 2, 3, 4, 0]).reused == 4
    p = d("B", [5, 6, 7, 8, 0])
    assert (p.reused, p.cause) == (2, "evicted")


# --- hosted APIs ------------------------------------------------------------------------------------
def test_openai_minimum_granularity_and_ttl():
    d = Driver("openai")
    ids = list(range(2000))
    p = d("a", ids[:1000], ts=0.0)
    assert p.reused == 0
    p = d("a", ids[:1000] + [1], ts=1.0)
    assert (p.reused, p.cause) == (0, "below_minimum")
    d("a", ids[:1400], ts=2.0)
    assert d("a", ids[:1400] + [5], ts=3.0).reused == 1280      # 1024 + 2 x 128 of the 1400 shared
    p = d("a", ids[:1400] + [6], ts=3.0 + 601)                   # idle past ttl_s
    assert (p.reused, p.cause) == (0, "expired")
    d = Driver("openai:ttl_s=86400")                             # extended retention
    d("a", ids[:1400], ts=0.0)
    assert d("a", ids[:1400] + [5], ts=3600.0).reused == 1280


def _blocks_prompt(n_blocks, size=100, start=0):
    return list(range(start, start + n_blocks * size))


def test_anthropic_breakpoints_and_the_20_block_lookback():
    spec = "anthropic:min_tokens=100"
    blocks = tuple(range(100, 3001, 100))               # 30 content blocks of 100 tokens
    ids = _blocks_prompt(30)
    d = Driver(spec)
    p = d("a", ids[:500], ts=0.0, breakpoints=(500,), content_blocks=blocks[:5])
    assert (p.reused, p.written) == (0, 500)
    # breakpoint at the end only: the look-back covers 3000, 2900, ..., 1100 (20 boundaries): 500 is out
    p = d("a", ids, ts=10.0, breakpoints=(3000,), content_blocks=blocks)
    assert (p.reused, p.cause) == (0, "lookback")
    d = Driver(spec)
    d("a", ids[:500], ts=0.0, breakpoints=(500,), content_blocks=blocks[:5])
    p = d("a", ids, ts=10.0, breakpoints=(2400,), content_blocks=blocks)   # 2400 .. 500: 20 boundaries
    assert (p.reused, p.written) == (500, 1900)


def test_anthropic_ttl_refreshed_on_hit_and_minimum_length():
    d = Driver("anthropic:min_tokens=100")
    ids = list(range(300))
    d("a", ids[:200], ts=0.0, breakpoints=(200,))
    assert d("a", ids[:200] + [1], ts=200.0, breakpoints=(200,)).reused == 200   # refreshed: lives to 500
    assert d("a", ids[:200] + [2], ts=450.0, breakpoints=(200,)).reused == 200
    p = d("a", ids[:200] + [3], ts=751.0, breakpoints=(200,))
    assert (p.reused, p.cause) == (0, "expired")
    d = Driver("anthropic")                              # minimum 1024: silently no cache
    d("a", ids[:200], ts=0.0)
    p = d("a", ids[:200] + [1], ts=1.0)
    assert (p.reused, p.written, p.cause) == (0, 0, "below_minimum")


def test_anthropic_automatic_breakpoint_and_prices():
    pre = parse_engine("anthropic:min_tokens=100")
    d = Driver("anthropic:min_tokens=100")
    ids = list(range(1000))
    p1 = d("a", ids[:400], ts=0.0)                      # automatic: one breakpoint at the prompt end
    assert (p1.reused, p1.written) == (0, 400)
    p2 = d("a", ids[:400] + ids[400:600], ts=1.0, content_blocks=(400, 600))
    assert (p2.reused, p2.written) == (400, 200)
    # $3/MTok base: 200 written x 1.25 + 400 read x 0.1, no uncached input, 10 output at $15/MTok
    assert pre.dollars(600, 10, 400, 200) == pytest.approx((200 * 3.75 + 400 * 0.3 + 10 * 15) / 1e6)


def test_anthropic_at_most_four_breakpoints():
    d = Driver("anthropic:min_tokens=1")
    with pytest.raises(ValueError, match="at most 4"):
        d("a", range(10), breakpoints=(1, 2, 3, 4, 5))


# --- specs ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec,field", [
    ("vllm:blok_size=4", "blok_size"), ("vllm:block_size=abc", "block_size"), ("vllm:block_size=0", "block_size"),
    ("sglang:eviction_policy=random", "eviction_policy"), ("llama.cpp:slots=-1", "slots"),
    ("vllm:kv_bytes=lots", "kv_bytes"), ("vllm:model=gpt-9", "model"), ("vllm@0.1", "version"),
    ("anthropic:ttl_s=-5", "ttl_s"), ("vllm:routing=random", "routing"), ("nosuch", "engine"),
    ("vllm:block_size", "block_size")])
def test_bad_specs_name_the_field(spec, field):
    with pytest.raises(ValueError, match=field):
        parse_engine(spec)


def test_presets_are_frozen_and_versioned():
    p = parse_engine("vllm@0.33")
    with pytest.raises(AttributeError):
        p.block_size = 32
    assert parse_engine(p.spec()) == p
    q = parse_engine("vllm:block_size=32,kv_blocks=8774")
    assert q.spec() == "vllm@0.33:block_size=32,kv_blocks=8774" and parse_engine(q.spec()) == q
    assert parse_engine("llama.cpp@latest").ctx_checkpoints == 32


def test_sglang_mamba_states_have_their_own_budget():
    d = Driver("sglang:model=qwen3-next-80b-a3b,mamba_slots=1")
    d("a", [1, 2, 3, 4])                                # state at the end of [1, 2, 3, 4] (no output)
    d("b", [5, 6, 7, 8])                                # second state: a's state goes (KV stays: a tombstone)
    assert d("b", [5, 6, 7, 8, 9]).reused == 4          # b's state is the one kept
    p = d("a", [1, 2, 3, 4, 9])
    assert (p.reused, p.cause) == (0, "no_state_checkpoint")


def test_openai_routes_by_the_first_tokens():
    from strata_lab.caches.fleet import Router
    from strata_lab.caches.presets import parse_engine

    r = Router(parse_engine("openai:replicas=8"))
    same = {r.route(Call(i, f"s{i}", as_ids(list(range(300)) + [i]))) for i in range(10)}
    assert len(same) == 1                               # one prefix: one cache machine
    other = {r.route(Call(i, "x", as_ids([i] + list(range(300))))) for i in range(40)}
    assert len(other) > 1


def test_compare_engines_defaults_to_every_engine_modelled():
    from strata_lab.caches.presets import ENGINES
    from strata_lab.caches.sweeps import compare_engines

    dump = Path(__file__).resolve().parent.parent / "dumps" / "agent.jsonl"
    s = compare_engines(dump)
    assert list(s["engine"]) == ["strata"] + [e for e in ENGINES if e != "strata"]
    assert s["hit_rate"].between(0, 1).all()
