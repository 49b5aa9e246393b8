"""TensorRT-LLM KV cache reuse, as `docs/source/features/kvcache.md` describes it.

- Blocks of `tokens_per_block` (32) in a radix tree keyed by their token ids, inserted as soon as they fill.
- A hit walks full blocks (capped at `prompt_len - 1`); with `partial_reuse` the next block that shares only
  its first ids with the prompt is reused too, by copying those ids (`copy_on_partial_reuse`).
- Eviction: leaf blocks only, lowest retention priority first (default 35), then least recently used.

>>> from strata_lab.caches.call_ids import Call, as_ids
>>> from strata_lab.caches.base import Hint
>>> from strata_lab.caches.presets import parse_engine
>>> m = parse_engine("trtllm:tokens_per_block=4").build()
>>> _ = m.step(Call(0, "a", as_ids(range(10))), Hint(None, 0, 0))
>>> p = m.step(Call(1, "b", as_ids([0, 1, 2, 3, 4, 5, 9, 9, 9])), Hint(None, 0, 0)); (p.reused, p.unit)
(6, 'blocks 0-0 +2 copied')
"""
from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

import numpy as np

from strata_lab.caches.base import CacheModel, Hint, CachePlan
from strata_lab.caches.call_ids import Call, lcp
from strata_lab.caches.presets import EnginePreset, _optional_positive_int, _positive_int, parse_bytes

__all__ = ["Preset", "Model"]


@dataclass(frozen=True)
class Preset(EnginePreset):
    engine = "trtllm"
    tokens_per_block: int = 32
    partial_reuse: bool = True
    priority: int = 35
    kv_blocks: int | None = None
    kv_tokens: int | None = None
    kv_bytes: str | None = None

    def __post_init__(self):
        super().__post_init__()
        _positive_int(self, "tokens_per_block")
        if isinstance(self.priority, bool) or not isinstance(self.priority, int) or not 0 <= self.priority <= 100:
            raise ValueError(f"trtllm: priority must be an int in [0, 100], got {self.priority!r}")
        for f in ("kv_blocks", "kv_tokens"):
            _optional_positive_int(self, f)
        if self.kv_bytes is not None:
            parse_bytes(self.kv_bytes, "trtllm: kv_bytes")

    def capacity_blocks(self) -> int | None:
        T = self.tokens_per_block
        if self.kv_blocks is not None:
            return self.kv_blocks
        if self.kv_tokens is not None:
            return max(self.kv_tokens // T, 1)
        if self.kv_bytes is not None:
            return max(parse_bytes(self.kv_bytes) // (self.shape.kv_bytes_per_token * T), 1)
        return None


class _Block:
    __slots__ = ("ids", "parent", "children", "time", "priority", "owner", "session", "alive", "lock", "n")

    def __init__(self, ids, parent, now, priority, owner, session, n):
        self.ids, self.parent, self.children = ids, parent, {}
        self.time, self.priority, self.owner, self.session = now, priority, owner, session
        self.alive, self.lock, self.n = True, 0, n


class Model(CacheModel):
    engine = "trtllm"

    def __init__(self, preset: Preset):
        super().__init__(preset)
        self.T = preset.tokens_per_block
        self.cap = preset.capacity_blocks()
        self.root = _Block(np.zeros(0, np.int32), None, 0, 100, None, None, 0)
        self.count = 0
        self.clock = 0
        self.seq = itertools.count(1)
        self.heap: list = []
        self.lost: set = set()

    def plan(self, call: Call, hint: Hint) -> CachePlan:
        self.clock += 1
        T, prompt = self.T, call.prompt
        limit = max(call.prompt_len - 1, 0)
        node, k, path = self.root, 0, []
        while (k + 1) * T <= limit:
            child = node.children.get(prompt[k * T:(k + 1) * T].tobytes())
            if child is None:
                break
            node, k = child, k + 1
            path.append(node)
        copied = 0
        if self.preset.partial_reuse and k * T < limit:
            rest = prompt[k * T:limit]
            for child in node.children.values():
                copied = max(copied, lcp(child.ids, rest))
        for b in path:
            b.time = self.clock
        reused = k * T + copied
        cause = None
        if reused < hint.exact:
            cause = "evicted" if call.session in self.lost else "not_cached"
        self.lost.discard(call.session)
        unit = (f"blocks 0-{k - 1}" if k else "") + (f" +{copied} copied" if copied else "")
        src = path[-1].owner if path else None
        return CachePlan(reused, unit=unit.strip(), source=src if reused else None, cause=cause, state=path)

    def _push(self, b):
        heapq.heappush(self.heap, (b.priority, b.time, b.n, b))

    def _evict_one(self) -> bool:
        skipped = []
        ok = False
        while self.heap:
            pr, t, _, b = heapq.heappop(self.heap)
            if not b.alive or b.children:
                continue
            if b.lock:
                skipped.append(b)
                continue
            if t != b.time:
                self._push(b)
                continue
            b.alive = False
            del b.parent.children[b.ids.tobytes()]
            self.count -= 1
            self.evictions += 1
            if b.session is not None:
                self.lost.add(b.session)
            if not b.parent.children and b.parent is not self.root:
                self._push(b.parent)
            ok = True
            break
        for b in skipped:
            self._push(b)
        return ok

    def evict(self, budget: int) -> int:
        gone = 0
        while self.count > budget and self._evict_one():
            gone += 1
        return gone

    def admit(self, call: Call, plan: CachePlan) -> None:
        self.start(call, plan)
        self.finish(call, plan)

    def start(self, call: Call, plan: CachePlan) -> None:
        """The request runs: the blocks it reuses are locked (not evictable) until it finishes."""
        for b in plan.state:
            b.lock += 1

    def finish(self, call: Call, plan: CachePlan) -> None:
        """The request ends: its new full blocks are stored (evicting unlocked leaves), then unlocked."""
        T = self.T
        path = plan.state
        seq = call.sequence()
        n_full = (call.prompt_len + max(len(call.output) - 1, 0)) // T
        node = path[-1] if path else self.root
        for k in range(len(path), n_full):
            key = seq[k * T:(k + 1) * T]
            child = node.children.get(key.tobytes())
            if child is None:
                if self.cap is not None and self.count >= self.cap and not self._evict_one():
                    break
                child = _Block(key.copy(), node, self.clock, self.preset.priority, call.index, call.session,
                               next(self.seq))
                node.children[key.tobytes()] = child
                self.count += 1
                self._push(child)
            child.time = self.clock
            child.lock += 1
            path.append(child)
            node = child
        for b in path:
            b.lock -= 1
            if not b.children:
                self._push(b)
