"""Where a session keeps snapshots: `strata_lab.rules.CheckpointPolicy` read by the state model.

There is one snapshot-policy type, `strata_lab.CheckpointPolicy` (strata_lab/rules.py, with its spec reader
and printer): the C++ engine and replay core get their own struct from it (`CheckpointPolicy._native(ext)`),
the state model reads its fields here.
"""
from __future__ import annotations

from typing import Sequence

from strata_lab.rules import CheckpointPolicy

__all__ = ["snapshot_positions", "prompt_positions", "snapshot_capacity", "before_last_pos"]


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
