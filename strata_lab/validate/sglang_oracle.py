"""SGLang's own prefix cache, driven in-process: no model, no server, no GPU.

Run with a Python that imports sglang (it imports nothing from strata_lab):

    SGLANG_PYTHON sglang_oracle.py < job.json > result.json

`job.json`: {"page_size": 1, "max_total_tokens": 4000 (null: a pool big enough to never evict),
"eviction_policy": "lru", "tree": "unified" | "radix", "calls": [{"prompt": [ids], "output": [ids],
"salt": null}, ...]}. Output: {"version": "...", "tree": "<class and tree core>", "cached": [per call: the
prefix SGLang matched, its `cached_tokens`]}. `{"jobs": [job, ...]}` runs several in one process:
{"version": ..., "tree": ..., "results": [cached lists or {"error": ...}]}.

`tree`: "unified" is what the scheduler builds for a plain full-attention model in 0.5.x
(`registry.create_unified_radix_cache`: `UnifiedRadixCache` with the FULL component and the tree core the
engine selects, the bundled Rust one where it loads); "radix" is the classic `RadixCache` class.

Each call runs alone, as the scheduler drives the tree for one request at a time, with SGLang's own token
allocator (`TokenToKVPoolAllocator`, or `PagedTokenToKVPoolAllocator` when page_size > 1) of
`max_total_tokens` slots on the CPU:
- admission (`Req.init_next_round_input` -> `match_kv_cache`): `match_prefix` on the prompt capped at
  `len - 1` (`_compute_max_prefix_len`), then the matched node is locked;
- prefill (`alloc_for_extend`): evict for the extend tokens (paged: plus one page per request, as
  `alloc_paged_token_slots_extend` over-estimates), allocate them;
- after the prefill, unless the request already finished: `checkpoint` the prompt into the tree
  (`checkpoint_kv_cache`);
- one decode step per further output id (`alloc_for_decode_default`): evict for one slot (paged: one page),
  allocate it for the id that was sampled last;
- finish (`release_kv_cache`): `checkpoint` `(prompt + output)[:kv_committed_len]` (the last output id has
  no KV), free the row past the tree-owned part, unlock.
"""
from __future__ import annotations

import json
import sys
from array import array


class _Kv:
    """The request's kv record, the fields the tree reads."""

    def __init__(self, protected: int):
        self.req_pool_idx = 0
        self.cache_protected_len = protected
        self.cache_inserted_len = 0
        self.swa_evict_floor = 0


class _Req:
    """The fields of `schedule_batch.Req` that `checkpoint` reads, for one request."""

    def __init__(self, rid: str, prompt: list, salt):
        self.rid = rid
        self.origin_input_ids = array("q", prompt)
        self.full_untruncated_fill_ids = array("q", prompt)
        self.output_ids: list = []
        self.extra_key = None
        self.cache_salt = salt or None
        self.priority = None
        self.session_id = None
        self.session = None
        self.kv_rotation_base = None
        self.lock = None
        self.last_node = None
        self.finished_reason = None
        self.skip_radix_cache_insert = False
        self.kv = None
        self._finished = False

    def finished(self) -> bool:
        return self._finished


class _RowPool:
    """`ReqToTokenPool` for one request at a time: one row of KV slot indices."""

    def __init__(self, torch, length: int):
        self.req_to_token = torch.zeros((1, length), dtype=torch.int32)

    def write(self, index, values):
        self.req_to_token[index] = values.to(self.req_to_token.dtype)


def _tree(job: dict, allocator, pool, torch):
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams

    kind = job.get("tree", "unified")
    page = int(job.get("page_size") or 1)
    policy = job.get("eviction_policy") or "lru"
    if kind == "radix":
        from sglang.srt.mem_cache.radix_cache import RadixCache

        tree = RadixCache(CacheInitParams(disable=False, req_to_token_pool=pool,
                                          token_to_kv_pool_allocator=allocator, page_size=page,
                                          eviction_policy=policy))
        return tree, "RadixCache"
    if kind != "unified":
        raise ValueError(f"tree must be 'unified' or 'radix', got {kind!r}")
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    tree = UnifiedRadixCache(CacheInitParams(disable=False, req_to_token_pool=pool,
                                             token_to_kv_pool_allocator=allocator, page_size=page,
                                             eviction_policy=policy, tree_components=(ComponentType.FULL,)))
    return tree, f"UnifiedRadixCache ({type(tree.tree_core).__name__})"


