"""Interleaved text + image + video sequences to positions (the multimodal *layout*).

A sample is a list of segments -- :class:`Text` ``(n)``, :class:`Image` ``(grid_thw)``,
:class:`Video` ``(grid_thw, second_per_grid)`` with grids in vision patches *before*
the spatial merge -- and :func:`build` turns a batch of samples into a :class:`Layout`
under one *scheme* of the registry :mod:`mmpos.schemes` (how positions advance):

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

:func:`build` (segments) and the token-id path (:func:`mmpos.integrations.hf_rope_index.get_rope_index`)
are two front ends of one packer, :func:`pack`, and return the same :class:`Layout`
(``mhrope-qwen2-vl``, MHRoPE on Qwen2-VL positions, is shaped as ``mhrope``).
:meth:`Layout.packed` gives a batch as one packed row with ``cu_seqlens``.

Conventions shared with the rotary encoders (:mod:`mmpos.encoders.mrope`):

* ``position_ids[a, b, n] == coords.pos[b, n, a]`` on real tokens for every
  multi-axis scheme; 1-axis schemes (``flat``, ``v2pe``) repeat their single row three
  times so that a Qwen2-VL-family model reads them as 1-D RoPE.
* Padding: ``position_ids`` holds the rule's padding value there (``1``, the Hugging Face
  convention before 5.3; ``0`` under ``rule="hf-5.3"``), ``coords.pos`` holds ``0`` and
  ``coords.mask`` is ``False``.
* Text tokens carry the same value on every axis, so every scheme reduces to 1-D RoPE
  on text-only input (positions ``0 .. L - 1`` on every axis).
* ``vrope``: axis ``c{k}`` is the position seen by rotary pair ``p`` with
  ``p mod 4 == k``; for vision token ``(i, j)`` of an ``H x W`` frame the four axes hold
  ``i + j``, ``i + (W-1-j)``, ``(H-1-i) + j``, ``(H-1-i) + (W-1-j)`` (plus the frame offset).
* ``coords.pos`` is float32, except ``v2pe`` (float64, so fractional steps such as
  ``1/256`` stay exact at ``10**6`` tokens) and layouts whose positions pass ``2**24``
  (float64, so integer positions stay exact; float32 ``position_ids`` there warn once).
* ``rope_deltas`` ``(B, 1)``: next position minus ``L`` (int64; float32 for ``hope``,
  whose positions after a video may be fractional); during decoding the token at
  cache position ``c`` gets position ``c + rope_deltas`` on every axis
  (:func:`decode_position_ids`). Under ``rule="hf-5.3"`` it is the largest position + 1
  (never behind the next position) minus the number of real tokens, as transformers >= 5.3
  computes it for its own schemes.

New segment kinds plug in with :func:`register_segment` (``docs/adding-a-scheme.md``).
"""

from __future__ import annotations

import dataclasses
import math
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache, cached_property, lru_cache, partial

import numpy as np
import torch
from torch import Tensor

from ._arrays import host
from ._validate import FLOAT32_EXACT, check_bytes, check_float, check_int, warn_once
from .coords import Coords, Modality
from .schemes import SCHEMES, BlockGeometry, Rule, Scheme, SchemeOptions, get_rule, get_scheme, resolve_options

__all__ = [
    "Image",
    "Layout",
    "Text",
    "Unit",
    "Video",
    "VisionBlocks",
    "build",
    "decode_position_ids",
    "pack",
    "register_segment",
]


def _check_int(value: object, name: str, minimum: int) -> int:
    return check_int(value, name, minimum)


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
        object.__setattr__(self, "_row", array("q", (0, self.n, 0, 0, 0, 0)).tobytes())  # build's unit row


@dataclass(frozen=True)
class Image:
    """An image of ``grid_thw`` vision patches (``t`` is 1 for a still image)."""

    grid_thw: tuple[int, int, int]

    def __post_init__(self) -> None:
        object.__setattr__(self, "grid_thw", _check_grid(self.grid_thw, "Image.grid_thw"))
        object.__setattr__(self, "_row", array("q", (int(Modality.IMAGE), 0, *self.grid_thw, 1)).tobytes())


@dataclass(frozen=True)
class Video:
    """A clip of ``grid_thw`` patches; ``second_per_grid`` seconds per temporal patch
    (``temporal_patch_size / fps``; ``None`` means 1 second, as transformers assumes)."""

    grid_thw: tuple[int, int, int]
    second_per_grid: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "grid_thw", _check_grid(self.grid_thw, "Video.grid_thw"))
        check_float(self.second_per_grid, "Video.second_per_grid", strict=False, none_ok=True)


Segment = Text | Image | Video


@dataclass(frozen=True)
class Unit:
    """What a segment contributes to the packer: ``tokens`` text tokens (``grid`` ``None``),
    or one vision block of ``grid`` ``(t, h, w)`` tokens (after the spatial merge) with its
    :class:`~mmpos.coords.Modality` code and ``seconds`` per temporal patch."""

    modality: int
    tokens: int
    grid: tuple[int, int, int] | None = None
    seconds: float = 0.0


#: segment class -> ``units(segment, scheme, spatial_merge_size, where) -> list[Unit]``
_SEGMENT_KINDS: dict[type, Callable[[object, Scheme, int, str], list[Unit]]] = {}


def register_segment(cls: type, units: Callable[[object, Scheme, int, str], list[Unit]]) -> None:
    """Teach :func:`build` a new segment class: ``units(segment, scheme, merge, where)``
    returns its :class:`Unit` list (``where`` names the segment in error messages)."""
    if not isinstance(cls, type):
        raise TypeError(f"cls must be a class, got {cls!r}")
    _SEGMENT_KINDS[cls] = units


def _merged(seg: Image | Video, m: int, where: str) -> tuple[int, int, int]:
    t, h, w = seg.grid_thw
    if h % m or w % m:
        raise ValueError(f"{where}.grid_thw={seg.grid_thw}: h and w must be divisible by spatial_merge_size={m}")
    return t, h // m, w // m


def _text_units(seg: Text, scheme: Scheme, m: int, where: str) -> list[Unit]:
    return [Unit(int(Modality.TEXT), seg.n)]


def _image_units(seg: Image, scheme: Scheme, m: int, where: str) -> list[Unit]:
    t, h, w = _merged(seg, m, where)
    return [Unit(int(Modality.IMAGE), t * h * w, (t, h, w))]  # images get no temporal scaling


def _video_units(seg: Video, scheme: Scheme, m: int, where: str) -> list[Unit]:
    t, h, w = _merged(seg, m, where)
    seconds = 1.0 if seg.second_per_grid is None else float(seg.second_per_grid)
    if scheme.frames:  # Qwen3-VL: one block per frame
        return [Unit(int(Modality.VIDEO), h * w, (1, h, w), seconds)] * t
    return [Unit(int(Modality.VIDEO), t * h * w, (t, h, w), seconds)]


register_segment(Text, _text_units)
register_segment(Image, _image_units)
register_segment(Video, _video_units)


