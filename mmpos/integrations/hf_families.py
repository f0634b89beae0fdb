"""Position ids of the transformers VLM families whose prompts are laid out their own way.

:func:`mmpos.integrations.hf_rope_index.get_rope_index` reads a config's ``model_type`` and hands
these families to the functions here (:data:`FAMILY_ROPE_INDEX`); their positions come from the
scheme registry (:mod:`mmpos.schemes`) through the one packer, :func:`mmpos.layout.pack`:

* ``hy_v4_vl`` (scheme ``hy-v4-vl``, transformers ``HYV4VLModel.get_rope_index``): every merged
  row of an image or video frame ends with a newline token, so a grid ``(t, h, w)`` holds
  ``t * (h / m) * (w / m + 1)`` tokens; each frame spans ``max(H, W + 1)`` positions.
* ``hunyuan_vl`` (scheme ``hunyuan-vl``, ``HunYuanVLModel.get_rope_index``): ``N`` axes
  (``len(text_config.rope_parameters["mrope_section"])``); the leading ``N - 3`` hold the 1-D
  position of every real token, the last three ``(width, height, image index)`` on the image
  tokens. An image of grid ``(t, h, w)`` is a run of ``(h / m) * (w / m + 1)`` image tokens,
  or of 2 more (its boundary tokens, at their 1-D position); ``t`` is not read. The token-id path
  writes these ids itself (one ``cumsum`` for the three vision axes; the ``hunyuan-vl`` scheme
  packed over :func:`newline_blocks` gives the same last three rows).
* ``glm_image`` (scheme ``glm-image``, ``GlmImageModel.get_rope_index``): the tokens between an
  image start and an image end token are the next grid of the sample (``images_per_sample``
  splits the grids; the grids after the sample's complete images are the images it generates,
  :func:`glm_image_decode_position_ids`); ``rope_deltas`` is zero.
* ``minicpmv4_7`` (scheme ``minicpm-v``, ``MiniCPMV4_7Model.get_rope_index``): a picture or video
  frame is a thumbnail crop, optionally followed by detail slices, between marker tokens; the
  thumbnail is stretched over the slices' canvas and the markers sit at its corners
  (:func:`minicpmv4_7_rope_index`, which reads ``target_sizes`` and ``downsample_mode``).

They exist from transformers 5.x on, with one rule each: ``rule`` may be ``"original"``,
``"installed"`` or ``"hf-5.3"`` (the same positions), not ``"hf-4.57"``. The references walk
every sample and block in Python; here the runs of placeholder tokens of the whole batch are
found at once (NumPy on the host) and the bookkeeping is per block.

GLM-4V's processors (``glm4v``, ``glm4v_moe``, ``glm46v``, ``glm_ocr``) write a video frame as
image tokens between the video start and end tokens (:func:`video_markers`); the Qwen-VL path
of :mod:`~mmpos.integrations.hf_rope_index` reads them so on every rule (transformers 4.57's
``get_rope_index`` of GLM-4V reads the token ids so; from 5.3 on ``mm_token_type_ids`` says 2).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .._arrays import host, ids_in_dtype
from .._validate import check_int
from ..layout import Layout, VisionBlocks, pack
from ..schemes import RULES, Scheme, SchemeOptions, get_scheme, resolve_options
from ._token_blocks import (
    check_grid,
    marked_runs,
    modality_code,
    modality_types,
    new_ids,
    packed_rows,
    real_tokens,
)

__all__ = [
    "FAMILY_ROPE_INDEX",
    "GLM_VIDEO_MARKER_FAMILIES",
    "glm_image_blocks",
    "glm_image_decode_position_ids",
    "glm_image_rope_index",
    "hunyuan_vl_rope_index",
    "hy_v4_vl_rope_index",
    "minicpmv4_7_blocks",
    "minicpmv4_7_rope_index",
    "newline_blocks",
    "packed_rope_index",
    "video_markers",
]

#: the model types whose processors write video frames as image tokens between video start / end tokens
GLM_VIDEO_MARKER_FAMILIES = ("glm4v", "glm4v_moe", "glm46v", "glm_ocr")
_ONE_RULE = ("original", "installed", "hf-5.3")


def video_markers(config: Any) -> tuple[int, int] | None:
    """``(video_start_token_id, video_end_token_id)`` of a GLM-4V-family ``config``; ``None`` for
    other families."""
    if getattr(config, "model_type", None) not in GLM_VIDEO_MARKER_FAMILIES:
        return None
    ids = tuple(getattr(config, n, None) for n in ("video_start_token_id", "video_end_token_id"))
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ValueError(f"config of model_type {config.model_type!r} lacks video_start_token_id / video_end_token_id")
    return ids  # type: ignore[return-value]


def inside_markers(input_ids: np.ndarray, start: int, end: int) -> np.ndarray:
    """``(B, L)`` bool: the tokens after a ``start`` token and before its ``end`` token (GLM-4V's
    ``create_mm_token_type_ids``: more starts than ends so far in the row)."""
    b, length = input_ids.shape
    is_start = input_ids == start
    marks = np.flatnonzero(is_start | (input_ids == end))  # (M,) flat index of every marker, reading order
    if not marks.size:
        return np.zeros((b, length), dtype=bool)
    opened = np.where(is_start.reshape(-1)[marks], 1, -1).cumsum()  # (M,) starts minus ends so far, whole batch
    row = marks // length
    row_first = np.searchsorted(row, np.arange(b))  # (B,) each row's first marker
    before = np.concatenate([[0], opened])[row_first]  # (B,) the count the earlier rows leave
    # the batch as runs: each row's start (count 0 until its first marker), then one run per marker
    edges = np.concatenate([np.arange(b) * length, marks])  # (B + M,)
    counts = np.concatenate([np.zeros(b, dtype=opened.dtype), opened - before[row]])
    order = np.argsort(edges, kind="stable")  # a marker at a row's first token follows the row's start
    edges, counts = edges[order], counts[order]
    runs = np.diff(edges, append=b * length)
    return np.repeat(counts > 0, runs).reshape(b, length)  # a few long runs, memset-like


# --------------------------------------------------------------------------- shared checks
def _check_ids(input_ids: Any) -> None:
    if not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
        raise ValueError(f"input_ids must be a (B, L) tensor, got {getattr(input_ids, 'shape', input_ids)}")
    if input_ids.is_floating_point() or input_ids.is_complex() or input_ids.dtype == torch.bool:
        raise TypeError(f"input_ids must be an integer tensor of token ids, got {input_ids.dtype}")


def _check_like(t: Any, name: str, input_ids: Tensor) -> None:
    if t is not None and (not isinstance(t, Tensor) or tuple(t.shape) != tuple(input_ids.shape)):
        raise ValueError(
            f"{name} must have the shape of input_ids {tuple(input_ids.shape)}, got {tuple(getattr(t, 'shape', ()))}"
        )


def _check_rule(rule: Any, model_type: str) -> None:
    if rule not in _ONE_RULE:
        raise ValueError(
            f"rule must be one of {_ONE_RULE} for model_type {model_type!r} (one rule in transformers >= 5; "
            f"transformers 4.57 has no {model_type}), got {rule!r}"
        )


def _merge(config: Any) -> int:
    m = getattr(getattr(config, "vision_config", None), "spatial_merge_size", None)
    return check_int(m, "config.vision_config.spatial_merge_size")


def _row_grid(grid: np.ndarray, m: int, name: str) -> np.ndarray:
    """``(K, 3)`` token grid ``(t, h / m, w / m + 1)``: every merged row ends with a newline token."""
    out, rest = np.divmod(grid, m)  # (K, 3) each, one pass over the whole (contiguous) grid
    if rest[:, 1:].any():
        raise ValueError(f"{name}: h and w must be divisible by the spatial merge size {m}")
    out[:, 0] = grid[:, 0]
    out[:, 2] += 1
    return out


def _runs(marks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(R,)`` flat index of the first token and length of every run of marked tokens of a
    ``(B, L)`` bool array, in reading order (a run never crosses samples)."""
    length = marks.shape[1]
    flat = marks.reshape(-1)  # (B * L,) one pass over the batch in flat order; then per run
    if not flat.size:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    edges = np.flatnonzero(flat[1:] != flat[:-1]) + 1  # (E,) a run starts or ends at each, in order
    cut = (np.flatnonzero(marks[:-1, -1] & marks[1:, 0]) + 1) * length  # rows a run would run across
    if flat[0] or flat[-1] or cut.size:
        ends = np.array([0] * bool(flat[0]) + [flat.size] * bool(flat[-1]), dtype=np.int64)
        edges = np.sort(np.concatenate([edges, cut, cut, ends]))
    return edges[0::2], edges[1::2] - edges[0::2]


