"""Replicas and the rule that routes each call to one of them (`replicas=K`, `routing=...`).

- `session`: a session sticks to the replica its first call got; new sessions go round-robin.
- `round_robin`: call after call, 0, 1, ..., K-1, 0, ...
- `prefix_hash`: a stable hash (crc32) of the first `route_tokens` ids and the session's cache key, as
  OpenAI routes on the prompt's first ~256 tokens and `prompt_cache_key`.
- `cache_aware`: SGLang's router. Each worker keeps an approximate tree of what it was sent (here: chained
  keys of 64-token chunks). If loads are imbalanced (max - min > `balance_abs_threshold` and
  max > `balance_rel_threshold` x min) the least loaded worker wins; else the best match if its match ratio
  exceeds `cache_threshold`; else the least loaded (ties: the smallest tree). Load = calls still in flight
  (arrival + recorded prefill + decode time).

>>> from strata_lab.caches.presets import parse_engine
>>> from strata_lab.caches.call_ids import Call, as_ids
>>> r = Router(parse_engine("vllm:replicas=3,routing=round_robin"))
>>> [r.route(Call(i, "s", as_ids([1, 2]))) for i in range(4)]
[0, 1, 2, 0]
"""
from __future__ import annotations

import heapq
import zlib

from strata_lab.caches.call_ids import Call

__all__ = ["Router"]

_CHUNK = 64


class Router:
    def __init__(self, preset):
        self.preset = preset
        self.K = preset.replicas
        self.rule = preset.routing
        self.sticky: dict = {}
        self.rr = 0
        self.trees = [set() for _ in range(self.K)]
        self.inflight = [[] for _ in range(self.K)]   # heaps of end times

    def route(self, call: Call) -> int:
        K = self.K
        if K == 1:
            return 0
        if self.rule == "round_robin":
            r = self.rr % K
            self.rr += 1
            return r
        if self.rule == "session":
            r = self.sticky.get(call.session)
            if r is None:
                r = self.sticky[call.session] = self.rr % K
                self.rr += 1
            return r
        if self.rule == "prefix_hash":
            n = getattr(self.preset, "route_tokens", 256)
            key = call.prompt[:n].tobytes() + (call.cache_salt or "").encode()
            return zlib.crc32(key) % K
        return self._cache_aware(call)

    def _cache_aware(self, call: Call) -> int:
        p = self.preset
        now = call.ts if call.ts is not None else 0.0
        for h in self.inflight:
            while h and h[0] <= now:
                heapq.heappop(h)
        loads = [len(h) for h in self.inflight]
        data = call.prompt.tobytes()
        keys, h = [], 0
        for i in range(len(call.prompt) // _CHUNK):
            h = hash((h, data[4 * _CHUNK * i:4 * _CHUNK * (i + 1)]))
            keys.append(h)
        lo, hi = min(loads), max(loads)
        if hi - lo > p.balance_abs_threshold and hi > p.balance_rel_threshold * lo:
            r = loads.index(lo)
        else:
            best, best_n = 0, -1
            for w, tree in enumerate(self.trees):
                n = 0
                while n < len(keys) and keys[n] in tree:
                    n += 1
                if n > best_n:
                    best, best_n = w, n
            ratio = best_n * _CHUNK / len(call.prompt) if len(call.prompt) else 0.0
            if ratio > p.cache_threshold:
                r = best
            else:
                r = min(range(self.K), key=lambda w: (loads[w], len(self.trees[w]), w))
        self.trees[r].update(keys)
        rec = call.record or {}
        t = rec.get("timings") if isinstance(rec.get("timings"), dict) else {}
        dur = sum(float(t.get(k) or 0.0) for k in ("prefill_ms", "decode_ms")) / 1000.0
        heapq.heappush(self.inflight[r], now + dur)
        return r