@dataclass(frozen=True, eq=False)
class Layout:
    """Positions of a batch of interleaved sequences (``B`` samples padded to ``L`` tokens).

    Attributes:
        position_ids: ``(3, B, L)`` (``(4, B, L)`` for ``vrope``): one row per axis (1-axis
            schemes repeat it three times); the rule's padding value on padding.
        rope_deltas: ``(B, 1)`` next position minus ``L`` (int64; float32 for ``hope``);
            under ``rule="hf-5.3"`` max(largest position + 1, next) minus the real length.
        attention_mask: ``(B, L)`` int64, 1 on real tokens (as HF models expect); built on
            first read, then cached (as ``modality`` and ``coords``).
        modality: ``(B, L)`` int64 :class:`~mmpos.coords.Modality` codes (padding: ``TEXT``).
        scheme: the scheme name.
        rule: the :class:`~mmpos.schemes.Rule` it was built with (a :data:`mmpos.schemes.RULES`
            entry, or a name of one).
        coords: the same positions as a :class:`~mmpos.coords.Coords` (``pos`` ``(B, L, A)``,
            axes ``SCHEMES[scheme].axes``, ``mask`` = real tokens); built from
            ``position_ids`` (or the packer's float64 positions, for fractional schemes) when
            first read, then cached.
        num_vision_tokens: how many tokens of the batch are vision tokens (of any block).
    """

    position_ids: Tensor
    rope_deltas: Tensor
    scheme: str
    rule: Rule | str = "original"
    num_vision_tokens: int = 0
    #: internal: the packer's host ``real`` ``(B, L)`` bool and a function making the ``(B, L)`` modality codes
    _masks: tuple[np.ndarray, Callable[[], np.ndarray]] | None = field(default=None, repr=False)
    #: internal: the packer's float64 positions ``(text (B, L), vision (A, Nv), is_vision (B, L))``
    #: of a fractional scheme (``None``: ``position_ids`` holds them exactly)
    _parts: tuple[Tensor, Tensor, Tensor] | None = field(default=None, repr=False)

    @cached_property
    def attention_mask(self) -> Tensor:
        return torch.from_numpy(self._masks[0].astype(np.int64)).to(self.position_ids.device)

    @cached_property
    def modality(self) -> Tensor:
        real, codes = self._masks
        return torch.from_numpy(codes().astype(np.int64).reshape(real.shape)).to(self.position_ids.device)

    @cached_property
    def coords(self) -> Coords:
        sch = get_scheme(self.scheme)
        a = len(sch.axes)
        real = self._masks[0]  # (B, L) bool, on the host
        if self._parts is None:  # position_ids hold the positions exactly (integers below 2**53)
            exact = host(self.position_ids[:a]).transpose(1, 2, 0)  # (B, L, A) view
        else:  # the packer's float64 positions (position_ids may be float32)
            text, vision, is_vision = (p.numpy() for p in self._parts)
            exact = np.empty((*real.shape, a), dtype=np.float64)
            exact[...] = text[..., None]
            exact[is_vision] = vision.T
        dtype, on_real = sch.coord_dtype, exact[real]  # (N, A)
        if dtype == torch.float32 and on_real.size and np.abs(on_real).max() > FLOAT32_EXACT:
            dtype = torch.float64  # as the Coords builders: float32 would merge neighbouring integer positions
        pos = np.empty((*real.shape, a), dtype=torch.empty(0, dtype=dtype).numpy().dtype)  # (B, L, A)
        np.copyto(pos, exact, casting="unsafe")  # one rounding
        pos[~real] = 0
        device = self.position_ids.device
        mask = torch.from_numpy(real.copy()).to(device)
        return Coords(torch.from_numpy(pos).to(device), sch.axes, mask=mask, modality=self.modality, _trusted=True)

    def _hf_deltas(self) -> Tensor:
        """``rope_deltas`` relative to the padded length (what :func:`decode_position_ids` reads)."""
        if get_rule(self.rule).deltas == "max-real":
            length = self.attention_mask.shape[1]
            return self.rope_deltas + (self.attention_mask.sum(1, keepdim=True) - length).to(self.rope_deltas.dtype)
        return self.rope_deltas

    def decode(self, num_new: int = 1, cache_position: Tensor | int | None = None) -> Tensor:
        """Positions of ``num_new`` tokens generated after this batch (``cache_position``
        defaults to ``L``); same row count as :attr:`position_ids`."""
        start = self.attention_mask.shape[1] if cache_position is None else cache_position
        return decode_position_ids(self._hf_deltas(), start, num_new, rows=self.position_ids.shape[0])

    def hf_position_ids(self, shape: str = "3d") -> Tensor:
        """Position ids for a Hugging Face Qwen-VL model patched with this scheme
        (:func:`mmpos.integrations.hf_rope.use_rope`): ``model(..., position_ids=...)``.

        ``shape``: ``"3d"`` ``(3, B, L)``, the scheme's rows packed as the model reads them
        (VRoPE: ``c0, c1, c2``; 1-axis schemes: three equal rows); ``"4d"`` ``(4, B, L)``,
        a text row first (``attention_mask.cumsum - 1``, 0 on padding, as ``generate``
        builds it; used for packed sequences and masks); ``"text"`` ``(B, L)``, that row.
        """
        if shape not in ("3d", "4d", "text"):
            raise ValueError(f"shape must be '3d', '4d' or 'text', got {shape!r}")
        if shape != "3d":
            text = (self.attention_mask.cumsum(-1) - 1).masked_fill(self.attention_mask == 0, 0)  # (B, L)
            if shape == "text":
                return text
        sch = get_scheme(self.scheme)
        try:
            picks = _hf_row_axes(sch.hf_rows)
        except TypeError:  # rows that are not hashable (lists): worked out at every call
            picks = _hf_row_axes.__wrapped__(sch.hf_rows)
        if picks is not None:  # every row reads one axis: position_ids holds it (same padding and dtype)
            ids = self.position_ids if picks == tuple(range(len(self.position_ids))) else self.position_ids[list(picks)]
        else:
            pos = self.coords.pos.permute(2, 0, 1).to(torch.float64)  # (A, B, L)
            weights = torch.tensor(sch.hf_rows, dtype=torch.float64, device=pos.device)
            rows = torch.einsum("ra,abl->rbl", weights, pos)
            ids = rows.masked_fill(self.attention_mask == 0, get_rule(self.rule).padding_value).to(
                self.position_ids.dtype
            )
        if shape == "3d":
            return ids
        return torch.cat([text.to(ids.dtype).unsqueeze(0), ids])

    def packed(self, shape: str = "4d") -> tuple[Tensor, Tensor, int]:
        """The batch as one packed row, for FlashAttention's varlen kernels and transformers'
        packed-sequence path: ``(position_ids, cu_seqlens, max_seqlen)``.

        ``position_ids``: the real tokens of every sample, sample after sample (padding dropped):
        ``"4d"`` ``(4, 1, N)``, a text row first that restarts at 0 at every sample (from which
        transformers finds the sample boundaries), then the scheme's three rows; ``"3d"``
        ``(3, 1, N)``. ``cu_seqlens`` ``(B + 1,)`` int32 sample offsets into the row (0, then the
        running sum of the real lengths), ``max_seqlen`` the longest sample. Each sample's
        positions are those it has alone (positions never depend on the other samples).
        """
        if shape not in ("3d", "4d"):
            raise ValueError(f"shape must be '3d' or '4d', got {shape!r}")
        real = self.attention_mask.bool()  # (B, L)
        ids = self.hf_position_ids(shape)  # (R, B, L)
        flat = ids[:, real].unsqueeze(1)  # (R, 1, N), row-major: sample after sample
        lengths = real.sum(1)
        cu_seqlens = torch.zeros(real.shape[0] + 1, dtype=torch.int32, device=real.device)
        cu_seqlens[1:] = lengths.cumsum(0)
        return flat, cu_seqlens, int(lengths.max()) if lengths.numel() else 0


@lru_cache(maxsize=64)
def _hf_row_axes(hf_rows: tuple[tuple[int, ...], ...]) -> tuple[int, ...] | None:
    """The axis each Hugging Face row reads where every row of ``hf_rows`` (``Scheme.hf_rows``) is a unit vector,
    else ``None`` (rows mixing axes: VRoPE's)."""
    picks = [row.index(1) if sorted(row) == [0] * (len(row) - 1) + [1] else None for row in hf_rows]
    return None if None in picks else tuple(picks)


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
    if isinstance(cache_position, Tensor):  # its dtype and size only: a value check would sync the device
        c = cache_position
        if not c.numel() or c.is_floating_point() or c.is_complex() or c.dtype == torch.bool:
            raise ValueError(
                f"cache_position must be an int >= 0 or a non-empty integer tensor, got {c.dtype} {tuple(c.shape)}"
            )
        start = c.reshape(-1)[:1].to(rope_deltas.device)  # (1,)
    else:
        start = torch.tensor([_check_int(cache_position, "cache_position", 0)], device=rope_deltas.device)
    steps = torch.arange(num_new, device=rope_deltas.device)
    pos = rope_deltas + (start + steps).to(rope_deltas.dtype)  # (B, 1) + (num_new,) -> (B, num_new)
    return pos.unsqueeze(0).expand(rows, -1, -1)


