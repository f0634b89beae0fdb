"""Layout images: a red and a blue square on noise; the label is where red lies relative to blue.

A *scene* is resolution-free: the centres of the two squares are fractions of the image
height and width, their sides are pixels *at the base resolution* ``base_size`` (the
training resolution). :func:`render` draws the same scene at any image size, so a model
trained at 32 px can be evaluated on identical layouts at 48 px (1.5x) or 64 px (2x).

Labels (4 classes, balanced; drawn first, the scene is conditioned on them): the
direction of the displacement ``red - blue`` along its dominant axis,
0 ``left``, 1 ``right``, 2 ``above``, 3 ``below`` (rows grow downwards).

Geometry guarantees, in base pixels, for every scene:

* the dominant axis wins by at least ``min_margin`` (``| |dy| - |dx| | >= min_margin``),
  so no label is ambiguous;
* along the dominant axis the squares are at least ``min_gap`` pixels apart (edge to
  edge). With ``min_gap >= patch size`` no patch ever holds both squares, so a model that
  sees a bag of patches (a ViT without position encoding) cannot beat chance (1/4): the
  relation is only visible through where the patches are.

Resolution change (``object_scale``):

* ``"pixels"`` (default, the recipes' choice): squares keep their size in pixels while
  their centres scale with the image. Patches at 1.5x/2x then look exactly like training
  patches (a 4-8 px square on noise); only the token grid grows and distances in tokens
  grow with it. A drop in accuracy at higher resolution is then due to how the position
  encoding handles the larger grid, not to the patch embedding meeting objects of an
  unseen size, which would dominate on such small images. Needs ``image_size >=
  base_size``, so that squares always fit.
* ``"image"``: squares scale with the image (the classical "evaluate at a higher
  resolution" protocol of DeiT/CPVT on natural images); patch statistics change too.

Shapes: images ``(B, 3, S, S)`` float32 (square: the relation is defined in a square frame), roughly zero-mean; labels ``(B,)`` int64.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .spatial import paint_boxes

__all__ = ["OBJECT_SCALES", "RELATIONS", "Scene", "layout_images", "relation", "render", "sample_scenes"]

RELATIONS = ("left", "right", "above", "below")
OBJECT_SCALES = ("pixels", "image")
_COLORS = ((1.0, -1.0, -1.0), (-1.0, -1.0, 1.0))  # red, blue (RGB, images are zero-mean)


@dataclass(frozen=True)
class Scene:
    """Resolution-free layouts of ``B`` scenes.

    ``center`` float ``(B, 2, 2)`` -- ``[square (red, blue), (y, x)]`` as fractions of the
    image height / width; ``side`` float ``(B, 2)`` -- square sides in pixels at
    ``base_size``; ``label`` long ``(B,)`` -- index into :data:`RELATIONS`.
    """

    center: Tensor
    side: Tensor
    label: Tensor
    base_size: int

    def __len__(self) -> int:
        return self.label.shape[0]


def relation(dy: Tensor, dx: Tensor) -> Tensor:
    """Label of displacements ``red - blue`` (any unit; ``dy`` down, ``dx`` right), ties -> -1."""
    horizontal = dx.abs() > dy.abs()
    label = torch.where(horizontal, (dx > 0).long(), 2 + (dy > 0).long())
    return torch.where(dx.abs() == dy.abs(), torch.full_like(label, -1), label)


def _check_positive(value: float, name: str) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}")


def sample_scenes(
    n: int,
    seed: int,
    base_size: int = 32,
    side: tuple[float, float] = (4.0, 8.0),
    min_gap: float = 8.0,
    min_margin: float = 4.0,
) -> Scene:
    """``n`` scenes with balanced labels, deterministic from ``seed`` (global RNG untouched).

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
    label = torch.randint(len(RELATIONS), (n,), generator=g)
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
    return Scene(center, sides, label, base_size)


def render(
    scene: Scene,
    image_size: int,
    seed: int,
    object_scale: str = "pixels",
    noise: float = 0.3,
    color_jitter: float = 0.2,
) -> tuple[Tensor, Tensor]:
    """Draw ``scene`` at ``image_size`` (square images; the label is a relation in a square frame) on noise.

    A square of side ``s`` base pixels centred at ``c`` (fractions) covers the rows
    ``[round(c_y S - s' / 2), + round(s'))`` (and likewise the columns) of an ``S x S`` image,
    where ``s' = s`` (``object_scale="pixels"``) or ``s * S / base_size`` (``"image"``).

    Returns ``(images (B, 3, S, S) float32, labels (B,) int64)``; deterministic from ``seed``.
    """
    if not isinstance(image_size, int) or isinstance(image_size, bool) or image_size <= 0:
        raise ValueError(f"image_size must be a positive int (square images), got {image_size!r}")
    h = w = image_size
    if object_scale not in OBJECT_SCALES:
        raise ValueError(f"object_scale must be one of {OBJECT_SCALES}, got {object_scale!r}")
    if object_scale == "pixels" and image_size < scene.base_size:
        raise ValueError(
            f"image_size={image_size} must be >= base_size={scene.base_size} with object_scale='pixels' "
            "(squares keep their pixel size and must fit)"
        )
    if noise < 0 or color_jitter < 0:
        raise ValueError(f"noise and color_jitter must be >= 0, got {noise} and {color_jitter}")
    g = torch.Generator().manual_seed(int(seed))
    n = len(scene)
    extent = torch.tensor([h, w], dtype=torch.float32)  # (yx)
    scale = extent / scene.base_size if object_scale == "image" else torch.ones(2)
    side = torch.clamp(torch.round(scene.side[:, :, None] * scale), min=1.0)  # (B, square, yx) px
    start = torch.round(scene.center * extent - side / 2).clamp(min=0.0)
    stop = torch.minimum(start + side, extent)
    images = noise * torch.randn(n, 3, h, w, generator=g)
    return paint_boxes(images, start, stop, _COLORS, color_jitter, g), scene.label.clone()


def layout_images(
    n: int,
    image_size: int = 32,
    seed: int = 0,
    base_size: int = 32,
    object_scale: str = "pixels",
    side: tuple[float, float] = (4.0, 8.0),
    min_gap: float = 8.0,
    min_margin: float = 4.0,
    noise: float = 0.3,
    color_jitter: float = 0.2,
) -> tuple[Tensor, Tensor]:
    """``n`` images and labels: :func:`sample_scenes` (seed) then :func:`render` (seed + 1)."""
    scene = sample_scenes(n, seed, base_size, side, min_gap, min_margin)
    return render(scene, image_size, seed + 1, object_scale, noise, color_jitter)
