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
  or of 2 more (its boundary tokens, at their 1-D position); ``t`` is not read.
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

from .._validate import check_int
from ..layout import Layout, VisionBlocks, pack
from ..schemes import RULES, get_scheme, resolve_options
from ._token_blocks import check_grid, host, packed_rows

__all__ = [
    "FAMILY_ROPE_INDEX",
    "GLM_VIDEO_MARKER_FAMILIES",
    "glm_image_decode_position_ids",
    "glm_image_rope_index",
    "hunyuan_vl_rope_index",
    "hy_v4_vl_rope_index",
    "minicpmv4_7_rope_index",
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
    opened = (input_ids == start).astype(np.int32) - (input_ids == end)  # (B, L) +1 at a start, -1 at an end
    return torch.from_numpy(opened).cumsum(1).numpy() > 0  # starts so far minus ends so far (one torch cumsum)


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
    if (grid[:, 1:] % m).any():
        raise ValueError(f"{name}: h and w must be divisible by the spatial merge size {m}")
    return grid // np.array([1, m, m]) + np.array([0, 0, 1])


def _runs(marks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(R,)`` flat index of the first token and length of every run of marked tokens of a
    ``(B, L)`` bool array, in reading order (a run never crosses samples)."""
    b, length = marks.shape
    edged = np.zeros((b, length + 2), dtype=bool)  # each row between two unmarked tokens
    edged[:, 1:-1] = marks
    edges = np.flatnonzero(edged[:, 1:] != edged[:, :-1])  # (2R,) per row: start, end, start, end, ...
    edges -= edges // (length + 1)  # flat index in the (B, L) batch (an end may be L: one past its row)
    return edges[0::2], edges[1::2] - edges[0::2]


def _real(attention_mask: Tensor | None, input_ids: Tensor) -> np.ndarray:
    if attention_mask is None:
        return np.ones(input_ids.shape, dtype=bool)
    return host(attention_mask) == 1


def _returned(lay: Layout, input_ids: Tensor) -> tuple[Tensor, Tensor]:
    return lay.position_ids.to(input_ids.dtype), lay.rope_deltas.to(input_ids.dtype)


# --------------------------------------------------------------------------- HY-V4-VL
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
    _check_ids(input_ids)
    _check_like(attention_mask, "attention_mask", input_ids)
    _check_like(mm_token_type_ids, "mm_token_type_ids", input_ids)
    m = _merge(config)
    real = _real(attention_mask, input_ids)
    if mm_token_type_ids is None:
        ids = host(input_ids)
        marks = {1: ids == config.image_token_id, 2: ids == config.video_token_id}
    else:
        types = host(mm_token_type_ids)
        marks = {1: types == 1, 2: types == 2}
    grids, firsts, is_image = [], [], []
    for kind, grid, name in ((1, image_grid_thw, "image_grid_thw"), (2, video_grid_thw, "video_grid_thw")):
        tokens_grid = _row_grid(check_grid(grid, name), m, name)
        first, length = _runs(marks[kind] & real)
        if first.shape[0] != tokens_grid.shape[0]:
            raise ValueError(
                f"{name} holds {tokens_grid.shape[0]} grids, but input_ids holds {first.shape[0]} runs of "
                f"{'image' if kind == 1 else 'video'} tokens"
            )
        bad = np.flatnonzero(length != tokens_grid.prod(-1))
        if bad.size:
            k = int(bad[0])
            raise ValueError(
                f"{name}: grid {k} {tokens_grid[k].tolist()} (tokens, a newline per row) holds "
                f"{int(tokens_grid[k].prod())} tokens, but its run of placeholder tokens holds {int(length[k])}"
            )
        grids.append(tokens_grid)
        firsts.append(first)
        is_image.append(np.full(first.shape[0], kind == 1))
    grid = np.concatenate(grids)
    blocks = VisionBlocks(grid, np.concatenate(firsts), np.zeros(grid.shape[0], np.float32), np.concatenate(is_image))
    sch = get_scheme("hy-v4-vl")
    lay = pack(real, blocks, sch, resolve_options(sch, rule=RULES["hf-5.3"]), device=input_ids.device)
    return _returned(lay, input_ids)


# --------------------------------------------------------------------------- HunYuan-VL
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
    _check_like(attention_mask, "attention_mask", input_ids)
    _check_like(mm_token_type_ids, "mm_token_type_ids", input_ids)
    text_config = getattr(config, "text_config", config)
    section = (getattr(text_config, "rope_parameters", None) or {}).get("mrope_section") or []
    axes = len(section)
    if axes < 3:
        raise ValueError(
            f"config.text_config.rope_parameters['mrope_section'] must hold >= 3 sections (HunYuan-VL's "
            f"M-RoPE axes), got {section!r}"
        )
    m = _merge(config)
    real = _real(attention_mask, input_ids)
    if image_grid_thw is None:  # the reference then reads no image: every real token is 1-D
        grid, first = np.zeros((0, 3), dtype=np.int64), np.zeros(0, dtype=np.int64)
    else:
        marks = (
            (host(input_ids) == config.image_token_id) if mm_token_type_ids is None else host(mm_token_type_ids) == 1
        )
        grid = _row_grid(check_grid(image_grid_thw, "image_grid_thw"), m, "image_grid_thw")
        grid[:, 0] = 1  # the reference reads h and w only
        start, length = _runs(marks & real)
        if start.shape[0] != grid.shape[0]:
            raise ValueError(
                f"image_grid_thw holds {grid.shape[0]} grids, but input_ids holds {start.shape[0]} runs of image tokens"
            )
        tokens = grid.prod(-1)
        bad = np.flatnonzero((length != tokens) & (length != tokens + 2))
        if bad.size:
            k = int(bad[0])
            raise ValueError(
                f"image_grid_thw: image {k} holds {int(tokens[k])} tokens (a newline per row), or {int(tokens[k]) + 2} "
                f"with its boundary tokens, but its run of image tokens holds {int(length[k])}"
            )
        first = start + (length == tokens + 2)
    blocks = VisionBlocks(grid, first, np.zeros(grid.shape[0], np.float32), np.ones(grid.shape[0], dtype=bool))
    sch = get_scheme("hunyuan-vl")
    lay = pack(real, blocks, sch, resolve_options(sch, rule=RULES["hf-5.3"]), device=input_ids.device)
    ids, deltas = _returned(lay, input_ids)
    out = torch.empty((axes, *input_ids.shape), dtype=ids.dtype)  # (N, B, L)
    mask = torch.from_numpy(real)
    torch.cumsum(mask, 1, out=out[0])  # every real token's index among the real tokens, 0 on padding
    out[0].sub_(1).masked_fill_(~mask, 0)
    out[1 : axes - 3] = out[0]
    out[axes - 3 :] = ids.cpu()
    return out.to(input_ids.device), deltas


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


def _glm_image_prompt(config, input_ids, image_grid_thw, images_per_sample, attention_mask):
    _check_ids(input_ids)
    b, length = input_ids.shape
    if attention_mask is not None and (not isinstance(attention_mask, Tensor) or attention_mask.dim() != 2):
        raise ValueError(
            f"attention_mask must be a (B, L) tensor, got {getattr(attention_mask, 'shape', attention_mask)}"
        )
    # the reference ignores a mask of another length (assisted decoding)
    use_mask = attention_mask is not None and tuple(attention_mask.shape) == (b, length)
    real = host(attention_mask) == 1 if use_mask else np.ones((b, length), dtype=bool)
    grids, offset, count = _glm_image_grids(image_grid_thw, images_per_sample, b)
    ids = host(input_ids)
    starts = np.flatnonzero((ids == config.image_start_token_id) & real)  # image start tokens, reading order
    ends = np.flatnonzero((ids == config.image_end_token_id) & real)
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
    sch = get_scheme("glm-image")
    lay = pack(real, blocks, sch, resolve_options(sch, rule=RULES["original"]), device=input_ids.device)
    return lay, grids, offset, count, complete


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
    ids = lay.position_ids.to(input_ids.dtype)
    return ids, torch.zeros(input_ids.shape[0], 1, dtype=input_ids.dtype, device=input_ids.device)


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
    lay, grids, offset, count, complete = _glm_image_prompt(
        config, input_ids, image_grid_thw, images_per_sample, attention_mask
    )
    b = input_ids.shape[0]
    if not (count > 0).all():
        raise ValueError(
            "every sample must read at least one grid of image_grid_thw for decode positions (transformers stacks "
            f"the samples that do), got images_per_sample {count.tolist()}"
        )
    n_dec = np.maximum(count - complete, 0)  # (B,) generated grids per sample
    # the generated grids, sample by sample, the last grid first
    sample = np.repeat(np.arange(b), n_dec)
    order = np.arange(sample.shape[0]) - np.repeat(np.cumsum(n_dec) - n_dec, n_dec)  # 0 .. n_dec - 1
    dec = grids[offset[sample] + count[sample] - 1 - order].copy()  # (G, 3)
    dec[:, 0] = 1  # t is not read: h * w tokens
    per = np.bincount(sample, weights=dec.prod(-1), minlength=b).astype(np.int64) + 1  # tokens + the end token
    width = int(per.max())
    real = np.arange(width)[None, :] < per[:, None]  # right padding to the longest
    first = np.repeat(np.arange(b) * width, n_dec) + (
        np.cumsum(dec.prod(-1)) - dec.prod(-1) - np.repeat(np.cumsum(per - 1) - (per - 1), n_dec)
    )
    sch = get_scheme("glm-image")
    blocks = VisionBlocks(dec, first, np.zeros(dec.shape[0], np.float32), np.ones(dec.shape[0], dtype=bool))
    gen = pack(real, blocks, sch, resolve_options(sch, rule=RULES["original"]))
    start = (lay.rope_deltas.cpu() + input_ids.shape[1]).view(1, b, 1)  # the prompt's next position, per sample
    pos = gen.position_ids + start  # (3, B, D)
    last = torch.from_numpy(per - 1).view(1, b, 1).expand(3, -1, -1)
    pos = torch.where(torch.from_numpy(real)[None], pos, pos.gather(2, last))  # repeat the end token
    return pos.permute(1, 0, 2).contiguous().to(input_ids.device)


# --------------------------------------------------------------------------- MiniCPM-V 4.7
_MINICPM_MARKERS = ("slice_start_id", "slice_end_id", "image_start_id", "image_end_id", "newline_id")


def _crop_runs(types: np.ndarray) -> list[tuple[int, int, int]]:
    """``(modality, start, end)`` of every maximal run of one non-zero modality code of ``types`` (n,)."""
    change = np.flatnonzero(np.diff(types)) + 1
    starts = np.concatenate([[0], change])
    ends = np.concatenate([change, [types.shape[0]]])
    keep = types[starts] != 0 if types.size else np.zeros(0, dtype=bool)
    return list(zip(types[starts[keep]].tolist(), starts[keep].tolist(), ends[keep].tolist()))


@functools.lru_cache(maxsize=4096)
def _canvas_axis(canvas: int, tokens: int) -> np.ndarray:
    """``tokens`` coordinates spread over ``canvas`` positions, rounded as the reference rounds
    (float32 ``linspace``, half to even; ``arange`` when ``canvas == tokens``)."""
    out = torch.linspace(0, canvas - 1, tokens).round().long().numpy()
    out.flags.writeable = False  # cached: shared by every crop of this size
    return out


@functools.lru_cache(maxsize=4096)
def _crop_grid(canvas_h: int, canvas_w: int, h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """``(h * w,)`` row and column coordinates of a crop of ``h x w`` tokens stretched over a
    ``canvas_h x canvas_w`` canvas (:func:`_canvas_axis`), raster order; cached, read-only."""
    rows = np.repeat(_canvas_axis(canvas_h, h), w)
    cols = np.tile(_canvas_axis(canvas_w, w), h)
    rows.flags.writeable = cols.flags.writeable = False
    return rows, cols


def _minicpm_sample(ids: np.ndarray, types: np.ndarray, grids: dict, merge: int, markers: tuple[int, ...]):
    """``(3, n)`` int64 positions of one unpadded MiniCPM-V 4.7 sequence; ``grids`` per modality
    ``[[(h, w) in tokens, ...], cursor]`` (consumed crop by crop, in order, across the batch)."""
    n = ids.shape[0]
    is_marker = ids == markers[0]
    for marker in markers[1:]:
        is_marker |= ids == marker
    non_marker = np.concatenate([[0], np.cumsum(~is_marker)])  # non-marker tokens before each index
    # the next non-marker index at or after each index (n past the end): where a frame's markers stop
    nxt = np.where(~is_marker, np.arange(n), n)
    nxt = np.minimum.accumulate(nxt[::-1])[::-1] if n else nxt
    nxt = np.concatenate([nxt, [n]])
    groups: list[list] = []  # [start, [frame, ...]]; frame = [modality, thumb start, thumb end, slices]
    open_slices, previous_end = None, 0
    for modality, start, end in _crop_runs(types):
        if open_slices is not None and ids[start - 1] == markers[0]:  # a detail slice of the open frame
            open_slices.append((start, end))
        else:  # a thumbnail opens a frame, in the group before it if only markers lie between them
            open_slices = []
            frame = [modality, start, end, open_slices]
            gap_start, gap_end = previous_end, start - 1
            only_markers = gap_end <= gap_start or non_marker[gap_end] == non_marker[gap_start]
            if groups and only_markers:
                groups[-1][1].append(frame)
            else:
                groups.append([start - 1, [frame]])
        previous_end = end
    pos = np.empty((3, n), dtype=np.int64)
    current, index = 0, 0

    def line(a: int, b: int, first: int) -> None:  # tokens a .. b - 1 at first, first + 1, ... on every axis
        pos[:, a:b] = np.arange(first, first + b - a)

    for group_start, frames in groups:
        ends = [int(nxt[(f[3][-1][1] if f[3] else f[2])]) for f in frames]  # each frame's end: past its markers
        group_end = ends[-1]
        if group_start > index:
            line(index, group_start, current)
            current += group_start - index
        cursor = group_start
        for (modality, thumb_start, thumb_end, slices), frame_end in zip(frames, ends):
            table = grids[modality]
            if table[1] >= len(table[0]):
                raise ValueError(f"{'target_sizes' if modality == 1 else 'target_sizes_videos'} holds too few crops")
            th, tw = table[0][table[1]]
            table[1] += 1
            frame_start = thumb_start - 1
            if frame_start > cursor:  # 1-D tokens between two frames, then one step more
                line(cursor, frame_start, current)
                current += frame_start - cursor + 1
            frame_end = min(frame_end, group_end)
            origin = current
            ch, cw = th, tw
            cols = rows = 0
            if slices:
                cols = len(slices)
                # a newline between two slices ends a row of the canvas
                wide = next((k for k in range(len(slices) - 1) if slices[k + 1][0] - slices[k][1] > 2), None)
                if wide is not None:
                    cols = wide + 1
                rows = len(slices) // cols
                if rows * cols != len(slices):
                    rows, cols = 1, len(slices)
                if table[1] + len(slices) > len(table[0]):
                    raise ValueError("target sizes hold too few crops for the slices")
                sh, sw = table[0][table[1]]
                ch, cw = rows * sh, cols * sw
            pos[:, frame_start:frame_end] = origin  # the frame's base coat
            pos[1:, frame_start] = max(origin - 1, 0)  # <image>: just outside the canvas
            if thumb_end < frame_end:  # </image>: the canvas's far corner
                pos[1, thumb_end], pos[2, thumb_end] = origin + ch, origin + cw
            n_thumb = th * tw
            if thumb_end - thumb_start != n_thumb:
                raise ValueError(
                    f"a thumbnail of {th} x {tw} tokens (target size / {merge}) has {thumb_end - thumb_start} tokens"
                )
            # the thumbnail stretched over the canvas: (origin, origin + row, origin + column)
            pos[0, thumb_start:thumb_end] = origin
            rows_at, cols_at = _crop_grid(ch, cw, th, tw)
            np.add(rows_at, origin, out=pos[1, thumb_start:thumb_end])
            np.add(cols_at, origin, out=pos[2, thumb_start:thumb_end])
            for k, (a, b) in enumerate(slices):
                sh_k, sw_k = table[0][table[1]]
                table[1] += 1
                if b - a != sh_k * sw_k:
                    raise ValueError(f"a slice of {sh_k} x {sw_k} tokens (target size / {merge}) has {b - a} tokens")
                h_off, w_off = (k // cols) * sh, (k % cols) * sw
                if a - 1 >= frame_start:  # <slice>: the slice's top-left corner
                    pos[1, a - 1], pos[2, a - 1] = origin + h_off, origin + w_off
                if b < frame_end:  # </slice>: its bottom-right corner
                    pos[1, b], pos[2, b] = origin + h_off + sh_k - 1, origin + w_off + sw_k - 1
                pos[0, a:b] = origin
                rows_at, cols_at = _crop_grid(sh_k, sw_k, sh_k, sw_k)
                np.add(rows_at, origin + h_off, out=pos[1, a:b])
                np.add(cols_at, origin + w_off, out=pos[2, a:b])
            for k in range(len(slices) - 1):  # the newline after a row of slices: past its right edge
                a, b = slices[k][1], slices[k + 1][0]
                if b - a > 2:
                    pos[1, a + 1 : b - 1] = origin + (k // cols + 1) * sh - 1
                    pos[2, a + 1 : b - 1] = origin + cols * sw
            current = origin + max(ch, cw) + 1
            cursor = frame_end
        if cursor < group_end:
            line(cursor, group_end, current)
            current += group_end - cursor
        index = group_end
    if index < n:
        line(index, n, current)
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
    position + 1 - real length (transformers' ``MiniCPMV4_7Model.get_rope_index``). Bookkeeping per
    crop on the host; no Python loop over tokens."""
    _check_rule(rule, "minicpmv4_7")
    _check_ids(input_ids)
    _check_like(attention_mask, "attention_mask", input_ids)
    _check_like(mm_token_type_ids, "mm_token_type_ids", input_ids)
    markers = tuple(getattr(config, name, None) for name in _MINICPM_MARKERS)
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in markers):
        raise ValueError(f"config must set the marker token ids {_MINICPM_MARKERS}, got {markers}")
    mode = downsample_mode or config.downsample_mode
    if mode not in ("16x", "4x"):
        raise ValueError(f"downsample_mode must be '16x' or '4x', got {mode!r}")
    merge = 2 if mode == "4x" else 4
    grids = {}
    for kind, sizes, name in ((1, target_sizes, "target_sizes"), (2, target_sizes_videos, "target_sizes_videos")):
        if sizes is None:
            grids[kind] = [[], 0]
            continue
        if not isinstance(sizes, Tensor) or sizes.dim() != 2 or sizes.shape[1] != 2 or sizes.is_floating_point():
            raise ValueError(
                f"{name} must be an integer tensor of shape (num_crops, 2), got {getattr(sizes, 'shape', sizes)}"
            )
        grids[kind] = [(host(sizes).astype(np.int64) // merge).tolist(), 0]  # (h, w) in tokens per crop
    ids = host(input_ids)
    if mm_token_type_ids is None:
        types = np.where(ids == config.image_token_id, 1, np.where(ids == config.video_token_id, 2, 0))
    else:
        types = host(mm_token_type_ids)
    real = _real(attention_mask, input_ids)
    b, length = ids.shape
    out = np.zeros((3, b, length), dtype=np.int64)  # 0 on padding
    for i in range(b):  # per sample, the bookkeeping per crop
        keep = real[i]
        out[:, i, keep] = _minicpm_sample(ids[i, keep], types[i, keep], grids, merge, markers)
    n_real = real.sum(1)
    deltas = out.max(axis=(0, 2)) + 1 - n_real if length else np.zeros(b, dtype=np.int64)
    device = input_ids.device
    return torch.from_numpy(out).to(device), torch.from_numpy(deltas.reshape(b, 1).astype(np.int64)).to(device)


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
