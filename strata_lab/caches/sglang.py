"""SGLang RadixAttention, as `python/sglang/srt/mem_cache/radix_cache.py` and `mamba_radix_cache.py` do it.

- A radix tree over token ids; keys are truncated to whole pages (`page_size`, usually 1) and a paged match
  compares whole pages. A different `cache_salt` (or LoRA) never shares nodes.
- Lookup: the longest cached prefix of `prompt[:len - 1]` (the scheduler caps at `input_len - 1`), splitting
  the node where the prompt parts; a match refreshes the access time along the path.
- At request end `(prompt + output)[:kv_committed_len]` is inserted (the last output id has no KV).
- Capacity in tokens: only evictable leaves go (no running request holds them, no child), lowest score
  first (`lru` default, `lfu`, `fifo`, `mru`, `filo`); a parent re-enters the heap when it becomes a leaf.
  `lfu` counts a hit on each node of the path a request inserts (prompt and output), not at the lookup.
- Hybrid models (`MambaRadixCache`): a node may also hold the recurrent state at its end; a hit is the
  deepest node on the matched path that still holds one. States have their own budget (`mamba_slots`),
  LRU, and an evicted state leaves its KV (a tombstone).

>>> from strata_lab.caches.call_ids import Call, as_ids
>>> from strata_lab.caches.base import Hint
>>> from strata_lab.caches.presets import parse_engine
>>> m = parse_engine("sglang").build()
>>> _ = m.step(Call(0, "a", as_ids([1, 2, 3, 4, 5]), as_ids([6, 7])), Hint(None, 0, 0))
>>> p = m.step(Call(1, "b", as_ids([1, 2, 3, 4, 5, 6, 9])), Hint(None, 0, 0)); (p.reused, p.source)
(6, 0)
>>> m.step(Call(2, "c", as_ids([1, 2, 3, 4, 5])), Hint(None, 0, 0)).reused    # a full repeat: len - 1
4
"""
from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from strata_lab.caches.base import CacheModel, Hint, CachePlan
from strata_lab.caches.call_ids import Call, lcp, lcp_call
from strata_lab.caches.presets import EnginePreset, _optional_positive_int, _positive_int, parse_bytes

__all__ = ["Preset", "Model"]

POLICIES = ("lru", "lfu", "fifo", "mru", "filo")


