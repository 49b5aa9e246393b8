"""vLLM's own prefix cache, driven in-process: the second oracle, no model and no server.

Run with a Python that has vLLM (it imports nothing from strata_lab):

    VLLM_PYTHON vllm_oracle.py < job.json > result.json

`job.json`: {"block_size": 16, "num_gpu_blocks": 300 (null: big enough to never evict), "enable_caching": true,
"max_num_batched_tokens": 8192, "max_model_len": 1048576, "calls": [{"prompt": [ids], "output": [ids],
"salt": null}, ...]}. Output: {"version": "...", "cached": [per call: vLLM's num_cached_tokens, or null when
refused]}. `{"jobs": [job, ...]}` runs several in one process: {"version": ..., "results": [cached lists]}.

Each call runs alone, as vLLM's `Scheduler` drives `KVCacheManager` for one request at a time: the lookup
(`get_computed_blocks`), the prefill in steps of `max_num_batched_tokens` (`allocate_slots` with the hit
blocks on the first), one `allocate_slots(request, 1)` per decode step with the sampled id appended after
each step (the block hasher hashes output blocks as they fill), then `free` (blocks back in reverse order).
"""
from __future__ import annotations

import json
import sys


def run(job: dict) -> dict:
    import torch
    import vllm
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.request import Request

    B = int(job["block_size"])
    calls = job["calls"]
    max_len = int(job.get("max_model_len") or 1 << 20)
    n_blocks = job.get("num_gpu_blocks")
    if n_blocks is None:  # unbounded: every id of every call fits, plus the null block
        n_blocks = sum(-(-(len(c["prompt"]) + len(c["output"])) // B) for c in calls) + 2
    hash_fn = get_hash_fn_by_name("sha256")
    init_none_hash(hash_fn)
    spec = FullAttentionSpec(block_size=B, num_kv_heads=1, head_size=32, dtype=torch.float16)
    cfg = KVCacheConfig(num_blocks=int(n_blocks), kv_cache_tensors=[],
                        kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)])
    mgr = KVCacheManager(cfg, max_model_len=max_len, scheduler_block_size=B, hash_block_size=B,
                         enable_caching=bool(job.get("enable_caching", True)))
    hasher = get_request_block_hasher(B, hash_fn)
    C = int(job.get("max_num_batched_tokens") or 8192)
    out = []
    for i, c in enumerate(calls):
        prompt, gen = list(c["prompt"]), list(c["output"])
        if len(prompt) >= max_len or not gen:
            out.append(None)   # refused: prompt + one generated id must fit the context
            continue
        req = Request(f"r{i}", prompt, SamplingParams(max_tokens=len(gen)), None, block_hasher=hasher,
                      cache_salt=c.get("salt"))
        blocks, hit, _ = mgr.get_computed_blocks(req)
        left, first = len(prompt) - hit, True
        req.num_computed_tokens = 0
        while left > 0:
            n = min(left, C)
            if first:
                got = mgr.allocate_slots(req, n, num_new_computed_tokens=hit, new_computed_blocks=blocks)
                req.num_computed_tokens = hit + n
                first = False
            else:
                got = mgr.allocate_slots(req, n)
                req.num_computed_tokens += n
            if got is None:
                raise RuntimeError(f"call {i}: vLLM found no free blocks for the prompt (pool too small)")
            left -= n
        req.num_cached_tokens = hit
        req.append_output_token_ids(gen[0])
        for t in gen[1:]:
            if mgr.allocate_slots(req, 1) is None:
                raise RuntimeError(f"call {i}: vLLM found no free block while decoding (pool too small)")
            req.num_computed_tokens += 1
            req.append_output_token_ids(t)
        mgr.free(req)
        out.append(hit)
    return {"version": vllm.__version__, "cached": out}


def run_many(jobs: list) -> dict:
    """Several jobs in one process (vLLM imports once); a job vLLM cannot serve gets {"error": ...}."""
    out = []
    version = None
    for job in jobs:
        try:
            r = run(job)
            version = r["version"]
            out.append(r["cached"])
        except RuntimeError as e:
            out.append({"error": str(e)})
    return {"version": version, "results": out}


if __name__ == "__main__":
    doc = json.load(sys.stdin)
    json.dump(run_many(doc["jobs"]) if "jobs" in doc else run(doc), sys.stdout)
