"""Runs of a 1-D bool mask, found by its edges (shared by the packer and the token-id front ends)."""

from __future__ import annotations

import numpy as np


def changes(flat: np.ndarray) -> np.ndarray:
    """``(E,)`` int64 sorted indices ``p`` (``1 <= p < n``) where the 1-D bool ``flat`` ``(n,)`` differs from
    ``flat[p - 1]``: where its runs start and end.

    One comparison pass; the (few) changes are then found word by word: the ``(n - 1,)`` difference
    mask read as uint64 words, only the nonzero words' bytes searched (a ``flatnonzero`` over every byte
    of a sparse mask costs several times more)."""
    n = flat.shape[0]
    if n < 2:
        return np.zeros(0, dtype=np.int64)
    diff = flat[1:] != flat[:-1]  # (n - 1,) bool, a new contiguous array
    whole = diff.shape[0] // 8 * 8
    hit = np.flatnonzero(diff[:whole].view(np.uint64) != 0)  # (W,) words holding a change
    at = np.flatnonzero(diff[:whole].reshape(-1, 8)[hit])  # (E,) in the (W, 8) bytes of those words, in order
    found = hit[at >> 3] * 8 + (at & 7)
    if whole < diff.shape[0]:
        found = np.concatenate([found, np.flatnonzero(diff[whole:]) + whole])
    return found + 1
