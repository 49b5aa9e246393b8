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

Hash traces (Mooncake, Bailian) key whole blocks from their block hashes (`trace_block_keys`) instead of
hashing every id: the same numbers, at a fraction of the work. With time and concurrency a request's blocks
are pinned (reference counts) from `start` to `finish`.

Why one module: the pool's arrays, the two ways of keying blocks and the call's plan / start / finish all
work on the same state; split, each part would reach into the others.

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

import zlib
from collections import deque
from dataclasses import dataclass

import numpy as np

from strata_lab.caches.base import CacheModel, Hint, CachePlan
from strata_lab.caches.calls import Call, lcp_call
from strata_lab.caches.presets import EnginePreset, _optional_positive_int, _positive_int, parse_bytes
from strata_lab.caches.presets import parse_engine  # noqa: F401  (the doctest above)

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


# Block keys, vectorised: each block's ids are mixed into one 64-bit content word (per-position odd
# multipliers, then the splitmix64 finaliser), and the chain is a polynomial over those words:
#   key_k = parent * M^(k+1) + sum_{j<=k} c_j * M^(k-j)   (mod 2^64)
# computed for all new blocks at once as M^k * cumsum(c_j * M^-j). Equal keys <=> equal (parent, ids, extra)
# up to 64-bit collisions, as with vLLM's own hashes.
_M = np.uint64(0x9E3779B97F4A7C15)
_MINV = np.uint64(pow(0x9E3779B97F4A7C15, -1, 1 << 64))
_W = np.random.default_rng(0x5EED).integers(1, 1 << 62, 4096, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
_pows: dict = {}


def _powers(n: int):
    got = _pows.get("n", 0)
    if got < n + 1:
        m = max(n + 1, 2 * got, 1024)
        with np.errstate(over="ignore"):
            pw = np.cumprod(np.full(m, _M, dtype=np.uint64), dtype=np.uint64)
            inv = np.cumprod(np.full(m, _MINV, dtype=np.uint64), dtype=np.uint64)
        one = np.ones(1, dtype=np.uint64)
        _pows.update(n=m, pw=np.concatenate([one, pw]), inv=np.concatenate([one, inv]))
    return _pows["pw"], _pows["inv"]


def _mix(x):
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def chain_hashes(ids: np.ndarray, first: int, parent: int, block: int, salt=None) -> np.ndarray:
    """Keys (int64) of the full blocks of `ids`, the first of which is block number `first` of its
    sequence, chained to `parent` (the previous block's key; unused when first == 0). `salt` (cache_salt,
    LoRA name) is an extra key of block 0 only.

    >>> a = chain_hashes(np.arange(8, dtype=np.int32), 0, 0, 4)
    >>> b = chain_hashes(np.arange(4, 8, dtype=np.int32), 1, int(a[0]), 4)
    >>> bool(a[1] == b[0]), len(chain_hashes(np.arange(7, dtype=np.int32), 0, 0, 4))
    (True, 1)
    """
    n = len(ids) // block
    if n == 0:
        return np.zeros(0, np.int64)
    # array arithmetic on uint64 wraps mod 2^64 silently (only numpy scalar ops warn)
    x = ids[:n * block].astype(np.uint64).reshape(n, block)
    c = _mix((x * _W[:block]).sum(axis=1, dtype=np.uint64))
    if first == 0 and salt is not None:
        c[:1] ^= np.array([zlib.crc32(str(salt).encode()) | (1 << 40)], dtype=np.uint64)
    pw, inv = _powers(n)
    h = pw[:n] * np.cumsum(c * inv[:n], dtype=np.uint64)
    start = np.array([(parent if first > 0 else _ROOT) & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64)
    h += start * pw[1:n + 1]
    return h.view(np.int64)


_BLOCK_ROOT = np.uint64(0xB10C4E75)   # hash-trace keys live apart from id-level keys
_SUB = np.uint64(0xD6E8FEB86659FD93)
_UNIQUE = np.uint64(0x2545F4914F6CDD1D)


def trace_block_keys(ctx, B: int) -> tuple[np.ndarray, np.ndarray]:
    """Keys (int64) of every B-token block every call of a hash trace holds (`HashBlocks`), computed in one
    vectorised pass, and each call's offset into them. Needs T % B == 0.

    Each B-block lies inside one trace block i, at sub-block s; its ids are a function of (block i's index,
    s) alone, so equal keys <=> equal chains of trace blocks up to i and equal s: exactly when
    `chain_hashes` over the ids gives equal keys (up to 64-bit collisions, as there). Blocks reaching past
    the covered positions hold fresh output ids that nothing else holds: each gets a key of its own.
    """
    got = ctx.keys.get(B)
    if got is not None:
        return got
    T = ctx.T
    per = T // B
    seqs = ctx.seqs
    m = np.fromiter((len(x) for x in seqs), np.int64, len(seqs))
    start = np.concatenate([[0], np.cumsum(m)])
    flat = np.concatenate(seqs) if len(seqs) else np.zeros(0, np.int64)
    pos = np.arange(len(flat), dtype=np.int64) - np.repeat(start[:-1], m)   # block i of its call
    pw, inv = _powers(int(m.max()) if len(m) else 0)
    c = _mix(flat.astype(np.uint64) + _BLOCK_ROOT) * inv[pos]
    cs = np.cumsum(c, dtype=np.uint64)
    base = np.concatenate([np.zeros(1, np.uint64), cs])[np.repeat(start[:-1], m)]
    chain = pw[pos] * (cs - base) + _BLOCK_ROOT * pw[pos + 1]        # per call: key_i chains blocks 0..i
    # B-blocks per call: every full block of prompt + output (a call never keys more)
    n = ctx.lengths // B
    off = np.concatenate([[0], np.cumsum(n)])
    call = np.repeat(np.arange(len(n)), n)
    q = np.arange(int(off[-1]), dtype=np.int64) - off[:-1][call]
    i = np.minimum(q // per, m[call] - 1)
    keys = _mix(chain[start[:-1][call] + np.maximum(i, 0)] ^ ((q % per).astype(np.uint64) * _SUB))
    past = (q + 1) * B > ctx.covered[call]
    if past.any():
        keys[past] = _mix((call[past].astype(np.uint64) << np.uint64(24)) + q[past].astype(np.uint64)
                          + _UNIQUE) | np.uint64(1 << 63)
    got = ctx.keys[B] = (keys.view(np.int64), off)
    return got


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
        self.blk_ref = np.zeros(n, dtype=np.int32)    # requests in flight that hold it (pinned while > 0)
        self.pinned = 0                               # blocks with blk_ref > 0
        self.keying = None                            # "ids" or "blocks" (hash-trace calls): never mixed
        self.next_new = 0                             # blocks never used so far (the queue's head)
        self.release = 0
        self.cands = np.zeros(0, np.int64)
        self.ckeys = np.zeros(0, np.int64)
        self.cpos = 0
        self.by_hash: dict[int, int] = {}
        self.sessions: dict[str, tuple] = {}  # session -> (last call, key buf, id buf, length, salt, evictions)

    # -- pool --------------------------------------------------------------------------------------
    def _grow(self):
        n = len(self.blk_hash) * 2
        for name in ("blk_hash", "blk_cached", "blk_free", "blk_key", "blk_owner", "blk_state", "blk_ref"):
            a = getattr(self, name)
            b = np.zeros(n, dtype=a.dtype) if name != "blk_owner" else np.full(n, -1, dtype=a.dtype)
            b[:len(a)] = a
            setattr(self, name, b)

    def _refill(self, need: int):
        free = np.flatnonzero(self.blk_free[:self.next_new])
        if not len(free):
            raise RuntimeError("vllm: no free block (a request needs more blocks than the pool holds)")
        keys = self.blk_key[free]
        m = min(len(free), max(64, need, len(free) // 8))
        part = np.argpartition(keys, m - 1)[:m] if m < len(free) else np.arange(len(free))
        order = part[np.argsort(keys[part], kind="stable")]
        self.cands, self.ckeys, self.cpos = free[order], keys[order], 0

    def _alloc(self, n: int) -> np.ndarray:
        """Pop n blocks off the free queue's head: never-used blocks first, then the least recently freed
        (evicting their keys). The candidate list is the queue's head in key order; entries touched since
        it was built are skipped (their key changed), and every block freed later sorts after it."""
        got = []
        fresh = n if self.cap is None else max(min(n, self.cap - self.next_new), 0)
        if fresh:
            while self.next_new + fresh > len(self.blk_hash):
                self._grow()
            got.append(np.arange(self.next_new, self.next_new + fresh, dtype=np.int64))
            self.next_new += fresh
        rest = n - fresh
        while rest > 0:
            if self.cpos >= len(self.cands):
                self._refill(rest)
            chunk = self.cands[self.cpos:]
            ok = self.blk_free[chunk] & (self.blk_key[chunk] == self.ckeys[self.cpos:])
            idx = np.flatnonzero(ok)[:rest]
            self.cpos = len(self.cands) if len(idx) < rest else self.cpos + int(idx[-1]) + 1
            sel = chunk[idx]
            if len(sel):
                self.blk_free[sel] = False
                self._drop_many(sel[self.blk_cached[sel]])
                got.append(sel)
                rest -= len(sel)
        return np.concatenate(got) if len(got) > 1 else (got[0] if got else np.zeros(0, np.int64))

    def _drop_many(self, bs: np.ndarray):
        """Evict the keys of blocks `bs` (popped off the free queue)."""
        if not len(bs):
            return
        # a cached block is the one its key maps to (a duplicate is never cached): pop them all, in C
        # (a missing key raises: that invariant broken would be a bug)
        deque(map(self.by_hash.pop, self.blk_hash[bs].tolist()), maxlen=0)
        self.blk_cached[bs] = False
        self.blk_state[bs] = False
        self.evictions += len(bs)

    def _free_count(self, hit_ids: np.ndarray) -> int:
        """Blocks this call may take: the pool less the blocks requests in flight pin and its own hits
        (sequentially nothing else is in flight: cap - hits)."""
        if self.cap is None:
            return 1 << 62
        return self.cap - self.pinned - int((self.blk_ref[hit_ids] == 0).sum())

    def evict(self, budget: int) -> int:
        """Evict free cached blocks in free-queue order until at most `budget` blocks hold a key (a bounded
        pool; an unbounded one keeps no queue and evicts nothing)."""
        if self.cap is None:
            return 0
        n = int(self.blk_cached[:self.next_new].sum()) - budget
        if n <= 0:
            return 0
        free = np.flatnonzero(self.blk_free[:self.next_new] & self.blk_cached[:self.next_new])
        order = free[np.argsort(self.blk_key[free], kind="stable")][:n]
        self._drop_many(order)
        return len(order)

    # -- the call ----------------------------------------------------------------------------------
    def plan(self, call: Call, hint: Hint) -> CachePlan:
        B, prompt, P = self.B, call.prompt, call.prompt_len
        if self.mode == "none":
            return CachePlan(0, cause="no_state_checkpoint" if hint.exact > 0 else None, state=None)
        computed = P + max(len(call.output) - 1, 0) if self.preset.cache_output else P
        n_prompt, n_full, n_need = P // B, computed // B, -(-computed // B)
        n_total = max(n_full, n_prompt)
        n_max = (P - 1) // B if P else 0          # hit <= prompt_len - 1, floored to a block
        # The session keeps growable buffers of its chain's keys and block ids (kb, ib: [capacity]); this
        # call's chain overwrites them from the first block it does not share, so nothing is copied.
        st = self.sessions.get(call.session)
        if st is not None and st[4] == call.cache_salt:
            last, kb, ib, L = st[0], st[1], st[2], st[3]
            shared = hint.lcp if last is hint.prev else lcp_call(prompt, last)
            n_shared = min(shared // B, L)
            fresh_ok = st[5] == self.evictions   # nothing evicted since: the session's blocks still hold
        else:
            kb = ib = None
            n_shared, fresh_ok = 0, True
        if kb is None or len(kb) < n_need:
            cap = max(64, 2 * n_need if kb is not None else n_need)   # a session's first call: no slack
            nkb, nib = np.empty(cap, np.int64), np.empty(cap, np.int64)
            if n_shared:
                nkb[:n_shared], nib[:n_shared] = kb[:n_shared], ib[:n_shared]
            kb, ib = nkb, nib
        # keys of every full block the call will hold (prompt, then fed output), past the shared ones
        blocks = call.blocks if call.blocks is not None and call.blocks[0].T % B == 0 \
            and call.cache_salt is None else None
        keying = "ids" if blocks is None else "blocks"
        if self.keying is None:
            self.keying = keying
        elif self.keying != keying:
            raise ValueError(f"call {call.index}: hash-trace calls and id-level calls cannot share one vLLM "
                             "replay (their blocks are keyed differently)")
        if blocks is not None:  # a hash trace: keys from its blocks, not from every id (same numbers)
            keys, off = trace_block_keys(blocks[0], B)
            o = int(off[blocks[1]])
            kb[n_shared:n_total] = keys[o + n_shared:o + n_total]
        else:
            tail = call.tail(n_shared * B)[:(n_total - n_shared) * B] if n_full > n_prompt else \
                prompt[n_shared * B:n_prompt * B]
            kb[n_shared:n_total] = chain_hashes(tail, n_shared, int(kb[n_shared - 1]) if n_shared else 0, B,
                                                call.cache_salt)
        m = min(n_shared, n_max)
        if m and not fresh_ok:  # blocks the session left: still holding their keys?
            hit = ib[:m]
            ok = self.blk_cached[hit] & (self.blk_hash[hit] == kb[:m])
            if not ok.all():
                m = int(ok.argmin())
        k = m
        step = 16
        while k < n_max:  # past what the session left (or cached by other sessions): look keys up in chunks
            got = list(map(self.by_hash.get, kb[k:min(k + step, n_max)].tolist()))
            stop = got.index(None) if None in got else len(got)
            if stop:
                bs = np.array(got[:stop], dtype=np.int64)
                ok = self.blk_cached[bs]
                if not ok.all():
                    stop = int(ok.argmin())
                ib[k:k + stop] = bs[:stop]
                k += stop
            if stop < len(got):
                break
            step *= 4
        attn = k
        if self.mode == "align" and k:
            states = np.flatnonzero(self.blk_state[ib[:k]])
            k = int(states[-1]) + 1 if len(states) else 0
        reused = k * B
        cause = None
        if reused < hint.exact:
            if attn > k:
                cause = "no_state_checkpoint"
            elif (hint.exact // B) * B <= reused:
                cause = "block_rounding"
            elif k < min(n_shared, n_max):   # the session held block k when it left: evicted since
                cause = "evicted"
            else:
                cause = "not_cached"
        unit = f"blocks 0-{k - 1}" if k else ""
        source = int(self.blk_owner[ib[k - 1]]) if k else None
        return CachePlan(reused, unit=unit, source=source, cause=cause, state=(kb, ib, k, n_full, n_need))

    def admit(self, call: Call, plan: CachePlan) -> None:
        """The whole request at once (sequential replay): it starts and ends."""
        self.start(call, plan)
        self.finish(call, plan)

    def start(self, call: Call, plan: CachePlan) -> None:
        """The request is scheduled: its hit blocks leave the free queue, new blocks are allocated (evicting
        the queue's head) and its full blocks are cached; all of them stay pinned until `finish`."""
        if self.mode == "none":
            return
        B, P = self.B, call.prompt_len
        kb, ib, k, n_full, n_need = plan.state
        hit_ids = ib[:k]
        bounded = self.cap is not None   # an unbounded pool never evicts: no free queue to keep
        n_new = min(n_need - k, self._free_count(hit_ids))
        if bounded:
            self.blk_free[hit_ids] = False  # touched: out of the free queue while the request runs
        new_ids = self._alloc(n_new)
        ib[k:k + len(new_ids)] = new_ids
        j1 = min(k + len(new_ids), n_full)   # new blocks k..j1-1 are full: they get keys
        if j1 > k:
            full_ids = new_ids[:j1 - k]
            if self.mode == "align":
                ends = np.arange(k + 1, j1 + 1, dtype=np.int64) * B
                C = self.preset.max_num_batched_tokens
                self.blk_state[full_ids] = (ends >= P) | ((ends - k * B) % C == 0)
            else:
                self.blk_state[full_ids] = True
            # keys not cached yet map to their new block; an identical block cached already (a full
            # repeat's recomputed last block) is not merged: setdefault keeps the old one
            hs = kb[k:j1]
            got = np.fromiter(map(self.by_hash.setdefault, hs.tolist(), full_ids.tolist()), np.int64, len(hs))
            fresh = got == full_ids
            bs = full_ids[fresh]
            if len(bs):
                self.blk_hash[bs] = hs[fresh]
                self.blk_cached[bs] = True
                self.blk_owner[bs] = call.index
        n = k + len(new_ids)
        held = ib[:n].copy() if bounded else None
        if bounded and n:
            self.pinned += int((self.blk_ref[held] == 0).sum())
            self.blk_ref[held] += 1   # a request's blocks are distinct
        plan.state = (kb, ib, k, n_full, n_need, held)
        self.sessions[call.session] = (call, kb, ib, min(n_full, n), call.cache_salt, self.evictions)

    def finish(self, call: Call, plan: CachePlan) -> None:
        """The request ends: the blocks no other running request holds go back to the queue's tail, in
        reverse order (the chain's tail is evicted first)."""
        if self.mode == "none" or self.cap is None:
            return
        held = plan.state[5]
        if not len(held):
            return
        self.blk_ref[held] -= 1
        done = held[self.blk_ref[held] == 0]
        if len(done):
            self.pinned -= len(done)
            self.blk_key[done[::-1]] = self.release + np.arange(len(done), dtype=np.int64)
            self.release += len(done)
            self.blk_free[done] = True
