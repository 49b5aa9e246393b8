"""vLLM V1 automatic prefix caching, as `vllm/v1/core/kv_cache_utils.py` and `kv_cache_manager.py` do it.

- Only full blocks are cached (default 16 tokens). Each block's key chains its parent's key, the block's
  token ids and extra keys (`cache_salt` in the first block only), so two prompts that differ in one token
  share no block from that token's block on.
- A hit is the longest run of cached blocks, capped at `prompt_len - 1` and floored to a block: a 100 %
  repeat recomputes its whole last block (`get_computed_blocks`).
- Output ids are hashed as their blocks fill; the last generated id is never fed back, so it has no KV.
- A finite pool of `kv_blocks`; free blocks wait in a queue, a finished request's blocks appended to its
  tail in reverse order (the chain's tail goes first); allocation pops the head (LRU) and evicts its key.
- Hybrid (Mamba / Gated DeltaNet) models: the attention block grows to `hybrid_block_size`, and a hit needs
  a recurrent state too. `mamba_cache_mode` none: no prefix cache; all: a state at every block boundary;
  align: a state only where a scheduler step ends on a block boundary (prefill steps of
  `max_num_batched_tokens` from the hit, every token while decoding).

Per call the work is proportional to the new tokens: the session's block keys and block ids from its last
call are kept and checked in one vectorised gather; only blocks past the common prefix are hashed.

>>> from strata_lab.caches.calls import Call, as_ids
>>> from strata_lab.caches.base import Hint
>>> m = parse_engine("vllm:block_size=4").build()
>>> c0 = Call(0, "a", as_ids(range(10)), as_ids([50, 51]))
>>> m.step(c0, Hint(None, 0, 0)).reused
0
>>> c1 = Call(1, "b", as_ids(list(range(10)) + [7]))      # another session, same first 10 ids
>>> p = m.step(c1, Hint(None, 0, 0)); (p.reused, p.unit, p.source)
(8, 'blocks 0-1', 0)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .base import CacheModel, Hint, Plan
from .calls import Call, lcp
from .presets import EnginePreset, _optional_positive_int, _positive_int, parse_bytes, parse_engine

__all__ = ["Preset", "Model", "chain_hashes"]

_ROOT = 0x5EED  # NONE_HASH: vLLM draws it at random per process; any fixed value keeps replays deterministic


@dataclass(frozen=True)
class Preset(EnginePreset):
    engine = "vllm"
    block_size: int = 16
    hybrid_block_size: int = 528
    mamba_cache_mode: str = "align"
    max_num_batched_tokens: int = 8192
    cache_output: bool = True
    kv_blocks: int | None = None   # capacity: blocks, tokens or bytes (None everywhere: unbounded)
    kv_tokens: int | None = None
    kv_bytes: str | None = None

    def __post_init__(self):
        super().__post_init__()
        for f in ("block_size", "hybrid_block_size", "max_num_batched_tokens"):
            _positive_int(self, f)
        for f in ("kv_blocks", "kv_tokens"):
            _optional_positive_int(self, f)
        if self.kv_bytes is not None:
            parse_bytes(self.kv_bytes, f"{self.engine}: kv_bytes")
        if self.mamba_cache_mode not in ("none", "all", "align"):
            raise ValueError(f"vllm: mamba_cache_mode must be none, all or align, got {self.mamba_cache_mode!r}")

    @property
    def block(self) -> int:
        """Tokens per block as the engine runs: inflated on hybrid models."""
        return self.hybrid_block_size if self.shape.hybrid else self.block_size

    def capacity_blocks(self) -> int | None:
        b = self.block
        if self.kv_blocks is not None:
            return self.kv_blocks
        if self.kv_tokens is not None:
            return max(self.kv_tokens // b, 1)
        if self.kv_bytes is not None:
            per_block = self.shape.kv_bytes_per_token * b
            return max(parse_bytes(self.kv_bytes) // per_block, 1)
        return None


def chain_hashes(seq: np.ndarray, start: int, end: int, parent: int, block: int, salt) -> list[int]:
    """Keys of blocks start..end-1 of `seq`: hash((parent key, block ids, extra keys)), chained."""
    out = []
    if end <= start:
        return out
    data = seq[start * block:end * block].tobytes()
    w = 4 * block  # int32 ids
    h = parent
    for k in range(end - start):
        h = hash((h, data[k * w:(k + 1) * w], salt if start + k == 0 else None))
        out.append(h)
    return out


class Model(CacheModel):
    engine = "vllm"

    def __init__(self, preset: Preset):
        super().__init__(preset)
        self.B = preset.block
        self.cap = preset.capacity_blocks()
        self.hybrid = preset.shape.hybrid
        self.mode = preset.mamba_cache_mode if self.hybrid else "all"
        n = self.cap if self.cap is not None else 1024
        # per physical block: [block] arrays
        self.blk_hash = np.zeros(n, dtype=np.int64)   # key of the cached block
        self.blk_cached = np.zeros(n, dtype=bool)     # holds a key (not evicted, not partial)
        self.blk_free = np.zeros(n, dtype=bool)       # in the free queue
        self.blk_key = np.zeros(n, dtype=np.int64)    # position in the free queue (smaller: evicted first)
        self.blk_owner = np.full(n, -1, dtype=np.int64)  # call that cached it
        self.blk_state = np.zeros(n, dtype=bool)      # a recurrent state at its end (hybrid)
        self.next_new = 0                             # blocks never used so far (the queue's head)
        self.release = 0
        self.cands: list = []
        self.ckeys: list = []
        self.cpos = 0
        self.by_hash: dict[int, int] = {}
        self.tomb: set = set()                        # keys evicted (and not cached again)
        self.sessions: dict[str, tuple] = {}          # session -> (seq, keys[int64], block ids[int64], salt)

    # -- pool --------------------------------------------------------------------------------------
    def _grow(self):
        n = len(self.blk_hash) * 2
        for name in ("blk_hash", "blk_cached", "blk_free", "blk_key", "blk_owner", "blk_state"):
            a = getattr(self, name)
            b = np.zeros(n, dtype=a.dtype) if name != "blk_owner" else np.full(n, -1, dtype=a.dtype)
            b[:len(a)] = a
            setattr(self, name, b)

    def _refill(self):
        free = np.flatnonzero(self.blk_free[:self.next_new])
        if not len(free):
            raise RuntimeError("vllm: no free block (a request needs more blocks than the pool holds)")
        keys = self.blk_key[free]
        m = min(len(free), max(64, len(free) // 8))
        part = np.argpartition(keys, m - 1)[:m] if m < len(free) else np.arange(len(free))
        order = part[np.argsort(keys[part], kind="stable")]
        self.cands, self.ckeys, self.cpos = free[order].tolist(), keys[order].tolist(), 0

    def _pop(self) -> int:
        if self.cap is None or self.next_new < self.cap:
            b = self.next_new
            self.next_new += 1
            if b >= len(self.blk_hash):
                self._grow()
            return b
        while True:
            if self.cpos >= len(self.cands):
                self._refill()
            b, key = self.cands[self.cpos], self.ckeys[self.cpos]
            self.cpos += 1
            if self.blk_free[b] and self.blk_key[b] == key:
                self.blk_free[b] = False
                if self.blk_cached[b]:
                    self._drop(b)
                return b

    def _drop(self, b: int):
        h = int(self.blk_hash[b])
        if self.by_hash.get(h) == b:
            del self.by_hash[h]
        self.tomb.add(h)
        self.blk_cached[b] = False
        self.blk_state[b] = False
        self.evictions += 1

    def _free_count(self, in_use: int) -> int:
        return (self.cap - in_use) if self.cap is not None else 1 << 62

    def evict(self, budget: int) -> int:
        """Evict free cached blocks, LRU first, until at most `budget` blocks hold a key."""
        gone = 0
        while int(self.blk_cached.sum()) > budget:
            free = np.flatnonzero(self.blk_free[:self.next_new] & self.blk_cached[:self.next_new])
            if not len(free):
                break
            b = int(free[np.argmin(self.blk_key[free])])
            self._drop(b)
            gone += 1
        return gone

    # -- the call ----------------------------------------------------------------------------------
    def plan(self, call: Call, hint: Hint) -> Plan:
        B, prompt, P = self.B, call.prompt, call.prompt_len
        if self.mode == "none":
            return Plan(0, cause="no_state_checkpoint" if hint.exact > 0 else None, state=(np.zeros(0, np.int64), []))
        st = self.sessions.get(call.session)
        if st is not None and st[3] == call.cache_salt:
            seq, keys, ids, _ = st
            shared = hint.lcp if seq is hint.prev else lcp(prompt, seq)
            n_shared = min(shared // B, len(keys), len(ids))
        else:
            keys, ids, n_shared = np.zeros(0, np.int64), np.zeros(0, np.int64), 0
        n_prompt = P // B
        n_max = (P - 1) // B if P else 0          # hit <= prompt_len - 1, floored to a block
        new_keys = chain_hashes(prompt, n_shared, n_prompt, int(keys[n_shared - 1]) if n_shared else _ROOT,
                                B, call.cache_salt)
        m = min(n_shared, n_max)
        hit = ids[:m]
        if m:  # the blocks the session left: still holding their keys?
            ok = self.blk_cached[hit] & (self.blk_hash[hit] == keys[:m])
            if not ok.all():
                m = int(ok.argmin())
                hit = hit[:m]
        more = []
        k = m
        while k < n_max:  # blocks past what the session left (or cached by others)
            h = int(keys[k]) if k < n_shared else new_keys[k - n_shared]
            b = self.by_hash.get(h)
            if b is None or not self.blk_cached[b]:
                break
            more.append(b)
            k += 1
        hit_ids = np.concatenate([hit, np.asarray(more, dtype=np.int64)]) if more else hit
        attn = k
        if self.mode == "align" and k:
            states = np.flatnonzero(self.blk_state[hit_ids])
            k = int(states[-1]) + 1 if len(states) else 0
            hit_ids = hit_ids[:k]
        all_keys = (keys[:n_shared], new_keys)
        reused = k * B
        cause = None
        if reused < hint.exact:
            nxt = int(keys[k]) if k < n_shared else (new_keys[k - n_shared] if k - n_shared < len(new_keys) else None)
            if attn > k:
                cause = "no_state_checkpoint"
            elif (hint.exact // B) * B <= reused:
                cause = "block_rounding"
            elif nxt is not None and nxt in self.tomb:
                cause = "evicted"
            else:
                cause = "not_cached"
        unit = f"blocks 0-{k - 1}" if k else ""
        source = int(self.blk_owner[hit_ids[-1]]) if k else None
        return Plan(reused, unit=unit, source=source, cause=cause, state=(hit_ids, all_keys))

    def admit(self, call: Call, plan: Plan) -> None:
        if self.mode == "none":
            return
        B = self.B
        hit_ids, (old_keys, new_keys) = plan.state
        k = len(hit_ids)
        P = call.prompt_len
        computed = P + max(len(call.output) - 1, 0) if self.preset.cache_output else P
        seq = call.sequence()
        n_full = computed // B
        n_need = -(-computed // B)
        # keys of every full block of the computed ids: prompt blocks (planned) + output blocks
        n_prompt = P // B
        keys = np.empty(n_full, dtype=np.int64) if n_full else np.zeros(0, np.int64)
        head = np.concatenate([old_keys, np.asarray(new_keys, dtype=np.int64)])[:min(n_prompt, n_full)]
        keys[:len(head)] = head
        if n_full > len(head):
            keys[len(head):] = chain_hashes(seq, len(head), n_full, int(head[-1]) if len(head) else _ROOT, B,
                                            call.cache_salt)
        self.blk_free[hit_ids] = False  # touched: out of the free queue while the request runs
        n_new = min(n_need - k, self._free_count(k))
        new_ids = np.fromiter((self._pop() for _ in range(n_new)), dtype=np.int64, count=n_new)
        start = k * B
        C = self.preset.max_num_batched_tokens
        for i, b in enumerate(new_ids.tolist()):
            j = k + i
            if j >= n_full:
                break  # the partial last block: no key
            h = int(keys[j])
            end = (j + 1) * B
            if self.mode == "align":
                self.blk_state[b] = end > P or end == P or (end - start) % C == 0
            else:
                self.blk_state[b] = True
            if h in self.by_hash and self.blk_cached[self.by_hash[h]]:
                continue  # an identical block is cached already (a full repeat's last block): not merged
            self.by_hash[h] = b
            self.blk_hash[b] = h
            self.blk_cached[b] = True
            self.blk_owner[b] = call.index
            self.tomb.discard(h)
        # the request ends: all its blocks go back to the queue's tail in reverse order
        all_ids = np.concatenate([hit_ids, new_ids])
        n = len(all_ids)
        if n:
            self.blk_key[all_ids[::-1]] = self.release + np.arange(n, dtype=np.int64)
            self.release += n
            self.blk_free[all_ids] = True
        self.sessions[call.session] = (seq, keys, all_ids[:n_full], call.cache_salt)


parse_engine  # re-exported for the doctest above