# --------------------------------------------------------------------------- the packer
@dataclass(frozen=True, eq=False)
class VisionBlocks:
    """The vision blocks of a padded ``(B, L)`` batch (an image, a video, or a Qwen3-VL video
    frame each): what :func:`pack` needs to know about them.

    Attributes:
        grid: ``(K, 3)`` int64 ``(t, h, w)`` in tokens, i.e. *after* the spatial merge.
        first: ``(K,)`` int64 flat index ``b * L + l`` of each block's first token; a block's
            ``t * h * w`` tokens are consecutive tokens of one sample, in raster order (t, h, w).
            Blocks may be listed in any order; they must not overlap.
        seconds: ``(K,)`` float32 seconds per temporal patch (0 for images; default all 0).
        is_image: ``(K,)`` bool, ``True`` for still images (default all ``False``).
        audio: ``(K,)`` int64 tokens of each block besides its ``t * h * w`` video tokens: an
            *audio-visual* block (Qwen-Omni ``use_audio_in_video``) holds a video's tokens and its
            audio's, interleaved by time in the order the scheme's block rule gives (the block spans
            ``t * h * w + audio`` consecutive tokens). Only schemes with ``Scheme.audio`` take them
            (default all 0; ``docs/layouts.md``, audio).

    Tensors or NumPy arrays; checked (shapes, sizes, overlaps) by :func:`pack`, which knows ``L``.
    """

    grid: Tensor | np.ndarray
    first: Tensor | np.ndarray
    seconds: Tensor | np.ndarray | None = None
    is_image: Tensor | np.ndarray | None = None
    audio: Tensor | np.ndarray | None = None


def _float64(t: Tensor | np.ndarray) -> np.ndarray:
    """A float64 NumPy view (or copy) of ``t`` on the host."""
    return host(t.to(torch.float64)) if isinstance(t, Tensor) else np.asarray(t, dtype=np.float64)


def _per_block(sch: Scheme, name: str, value: float | None, options: SchemeOptions, k: int, generator):
    """``(K,)`` float64: a random choice per block while training (blocks in reading order, so
    both front ends draw alike), else ``value`` (default 1)."""
    if options.training and name in sch.draws:
        choices = torch.tensor(sch.draws[name], dtype=torch.float64)
        return choices[torch.randint(len(choices), (k,), generator=generator)]
    return torch.from_numpy(np.full(k, _one(value)))


def _one(value: float | None) -> float:
    """A per-block value without draws (:func:`_per_block`): ``value``, default 1."""
    return 1.0 if value is None else float(value)