@dataclass(frozen=True)
class Preset(EnginePreset):
    engine = "sglang"
    page_size: int = 1
    eviction_policy: str = "lru"
    mamba_slots: int = 0
    mamba_track_interval: int = 0
    max_total_tokens: int | None = None   # capacity: tokens or bytes (None: unbounded)
    kv_bytes: str | None = None

    def __post_init__(self):
        super().__post_init__()
        _positive_int(self, "page_size")
        _positive_int(self, "mamba_slots", zero=True)
        _positive_int(self, "mamba_track_interval", zero=True)
        _optional_positive_int(self, "max_total_tokens")
        if self.kv_bytes is not None:
            parse_bytes(self.kv_bytes, "sglang: kv_bytes")
        if self.eviction_policy not in POLICIES:
            raise ValueError(f"sglang: eviction_policy must be one of {POLICIES}, got {self.eviction_policy!r}")

    def capacity_tokens(self) -> int | None:
        if self.max_total_tokens is not None:
            return self.max_total_tokens
        if self.kv_bytes is not None:
            return max(parse_bytes(self.kv_bytes) // self.shape.kv_bytes_per_token, 1)
        return None


class _Node:
    __slots__ = ("key", "children", "parent", "end", "time", "hits", "created", "lock", "alive", "state",
                 "owner", "session", "id")

    def __init__(self, key, parent, end, now, owner, session, nid):
        self.key = key            # [n] int32 ids of this edge
        self.children: dict = {}  # first page (bytes) -> node
        self.parent = parent
        self.end = end            # depth at the node's end (tokens from the root)
        self.time = now
        self.hits = 0
        self.created = nid
        self.lock = 0
        self.alive = True
        self.state = False
        self.owner = owner
        self.session = session
        self.id = nid


class Model(CacheModel):
    engine = "sglang"

    def __init__(self, preset: Preset):
        super().__init__(preset)
        self.P = preset.page_size
        self.cap = preset.capacity_tokens()
        self.hybrid = preset.shape.hybrid
        self.ids = itertools.count(1)
        self.roots: dict = {}               # cache_salt -> root node
        self.tokens = 0
        self.clock = 0                      # logical time: one tick per call (LRU order)
        self.heap: list = []
        self.states: "OrderedDict[int, _Node]" = OrderedDict()  # nodes holding a recurrent state, LRU first
        self.paths: dict = {}               # session -> (last call, [nodes root..leaf], [their ends], salt)
        self.lost_sessions: set = set()     # sessions whose nodes were evicted since their last call

    def _root(self, salt):
        r = self.roots.get(salt)
        if r is None:
            r = self.roots[salt] = _Node(np.zeros(0, np.int32), None, 0, 0, None, None, 0)
            r.lock = 1
        return r

    def _first(self, ids: np.ndarray, pos: int) -> bytes:
        return ids[pos:pos + self.P].tobytes()

    def _score(self, n: _Node):
        pol = self.preset.eviction_policy
        if pol == "lru":
            return n.time
        if pol == "mru":
            return -n.time
        if pol == "lfu":
            return (n.hits, n.time)
        if pol == "fifo":
            return n.created
        return -n.created  # filo

    def _push(self, n: _Node):
        heapq.heappush(self.heap, (self._score(n), n.id, n))

    def _split(self, child: _Node, m: int) -> _Node:
        """Cut `child`'s edge after m ids; the new node takes the first part."""
        parent = child.parent
        mid = _Node(child.key[:m], parent, child.end - len(child.key) + m, child.time, child.owner, child.session,
                    next(self.ids))
        mid.hits = child.hits
        parent.children[self._first(child.key, 0)] = mid
        child.key = child.key[m:]
        child.parent = mid
        mid.children[self._first(child.key, 0)] = child
        return mid

    def _walk(self, node: _Node, ids: np.ndarray, pos: int, n: int):
        """Follow `ids[pos:n]` down from `node` (splitting where it parts); return (node, depth)."""
        P = self.P
        while pos < n:
            child = node.children.get(self._first(ids, pos))
            if child is None or not child.alive:
                break
            m = lcp(child.key, ids[pos:n])
            m -= m % P
            if m == 0:
                break
            if m < len(child.key):
                node = self._split(child, m)
                pos += m
                break
            node, pos = child, pos + m
        return node, pos

    def plan(self, call: Call, hint: Hint) -> CachePlan:
        self.clock += 1
        prompt, P = call.prompt, call.prompt_len
        limit = max(P - 1, 0)
        limit -= limit % self.P
        node, pos = self._root(call.cache_salt), 0
        st = self.paths.get(call.session)
        if st is not None and st[3] == call.cache_salt:  # start from the deepest live node the session left
            last, nodes, ends, _ = st
            shared = min(hint.lcp if last is hint.prev else lcp_call(prompt, last), limit)
            i = int(np.searchsorted(ends, shared, side="right")) - 1
            while i >= 0 and not nodes[i].alive:
                i -= 1
            if i >= 0:
                node, pos = nodes[i], nodes[i].end
        node, pos = self._walk(node, prompt, pos, limit)
        path = []
        n = node
        while n.parent is not None:
            n.time = self.clock
            path.append(n)
            n = n.parent
        path.reverse()
        kv = pos
        if self.hybrid:
            while node.parent is not None and not node.state:
                node = node.parent
            pos = node.end
            if node.parent is not None:
                self.states.move_to_end(node.id)
        cause = None
        if pos < hint.exact:
            if kv > pos:
                cause = "no_state_checkpoint"
            elif (hint.exact - hint.exact % self.P) <= pos:
                cause = "block_rounding"
            elif call.session in self.lost_sessions:
                cause = "evicted"
            else:
                cause = "not_cached"
        self.lost_sessions.discard(call.session)
        unit = f"node {node.id} (depth {pos})" if pos else ""
        return CachePlan(pos, unit=unit, source=node.owner if pos else None, cause=cause, state=(path, kv))

    def _evict_tokens(self, need: int) -> None:
        """Free at least `need` tokens by evicting unlocked leaves, lowest score first."""
        freed = 0
        skipped = []
        while freed < need and self.heap:
            score, _, n = heapq.heappop(self.heap)
            if not n.alive or n.children or n.parent is None:
                continue
            if n.lock:
                skipped.append(n)
                continue
            if score != self._score(n):
                self._push(n)
                continue
            n.alive = False
            del n.parent.children[self._first(n.key, 0)]
            freed += len(n.key)
            self.tokens -= len(n.key)
            self.evictions += 1
            if n.session is not None:
                self.lost_sessions.add(n.session)
            if n.state:
                self.states.pop(n.id, None)
            p = n.parent
            if not p.children and p.parent is not None:
                self._push(p)
        for n in skipped:
            self._push(n)

    def evict(self, budget: int) -> int:
        before = self.tokens
        if self.tokens > budget:
            self._evict_tokens(self.tokens - budget)
        return before - self.tokens

    def admit(self, call: Call, plan: CachePlan) -> None:
        self.start(call, plan)
        self.finish(call, plan)

    def start(self, call: Call, plan: CachePlan) -> None:
        """The request runs: its matched path is locked (not evictable) until it finishes."""
        for x in plan.state[0]:
            x.lock += 1

    def _extend(self, call: Call, node: _Node, tail: np.ndarray, rel: int, stop: int, kv: int):
        """Insert `tail[rel:stop]` below `node` (evicting to make room): walk what is cached, a new leaf for
        the rest; return (the deepest node, how far the tail is in)."""
        node, rel = self._walk(node, tail, rel, stop)
        if rel < stop:
            need = stop - rel
            if self.cap is not None and self.tokens + need > self.cap:
                self._evict_tokens(self.tokens + need - self.cap)
                node, rel = self._walk(node, tail, rel, stop)  # a split may have moved the cut
            if rel < stop:
                room = stop - rel if self.cap is None else max(min(stop - rel, self.cap - self.tokens), 0)
                room -= room % self.P
                if room:
                    leaf = _Node(tail[rel:rel + room], node, kv + rel + room, self.clock, call.index,
                                 call.session, next(self.ids))
                    node.children[self._first(tail, rel)] = leaf
                    self.tokens += room
                    self._push(leaf)
                    node, rel = leaf, rel + room
        return node, rel

    def finish(self, call: Call, plan: CachePlan) -> None:
        """The request ends: `(prompt + output)[:kv_committed_len]` is inserted, then its path unlocked.

        As SGLang does it: the prompt goes in first (the checkpoint after the prefill, held by the request
        while it decodes), then the output, so a node always ends at the prompt's last whole page and
        eviction can drop a reply without its prompt."""
        path, kv = plan.state
        n = call.prompt_len + max(len(call.output) - 1, 0)   # kv_committed_len
        n -= n % self.P
        tail = call.tail(kv)[:n - kv]   # the ids past the match: tail[i] is position kv + i
        node = path[-1] if path else self._root(call.cache_salt)
        cut = min(max(call.prompt_len - call.prompt_len % self.P - kv, 0), len(tail))
        node, rel = self._extend(call, node, tail, 0, cut, kv)
        if rel == cut < len(tail):
            node.lock += 1
            held, (node, rel) = node, self._extend(call, node, tail, rel, len(tail), kv)
            held.lock -= 1
        pos = kv + rel
        for x in path:
            x.lock -= 1
        if self.hybrid and node.parent is not None:
            t = self.preset.mamba_track_interval
            target = pos - pos % t if t else pos
            s = node
            while s.parent is not None and s.end > target:
                s = s.parent
            if s.parent is not None and s.end == target:
                s.state = True
                self.states[s.id] = s
                self.states.move_to_end(s.id)
                cap = self.preset.mamba_slots
                while cap and len(self.states) > cap:
                    _, old = self.states.popitem(last=False)
                    old.state = False   # tombstone: the KV stays
        # the session's path, root to the deepest node it now reaches; SGLang counts a hit on every node of
        # the path its inserts walk (`_inc_hit_count`: once per request), none at the lookup
        nodes = []
        x = node
        while x.parent is not None:
            x.hits += 1
            nodes.append(x)
            x = x.parent
        nodes.reverse()
        self.paths[call.session] = (call, nodes, np.fromiter((x.end for x in nodes), np.int64, len(nodes)),
                                    call.cache_salt)
