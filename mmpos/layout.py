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
* ``rope_deltas`` ``(B, 1)``: next position minus ``L``; during decoding the token at
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
    "build",
    "decode_position_ids",
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
        rope_deltas: ``(B, 1)`` next position minus ``L`` (int64; float64 for ``v2pe``,
            float32 for ``hope``).
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
