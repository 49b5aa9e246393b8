"""Contract 1 without weights: which prompt ids a session can reuse, and where it keeps checkpoints.

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

__all__ = [
    "CheckpointPolicy", "TurnStart", "EveryN", "Positions", "MemoryBudget", "NoCheckpoints",
    "SessionState", "CallPrediction", "lcp_len", "predict_reuse", "reuse_target", "parse_checkpoint_policy",
    "DEFAULT_SNAPSHOT_BYTES", "ATTENTION_SNAPSHOT_BYTES", "MODELS", "FULL_HIT_RULES", "IM_START_ID",
    "before_last_pos",
]

MODELS = ("hybrid", "attention")
# What the engine does when the whole prompt is already held (reuse would equal len(prompt)).
# "held_logits" is the C++ engine's rule: saved logits when prompt == held, or at a checkpoint at exactly
# len(prompt); "last_held_only": only when prompt == held (the engine before snapshots kept logits).
FULL_HIT_RULES = ("held_logits", "last_held_only", "reread_last", "saved_logits")
# One recurrent-state snapshot of the 80B-A3B shape: ~2 MiB of S per GDN layer x 36 layers (ENGINE_SPEC);
# its saved logits (ATTENTION_SNAPSHOT_BYTES, under 1% more) are left out of this round figure.
DEFAULT_SNAPSHOT_BYTES = 72 * 2**20
# One attention-only snapshot: just the fp32 logits over Qwen3's 151936 embedding rows.
ATTENTION_SNAPSHOT_BYTES = 4 * 151936


def lcp_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two id sequences.

    >>> lcp_len([1, 2, 3], [1, 2, 4, 5])
    2
    """
    a = a if isinstance(a, list) else list(a)
    b = b if isinstance(b, list) else list(b)
    n = min(len(a), len(b))
    i = 0
    # compare chunks first: list slices compare in C, far faster than a Python loop on long ids
    while i < n:
        j = min(i + 2048, n)
        if a[i:j] == b[i:j]:
            i = j
            continue
        while a[i] == b[i]:
            i += 1
        return i
    return n


# --- checkpoint policies -----------------------------------------------------------------------------
@dataclass(frozen=True)
class CheckpointPolicy:
    """Where a session saves snapshots. Subclasses say which positions a read span creates.

    `bytes_per_snapshot` sizes MemoryBudget's capacity and the reported memory: for an attention-only
    model a snapshot is just logits (ATTENTION_SNAPSHOT_BYTES for Qwen3's vocabulary).

    `before_last` (a token id, None: off; any policy) also snapshots, after each prompt read, the position
    just before the LAST occurrence of that id in the prompt, when the call reads it (reused < p): the
    engine's ``CheckpointPolicy.before_last``. With ``<|im_start|>`` (151644) that is the generation
    prompt's header, where a template that rewrites the previous reply makes the next prompt diverge.

    >>> TurnStart(before_last=9).prompt_positions([1, 9, 2, 9, 3], 0)
    [3, 5]
    """

    bytes_per_snapshot: int = field(default=DEFAULT_SNAPSHOT_BYTES, kw_only=True)
    before_last: int | None = field(default=None, kw_only=True)

    def __post_init__(self):
        if not isinstance(self.bytes_per_snapshot, int) or self.bytes_per_snapshot <= 0:
            raise ValueError(f"bytes_per_snapshot must be a positive int, got {self.bytes_per_snapshot!r}")
        b = self.before_last
        if b is not None and (isinstance(b, bool) or not isinstance(b, int) or b < 0):
            raise ValueError(f"before_last must be a token id (int >= 0) or None, got {b!r}")

    def prompt_positions(self, prompt: Sequence[int], start: int) -> list[int]:
        """Snapshot positions, ascending, created by reading `prompt` from `start` (the prefill span):
        `positions(start, len(prompt), prompt_end=True)` plus the before_last position."""
        end = len(prompt)
        out = self.positions(start, end, prompt_end=True)
        p = before_last_pos(prompt, self.before_last)
        if p is not None and start < p < end and p not in out:
            out = sorted([*out, p])
        return out

    def positions(self, start: int, end: int, *, prompt_end: bool) -> list[int]:
        """Snapshot positions in (start, end] created by reading ids start..end.

        `prompt_end` is True for the prefill span (end = len(prompt)), False for decode.
        """
        raise NotImplementedError

    @property
    def capacity(self) -> int | None:
        """Most snapshots kept at once (None: unbounded)."""
        return None

    @property
    def name(self) -> str:
        return type(self).__name__ + self._suffix()

    def _suffix(self) -> str:
        return "" if self.before_last is None else f"+before_last({self.before_last})"


def before_last_pos(prompt: Sequence[int], token_id: int | None) -> int | None:
    """Index of the last occurrence of `token_id` in `prompt` (the position just before it), None when
    off, absent, or only at index 0.

    >>> before_last_pos([5, 1, 7, 1, 8], 1), before_last_pos([1, 2], 1), before_last_pos([1, 2], None)
    (3, None, None)
    """
    if token_id is None:
        return None
    for i in range(len(prompt) - 1, 0, -1):
        if prompt[i] == token_id:
            return i
    return None


