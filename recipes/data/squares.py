"""Red and blue squares on noise; the label is where the red square lies relative to the blue one.

One generator, two placements of the squares, one relation vocabulary and one painter.
Scenes are resolution-free: :func:`sample_grid` / :func:`sample_free` draw them from a
seed, :func:`render` draws the same scenes at any image size (a model trained at 32 px is
evaluated on identical scenes at 48 or 64 px), :func:`make_squares` does both.

Labels (:data:`RELATIONS`, :func:`relation`): the direction of the displacement
``red - blue`` (rows grow downwards), balanced (drawn first, the scene is conditioned on it):

* ``num_relations=4``: 0 ``left``, 1 ``right``, 2 ``above``, 3 ``below`` -- the dominant
  axis; displacements with ``|dy| == |dx|`` are ambiguous and never drawn;
* ``num_relations=8``: 0 ``left``, 1 ``above-left``, 2 ``above``, 3 ``above-right``,
  4 ``right``, 5 ``below-right``, 6 ``below``, 7 ``below-left`` -- the 45-degree sector.

Placements:

* ``"grid"`` (:class:`GridSquares`, the ``quickstart`` recipe): a coarse ``cells`` grid;
  each square lies inside one cell (random size and offset as fractions of the cell), the
  two cells differ, the label is the direction between the cells (4 or 8 relations).
  Squares scale with the image. When the cell grid equals the patch grid, each square
  lies inside one patch at an offset that does not depend on the patch: the *set* of
  patches is the same for a scene and for the scene with the two cells exchanged, which
  has the opposite label, so a bag of patches (a ViT without position encoding) cannot
  beat chance, ``1 / num_relations``.
* ``"free"`` (:class:`FreeSquares`, the ``vit_spatial`` recipes): centres anywhere, as
  fractions of the image; sides in pixels at the base (training) resolution; 4 relations.
  In base pixels the dominant axis wins by at least ``min_margin`` and the squares are at
  least ``min_gap`` apart along it: with ``min_gap >=`` the patch size no patch holds both
  squares, and again only where the patches are tells the relation. At another resolution
  the squares keep their pixel size (``object_scale="pixels"``: patches look like training
  patches, only the token grid grows) or scale with the image (``"image"``, the DeiT/CPVT
  "evaluate at a higher resolution" protocol). ``"pixels"`` needs ``image_size >= base_size``.

Shapes: images ``(B, 3, H, W)`` float32, roughly zero-mean (free placement: square images);
labels ``(B,)`` int64. Every function draws from a private ``torch.Generator`` seeded by its
``seed``; the global RNG is not touched.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "OBJECT_SCALES",
    "PLACEMENTS",
    "RELATIONS",
    "FreeSquares",
    "GridSquares",
    "make_squares",
    "paint_boxes",
    "relation",
    "render",
    "sample_free",
    "sample_grid",
]

RELATIONS = {
    4: ("left", "right", "above", "below"),
    8: ("left", "above-left", "above", "above-right", "right", "below-right", "below", "below-left"),
}
OBJECT_SCALES = ("pixels", "image")
PLACEMENTS = ("grid", "free")
_RED_BLUE = ((1.0, -1.0, -1.0), (-1.0, -1.0, 1.0))  # RGB of the two squares (images are zero-mean)


def relation(dy: Tensor, dx: Tensor, num_relations: int = 4) -> Tensor:
    """Labels of displacements ``red - blue`` (any unit; ``dy`` down, ``dx`` right), ``-1`` where ambiguous.

    4 relations: ties ``|dy| == |dx|`` are ambiguous; 8 relations: only ``(0, 0)`` is.
    """
    if num_relations == 4:
        horizontal = dx.abs() > dy.abs()
        label = torch.where(horizontal, (dx > 0).long(), 2 + (dy > 0).long())
        return torch.where(dx.abs() == dy.abs(), torch.full_like(label, -1), label)
    if num_relations == 8:
        # angle measured from "left" (-x) turning towards "above" (-y): sector k covers k*45 +- 22.5 deg
        angle = torch.atan2(-dy.double(), -dx.double())
        label = torch.round(angle / (math.pi / 4)).long() % 8
        return torch.where((dy == 0) & (dx == 0), torch.full_like(label, -1), label)
    raise ValueError(f"num_relations must be one of {sorted(RELATIONS)}, got {num_relations!r}")


def _pair(value: int | tuple[int, int], name: str) -> tuple[int, int]:
    out = (value, value) if isinstance(value, int) else tuple(value)
    if len(out) != 2 or any(not isinstance(v, int) or isinstance(v, bool) or v <= 0 for v in out):
        raise ValueError(f"{name} must be a positive int or a pair of them, got {value!r}")
    return out  # type: ignore[return-value]


def _check_positive(value: float, name: str) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}")


@dataclass(frozen=True)
class GridSquares:
    """Scenes of the ``"grid"`` placement: cell indices and in-cell geometry of the two squares.

    ``cell`` long ``(B, 2, 2)`` -- ``[square (red, blue), (row, col)]``;
    ``offset`` and ``side`` float ``(B, 2, 2)`` -- fractions of a cell, ``offset + side <= 1``;
    ``label`` long ``(B,)`` -- index into ``RELATIONS[num_relations]``; ``cells`` the grid ``(rows, cols)``.
    """

    cell: Tensor
    offset: Tensor
    side: Tensor
    label: Tensor
    cells: tuple[int, int]
    num_relations: int

    def __len__(self) -> int:
        return self.label.shape[0]

    def _boxes(self, image_size: int | tuple[int, int], object_scale: str | None) -> tuple[int, int, Tensor, Tensor]:
        """``(H, W, start, stop)``: pixel boxes ``(B, 2, 2)`` as ``(y, x)``, rows/cols ``[start, stop)``."""
        if object_scale not in (None, "image"):
            raise ValueError(
                f"object_scale must be None or 'image' for GridSquares (squares are fractions of a cell), "
                f"got {object_scale!r}"
            )
        h, w = _pair(image_size, "image_size")
        rows, cols = self.cells
        if h % rows or w % cols:
            raise ValueError(f"image_size {(h, w)} must be a multiple of the scenes' cells {self.cells}")
        px = torch.tensor([h // rows, w // cols], dtype=torch.float32)  # one cell, (yx) pixels
        start = self.cell * px + torch.round(self.offset * px)
        size = torch.clamp(torch.round(self.side * px), min=1.0)
        return h, w, start, torch.minimum(start + size, (self.cell + 1) * px)


@dataclass(frozen=True)
class FreeSquares:
    """Scenes of the ``"free"`` placement (4 relations).

    ``center`` float ``(B, 2, 2)`` -- ``[square (red, blue), (y, x)]`` as fractions of the
    image height / width; ``side`` float ``(B, 2)`` -- square sides in pixels at
    ``base_size``; ``label`` long ``(B,)`` -- index into ``RELATIONS[4]``.
    """

    center: Tensor
    side: Tensor
    label: Tensor
    base_size: int

    num_relations = 4  # a class attribute, not a field

    def __len__(self) -> int:
        return self.label.shape[0]

    def _boxes(self, image_size: int, object_scale: str | None) -> tuple[int, int, Tensor, Tensor]:
        """A square of side ``s`` base pixels centred at ``c`` covers rows ``[round(c_y S - s'/2), + round(s'))``
        (likewise columns), ``s' = s`` (``"pixels"``, the default) or ``s * S / base_size`` (``"image"``)."""
        if not isinstance(image_size, int) or isinstance(image_size, bool) or image_size <= 0:
            raise ValueError(f"image_size must be a positive int for FreeSquares (square images), got {image_size!r}")
        object_scale = object_scale or "pixels"
        if object_scale not in OBJECT_SCALES:
            raise ValueError(f"object_scale must be one of {OBJECT_SCALES}, got {object_scale!r}")
        if object_scale == "pixels" and image_size < self.base_size:
            raise ValueError(
                f"image_size={image_size} must be >= base_size={self.base_size} with object_scale='pixels' "
                "(squares keep their pixel size and must fit)"
            )
        extent = torch.tensor([image_size, image_size], dtype=torch.float32)  # (yx)
        scale = extent / self.base_size if object_scale == "image" else torch.ones(2)
        side = torch.clamp(torch.round(self.side[:, :, None] * scale), min=1.0)  # (B, square, yx) px
        start = torch.round(self.center * extent - side / 2).clamp(min=0.0)
        return image_size, image_size, start, torch.minimum(start + side, extent)


