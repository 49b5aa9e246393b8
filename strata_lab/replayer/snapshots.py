"""Where a session keeps snapshots: the engine's `CheckpointPolicy` read by the state model, and its specs.

There is one snapshot-policy type, `strata_lab.CheckpointPolicy` (engine.py): the C++ engine gets its own
struct from it (`CheckpointPolicy._native()`), the state model reads its fields here.

>>> p = parse_checkpoint_policy("every:64,header")
>>> (p.every, p.before_last), describe_policy(p)
((64, 151644), 'every:64,header')
"""
from __future__ import annotations

from typing import Sequence

from strata_lab.engine import CheckpointPolicy

__all__ = ["CheckpointPolicy", "snapshot_positions", "prompt_positions", "snapshot_capacity", "describe_policy",
           "before_last_pos", "parse_checkpoint_policy", "IM_START_ID"]


# --- checkpoint policies: the engine's one type, read by the state model ----------------------------
def snapshot_positions(policy: CheckpointPolicy, start: int, end: int, *, prompt_end: bool) -> list[int]:
    """Snapshot positions, ascending, in (start, end] created by reading ids start..end, as the engine
    takes them: every `every` positions, at `positions`, and at the prompt's end when `at_prompt_end`
    (`prompt_end` is True for the prefill span, False for decode).

    >>> snapshot_positions(CheckpointPolicy(every=4), 2, 11, prompt_end=False)
    [4, 8]
    >>> snapshot_positions(CheckpointPolicy(every=4, positions=(10,)), 2, 11, prompt_end=True)
    [4, 8, 10, 11]
    """
    last = [end] if prompt_end and policy.at_prompt_end and end > 0 else []
    if not policy.every and not policy.positions:
        return last
    out = set(range((start // policy.every + 1) * policy.every, end + 1, policy.every)) if policy.every else set()
    out.update([p for p in policy.positions if start < p <= end])
    out.update(last)
    return sorted(out)


def prompt_positions(policy: CheckpointPolicy, prompt: Sequence[int], start: int) -> list[int]:
    """Snapshot positions created by reading `prompt` from `start` (the prefill span): the span's
    positions plus the `before_last` one (just before the last occurrence of that id, when read).

    >>> prompt_positions(CheckpointPolicy(before_last=9), [1, 9, 2, 9, 3], 0)
    [3, 5]
    """
    end = len(prompt)
    out = snapshot_positions(policy, start, end, prompt_end=True)
    p = before_last_pos(prompt, policy.before_last)
    if p is not None and start < p < end and p not in out:
        out = sorted([*out, p])
    return out


def snapshot_capacity(policy: CheckpointPolicy, bytes_per_snapshot: int) -> int | None:
    """Most snapshots kept at once under the policy's MiB budget (None: no budget).

    >>> snapshot_capacity(CheckpointPolicy(budget_mib=288), 72 * 2**20), snapshot_capacity(CheckpointPolicy(), 1)
    (4, None)
    """
    if not policy.budget_mib:
        return None
    return int(policy.budget_mib * 2**20 // bytes_per_snapshot)


def describe_policy(policy: CheckpointPolicy) -> str:
    """A short spec that parse_checkpoint_policy reads back.

    >>> describe_policy(parse_checkpoint_policy("budget:288:64,header"))
    'budget:288:64,header'
    """
    if policy.budget_mib:
        out = f"budget:{policy.budget_mib:g}" + (f":{policy.every}" if policy.every else "")
    elif policy.every:
        out = f"every:{policy.every}"
    elif policy.positions:
        out = "at:" + ",".join(str(p) for p in policy.positions)
    else:
        out = "turn" if policy.at_prompt_end else "none"
    if policy.before_last is not None:
        out += ",header" if policy.before_last == IM_START_ID else f",before-last:{policy.before_last}"
    return out


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


# <|im_start|> in the Qwen vocabulary: "header" checkpoints sit just before the generation prompt's header.
IM_START_ID = 151644


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
    raise ValueError(f"checkpoint policy {spec!r}: unknown kind {kind!r} "
                     "(turn, none, every:N, at:P1,P2, budget:MIB[:N], header, before-last:ID)")


def _header_id(part: str) -> int:
    if part == "header":
        return IM_START_ID
    _, _, arg = part.partition(":")
    return int(arg)
