"""Cell scenes: coloured shapes drawn with OpenCV on a grid of cells.

The multimodal tasks (grounding, video events, needle in a haystack) share this
vocabulary and renderer. A scene is a ``(rows, cols)`` array of object ids
(``-1`` = empty); object ``o`` has shape ``o // len(COLORS)`` and colour
``o % len(COLORS)``. Images are float32 ``(3, rows * cell, cols * cell)`` in [0, 1].

The *mark* of the tasks (the needle of :mod:`recipes.data.haystack`, the marked cell of
:mod:`recipes.data.relations`, the flash of :mod:`recipes.data.video`) is a white square
painted by :func:`paint_mark` over the pixels a square object would cover.
"""

from __future__ import annotations

import cv2
import numpy as np

__all__ = ["COLORS", "NUM_OBJECTS", "SHAPES", "add_noise", "paint_mark", "random_scene", "render_scene"]

SHAPES = ("square", "circle", "triangle", "cross")
COLORS = {  # RGB
    "red": (230, 40, 40),
    "green": (40, 200, 60),
    "blue": (50, 80, 235),
    "yellow": (235, 215, 40),
}
NUM_OBJECTS = len(SHAPES) * len(COLORS)
_RGB = np.array(list(COLORS.values()), dtype=np.uint8)


def _margin(cell: int) -> int:
    """Pixels between a cell's border and the object (or mark) inside it."""
    return max(cell // 6, 1)


def _draw(canvas: np.ndarray, shape: int, color: tuple[int, int, int], y0: int, x0: int, cell: int) -> None:
    m = _margin(cell)
    y1, x1 = y0 + cell - 1 - m, x0 + cell - 1 - m
    y0, x0 = y0 + m, x0 + m
    cy, cx = (y0 + y1) // 2, (x0 + x1) // 2
    if shape == 0:
        cv2.rectangle(canvas, (x0, y0), (x1, y1), color, thickness=-1)
    elif shape == 1:
        cv2.circle(canvas, (cx, cy), max((x1 - x0) // 2, 1), color, thickness=-1)
    elif shape == 2:
        pts = np.array([[cx, y0], [x0, y1], [x1, y1]], dtype=np.int32)
        cv2.fillPoly(canvas, [pts], color)
    else:
        t = max(cell // 5, 1)
        cv2.rectangle(canvas, (x0, cy - t // 2), (x1, cy + t // 2), color, thickness=-1)
        cv2.rectangle(canvas, (cx - t // 2, y0), (cx + t // 2, y1), color, thickness=-1)


def render_scene(scene: np.ndarray, cell: int, rng: np.random.Generator, noise: float = 0.05) -> np.ndarray:
    """Draw ``scene`` ``(rows, cols)`` of object ids; returns float32 ``(3, H, W)`` in [0, 1]."""
    if scene.ndim != 2:
        raise ValueError(f"scene must be a 2-D array of object ids, got shape {scene.shape}")
    if cell < 4:
        raise ValueError(f"cell must be at least 4 pixels, got {cell}")
    rows, cols = scene.shape
    canvas = np.full((rows * cell, cols * cell, 3), 20, dtype=np.uint8)
    for r, c in zip(*np.nonzero(scene >= 0)):
        obj = int(scene[r, c])
        _draw(canvas, obj // len(COLORS), tuple(int(v) for v in _RGB[obj % len(COLORS)]), r * cell, c * cell, cell)
    return add_noise(canvas.astype(np.float32) / 255.0, noise, rng).transpose(2, 0, 1)


def paint_mark(image: np.ndarray, row: int, col: int, cell: int) -> None:
    """Paint the mark, white (1.0), into cell ``(row, col)`` of ``image`` ``(..., 3, H, W)`` in place
    (every leading index: e.g. all frames of a clip slice ``(T, 3, H, W)``)."""
    m = _margin(cell)
    image[..., row * cell + m : (row + 1) * cell - m, col * cell + m : (col + 1) * cell - m] = 1.0


def add_noise(image: np.ndarray, noise: float, rng: np.random.Generator) -> np.ndarray:
    """``image`` (float32, in [0, 1], any shape) plus Gaussian noise of std ``noise`` from ``rng``, clipped
    to [0, 1]; ``image`` itself when ``noise`` is 0 (no draw)."""
    if not noise:
        return image
    return np.clip(image + rng.normal(0.0, noise, image.shape).astype(np.float32), 0.0, 1.0)


def random_scene(rows: int, cols: int, num_objects: int, rng: np.random.Generator) -> np.ndarray:
    """``(rows, cols)`` ids: ``num_objects`` distinct objects in distinct random cells, others -1."""
    if not 0 < num_objects <= min(rows * cols, NUM_OBJECTS):
        raise ValueError(f"num_objects must be in [1, {min(rows * cols, NUM_OBJECTS)}], got {num_objects}")
    scene = np.full(rows * cols, -1, dtype=np.int64)
    cells = rng.choice(rows * cols, size=num_objects, replace=False)
    scene[cells] = rng.choice(NUM_OBJECTS, size=num_objects, replace=False)
    return scene.reshape(rows, cols)
