"""Spatial relations: a red and a blue square on noise; the label is where red is relative to blue.

A scene is laid out on a coarse ``cells x cells`` grid: each square sits inside one cell
(random size and offset inside the cell, as fractions of the cell), the two cells differ,
and the label is the direction from the blue cell to the red cell:

* ``num_relations=4``: 0 left, 1 right, 2 above, 3 below (the dominant axis of the
  displacement; displacements with ``|dx| == |dy|`` are never drawn);
* ``num_relations=8``: 0 left, 1 above-left, 2 above, 3 above-right, 4 right,
  5 below-right, 6 below, 7 below-left (the 45-degree sector of the displacement).

Labels are balanced (the label is drawn first, the cells conditioned on it).

The same layout renders at any image size that the cell grid divides, so a model trained
at 32 px can be evaluated on the same scenes at 48 or 64 px (:func:`render`).

Why position encoding is needed: when the cell grid equals the patch grid, each square
lies inside one patch and its offset inside the patch does not depend on which patch it
is in. The *set* of patches is then identical for a scene and for the scene with the two
cells exchanged (or the grid transposed), which have different labels; a model that sees
a bag of patches (a ViT without position encoding) cannot beat chance, ``1/num_relations``.

Shapes: images ``(B, 3, H, W)`` float32, roughly zero-mean; labels ``(B,)`` int64.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "RELATIONS",
    "SpatialLayout",
    "paint_boxes",
    "relation",
    "render",
    "sample_layout",
    "spatial_relations",
]

RELATIONS = {
    4: ("left", "right", "above", "below"),
    8: ("left", "above-left", "above", "above-right", "right", "below-right", "below", "below-left"),
}
RED = (1.0, -1.0, -1.0)
BLUE = (-1.0, -1.0, 1.0)


@dataclass(frozen=True)
class SpatialLayout:
    """Resolution-free scenes: cell indices and in-cell geometry of the two squares.

    ``cell`` long ``(B, 2, 2)`` -- ``[square (red, blue), (row, col)]``;
    ``offset`` and ``side`` float ``(B, 2, 2)`` -- fractions of a cell, ``offset + side <= 1``;
    ``label`` long ``(B,)``; ``cells`` the grid ``(rows, cols)``.
    """

    cell: Tensor
    offset: Tensor
    side: Tensor
    label: Tensor
    cells: tuple[int, int]
    num_relations: int

    def __len__(self) -> int:
        return self.label.shape[0]


def _pair(value: int | tuple[int, int], name: str) -> tuple[int, int]:
    out = (value, value) if isinstance(value, int) else tuple(value)
    if len(out) != 2 or any(not isinstance(v, int) or isinstance(v, bool) or v <= 0 for v in out):
        raise ValueError(f"{name} must be a positive int or a pair of them, got {value!r}")
    return out  # type: ignore[return-value]


def relation(drow: Tensor, dcol: Tensor, num_relations: int) -> Tensor:
    """Label of displacements ``red - blue`` in cells (row down, col right); -1 where ambiguous."""
    if num_relations == 4:
        horizontal = dcol.abs() > drow.abs()
        lab = torch.where(horizontal, (dcol > 0).long(), 2 + (drow > 0).long())
        return torch.where(dcol.abs() == drow.abs(), torch.full_like(lab, -1), lab)
    if num_relations == 8:
        # angle measured from "left" (-col) turning towards "above" (-row): sector k covers k*45 +- 22.5 deg
        angle = torch.atan2(-drow.double(), -dcol.double())
        lab = torch.round(angle / (math.pi / 4)).long() % 8
        return torch.where((drow == 0) & (dcol == 0), torch.full_like(lab, -1), lab)
    raise ValueError(f"num_relations must be one of {sorted(RELATIONS)}, got {num_relations}")


def sample_layout(
    n: int,
    seed: int,
    cells: int | tuple[int, int] = 8,
    num_relations: int = 4,
    min_side: float = 0.5,
) -> SpatialLayout:
    """``n`` scenes with balanced labels, deterministic from ``seed``.

    Args:
        n: number of scenes.
        seed: seed of a private ``torch.Generator`` (the global RNG is not touched).
        cells: layout grid ``rows x cols`` (match it to the patch grid, see the module doc).
        num_relations: 4 or 8 classes.
        min_side: smallest square side as a fraction of a cell (the largest is 1).
    """
    rows, cols = _pair(cells, "cells")
    if rows * cols < 2:
        raise ValueError(f"cells must leave room for two squares, got {(rows, cols)}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not 0 < min_side <= 1:
        raise ValueError(f"min_side must be in (0, 1], got {min_side}")
    if num_relations not in RELATIONS:
        raise ValueError(f"num_relations must be one of {sorted(RELATIONS)}, got {num_relations}")
    g = torch.Generator().manual_seed(int(seed))
    label = torch.randint(num_relations, (n,), generator=g)
    cell = torch.empty(n, 2, 2, dtype=torch.long)
    todo = torch.arange(n)
    while len(todo):  # rejection sampling: draw cell pairs until each scene's relation matches its label
        k = len(todo)
        draw = torch.stack([torch.randint(rows, (k, 2), generator=g), torch.randint(cols, (k, 2), generator=g)], -1)
        ok = relation(draw[:, 0, 0] - draw[:, 1, 0], draw[:, 0, 1] - draw[:, 1, 1], num_relations) == label[todo]
        cell[todo[ok]] = draw[ok]
        todo = todo[~ok]
    side = min_side + (1 - min_side) * torch.rand(n, 2, 2, generator=g)
    offset = (1 - side) * torch.rand(n, 2, 2, generator=g)
    return SpatialLayout(cell, offset, side, label, (rows, cols), num_relations)


def paint_boxes(
    images: Tensor,
    start: Tensor,
    stop: Tensor,
    colors: Sequence[Sequence[float]],
    color_jitter: float,
    generator: torch.Generator,
) -> Tensor:
    """Fill box ``k`` (rows and columns ``[start, stop)``, ``(B, K, 2)`` pixels as ``(y, x)``) of
    ``images`` ``(B, 3, H, W)`` with ``colors[k]`` plus a uniform jitter of ``color_jitter`` per image."""
    n, _, h, w = images.shape
    ys = torch.arange(h, dtype=torch.float32).view(1, h, 1)
    xs = torch.arange(w, dtype=torch.float32).view(1, 1, w)
    for i, color in enumerate(colors):
        inside = (
            (ys >= start[:, i, 0, None, None])
            & (ys < stop[:, i, 0, None, None])
            & (xs >= start[:, i, 1, None, None])
            & (xs < stop[:, i, 1, None, None])
        )  # (B, H, W)
        rgb = torch.tensor(color) + color_jitter * (2 * torch.rand(n, 3, generator=generator) - 1)  # (B, 3)
        images = torch.where(inside[:, None], rgb[:, :, None, None], images)
    return images


def render(
    layout: SpatialLayout,
    image_size: int | tuple[int, int],
    seed: int,
    noise: float = 0.5,
    color_jitter: float = 0.2,
) -> tuple[Tensor, Tensor]:
    """Draw ``layout`` at ``image_size`` (``H, W`` multiples of the cell grid) on Gaussian noise.

    Returns ``(images (B, 3, H, W) float32, labels (B,) int64)``; deterministic from ``seed``.
    """
    h, w = _pair(image_size, "image_size")
    rows, cols = layout.cells
    if h % rows or w % cols:
        raise ValueError(f"image_size {(h, w)} must be a multiple of the layout's cells {layout.cells}")
    ch, cw = h // rows, w // cols
    g = torch.Generator().manual_seed(int(seed))
    n = len(layout)
    images = noise * torch.randn(n, 3, h, w, generator=g)
    px = torch.tensor([ch, cw], dtype=torch.float32)
    start = layout.cell * px + torch.round(layout.offset * px)  # (B, 2, 2) pixels
    size = torch.clamp(torch.round(layout.side * px), min=1.0)
    stop = torch.minimum(start + size, (layout.cell + 1) * px)
    return paint_boxes(images, start, stop, (RED, BLUE), color_jitter, g), layout.label.clone()


def spatial_relations(
    n: int,
    image_size: int | tuple[int, int] = 32,
    seed: int = 0,
    cells: int | tuple[int, int] = 8,
    num_relations: int = 4,
    noise: float = 0.5,
    min_side: float = 0.5,
    color_jitter: float = 0.2,
) -> tuple[Tensor, Tensor]:
    """``n`` images and labels: :func:`sample_layout` then :func:`render` (both from ``seed``)."""
    layout = sample_layout(n, seed, cells, num_relations, min_side)
    return render(layout, image_size, seed + 1, noise, color_jitter)
