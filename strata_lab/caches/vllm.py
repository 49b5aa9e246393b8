"""vLLM V1 automatic prefix caching, as `vllm/v1/core/kv_cache_utils.py` and `kv_cache_manager.py` do it.

- Only full blocks are cached (default 16 tokens). Each block's key chains its parent's key, the block's
  token ids and extra keys (`cache_salt` in the first block only), so two prompts that differ in one token
  share no block from that token's block on.
- A hit is the longest run of cached blocks, capped at `prompt_len - 1` and floored to a block: a 100 %
  repeat recomputes its whole last block (`get_computed_blocks`).
- Output ids are hashed as their blocks fill; the last generated id is never fed back, so it has no KV.
- A finite pool of `kv_blocks` (vLLM's logged `num_gpu_blocks`), one of which is the null block: N blocks
  hold N-1. Free blocks wait in a queue; a finished request's blocks are freed in reverse order (the
  chain's tail goes first), those holding a key appended to the queue's tail, those without one (the
  partial last block) put at its head; allocation pops the head and evicts its key.
- Identical full blocks are not merged: a second copy (a retried prompt's recomputed last block) keeps its
  key too, a lookup takes the first copy cached, and evicting one copy leaves the others.

The pool rules, as the installed vLLM 0.32 has them (`vllm/v1/core/block_pool.py`):

    self.null_block = self.free_block_queue.popleft()          # BlockPool.__init__
    self.null_block.is_null = True
    ...
    if block.block_hash is None or not self.enable_caching:    # BlockPool.free_blocks
        # LIFO reuse of non-cached blocks for better GPU locality.
        blocks_to_evict_first.append(block)
    else:
        # FIFO reuse of cached blocks for LRU eviction behavior.
        blocks_to_evict_last.append(block)
    ...
    self.free_block_queue.prepend_n(blocks_to_evict_first)
    self.free_block_queue.append_n(blocks_to_evict_last)

    NOTE #1: We currently don't de-duplicate the blocks in the cache,       # BlockHashToBlockMap
    meaning that if a block becomes full and is cached, we don't check
    if there is already an identical block in the cache.
    ...
    if isinstance(blocks, dict):                                # get_one_block: the first copy
        return next(iter(blocks.values()))

and `vllm/v1/engine/input_processor.py` (a prompt of `max_model_len` ids or more is refused):

    if prompt_len > max_prompt_len: ... raise VLLMValidationError(
    elif prompt_len == max_prompt_len and model_config.runner_type == "generate": ... raise

and `single_type_kv_cache_manager.py`: `self.block_pool.free_blocks(reversed(self.pop_blocks_for_free(
request_id)))` ("Free blocks in reverse order so that the tail blocks are freed first").
- Hybrid (Mamba / Gated DeltaNet) models: the attention block grows to `hybrid_block_size`, and a hit needs
  a recurrent state too. `mamba_cache_mode` none: no prefix cache; all: a state at every block boundary;
  align: a state only where a scheduler step ends on a block boundary (prefill steps of
  `max_num_batched_tokens` from the hit, every token while decoding).

Hash traces (Mooncake, Bailian) key whole blocks from their block hashes (`trace_block_keys`) instead of
hashing every id: the same numbers, at a fraction of the work. With time and concurrency a request's blocks
are pinned (reference counts) from `start` to `finish`.

Why one module: the pool's arrays, the two ways of keying blocks and the call's plan / start / finish all
work on the same state, and the `vllm serve` flags that configure them change together from one vLLM
release to the next, with the quoted source lines next to the rules they justify.

Per call the work is proportional to the new tokens: the session's block keys and block ids from its last
call are kept and checked in one vectorised gather; only blocks past the common prefix are hashed.

>>> from strata_lab.caches.call_ids import Call, as_ids
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

import re
import zlib
from dataclasses import dataclass

import numpy as np

from strata_lab.caches.base import CacheModel, Hint, CachePlan
from strata_lab.caches.call_ids import Call, lcp_call
from strata_lab.caches.presets import EnginePreset, _optional_positive_int, _positive_int, parse_bytes
from strata_lab.caches.presets import parse_engine  # noqa: F401  (the doctest above)

__all__ = ["Preset", "Model", "chain_hashes", "parse_args"]

_ROOT = 0x5EED  # NONE_HASH: vLLM draws it at random per process; any fixed value keeps replays deterministic


@dataclass(frozen=True)
class Preset(EnginePreset):
    engine = "vllm"
    block_size: int = 16
    hybrid_block_size: int = 528
    mamba_cache_mode: str = "align"
    max_num_batched_tokens: int = 8192
    cache_output: bool = True
    kv_blocks: int | None = None   # capacity: blocks (vLLM's num_gpu_blocks, null block included), tokens or
    kv_tokens: int | None = None   # bytes (None everywhere: unbounded)
    kv_bytes: str | None = None
    enable_prefix_caching: bool = True
    max_model_len: int | None = None   # prompts of max_model_len ids or more are refused (None: no limit)

    def __post_init__(self):
        super().__post_init__()
        for f in ("block_size", "hybrid_block_size", "max_num_batched_tokens"):
            _positive_int(self, f)
        for f in ("kv_blocks", "kv_tokens", "max_model_len"):
            _optional_positive_int(self, f)
        if self.kv_blocks is not None and self.kv_blocks < 2:
            raise ValueError(f"vllm: kv_blocks must be >= 2 (one of them is vLLM's null block), got {self.kv_blocks}")
        if self.kv_bytes is not None:
            parse_bytes(self.kv_bytes, f"{self.engine}: kv_bytes")
        if self.mamba_cache_mode not in ("none", "all", "align"):
            raise ValueError(f"vllm: mamba_cache_mode must be none, all or align, got {self.mamba_cache_mode!r}")

    @property
    def block(self) -> int:
        """Tokens per block as the engine runs: inflated on hybrid models."""
        return self.hybrid_block_size if self.shape.hybrid else self.block_size

    def capacity_blocks(self) -> int | None:
        """Blocks in the pool as vLLM logs them (`num_gpu_blocks`), the null block included."""
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


# `vllm serve` flags (vllm/engine/arg_utils.py, 0.32) -> preset fields. Flags that change nothing in the
# prefix cache are listed apart with their arity; any other flag is refused by name.
_FLAGS = {"--block-size": ("block_size", int), "--num-gpu-blocks-override": ("kv_blocks", int),
          "--max-num-batched-tokens": ("max_num_batched_tokens", int), "--max-model-len": ("max_model_len", int),
          "--mamba-cache-mode": ("mamba_cache_mode", str)}
_BOOLS = {"--enable-prefix-caching": ("enable_prefix_caching", True),
          "--no-enable-prefix-caching": ("enable_prefix_caching", False)}
_NEUTRAL = {"--enable-prompt-tokens-details": 0, "--no-enable-prompt-tokens-details": 0, "--host": 1, "--port": 1,
            "--dtype": 1, "--seed": 1, "--max-num-seqs": 1, "--served-model-name": 1, "--disable-log-stats": 0,
            "--enable-log-requests": 0, "--disable-log-requests": 0, "--prefix-caching-hash-algo": 1,
            "--tokenizer": 1, "--generation-config": 1, "--uvicorn-log-level": 1, "--enforce-eager": 0,
            "--gpu-memory-utilization": 1, "--kv-cache-dtype": 1, "--trust-remote-code": 0}


def _human_int(flag: str, text: str) -> int:
    """vLLM's `human_readable_int`: 25k = 25000, 25K = 25600 (binary), plain ints as they are."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgG]?)", text.strip())
    if not m:
        raise ValueError(f"vllm: args: {flag} expects an integer, got {text!r}")
    unit = m.group(2)
    mult = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "K": 2**10, "M": 2**20, "G": 2**30}[unit]
    v = float(m.group(1)) * mult
    if v != int(v):
        raise ValueError(f"vllm: args: {flag} expects an integer, got {text!r}")
    return int(v)


