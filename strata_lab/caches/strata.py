"""Our engine (Contract 1) as a cache model: one `SessionState` per session, the replay's own rule, so its
reuse equals what our engine reported on every call of every recorded dump.

`checkpoints="recorded"` (default) applies the checkpoints each dump line reports; any checkpoint spec of
`strata-lab replay --checkpoints` (turn, every:N, header, budget:MIB) models a policy instead.

What a spec leaves unsaid comes from the dump (`for_calls`, applied by every replay): `kind` is the model kind
its `model` field names (a log of another server naming no hybrid model: attention), and "recorded"
checkpoints on a dump with no line of our engine's (an imported log, a proxy capture) are the turn-start
policy, so `replay` with no engine and `--engine strata` give one answer.

>>> from strata_lab.caches.call_ids import Call, as_ids
>>> from strata_lab.caches.base import Hint
>>> from strata_lab.caches.presets import parse_engine
>>> m = parse_engine("strata:checkpoints=turn").build()
>>> _ = m.step(Call(0, "s", as_ids([1, 2, 3, 4]), as_ids([5, 6])), Hint(None, 0, 0))
>>> m.step(Call(1, "s", as_ids([1, 2, 3, 4, 5, 9])), Hint(None, 5, 5)).reused   # back to the turn start
4
"""
from __future__ import annotations

from dataclasses import dataclass

from strata_lab.caches.base import CacheModel, Hint, CachePlan
from strata_lab.caches.call_ids import Call
from strata_lab.caches.presets import EnginePreset

__all__ = ["Preset", "Model", "for_calls"]


@dataclass(frozen=True)
class Preset(EnginePreset):
    engine = "strata"
    kind: str = "hybrid"
    checkpoints: str = "recorded"
    full_hit: str = "held_logits"

    def __post_init__(self):
        super().__post_init__()
        from strata_lab.replayer.state import FULL_HIT_RULES, MODELS
        from strata_lab.rules import parse_checkpoint_policy

        if self.kind not in MODELS:
            raise ValueError(f"strata: kind must be one of {MODELS}, got {self.kind!r}")
        if self.full_hit not in FULL_HIT_RULES:
            raise ValueError(f"strata: full_hit must be one of {FULL_HIT_RULES}, got {self.full_hit!r}")
        if self.checkpoints != "recorded":
            try:
                parse_checkpoint_policy(self.checkpoints)
            except ValueError as exc:
                raise ValueError(f"strata: checkpoints: {exc}") from None


def _served_elsewhere(rec: dict) -> bool:
    """A line another server served (imported from a log, or captured by the proxy): it has `fidelity` /
    `trace_format`, which our recorder never writes, and its `checkpoints` are none of ours."""
    return "trace_format" in rec or "fidelity" in rec


def for_calls(preset: Preset, calls) -> Preset:
    """`preset` with what its spec did not say taken from the calls' dump lines: `kind` from their `model`
    field (lines served elsewhere naming no hybrid model: attention; lines naming nothing: the preset's),
    and `checkpoints="recorded"` as "turn" when the lines were served elsewhere and none is our engine's
    recording (their empty `checkpoints` are not snapshots anyone kept). Fields the spec sets (`strata:kind=hybrid`) stay as given.

    >>> from strata_lab.caches.call_ids import Call, as_ids
    >>> from strata_lab.caches.presets import parse_engine
    >>> log = [Call(0, "s", as_ids([1]), record={"model": "gpt-4o", "trace_format": "openai", "checkpoints": []})]
    >>> for_calls(parse_engine("strata"), log).spec(), for_calls(parse_engine("strata:kind=hybrid"), log).spec()
    ('strata@1:checkpoints=turn,kind=attention', 'strata@1:checkpoints=turn,kind=hybrid')
    """
    from strata_lab.replayer.state import model_kind_of

    told = {k for k, _ in preset.overrides}
    recs = [c.record for c in calls if c.record is not None]
    change = {}
    if "kind" not in told:
        kinds = {model_kind_of(r.get("model")) or ("attention" if _served_elsewhere(r) else None) for r in recs}
        kinds.discard(None)
        if len(kinds) == 1 and preset.kind not in kinds:
            change["kind"] = next(iter(kinds))
    if "checkpoints" not in told and preset.checkpoints == "recorded" and any(map(_served_elsewhere, recs)) and \
            not any("checkpoints" in r and not _served_elsewhere(r) for r in recs):
        change["checkpoints"] = "turn"
    return preset.with_(**change) if change else preset


class Model(CacheModel):
    engine = "strata"

    def __init__(self, preset: Preset):
        super().__init__(preset)
        from strata_lab.replayer.state import default_snapshot_bytes
        from strata_lab.rules import CheckpointPolicy, parse_checkpoint_policy

        self.snapshot_bytes = default_snapshot_bytes(preset.kind)
        self.recorded = preset.checkpoints == "recorded"
        # "recorded": the turn-start policy, with each call's recorded checkpoints adopted after it
        self.policy = CheckpointPolicy() if self.recorded else parse_checkpoint_policy(preset.checkpoints)
        self.states: dict = {}

    def plan(self, call: Call, hint: Hint) -> CachePlan:
        from strata_lab.replayer.state import SessionState, shortfall_cause

        st = self.states.get(call.session)
        if st is None:
            st = self.states[call.session] = SessionState(model=self.preset.kind, policy=self.policy,
                                                          full_hit=self.preset.full_hit,
                                                          bytes_per_snapshot=self.snapshot_bytes)
        pred = st.call(call.prompt.tolist())
        cause = shortfall_cause(self.preset.kind, pred.reused, hint.exact)   # a hybrid restarts from a snapshot
        unit = ""
        if pred.reused:
            unit = f"checkpoint {pred.restored_checkpoint}" if pred.restored_checkpoint is not None else "session state"
        return CachePlan(pred.reused, unit=unit, source=None, cause=cause, state=st)

    def admit(self, call: Call, plan: CachePlan) -> None:
        st = plan.state
        rec = call.record or {}
        if call.record is not None:
            st.finish(rec.get("gen_ids") or [], rec.get("drained_ids") or [])
        else:
            st.finish(call.output.tolist(), [])
        if self.recorded and call.record is not None and "checkpoints" in rec:   # a line that does not say which
            st.checkpoints.clear()                                           # snapshots it kept keeps the turn's
            st.checkpoints.update((int(c), None) for c in rec.get("checkpoints") or [] if 0 < int(c) <= len(st.held))
