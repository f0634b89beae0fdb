"""Host-side checks shared by the token-id front ends (:mod:`.hf_rope_index`, :mod:`.hf_families`,
:mod:`.hf_omni`): grid arguments, packed rows' ``cu_seqlens`` and the placement of a batch's vision blocks
on its placeholder tokens."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .._arrays import host


def check_grid(grid: Any, name: str, merge: int | None = None) -> np.ndarray:
    """``(num, 3)`` int64 host copy of a grid argument: positive integers and, with ``merge``,
    ``h`` and ``w`` divisible by the spatial merge size."""
    if grid is None:
        return np.zeros((0, 3), dtype=np.int64)
    if not isinstance(grid, Tensor) or grid.dim() != 2 or grid.shape[1] != 3:
        raise ValueError(f"{name} must be a tensor of shape (num, 3), got {getattr(grid, 'shape', grid)}")
    if grid.is_floating_point() or grid.is_complex() or grid.dtype == torch.bool:
        raise ValueError(f"{name} must hold integers, got dtype {grid.dtype}")
    out = host(grid).astype(np.int64)
    if out.size and out.min() <= 0:
        raise ValueError(f"{name} must hold positive sizes")
    if merge is not None and merge != 1 and (out[:, 1:] % merge).any():
        raise ValueError(f"{name}: h and w must be divisible by the spatial merge size {merge}")
    return out


def block_first(is_token: np.ndarray, block_tokens: np.ndarray, name: str) -> np.ndarray:
    """``(K,)`` flat index of each block's first token: the marked tokens of a ``(B, L)`` batch,
    in reading order, fill the blocks one after the other (as the reference consumes its grids).
    Every block's tokens must be consecutive tokens of one sample.

    The marked tokens are read as runs (one pass for the edges, no index per token): block ``k``
    holds the marked tokens ``offset[k] .. offset[k] + tokens[k] - 1`` of the batch, which must lie
    in one run, runs cut at the sample starts."""
    length = is_token.shape[1]
    flat = is_token.reshape(-1)
    n = flat.shape[0]
    edges = np.flatnonzero(flat[1:] != flat[:-1]) + 1  # (E,) where a run starts or ends
    if n and length < n:  # runs cut at every sample start inside one
        inside = np.arange(length, n, length)
        inside = inside[flat[inside] & flat[inside - 1]]
        if inside.size:
            edges = np.sort(np.concatenate([edges, inside, inside]))  # an end and a start there
    if n:
        edges = np.concatenate([[0], edges]) if flat[0] else edges
        edges = np.concatenate([edges, [n]]) if flat[-1] else edges
    start, end = edges[0::2], edges[1::2]  # (M,) the runs of marked tokens, in reading order
    run_end = np.cumsum(end - start)  # (M,) marked tokens up to each run's end
    found = int(run_end[-1]) if run_end.size else 0
    total = int(block_tokens.sum())
    if found != total:
        raise ValueError(f"{name} describes {total} tokens, but input_ids holds {found} such tokens")
    if not total:
        return np.zeros(block_tokens.shape[0], dtype=np.int64)
    offset = np.cumsum(block_tokens) - block_tokens  # (K,) marked tokens before each block
    run = np.searchsorted(run_end, offset, side="right")  # (K,) the run holding each block's first token
    first = start[run] + offset - (run_end[run] - (end - start)[run])
    bad = offset + block_tokens > run_end[run]  # the block runs past its run
    if bad.any():
        index = np.flatnonzero(is_token)  # the error path: where the block's last token is
        k = int(np.flatnonzero(bad)[0])
        last = index[offset[k] + block_tokens[k] - 1]
        raise ValueError(
            f"{name}: block {k} ({int(block_tokens[k])} tokens) does not fit consecutive tokens of one sample "
            f"(its tokens run from sample {int(first[k] // length)} to sample {int(last // length)}); "
            "each grid must match one run of placeholder tokens"
        )
    return first


def check_cu_seqlens(cu_seqlens: Any, total: int) -> np.ndarray:
    """``(B + 1,)`` int64 host copy of a packed row's sample offsets: integers rising strictly from 0 to ``total``."""
    if not isinstance(cu_seqlens, Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 2:
        raise ValueError(f"cu_seqlens must be a 1-D tensor (B + 1,), got {getattr(cu_seqlens, 'shape', cu_seqlens)}")
    if cu_seqlens.is_floating_point() or cu_seqlens.is_complex() or cu_seqlens.dtype == torch.bool:
        raise ValueError(f"cu_seqlens must hold integers, got dtype {cu_seqlens.dtype}")
    cu = host(cu_seqlens).astype(np.int64)
    if cu[0] != 0 or cu[-1] != total or (np.diff(cu) <= 0).any():
        raise ValueError(
            f"cu_seqlens must rise strictly from 0 to the packed length {total} (no empty sample), got {cu.tolist()}"
        )
    return cu


def packed_rows(cu_seqlens: Any, total: int, device: torch.device) -> tuple[np.ndarray, Callable[[Tensor], Tensor]]:
    """A packed row's sample lengths ``(B,)`` (``cu_seqlens`` checked by :func:`check_cu_seqlens`) and
    ``unpack``: a ``(1, N)`` tensor laid out as the padded ``(B, longest)`` batch (right padding, zeros)."""
    cu = check_cu_seqlens(cu_seqlens, total)
    lengths = np.diff(cu)
    b, longest = lengths.shape[0], int(lengths.max())
    flat = np.repeat(np.arange(b) * longest - cu[:-1], lengths) + np.arange(total)  # (N,) into (B, longest)
    flat_t = torch.from_numpy(flat).to(device)

    def unpack(t: Tensor) -> Tensor:
        return t.new_zeros(b * longest).index_copy_(0, flat_t, t.reshape(-1)).view(b, longest)

    return lengths, unpack
