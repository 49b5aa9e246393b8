"""The session state model: which prompt ids a session can reuse, and where it keeps snapshots (no weights).

The engine (C++) and the replay share these rules; engine tests assert `engine reused == predicted`.

A session holds `held` (every id whose effect is in its state) and checkpoints: positions where a
snapshot is saved. A snapshot holds the logits after its last id (both model kinds) and, on a hybrid
model, the recurrent state there; an attention-only model's KV cache can be cut anywhere, so its
snapshots matter only for their logits. On a call with `prompt`:

- `lcp` = longest common prefix of `prompt` and `held`;
- the engine needs logits for the last prompt position. With ``full_hit="held_logits"`` (default, the C++
  engine's rule in engine/src/session.cpp `Session::plan`) a prompt equal to held reuses everything (the
  engine kept the last logits), and so does a prefix of held ending exactly on a checkpoint (the snapshot
  kept its logits: a retry of the same prompt after a reply); otherwise the target is capped at
  ``len(prompt) - 1`` (the last prompt token is re-read). ``"last_held_only"`` is the older engine rule
  (checkpoints keep no logits), ``"reread_last"`` always caps, ``"saved_logits"`` never does;
- attention-only: reuse = target; hybrid: reuse = target if target == len(held) (state already there),
  else the largest checkpoint <= target (0 if none). Checkpoints past the cut are dropped.

>>> s = SessionState(model="hybrid")
>>> s.call([1, 2, 3, 4]).reused
0
>>> s.finish([5, 6])            # generated ids join held
>>> s.call([1, 2, 3, 4, 5, 6, 7]).reused   # extends held: the state is already there
6
>>> s.finish([8])
>>> s.call([1, 2, 3, 4, 5, 9]).reused      # diverges inside the first reply: back to its turn start
4
>>> s.finish([7])
>>> s.call([1, 2, 3, 4]).reused            # the same prompt again: its checkpoint kept the logits
4
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Sequence

# The one snapshot-policy type is strata_lab.rules'; snapshots.py reads its fields for the state model.
from strata_lab.rules import CheckpointPolicy
from strata_lab.text.ids import lcp_len
from strata_lab.replayer.snapshots import before_last_pos, prompt_positions, snapshot_capacity, snapshot_positions

__all__ = [
    "SessionState", "CallPrediction", "lcp_len", "predict_reuse", "reuse_target",
    "snapshot_positions", "prompt_positions", "snapshot_capacity",
    "default_snapshot_bytes", "DEFAULT_SNAPSHOT_BYTES", "ATTENTION_SNAPSHOT_BYTES", "MODELS", "FULL_HIT_RULES",
    "before_last_pos", "model_kind_of",
]

MODELS = ("hybrid", "attention")


def model_kind_of(name) -> str | None:
    """The model kind a dump's `model` field names ('hybrid' / 'attention'), or None when the name says
    neither (a hosted model such as gpt-4o: the caller decides).

    >>> model_kind_of("embedded-hybrid-vocab151669-seed0"), model_kind_of("Qwen3-8B"), model_kind_of("gpt-4o")
    ('hybrid', 'attention', None)
    """
    n = str(name or "").lower()
    if "hybrid" in n or "qwen3_next" in n or "qwen3-next" in n:
        return "hybrid"
    if "attention" in n or n.startswith("qwen3"):
        return "attention"
    return None

# What the engine does when the whole prompt is already held (reuse would equal len(prompt)).
# "held_logits" is the C++ engine's rule: saved logits when prompt == held, or at a checkpoint at exactly
# len(prompt); "last_held_only": only when prompt == held (the engine before snapshots kept logits).
FULL_HIT_RULES = ("held_logits", "last_held_only", "reread_last", "saved_logits")
# One recurrent-state snapshot of the 80B-A3B shape: ~2 MiB of S per GDN layer x 36 layers (docs/ENGINE.md);
# its saved logits (ATTENTION_SNAPSHOT_BYTES, under 1% more) are left out of this round figure.
DEFAULT_SNAPSHOT_BYTES = 72 * 2**20
# One attention-only snapshot: just the fp32 logits over Qwen3's 151936 embedding rows.
ATTENTION_SNAPSHOT_BYTES = 4 * 151936


def default_snapshot_bytes(model: str) -> int:
    """Bytes one snapshot takes on a model kind: recurrent state on a hybrid model, logits on attention.

    >>> default_snapshot_bytes("attention")
    607744
    """
    if model not in MODELS:
        raise ValueError(f"model must be one of {MODELS}, got {model!r}")
    return DEFAULT_SNAPSHOT_BYTES if model == "hybrid" else ATTENTION_SNAPSHOT_BYTES


# --- the rule --------------------------------------------------------------------------------------
def predict_reuse(prompt: Sequence[int], held: Sequence[int], checkpoints, *, model: str = "hybrid",
                  full_hit: str = "held_logits", lcp: int | None = None) -> int:
    """Contract 1's reuse for one call, from ids alone.

    >>> predict_reuse([1, 2, 9], [1, 2, 3], [1], model="hybrid")
    1
    >>> predict_reuse([1, 2, 9], [1, 2, 3], [1], model="attention")
    2
    >>> predict_reuse([1, 2], [1, 2, 3, 4], [2], model="hybrid")   # a retry: the checkpoint at 2 has logits
    2
    """
    if model not in MODELS:
        raise ValueError(f"model must be one of {MODELS}, got {model!r}")
    if full_hit not in FULL_HIT_RULES:
        raise ValueError(f"full_hit must be one of {FULL_HIT_RULES}, got {full_hit!r}")
    if lcp is None:
        lcp = lcp_len(prompt, held)
    target = reuse_target(len(prompt), len(held), lcp, full_hit, checkpoints)
    return reuse_from_target(target, len(held), checkpoints, model)


def shortfall_cause(model: str, reused: int, exact: int) -> str | None:
    """Our engine's own reason for reusing less than `exact` (what a token-exact cache could reuse): a hybrid
    restarts from an earlier state snapshot (`no_state_checkpoint`); None: no reason of its own (the one
    explainer, `explain.attribute`, names it). The strata cache model and the state model's rows both use it.

    >>> shortfall_cause("hybrid", 4, 6), shortfall_cause("attention", 4, 6), shortfall_cause("hybrid", 6, 6)
    ('no_state_checkpoint', None, None)
    """
    return "no_state_checkpoint" if model == "hybrid" and reused < exact else None


def reuse_from_target(target: int, held_len: int, checkpoints, model: str) -> int:
    """What the state can serve of `target` ids: all of it on attention or when the state is already there
    (target == held_len); else the nearest snapshot at or before it (0 if none)."""
    if model == "attention" or target == held_len:
        return target
    return max((c for c in checkpoints if c <= target), default=0)


def reuse_target(prompt_len: int, held_len: int, lcp: int, full_hit: str = "held_logits",
                 checkpoints=()) -> int:
    """How many prompt ids the engine may reuse before checkpoints: the LCP, less the last prompt token
    when the engine must re-read it for its logits. A full hit keeps the last token when prompt == held
    or (``"held_logits"``) when a checkpoint sits at exactly ``prompt_len``.

    >>> reuse_target(5, 5, 5), reuse_target(5, 9, 5), reuse_target(5, 9, 5, checkpoints=[5])
    (5, 4, 5)
    >>> reuse_target(5, 5, 5, "reread_last"), reuse_target(5, 9, 5, "last_held_only", [5])
    (4, 4)
    """
    if lcp < prompt_len or full_hit == "saved_logits":
        return lcp
    if full_hit in ("held_logits", "last_held_only") and prompt_len == held_len:
        return lcp
    if full_hit == "held_logits" and prompt_len > 0 and prompt_len in checkpoints:
        return lcp
    return max(prompt_len - 1, 0)


@dataclass
class CallPrediction:
    """What the state model says about one call (before its reply joins held)."""

    prompt_len: int
    held_before: int
    lcp: int
    reused: int
    restored_checkpoint: int | None   # the snapshot restored (None: state already there or 0); on an
    # attention-only model only a full hit on a checkpoint restores (its logits)
    checkpoints_before: int           # snapshots held when the call arrived
    target: int = 0                   # what the ids alone allow (the LCP, less the last prompt id when its
    # logits must be computed); reused falls short of it on a hybrid model without a snapshot there


@dataclass
class SessionState:
    """One session's held ids, their origins and checkpoints, stepped call by call.

    `segments` records where held ids came from: (start, end, kind, call) with kind "prompt", "gen"
    or "drained"; replay uses it to say whether a divergence lies in a reply or in the history.
    """

    model: str = "hybrid"
    policy: CheckpointPolicy = field(default_factory=CheckpointPolicy)
    full_hit: str = "held_logits"
    bytes_per_snapshot: int | None = None   # None: default_snapshot_bytes(model); sizes budget_mib
    held: list = field(default_factory=list)
    checkpoints: "OrderedDict[int, None]" = field(default_factory=OrderedDict)  # LRU order, oldest first
    segments: list = field(default_factory=list)
    calls: int = 0
    peak_snapshots: int = 0
    capacity: int | None = field(default=None, init=False)   # most snapshots kept (from budget_mib)

    def __post_init__(self):
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {MODELS}, got {self.model!r}")
        if self.full_hit not in FULL_HIT_RULES:
            raise ValueError(f"full_hit must be one of {FULL_HIT_RULES}, got {self.full_hit!r}")
        if not isinstance(self.policy, CheckpointPolicy):
            raise TypeError(f"policy must be a strata_lab.CheckpointPolicy, got {type(self.policy).__name__}")
        if self.bytes_per_snapshot is None:
            self.bytes_per_snapshot = default_snapshot_bytes(self.model)
        b = self.bytes_per_snapshot
        if isinstance(b, bool) or not isinstance(b, int) or b <= 0:
            raise ValueError(f"bytes_per_snapshot must be a positive int, got {b!r}")
        self.capacity = snapshot_capacity(self.policy, b)
        if self.capacity is not None and self.capacity < 1:
            raise ValueError(f"budget_mib={self.policy.budget_mib} holds no snapshot of {b} bytes")

    @property
    def uses_checkpoints(self) -> bool:
        """Whether a divergence restores a recurrent-state snapshot (hybrid). Both models keep
        checkpoints: their logits serve a prompt that ends exactly on one."""
        return self.model == "hybrid"

    def plan(self, prompt: Sequence[int], *, lcp: int | None = None) -> CallPrediction:
        """What a call with `prompt` reuses; changes nothing (`apply` it next). `lcp`: if known already."""
        held_before = len(self.held)
        if lcp is None:
            lcp = lcp_len(prompt, self.held)
        target = reuse_target(len(prompt), held_before, lcp, self.full_hit, self.checkpoints)
        reused = reuse_from_target(target, held_before, self.checkpoints, self.model)
        restored = reused if (reused != held_before and reused in self.checkpoints
                              and (self.uses_checkpoints or reused == len(prompt))) else None
        return CallPrediction(len(prompt), held_before, lcp, reused, restored, len(self.checkpoints), target)

    def apply(self, prompt: Sequence[int], pred: CallPrediction) -> None:
        """Make the planned call: restore the snapshot at `pred.reused`, drop what lies past it, and read the
        prompt from there (prefill). Work is proportional to the ids that change, not the prompt."""
        if pred.restored_checkpoint is not None:
            self.checkpoints.move_to_end(pred.restored_checkpoint)  # a restore counts as a use for LRU
        self._cut(pred.reused, pred.lcp)
        # held[:lcp] already equals prompt[:lcp]: the ids re-read from `reused` are the same ones, and keep their
        # origin (as `explain.SessionHistory` has them: a divergence is the same for every engine)
        del self.held[pred.lcp:]
        self.held.extend(prompt[pred.lcp:])
        self._add_segment(pred.lcp, len(self.held), "prompt")
        self._snapshot(pred.reused, len(self.held), prompt_end=True, prompt=prompt)
        self.calls += 1

    def call(self, prompt_ids: Sequence[int]) -> CallPrediction:
        """Reuse for `prompt_ids`, then cut held there and append the prompt (prefill)."""
        prompt = prompt_ids if isinstance(prompt_ids, list) else list(prompt_ids)
        pred = self.plan(prompt)
        self.apply(prompt, pred)
        return pred

    def finish(self, gen_ids: Sequence[int] = (), drained_ids: Sequence[int] = ()) -> None:
        """Generated and drained ids join held (decode), with any checkpoints the policy takes there."""
        start = len(self.held)
        self.held.extend(gen_ids)
        self._add_segment(start, len(self.held), "gen")
        mid = len(self.held)
        self.held.extend(drained_ids)
        self._add_segment(mid, len(self.held), "drained")
        self._snapshot(start, len(self.held), prompt_end=False)

    def reset(self) -> None:
        self.held.clear()
        self.checkpoints.clear()
        self.segments.clear()

    def snapshot_bytes(self) -> int:
        return len(self.checkpoints) * self.bytes_per_snapshot

    # -- internals ----------------------------------------------------------------------------------
    def _cut(self, n: int, origins: int | None = None) -> None:
        """Drop the snapshots past position n and the segment origins past `origins` (default n; the ids are
        cut by the caller)."""
        if n < len(self.held):
            for c in [c for c in self.checkpoints if c > n]:
                del self.checkpoints[c]
        n = n if origins is None else origins
        if n < len(self.held):
            while self.segments and self.segments[-1][0] >= n:
                self.segments.pop()
            if self.segments and self.segments[-1][1] > n:
                s = self.segments[-1]
                self.segments[-1] = (s[0], n, s[2], s[3])

    def _add_segment(self, start: int, end: int, kind: str) -> None:
        if end > start:
            self.segments.append((start, end, kind, self.calls - (kind != "prompt")))

    def _snapshot(self, start: int, end: int, *, prompt_end: bool, prompt=None) -> None:
        cap = self.capacity
        ps = prompt_positions(self.policy, prompt, start) if prompt is not None else \
            snapshot_positions(self.policy, start, end, prompt_end=prompt_end)
        for p in ps:
            self.checkpoints[p] = None
            self.checkpoints.move_to_end(p)
            if cap is not None:
                while len(self.checkpoints) > cap:
                    self.checkpoints.popitem(last=False)
        self.peak_snapshots = max(self.peak_snapshots, len(self.checkpoints))
