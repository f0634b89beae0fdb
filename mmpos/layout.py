"""Interleaved text + image + video sequences to positions (the multimodal *layout*).

A sample is a list of segments -- :class:`Text` ``(n)``, :class:`Image` ``(grid_thw)``,
:class:`Video` ``(grid_thw, second_per_grid)`` with grids in vision patches *before*
the spatial merge -- and :func:`build` turns a batch of samples into a :class:`Layout`
under one *scheme* (how positions advance):

=============  ================================  ===============================  ==========
scheme         ``coords.axes``                   ``position_ids``                 dtype
=============  ================================  ===============================  ==========
qwen2-vl       ``("t", "h", "w")``               ``(3, B, L)`` rows t, h, w        int64
qwen2.5-vl     ``("t", "h", "w")``               ``(3, B, L)`` rows t, h, w        int64
qwen3-vl       ``("t", "h", "w")``               ``(3, B, L)`` rows t, h, w        int64
mrope-i        ``("t", "h", "w")``               ``(3, B, L)`` rows t, h, w        int64
mhrope         ``("t", "h", "w")``               ``(3, B, L)`` rows t, h, w        int64
hope           ``("t", "h", "w")``               ``(3, B, L)`` rows t, h, w        float32
vrope          ``("c0", "c1", "c2", "c3")``      ``(4, B, L)`` rows c0 .. c3       int64
v2pe           ``("seq",)``                      ``(3, B, L)`` three equal rows    float64
flat           ``("seq",)``                      ``(3, B, L)`` three equal rows    int64
=============  ================================  ===============================  ==========

Conventions shared with the rotary encoders (:mod:`mmpos.encoders.mrope`):

* ``position_ids[a, b, n] == coords.pos[b, n, a]`` on real tokens for every
  multi-axis scheme; 1-axis schemes (``flat``, ``v2pe``) repeat their single row three
  times so that a Qwen2-VL-family model reads them as 1-D RoPE.
* Padding: ``position_ids`` holds ``1`` there (the Hugging Face convention),
  ``coords.pos`` holds ``0`` and ``coords.mask`` is ``False``.
* Text tokens carry the same value on every axis, so every scheme reduces to 1-D RoPE
  on text-only input (positions ``0 .. L - 1`` on every axis).
* ``vrope``: axis ``c{k}`` is the position seen by rotary pair ``p`` with
  ``p mod 4 == k``; for vision token ``(i, j)`` of an ``H x W`` frame the four axes hold
  ``i + j``, ``i + (W-1-j)``, ``(H-1-i) + j``, ``(H-1-i) + (W-1-j)`` (plus the frame offset).
* ``coords.pos`` is float32, except ``v2pe`` (float64, so fractional steps such as
  ``1/256`` stay exact at ``10**6`` tokens).
* ``rope_deltas`` ``(B, 1)``: next position minus ``L`` (int64; float32 for ``hope``,
  whose positions after a video may be fractional); during decoding the token at
  cache position ``c`` gets position ``c + rope_deltas`` on every axis
  (:func:`decode_position_ids`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from .coords import Coords, Modality

__all__ = [
    "Text",
    "Image",
    "Video",
    "Layout",
    "SCHEMES",
    "SCHEME_AXES",
    "HOPE_SCALES",
    "V2PE_DELTAS",
    "build",
    "decode_position_ids",
    "VisionBlocks",
    "token_positions",
]

#: the coordinate axes each scheme produces (see the module docstring)
SCHEME_AXES: dict[str, tuple[str, ...]] = {
    "qwen2-vl": ("t", "h", "w"),
    "qwen2.5-vl": ("t", "h", "w"),
    "qwen3-vl": ("t", "h", "w"),
    "mrope-i": ("t", "h", "w"),
    "mhrope": ("t", "h", "w"),
    "hope": ("t", "h", "w"),
    "vrope": ("c0", "c1", "c2", "c3"),
    "v2pe": ("seq",),
    "flat": ("seq",),
}
SCHEMES = tuple(SCHEME_AXES)
#: HoPE's training choices of the temporal scale ``s`` (hrlics/HoPE ``modeling_hope.py``)
HOPE_SCALES = (0.5, 0.75, 1.0, 1.25, 1.5)
#: V2PE's training choices of the visual step ``delta = stride / 256`` (OpenGVLab/V2PE ``v2pe_rnd``)
V2PE_DELTAS = tuple(2.0**-k for k in range(9))
ADVANCES = ("max", "spatial")


def _check_int(value: object, name: str, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def _check_grid(grid_thw: Sequence[int], name: str) -> tuple[int, int, int]:
    grid = tuple(grid_thw)
    if len(grid) != 3:
        raise ValueError(f"{name} must hold 3 sizes (t, h, w), got {grid_thw!r}")
    for size, axis in zip(grid, "thw"):
        _check_int(size, f"{name}[{axis}]", 1)
    return grid  # type: ignore[return-value]


@dataclass(frozen=True)
class Text:
    """``n`` text tokens."""

    n: int

    def __post_init__(self) -> None:
        _check_int(self.n, "Text.n", 1)


@dataclass(frozen=True)
class Image:
    """An image of ``grid_thw`` vision patches (``t`` is 1 for a still image)."""

    grid_thw: tuple[int, int, int]

    def __post_init__(self) -> None:
        object.__setattr__(self, "grid_thw", _check_grid(self.grid_thw, "Image.grid_thw"))


@dataclass(frozen=True)
class Video:
    """A clip of ``grid_thw`` patches; ``second_per_grid`` seconds per temporal patch
    (``temporal_patch_size / fps``; ``None`` means 1 second, as transformers assumes)."""

    grid_thw: tuple[int, int, int]
    second_per_grid: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "grid_thw", _check_grid(self.grid_thw, "Video.grid_thw"))
        s = self.second_per_grid
        if s is not None and (isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or s < 0):
            raise ValueError(f"Video.second_per_grid must be a finite number >= 0 or None, got {s!r}")


Segment = Text | Image | Video


@dataclass(frozen=True, eq=False)
class Layout:
    """Positions of a batch of interleaved sequences (``B`` samples padded to ``L`` tokens).

    Attributes:
        position_ids: ``(3, B, L)`` (``(4, B, L)`` for ``vrope``), HF layout; ``1`` on padding.
        rope_deltas: ``(B, 1)`` next position minus ``L`` (int64; float32 for ``hope``).
        attention_mask: ``(B, L)`` int64, 1 on real tokens (as HF models expect).
        modality: ``(B, L)`` int64 :class:`~mmpos.coords.Modality` codes (padding: ``TEXT``).
        coords: the same positions as a :class:`~mmpos.coords.Coords` (``pos`` ``(B, L, A)``,
            axes :data:`SCHEME_AXES` ``[scheme]``, ``mask`` = real tokens).
        scheme: the scheme name.
    """

    position_ids: Tensor
    rope_deltas: Tensor
    attention_mask: Tensor
    modality: Tensor
    coords: Coords
    scheme: str

    def decode(self, num_new: int = 1, cache_position: Tensor | int | None = None) -> Tensor:
        """Positions of ``num_new`` tokens generated after this batch (``cache_position``
        defaults to ``L``); same row count as :attr:`position_ids`."""
        start = self.attention_mask.shape[1] if cache_position is None else cache_position
        return decode_position_ids(self.rope_deltas, start, num_new, rows=self.position_ids.shape[0])


def decode_position_ids(rope_deltas: Tensor, cache_position: Tensor | int, num_new: int = 1, rows: int = 3) -> Tensor:
    """Positions ``(rows, B, num_new)`` of new tokens at cache positions ``cache_position ..``.

    ``cache_position`` is the index of the first new token in the (padded) cache: an int
    or a tensor whose first entry is used (HF passes ``cache_position`` ``(num_new,)``).
    Works for left and right padded batches alike, since ``rope_deltas`` is relative to
    the padded length. Text tokens share one position on every axis, so all rows are equal.
    """
    if not isinstance(rope_deltas, Tensor) or rope_deltas.dim() != 2 or rope_deltas.shape[1] != 1:
        got = tuple(rope_deltas.shape) if isinstance(rope_deltas, Tensor) else type(rope_deltas).__name__
        raise ValueError(f"rope_deltas must be a tensor of shape (B, 1), got {got}")
    _check_int(num_new, "num_new", 1)
    _check_int(rows, "rows", 1)
    if isinstance(cache_position, Tensor):
        start = cache_position.reshape(-1)[:1].to(rope_deltas.device)  # (1,)
    else:
        start = torch.tensor([_check_int(cache_position, "cache_position", 0)], device=rope_deltas.device)
    steps = torch.arange(num_new, device=rope_deltas.device)
    pos = rope_deltas + (start + steps).to(rope_deltas.dtype)  # (B, 1) + (num_new,) -> (B, num_new)
    return pos.unsqueeze(0).expand(rows, -1, -1)


# --------------------------------------------------------------------------- the shared core
@dataclass(frozen=True, eq=False)
class VisionBlocks:
    """The vision blocks of a batch (an image, a video, or a Qwen3-VL video frame) and their tokens.

    Attributes:
        grid: ``(K, 3)`` int64 ``(t, h, w)`` in tokens, i.e. *after* the spatial merge.
        second_per_grid: ``(K,)`` float32 seconds per temporal patch (0 for images).
        delta: ``(K,)`` float64 V2PE step of the block's tokens.
        scale: ``(K,)`` float64 HoPE temporal scale of the block.
        token_index: ``(Nv,)`` int64 flat index ``b * L + l`` into the padded ``(B, L)`` batch
            of every vision token: block after block, each block's ``t * h * w`` tokens in
            raster order (t, h, w).
    """

    grid: Tensor
    second_per_grid: Tensor
    delta: Tensor
    scale: Tensor
    token_index: Tensor

    def __post_init__(self) -> None:
        k = self.grid.shape[0]
        for name in ("second_per_grid", "delta", "scale"):
            if tuple(getattr(self, name).shape) != (k,):
                raise ValueError(f"{name} must have shape ({k},), one value per block")
        total = int(self.grid.prod(-1).sum())
        if tuple(self.token_index.shape) != (total,):
            raise ValueError(
                f"token_index must list the {total} vision tokens of the blocks, got {tuple(self.token_index.shape)}"
            )


def _block_offsets(blocks: VisionBlocks, scheme: str, tokens_per_second: float, temporal_stride: int, advance: str):
    """Per-token offsets from the block start ``(A, Nv)``, per-block extents ``(K,)`` and which
    axes add the block start ``(A,)``, all float64.

    Index arithmetic runs in float64 (floor of a quotient is exact below 2**31), which is
    several times faster than int64 division on CPU.
    """
    f64 = torch.float64
    t, h, w = blocks.grid.to(f64).unbind(-1)  # (K,) each
    counts = blocks.grid.prod(-1)
    nv = blocks.token_index.shape[0]
    blocks_k = torch.arange(counts.shape[0], device=t.device)
    k = torch.repeat_interleave(blocks_k, counts, output_size=nv)  # block of each token
    local = torch.arange(nv, device=t.device, dtype=f64) - (counts.cumsum(0) - counts).to(f64)[k]  # index in the block
    hk, wk = h[k], w[k]  # (Nv,) each
    row = torch.floor(local / wk)  # f * H + i
    wi = local - row * wk
    ti = torch.floor(row / hk)
    hi = row - ti * hk
    use_start = torch.ones(len(SCHEME_AXES[scheme]), dtype=f64, device=t.device)
    if scheme in ("qwen2-vl", "qwen2.5-vl", "qwen3-vl", "mhrope", "mrope-i"):
        if scheme == "qwen2.5-vl":  # multiply, then floor, in float32 as the Qwen2.5-VL reference does
            spg = blocks.second_per_grid
            t_off = (ti.float() * spg[k] * tokens_per_second).floor().to(f64)
            t_max = ((t - 1).float() * spg * tokens_per_second).floor().to(f64)
        else:
            stride = temporal_stride if scheme == "mrope-i" else 1
            t_off, t_max = ti * stride, (t - 1) * stride
        offset = torch.stack([t_off, hi, wi])
        extent = torch.maximum(torch.maximum(t_max, h - 1), w - 1) + 1 if advance == "max" else torch.maximum(h, w)
        if scheme == "mrope-i":
            use_start[1:] = 0  # spatial reset: h and w start at 0 in every block
    elif scheme == "hope":
        t_off = ti * blocks.scale[k]
        h_off = hi - torch.floor((hk - 1) / 2) + t_off  # centred, then shifted by the scaled time
        w_off = wi - torch.floor((wk - 1) / 2) + t_off
        offset = torch.stack([t_off, h_off, w_off])
        extent = (t - 1) * blocks.scale + 1  # the text continues at the last t + 1
    elif scheme == "vrope":
        hi_flip, wi_flip = hk - 1 - hi, wk - 1 - wi
        offset = torch.stack([hi + wi, hi + wi_flip, hi_flip + wi, hi_flip + wi_flip])
        offset = offset + ti * (hk + wk - 1)  # frame f at f (H + W - 1)
        extent = t * (h + w - 1)
    elif scheme == "v2pe":
        offset = ((local + 1) * blocks.delta[k] - 1).unsqueeze(0)  # previous token + step, + 2 step, ...
        extent = torch.ceil(counts.to(f64) * blocks.delta)  # text resumes at ceil(last visual) + 1
    elif scheme == "flat":
        offset = local.unsqueeze(0)
        extent = counts.to(f64)
    else:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    return offset, extent, use_start


def token_positions(
    real: Tensor,
    blocks: VisionBlocks,
    scheme: str,
    tokens_per_second: float = 2,
    temporal_stride: int = 1,
    advance: str = "max",
) -> tuple[Tensor, Tensor]:
    """Positions of every token of a padded batch under ``scheme``, vectorised over the batch.

    Args:
        real: ``(B, L)`` bool, ``False`` on padding.
        blocks: the vision blocks and their tokens; every other real token is text.
        scheme: one of :data:`SCHEMES`.
        tokens_per_second: Qwen2.5-VL temporal resolution (``qwen2.5-vl`` only).
        temporal_stride: MRoPE-I temporal stride (``mrope-i`` only).
        advance: ``"max"`` (text after a block continues at the block's maximum over all axes
            + 1) or ``"spatial"`` (transformers >= 5.3: ``start + max(h, w)``, time ignored).

    Returns:
        ``pos`` ``(A, B, L)`` float64 (zero on padding) and ``next`` ``(B,)`` float64, the
        position the token after each sample gets.

    A text token advances the position by 1 and a vision block by its *extent*; a unit
    starts at the running sum of what came before it (one ``cumsum`` along ``L``).
    """
    if advance not in ADVANCES:
        raise ValueError(f"advance must be one of {ADVANCES}, got {advance!r}")
    offset, extent, use_start = _block_offsets(blocks, scheme, tokens_per_second, temporal_stride, advance)
    b, length = real.shape
    counts = blocks.grid.prod(-1)
    block_first = blocks.token_index[counts.cumsum(0) - counts]  # flat index of each block's first token

    is_real = real.reshape(-1).to(torch.float64)  # (B * L,) 1 on real tokens, 0 on padding
    adv = is_real.clone()  # 1 per text token ...
    adv.index_fill_(0, blocks.token_index, 0)  # ... vision tokens count through their block:
    adv[block_first] = extent  # the block's extent, once
    cum = adv.view(b, length).cumsum(dim=1).view(-1)  # (B * L,)
    block_start = cum[block_first] - extent  # (K,)

    text = (cum - 1) * is_real  # text positions, 0 on padding
    pos = text.unsqueeze(0).repeat(use_start.shape[0], 1)  # (A, B * L): all axes equal
    token_start = torch.repeat_interleave(block_start, counts, output_size=blocks.token_index.shape[0])
    pos.index_copy_(1, blocks.token_index, token_start * use_start.unsqueeze(1) + offset)  # (A, Nv) vision
    return pos.view(-1, b, length), cum.view(b, length)[:, -1]


# --------------------------------------------------------------------------- build
def _check_scheme_options(
    scheme: str, delta: float | None, temporal_scale: float | None, training: bool
) -> tuple[float, float]:
    """Returns ``(delta, temporal_scale)`` with the scheme's defaults filled in."""
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    if delta is not None and scheme != "v2pe":
        raise ValueError(f"delta applies only to scheme='v2pe', got delta={delta!r} for scheme={scheme!r}")
    if temporal_scale is not None and scheme not in ("hope", "mrope-i"):
        raise ValueError(f"temporal_scale applies only to 'hope' and 'mrope-i', got it for scheme={scheme!r}")
    if scheme == "v2pe":
        if training and delta is not None:
            raise ValueError("delta must be None when training=True (V2PE draws it per image)")
        if not training and not (isinstance(delta, (int, float)) and not isinstance(delta, bool) and 0 < delta <= 1):
            raise ValueError(f"delta must be a number in (0, 1] for scheme='v2pe' at evaluation, got {delta!r}")
    if scheme == "hope":
        if training and temporal_scale is not None:
            raise ValueError("temporal_scale must be None when training=True (HoPE draws it per block)")
        ok = isinstance(temporal_scale, (int, float)) and not isinstance(temporal_scale, bool)
        if not training and not (ok and math.isfinite(temporal_scale) and temporal_scale > 0):
            raise ValueError(
                f"temporal_scale must be a positive number for scheme='hope' at evaluation "
                f"(the reference makes the user choose it), got {temporal_scale!r}"
            )
    if scheme == "mrope-i":
        stride = 1 if temporal_scale is None else temporal_scale
        scale = float(_check_int(stride, "temporal_scale (the MRoPE-I temporal stride)", 1))
    elif scheme == "hope" and not training:
        scale = float(temporal_scale)  # type: ignore[arg-type]
    else:
        scale = 1.0
    return (1.0 if delta is None else float(delta)), scale