@dataclass(frozen=True)
class NoCheckpoints(CheckpointPolicy):
    """No snapshots at all: a hybrid session can only extend what it holds or start from 0."""

    def positions(self, start, end, *, prompt_end):
        return []


@dataclass(frozen=True)
class TurnStart(CheckpointPolicy):
    """The default: one snapshot at the end of each prompt (the turn start of the reply)."""

    def positions(self, start, end, *, prompt_end):
        return [end] if prompt_end and end > 0 else []


@dataclass(frozen=True)
class EveryN(CheckpointPolicy):
    """A snapshot every `n` positions, inside replies too, plus the turn start (unless turn_start=False).

    >>> EveryN(4).positions(2, 11, prompt_end=False)
    [4, 8]
    """

    n: int = 256
    turn_start: bool = True

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.n, int) or self.n <= 0:
            raise ValueError(f"n must be a positive int, got {self.n!r}")

    def positions(self, start, end, *, prompt_end):
        out = list(range((start // self.n + 1) * self.n, end + 1, self.n))
        if prompt_end and self.turn_start and end > 0 and (not out or out[-1] != end):
            out.append(end)
        return out

    @property
    def name(self):
        return f"EveryN({self.n})" + self._suffix()


@dataclass(frozen=True)
class Positions(CheckpointPolicy):
    """Snapshots at chosen absolute positions (plus the turn start if turn_start=True)."""

    at: tuple = ()
    turn_start: bool = False

    def __post_init__(self):
        super().__post_init__()
        at = tuple(sorted(set(self.at)))
        if any(not isinstance(p, int) or p <= 0 for p in at):
            raise ValueError(f"at must hold positive ints, got {self.at!r}")
        object.__setattr__(self, "at", at)

    def positions(self, start, end, *, prompt_end):
        out = [p for p in self.at if start < p <= end]
        if prompt_end and self.turn_start and end > 0 and end not in out:
            out.append(end)
        return out


@dataclass(frozen=True)
class MemoryBudget(CheckpointPolicy):
    """Snapshots of an inner policy, at most `mib` MiB of them, least recently used evicted first.

    >>> MemoryBudget(mib=288, bytes_per_snapshot=72 * 2**20).capacity
    4
    """

    mib: float = 1024.0
    every: int | None = None   # inner policy: EveryN(every) when set, else TurnStart

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.mib, (int, float)) or self.mib <= 0:
            raise ValueError(f"mib must be a positive number, got {self.mib!r}")
        if self.every is not None and (not isinstance(self.every, int) or self.every <= 0):
            raise ValueError(f"every must be a positive int or None, got {self.every!r}")
        if self.capacity < 1:
            raise ValueError(f"mib={self.mib} holds no snapshot of {self.bytes_per_snapshot} bytes")

    def positions(self, start, end, *, prompt_end):
        inner = EveryN(self.every, bytes_per_snapshot=self.bytes_per_snapshot) if self.every else \
            TurnStart(bytes_per_snapshot=self.bytes_per_snapshot)
        return inner.positions(start, end, prompt_end=prompt_end)

    @property
    def capacity(self):
        return int(self.mib * 2**20 // self.bytes_per_snapshot)

    @property
    def name(self):
        inner = f", every={self.every}" if self.every else ""
        return f"MemoryBudget({self.mib:g} MiB{inner})" + self._suffix()


# <|im_start|> in the Qwen vocabulary: "header" checkpoints sit just before the generation prompt's header.
IM_START_ID = 151644


def parse_checkpoint_policy(spec: str, *, bytes_per_snapshot: int = DEFAULT_SNAPSHOT_BYTES,
                            before_last: int | None = None) -> CheckpointPolicy:
    """Build a policy from a short spec: "turn", "none", "every:N", "at:P1,P2", "budget:MIB[:N]", plus
    "header" (TurnStart and a snapshot before the last <|im_start|> of each prompt: before_last=151644)
    or "before-last:ID" (the same with any id). A ",header" / ",before-last:ID" suffix adds it to any
    other kind ("every:256,header"); `before_last` sets it for every kind.

    >>> parse_checkpoint_policy("every:512")
    EveryN(bytes_per_snapshot=75497472, before_last=None, n=512, turn_start=True)
    >>> parse_checkpoint_policy("header").name, parse_checkpoint_policy("every:64,before-last:7").name
    ('TurnStart+before_last(151644)', 'EveryN(64)+before_last(7)')
    """
    spec = spec.strip()
    low = spec.lower().replace("_", "-")
    try:
        # a trailing ",header" / ",before-last:ID" on another kind
        for key in (",header", ",before-last:"):
            i = low.find(key)
            if i > 0:
                before_last = _header_id(low[i + 1:])
                spec, low = spec[:i], low[:i]
                break
        if low in ("header", "turn+header") or low.startswith("before-last:"):
            return TurnStart(bytes_per_snapshot=bytes_per_snapshot, before_last=_header_id(low))
        kind, _, arg = spec.partition(":")
        kind = kind.strip().lower()
        kw = dict(bytes_per_snapshot=bytes_per_snapshot, before_last=before_last)
        if kind in ("turn", "turnstart", "turn_start"):
            return TurnStart(**kw)
        if kind == "none":
            return NoCheckpoints(**kw)
        if kind in ("every", "everyn"):
            return EveryN(n=int(arg), **kw)
        if kind in ("at", "positions"):
            return Positions(at=tuple(int(p) for p in arg.split(",") if p), **kw)
        if kind in ("budget", "memory"):
            mib, _, every = arg.partition(":")
            return MemoryBudget(mib=float(mib), every=int(every) if every else None, **kw)
    except ValueError as exc:
        raise ValueError(f"checkpoint policy {spec!r}: {exc}") from None
    raise ValueError(f"checkpoint policy {spec!r}: unknown kind {kind!r} "
                     "(turn, none, every:N, at:P1,P2, budget:MIB[:N], header, before-last:ID)")


def _header_id(part: str) -> int:
    if part == "header":
        return IM_START_ID
    _, _, arg = part.partition(":")
    return int(arg)


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
    if model == "attention" or target == len(held):
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


@dataclass
class SessionState:
    """One session's held ids, their origins and checkpoints, stepped call by call.

    `segments` records where held ids came from: (start, end, kind, call) with kind "prompt", "gen"
    or "drained"; replay uses it to say whether a divergence lies in a reply or in the history.
    """

    model: str = "hybrid"
    policy: CheckpointPolicy = field(default_factory=TurnStart)
    full_hit: str = "held_logits"
    held: list = field(default_factory=list)
    checkpoints: "OrderedDict[int, None]" = field(default_factory=OrderedDict)  # LRU order, oldest first
    segments: list = field(default_factory=list)
    calls: int = 0
    peak_snapshots: int = 0

    def __post_init__(self):
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {MODELS}, got {self.model!r}")
        if self.full_hit not in FULL_HIT_RULES:
            raise ValueError(f"full_hit must be one of {FULL_HIT_RULES}, got {self.full_hit!r}")
        if not isinstance(self.policy, CheckpointPolicy):
            raise ValueError(f"policy must be a CheckpointPolicy, got {self.policy!r}")

    @property
    def uses_checkpoints(self) -> bool:
        """Whether a divergence restores a recurrent-state snapshot (hybrid). Both models keep
        checkpoints: their logits serve a prompt that ends exactly on one."""
        return self.model == "hybrid"

    def call(self, prompt_ids: Sequence[int]) -> CallPrediction:
        """Reuse for `prompt_ids`, then cut held there and append the prompt (prefill)."""
        prompt = list(prompt_ids)
        held_before = len(self.held)
        n_ckpt = len(self.checkpoints)
        lcp = lcp_len(prompt, self.held)
        reused = predict_reuse(prompt, self.held, self.checkpoints, model=self.model,
                               full_hit=self.full_hit, lcp=lcp)
        restored = None
        if reused != held_before and reused in self.checkpoints and (self.uses_checkpoints or reused == len(prompt)):
            restored = reused
            self.checkpoints.move_to_end(reused)  # a restore counts as a use for LRU
        self._cut(reused)
        self.held.extend(prompt[reused:])
        self._add_segment(reused, len(self.held), "prompt")
        self._snapshot(reused, len(self.held), prompt_end=True, prompt=prompt)
        self.calls += 1
        return CallPrediction(len(prompt), held_before, lcp, reused, restored, n_ckpt)

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
        return len(self.checkpoints) * self.policy.bytes_per_snapshot

    # -- internals ----------------------------------------------------------------------------------
    def _cut(self, n: int) -> None:
        if n < len(self.held):
            del self.held[n:]
            for c in [c for c in self.checkpoints if c > n]:
                del self.checkpoints[c]
            while self.segments and self.segments[-1][0] >= n:
                self.segments.pop()
            if self.segments and self.segments[-1][1] > n:
                s = self.segments[-1]
                self.segments[-1] = (s[0], n, s[2], s[3])

    def _add_segment(self, start: int, end: int, kind: str) -> None:
        if end > start:
            self.segments.append((start, end, kind, self.calls - (kind != "prompt")))

    def _snapshot(self, start: int, end: int, *, prompt_end: bool, prompt=None) -> None:
        cap = self.policy.capacity
        ps = self.policy.prompt_positions(prompt, start) if prompt is not None else \
            self.policy.positions(start, end, prompt_end=prompt_end)
        for p in ps:
            self.checkpoints[p] = None
            self.checkpoints.move_to_end(p)
            if cap is not None:
                while len(self.checkpoints) > cap:
                    self.checkpoints.popitem(last=False)
        self.peak_snapshots = max(self.peak_snapshots, len(self.checkpoints))
