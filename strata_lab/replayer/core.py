"""The state model's replay settings: `resolve_options` checks every argument before any work and gives the
`ReplayOptions` the C++ replay core (`strata_lab.replayer.native`) and the notebook's store pager
(`strata_lab.replayer.pages`) step calls under. The replay itself, on every path, is `strata_lab.replay`
(`strata_lab.caches.replay`, where this model is the engine `strata`); its one report is `ReplayReport`.

>>> opts = resolve_options(model="attention", checkpoint_policy="every:64")
>>> opts.model, opts.checkpoints.every, opts.recorded_checkpoints
('attention', 64, False)
"""
from __future__ import annotations

from dataclasses import dataclass

from strata_lab.rules import CheckpointPolicy, parse_checkpoint_policy
from strata_lab.replayer.policies import Policy, parse_policy
from strata_lab.replayer.state import FULL_HIT_RULES, MODELS, SessionState, default_snapshot_bytes

__all__ = ["ReplayOptions", "resolve_options", "load_tokenizer_arg"]


@dataclass(frozen=True)
class ReplayOptions:
    """Validated replay settings: the model kind, the prompt policy, the snapshot policy sessions start
    with ("recorded": each dump line's own snapshots), the full-hit rule and the snapshot size."""

    model: str
    policy: Policy
    checkpoints: CheckpointPolicy | str
    full_hit: str
    bytes_per_snapshot: int
    context_chars: int = 40

    def new_state(self) -> SessionState:
        cp = self.checkpoints if isinstance(self.checkpoints, CheckpointPolicy) else CheckpointPolicy()
        return SessionState(model=self.model, policy=cp, full_hit=self.full_hit,
                            bytes_per_snapshot=self.bytes_per_snapshot)

    @property
    def recorded_checkpoints(self) -> bool:
        return self.checkpoints == "recorded"


def resolve_options(*, model: str = "hybrid", checkpoint_policy: CheckpointPolicy | str | None = None,
                    policy: Policy | str = "recorded", full_hit: str = "held_logits",
                    bytes_per_snapshot: int | None = None, context_chars: int = 40) -> ReplayOptions:
    """Check every replay argument before any work; name the bad one.

    >>> resolve_options(checkpoint_policy="every:64").checkpoints.every
    64
    >>> resolve_options(checkpoint_policy=64)
    Traceback (most recent call last):
    ...
    TypeError: checkpoint_policy must be a strata_lab.CheckpointPolicy, a spec string or None, got int
    """
    if model not in MODELS:
        raise ValueError(f"model must be one of {MODELS}, got {model!r}")
    if full_hit not in FULL_HIT_RULES:
        raise ValueError(f"full_hit must be one of {FULL_HIT_RULES}, got {full_hit!r}")
    if isinstance(policy, str):
        policy = parse_policy(policy)
    if not isinstance(policy, Policy):
        raise TypeError(f"policy must be a Policy or a spec string, got {type(policy).__name__}")
    if not (checkpoint_policy is None or isinstance(checkpoint_policy, (str, CheckpointPolicy))):
        raise TypeError(f"checkpoint_policy must be a strata_lab.CheckpointPolicy, a spec string or None, "
                        f"got {type(checkpoint_policy).__name__}")
    ckpt = policy.checkpoint_policy if policy.checkpoint_policy is not None else checkpoint_policy
    if isinstance(ckpt, str) and ckpt != "recorded":
        ckpt = parse_checkpoint_policy(ckpt)
    if ckpt is None:
        ckpt = CheckpointPolicy()
    snap = default_snapshot_bytes(model) if bytes_per_snapshot is None else bytes_per_snapshot
    opts = ReplayOptions(model=model, policy=policy, checkpoints=ckpt, full_hit=full_hit, bytes_per_snapshot=snap,
                         context_chars=context_chars)
    opts.new_state()  # validates the snapshot size and budget against the model
    return opts


def load_tokenizer_arg(tokenizer):
    """A Tokenizer from a name ("qwen3") or the object itself."""
    if isinstance(tokenizer, str):
        from strata_lab.text.tokenizer import load_tokenizer

        return load_tokenizer(tokenizer)
    return tokenizer
