"""Contract 1 for hybrid models, from token ids alone (no weights): what a session reuses per call.

This mirrors NextSession in the C++ engine exactly, so tests (and the replay) can predict ``reused``,
``restored`` and the checkpoint set of every call from the ids.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from strata_lab.next_model import CheckpointPolicy

__all__ = ["HybridStateModel", "Prediction"]


@dataclass
class Prediction:
    reused: int
    restored: int | None
    lcp: int
    read: int


@dataclass
class HybridStateModel:
    """Held ids and checkpoint positions of one hybrid session, advanced call by call.

    Snapshot sizes are not modelled, so a ``budget_mib`` policy needs ``snapshot_mib`` (MiB per snapshot).

    >>> m = HybridStateModel(CheckpointPolicy())
    >>> m.call([1, 2, 3], [7, 8]).reused
    0
    >>> m.call([1, 2, 3, 7, 9], []).reused   # diverges inside the reply: back to the turn start
    3
    """

    policy: CheckpointPolicy
    snapshot_mib: float = 0.0
    held: list[int] = field(default_factory=list)
    checkpoints: dict[int, int] = field(default_factory=dict)  # position -> last-use tick
    _tick: int = 0

    def _snap(self, pos: int) -> None:
        if pos in self.checkpoints:
            return
        self._tick += 1
        self.checkpoints[pos] = self._tick
        if self.policy.budget_mib > 0:
            while self.checkpoints and len(self.checkpoints) * self.snapshot_mib > self.policy.budget_mib:
                del self.checkpoints[min(self.checkpoints, key=self.checkpoints.get)]

    def call(self, prompt_ids: list[int], gen_ids: list[int]) -> Prediction:
        prompt = list(prompt_ids)
        lcp = 0
        while lcp < min(len(prompt), len(self.held)) and prompt[lcp] == self.held[lcp]:
            lcp += 1
        reuse, restored = lcp, None
        if lcp != len(self.held):
            self.checkpoints = {p: t for p, t in self.checkpoints.items() if p <= lcp}
            if self.checkpoints:
                reuse = restored = max(self.checkpoints)
                self._tick += 1
                self.checkpoints[reuse] = self._tick
            else:
                reuse = 0
            self.held = self.held[:reuse]
        for pos in range(reuse + 1, len(prompt) + 1):
            if self.policy.wants(pos, len(prompt)):
                self._snap(pos)
        if reuse == len(prompt) and self.policy.at_prompt_end:
            self._snap(len(prompt))
        self.held = prompt[:]
        for g in gen_ids:
            self.held.append(g)
            if self.policy.wants(len(self.held), -1):
                self._snap(len(self.held))
        return Prediction(reused=reuse, restored=restored, lcp=lcp, read=len(prompt) - reuse)
