"""Deprecated: the red/blue squares of the ``"free"`` placement moved to :mod:`mmpos.data.squares`.

Each old name still resolves, with a ``DeprecationWarning`` naming its replacement:
``Scene`` -> ``FreeSquares``, ``sample_scenes`` -> ``sample_free``, ``layout_images`` ->
``make_squares(placement="free")``, ``RELATIONS`` -> ``RELATIONS[4]``; ``render``,
``relation`` and ``OBJECT_SCALES`` keep their names (``render`` and ``make_squares`` take
their options by keyword).
"""

from __future__ import annotations

from typing import Any

from .._deprecate import moved_attributes
from . import squares

__all__: list[str] = []


def _render(scene, image_size, seed, object_scale="pixels", noise=0.3, color_jitter=0.2):
    return squares.render(scene, image_size, seed, noise=noise, color_jitter=color_jitter, object_scale=object_scale)


def _layout_images(
    n, image_size=32, seed=0, base_size=32, object_scale="pixels", side=(4.0, 8.0), min_gap=8.0, min_margin=4.0,
    noise=0.3, color_jitter=0.2,
):  # fmt: skip
    return squares.make_squares(
        n, image_size, seed, placement="free", noise=noise, color_jitter=color_jitter, object_scale=object_scale,
        base_size=base_size, side=side, min_gap=min_gap, min_margin=min_margin,
    )  # fmt: skip


_MOVED: dict[str, tuple[Any, str]] = {
    "OBJECT_SCALES": (squares.OBJECT_SCALES, "OBJECT_SCALES"),
    "RELATIONS": (squares.RELATIONS[4], "RELATIONS[4]"),
    "Scene": (squares.FreeSquares, "FreeSquares"),
    "layout_images": (_layout_images, 'make_squares(..., placement="free")'),
    "relation": (squares.relation, "relation"),
    "render": (_render, "render"),
    "sample_scenes": (squares.sample_free, "sample_free"),
}


__getattr__ = moved_attributes(__name__, _MOVED, "mmpos.data.squares")
