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
from ..schemes import Scheme


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


def check_grids(image_grid_thw: Any, video_grid_thw: Any, merge: int) -> tuple[np.ndarray, int]:
    """:func:`check_grid` of both grid arguments at once: ``(K, 3)`` int64 host array, the image grids
    then the video grids (a fresh array: callers may write into it), and the number of image grids.
    The checks and their order (image grid first) are :func:`check_grid`'s: where a value check fails,
    the grids are checked one by one for the error."""
    parts = [g for g in (image_grid_thw, video_grid_thw) if g is not None]
    for g in parts:  # metadata first; an invalid one: the one-by-one checks raise in order
        if not isinstance(g, Tensor) or g.dim() != 2 or g.shape[1] != 3 or g.dtype != torch.int64:
            return _grids_one_by_one(image_grid_thw, video_grid_thw, merge)
    if not parts:
        return np.zeros((0, 3), dtype=np.int64), 0
    k_img = 0 if image_grid_thw is None else image_grid_thw.shape[0]
    grid = np.concatenate([host(g) for g in parts]) if len(parts) == 2 else host(parts[0]).copy()  # (K, 3) fresh
    if grid.size and (grid.min() <= 0 or (merge != 1 and (grid[:, 1:] % merge).any())):
        return _grids_one_by_one(image_grid_thw, video_grid_thw, merge)  # raises the first grid's error
    return grid, k_img


def _grids_one_by_one(image_grid_thw: Any, video_grid_thw: Any, merge: int) -> tuple[np.ndarray, int]:
    images = check_grid(image_grid_thw, "image_grid_thw", merge)
    videos = check_grid(video_grid_thw, "video_grid_thw", merge)
    return np.concatenate([images, videos]), images.shape[0]


def new_ids(input_ids: Any, scheme: Scheme) -> Tensor | None:
    """A new ``(rows, B, L)`` ids tensor of ``scheme`` (its ``id_dtype``; ``rows``: 3, or its axes when it has more)
    for a CPU ``(B, L)`` ``input_ids`` (``None`` otherwise: the packer allocates), for ``pack(..., out=)``. A front
    end allocates it *before* its per-token temporaries: the ids then take the memory the caller just freed (its
    last call's ids), where allocated after them they can land on the heap's top, which glibc hands back to the
    system when they are freed, so that every call faults its ids in again, page by page (about 600 faults and twice
    the time of a call on the benchmark batch; docs/benchmarks/multimodal.md)."""
    if not isinstance(input_ids, Tensor) or input_ids.dim() != 2 or input_ids.device.type != "cpu":
        return None
    rows = 3 if len(scheme.axes) == 1 else len(scheme.axes)
    return torch.empty((rows, *input_ids.shape), dtype=scheme.id_dtype)


def real_tokens(attention_mask: Tensor | None, shape: tuple[int, ...]) -> np.ndarray:
    """``(B, L)`` bool host array: where ``attention_mask`` (checked to have ``shape`` by the caller) is 1; every
    token where it is ``None``. The mask must hold 0 and 1 only: transformers 4.57 reads ``attention_mask == 1``,
    5.x ``attention_mask.bool()``, which agree on these values alone."""
    if attention_mask is None:
        return np.ones(shape, dtype=bool)
    mask = host(attention_mask)
    real = mask == 1
    if np.count_nonzero(mask) != np.count_nonzero(real):  # a value that is neither 0 nor 1 (NaN included)
        bad = mask[(mask != 0) & ~real].flat[0]
        raise ValueError(f"attention_mask must hold 0 (padding) and 1 (a real token) only, got {bad.item()!r}")
    return real


def modality_types(mm_token_type_ids: Tensor) -> np.ndarray:
    """Host copy of ``mm_token_type_ids`` (shape checked by the caller): 0 (text), 1 (image) or 2 (video) only, as
    the references read them (another value is no modality of theirs: a ``KeyError`` or a wrong grid there)."""
    types = host(mm_token_type_ids)
    if types.dtype.kind not in "iu":
        raise ValueError(f"mm_token_type_ids must be an integer tensor (0 text, 1 image, 2 video), got {types.dtype}")
    bad = (types < 0) | (types > 2)
    if bad.any():
        raise ValueError(
            f"mm_token_type_ids must hold 0 (text), 1 (image) or 2 (video), got {types[bad].flat[0].item()!r}"
        )
    return types


