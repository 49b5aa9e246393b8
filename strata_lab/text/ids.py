"""Helpers on token-id sequences shared by every stage: the longest common prefix."""
from __future__ import annotations

from typing import Sequence

__all__ = ["lcp_len"]


def lcp_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two id sequences.

    >>> lcp_len([1, 2, 3], [1, 2, 4, 5])
    2
    >>> lcp_len(list(range(5000)), list(range(3001)) + [0] * 10), lcp_len([], [1])
    (3001, 0)
    """
    a = a if isinstance(a, list) else list(a)
    b = b if isinstance(b, list) else list(b)
    n = min(len(a), len(b))
    if n <= 4096:  # one compare in C, copying only the longer side's head
        if (a if len(a) == n else a[:n]) == (b if len(b) == n else b[:n]):
            return n
    i = 0
    # compare chunks first: list slices compare in C, far faster than a Python loop on long ids
    while i < n:
        j = min(i + 2048, n)
        if a[i:j] == b[i:j]:
            i = j
            continue
        # the first difference lies in [i, j): halve the window with slice compares, then step
        lo, hi = i, j
        while hi - lo > 16:
            mid = (lo + hi) // 2
            if a[lo:mid] == b[lo:mid]:
                lo = mid
            else:
                hi = mid
        while a[lo] == b[lo]:
            lo += 1
        return lo
    return n