def run(job: dict) -> dict:
    import torch
    import sglang
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
    from sglang.srt.mem_cache.common import evict_from_tree_cache
    from sglang.srt.mem_cache.radix_cache import RadixKey

    page = int(job.get("page_size") or 1)
    calls = job["calls"]
    longest = max((len(c["prompt"]) + len(c["output"]) for c in calls), default=1)
    size = job.get("max_total_tokens")
    if size is None:   # unbounded: every id of every call fits, each call's last page included
        size = sum(len(c["prompt"]) + len(c["output"]) + page for c in calls) + 2 * page
    size = int(size) // page * page
    if page == 1:
        alloc = TokenToKVPoolAllocator(size, torch.float16, "cpu", None, False)
    else:
        alloc = PagedTokenToKVPoolAllocator(size, page, torch.float16, "cpu", None, False)
        alloc.use_triton_kernels = False   # the CPU path of the same allocation
    pool = _RowPool(torch, longest + page)
    tree, name = _tree(job, alloc, pool, torch)
    row = pool.req_to_token[0]
    t64 = lambda *v: torch.tensor(v, dtype=torch.int64)   # noqa: E731

    def get(n: int, what: str, i: int, **kw):
        if page == 1:
            evict_from_tree_cache(tree, n)
            loc = alloc.alloc(n)
        else:
            evict_from_tree_cache(tree, kw.pop("demand"))
            loc = alloc.alloc_extend(**kw) if what == "prompt" else alloc.alloc_decode(**kw)
        if loc is None:
            raise RuntimeError(f"call {i}: SGLang found no free KV slots for the {what} (pool too small)")
        return loc

    out = []
    for i, c in enumerate(calls):
        prompt, gen = list(c["prompt"]), list(c["output"])
        if not prompt:
            out.append(None)
            continue
        req = _Req(f"r{i}", prompt, c.get("salt"))
        key = RadixKey(array("q", prompt), None, limit=max(len(prompt) - 1, 0), cache_salt=req.cache_salt)
        m = tree.match_prefix(MatchPrefixParams(key=key))
        hit = m.device_prefix_len
        req.kv = _Kv(hit if getattr(m, "cache_protected_len", None) is None else m.cache_protected_len)
        req.last_node = m.last_device_node
        req.lock = tree.lock(m.last_device_node)
        if hit:
            row[:hit] = tree.path_device_indices(m.last_device_node)[:hit].to(row.dtype)
        P = len(prompt)
        need = P - hit
        if need:
            loc = get(need, "prompt", i, demand=need + page, prefix_lens=t64(hit), prefix_lens_cpu=t64(hit),
                      seq_lens=t64(P), seq_lens_cpu=t64(P),
                      last_loc=t64(int(row[hit - 1]) if hit else -1), extend_num_tokens=need)
            row[hit:P] = loc.to(row.dtype)
        committed = P   # no output (`max_new_tokens` 0): the request finishes with its prefill
        req.output_ids.extend(gen[:1])
        if len(gen) > 1:
            tree.checkpoint(req, up_to=P)
        for t in gen[1:]:
            loc = get(1, "decode", i, demand=page, seq_lens=t64(committed + 1), seq_lens_cpu=t64(committed + 1),
                      last_loc=t64(int(row[committed - 1])))
            row[committed] = int(loc[0])
            committed += 1
            req.output_ids.append(t)
        req._finished = True
        req.full_untruncated_fill_ids = array("q", prompt + gen)
        tree.checkpoint(req, up_to=committed)
        lo = req.kv.cache_protected_len
        if committed > lo:
            alloc.free(row[lo:committed].to(torch.int64))
        tree.unlock(req.lock)
        req.lock = None
        out.append(hit)
    return {"version": sglang.__version__, "tree": name, "cached": out}


def run_many(jobs: list) -> dict:
    """Several jobs in one process (sglang imports once); a job SGLang cannot serve gets {"error": ...}."""
    out, version, tree = [], None, None
    for job in jobs:
        try:
            r = run(job)
            version, tree = r["version"], r["tree"]
            out.append(r["cached"])
        except RuntimeError as e:
            out.append({"error": str(e)})
    return {"version": version, "tree": tree, "results": out}


if __name__ == "__main__":
    import logging

    logging.disable(logging.WARNING)
    doc = json.load(sys.stdin)
    json.dump(run_many(doc["jobs"]) if "jobs" in doc else run(doc), sys.stdout)