def build(
    samples: Sequence[Sequence[Segment]],
    scheme: str,
    *,
    spatial_merge_size: int = 2,
    padding_side: str = "right",
    tokens_per_second: float = 2,
    delta: float | None = None,
    temporal_scale: float | None = None,
    training: bool = False,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> Layout:
    """Positions of a batch of interleaved text / image / video samples.

    Args:
        samples: ``B`` samples, each a non-empty list of :class:`Text`, :class:`Image`,
            :class:`Video` segments; a vision segment holds ``t * (h / m) * (w / m)`` tokens
            (``m = spatial_merge_size``).
        scheme: one of :data:`SCHEMES` (rules in ``docs/layouts.md``).
        spatial_merge_size: patches merged per token along h and w (2 in Qwen-VL).
        padding_side: ``"right"`` or ``"left"``.
        tokens_per_second: ``qwen2.5-vl`` temporal resolution (2 in the released checkpoints).
        delta: ``v2pe`` visual step in ``(0, 1]`` at evaluation (``stride / 256``).
        temporal_scale: ``hope`` temporal scale ``s`` at evaluation (required), or the
            ``mrope-i`` temporal stride (int, default 1).
        training: ``v2pe`` draws ``delta`` per block from :data:`V2PE_DELTAS`, ``hope`` draws
            ``s`` per block from :data:`HOPE_SCALES`; other schemes ignore it.
        generator: random source for ``training``.
        device: where the tensors are built.

    Under ``qwen3-vl`` a :class:`Video` becomes ``t`` consecutive one-frame blocks; for the
    exact Qwen3-VL token layout write each frame as ``Text(timestamp tokens), Video((1, h, w))``.
    """
    delta_value, scale_value = _check_scheme_options(scheme, delta, temporal_scale, training)
    m = _check_int(spatial_merge_size, "spatial_merge_size", 1)
    if padding_side not in ("right", "left"):
        raise ValueError(f"padding_side must be 'right' or 'left', got {padding_side!r}")
    tps = tokens_per_second
    if isinstance(tps, bool) or not isinstance(tps, (int, float)) or not (math.isfinite(tps) and tps > 0):
        raise ValueError(f"tokens_per_second must be a positive number, got {tokens_per_second!r}")
    if isinstance(samples, (str, bytes)) or not isinstance(samples, Sequence) or not samples:
        raise ValueError("samples must be a non-empty list of samples (lists of segments)")

    # one row per segment: sample, modality, tokens, t, h, w (merged); seconds per grid
    rows: list[tuple[int, int, int, int, int, int]] = []
    seconds: list[float] = []
    for i, sample in enumerate(samples):
        if isinstance(sample, (str, bytes)) or not isinstance(sample, Sequence) or not sample:
            raise ValueError(f"samples[{i}] must be a non-empty list of segments, got {sample!r}")
        for j, seg in enumerate(sample):
            if isinstance(seg, Text):
                rows.append((i, int(Modality.TEXT), seg.n, 0, 0, 0))
                seconds.append(0.0)
                continue
            if not isinstance(seg, (Image, Video)):
                raise ValueError(f"samples[{i}][{j}] must be a Text, Image or Video segment, got {seg!r}")
            t, h, w = seg.grid_thw
            if h % m or w % m:
                raise ValueError(
                    f"samples[{i}][{j}].grid_thw={seg.grid_thw}: h and w must be divisible by "
                    f"spatial_merge_size={m}"
                )
            h, w = h // m, w // m
            if isinstance(seg, Image):
                rows.append((i, int(Modality.IMAGE), t * h * w, t, h, w))
                seconds.append(0.0)  # images get no temporal scaling
            else:
                frame_t, n_blocks = (1, t) if scheme == "qwen3-vl" else (t, 1)  # Qwen3-VL: one block per frame
                rows.extend([(i, int(Modality.VIDEO), frame_t * h * w, frame_t, h, w)] * n_blocks)
                seconds.extend([1.0 if seg.second_per_grid is None else float(seg.second_per_grid)] * n_blocks)

    seg = torch.tensor(rows, dtype=torch.long, device=device)  # (S, 6)
    seg_sample, seg_kind, seg_len = seg[:, 0], seg[:, 1], seg[:, 2]
    batch = len(samples)
    sample_len = torch.zeros(batch, dtype=torch.long, device=device).index_add_(0, seg_sample, seg_len)
    length = int(sample_len.max())

    # where each segment starts in the padded (B, L) batch, as a flat index b * L + l
    seg_offset = seg_len.cumsum(0) - seg_len  # tokens before the segment, over the whole batch
    row_offset = (sample_len.cumsum(0) - sample_len)[seg_sample]  # ... before its sample
    pad = (length - sample_len)[seg_sample] if padding_side == "left" else 0
    seg_flat = seg_sample * length + pad + seg_offset - row_offset
    cols = torch.arange(length, device=device)
    if padding_side == "right":
        real = cols < sample_len.unsqueeze(1)
    else:
        real = cols >= (length - sample_len).unsqueeze(1)

    # vision tokens, block after block: flat index = segment start + index inside it
    is_vision_seg = seg_kind != int(Modality.TEXT)
    counts = seg_len[is_vision_seg]
    nv = int(counts.sum())
    first = counts.cumsum(0) - counts
    token_index = torch.arange(nv, device=device)
    token_index += torch.repeat_interleave(seg_flat[is_vision_seg] - first, counts, output_size=nv)
    modality = torch.full((batch * length,), int(Modality.TEXT), dtype=torch.long, device=device)
    modality[token_index] = torch.repeat_interleave(seg_kind[is_vision_seg], counts, output_size=nv)

    k = int(is_vision_seg.sum())
    def per_block(choices: tuple[float, ...], value: float, draw: bool) -> Tensor:
        if draw:  # one choice per block
            return torch.tensor(choices, dtype=torch.float64)[torch.randint(len(choices), (k,), generator=generator)]
        return torch.full((k,), value, dtype=torch.float64)

    delta_t = per_block(V2PE_DELTAS, delta_value, training and scheme == "v2pe")
    scale_t = per_block(HOPE_SCALES, scale_value, training and scheme == "hope")
    blocks = VisionBlocks(
        grid=seg[is_vision_seg, 3:6],
        second_per_grid=torch.tensor(seconds, dtype=torch.float32, device=device)[is_vision_seg],
        delta=delta_t.to(device),
        scale=scale_t.to(device),
        token_index=token_index,
    )
    stride = int(scale_value) if scheme == "mrope-i" else 1
    pos, nxt = token_positions(real, blocks, scheme, tokens_per_second, stride)
    return _layout(pos, nxt, real, modality.view(batch, length), scheme)


def _layout(pos: Tensor, nxt: Tensor, real: Tensor, modality: Tensor, scheme: str) -> Layout:
    """Package float64 positions ``(A, B, L)`` into a :class:`Layout` with per-scheme dtypes."""
    length = real.shape[1]
    coord_dtype = torch.float64 if scheme == "v2pe" else torch.float32
    id_dtype = {"v2pe": torch.float64, "hope": torch.float32}.get(scheme, torch.long)
    ids = pos.masked_fill(~real, 1).to(id_dtype)  # (A, B, L), 1 on padding
    if ids.shape[0] == 1:
        ids = ids.expand(3, -1, -1).contiguous()
    deltas = (nxt - length).unsqueeze(1).to(torch.float32 if scheme == "hope" else torch.long)
    coord_pos = pos.permute(1, 2, 0).to(coord_dtype).contiguous()  # (B, L, A)
    coords = Coords(coord_pos, SCHEME_AXES[scheme], mask=real, modality=modality)
    return Layout(ids, deltas, real.long(), modality, coords, scheme)