def modality_code(marks: np.ndarray, image_mark: Any, video_mark: Any, real: np.ndarray | None) -> np.ndarray:
    """``(B, L)`` uint8: 1 where ``marks`` (token ids or types) equals ``image_mark``, 2 where it equals
    ``video_mark`` (``None``: none), on the ``real`` tokens (``None``: all), 0 elsewhere; the marks must differ.
    The arithmetic stays in uint8 (two adds, one loop: no shift or ``or`` loop to warm up)."""
    code = (marks == image_mark).view(np.uint8)  # (B, L) 1 on the image tokens
    if video_mark is not None:
        video = (marks == video_mark).view(np.uint8)
        code += video
        code += video
    if real is not None:
        code *= real.view(np.uint8)  # real tokens only
    return code


def marked_runs(code: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The runs of equal nonzero values of a ``(B, L)`` integer or bool ``code`` (0: not marked), cut at the
    sample starts: ``start (M,)``, ``end (M,)`` flat indices (end exclusive) and ``value (M,)``, in reading
    order. One pass over the batch for the edges, no index per token."""
    length = code.shape[1]
    flat = code.reshape(-1)
    n = flat.shape[0]
    if not n:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, flat[:0]
    change = flat[1:] != flat[:-1]  # (N - 1,) whether token i + 1 starts a new run ...
    change[length - 1 :: length] = True  # ... and every sample start does (a cut between unmarked tokens splits
    # a run of zeros only: the marked runs are those cut at the sample starts)
    cut = change.nonzero()[0]  # (E,) each run's first token, minus one (methods: no Python-level wrapper)
    cut += 1
    bounds = np.concatenate([[0], cut, [n]])  # (R + 1,) every run, marked or not
    value = flat.take(bounds[:-1])  # (R,)
    keep = value != 0
    return bounds[:-1][keep], bounds[1:][keep], value[keep]


def fit_blocks(
    start: np.ndarray,
    end: np.ndarray,
    block_tokens: np.ndarray,
    name: str,
    length: int,
    marked: Callable[[], np.ndarray],
) -> np.ndarray:
    """``(K,)`` flat index of each block's first token: the marked tokens, read as the runs ``start``,
    ``end`` (:func:`marked_runs`, in reading order), fill the blocks one after the other; block ``k``
    holds the marked tokens ``offset[k] .. offset[k] + tokens[k] - 1``, which must lie in one run.
    ``length``: the batch's ``L``; ``marked``: the flat mask of the marked tokens (made on the error path only)."""
    size = end - start  # (M,)
    run_end = np.cumsum(size)  # (M,) marked tokens up to each run's end
    found = int(run_end[-1]) if run_end.size else 0
    total = int(block_tokens.sum())
    if found != total:
        raise ValueError(f"{name} describes {total} tokens, but input_ids holds {found} such tokens")
    if not total:
        return np.zeros(block_tokens.shape[0], dtype=np.int64)
    block_end = np.cumsum(block_tokens)  # (K,) marked tokens up to each block's end ...
    offset = block_end - block_tokens  # ... and before it
    run = np.searchsorted(run_end, offset, side="right")  # (K,) the run holding each block's first token
    run_stop = run_end[run]
    first = start[run] + offset - (run_stop - size[run])
    bad = block_end > run_stop  # the block runs past its run
    if bad.any():
        index = np.flatnonzero(marked())  # the error path: where the block's last token is
        k = int(np.flatnonzero(bad)[0])
        last = index[offset[k] + block_tokens[k] - 1]
        raise ValueError(
            f"{name}: block {k} ({int(block_tokens[k])} tokens) does not fit consecutive tokens of one sample "
            f"(its tokens run from sample {int(first[k] // length)} to sample {int(last // length)}); "
            "each grid must match one run of placeholder tokens"
        )
    return first


def block_first(is_token: np.ndarray, block_tokens: np.ndarray, name: str) -> np.ndarray:
    """``(K,)`` flat index of each block's first token: the marked tokens of a ``(B, L)`` bool batch,
    in reading order, fill the blocks one after the other (as the reference consumes its grids).
    Every block's tokens must be consecutive tokens of one sample (:func:`marked_runs`, :func:`fit_blocks`)."""
    start, end, _ = marked_runs(is_token)
    return fit_blocks(start, end, block_tokens, name, is_token.shape[1], lambda: is_token.reshape(-1))


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
