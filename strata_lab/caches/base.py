"""The one interface every engine's cache model implements, and what a call's plan reports.

A `CacheModel` is one server replica's prompt cache. The replay drives it call by call, in arrival order:

    model.advance(call.ts)          # time passes: TTL expiry (hosted APIs), nothing for block pools
    plan = model.plan(call, hint)   # how many prompt ids the cache serves, which unit served them, why not more
    model.admit(call, plan)         # what the call leaves behind (prompt, generated ids), evicting under the budget

With time and concurrency, `admit` splits in two: `start` when the call arrives (pools pin the blocks it
holds: in-flight blocks are never evicted, as in vLLM and SGLang) and `finish` when its modelled duration ends.

`hint` is the session's view, computed once by the replay for every engine: the ids the session's previous
call left (`prev`), their common prefix with this prompt (`lcp`) and `exact`, the most a token-exact cache
that re-reads the last prompt token could reuse (`min(lcp, prompt_len - 1)`). Models compare themselves to
`exact` to name what they lost: `block_rounding`, `evicted`, `expired`, `below_minimum`, `slot_stolen`,
`no_state_checkpoint`, `lookback`, `not_cached`, `refused` (the engine turns the call away: over its context;
no reuse, nothing cached);
`last_output_token` (the last generated id is never fed back, so no engine but ours holds its KV); the replay adds `routing`, `new_session` and the divergence
causes of the one explainer (`retokenized_reply`, `template_rewrite`, `history_edit`, ...; see
`strata_lab.replayer.explain`: the cause that cost the most tokens is reported).

>>> CachePlan(reused=32, unit="blocks 0-1").reused
32
"""
from __future__ import annotations

from dataclasses import dataclass


from strata_lab.caches.call_ids import Call

__all__ = ["CacheModel", "CachePlan", "Hint"]


@dataclass(slots=True)
class Hint:
    """The session's view of a call, shared by every engine's model (see module docstring)."""

    prev: Call | None         # the session's previous call (it left prev.prompt + prev.output), None: first call
    lcp: int                  # common prefix of what prev left and this prompt
    exact: int                # min(lcp, prompt_len - 1): a token-exact cache's reuse

    @property
    def held(self) -> int:
        return self.prev.held_len if self.prev is not None else 0


@dataclass(slots=True)
class CachePlan:
    """What a cache model decides for one call before it runs."""

    reused: int                  # prompt ids served from the cache
    unit: str = ""               # the cached unit that served them ("blocks 0-77", "slot 2", "node 5", ...)
    source: int | None = None    # index of the call that wrote that unit
    cause: str | None = None     # why fewer than hint.exact were served (one of strata_lab.rules.ENGINE_CAUSES)
    written: int = 0             # prompt ids written to the cache by this call (hosted: cache creation)
    state: object = None         # model-private data carried from plan to admit


class CacheModel:
    """One replica's prompt cache. Subclasses implement `plan` and `admit`; `advance` and `evict` default to
    nothing to do (block pools evict inside `admit`, under their capacity)."""

    engine = "base"

    def __init__(self, preset):
        self.preset = preset
        self.now = 0.0
        self.evictions = 0

    def advance(self, now: float | None) -> None:
        """Move the clock to `now` (seconds); expire what timed out. Time never goes back."""
        if now is not None and now > self.now:
            self.now = now

    def plan(self, call: Call, hint: Hint) -> CachePlan:
        raise NotImplementedError

    def admit(self, call: Call, plan: CachePlan) -> None:
        raise NotImplementedError

    def start(self, call: Call, plan: CachePlan) -> None:
        """With time and concurrency (`replay_engines(..., concurrency=True)`): the call is scheduled and
        stays in flight; pin what it holds. Default: nothing to pin (its effect lands at `finish`)."""

    def finish(self, call: Call, plan: CachePlan) -> None:
        """The call in flight ends (the clock is at its end): what it leaves is admitted. Default: `admit`.
        A sequential replay calls `admit` (start and finish at once) instead."""
        self.admit(call, plan)

    def evict(self, budget: int) -> int:
        """Evict until at most `budget` capacity units (the model's own: blocks, tokens, entries) stay
        cached; return how many units went. Models whose admission evicts by itself may leave this a no-op."""
        return 0

    def step(self, call: Call, hint: Hint) -> CachePlan:
        self.advance(call.ts)
        plan = self.plan(call, hint)
        self.admit(call, plan)
        return plan

    def describe(self) -> str:
        return self.preset.spec()