def parse_args(argv: list, preset) -> dict:
    """Preset fields from a `vllm serve` command line (`serve` and the model path may lead); `--flag value`
    and `--flag=value` as argparse reads them.

    >>> parse_args(["--block-size", "32", "--num-gpu-blocks-override=300", "--no-enable-prefix-caching"], None)
    {'block_size': 32, 'kv_blocks': 300, 'enable_prefix_caching': False}
    """
    out: dict = {}
    i = 0
    if argv and argv[0] == "serve":
        i = 1
    if i < len(argv) and not argv[i].startswith("-"):
        i += 1   # the model: its shape comes from `model=`, not from the folder
    while i < len(argv):
        a = argv[i]
        flag, eq, val = a.partition("=")
        if flag in _FLAGS:
            if not eq:
                if i + 1 >= len(argv):
                    raise ValueError(f"vllm: args: {flag} expects a value")
                i += 1
                val = argv[i]
            field, kind = _FLAGS[flag]
            out[field] = _human_int(flag, val) if kind is int else val
        elif flag in _BOOLS and not eq:
            out[_BOOLS[flag][0]] = _BOOLS[flag][1]
        elif flag in _NEUTRAL:
            i += 0 if eq else _NEUTRAL[flag]
        else:
            raise ValueError(f"vllm: args: unknown or unsupported flag {a!r} (supported: "
                             f"{', '.join(sorted(_FLAGS) + sorted(_BOOLS))}; no effect on the cache: "
                             f"{', '.join(sorted(_NEUTRAL))})")
        i += 1
    return out


