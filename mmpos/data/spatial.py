"""Deprecated: the red/blue squares of the ``"grid"`` placement moved to :mod:`mmpos.data.squares`.

Each old name still resolves, with a ``DeprecationWarning`` naming its replacement:
``SpatialLayout`` -> ``GridSquares``, ``sample_layout`` -> ``sample_grid``,
``spatial_relations`` -> ``make_squares(placement="grid")``; ``render``, ``relation``,
``RELATIONS`` and ``paint_boxes`` keep their names (``render`` and ``make_squares`` take
their options by keyword).
"""

from __future__ import annotations

from typing import Any

from .._deprecate import moved_attributes
from . import squares

__all__: list[str] = []


def _render(layout, image_size, seed, noise=0.5, color_jitter=0.2):
    return squares.render(layout, image_size, seed, noise=noise, color_jitter=color_jitter)


def _spatial_relations(n, image_size=32, seed=0, cells=8, num_relations=4, noise=0.5, min_side=0.5, color_jitter=0.2):
    return squares.make_squares(
        n, image_size, seed, placement="grid", noise=noise, color_jitter=color_jitter,
        cells=cells, num_relations=num_relations, min_side=min_side,
    )  # fmt: skip


_MOVED: dict[str, tuple[Any, str]] = {
    "RELATIONS": (squares.RELATIONS, "RELATIONS"),
    "SpatialLayout": (squares.GridSquares, "GridSquares"),
    "paint_boxes": (squares.paint_boxes, "paint_boxes"),
    "relation": (squares.relation, "relation"),
    "render": (_render, "render"),
    "sample_layout": (squares.sample_grid, "sample_grid"),
    "spatial_relations": (_spatial_relations, 'make_squares(..., placement="grid")'),
}


__getattr__ = moved_attributes(__name__, _MOVED, "mmpos.data.squares")
