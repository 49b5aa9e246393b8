"""Anthropic prompt caching (platform.claude.com/docs/en/build-with-claude/prompt-caching): entries at
breakpoints, not blocks.

- Cache entries exist only where a request put a breakpoint (`cache_control`, at most 4) or, in automatic
  mode, at the end of the prompt. Prefix order is tools -> system -> messages; we see the rendered ids.
- A read at a breakpoint looks back over content-block boundaries, `lookback_blocks` (20) in all counting
  the breakpoint's own, for the longest prefix that has a live entry. An entry further back is not found.
- Entries live `ttl_s` (300 s), refreshed free on every hit (3600 s for "1h").
- Prompts under the model's minimum (`min_tokens`) are not cached: both counters stay 0.
- Usage reports cache creation (written at the last breakpoint past what was read) and cache read apart;
  price: writes x`write_multiplier`, reads x`read_multiplier`.

Content blocks come from the call (`content_blocks`) or, for rendered ChatML ids, from each `<|im_start|>`.

>>> from strata_lab.caches.call_ids import Call, as_ids
>>> from strata_lab.caches.base import Hint
>>> from strata_lab.caches.presets import parse_engine
>>> m = parse_engine("anthropic:min_tokens=4").build()
>>> p = m.step(Call(0, "a", as_ids(range(10)), ts=0.0, breakpoints=(6,)), Hint(None, 0, 0)); (p.reused, p.written)
(0, 6)
>>> p = m.step(Call(1, "a", as_ids(range(12)), ts=60.0, breakpoints=(6, 12)), Hint(None, 0, 0)); (p.reused, p.written)
(6, 6)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from strata_lab.caches.base import CacheModel, Hint, CachePlan
from strata_lab.caches.call_ids import Call
from strata_lab.caches.presets import EnginePreset, _positive_int

__all__ = ["Preset", "Model"]


@dataclass(frozen=True)
class Preset(EnginePreset):
    engine = "anthropic"
    max_breakpoints: int = 4
    lookback_blocks: int = 20
    automatic: bool = True
    min_tokens: int = 1024
    ttl_s: float = 300.0
    block_boundary_id: int = 151644
    input_usd_per_mtok: float = 3.0
    write_multiplier: float = 1.25
    read_multiplier: float = 0.1
    output_usd_per_mtok: float = 15.0

    def __post_init__(self):
        super().__post_init__()
        for f in ("max_breakpoints", "lookback_blocks", "min_tokens"):
            _positive_int(self, f)
        _positive_int(self, "block_boundary_id", zero=True)
        for f in ("ttl_s", "input_usd_per_mtok", "write_multiplier", "read_multiplier", "output_usd_per_mtok"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
                raise ValueError(f"anthropic: {f} must be a number >= 0, got {v!r}")

    def dollars(self, prompt_len: int, output_len: int, read: int, written: int) -> float:
        r = self.input_usd_per_mtok / 1e6
        return (prompt_len - read - written) * r + written * r * self.write_multiplier \
            + read * r * self.read_multiplier + output_len * self.output_usd_per_mtok / 1e6

    def boundaries(self, call: Call) -> tuple:
        """Content-block ends of the call's prompt (always including its breakpoints and its end)."""
        P = call.prompt_len
        if call.content_blocks is not None:
            b = set(call.content_blocks)
        else:
            b = set(np.flatnonzero(call.prompt == self.block_boundary_id).tolist())
        b.update(self.breakpoints(call))
        b.add(P)
        b.discard(0)
        return tuple(sorted(b))

    def breakpoints(self, call: Call) -> tuple:
        if call.breakpoints is not None:
            if len(call.breakpoints) > self.max_breakpoints:
                raise ValueError(f"call {call.index}: cache_control has {len(call.breakpoints)} breakpoints, "
                                 f"anthropic allows at most {self.max_breakpoints}")
            return tuple(p for p in call.breakpoints if p > 0)
        return (self.last_block_end(call),) if self.automatic and call.prompt_len else ()

    def last_block_end(self, call: Call) -> int:
        """Where automatic caching puts its breakpoint: the end of the last content block. The API caches
        messages, not a rendered generation header: a ChatML render ends with `<|im_start|>assistant\n...`,
        which no later request repeats (the next turn has the reply there), so the last message ends at the
        last `<|im_start|>`. Given `content_blocks`, the last of them; otherwise the prompt's end."""
        P = call.prompt_len
        if call.content_blocks is not None:
            return max((b for b in call.content_blocks if 0 < b <= P), default=P)
        starts = np.flatnonzero(call.prompt == self.block_boundary_id)
        return int(starts[-1]) if len(starts) and starts[-1] > 0 else P


class Model(CacheModel):
    engine = "anthropic"

    def __init__(self, preset: Preset):
        super().__init__(preset)
        self.entries: dict[int, list] = {}   # prefix key -> [expiry, owner call, position]

    def plan(self, call: Call, hint: Hint) -> CachePlan:
        pre = self.preset
        bps = pre.breakpoints(call)
        bounds = pre.boundaries(call)
        data = call.prompt.tobytes()
        keys, h, last = [], hash(call.cache_salt), 0
        for b in bounds:  # one key per boundary: the whole prefix up to it, chained
            h = hash((h, data[4 * last:4 * b]))
            keys.append(h)
            last = b
        index = {b: i for i, b in enumerate(bounds)}
        read, src, expired = 0, None, False
        looked = set()
        for bp in bps:
            i = index[bp]
            for j in range(i, max(i - pre.lookback_blocks, -1), -1):
                looked.add(j)
                if bounds[j] <= read or bounds[j] < pre.min_tokens:
                    break
                e = self.entries.get(keys[j])
                if e is None:
                    continue
                if e[0] <= self.now:
                    expired = True
                    continue
                read, src = bounds[j], e[1]
                break
        last_bp = max(bps, default=0)
        written = last_bp - read if last_bp >= pre.min_tokens and last_bp > read else 0
        cause = None
        if read < hint.exact:
            beyond = any(j not in looked and bounds[j] > read and (e := self.entries.get(keys[j])) is not None
                         and e[0] > self.now for j in range(len(bounds)))
            if not bps:
                cause = "not_cached"
            elif hint.exact < pre.min_tokens or last_bp < pre.min_tokens:
                cause = "below_minimum"
            elif beyond:
                cause = "lookback"
            elif expired:
                cause = "expired"
            else:
                cause = "not_cached"
        return CachePlan(read, unit=f"breakpoint {read}" if read else "", source=src, cause=cause, written=written,
                    state=(bps, keys, index, read))

    def admit(self, call: Call, plan: CachePlan) -> None:
        bps, keys, index, read = plan.state
        until = self.now + self.preset.ttl_s
        if read:
            e = self.entries.get(keys[index[read]])
            if e is not None:
                e[0] = until  # refreshed on the hit
        for bp in bps:
            if bp < self.preset.min_tokens:
                continue
            e = self.entries.get(keys[index[bp]])
            if e is None or e[0] <= self.now:
                self.entries[keys[index[bp]]] = [until, call.index, bp]
            else:
                e[0] = until