def _is_none(x) -> bool:
    return x is None


def _one(b: int) -> list:
    return [b]


class Model(CacheModel):
    engine = "vllm"
    stored_first = 1024   # blocks of a bounded pool stored up front (the rest as the free queue reaches them)

    def __init__(self, preset: Preset):
        super().__init__(preset)
        self.B = preset.block
        n_gpu = preset.capacity_blocks()
        self.cap = None if n_gpu is None else max(n_gpu - 1, 1)   # usable: all but the null block
        self.hybrid = preset.shape.hybrid
        self.mode = preset.mamba_cache_mode if self.hybrid else "all"
        # a bounded pool's never-used blocks past the first `next_new` are not stored: they are free, in id order,
        # before every block freed to the tail (`_materialise` adds them as the free queue reaches them), so a
        # capacity far beyond the trace costs no memory or time
        n = min(self.cap, self.stored_first) if self.cap is not None else 1024
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
        self.blk_first = np.zeros(n, dtype=bool)      # the first copy of its key (the one a lookup takes)
        self.next_new = 0                             # blocks never used so far (unbounded pool)
        self.release = 0                              # next queue key at the tail
        self.head = 0                                 # last queue key given at the head
        self.front: list = []                         # blocks put at the head since (popped from the end)
        if self.cap is not None:                      # vLLM's queue starts as every block in id order
            self.next_new = n
            self.blk_free[:] = True
            self.blk_key[:] = np.arange(n, dtype=np.int64)
            self.release = self.cap
        self.cands = np.zeros(0, np.int64)
        self.ckeys = np.zeros(0, np.int64)
        self.cpos = 0
        self.by_hash: dict[int, list] = {}   # key -> blocks holding it, first cached first
        self.sessions: dict[str, tuple] = {}  # session -> (last call, key buf, id buf, length, salt, evictions)

    # -- pool --------------------------------------------------------------------------------------
    def _grow(self):
        n = len(self.blk_hash) * 2
        for name in ("blk_hash", "blk_cached", "blk_free", "blk_key", "blk_owner", "blk_state", "blk_ref",
                     "blk_first"):
            a = getattr(self, name)
            b = np.zeros(n, dtype=a.dtype) if name != "blk_owner" else np.full(n, -1, dtype=a.dtype)
            b[:len(a)] = a
            setattr(self, name, b)

    def _materialise(self, need: int):
        """Store never-used blocks of a bounded pool until the candidates `_refill` takes (the
        max(64, need, free // 8) smallest keys) all come before every block freed to the tail (head and
        never-used keys are below `cap`), or the whole pool is stored."""
        while self.next_new < self.cap:
            free = self.blk_free[:self.next_new]
            small = int((free & (self.blk_key[:self.next_new] < self.cap)).sum())
            if small >= max(64, need, int(free.sum()) // 8):
                return
            if self.next_new == len(self.blk_hash):
                self._grow()
            end = min(self.cap, len(self.blk_hash))
            self.blk_free[self.next_new:end] = True
            self.blk_key[self.next_new:end] = np.arange(self.next_new, end, dtype=np.int64)
            self.next_new = end

    def _refill(self, need: int):
        if self.cap is not None:
            self._materialise(need)
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
        fresh = n if self.cap is None else 0
        if fresh:
            while self.next_new + fresh > len(self.blk_hash):
                self._grow()
            got.append(np.arange(self.next_new, self.next_new + fresh, dtype=np.int64))
            self.next_new += fresh
        rest = n - fresh
        front = self.front
        while rest > 0 and front:   # blocks put at the head, newest first
            b = front[-1][0]
            if self.blk_free[b] and self.blk_key[b] == front[-1][1]:
                self.blk_free[b] = False
                self._drop_many(np.array([b], dtype=np.int64)[self.blk_cached[b:b + 1]])
                got.append(np.array([b], dtype=np.int64))
                rest -= 1
            front.pop()
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
        hs = self.blk_hash[bs].tolist()
        by_hash = self.by_hash
        for h, b in zip(hs, bs.tolist()):
            copies = by_hash.get(h)
            if copies is None or b not in copies:
                continue
            copies.remove(b)
            if not copies:
                del by_hash[h]
            elif self.blk_first[b]:
                self.blk_first[copies[0]] = True
        self.blk_cached[bs] = False
        self.blk_first[bs] = False
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
        mml = self.preset.max_model_len
        if mml is not None and P >= mml:   # no room for one generated id: HTTP 400, nothing cached
            return CachePlan(0, cause="refused", state=None)
        if not self.preset.enable_prefix_caching:
            return CachePlan(0, cause="not_cached" if hint.exact > 0 else None, state=None)
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
        else:
            kb = ib = None
            n_shared = 0
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
        if m:  # blocks the session left: still holding their keys, and the copies a lookup takes?
            hit = ib[:m]
            ok = self.blk_cached[hit] & (self.blk_hash[hit] == kb[:m]) & self.blk_first[hit]
            if not ok.all():
                m = int(ok.argmin())
        k = m
        step = 16
        while k < n_max:  # past what the session left (or cached by other sessions): look keys up in chunks
            got = list(map(self.by_hash.get, kb[k:min(k + step, n_max)].tolist()))
            stop = got.index(None) if None in got else len(got)
            if stop:
                ib[k:k + stop] = [c[0] for c in got[:stop]]
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
        if plan.state is None:   # refused, or no prefix cache
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
            by_hash = self.by_hash
            # an identical block cached already (a full repeat's recomputed last block) is not merged:
            # this copy holds the key too, behind the first one
            hs = kb[k:j1]
            hl, fl = hs.tolist(), full_ids.tolist()
            got = list(map(by_hash.get, hl))
            first = np.fromiter(map(_is_none, got), dtype=bool, count=len(got))
            if first.all():   # the usual case, in C: every key new (a chain's keys are distinct)
                by_hash.update(zip(hl, map(_one, fl)))
            else:
                for h, b, copies in zip(hl, fl, got):
                    if copies is None:
                        by_hash[h] = [b]
                    else:
                        copies.append(b)
            self.blk_hash[full_ids] = hs
            self.blk_cached[full_ids] = True
            self.blk_first[full_ids] = first
            self.blk_owner[full_ids] = call.index
        n = k + len(new_ids)
        held = ib[:n].copy() if bounded else None
        if bounded and n:
            self.pinned += int((self.blk_ref[held] == 0).sum())
            self.blk_ref[held] += 1   # a request's blocks are distinct
        plan.state = (kb, ib, k, n_full, n_need, held)
        self.sessions[call.session] = (call, kb, ib, min(n_full, n), call.cache_salt, self.evictions)

    def finish(self, call: Call, plan: CachePlan) -> None:
        """The request ends: the blocks no other running request holds are freed in reverse order (the
        chain's tail is evicted first); keyed ones go to the free queue's tail, the others (a partial last
        block) to its head, where the next allocation takes them first."""
        if plan.state is None or self.cap is None:
            return
        held = plan.state[5]
        if not len(held):
            return
        self.blk_ref[held] -= 1
        done = held[self.blk_ref[held] == 0]
        if len(done):
            self.pinned -= len(done)
            rev = done[::-1]
            keyed = self.blk_cached[rev]
            tail, head = rev[keyed], rev[~keyed]
            self.blk_key[tail] = self.release + np.arange(len(tail), dtype=np.int64)
            self.release += len(tail)
            if len(head):
                self.head -= len(head)
                keys = self.head + np.arange(len(head), dtype=np.int64)
                self.blk_key[head] = keys
                self.front.extend(zip(head[::-1].tolist(), keys[::-1].tolist()))
            self.blk_free[done] = True
