"""OpenAI prompt caching (developers.openai.com/api/docs/guides/prompt-caching): not a block pool.

- Automatic for prompts of at least `min_tokens` (1024); the cached prefix must match exactly.
- Hits come in `granularity` steps (128 in the documented rule: 1024, 1152, 1280, ...).
- An entry lives `ttl_s` after its last use (5-10 min idle in memory; "24h" extended retention: 86400).
- Requests are routed by a hash of the first `route_tokens` ids (and `prompt_cache_key`): with
  `replicas=K` the replay's `prefix_hash` router sends them to one of K cache machines.
- Price: uncached input at `input_usd_per_mtok`, cached at `cached_input_multiplier` x that, output apart.

>>> from strata_lab.caches.call_ids import Call, as_ids
>>> from strata_lab.caches.base import Hint
>>> from strata_lab.caches.presets import parse_engine
>>> m = parse_engine("openai").build()
>>> ids = list(range(1300))
>>> _ = m.step(Call(0, "a", as_ids(ids), ts=0.0), Hint(None, 0, 0))
>>> m.step(Call(1, "a", as_ids(ids + [7]), ts=10.0), Hint(None, 0, 0)).reused     # 1024 + 2 x 128
1280
>>> p = m.step(Call(2, "a", as_ids(ids + [8]), ts=2000.0), Hint(None, 1300, 1300)); (p.reused, p.cause)
(0, 'expired')
"""
from __future__ import annotations

from dataclasses import dataclass

from strata_lab.caches.base import CacheModel, Hint, CachePlan
from strata_lab.caches.call_ids import Call
from strata_lab.caches.presets import EnginePreset, _positive_int
from strata_lab.caches.vllm import chain_hashes

__all__ = ["Preset", "Model"]


@dataclass(frozen=True)
class Preset(EnginePreset):
    engine = "openai"
    min_tokens: int = 1024
    granularity: int = 128
    route_tokens: int = 256
    ttl_s: float = 600.0
    input_usd_per_mtok: float = 1.25
    cached_input_multiplier: float = 0.1
    output_usd_per_mtok: float = 10.0

    def __post_init__(self):
        super().__post_init__()
        for f in ("min_tokens", "granularity", "route_tokens"):
            _positive_int(self, f)
        for f in ("ttl_s", "input_usd_per_mtok", "cached_input_multiplier", "output_usd_per_mtok"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
                raise ValueError(f"{self.engine}: {f} must be a number >= 0, got {v!r}")

    def dollars(self, prompt_len: int, output_len: int, read: int, written: int) -> float:
        r = self.input_usd_per_mtok / 1e6
        return (prompt_len - read) * r + read * r * self.cached_input_multiplier \
            + output_len * self.output_usd_per_mtok / 1e6


class Model(CacheModel):
    engine = "openai"

    def __init__(self, preset: Preset):
        super().__init__(preset)
        # chunk key -> expiry, and -> the call that wrote it. A call writes (and refreshes) every chunk of its
        # prompt at once, so a chunk never outlives the chunks before it: the live chunks of a prompt are a
        # prefix of its keys, and the longest is found by bisection.
        self.expiry: dict[int, float] = {}
        self.owner: dict[int, int] = {}

    def _live(self, keys: list) -> int:
        """How many of `keys` (a prompt's chained chunk keys) are cached and unexpired (a prefix of them)."""
        lo, hi, now, exp = 0, len(keys), self.now, self.expiry
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if exp.get(keys[mid - 1], now) > now:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def plan(self, call: Call, hint: Hint) -> CachePlan:
        pre, G = self.preset, self.preset.granularity
        P = call.prompt_len
        keys = chain_hashes(call.prompt, 0, 0, G, call.cache_salt).tolist()
        k = self._live(keys)
        expired = k < len(keys) and keys[k] in self.expiry
        owner = self.owner[keys[k - 1]] if k else None
        matched = k * G
        reused = matched if matched >= pre.min_tokens else 0
        cause = None
        if reused < hint.exact:
            if P < pre.min_tokens or hint.exact < pre.min_tokens:
                cause = "below_minimum"
            elif expired:
                cause = "expired"
            elif hint.exact - hint.exact % G <= reused:
                cause = "block_rounding"
            else:
                cause = "not_cached"
        return CachePlan(reused, unit=f"prefix {reused}" if reused else "", source=owner if reused else None,
                    cause=cause, written=(len(keys) * G - reused) if P >= pre.min_tokens else 0,
                    state=(keys, k))

    def admit(self, call: Call, plan: CachePlan) -> None:
        keys, live = plan.state
        if call.prompt_len < self.preset.min_tokens:
            return
        # every chunk's idle timer restarts; the chunks past the live prefix (absent or expired) are this call's
        self.expiry.update(dict.fromkeys(keys, self.now + self.preset.ttl_s))
        self.owner.update(dict.fromkeys(keys[live:], call.index))