def _real_index(real: np.ndarray, out: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
    """Write into ``out`` ``(B, L)`` (contiguous, a dtype that holds ``-L .. L``) every real token's index among its
    row's real tokens, 0 on padding; return ``(B,)`` int64 real tokens and first real token (``L``: none) per row,
    and whether every row's real tokens are one span. Rows whose real tokens are one span (left or right
    padding): each row is a window of ``max(arange(-L, L), 0)`` (one row copy each: ``index_select`` of the ramp's
    windows), 0 after a span; else a ``cumsum`` of ``real``."""
    length = real.shape[1]
    if not length:
        return np.zeros(real.shape[0], dtype=np.int64), np.zeros(real.shape[0], dtype=np.int64), True
    n_real = real.view(np.uint8).sum(1, dtype=np.uint16 if length < 2**16 else np.int64).astype(np.int64)
    first = np.where(n_real > 0, real.argmax(1), length)  # (B,) first real token (L: none)
    end = first + n_real  # (B,) past the span, if the real tokens are one span
    left = end == length  # ... to the row's end (empty rows too): they are, as real[b, first] is
    if not left.all():  # else one span iff the row has no more True/False edges than its span's
        edges = np.count_nonzero(real[:, 1:] != real[:, :-1])
        if edges != np.count_nonzero((first > 0) & (n_real > 0)) + np.count_nonzero(~left & (n_real > 0)):
            np.cumsum(real, axis=1, out=out)
            out -= 1
            out *= real
            return n_real, first, False
    target = torch.from_numpy(out)
    ramp = torch.from_numpy(np.maximum(np.arange(-length, length, dtype=out.dtype), 0))  # (2L,)
    # row b: the window of the ramp from L - first[b], max(j - first[b], 0)
    torch.index_select(ramp.unfold(0, length, 1), 0, torch.from_numpy(length - first), out=target)
    if not left.all():
        out *= real  # 0 after a span
    return n_real, first, True


@functools.cache
def _own_scheme(name: str, rule: str) -> tuple[Scheme, SchemeOptions]:
    """A family's own registry scheme and its options under ``RULES[rule]``: constants (a registered name is never
    replaced), resolved once."""
    sch = get_scheme(name)
    return sch, resolve_options(sch, rule=RULES[rule])


def _returned(lay: Layout, input_ids: Tensor) -> tuple[Tensor, Tensor]:
    return ids_in_dtype(lay.position_ids, lay.rope_deltas, input_ids.dtype)


# --------------------------------------------------------------------------- HY-V4-VL
def newline_blocks(
    config: Any,
    input_ids: Tensor,
    image_grid_thw: Tensor | None = None,
    video_grid_thw: Tensor | None = None,
    attention_mask: Tensor | None = None,
    mm_token_type_ids: Tensor | None = None,
) -> tuple[np.ndarray, VisionBlocks]:
    """``(real, blocks)`` of a HY-V4-VL or HunYuan-VL batch (``config.model_type`` ``hy_v4_vl`` / ``hunyuan_vl``):
    ``real`` ``(B, L)`` bool and its vision blocks, grids in tokens ``(t, h / m, w / m + 1)`` (a newline token ends
    every merged row), as :func:`hy_v4_vl_rope_index` and :func:`hunyuan_vl_rope_index` read them (HunYuan-VL:
    ``t`` set to 1, a block's 2 boundary tokens left out as text). What another scheme packs under ``use_rope``."""
    model_type = getattr(config, "model_type", None)
    if model_type == "hy_v4_vl":
        return _hy_v4_vl_blocks(config, input_ids, image_grid_thw, video_grid_thw, attention_mask, mm_token_type_ids)
    if model_type == "hunyuan_vl":
        if video_grid_thw is not None:
            raise ValueError("video_grid_thw must be None for model_type 'hunyuan_vl' (it reads images only)")
        return _hunyuan_vl_blocks(config, input_ids, image_grid_thw, attention_mask, mm_token_type_ids)
    raise ValueError(f"config.model_type must be 'hy_v4_vl' or 'hunyuan_vl', got {model_type!r}")


def _hy_v4_vl_blocks(config, input_ids, image_grid_thw, video_grid_thw, attention_mask, mm_token_type_ids):
    _check_ids(input_ids)
    _check_like(attention_mask, "attention_mask", input_ids)
    _check_like(mm_token_type_ids, "mm_token_type_ids", input_ids)
    m = _merge(config)
    real = real_tokens(attention_mask, input_ids.shape)
    if mm_token_type_ids is None:
        code = modality_code(host(input_ids), config.image_token_id, config.video_token_id, real)
    else:
        code = modality_code(modality_types(mm_token_type_ids), 1, 2, real)
    start, end, value = marked_runs(code)  # (M,) every run of image or video tokens, reading order
    is_image = value == 1
    grid = np.empty((start.shape[0], 3), dtype=np.int64)  # (M, 3) each run's grid
    for kind, grid_thw, name in ((1, image_grid_thw, "image_grid_thw"), (2, video_grid_thw, "video_grid_thw")):
        tokens_grid = _row_grid(check_grid(grid_thw, name), m, name)
        runs = is_image.nonzero()[0] if kind == 1 else (~is_image).nonzero()[0]  # (K,) this kind's runs
        if runs.shape[0] != tokens_grid.shape[0]:
            raise ValueError(
                f"{name} holds {tokens_grid.shape[0]} grids, but input_ids holds {runs.shape[0]} runs of "
                f"{'image' if kind == 1 else 'video'} tokens"
            )
        length = end.take(runs) - start.take(runs)
        bad = (length != tokens_grid.prod(-1)).nonzero()[0]
        if bad.size:
            k = int(bad[0])
            raise ValueError(
                f"{name}: grid {k} {tokens_grid[k].tolist()} (tokens, a newline per row) holds "
                f"{int(tokens_grid[k].prod())} tokens, but its run of placeholder tokens holds {int(length[k])}"
            )
        grid[runs] = tokens_grid
    return real, VisionBlocks(grid, start, np.zeros(grid.shape[0], np.float32), is_image)


def hy_v4_vl_rope_index(
    config: Any,
    input_ids: Tensor,
    image_grid_thw: Tensor | None = None,
    video_grid_thw: Tensor | None = None,
    attention_mask: Tensor | None = None,
    mm_token_type_ids: Tensor | None = None,
    rule: str = "original",
) -> tuple[Tensor, Tensor]:
    """HY-V4-VL position ids ``(3, B, L)`` and ``rope_deltas`` ``(B, 1)`` (dtype of ``input_ids``).

    Every run of image (video) tokens -- ``mm_token_type_ids`` 1 (2), else ``config.image_token_id``
    (``video_token_id``) -- is the next grid of ``image_grid_thw`` (``video_grid_thw``), with
    ``t * (h / m) * (w / m + 1)`` tokens; 0 on padding; ``rope_deltas`` = largest position + 1 -
    real length (as transformers' ``HYV4VLModel.get_rope_index``)."""
    _check_rule(rule, "hy_v4_vl")
    scheme, options = _own_scheme("hy-v4-vl", "hf-5.3")
    out = new_ids(input_ids, scheme)  # (3, B, L) before any temporary (new_ids)
    args = (image_grid_thw, video_grid_thw, attention_mask, mm_token_type_ids)
    real, blocks = _hy_v4_vl_blocks(config, input_ids, *args)
    lay = pack(real, blocks, scheme, options, device=input_ids.device, out=out)
    return _returned(lay, input_ids)


# --------------------------------------------------------------------------- HunYuan-VL
def _hunyuan_vl_blocks(config, input_ids, image_grid_thw, attention_mask, mm_token_type_ids):
    real, grid, first, _ = _hunyuan_vl_images(config, input_ids, image_grid_thw, attention_mask, mm_token_type_ids)
    return real, VisionBlocks(grid, first, np.zeros(grid.shape[0], np.float32), np.ones(grid.shape[0], dtype=bool))


def _hunyuan_vl_images(config, input_ids, image_grid_thw, attention_mask, mm_token_type_ids):
    """``(real, grid, first, grid_tokens)``: :func:`newline_blocks` of a HunYuan-VL batch (``grid`` ``(K, 3)`` in
    tokens, ``first`` ``(K,)``) and ``(B, L)`` bool, ``True`` on the blocks' tokens (the image tokens but the
    boundary tokens; ``None`` without ``image_grid_thw``)."""
    _check_ids(input_ids)
    _check_like(attention_mask, "attention_mask", input_ids)
    _check_like(mm_token_type_ids, "mm_token_type_ids", input_ids)
    m = _merge(config)
    real = real_tokens(attention_mask, input_ids.shape)
    if image_grid_thw is None:  # the reference then reads no image: every real token is 1-D
        grid, first, marks = np.zeros((0, 3), dtype=np.int64), np.zeros(0, dtype=np.int64), None
    else:
        marks = (
            (host(input_ids) == config.image_token_id) if mm_token_type_ids is None else host(mm_token_type_ids) == 1
        )
        grid = _row_grid(check_grid(image_grid_thw, "image_grid_thw"), m, "image_grid_thw")
        grid[:, 0] = 1  # the reference reads h and w only
        start, length = _runs(np.logical_and(marks, real, out=marks))  # the image tokens among the real ones
        if start.shape[0] != grid.shape[0]:
            raise ValueError(
                f"image_grid_thw holds {grid.shape[0]} grids, but input_ids holds {start.shape[0]} runs of image tokens"
            )
        tokens = grid[:, 1] * grid[:, 2]  # (t = 1)
        bad = np.flatnonzero((length != tokens) & (length != tokens + 2))
        if bad.size:
            k = int(bad[0])
            raise ValueError(
                f"image_grid_thw: image {k} holds {int(tokens[k])} tokens (a newline per row), or {int(tokens[k]) + 2} "
                f"with its boundary tokens, but its run of image tokens holds {int(length[k])}"
            )
        bounded = length == tokens + 2
        first = start + bounded
        if bounded.any():  # the boundary tokens are text
            flat = marks.reshape(-1)
            flat[start[bounded]] = False
            flat[first[bounded] + tokens[bounded]] = False
    return real, grid, first, marks


def hunyuan_vl_rope_index(
    config: Any,
    input_ids: Tensor,
    image_grid_thw: Tensor | None = None,
    video_grid_thw: Tensor | None = None,
    attention_mask: Tensor | None = None,
    mm_token_type_ids: Tensor | None = None,
    rule: str = "original",
) -> tuple[Tensor, Tensor]:
    """HunYuan-VL position ids ``(N, B, L)`` and ``rope_deltas`` ``(B, 1)`` (dtype of ``input_ids``).

    ``N = len(config.text_config.rope_parameters["mrope_section"])`` (>= 3). Every run of image
    tokens (``mm_token_type_ids`` 1, else ``config.image_token_id``) is the next grid of
    ``image_grid_thw``: ``(h / m) * (w / m + 1)`` tokens, or 2 more whose first and last keep their
    1-D position. Axes ``0 .. N - 4``: every real token's index among the real tokens; the last
    three: ``(j, i, k)`` on the token in row ``i``, column ``j`` of the ``k``-th image of the batch,
    the 1-D position elsewhere. 0 on padding; ``rope_deltas`` = largest position + 1 - real length
    (as transformers' ``HunYuanVLModel.get_rope_index``). HunYuan-VL has no videos."""
    _check_rule(rule, "hunyuan_vl")
    if video_grid_thw is not None:
        raise ValueError("video_grid_thw must be None for model_type 'hunyuan_vl' (it reads images only)")
    _check_ids(input_ids)
    text_config = getattr(config, "text_config", config)
    section = (getattr(text_config, "rope_parameters", None) or {}).get("mrope_section") or []
    axes = len(section)
    if axes < 3:
        raise ValueError(
            f"config.text_config.rope_parameters['mrope_section'] must hold >= 3 sections (HunYuan-VL's "
            f"M-RoPE axes), got {section!r}"
        )
    b, length = input_ids.shape
    dtype = input_ids.dtype
    grids_ok = isinstance(image_grid_thw, Tensor) and image_grid_thw.dim() == 2  # (checked below)
    k = image_grid_thw.shape[0] if grids_ok else 0
    # every id lies in [0, max(L, K) - 1] (an index among a row's tokens, a row or column of an image, the image's
    # index among the batch's K) and rope_deltas in [1 - L, max(L, K)]: a dtype that holds [-L, max(L, K)] (and the
    # ramp of _real_index) is written straight into; else int64, then the checked cast (refuses what would wrap)
    info = torch.iinfo(dtype)
    fits = max(length, k) <= info.max and -length >= info.min
    # (N, B, L), allocated before any per-token temporary (as _token_blocks.new_ids says why)
    out = torch.empty((axes, b, length), dtype=dtype if fits else torch.int64)
    real, grid, first, grid_tokens = _hunyuan_vl_images(
        config, input_ids, image_grid_thw, attention_mask, mm_token_type_ids
    )
    deltas = torch.from_numpy(_hunyuan_vl_ids(real, grid, first, grid_tokens, out.numpy())).view(b, 1)
    if fits:
        ids, deltas = out, deltas.to(dtype)
    else:
        ids, deltas = ids_in_dtype(out, deltas, dtype)
    return ids.to(input_ids.device), deltas.to(input_ids.device)


def _hunyuan_vl_row_starts(grid: np.ndarray, first: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(R - K,)`` flat index of the first token of every image row after each image's first, and its columns."""
    h, w = grid[:, 1], grid[:, 2]
    row_w = np.repeat(w, h - 1)  # (R - K,) the columns of each row after an image's first, reading order
    before = (h - 1) * w  # (K,) ... their sum per image, then before each image
    before = np.cumsum(before) - before
    return np.cumsum(row_w) + np.repeat(first - before, h - 1), row_w


def _hunyuan_vl_corrections(grid, first, grid_tokens, c, start, one_d) -> None:
    """The vision axes ``c`` ``(3, B, L)`` as ``d - c`` (any padding; :func:`_hunyuan_vl_ids`)."""
    k = grid.shape[0]
    b, length = one_d.shape
    h, w = grid[:, 1], grid[:, 2]
    tokens = h * w
    image = np.arange(k)
    c[0] = 0
    np.copyto(c[1:], grid_tokens)  # steps of (h, image) inside an image: 1
    flat = c.reshape(3, -1)  # (3, B * L) views
    # row starts but each image's first: c of w steps by w + 1 there (j back to 0), of h by 0 (i steps too)
    at, row_w = _hunyuan_vl_row_starts(grid, first)
    flat[0, at] = row_w
    flat[1, at] = 0
    # the token after an image (if any): c back to 0 from the last token's s + t - (w - 1, h - 1, k), t = h w - 1;
    # an image's first token: c = (s, s, s - k), plus the step back of an image ending right before it (the
    # previous row's last tokens)
    end = first + tokens  # (K,) flat index past each image, increasing (B * L: none)
    back = np.stack([w, h, image + 1]) - (start + tokens)  # (3, K)
    at_first = np.stack([start, start, start - image])  # (3, K)
    joined = np.flatnonzero(end[:-1] == first[1:])  # image k ends right before image k + 1
    at_first[:, joined + 1] += back[:, joined]
    ends = k - int(end[-1] == b * length)  # the images followed by a token
    for axis in range(3):  # 1-D writes (a 2-D one is slower)
        flat[axis, end[:ends]] = back[axis, :ends]
        flat[axis, first] = at_first[axis]
    torch.from_numpy(flat).cumsum_(1)  # (3, B * L) c
    np.subtract(one_d, c, out=c)  # (3, B, L) d - c


def _hunyuan_vl_spans(real, grid, first, grid_tokens, v, start, n_real, first_real) -> None:
    """The vision axes ``v`` ``(3, B, L)`` where every row's real tokens are one span: one ``cumsum`` along each
    row of the ids' own steps. Base step 1 on the real tokens (``w``) or on the real text tokens (``h``, image);
    set: 0 at a row's first real token, back to 0 after its span, ``(0, 0, k) - (s - 1 or 0)`` at image ``k``'s
    first token, ``(1 - (w + 1), 1, 0)`` at each of its rows' starts after the first, and ``d - (w, h - 1, k)``
    at the token after it in its row (``d``: that token's 1-D index, 0 on padding)."""
    b, length = real.shape
    h, w = grid[:, 1], grid[:, 2]
    tokens = h * w
    image = np.arange(first.shape[0])
    np.copyto(v[0], real)
    np.copyto(v[1:], real & ~grid_tokens)
    flat = v.reshape(3, -1)  # (3, B * L) views
    rows = np.flatnonzero(n_real)  # the rows with a real token
    row_start = rows * length
    flat[:, row_start + first_real[rows]] = 0  # the 1-D index starts at 0
    span_end = first_real[rows] + n_real[rows]  # (B',) past each span, in its row
    padded = span_end < length
    flat[:, (row_start + span_end)[padded]] = -(n_real[rows] - 1)[padded]  # the padding after a span: 0
    at, row_w = _hunyuan_vl_row_starts(grid, first)
    flat[0, at] = 1 - row_w
    flat[1, at] = 1
    before = np.maximum(start - 1, 0)  # (K,) the id of the token before each image (0: none in the row)
    end = first + tokens  # (K,) past each image
    inside = end // length == first // length  # ... in its row
    last_real = (first // length) * length + first_real[first // length] + n_real[first // length]  # (K,) span ends
    after = np.where(end < last_real, start + tokens, 0)[inside]  # (K',) 1-D index of the token after (0: padding)
    for axis, (at_first, last) in enumerate(((0, w - 1), (0, h - 1), (image, image))):
        flat[axis, end[inside]] = after - last[inside]
        flat[axis, first] = at_first - before
    torch.from_numpy(v.reshape(3 * b, length)).cumsum_(1)  # (3 B, L) along each row


def _hunyuan_vl_ids(
    real: np.ndarray, grid: np.ndarray, first: np.ndarray, grid_tokens: np.ndarray | None, out: np.ndarray
) -> np.ndarray:
    """Write HunYuan-VL's ids into ``out`` ``(N, B, L)`` (contiguous, a dtype that holds ``-L .. max(L, K)``) and
    return ``rope_deltas`` ``(B,)`` int64: the ``hunyuan-vl`` scheme's positions (:func:`mmpos.layout.pack` of these
    blocks gives the same last three rows), written directly.

    Every axis holds the 1-D index ``d`` of every real token (its index among the row's real tokens, 0 on padding):
    a text token advances every axis by 1 and an image by its token count, and no image reads its start. The last
    three axes hold ``(j, i, k)`` on image ``k``'s tokens instead (column and row in its token grid ``grid[k]``
    ``(1, h, w + 1)``; ``k``: its index among the batch's ``K``), i.e. ``d - c`` where ``c`` is 0 off the images and,
    on image ``k`` with 1-D start ``s`` and token ``t = i (w + 1) + j`` of it, ``s + t - (j, i, k)``: ``c`` steps by
    ``(0, 1, 1)`` from token to token of an image (``grid_tokens``), by ``(w + 1, 0, 1)`` at the start of each of
    its rows after the first, and is set at each image's first token and at the token after its last: ``R - K + 2 K``
    steps written, then one ``cumsum`` along the flat batch gives ``c`` on the three axes at once (no per-token
    index; :func:`_hunyuan_vl_corrections`). Where every row's real tokens are one span and there is a 1-D axis
    (``N > 3``), the cumsum along each row of the ids' own steps gives them without the subtraction
    (:func:`_hunyuan_vl_spans`). ``rope_deltas``: the row's largest id + 1 - its real tokens."""
    axes, b, length = out.shape
    k = grid.shape[0]
    one_d = out[0] if axes > 3 or not k else np.empty((b, length), dtype=out.dtype)  # (B, L)
    n_real, first_real, one_span = _real_index(real, one_d)  # (B,), (B,), every row's real tokens one span
    top = n_real - 1  # (B,) the largest 1-D index (-1: no real token)
    if not k:
        out[1:] = one_d  # (N - 1, B, L) the 1-D index on every axis
        return top + 1 - n_real
    if axes > 4:
        out[1 : axes - 3] = one_d  # the leading N - 3 axes: the 1-D index
    h, w = grid[:, 1], grid[:, 2]  # (K,) rows and columns of each image (a newline ends every row)
    start = one_d.reshape(-1)[first]  # (K,) each image's 1-D start s
    image = np.arange(k)
    if one_span and axes > 3:
        _hunyuan_vl_spans(real, grid, first, grid_tokens, out[axes - 3 :], start, n_real, first_real)
    else:
        _hunyuan_vl_corrections(grid, first, grid_tokens, out[axes - 3 :], start, one_d)
    if axes == 3:  # no 1-D axis: a row's largest text id is its last real text token's, not always n_real - 1
        last = length - 1 - real[:, ::-1].argmax(1)  # (B,) each row's last real token (if any)
        ends_in_image = np.flatnonzero(grid_tokens[np.arange(b), last] & (n_real > 0))  # (B',) rows
        if ends_in_image.size:
            text = real[ends_in_image] & ~grid_tokens[ends_in_image]  # (B', L)
            top[ends_in_image] = np.where(text, one_d[ends_in_image], -1).max(1)
    # each image's largest id: its last column, last row or its index
    np.maximum.at(top, first // length, np.maximum(np.maximum(w - 1, h - 1), image))
    return top + 1 - n_real


# --------------------------------------------------------------------------- GLM-Image
def _glm_image_grids(image_grid_thw: Tensor | None, images_per_sample: Tensor | None, batch: int):
    """Per sample: its grids ``(n_b, 3)`` as one array and the offset of each sample's first grid
    (transformers' fallback without ``images_per_sample``: every sample reads all grids)."""
    grids = check_grid(image_grid_thw, "image_grid_thw")
    if image_grid_thw is None:
        return grids, np.zeros(batch, dtype=np.int64), np.zeros(batch, dtype=np.int64)
    if images_per_sample is None:
        return grids, np.zeros(batch, dtype=np.int64), np.full(batch, grids.shape[0], dtype=np.int64)
    per = torch.as_tensor(images_per_sample)
    if per.is_floating_point() or per.dtype == torch.bool or per.dim() != 1 or per.shape[0] != batch:
        raise ValueError(
            f"images_per_sample must be an integer tensor (B,) = ({batch},), got {per.dtype} {tuple(per.shape)}"
        )
    per = host(per).astype(np.int64)
    if (per < 0).any() or per.sum() != grids.shape[0]:
        raise ValueError(f"images_per_sample must be >= 0 and sum to the {grids.shape[0]} grids, got {per.tolist()}")
    return grids, np.cumsum(per) - per, per


def _rank(flat: np.ndarray, per_sample: np.ndarray) -> np.ndarray:
    """Index of each of the sorted flat positions ``flat`` among those of its sample."""
    return np.arange(flat.shape[0]) - np.repeat(np.cumsum(per_sample) - per_sample, per_sample)


def glm_image_blocks(
    config: Any,
    input_ids: Tensor,
    image_grid_thw: Tensor | None = None,
    images_per_sample: Tensor | None = None,
    attention_mask: Tensor | None = None,
) -> tuple[np.ndarray, VisionBlocks, np.ndarray, np.ndarray]:
    """What a GLM-Image batch holds, for the packer: ``(real, prompt, generated, sample)``.

    ``real`` ``(B, L)`` bool; ``prompt`` the :class:`~mmpos.layout.VisionBlocks` of its complete source images
    (the tokens between a sample's ``k``-th image start and end tokens: its ``k``-th grid, read as
    :func:`glm_image_rope_index` reads them); ``generated`` ``(G, 3)`` the grids of the images it generates (a
    sample's grids past its complete images, the last grid first, ``t`` set to 1: ``h * w`` tokens each) and
    ``sample`` ``(G,)`` the sample of each, in that order (:func:`glm_image_decode_position_ids`)."""
    _check_ids(input_ids)
    b, length = input_ids.shape
    if attention_mask is not None and (not isinstance(attention_mask, Tensor) or attention_mask.dim() != 2):
        raise ValueError(
            f"attention_mask must be a (B, L) tensor, got {getattr(attention_mask, 'shape', attention_mask)}"
        )
    # the reference ignores a mask of another length (assisted decoding)
    use_mask = attention_mask is not None and tuple(attention_mask.shape) == (b, length)
    real = real_tokens(attention_mask if use_mask else None, (b, length))
    grids, offset, count = _glm_image_grids(image_grid_thw, images_per_sample, b)
    ids = host(input_ids)
    flat_real = real.reshape(-1)
    starts = np.flatnonzero(ids == config.image_start_token_id)  # image start tokens, reading order ...
    starts = starts[flat_real[starts]]  # ... the real ones (a few: read at them, no (B, L) mask)
    ends = np.flatnonzero(ids == config.image_end_token_id)
    ends = ends[flat_real[ends]]
    n_start, n_end = np.bincount(starts // length, minlength=b), np.bincount(ends // length, minlength=b)
    complete = np.minimum(n_start, n_end)  # zip(starts, ends): the k-th start with the k-th end
    used = np.minimum(complete, count)  # images past the sample's grids stay text (the reference breaks)
    s_keep = _rank(starts, n_start) < used[starts // length]
    e_keep = _rank(ends, n_end) < used[ends // length]
    first, last = starts[s_keep] + 1, ends[e_keep]  # each image's first token and its end token
    sample = first // length
    grid = grids[offset[sample] + _rank(starts, n_start)[s_keep]] if first.size else np.zeros((0, 3), dtype=np.int64)
    bad = np.flatnonzero(last - first != grid.prod(-1))
    if bad.size:
        k = int(bad[0])
        raise ValueError(
            f"image_grid_thw: grid {grid[k].tolist()} holds {int(grid[k].prod())} tokens, but {int(last[k] - first[k])} "
            f"tokens lie between its image start and end tokens (sample {int(sample[k])})"
        )
    blocks = VisionBlocks(grid, first, np.zeros(grid.shape[0], np.float32), np.ones(grid.shape[0], dtype=bool))
    n_dec = np.maximum(count - complete, 0)  # (B,) generated grids per sample
    # the generated grids, sample by sample, the last grid first
    gen_sample = np.repeat(np.arange(b), n_dec)
    order = np.arange(gen_sample.shape[0]) - np.repeat(np.cumsum(n_dec) - n_dec, n_dec)  # 0 .. n_dec - 1
    generated = grids[offset[gen_sample] + count[gen_sample] - 1 - order].copy()  # (G, 3)
    generated[:, 0] = 1  # t is not read: h * w tokens
    return real, blocks, generated, gen_sample


def _glm_image_prompt(config, input_ids, image_grid_thw, images_per_sample, attention_mask):
    scheme, options = _own_scheme("glm-image", "original")
    out = new_ids(input_ids, scheme)  # (3, B, L) before any temporary (new_ids)
    real, blocks, generated, sample = glm_image_blocks(
        config, input_ids, image_grid_thw, images_per_sample, attention_mask
    )
    lay = pack(real, blocks, scheme, options, device=input_ids.device, out=out)
    return lay, generated, sample


def glm_image_rope_index(
    config: Any,
    input_ids: Tensor,
    image_grid_thw: Tensor | None = None,
    images_per_sample: Tensor | None = None,
    attention_mask: Tensor | None = None,
    rule: str = "original",
) -> tuple[Tensor, Tensor]:
    """GLM-Image prompt position ids ``(3, B, L)`` and ``rope_deltas`` ``(B, 1)`` (zero: GLM-Image
    generates from :func:`glm_image_decode_position_ids`), dtype of ``input_ids``.

    Sample ``b`` reads ``images_per_sample[b]`` grids (``(t, h, w)`` in tokens) of ``image_grid_thw``
    in order (without it, every sample reads all of them, transformers' fallback for one sample);
    its ``k``-th complete image (tokens between its ``k``-th image start and image end tokens, which
    must be ``t * h * w``) sits at ``(start + f, start + i, start + j)`` and the text after it at
    ``start + max(h, w)``. 1 on padding (as transformers' ``GlmImageModel.get_rope_index``)."""
    _check_rule(rule, "glm_image")
    lay = _glm_image_prompt(config, input_ids, image_grid_thw, images_per_sample, attention_mask)[0]
    deltas = torch.zeros(input_ids.shape[0], 1, dtype=torch.int64, device=input_ids.device)
    # a token's position is at most its index in the row (an image's extent, max(h, w), is at most its t * h * w
    # tokens), padding 1: a dtype holding L is cast to; else the checked cast (refuses what would wrap around)
    if input_ids.shape[1] <= torch.iinfo(input_ids.dtype).max:
        return lay.position_ids.to(input_ids.dtype), deltas.to(input_ids.dtype)
    return ids_in_dtype(lay.position_ids, deltas, input_ids.dtype)


def glm_image_decode_position_ids(
    config: Any,
    input_ids: Tensor,
    image_grid_thw: Tensor,
    images_per_sample: Tensor | None = None,
    attention_mask: Tensor | None = None,
) -> Tensor:
    """Positions of the tokens GLM-Image generates after the prompt, ``(B, 3, D)`` int64
    (transformers' ``GlmImageModel._cached_decode_position_ids``).

    A sample's grids past its complete images are the images it generates, the last grid first:
    each grid ``(t, h, w)`` is ``h * w`` tokens at ``(p, p + i, p + j)``, then ``p`` moves by
    ``max(h, w)``; one end token at the final ``p``. ``p`` starts where the prompt's positions end.
    Shorter samples repeat their last position up to the longest ``D``."""
    lay, dec, sample = _glm_image_prompt(config, input_ids, image_grid_thw, images_per_sample, attention_mask)
    b = input_ids.shape[0]
    count = _glm_image_grids(image_grid_thw, images_per_sample, b)[2]  # (B,) the grids each sample reads
    if not (count > 0).all():
        raise ValueError(
            "every sample must read at least one grid of image_grid_thw for decode positions (transformers stacks "
            f"the samples that do), got images_per_sample {count.tolist()}"
        )
    n_dec = np.bincount(sample, minlength=b)  # (B,) generated grids per sample
    per = np.bincount(sample, weights=dec.prod(-1), minlength=b).astype(np.int64) + 1  # tokens + the end token
    width = int(per.max())
    real = np.arange(width)[None, :] < per[:, None]  # right padding to the longest
    first = np.repeat(np.arange(b) * width, n_dec) + (
        np.cumsum(dec.prod(-1)) - dec.prod(-1) - np.repeat(np.cumsum(per - 1) - (per - 1), n_dec)
    )
    blocks = VisionBlocks(dec, first, np.zeros(dec.shape[0], np.float32), np.ones(dec.shape[0], dtype=bool))
    gen = pack(real, blocks, *_own_scheme("glm-image", "original"))
    start = (lay.rope_deltas.cpu() + input_ids.shape[1]).view(1, b, 1)  # the prompt's next position, per sample
    pos = gen.position_ids + start  # (3, B, D)
    last = torch.from_numpy(per - 1).view(1, b, 1).expand(3, -1, -1)
    pos = torch.where(torch.from_numpy(real)[None], pos, pos.gather(2, last))  # repeat the end token
    return pos.permute(1, 0, 2).contiguous().to(input_ids.device)


# --------------------------------------------------------------------------- MiniCPM-V 4.7
_MINICPM_MARKERS = ("slice_start_id", "slice_end_id", "image_start_id", "image_end_id", "newline_id")


@functools.lru_cache(maxsize=4096)
def _canvas_axis(canvas: int, tokens: int) -> np.ndarray:
    """``tokens`` coordinates spread over ``canvas`` positions, rounded as the reference rounds
    (float32 ``linspace``, half to even; ``arange`` when ``canvas == tokens``)."""
    out = torch.linspace(0, canvas - 1, tokens).round().long().numpy()
    out.flags.writeable = False  # cached: shared by every crop of this size
    return out


def _spans(starts: np.ndarray, stops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(T,)`` every index of the ranges ``[starts[k], stops[k])`` in order, and ``(T,)`` the
    range each belongs to (``stops >= starts``)."""
    lens = stops - starts
    owner = np.repeat(np.arange(lens.shape[0]), lens)
    first = np.cumsum(lens) - lens  # where each range begins in the output
    return np.arange(owner.shape[0]) + (starts - first)[owner], owner


@functools.lru_cache(maxsize=4096)
def _crop_grid(canvas_h: int, canvas_w: int, h: int, w: int) -> np.ndarray:
    """``(2, h * w)`` row and column coordinates of a crop of ``h x w`` tokens stretched over a
    ``canvas_h x canvas_w`` canvas (:func:`_canvas_axis`), raster order; cached, read-only."""
    out = np.stack([np.repeat(_canvas_axis(canvas_h, h), w), np.tile(_canvas_axis(canvas_w, w), h)])
    out.flags.writeable = False
    return out


def _minicpm_error(k: int, fmod, ft, flast, cs, ce, hw, bad_table, merge: int) -> ValueError:
    """The error of frame ``k``, the first bad frame, in the order the reference meets them."""
    thumb, slices = ft[k], range(ft[k] + 1, flast[k] + 1)
    if bad_table[thumb]:
        return ValueError(f"{'target_sizes' if fmod[k] == 1 else 'target_sizes_videos'} holds too few crops")
    if any(bad_table[c] for c in slices):
        return ValueError("target sizes hold too few crops for the slices")
    for c, what in [(thumb, "a thumbnail")] + [(c, "a slice") for c in slices]:
        h, w = hw[c].tolist()
        if ce[c] - cs[c] != h * w:
            return ValueError(f"{what} of {h} x {w} tokens (target size / {merge}) has {ce[c] - cs[c]} tokens")
    raise AssertionError("frame without an error")  # pragma: no cover


def _minicpm_crops(ids, types, counts, tables, merge: int, markers: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    """The crops and frames of the unpadded samples laid end to end (arguments as :func:`_minicpm_positions`):
    ``(s_start, s_end)`` ``(B,)`` each sample's tokens; per crop ``(C,)`` ``cs, ce`` its tokens, ``csample``, ``first``
    (its sample's first crop), ``is_slice``, ``fid`` (its frame) and ``hw`` ``(C, 2)`` its table row; per frame
    ``(F,)`` ``ft`` / ``flast`` its thumbnail / last crop, ``fmod`` its modality, ``fsample``. Every crop's size is
    checked against its table row (the reference's errors, in the order it meets them)."""
    n = ids.shape[0]
    s_start = np.cumsum(counts) - counts  # (B,) first token of each sample
    s_end = s_start + counts
    # ---- crops: maximal runs of one non-zero type, cut at the samples' edges
    edge = np.ones(n, dtype=bool)
    edge[1:] = types[1:] != types[:-1]
    edge[s_start[counts > 0]] = True
    run_start = np.flatnonzero(edge)
    run_end = np.append(run_start[1:], n)
    keep = types[run_start] != 0
    cs, ce = run_start[keep], run_end[keep]  # (C,)
    csample = np.searchsorted(s_end, cs, side="right")  # (C,) the sample of each crop
    first = np.ones(cs.shape[0], dtype=bool)  # the first crop of its sample: always a thumbnail
    first[1:] = csample[1:] != csample[:-1]
    is_slice = ~first & (ids[np.maximum(cs - 1, 0)] == markers[0])
    ft = np.flatnonzero(~is_slice)  # (F,) each frame's thumbnail crop
    fid = np.cumsum(~is_slice) - 1  # (C,) frame of each crop
    flast = np.append(ft[1:], cs.shape[0]) - 1  # (F,) its last crop
    fmod, fsample = types[cs[ft]], csample[ft]
    # ---- each crop's (h, w) in tokens from its frame's modality table, in order (no frame: no crop)
    tmod = fmod[fid]
    hw = np.zeros((cs.shape[0], 2), dtype=np.int64)
    bad_table = np.zeros(cs.shape[0], dtype=bool)
    for m, table in tables.items():
        sel = np.flatnonzero(tmod == m)
        k = min(sel.shape[0], table.shape[0])
        hw[sel[:k]] = table[:k]
        bad_table[sel[k:]] = True
    bad = bad_table | (ce - cs != hw[:, 0] * hw[:, 1])
    if bad.any():
        k = int(fid[np.argmax(bad)])
        raise _minicpm_error(k, fmod, ft, flast, cs, ce, hw, bad_table, merge)
    return s_start, s_end, cs, ce, csample, first, is_slice, fid, hw, ft, flast, fmod, fsample


def _minicpm_positions(ids, types, counts, tables, merge: int, markers: tuple[int, ...]) -> np.ndarray:
    """``(3, N)`` int64 positions of the unpadded samples laid end to end (``ids`` / ``types`` ``(N,)``,
    ``counts`` ``(B,)`` tokens per sample); ``tables`` per modality the ``(h, w)`` in tokens of every
    crop, consumed in order across the batch. Vectorised over crops and frames: every write of the
    reference's walk lands on tokens no later write of it touches, once each frame's span is cut where
    the next frame of its group starts (its base coat covers the rest)."""
    crops = _minicpm_crops(ids, types, counts, tables, merge, markers)
    s_start, s_end, cs, ce, _, first, is_slice, fid, hw, ft, flast, _, fsample = crops
    n, nf = ids.shape[0], ft.shape[0]
    pos = np.empty((3, n), dtype=np.int64)
    if nf == 0:  # text only: one step per token
        pos[:] = np.arange(n) - np.repeat(s_start, counts)
        return pos
    # ---- frames: groups, ends, canvas
    ts, te = cs[ft], ce[ft]
    fs = ts - 1  # the <image> slot
    prev_end = ce[np.maximum(ft - 1, 0)]
    # (M,) markers (the tokens in their ids' range, then those of them that are markers); past each run of
    # markers: the next non-marker
    marks = np.flatnonzero((ids >= min(markers)) & (ids <= max(markers)))
    marks = marks[np.isin(ids[marks], markers)]
    run_last = np.flatnonzero(np.append(marks[1:] != marks[:-1] + 1, True))  # last marker of each run
    past_run = marks[run_last[np.searchsorted(run_last, np.arange(marks.shape[0]))]] + 1  # (M,)

    def next_text(at: np.ndarray) -> np.ndarray:  # the first non-marker index >= at (n past the end)
        if not marks.size:
            return at
        at_c = np.minimum(at, n - 1)
        k = np.minimum(np.searchsorted(marks, at_c), marks.shape[0] - 1)
        hit = (at < n) & (marks[k] == at_c)  # at_c is a marker
        return np.where(hit, past_run[k], at)

    only_markers = next_text(prev_end) >= fs  # nothing but markers in [prev_end, fs)
    new_group = first[ft] | ~only_markers
    gfirst = np.flatnonzero(new_group)  # (G,)
    gid = np.cumsum(new_group) - 1
    glast = np.append(gfirst[1:], nf) - 1
    after = ce[flast]  # past each frame's last crop; its end: past the markers that follow (in its sample)
    nxt = next_text(after)
    fe_raw = np.minimum(nxt, s_end[fsample])
    ge = fe_raw[glast]  # (G,)
    fe = np.minimum(fe_raw, ge[gid])
    same_next = np.zeros(nf, dtype=bool)
    same_next[:-1] = ~new_group[1:]
    hi = np.where(same_next, np.append(fs[1:], 0), ge[gid])  # the frame's span ends where the next one starts
    lo = np.maximum(fs, s_start[fsample])
    th, tw = hw[ft, 0], hw[ft, 1]
    nsl = flast - ft
    j = np.arange(cs.shape[0]) - ft[fid] - 1  # (C,) slice index in its frame (-1: the thumbnail)
    next_slice = np.zeros(cs.shape[0], dtype=bool)
    next_slice[:-1] = is_slice[1:]
    gap = np.append(cs[1:], 0) - ce
    wide = is_slice & next_slice & (gap > 2)  # a newline before the next slice ends a row
    big = np.iinfo(np.int64).max
    cols = np.minimum(np.minimum.reduceat(np.where(wide, j + 1, big), ft), nsl) if nf else nsl
    rows = np.where(cols > 0, nsl // np.maximum(cols, 1), 0)
    ragged = rows * cols != nsl
    rows, cols = np.where(ragged, 1, rows), np.where(ragged, nsl, cols)
    first_slice = np.minimum(ft + 1, cs.shape[0] - 1)
    sh, sw = np.where(nsl > 0, hw[first_slice, 0], 0), np.where(nsl > 0, hw[first_slice, 1], 0)
    ch, cw = np.where(nsl > 0, rows * sh, th), np.where(nsl > 0, cols * sw, tw)
    adv = np.maximum(ch, cw) + 1
    # ---- the base coat, one cumsum of steps: +1 a text token, 0 inside a frame, the canvas at a frame's
    # start (the previous frame's) and at the text after a group (the last frame's); 0 at a sample's start
    glo = lo[gfirst]
    bounds = np.concatenate([[0], np.stack([glo, ge], 1).reshape(-1), [n]])  # text, group, text, ..., text
    step = pos[0]  # the coat is summed in axis 0 (written over by a thumbnail at its sample's first token)
    step[...] = np.repeat(np.resize(np.array([1, 0], dtype=np.int8), bounds.shape[0] - 1), np.diff(bounds))
    step[glo] = 1  # a group's first frame: at the step after the text before it
    lead = s_start[counts > 0]
    step[lead] = 0
    later = np.flatnonzero(~new_group)
    step[lo[later]] += adv[later - 1]  # (+=: a later frame may start at its sample's first token, as its group)
    tail = ge < s_end[fsample[glast]]
    step[ge[tail]] = adv[glast[tail]]
    step[lead[1:]] -= np.add.reduceat(step, lead)[:-1]  # back to 0: minus the sample before's total
    torch.cumsum(torch.from_numpy(step), 0, out=torch.from_numpy(step))  # (in place; NumPy's is several times slower)
    base = step
    within = np.cumsum(adv) - adv
    within -= within[gfirst][gid]  # the canvases of its group's frames before it
    at_start = glo == s_start[fsample[gfirst]]
    origin = np.where(at_start, 0, base[np.maximum(glo - 1, 0)] + 1)[gid] + within
    sl = np.flatnonzero(is_slice)
    f_sl = fid[sl]
    h_off = (j[sl] // cols[f_sl]) * sh[f_sl]  # each slice's place on its canvas
    w_off = (j[sl] % cols[f_sl]) * sw[f_sl]
    # ---- crops: the thumbnail stretched over its canvas, a slice at its row and column (cached grids)
    canvas_h, canvas_w = ch[fid], cw[fid]
    canvas_h[sl], canvas_w[sl] = hw[sl, 0], hw[sl, 1]
    offset = np.stack([origin[fid], origin[fid]])  # (2, C) each crop's grid offset
    offset[0, sl] += h_off
    offset[1, sl] += w_off
    shape = np.stack([canvas_h, canvas_w, hw[:, 0], hw[:, 1]])  # (4, C)
    m = int(shape.max()) + 1
    if m < 1 << 15:  # one int64 key per shape
        keys, inverse = np.unique(((shape[0] * m + shape[1]) * m + shape[2]) * m + shape[3], return_inverse=True)
    else:
        keys, inverse = np.unique(shape, axis=1, return_inverse=True)
    first_of = np.zeros(keys.shape[-1], dtype=np.int64)
    first_of[inverse.reshape(-1)] = np.arange(cs.shape[0])
    lens = ce - cs
    # every distinct grid once, end to end (2, S); each crop's tokens read their grid's span of it, shifted
    lib = np.concatenate([_crop_grid(*key) for key in shape.T[first_of].tolist()], axis=1)
    size = lens[first_of]  # (U,) tokens of each distinct grid
    at = np.stack([(np.cumsum(size) - size)[inverse.reshape(-1)] - (np.cumsum(lens) - lens), offset[0], offset[1]])

    def crop_values() -> np.ndarray:  # (2, T) the crops' tokens in order: their grids + their offsets
        per = np.repeat(at, lens, axis=1)  # (3, T)
        per[0] += np.arange(per.shape[1])  # each token's index into lib
        val = per[1:]  # the offsets, plus each token's grid coordinates: 1-D gathers (a 2-D one is slower)
        val[0] += lib[0].take(per[0])
        val[1] += lib[1].take(per[0])
        return val

    # ---- the markers: <image> halo, </image> at the canvas's far corner, </slice> at a slice's
    # bottom-right corner, then <slice> at its top-left (a crop's grid, written after, wins on its tokens)
    halo = fs >= lo
    corner = (te < fe) & (te < hi)
    o_sl = origin[f_sl]
    end_ok = (ce[sl] < fe[f_sl]) & (ce[sl] < hi[f_sl])
    mark_ok = cs[sl] - 1 < hi[f_sl]
    marks_at = [fs[halo], te[corner], ce[sl][end_ok], (cs[sl] - 1)[mark_ok]]

    def write_markers() -> None:  # 1-D writes (a 2-D one, pos[1:, at], is about 2x slower)
        pos[1, marks_at[0]] = pos[2, marks_at[0]] = np.maximum(origin[halo] - 1, 0)
        pos[1, marks_at[1]], pos[2, marks_at[1]] = (origin + ch)[corner], (origin + cw)[corner]
        pos[1, marks_at[2]] = (o_sl + h_off + hw[sl, 0] - 1)[end_ok]
        pos[2, marks_at[2]] = (o_sl + w_off + hw[sl, 1] - 1)[end_ok]
        pos[1, marks_at[3]], pos[2, marks_at[3]] = (o_sl + h_off)[mark_ok], (o_sl + w_off)[mark_ok]

    head = np.flatnonzero(fs < lo).tolist()
    on_crops = any((types[at] != 0).any() for at in marks_at)
    if not head and not on_crops and not (ce > hi[fid]).any():  # axes 1, 2: the coat and the grids in turn
        pos[1:] = base  # the coat, then over the crops' tokens (masked writes) their grids, shifted
        crop_val = crop_values()  # (2, T) the crops' tokens in order
        is_crop = types != 0
        pos[1][is_crop], pos[2][is_crop] = crop_val
        write_markers()  # on no crop's token
    else:
        pos[1:] = base
        for k in head:  # a thumbnail at its sample's first token (at most one a sample):
            # the reference's base coat [-1:end] then misses the span, which keeps its first coat, 0, 1, 2, ...
            a, z = int(lo[k]), int(hi[k])
            pos[:, a:z] = np.arange(z - a)
            for c in range(ft[k], flast[k] + 1):  # its crops' t: the origin, 0
                pos[0, cs[c] : min(ce[c], z)] = 0
            if z == s_end[fsample[k]]:  # ... but for the sample's last token, where that slice lands (origin 0)
                pos[:, z - 1] = 0
        write_markers()
        hw_val = crop_values()  # (2, T)
        tok = np.flatnonzero(types != 0)  # the crops' tokens, in order
        inside = tok < np.repeat(hi[fid], lens)  # a crop running into the next frame's <image> slot: cut
        pos[1:, tok[inside]] = hw_val[:, inside]
    # ---- the newline after a row of slices: past the row's right edge
    nl = np.flatnonzero(wide)
    f_nl = fid[nl]
    tok, owner = _spans(ce[nl] + 1, cs[nl + 1] - 1)
    o_nl = origin[f_nl]
    pos[1, tok] = (o_nl + (j[nl] // cols[f_nl] + 1) * sh[f_nl] - 1)[owner]
    pos[2, tok] = (o_nl + cols[f_nl] * sw[f_nl])[owner]
    return pos


def minicpmv4_7_rope_index(
    config: Any,
    input_ids: Tensor,
    mm_token_type_ids: Tensor | None = None,
    target_sizes: Tensor | None = None,
    target_sizes_videos: Tensor | None = None,
    downsample_mode: str | None = None,
    attention_mask: Tensor | None = None,
    rule: str = "original",
) -> tuple[Tensor, Tensor]:
    """MiniCPM-V 4.7 canvas position ids ``(3, B, L)`` and ``rope_deltas`` ``(B, 1)``, int64.

    Every run of image (video) tokens -- ``mm_token_type_ids`` 1 (2), else ``config.image_token_id``
    (``video_token_id``) -- is a crop; the next ``target_sizes`` (``target_sizes_videos``) row
    ``(h, w)`` in patches gives its ``h / m x w / m`` tokens (``m`` 4 in ``"16x"`` mode, 2 in ``"4x"``).
    A crop after a ``<slice>`` token is a slice of the open frame, else a thumbnail opening a
    frame; frames with only markers between them share a group. A frame's canvas (the slices'
    rows x columns, or the thumbnail) starts at ``origin``; the thumbnail is stretched over it,
    each slice sits at its row and column, the markers at its corners, the newline past its right
    edge; the text after it at ``origin + max(canvas) + 1``. 0 on padding; ``rope_deltas`` = largest
    position + 1 - real length (transformers' ``MiniCPMV4_7Model.get_rope_index``). Array ops over all
    the batch's crops and frames on the host; no Python loop over tokens (per distinct crop grid its
    cached coordinates, for one ``concatenate``; per sample only a thumbnail at its first token)."""
    _check_rule(rule, "minicpmv4_7")
    real, counts, flat, padded, args = _minicpm_inputs(
        config, input_ids, mm_token_type_ids, target_sizes, target_sizes_videos, downsample_mode, attention_mask
    )
    b, length = real.shape
    pos = _minicpm_positions(*args)
    if padded:
        out = np.zeros((3, b * length), dtype=np.int64)  # 0 on padding
        for axis in range(3):  # a 1-D masked write per axis (a 2-D one is about 4x slower)
            out[axis][flat] = pos[axis]
        out = out.reshape(3, b, length)
    else:
        out = pos.reshape(3, b, length)
    deltas = np.zeros(b, dtype=np.int64)  # the largest position of each sample (0 without tokens) ...
    if pos.shape[1]:
        full = counts > 0
        top = np.maximum.reduceat(pos, (np.cumsum(counts) - counts)[full], axis=1).max(0)  # (3, B') -> (B',)
        deltas[full] = np.maximum(top, 0)
    if length:
        deltas += 1 - counts  # ... + 1 - its length
    device = input_ids.device
    return torch.from_numpy(out).to(device), torch.from_numpy(deltas.reshape(b, 1).astype(np.int64)).to(device)


def _minicpm_inputs(config, input_ids, mm_token_type_ids, target_sizes, target_sizes_videos, downsample_mode, mask):
    """:func:`minicpmv4_7_rope_index`'s arguments checked and read on the host: ``real`` ``(B, L)`` bool, ``counts``
    ``(B,)`` real tokens per sample, ``flat`` ``(B * L,)`` ``real`` in flat order, ``padded`` (any padding) and the
    arguments of :func:`_minicpm_positions` (the real tokens' ids and types end to end, ``counts``, the crop
    tables, the merge and the marker ids)."""
    _check_ids(input_ids)
    _check_like(mask, "attention_mask", input_ids)
    _check_like(mm_token_type_ids, "mm_token_type_ids", input_ids)
    markers = tuple(getattr(config, name, None) for name in _MINICPM_MARKERS)
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in markers):
        raise ValueError(f"config must set the marker token ids {_MINICPM_MARKERS}, got {markers}")
    mode = downsample_mode or config.downsample_mode
    if mode not in ("16x", "4x"):
        raise ValueError(f"downsample_mode must be '16x' or '4x', got {mode!r}")
    merge = 2 if mode == "4x" else 4
    tables = {}
    for kind, sizes, name in ((1, target_sizes, "target_sizes"), (2, target_sizes_videos, "target_sizes_videos")):
        if sizes is None:
            tables[kind] = np.zeros((0, 2), dtype=np.int64)
            continue
        if not isinstance(sizes, Tensor) or sizes.dim() != 2 or sizes.shape[1] != 2 or sizes.is_floating_point():
            raise ValueError(
                f"{name} must be an integer tensor of shape (num_crops, 2), got {getattr(sizes, 'shape', sizes)}"
            )
        tables[kind] = host(sizes).astype(np.int64) // merge  # (h, w) in tokens per crop
    real = real_tokens(mask, input_ids.shape)
    length = real.shape[1]
    counts = real.view(np.uint8).sum(1, dtype=np.uint16 if length < 2**16 else np.int64).astype(np.int64)
    flat = real.reshape(-1)  # (B * L,) the real tokens, row by row: masked reads and writes (no index arrays)
    padded = not flat.all()
    ids = host(input_ids).reshape(-1)
    ids = ids[flat] if padded else ids  # (N,)
    if mm_token_type_ids is None:
        image, video = config.image_token_id, config.video_token_id
        types = (ids == video).view(np.int8) * np.int8(2)  # (N,) 0 text, 1 image, 2 video
        if image == video:
            types[ids == image] = 1  # (one id for both: image)
        else:
            types += (ids == image).view(np.int8)  # (no masked write)
    else:
        types = modality_types(mm_token_type_ids).reshape(-1)
        types = types[flat] if padded else types
    return real, counts, flat, padded, (ids, types, counts, tables, merge, markers)


def minicpmv4_7_blocks(
    config: Any,
    input_ids: Tensor,
    mm_token_type_ids: Tensor | None = None,
    target_sizes: Tensor | None = None,
    target_sizes_videos: Tensor | None = None,
    downsample_mode: str | None = None,
    attention_mask: Tensor | None = None,
) -> tuple[np.ndarray, VisionBlocks]:
    """``(real, blocks)`` of a MiniCPM-V 4.7 batch (arguments as :func:`minicpmv4_7_rope_index`, checked as it checks
    them: the same errors): ``real`` ``(B, L)`` bool, and every crop -- a thumbnail, a slice or a video frame, i.e.
    a run of image (video) tokens -- a vision block of its own grid ``(1, h / m, w / m)`` (its ``target_sizes``
    (``target_sizes_videos``) row, in order), images ``is_image``; the markers and newlines are text. The blocks
    another scheme places under ``use_rope`` (the canvas, the thumbnail stretched over its slices, is the model's
    own rule only, and is not computed here)."""
    real, _, _, _, args = _minicpm_inputs(
        config, input_ids, mm_token_type_ids, target_sizes, target_sizes_videos, downsample_mode, attention_mask
    )
    _minicpm_crops(*args)  # the crops read as the own rule reads them (its errors)
    tables = args[3]
    if mm_token_type_ids is None:
        ids = host(input_ids)
        types = np.where(ids == config.video_token_id, 2, 0)
        types[ids == config.image_token_id] = 1
    else:
        types = host(mm_token_type_ids)
    grids, firsts, is_image = [], [], []
    for kind, sizes, name in ((1, target_sizes, "target_sizes"), (2, target_sizes_videos, "target_sizes_videos")):
        first, length = _runs((types == kind) & real)  # (C,) each crop of this modality, in reading order
        hw = tables[kind][: first.shape[0]]
        if hw.shape[0] != first.shape[0] or (hw.prod(-1) != length).any():
            raise ValueError(  # a crop the own rule reads otherwise (cut by padding): no grid to place
                f"{name}: the {first.shape[0]} runs of {'image' if kind == 1 else 'video'} tokens hold "
                f"{length.tolist()} tokens, the crops {hw.prod(-1).tolist()}"
            )
        grids.append(np.concatenate([np.ones((hw.shape[0], 1), dtype=np.int64), hw], 1))
        firsts.append(first)
        is_image.append(np.full(first.shape[0], kind == 1))
    grid = np.concatenate(grids)
    blocks = VisionBlocks(grid, np.concatenate(firsts), np.zeros(grid.shape[0], np.float32), np.concatenate(is_image))
    return real, blocks


def _minicpm_through_get_rope_index(config: Any, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
    raise ValueError(
        "model_type 'minicpmv4_7' reads target_sizes / target_sizes_videos (h, w) per crop and downsample_mode, not "
        "image_grid_thw: call mmpos.integrations.hf_families.minicpmv4_7_rope_index"
    )


#: ``model_type`` -> its position-id function (called by :func:`~mmpos.integrations.hf_rope_index.get_rope_index`)
FAMILY_ROPE_INDEX: dict[str, Callable[..., tuple[Tensor, Tensor]]] = {
    "hy_v4_vl": hy_v4_vl_rope_index,
    "hunyuan_vl": hunyuan_vl_rope_index,
    "glm_image": glm_image_rope_index,
    "minicpmv4_7": _minicpm_through_get_rope_index,
}


# --------------------------------------------------------------------------- packed rows
_PACKED_FAMILIES = {
    "hy_v4_vl": hy_v4_vl_rope_index,
    "hunyuan_vl": hunyuan_vl_rope_index,
    "glm_image": glm_image_rope_index,
    "minicpmv4_7": minicpmv4_7_rope_index,
}


def packed_rope_index(config: Any, input_ids: Tensor, cu_seqlens: Tensor, **inputs: Any) -> tuple[Tensor, Tensor]:
    """Position ids of a packed batch of ``hy_v4_vl``, ``hunyuan_vl``, ``glm_image`` or ``minicpmv4_7``:
    several samples in one row, each with the positions (and ``rope_deltas``) it has alone (as
    :func:`mmpos.integrations.hf_rope_index.packed_rope_index` for the Qwen-VL families).

    Args:
        config: the family's config (``config.model_type`` picks the function).
        input_ids: ``(1, N)`` the samples one after the other, no padding.
        cu_seqlens: ``(B + 1,)`` integer sample offsets (FlashAttention varlen's ``cu_seqlens``: 0,
            then the running sum of the sample lengths).
        inputs: the family function's other arguments (:func:`hy_v4_vl_rope_index`,
            :func:`hunyuan_vl_rope_index`, :func:`glm_image_rope_index`, :func:`minicpmv4_7_rope_index`),
            the grids / crop sizes in order of appearance across the row; ``mm_token_type_ids`` ``(1, N)``;
            no ``attention_mask`` (the row has no padding). ``glm_image`` with ``B > 1`` needs
            ``images_per_sample`` ``(B,)``.

    Returns:
        ``position_ids`` ``(A, 1, N)`` (``A`` = 3, HunYuan-VL's ``N`` axes; every sample starts at 0, its
        image index too) and ``rope_deltas`` ``(B, 1)``, each sample's own.
    """
    model_type = getattr(config, "model_type", None)
    if model_type not in _PACKED_FAMILIES:
        raise ValueError(f"config.model_type must be one of {sorted(_PACKED_FAMILIES)}, got {model_type!r}")
    _check_ids(input_ids)
    if input_ids.shape[0] != 1:
        raise ValueError(f"input_ids must be a packed (1, N) tensor, got {tuple(input_ids.shape)}")
    if "attention_mask" in inputs:
        raise ValueError("attention_mask must not be given: a packed row has no padding (cu_seqlens splits it)")
    total = input_ids.shape[1]
    lengths, unpack = packed_rows(cu_seqlens, total, input_ids.device)  # (1, N) -> (B, longest), right padding
    b, longest = lengths.shape[0], int(lengths.max())

    types = inputs.pop("mm_token_type_ids", None)
    if types is not None:
        _check_like(types, "mm_token_type_ids", input_ids)
        inputs["mm_token_type_ids"] = unpack(types)
    if model_type == "glm_image" and b > 1 and inputs.get("images_per_sample") is None:
        raise ValueError("images_per_sample (B,) must be given for a packed glm_image row of several samples")
    ids, mask = unpack(input_ids), unpack(torch.ones_like(input_ids))
    fn = _PACKED_FAMILIES[model_type]
    grid = inputs.get("image_grid_thw")
    if model_type == "hunyuan_vl" and isinstance(grid, Tensor) and b > 1:
        # HunYuan-VL's image index counts the images of the whole batch; alone, a sample's count from 0
        marks = host(inputs["mm_token_type_ids"]) == 1 if types is not None else host(ids) == config.image_token_id
        first, _ = _runs(marks & (host(mask) == 1))
        count = np.bincount(first // longest, minlength=b)
        if count.sum() != grid.shape[0]:
            raise ValueError(
                f"image_grid_thw holds {grid.shape[0]} grids, but input_ids holds {int(count.sum())} runs of image tokens"
            )
        offset = np.cumsum(count) - count
        parts = []
        for i in range(b):  # per sample (not per token): its own grids, its image index from 0
            own = dict(inputs, image_grid_thw=grid[offset[i] : offset[i] + count[i]] if count[i] else None)
            if types is not None:
                own["mm_token_type_ids"] = own["mm_token_type_ids"][i : i + 1, : lengths[i]]
            parts.append(fn(config, ids[i : i + 1, : lengths[i]], **own))
        return torch.cat([p[0] for p in parts], 2), torch.cat([p[1] for p in parts], 0)
    position_ids, deltas = fn(config, ids, attention_mask=mask, **inputs)
    return position_ids[:, mask.bool()].unsqueeze(1), deltas