def _check_blocks(blocks: VisionBlocks, real: np.ndarray) -> tuple:
    """Host ``grid (K, 3)``, ``first (K,)``, ``seconds (K,)`` float32 and ``is_image (K,)`` of
    ``blocks``, in reading order (sorted by ``first``), ``is_vision``: a function making the ``(B, L)``
    mask of the blocks' tokens (built only where a path reads it), ``audio (K,)`` (``None``: no audio) and
    ``changes (E,)``, the flat indices where ``real`` changes; checked."""
    if not isinstance(blocks, VisionBlocks):
        raise TypeError(f"blocks must be a VisionBlocks, got {type(blocks).__name__}")
    grid, first = host(blocks.grid), host(blocks.first)
    if grid.ndim != 2 or grid.shape[1] != 3 or grid.dtype.kind not in "iu":
        raise ValueError(f"blocks.grid must be an integer (K, 3) tensor, got {grid.dtype} {grid.shape}")
    k = grid.shape[0]
    if first.shape != (k,) or (k and first.dtype.kind not in "iu"):
        raise ValueError(
            f"blocks.first must be an integer ({k},) tensor, one per block, got {first.dtype} {first.shape}"
        )
    grid, first = grid.astype(np.int64, copy=False), first.astype(np.int64, copy=False)
    seconds = np.zeros(k, dtype=np.float32) if blocks.seconds is None else host(blocks.seconds)
    is_image = np.zeros(k, dtype=bool) if blocks.is_image is None else host(blocks.is_image)
    for name, v in (("seconds", seconds), ("is_image", is_image)):
        if v.shape != (k,):
            raise ValueError(f"blocks.{name} must have shape ({k},), one value per block, got {v.shape}")
    if is_image.dtype != bool:
        raise ValueError(f"blocks.is_image must be bool, got {is_image.dtype}")
    audio = None if blocks.audio is None else host(blocks.audio)
    if audio is not None:
        if audio.shape != (k,) or (k and audio.dtype.kind not in "iu") or (audio < 0).any():
            raise ValueError(
                f"blocks.audio must be ({k},) integers >= 0, one per block, got {audio.dtype} {audio.shape}"
            )
        audio = audio.astype(np.int64, copy=False)
    if k and grid.min() < 1:
        raise ValueError("blocks.grid must hold sizes >= 1")
    counts = grid[:, 0] * grid[:, 1] * grid[:, 2]  # (K,) tokens per block (>= 1)
    if audio is not None:
        counts += audio
    last = first + counts - 1
    # each block starts after the last one's end: in reading order (first increases) and no overlap, one check
    disjoint = k < 2 or bool((first[1:] > last[:-1]).all())
    if not disjoint and not (first[1:] > first[:-1]).all():  # listed out of reading order: sort (stable)
        order = first.argsort(kind="stable")
        grid, first, counts, last = grid.take(order, axis=0), first.take(order), counts.take(order), last.take(order)
        seconds = seconds if blocks.seconds is None else seconds.take(order)  # (the default zeros need no gather)
        is_image = is_image if blocks.is_image is None else is_image.take(order)
        audio = None if audio is None else audio.take(order)
    b, length = real.shape
    if k and (first[0] < 0 or last[-1] >= b * length):
        raise ValueError(f"blocks.first: the blocks' tokens must lie in the (B, L) = {(b, length)} batch")
    if k and ((first // length != last // length).any() or not (disjoint or (first[1:] > last[:-1]).all())):
        raise ValueError(
            "blocks: every block's tokens must be consecutive tokens of one sample, and blocks must not overlap"
        )
    flat = real.reshape(-1)
    changes = _changes(flat)  # (E,) where real changes
    # a block lies on real tokens: its first one is real, and real does not change after it inside the block
    if k and not (flat[first].all() and _same_side(changes, first, last)):
        raise ValueError("blocks: every vision token must be a real token (real is True there)")
    is_vision = partial(_vision_mask, b, length, first, counts)
    return grid, first, seconds.astype(np.float32, copy=False), is_image, is_vision, audio, changes, counts


def _same_side(changes: np.ndarray, first: np.ndarray, last: np.ndarray) -> bool:
    """Whether no change (``changes`` ``(E,)``, increasing) lies in ``(first, last]`` of any block (``(K,)`` each):
    both ends searched in one call."""
    k = first.shape[0]
    ends = np.empty(2 * k, dtype=np.int64)
    ends[:k], ends[k:] = first, last
    at = changes.searchsorted(ends, "right")
    return bool((at[:k] == at[k:]).all())


def _changes(flat: np.ndarray) -> np.ndarray:
    """``(E,)`` int64 the indices ``i >= 1`` where ``flat[i] != flat[i - 1]`` (``flat`` ``(N,)`` bool), increasing:
    one comparison and NumPy's bool ``nonzero`` (its SIMD count and scan; reading the comparison's bytes as
    uint64 words first measured 2x slower, 40 against 20 us on a 91k-token batch)."""
    at = np.not_equal(flat[1:], flat[:-1]).nonzero()[0]
    at += 1
    return at


def _vision_mask(b: int, length: int, first: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``(B, L)`` bool: the tokens of the blocks (``first``, ``counts``: checked, in reading order)."""
    k = first.shape[0]
    # the batch as runs: a gap of non-block tokens before each block, the block, and the gap after the last
    runs = np.empty(2 * k + 1, dtype=np.int64)
    runs[1::2] = counts
    runs[0:-1:2] = first - np.concatenate([[0], first[:-1] + counts[:-1]])
    runs[-1] = b * length - (first[-1] + counts[-1] if k else 0)
    run_is_block = np.zeros(2 * k + 1, dtype=bool)
    run_is_block[1::2] = True
    return np.repeat(run_is_block, runs).reshape(b, length)  # (B, L): a few long runs, memset-like


def _settle_starts(sch, geometry, options, text, block_first):
    """``sch.block`` of ``geometry`` with ``BlockGeometry.start`` = the running position at each block's first
    token (text tokens before it in its sample + the extents of its sample's earlier blocks). The extents are
    asked for again with the starts they give until they settle: a block's start depends only on the blocks
    before it, so the ``i``-th block of every sample is fixed after ``i + 1`` calls. A scheme with
    ``Scheme.extent`` answers from its blocks alone, and ``block`` places the tokens once, at the settled starts;
    otherwise every call is ``block``'s (its last one is kept)."""
    length = text.shape[1]
    text_before = np.cumsum(text, axis=1).reshape(-1) - text.reshape(-1)  # (B * L,) text tokens before each token
    sample = block_first // length  # (K,) blocks in reading order
    per_sample = np.bincount(sample, minlength=text.shape[0])
    sample_first = (np.cumsum(per_sample) - per_sample)[sample]  # (K,) the first block of each block's sample

    def ask(g):  # (K,) float64 extents at g's starts, and block's whole answer where it gave them
        placed = sch.block(g, options) if sch.extent is None else None
        got = host(torch.as_tensor(sch.extent(g, options) if placed is None else placed[1]).to(torch.float64))
        if got.shape != block_first.shape:
            raise ValueError(
                f"scheme {sch.name!r}: its rule gave extents {got.shape}, the blocks are {block_first.shape}"
            )
        return got, placed

    g = geometry
    extent, placed = ask(g)
    for _ in range(int(per_sample.max()) + 1):
        done = np.cumsum(extent) - extent  # (K,) extents of the blocks before, over the whole batch ...
        done = done - done[sample_first]  # ... minus those of earlier samples
        g = dataclasses.replace(geometry, start=torch.from_numpy(text_before[block_first] + done))
        new, placed = ask(g)
        if np.array_equal(new, extent):
            break
        extent = new
    offset, _, use_start = sch.block(g, options) if placed is None else placed
    return offset, torch.from_numpy(extent), use_start


def _exact_sum(sch: Scheme, tokens: int, extent: np.ndarray) -> bool:
    """Whether integer ids of ``sch`` can hold the running positions exactly: integer extents whose sum with the
    ``tokens`` stays below 2**53 (the int64 sum then equals the float64 one)."""
    return not sch.id_dtype.is_floating_point and bool(
        (np.floor(extent) == extent).all() and np.abs(extent).sum() + tokens < 2**53
    )


def _write_runs(
    ids, real, vision_mask, changes, grid, block_first, counts, row_block, base, step, use_start, extent, pad, tops
):
    """Write the integer ids of a per-row rule (``Scheme.rows``) into ``ids`` ``(A, B * L)``.

    Every token lies in a *run* whose values start at a known value and step by a fixed amount per
    axis: a run of text (step 1 on every axis), of padding (step 0, the padding value) or a row of a
    vision block (token ``j`` of row ``r`` of block ``k`` at ``block_start[k] * use_start + base[:, r]
    + step * j``). Each axis is one ``cumsum`` over the flat batch of its per-token steps (1 on text,
    ``step`` on vision, 0 on padding) in which each run's first token holds its jump from the token
    before (a sample's first token: from the last token of the sample before): a mask copied once per
    distinct step, a scatter of a few thousand jumps and a ``cumsum`` per axis. The runs are found from the
    edges of ``real`` (``changes``, where it changes) and the blocks (no index per token); every value is
    computed per run, in int64 after the finiteness check (exact). Inside a block the jump from one row to the
    next is ``base``'s difference minus the row's span (the block start cancels), so only each block's first
    and last values add it. Small per-axis values (steps, ``use_start``) are read as Python numbers.

    Returns ``(nxt (B,), top (B,) or None, n_real (B,))`` int64: the next position after each sample, the
    largest position of each sample (text or vision, any axis; when ``tops``, for the ``"max-real"``
    deltas) and real tokens per sample."""
    b, length = real.shape
    n = b * length
    a_n = base.shape[0]
    block_w = grid[:, 2]  # (K,) tokens per row of each block
    rows_k = grid[:, 0] * grid[:, 1]  # (K,) rows per block
    row_end = rows_k.cumsum()  # (K,) one past each block's last row
    block_row = row_end - rows_k  # (K,) each block's first row
    # the coarse runs: the batch cut at every sample start, where real changes and at every block's edges
    flat = real.reshape(-1)
    samples = np.arange(0, n, length)  # (B,) each sample's first token
    cuts = np.concatenate([samples, changes, block_first, block_first + counts, [n]])
    cuts.sort()
    keep = np.empty(cuts.shape[0], dtype=bool)
    keep[0] = True
    np.not_equal(cuts[1:], cuts[:-1], out=keep[1:])
    cuts = cuts[keep]  # (C + 1,) each run's first token, then n
    run_len = cuts[1:] - cuts[:-1]  # (C,)
    cuts = cuts[:-1]  # (C,)
    blk = cuts.searchsorted(block_first)  # (K,) each block's run
    first_run = cuts.searchsorted(samples)  # (B,) each sample's first run
    text = flat.take(cuts)  # (C,) real runs ...
    adv = run_len * text  # (C,) int64: real tokens of each run ...
    n_real = np.add.reduceat(adv, first_run)  # (B,)
    text[blk] = False  # ... but the blocks': text runs
    adv[blk] = extent  # ... how far each run moves the position (integers: the caller's _exact_sum)
    before = adv.cumsum()
    before -= adv  # (C,) exact: |sums| <= n + sum |extent| < 2**53
    pos = before - before.take(first_run).take(cuts // length)  # (C,) running position at each run's first token
    nxt = np.add.reduceat(adv, first_run)  # (B,) the position the token after each sample gets
    block_start = pos.take(blk)  # (K,)
    step_i = step.astype(np.int64)
    steps, us = step_i.tolist(), use_start.tolist()  # (A,) as Python numbers
    # |every running position| <= ends < 2**53 (the caller's _exact_sum), so none needs a finiteness check
    ends = float(np.abs(extent).sum()) + n
    # the values (A, R) of each row's first token: in int64 where base and use_start are integers and no sum
    # can reach 2**53, else in float64 (checked, then cast)
    spread = max(map(abs, steps)) * (int(block_w.max()) - 1)  # how far a row's last value is from its first
    integer = all(float(u).is_integer() for u in us)
    if integer:  # (an inf in a float base fails the comparison: the float64 path below refuses it)
        reach = max(abs(float(base.max())), abs(float(base.min()))) + max(map(abs, us)) * ends
        integer = reach + spread < 2**53
        if integer and base.dtype.kind not in "iu":
            base = base.astype(np.int64)  # exact: integers (checked by the caller) below 2**53
    row_w = block_w.take(row_block)  # (R,) tokens per row
    block_top = None
    if integer:
        # (A, R - 1) the jump from each row's last token to the next row's first: base's difference minus the
        # row's span (the block start cancels inside a block; a block's first row takes its run's jump below)
        row_jump = base[:, 1:] - base[:, :-1]
        if any(steps):
            span = row_w[:-1] - 1  # (R - 1,)
            for a, s in enumerate(steps):
                if s:
                    row_jump[a] -= span if s == 1 else s * span
        lift = block_start if all(u == 1 for u in us) else np.multiply.outer(np.array(us, dtype=np.int64), block_start)
        block_first_value = base.take(block_row, axis=1) + lift  # (A, K) each block's first token
        block_last_value = base.take(row_end - 1, axis=1) + lift  # (A, K) ... its last row's first token ...
        block_last_value += np.multiply.outer(step_i, block_w - 1)  # ... and last token
        if tops:  # each block's largest value on any axis (w is fixed along a block's rows)
            row_max = np.maximum.reduceat(base, block_row, axis=1) + lift  # (A, K)
            up = [max(s, 0) for s in steps]
            if any(up):
                row_max += np.multiply.outer(up, block_w - 1)
            block_top = row_max.max(0)  # (K,)
        near = False
    else:
        with np.errstate(all="ignore"):  # huge seconds: inf and NaN, refused here
            start = block_start.take(row_block).astype(np.float64)  # (R,)
            first = base + start if (use_start == 1).all() else base + use_start[:, None] * start  # (A, R)
            largest = float(np.abs(first).max())
        if not largest < 2**53:
            raise _not_finite()
        near = not largest + spread < 2**53  # the rows' last values then checked one by one
        first = first.astype(np.int64)
        row_span = row_w - 1  # (R,)
        last = [first[a] if s == 0 else first[a] + s * row_span for a, s in enumerate(steps)]  # (R,) per axis
        if tops or near:  # each block's largest value on any axis (and the smallest vision value)
            row_top = np.maximum.reduce([last[a] if s >= 0 else first[a] for a, s in enumerate(steps)])  # (R,)
            block_top = np.maximum.reduceat(row_top, block_row)  # (K,)
            if near:
                low = np.minimum.reduce([first[a] if s >= 0 else last[a] for a, s in enumerate(steps)]).min()
                if not (float(np.abs(block_top.astype(np.float64)).max()) < 2**53 and abs(float(low)) < 2**53):
                    raise _not_finite()
        row_jump = np.stack([first[a][1:] - last[a][:-1] for a in range(a_n)])  # (A, R - 1)
        block_first_value = first.take(block_row, axis=1)
        block_last_value = first.take(row_end - 1, axis=1) + np.multiply.outer(step_i, block_w - 1)
    top = None
    if tops:  # the largest position of each sample: a text run's last, or a block's top (padding: none)
        run_top = np.where(text, pos + run_len - 1, np.iinfo(np.int64).min)  # (C,)
        run_top[blk] = block_top
        top = np.maximum.reduceat(run_top, first_run)  # (B,)
    # the jumps: at each run's first token (a block's: its first row's) and at each other row's first token
    head = np.empty((a_n, cuts.shape[0]), dtype=np.int64)  # (A, C) each run's first value ...
    head[:] = np.where(text, pos, pad)  # ... text: its position; padding: the padding value
    head[:, blk] = block_first_value
    tail = head + text * (run_len - 1)  # (A, C) its last value
    tail[:, blk] = block_last_value
    jump = np.empty_like(head)  # (A, C); column 0: the batch's first run (below)
    np.subtract(head[:, 1:], tail[:, :-1], out=jump[:, 1:])  # (a sample's first run: from the last sample's end)
    jump[:, 0] = head[:, 0]  # one cumsum over the flat batch starts at 0
    # each row's first token (flat): its row tokens before it plus its block's shift, summed from the differences
    shift = block_first - (counts.cumsum() - counts)  # (K,)
    at = np.empty(row_w.shape[0], dtype=np.int64)  # (R,)
    at[0] = shift[0]
    at[1:] = row_w[:-1]
    at[block_row[1:]] += shift[1:] - shift[:-1]
    row_at = at.cumsum()[1:]  # (R - 1,) every row but the first
    groups = {}  # step -> its axes (a loop over axes)
    for a, s in enumerate(steps):
        groups.setdefault(s, []).append(a)
    for s, group in groups.items():
        buf = ids[group[-1]]  # the per-token steps (1 on text, s on vision, 0 on padding); its axis last
        if s == 0:
            np.copyto(buf, text.repeat(run_len))
        elif s == 1:
            np.copyto(buf, flat)
        else:
            np.multiply(vision_mask().reshape(-1), s - 1, out=buf)
            buf += flat
        for a in group:  # every axis of a group jumps at the same tokens: each one's jumps overwrite the last's
            buf[row_at] = row_jump[a]  # a row after a row (a block's first: its run's jump below)
            buf[cuts] = jump[a]
            src = torch.from_numpy(buf)  # (B * L,) one flat cumsum: every partial sum is a token's value
            if a == group[-1]:
                src.cumsum_(0)
            else:
                torch.cumsum(src, 0, out=torch.from_numpy(ids[a]))
    return nxt, top, n_real


def _not_finite() -> ValueError:
    return ValueError(
        "positions reach 2**53 or beyond, or are not finite (float64 and int64 ids would be wrong): check "
        "second_per_grid / second_per_grid_ts, tokens_per_second and temporal_scale"
    )


def _audio_or_none(audio: np.ndarray | None) -> Tensor | None:
    return torch.from_numpy(audio) if audio is not None and audio.any() else None


def _block_codes(
    vision_mask: Callable[[], np.ndarray], first: np.ndarray, counts: np.ndarray, is_image: np.ndarray
) -> np.ndarray:
    """``(B, L)`` modality codes from the blocks: 1 image, 2 video, 0 text and padding."""
    is_vision = vision_mask()
    codes = np.zeros(is_vision.size, dtype=np.int64)
    codes[is_vision.reshape(-1)] = np.repeat(np.where(is_image, int(Modality.IMAGE), int(Modality.VIDEO)), counts)
    return codes.reshape(is_vision.shape)


def pack(
    real: Tensor | np.ndarray,
    blocks: VisionBlocks,
    scheme: str | Scheme,
    options: SchemeOptions,
    *,
    modality: Tensor | np.ndarray | Callable[[], np.ndarray] | None = None,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
    out: Tensor | None = None,
) -> Layout:
    """Positions of every token of a padded batch under ``scheme``, vectorised over the batch.

    The one packer: :func:`build` (segments) and
    :func:`mmpos.integrations.hf_rope_index.token_layout` (token ids) describe their batch as
    ``real`` + :class:`VisionBlocks` and call it.

    Args:
        real: ``(B, L)`` bool, ``False`` on padding.
        blocks: the vision blocks; every other real token is text.
        scheme: a :data:`mmpos.schemes.SCHEMES` entry or its name.
        options: from :func:`mmpos.schemes.resolve_options`.
        modality: ``(B, L)`` int :class:`~mmpos.coords.Modality` codes, or a function making
            them when :attr:`Layout.modality` is first read; default from the blocks (image 1,
            video 2, text and padding 0).
        generator: random source of the per-block training draws (V2PE, HoPE), drawn in reading order.
        device: where the layout's tensors go (default: ``real``'s device).
        out: a contiguous CPU tensor of shape ``(rows, B, L)`` and the scheme's id dtype (int64 for all
            but ``hope`` float32 and ``v2pe`` float64; ``rows``: 3, or the scheme's axes when it has more
            than one) that the ids are written into instead of a new tensor: :attr:`Layout.position_ids`
            is then ``out`` (``device`` must be the CPU). Its values before the call are never read.

    A text token advances the position by 1 and a vision block by its *extent*; a unit
    starts at the running sum of what came before it (one ``cumsum`` along ``L``, summed in
    place in the ids' first row when ids and extents are integers). The bookkeeping runs in
    NumPy on the host (a NumPy operation costs about a microsecond, a PyTorch one 5--10, and
    these are small integer arrays): the scheme's block rule places all vision tokens of the
    batch at once, each axis's vision positions are computed, checked and written once (a
    masked write in reading order, no scatter by index), and ``attention_mask``, ``modality``
    and ``coords`` are built only when read. Inputs on an accelerator make one round trip:
    read to the host once, ``position_ids`` and ``rope_deltas`` moved back once.
    """
    sch = scheme if isinstance(scheme, Scheme) else get_scheme(scheme)
    if not isinstance(options, SchemeOptions):
        raise TypeError(
            f"options must be a SchemeOptions (mmpos.schemes.resolve_options), got {type(options).__name__}"
        )
    if device is None:
        device = real.device if isinstance(real, Tensor) else torch.device("cpu")
    real = host(real)
    if real.ndim != 2 or real.dtype != bool:
        raise ValueError(f"real must be a (B, L) bool tensor, got {real.dtype} {real.shape}")
    if out is not None:
        _check_out(out, sch, real.shape, device)
    grid, block_first, seconds, is_image, is_vision, audio, changes, counts = _check_blocks(blocks, real)
    if audio is not None and audio.any() and not sch.audio:
        takes = [s.name for s in SCHEMES.values() if s.audio]
        raise ValueError(f"blocks.audio (audio-visual blocks) applies only to schemes {takes}, got scheme={sch.name!r}")
    if modality is None:
        codes = partial(_block_codes, is_vision, block_first, counts, is_image)
    elif callable(modality):
        codes = modality
    else:
        codes = partial(host, modality)
        if codes().shape != real.shape:
            raise ValueError(f"modality must have the shape of real {real.shape}, got {codes().shape}")
    return _pack(
        real,
        is_vision,
        codes,
        grid,
        seconds,
        is_image,
        block_first,
        sch,
        options,
        generator,
        device,
        audio,
        changes,
        out,
        counts,
    )


def _check_out(out: object, sch: Scheme, shape: tuple[int, int], device: torch.device | str) -> None:
    """``pack``'s ``out``: a contiguous CPU ``(rows, B, L)`` tensor of the scheme's id dtype, the layout on the CPU."""
    if not isinstance(out, Tensor):
        raise TypeError(f"out must be a torch.Tensor or None, got {type(out).__name__}")
    rows = 3 if len(sch.axes) == 1 else len(sch.axes)
    want = (rows, *shape)
    if tuple(out.shape) != want or out.dtype != sch.id_dtype or out.device.type != "cpu" or not out.is_contiguous():
        got = f"{out.dtype} {tuple(out.shape)} on {out.device}" + ("" if out.is_contiguous() else " (not contiguous)")
        raise ValueError(
            f"out must be a contiguous {sch.id_dtype} CPU tensor of shape {want} (rows, B, L) for scheme "
            f"{sch.name!r}, got {got}"
        )
    if torch.device(device).type != "cpu":
        raise ValueError(f"out is a CPU tensor: device must be the CPU when out is given, got device={device!r}")


def _pack(
    real: np.ndarray,
    vision_mask: Callable[[], np.ndarray],
    codes: Callable[[], np.ndarray],
    grid: np.ndarray,
    seconds: np.ndarray,
    is_image: np.ndarray,
    block_first: np.ndarray,
    sch: Scheme,
    options: SchemeOptions,
    generator: torch.Generator | None,
    device: torch.device | str,
    audio: np.ndarray | None,
    changes: np.ndarray,
    out: Tensor | None,
    counts: np.ndarray,
) -> Layout:
    """:func:`pack` on checked host arrays, blocks in reading order (their tokens are the
    ``vision_mask()`` tokens in flat order; ``changes``: where ``real`` changes; ``out``: checked, the ids' tensor;
    ``counts`` ``(K,)``: tokens per block)."""
    b, length = real.shape
    k = block_first.shape[0]
    audio_t = _audio_or_none(audio)
    if audio_t is None and not (options.training and ("delta" in sch.draws or "temporal_scale" in sch.draws)):
        # no draws: the per-block tensors are built only if the rule reads them (same values as below)
        geometry = BlockGeometry.from_host(
            np.ascontiguousarray(grid, dtype=np.int64),
            seconds,
            is_image,
            *map(_one, (options.delta, options.temporal_scale)),
        )
    else:
        delta = _per_block(sch, "delta", options.delta, options, k, generator)
        scale = _per_block(sch, "temporal_scale", options.temporal_scale, options, k, generator)
        geometry = BlockGeometry.of(grid, torch.from_numpy(seconds), torch.from_numpy(is_image), delta, scale, audio_t)
    size_ok = partial(_exact_sum, sch, b * length)
    per_row = sch.rows is not None and not sch.reads_start and k > 0
    if per_row:  # integer ids written row by row of every block: no per-token offsets
        base, step, extent, use_start = sch.rows(geometry, options)
        base = host(base)  # an integer base needs no integrality check
        base = base if base.dtype.kind in "iu" else base.astype(np.float64, copy=False)
        step, extent, use_start = (_float64(x) for x in (step, extent, use_start))
        row_block = np.arange(k).repeat(grid[:, 0] * grid[:, 1])  # (R,) each row's block (as geometry.row_block)
        if base.ndim != 2 or base.shape[1] != row_block.shape[0] or step.shape != (base.shape[0],):
            raise ValueError(
                f"scheme {sch.name!r}: its row rule gave offsets {base.shape} and steps {step.shape}, the blocks hold "
                f"{row_block.shape[0]} rows"
            )
        per_row = all(float(v).is_integer() for v in step.tolist())  # (A,) steps: Python numbers
        if per_row and base.dtype.kind not in "iu":
            with np.errstate(all="ignore"):
                per_row = bool((np.floor(base) == base).all())
        if per_row:
            with np.errstate(all="ignore"):
                per_row = size_ok(extent)
        axes = base.shape[0]
    if not per_row:
        if sch.reads_start and k:  # the rule reads its block starts: the starts settle on its extents first
            offset, extent, use_start = _settle_starts(sch, geometry, options, real & ~vision_mask(), block_first)
        else:
            offset, extent, use_start = sch.block(geometry, options)
        if offset.shape[-1] != int(counts.sum()):
            raise ValueError(
                f"scheme {sch.name!r}: its block rule placed {offset.shape[-1]} tokens, the blocks hold {counts.sum()}"
            )
        # a new contiguous float64 tensor (not a view of the geometry) is the rule's own: the values are summed into it
        fresh = offset.dtype == torch.float64 and offset.is_contiguous() and not offset._is_view()
        offset, extent, use_start = (host(x.to(torch.float64)) for x in (offset, extent, use_start))
        axes = offset.shape[0]
    del geometry  # its per-token rows go back to the allocator before the ids are allocated
    rule = options.rule
    if per_row:  # integer ids written run by run (text, padding, rows of blocks): no per-token offsets
        return _pack_rows(
            real,
            vision_mask,
            changes,
            codes,
            grid,
            block_first,
            counts,
            row_block,
            base,
            step,
            use_start,
            extent,
            sch,
            rule,
            device,
            out,
        )
    first = np.cumsum(counts) - counts  # (K,) each block's first token among the vision tokens
    is_vision = vision_mask()  # (B, L)
    text = real & ~is_vision  # (B, L) real text tokens
    rows = 3 if axes == 1 else axes  # 1-axis schemes write their axis on all three rows
    ids = _ids_tensor(out, rows, b * length, sch.id_dtype)  # (rows, B * L), written through NumPy
    ids_np = ids.numpy()
    with np.errstate(all="ignore"):  # huge seconds: inf and NaN, refused below
        # integer ids and extents: the running position is summed in the ids' first row (int64, exact below
        # 2**53, as the float64 sum it equals); otherwise in float64, cast when written
        exact = size_ok(extent)
    run = ids_np[0] if exact else np.empty(b * length, dtype=np.float64)  # (B * L,)
    np.copyto(run, text.reshape(-1))  # 1 per text token, 0 on padding and vision tokens ...
    run[block_first] = extent  # ... but a block's first token: the block's extent
    pos = run.reshape(b, length)
    if exact and length:  # integers: each row starts at -1, so the sum gives the text positions (no pass for - 1)
        pos[:, 0] -= 1
    torch.from_numpy(pos).cumsum_(1)  # (B, L) running position after each token, - 1 (exact) or not yet
    block_end = pos.reshape(-1)[block_first].astype(np.float64)  # (K,)
    nxt = pos[:, -1].astype(np.float64)  # (B,) the position the token after each sample gets
    if exact:
        block_end += 1
        nxt += 1
    else:  # float64 sums: - 1 after the sum, as it always was (the same rounding)
        pos -= 1  # text positions (at a vision token: its block's end - 1, overwritten below)
    if rule.deltas == "max-real":
        if bool((extent >= 0).all()):  # positions never go back: the last real token's is the largest
            top = nxt - 1
        else:
            top = np.where(text, pos, -math.inf).max(1)
    np.copyto(pos, rule.padding_value, casting="unsafe", where=~real)  # the padding value on padding (as putmask)
    if axes > 1:
        with np.errstate(invalid="ignore"):  # NaN of huge seconds: refused below
            ids_np[int(exact) :] = run  # the text row on every axis (cast once)

    # vision tokens, one axis at a time (each value computed, checked and written once)
    flat = is_vision.reshape(-1)
    block_top = np.full(len(counts), -math.inf)
    low = np.float64(math.inf)
    kept = []
    with np.errstate(all="ignore"):
        block_start = block_end - extent
        starts = np.repeat(block_start, counts)  # (Nv,) each vision token's block start
        for axis in range(axes):
            u = use_start[axis]
            add = starts if u == 1 else u * starts
            values = np.add(offset[axis], add, out=offset[axis] if fresh else None)  # (Nv,) float64, block order
            if values.size:
                np.maximum(block_top, np.maximum.reduceat(values, first), out=block_top)
                low = np.minimum(low, values.min())  # NaN stays NaN
            row = ids_np[axis] if axes > 1 or exact else run
            row[flat] = values  # a masked write: sequential, about 5x faster than a scatter by index
            if not exact:
                kept.append(values)
        bounds = [nxt, block_start, block_end, block_top, np.array([low])] if block_top.size else [nxt]
        tops = [float(np.abs(x).max()) for x in bounds if x.size]  # NaN where any value is NaN
        finite, largest = all(v < 2**53 for v in tops), max(tops, default=0.0)  # NaN fails the comparison too
    if not finite:
        raise _not_finite()
    if sch.id_dtype == torch.float32 and largest > FLOAT32_EXACT:
        warn_once(
            ("layout-float32", sch.name),
            f"scheme {sch.name!r} writes float32 position_ids (as its reference) and positions here pass "
            f"{FLOAT32_EXACT} (2**24), where float32 cannot hold every integer: neighbouring tokens share one "
            "position id (Layout.coords keeps them exact in float64); check second_per_grid, temporal_scale",
            stacklevel=4,
        )
    if axes == 1:
        ids_np[int(exact) :] = run  # one axis on all three rows
    parts = None
    if not exact:  # float64 positions of the coordinates (ids may be float32)
        parts = (torch.from_numpy(pos), torch.from_numpy(np.stack(kept)), torch.from_numpy(is_vision))
    # (B,) real tokens per sample: bytes summed in uint16 where a row fits (about 8x faster than count_nonzero)
    n_real = real.view(np.uint8).sum(1, dtype=np.uint16 if length < 2**16 else np.int64).astype(np.int64)
    deltas = _deltas(sch, rule, length, nxt, n_real, top if rule.deltas == "max-real" else None, block_first, block_top)
    nv = int(counts.sum())
    ids = ids.view(rows, b, length).to(device) if out is None else out
    return Layout(ids, deltas.to(device), sch.name, rule, nv, (real, codes), parts)


def _deltas(sch, rule, length, nxt, n_real, top, block_first, block_top) -> Tensor:
    """``rope_deltas`` ``(B, 1)`` from the next position ``nxt`` ``(B,)``; under ``"max-real"`` from the largest
    text position ``top`` ``(B,)`` (updated in place) and each block's largest value ``block_top`` ``(K,)``."""
    if rule.deltas == "max-real":
        if block_top.size:  # ... or a vision token's (blocks in reading order: one reduceat per sample's blocks)
            sample = block_first // length
            at = np.flatnonzero(np.concatenate([[True], sample[1:] != sample[:-1]]))  # each sample's first block
            top[sample[at]] = np.maximum(top[sample[at]], np.maximum.reduceat(block_top, at))
        deltas = np.where(n_real > 0, np.maximum(top + 1, nxt), 0) - n_real  # never behind next
        if sch.id_dtype == torch.float32:  # from the largest float32 id written, summed in float32 (as the models)
            top32 = np.maximum(top.astype(np.float32) + np.float32(1), nxt.astype(np.float32))
            deltas = np.where(n_real > 0, top32, np.float32(0)) - n_real.astype(np.float32)
    else:
        deltas = nxt - length
    return torch.from_numpy(deltas.reshape(-1, 1).astype(_numpy_dtype(sch.delta_dtype)))


def _ids_tensor(out: Tensor | None, rows: int, n: int, dtype: torch.dtype) -> Tensor:
    """``(rows, n)`` the ids' tensor: a view of ``out`` (checked by :func:`_check_out`) or a new one."""
    return torch.empty((rows, n), dtype=dtype) if out is None else out.view(rows, n)


_NO_BLOCKS = np.empty(0)  # _deltas' block_top when top already holds the blocks' values


@cache
def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The NumPy dtype of a torch dtype (asked once per dtype)."""
    return torch.empty(0, dtype=dtype).numpy().dtype


def _pack_rows(
    real,
    vision_mask,
    changes,
    codes,
    grid,
    block_first,
    counts,
    row_block,
    base,
    step,
    use_start,
    extent,
    sch,
    rule,
    device,
    out=None,
) -> Layout:
    """:func:`_pack` of a per-row rule (``Scheme.rows``) whose ids and extents are integers: every value
    written by :func:`_write_runs`, no per-token float64."""
    b, length = real.shape
    axes = base.shape[0]
    rows = 3 if axes == 1 else axes  # 1-axis schemes write their axis on all three rows
    ids = _ids_tensor(out, rows, b * length, sch.id_dtype)  # (rows, B * L), written through NumPy
    ids_np = ids.numpy()
    nxt, top, n_real = _write_runs(
        ids_np,
        real,
        vision_mask,
        changes,
        grid,
        block_first,
        counts,
        row_block,
        base,
        step,
        use_start,
        extent,
        rule.padding_value,
        rule.deltas == "max-real",
    )
    if axes == 1:
        ids_np[1:] = ids_np[0]  # one axis on all three rows
    deltas = _deltas(sch, rule, length, nxt, n_real, top, block_first, _NO_BLOCKS)  # top: the blocks' included
    nv = int(counts.sum())
    ids = ids.view(rows, b, length).to(device) if out is None else out
    return Layout(ids, deltas.to(device), sch.name, rule, nv, (real, codes))


# --------------------------------------------------------------------------- build
def _unit_rows(seg: object, sch: Scheme, m: int, where: str) -> tuple[bytes, list[float]]:
    """A registered segment's units as packed rows (see :func:`build`) and their seconds."""
    units = _SEGMENT_KINDS.get(type(seg))
    if units is None:
        kinds = ", ".join(c.__name__ for c in _SEGMENT_KINDS)
        raise ValueError(f"{where} must be a {kinds} segment, got {seg!r}")
    out = [u for u in units(seg, sch, m, where)]
    rows = array("q", [v for u in out for v in (u.modality, u.tokens, *(u.grid or (0, 0, 0)), 0)])
    return rows.tobytes(), [u.seconds for u in out]


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
    rule: str = "original",
    device: torch.device | str | None = None,
    visual_stride: float | None = None,
    **scheme_options: object,
) -> Layout:
    """Positions of a batch of interleaved text / image / video samples.

    Args:
        samples: ``B`` samples, each a non-empty list of :class:`Text`, :class:`Image`,
            :class:`Video` segments (or a kind added by :func:`register_segment`); a vision
            segment holds ``t * (h / m) * (w / m)`` tokens (``m = spatial_merge_size``).
        scheme: one of :data:`mmpos.schemes.SCHEMES` (rules in ``docs/layouts.md``).
        spatial_merge_size: patches merged per token along h and w (2 in Qwen-VL).
        padding_side: ``"right"`` or ``"left"``.
        tokens_per_second: ``qwen2.5-vl`` temporal resolution (2 in the released checkpoints).
        delta: ``v2pe`` visual step in ``(0, 1]`` at evaluation (``stride / 256``).
        temporal_scale: ``hope`` temporal scale ``s`` at evaluation (required), or the
            ``mrope-i`` temporal stride (int, default 1).
        training: ``v2pe`` draws ``delta`` per block from :data:`mmpos.schemes.V2PE_DELTAS`, ``hope``
            draws ``s`` per block from :data:`mmpos.schemes.HOPE_SCALES`; other schemes ignore it.
        generator: random source for ``training``.
        rule: a Qwen-family rule of :data:`mmpos.schemes.RULES` (``"original"``, ``"hf-4.57"``, ``"hf-5.3"``).
        device: where the tensors are put (they are computed on the host and moved once).
        visual_stride: ``v2pe`` block-span form instead of ``delta``: the position span of
            every vision block, its per-token step ``visual_stride / tokens`` (V2PE's
            ``rope_pos_id_stride / num_image_token``, for blocks of any size).
        scheme_options: a scheme's own options (names in its ``Scheme.options``), e.g.
            ``circlerope``'s ``radius``, ``alpha``, ``move_to_origin``, ``move_to_positive``,
            ``dff_rate``, ``method`` (:func:`mmpos.schemes.resolve_options`).

    Under ``qwen3-vl`` a :class:`Video` becomes ``t`` consecutive one-frame blocks; for the
    exact Qwen3-VL token layout write each frame as ``Text(timestamp tokens), Video((1, h, w))``.
    """
    sch = get_scheme(scheme)
    options = resolve_options(
        sch,
        delta=delta,
        temporal_scale=temporal_scale,
        training=training,
        tokens_per_second=tokens_per_second,
        rule=rule,
        visual_stride=visual_stride,
        **scheme_options,
    )
    m = _check_int(spatial_merge_size, "spatial_merge_size", 1)
    if padding_side not in ("right", "left"):
        raise ValueError(f"padding_side must be 'right' or 'left', got {padding_side!r}")
    if isinstance(samples, (str, bytes)) or not isinstance(samples, Sequence) or not samples:
        raise ValueError("samples must be a non-empty list of samples (lists of segments)")
    segments: list = []
    for i, sample in enumerate(samples):
        if isinstance(sample, (str, bytes)) or not isinstance(sample, Sequence) or not sample:
            raise ValueError(f"samples[{i}] must be a non-empty list of segments, got {sample!r}")
        segments.extend(sample)
    batch = len(samples)

    # one row per unit: modality, tokens, t, h, w, raw (1: an Image grid still in patches). Text and
    # Image segments carry their row, packed when they were made (and validated then); other kinds
    # go through their registered units (Video: seconds per grid, Qwen3-VL frames)
    kinds = set(map(type, segments))
    seconds: dict[int, float] = {}  # unit row -> seconds per grid (videos)
    if kinds <= {Text, Image}:
        rows = b"".join([seg._row for seg in segments])
        per_sample = np.fromiter(map(len, samples), dtype=np.int64, count=batch)  # units per sample
    else:
        parts, per_sample, n_units = [], np.zeros(batch, dtype=np.int64), 0
        for i, sample in enumerate(samples):
            for j, seg in enumerate(sample):
                if type(seg) in (Text, Image):
                    parts.append(seg._row)
                    per_sample[i] += 1
                    n_units += 1
                    continue
                row, secs = _unit_rows(seg, sch, m, f"samples[{i}][{j}]")
                parts.append(row)
                seconds.update({n_units + k: s for k, s in enumerate(secs) if s})
                per_sample[i] += len(secs)
                n_units += len(secs)
        rows = b"".join(parts)
    unit = np.frombuffer(rows, dtype=np.int64).reshape(-1, 6)  # (U, 6)
    raw = unit[:, 5:6] == 1  # Image grids: merge h and w (all at once), tokens t * h * w
    if (unit[:, 3:5] % m * raw).any():
        for i, sample in enumerate(samples):  # the error path names the first bad segment
            for j, s in enumerate(sample):
                if type(s) is Image:
                    _merged(s, m, f"samples[{i}][{j}]")
    grid = unit[:, 2:5] // np.where(raw, np.array([1, m, m]), 1)  # (U, 3) in tokens; (0, 0, 0) for text
    tokens = np.where(raw[:, 0], grid.prod(-1), unit[:, 1])
    kind, is_block = unit[:, 0], grid[:, 0] > 0
    unit_sample = np.repeat(np.arange(batch), per_sample)
    sample_len = np.bincount(unit_sample, weights=tokens, minlength=batch).astype(np.int64)
    length = int(sample_len.max())
    # ~100 bytes a token: ids rows, coordinates, mask, modality and the packer's int64 work arrays
    check_bytes(100 * batch * length, f"a layout of {batch} x {length:,} tokens")

    # the padded batch as runs: every unit, and one padding run per sample (before or after its units)
    left = padding_side == "left"
    unit_run = np.arange(len(unit)) + unit_sample + left  # (U,) run of each unit
    pad_run = np.cumsum(per_sample) - (per_sample if left else 0) + np.arange(batch)  # (B,)
    small = kind.size == 0 or -128 <= kind.min() <= kind.max() <= 127
    run_len = np.empty(len(unit) + batch, dtype=np.int64)
    run_len[unit_run], run_len[pad_run] = tokens, length - sample_len
    run_kind = np.zeros(len(run_len), dtype=np.int8 if small else np.int64)  # padding: TEXT
    run_kind[unit_run] = kind
    run_block, run_real = np.zeros(len(run_len), dtype=bool), np.zeros(len(run_len), dtype=bool)
    run_block[unit_run], run_real[unit_run] = is_block, True
    real = np.repeat(run_real, run_len).reshape(batch, length)
    block_seconds = np.zeros(len(unit), dtype=np.float32)
    if seconds:
        with np.errstate(over="ignore"):  # beyond float32: inf, refused by the packer's check
            block_seconds[list(seconds)] = list(seconds.values())
    blocks = VisionBlocks(
        grid[is_block],
        (np.cumsum(run_len) - run_len)[run_block],  # each block's first token, in reading order
        block_seconds[is_block],
        kind[is_block] == int(Modality.IMAGE),
    )
    return pack(
        real,
        blocks,
        sch,
        options,
        modality=partial(np.repeat, run_kind, run_len),  # the modality codes, made if read
        generator=generator,
        device=torch.device("cpu") if device is None else torch.device(device),
    )