def sample_grid(
    n: int,
    seed: int,
    cells: int | tuple[int, int] = 8,
    num_relations: int = 4,
    min_side: float = 0.5,
) -> GridSquares:
    """``n`` scenes of the ``"grid"`` placement with balanced labels, deterministic from ``seed``.

    Args:
        n: number of scenes (>= 0).
        seed: seed of a private ``torch.Generator``.
        cells: grid ``rows x cols`` (match it to the patch grid, see the module doc).
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
    return GridSquares(cell, offset, side, label, (rows, cols), num_relations)


def sample_free(
    n: int,
    seed: int,
    base_size: int = 32,
    side: tuple[float, float] = (4.0, 8.0),
    min_gap: float = 8.0,
    min_margin: float = 4.0,
) -> FreeSquares:
    """``n`` scenes of the ``"free"`` placement with balanced labels, deterministic from ``seed``.

    Args:
        n: number of scenes (>= 0).
        seed: seed of a private ``torch.Generator``.
        base_size: the training resolution in pixels (square images).
        side: ``(smallest, largest)`` square side in base pixels, drawn uniformly.
        min_gap: smallest edge-to-edge distance along the dominant axis, base pixels
            (set it to at least the patch size, see the module doc).
        min_margin: smallest ``| |dy| - |dx| |`` of the centre displacement, base pixels.
    """
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    if not isinstance(base_size, int) or base_size <= 0:
        raise ValueError(f"base_size must be a positive int, got {base_size!r}")
    lo, hi = side
    if not 0 < lo <= hi:
        raise ValueError(f"side must be (smallest, largest) with 0 < smallest <= largest, got {side!r}")
    _check_positive(min_gap, "min_gap")
    _check_positive(min_margin, "min_margin")
    if 2 * hi + min_gap + 2 > base_size:
        raise ValueError(
            f"two squares of side up to {hi} px with min_gap={min_gap} px do not fit in base_size={base_size} px"
        )
    g = torch.Generator().manual_seed(int(seed))
    label = torch.randint(len(RELATIONS[4]), (n,), generator=g)
    center = torch.empty(n, 2, 2)
    sides = torch.empty(n, 2)
    todo = torch.arange(n)
    while len(todo):  # rejection sampling until each scene is valid and matches its label
        k = len(todo)
        s = lo + (hi - lo) * torch.rand(k, 2, generator=g)  # (k, square)
        free = base_size - s[:, :, None] - 2  # 1 px from the border, so rounding never clips a square
        c = s[:, :, None] / 2 + 1 + free * torch.rand(k, 2, 2, generator=g)  # (k, square, yx) px
        d = c[:, 0] - c[:, 1]  # (k, yx): red - blue
        dominant = torch.maximum(d[:, 0].abs(), d[:, 1].abs())
        ok = (
            (relation(d[:, 0], d[:, 1]) == label[todo])
            & ((d[:, 0].abs() - d[:, 1].abs()).abs() >= min_margin)
            & (dominant - s.sum(1) / 2 >= min_gap)
        )
        center[todo[ok]] = c[ok] / base_size
        sides[todo[ok]] = s[ok]
        todo = todo[~ok]
    return FreeSquares(center, sides, label, base_size)


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
    scenes: GridSquares | FreeSquares,
    image_size: int | tuple[int, int],
    seed: int,
    *,
    noise: float = 0.5,
    color_jitter: float = 0.2,
    object_scale: str | None = None,
) -> tuple[Tensor, Tensor]:
    """Draw ``scenes`` at ``image_size`` on Gaussian noise of std ``noise``; deterministic from ``seed``.

    ``image_size``: ``GridSquares`` take an int or ``(H, W)``, multiples of the cell grid;
    ``FreeSquares`` an int (square images). ``object_scale`` (``FreeSquares`` only):
    ``"pixels"`` (default) or ``"image"``, see the module doc; ``GridSquares`` always scale
    with the image. Returns ``(images (B, 3, H, W) float32, labels (B,) int64)``.
    """
    if not isinstance(scenes, (GridSquares, FreeSquares)):
        raise TypeError(f"scenes must be GridSquares or FreeSquares, got {type(scenes).__name__}")
    if noise < 0 or color_jitter < 0:
        raise ValueError(f"noise and color_jitter must be >= 0, got {noise} and {color_jitter}")
    h, w, start, stop = scenes._boxes(image_size, object_scale)
    g = torch.Generator().manual_seed(int(seed))
    images = noise * torch.randn(len(scenes), 3, h, w, generator=g)
    return paint_boxes(images, start, stop, _RED_BLUE, color_jitter, g), scenes.label.clone()


_SAMPLERS = {"grid": sample_grid, "free": sample_free}


def make_squares(
    n: int,
    image_size: int | tuple[int, int] = 32,
    seed: int = 0,
    *,
    placement: str = "grid",
    noise: float = 0.5,
    color_jitter: float = 0.2,
    object_scale: str | None = None,
    **options,
) -> tuple[Tensor, Tensor]:
    """``n`` images and labels: the scenes of ``placement`` from ``seed``, rendered from ``seed + 1``.

    ``options`` go to the placement's sampler: :func:`sample_grid` (``cells``,
    ``num_relations``, ``min_side``) or :func:`sample_free` (``base_size``, ``side``,
    ``min_gap``, ``min_margin``). Returns ``(images (B, 3, H, W) float32, labels (B,) int64)``.
    """
    if placement not in _SAMPLERS:
        raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
    sampler = _SAMPLERS[placement]
    accepted = [p for p in inspect.signature(sampler).parameters if p not in ("n", "seed")]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(f"placement={placement!r} takes the options {accepted}, got unknown {unknown}")
    scenes = sampler(n, seed, **options)
    return render(scenes, image_size, seed + 1, noise=noise, color_jitter=color_jitter, object_scale=object_scale)
