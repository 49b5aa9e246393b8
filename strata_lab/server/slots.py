"""Slots: N engine sessions in one server, so conversations stop evicting each other.

Which slot serves a request, in order (llama.cpp's rule, tools/server/README.md `--slot-prompt-similarity`):
1. `id_slot` names one;
2. a session key (`x-session-id` header, OpenAI `user`, Anthropic `metadata.user_id`) already bound to a
   slot picks that slot;
3. the slot whose held ids share the longest common prefix with the prompt, if that prefix covers more
   than `similarity` of the prompt;
4. else the least recently used slot (a never-used one first).
Slots are partitioned by API key (`owner`: the key's name; None when no key is required, or for every
request with `--shared-cache`): rules 2 and 3 only see the requesting key's own bindings and slots, and a
slot that last held another key's ids is reset before it serves this one (`take`), so no key reuses,
or learns from `cached_tokens` about, another key's prompt. A key seen for the first time is bound to the slot chosen for it; the least recently used slot is taken
among the idle ones first (`busy`: slots serving a request now). The slots' requests run at the same time
(one worker lane per slot), their decode steps batched by the engine; each slot keeps its own held ids, KV
cache and checkpoints and serves one request at a time. Dumps carry the slot's session name.

>>> pool = SlotPool([_Held([1, 2, 3, 4]), _Held([])], names=["s-0", "s-1"])
>>> pool.choose([1, 2, 3, 4, 5]).id, pool.choose([9, 9]).id
(0, 1)
>>> pool.choose([7], key="bob").id, pool.choose([1, 2, 3, 4, 5], key="bob").id
(0, 0)
>>> pool.take(pool.slots[0], None), pool.take(pool.slots[0], "alice"), pool.take(pool.slots[0], "alice")
(False, True, False)
>>> pool.choose([1, 2, 3, 4, 5], owner="eve").id  # alice's held prefix is not eve's to reuse
1
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from strata_lab.server.errors import RequestError

__all__ = ["Slot", "SlotPool", "slot_names"]


def slot_names(base: str, n: int) -> list[str]:
    """Session names of n slots: the base name alone for one slot (dumps as before), else base-0..base-(n-1)."""
    return [base] if n == 1 else [f"{base}-{i}" for i in range(n)]


@dataclass
class Slot:
    id: int
    name: str                 # the engine session name (a dump line's `session`)
    session: Any              # strata_lab.engine.Session
    last_used: float = 0.0    # time.time() of the last request; 0: never
    requests: int = 0
    keys: set = field(default_factory=set)
    owner: str | None = None  # the API key (name) whose ids the session holds; None: no key / shared cache

    def as_dict(self, batch: int = 0, *, viewer: str | None = None) -> dict:
        """batch: the size of the engine's latest decode step (shown on the slots that are processing).
        A slot holding another key's ids than `viewer`'s shows none of its contents (held length, requests,
        last use, checkpoints): only that it is there and whether it is busy."""
        busy = bool(getattr(self.session, "busy", False))
        out = {"id": self.id, "session": self.name, "is_processing": busy, "batch": batch if busy else 0}
        if self.owner is not None and self.owner != viewer:
            return {**out, "n_held": None, "requests": None, "last_used": None, "checkpoints": None}
        return {**out, "n_held": len(self.session.held_ids), "requests": self.requests,
                "last_used": self.last_used or None, "checkpoints": self.session.checkpoints}


def _lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class SlotPool:
    """The server's slots and the rule that picks one per request."""

    def __init__(self, sessions: Sequence[Any], *, names: Sequence[str], similarity: float = 0.5):
        if not sessions:
            raise ValueError("sessions must not be empty")
        if not 0.0 <= similarity <= 1.0:
            raise ValueError(f"similarity must be in [0, 1], got {similarity}")
        self.slots = [Slot(i, n, s) for i, (n, s) in enumerate(zip(names, sessions))]
        self.similarity = similarity
        self._keys: dict[str, int] = {}
        self._tick = 0

    def __len__(self) -> int:
        return len(self.slots)

    def choose(self, prompt_ids: Sequence[int], *, slot: int | None = None, key: str | None = None,
               busy: frozenset | set = frozenset(), owner: str | None = None) -> Slot:
        """The slot for a request of API key `owner` (see the module docstring); the caller `take`s it."""
        bound = (owner, key)  # one key's session names are not another's
        if slot is not None:
            if not 0 <= slot < len(self.slots):
                raise RequestError("id_slot", f"must be in 0..{len(self.slots) - 1} (or -1), got {slot}")
            chosen = self.slots[slot]
        elif key is not None and bound in self._keys:
            chosen = self.slots[self._keys[bound]]
        else:
            chosen = self._by_rule(prompt_ids, busy, owner)
        if key is not None:
            self._keys[bound] = chosen.id
            if len(self._keys) > 100_000:  # bounded: forget the oldest bindings
                for old in list(self._keys)[:50_000]:
                    del self._keys[old]
        self._tick += 1
        chosen.last_used = time.time()
        chosen.requests += 1
        chosen._order = self._tick
        return chosen

    def take(self, chosen: Slot, owner: str | None) -> bool:
        """Make `owner` the slot's owner once the request holds it; True when the slot held another key's
        ids, which the caller must drop (`session.reset()`) before the request runs."""
        other = chosen.owner != owner and (chosen.owner is not None or owner is not None)
        chosen.owner = owner
        return other

    def _by_rule(self, prompt_ids: Sequence[int], busy: frozenset | set = frozenset(),
                 owner: str | None = None) -> Slot:
        best, best_lcp = None, 0
        for s in self.slots:
            if s.owner != owner:  # another key's ids: never reused for this one
                continue
            n = _lcp(prompt_ids, s.session.held_ids)
            if n > best_lcp:
                best, best_lcp = s, n
        if best is not None and prompt_ids and best_lcp / len(prompt_ids) > self.similarity:
            return best
        idle = [s for s in self.slots if s.id not in busy] or self.slots
        return min(idle, key=lambda s: getattr(s, "_order", 0))  # least recently used, idle ones first

    def as_list(self, batch: int = 0, *, viewer: str | None = None) -> list[dict]:
        return [s.as_dict(batch, viewer=viewer) for s in self.slots]


class _Held:
    """A stand-in with only `held_ids`/`checkpoints`, for the doctest."""

    def __init__(self, ids):
        self.held_ids, self.checkpoints = list(ids), []
