"""The rules every stage shares, on the bottom floor (it imports nothing from strata_lab): where a session
keeps snapshots (`CheckpointPolicy`), the checkpoint-spec kinds and their one reader and one printer, and
the cause vocabulary a replay row names.

The engine hands a `CheckpointPolicy` to C++, the state model (strata_lab.replayer) reads its fields, the
replays and reports print it; none of them owns it.

>>> p = parse_checkpoint_policy("every:64,header")
>>> (p.every, p.before_last), checkpoint_spec(p)
((64, 151644), 'every:64,header')
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

__all__ = ["CheckpointPolicy", "CHECKPOINT_KINDS", "IM_START_ID", "parse_checkpoint_policy", "checkpoint_spec",
           "DIVERGENCE_CAUSES", "HABIT_CAUSES", "ENGINE_CAUSES", "CAUSES"]


@dataclass(frozen=True)
class CheckpointPolicy:
    """Where a session saves state snapshots (checkpoints). Every snapshot keeps the logits after its last
    id (4 x vocab_size bytes), which serve a prompt ending exactly there. Qwen3's snapshots hold nothing
    else (its KV cache can be cut anywhere); hybrid models also save the recurrent state and restore it
    when the prompt leaves the held ids. ``budget_mib`` counts the logits too.

    ``before_last`` (a token id, None: off) also snapshots, after each prompt read, the position just
    before the LAST occurrence of that id in the prompt: with ``<|im_start|>`` (151644) the generation
    prompt's header, where the next prompt parts from the held ids when the template rewrites the reply
    (Qwen3 strips its empty ``<think>`` block once a new user turn arrives). The read splits there, so
    the snapshot is exact; it is taken only when that position is read by this call.

    >>> CheckpointPolicy(every=256, budget_mib=512).every
    256
    >>> CheckpointPolicy(before_last=151644).before_last
    151644
    """

    at_prompt_end: bool = True          # one snapshot at the end of each prompt (the turn start)
    every: int = 0                      # also every N tokens (0: off)
    positions: tuple[int, ...] = ()     # also at these positions
    budget_mib: float = 0.0             # evict least recently used snapshots beyond this (0: no limit)
    before_last: Optional[int] = None   # also just before the last occurrence of this id in each prompt

    def __post_init__(self):
        if int(self.every) < 0:
            raise ValueError(f"every must be >= 0, got {self.every}")
        if any(int(p) <= 0 for p in self.positions):
            raise ValueError(f"positions must be > 0, got {list(self.positions)}")
        if not self.budget_mib >= 0:
            raise ValueError(f"budget_mib must be >= 0, got {self.budget_mib}")
        b = self.before_last
        if b is not None and (isinstance(b, bool) or not isinstance(b, int) or not 0 <= b < 2**31):
            raise ValueError(f"before_last must be a token id (int >= 0) or None, got {b!r}")

    def __str__(self) -> str:
        """The policy's spec (`checkpoint_spec`), or its fields when no spec names it.

        >>> str(CheckpointPolicy(every=64)), str(CheckpointPolicy(every=4, positions=(6,)))
        ('every:64', 'CheckpointPolicy(at_prompt_end=True, every=4, positions=(6,), budget_mib=0.0, before_last=None)')
        """
        try:
            return checkpoint_spec(self)
        except ValueError:
            return repr(self)

    def _native(self, ext):
        """This policy as the compiled extension `ext`'s CheckpointPolicy (the engine's or the replay
        core's). The fields are declared once, in engine/include/strata/checkpoint_policy.h; they are copied
        by the names the binding lists (`_fields`), each converted to the type of the binding's default
        (None: -1, off)."""
        p = ext.CheckpointPolicy()
        for name in type(p)._fields:
            v, default = getattr(self, name), getattr(p, name)
            if v is None:
                v = -1
            elif isinstance(default, list):
                v = [int(x) for x in v]
            else:
                v = type(default)(v)
            setattr(p, name, v)
        return p


# <|im_start|> in the Qwen vocabulary: "header" checkpoints sit just before the generation prompt's header.
IM_START_ID = 151644

# The kinds a checkpoint spec names (parse_checkpoint_policy); "header" and "before-last:ID" also join any
# other kind as a ",header" / ",before-last:ID" suffix.
CHECKPOINT_KINDS = ("turn", "none", "every:N", "at:P1,P2", "budget:MIB[:N]", "header", "before-last:ID")


def parse_checkpoint_policy(spec: str, *, before_last: int | None = None) -> CheckpointPolicy:
    """Build a CheckpointPolicy from a short spec: "turn", "none", "every:N", "at:P1,P2", "budget:MIB[:N]",
    plus "header" (the turn start and a snapshot before the last <|im_start|> of each prompt:
    before_last=151644) or "before-last:ID" (the same with any id). A ",header" / ",before-last:ID" suffix
    adds it to any other kind ("every:256,header"); `before_last` sets it for every kind.

    >>> parse_checkpoint_policy("every:512")
    CheckpointPolicy(at_prompt_end=True, every=512, positions=(), budget_mib=0.0, before_last=None)
    >>> parse_checkpoint_policy("header").before_last, parse_checkpoint_policy("every:64,before-last:7").before_last
    (151644, 7)
    """
    if not isinstance(spec, str):
        raise TypeError(f"checkpoint policy spec must be a str, got {type(spec).__name__}")
    spec = spec.strip()
    low = spec.lower().replace("_", "-")
    kind = low
    try:
        # a trailing ",header" / ",before-last:ID" on another kind
        for key in (",header", ",before-last:"):
            i = low.find(key)
            if i > 0:
                before_last = _header_id(low[i + 1:])
                spec, low = spec[:i], low[:i]
                break
        if low in ("header", "turn+header") or low.startswith("before-last:"):
            return CheckpointPolicy(before_last=_header_id(low))
        kind, _, arg = spec.partition(":")
        kind = kind.strip().lower()
        if kind in ("turn", "turnstart", "turn-start", "turn_start"):
            return CheckpointPolicy(before_last=before_last)
        if kind == "none":
            return CheckpointPolicy(at_prompt_end=False, before_last=before_last)
        if kind in ("every", "everyn"):
            n = int(arg)
            if n <= 0:
                raise ValueError(f"n must be a positive int, got {n}")
            return CheckpointPolicy(every=n, before_last=before_last)
        if kind in ("at", "positions"):
            at = tuple(sorted({int(p) for p in arg.split(",") if p}))
            return CheckpointPolicy(at_prompt_end=False, positions=at, before_last=before_last)
        if kind in ("budget", "memory"):
            mib, _, every = arg.partition(":")
            if not float(mib) > 0:
                raise ValueError(f"mib must be a positive number, got {mib}")
            n = int(every) if every else 0
            if n < 0:
                raise ValueError(f"every must be a positive int, got {n}")
            return CheckpointPolicy(budget_mib=float(mib), every=n, before_last=before_last)
    except ValueError as exc:
        raise ValueError(f"checkpoint policy {spec!r}: {exc}") from None
    raise ValueError(f"checkpoint policy {spec!r}: unknown kind {kind!r} ({', '.join(CHECKPOINT_KINDS)})")


def _header_id(part: str) -> int:
    if part == "header":
        return IM_START_ID
    _, _, arg = part.partition(":")
    return int(arg)


def checkpoint_spec(policy: CheckpointPolicy | str) -> str:
    """The one printer of a checkpoint policy: the spec `parse_checkpoint_policy` reads back as the same
    policy; a string (a spec, or the engine spec's "recorded") is returned as given. A policy no spec names
    (`every` together with `positions`, or `positions` kept with the turn start) is a ValueError.

    >>> checkpoint_spec(CheckpointPolicy(every=64)), checkpoint_spec(CheckpointPolicy(before_last=151644))
    ('every:64', 'header')
    >>> checkpoint_spec(parse_checkpoint_policy("budget:288:64,before-last:9"))
    'budget:288:64,before-last:9'
    """
    if isinstance(policy, str):
        return policy
    if not isinstance(policy, CheckpointPolicy):
        raise TypeError(f"checkpoint_policy must be a strata_lab.CheckpointPolicy or a spec string, "
                        f"got {type(policy).__name__}")
    if policy.budget_mib:
        base = f"budget:{policy.budget_mib:g}" + (f":{policy.every}" if policy.every else "")
    elif policy.positions:
        base = "at:" + ",".join(map(str, policy.positions))
    elif policy.every:
        base = f"every:{policy.every}"
    else:
        base = "turn" if policy.at_prompt_end else "none"
    if policy.before_last is not None:
        tail = "header" if policy.before_last == IM_START_ID else f"before-last:{policy.before_last}"
        base = tail if base == "turn" else f"{base},{tail}"
    if parse_checkpoint_policy(base) != policy:
        raise ValueError(f"checkpoint policy {policy!r} has no spec; use one of {', '.join(CHECKPOINT_KINDS)}")
    return base


# --- the cause vocabulary of a replay row (docs/CONTRACTS.md, Contract 3) --------------------------------
# Why the prompt parted from what its session held (engine-independent).
DIVERGENCE_CAUSES = ("retokenized_reply", "retokenized_prompt", "drained_dropped", "template_rewrite",
                     "volatile_system", "arguments_reserialised", "tool_output_truncated", "history_edit",
                     "diverged")
# A client habit found on a call's messages (import's `history_change`, strata_lab/traces/habits.py) -> the
# divergence it causes; a call whose messages resend what the session held, yet whose ids part, was rewritten
# by the template (`template_rewrite`).
HABIT_CAUSES = {"volatile_system": "volatile_system", "reasoning_dropped": "template_rewrite",
                "arguments_reserialised": "arguments_reserialised", "tool_output_truncated": "tool_output_truncated",
                "history_edit": "history_edit"}
# Why an engine served less than the ids allowed (one name each; `no_state_checkpoint` also names our hybrid
# engine restarting from an earlier state snapshot).
ENGINE_CAUSES = ("block_rounding", "evicted", "expired", "below_minimum", "slot_stolen", "no_state_checkpoint",
                 "lookback", "not_cached", "last_output_token", "routing", "refused")
# The one cause vocabulary of a replay row (the C++ replay core exports its causes by name, each one of these).
CAUSES = ("none", "new_session") + DIVERGENCE_CAUSES + ENGINE_CAUSES
