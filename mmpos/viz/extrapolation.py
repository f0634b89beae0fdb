"""Each scaling rule's similarity map beyond the training grid (``mmpos plot extrapolation --rules``).

A rotary encoder is built once per rule of :mod:`mmpos.scaling` (numbers for "trained on ``grid``,
run on ``factor`` times it": ``factor`` per axis and ``original_size = grid``) and its
:func:`~mmpos.viz.maps.similarity_map` is drawn on the larger grid, the query at the same relative
place, beside the unscaled map on the training grid.

:attr:`RuleMap.drift` measures how far the map on the larger grid is from the training map at the
same relative places: the mean absolute difference between ``wide[factor * i]`` and ``train[i]``
over the training cells ``i`` (0 for position interpolation, which maps the larger grid exactly
onto the training extent; larger where a rule lets the map sharpen or wrap beyond it).

Shapes: :class:`RuleMap` ``smap`` is a :class:`~mmpos.viz.maps.SimilarityMap` on the larger grid
(``values`` ``(H, N)``); ``drift`` a float in the map's units.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from torch import Tensor

from .._validate import check_int
from ..coords import Coords
from ..encoders.base import RotaryEncoder
from .maps import SEED_MAX, SimilarityMap, similarity_map

__all__ = ["RULE_CHOICES", "RuleMap", "plot_scaling_extrapolation", "rule_arguments", "scaling_maps"]

#: the rules drawn by default (``"none"``: plain extrapolation); ``longrope`` needs per-pair factors of a
#: searched model and is not drawn
RULE_CHOICES = ("none", "linear", "ntk", "theta", "dynamic", "ntk-by-parts", "yarn", "llama3", "ref-shape")


@dataclass(frozen=True)
class RuleMap:
    """One panel: ``rule`` (``"none"`` for the unscaled encoder), its map and its drift from the training map.

    ``error`` holds the reason when the encoder refuses the rule (RoPE-Mixed and the spectral rules); ``smap``
    and ``drift`` are then ``None``.
    """

    rule: str
    smap: SimilarityMap | None
    drift: float | None
    error: str | None = None


def rule_arguments(rule: str, grid: Sequence[int], factor: int) -> dict | None:
    """The :class:`~mmpos.scaling.RopeScaling` arguments for "trained on ``grid``, run at ``factor`` times it"."""
    if rule not in RULE_CHOICES:
        raise ValueError(f"rule must be one of {RULE_CHOICES}, got {rule!r}")
    if rule == "none":
        return None
    original = tuple(float(g) for g in grid)
    if rule == "ref-shape":  # the scale is read off the coordinates
        return {"rule": rule, "original_size": original}
    return {"rule": rule, "factor": float(factor), "original_size": original}


def _drift(train: SimilarityMap, wide: SimilarityMap, factor: int) -> float:
    small, big = train.on_grid(), wide.on_grid()
    index = tuple(slice(None, None, factor) for _ in range(big.dim()))
    return float((big[index] - small).abs().mean())


def scaling_maps(
    build: Callable[[dict | None], RotaryEncoder],
    grid: Sequence[int],
    query: Sequence[int],
    factor: int = 2,
    rules: Sequence[str] = RULE_CHOICES,
    content: str | Tensor = "constant",
    seed: int = 0,
) -> tuple[SimilarityMap, list[RuleMap]]:
    """The unscaled map on ``grid`` and one :class:`RuleMap` per rule on ``factor`` times the grid.

    ``build(scaling)`` returns the encoder for a scaling dict (``None``: unscaled); build it with the same seed
    every call so that learned initialisations agree.
    """
    check_int(factor, "factor", 2)
    seed = check_int(seed, "seed", 0, SEED_MAX)
    grid = tuple(grid)
    rules = tuple(rules)
    if not rules:
        raise ValueError(f"rules must name at least one of {RULE_CHOICES}")
    for rule in rules:
        rule_arguments(rule, grid, factor)
    base = build(None)
    if not isinstance(base, RotaryEncoder):
        raise TypeError(
            f"scaling rules apply to rotary encoders, got a {getattr(base, 'kind', type(base).__name__)} one"
        )
    train = similarity_map(base, Coords.grid(*grid), query, content, seed)
    wide_coords = Coords.grid(*(g * factor for g in grid))
    wide_query = [q * factor for q in query]
    out = []
    for rule in rules:
        try:
            encoder = build(rule_arguments(rule, grid, factor))
        except ValueError as e:  # e.g. a spectral rule on RoPE-Mixed's learned plan
            out.append(RuleMap(rule, None, None, str(e)))
            continue
        wide = similarity_map(encoder, wide_coords, wide_query, content, seed)
        out.append(RuleMap(rule, wide, _drift(train, wide, factor)))
    return train, out


def plot_scaling_extrapolation(
    build: Callable[[dict | None], RotaryEncoder],
    grid: Sequence[int],
    query: Sequence[int],
    path: str | Path,
    factor: int = 2,
    rules: Sequence[str] = RULE_CHOICES,
    content: str | Tensor = "constant",
    title: str = "",
    dpi: int = 90,
) -> tuple[SimilarityMap, list[RuleMap]]:
    """:func:`scaling_maps` drawn to ``path`` (PNG): the training map, then one panel per rule (mean of heads).

    2-D grids are images on one colour scale; 1-D grids are curves over the relative position.
    """
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise ValueError(f"path must name a .png file, got {str(path)!r}")
    if len(tuple(grid)) not in (1, 2):
        raise ValueError(f"grid must be 1-D or 2-D for this figure, got {list(grid)}")
    train, maps = scaling_maps(build, grid, query, factor, rules, content)
    panels = [("train grid " + "x".join(map(str, grid)) + ", no scaling", train, None)]
    panels += [(m.rule, m.smap, m) for m in maps]
    two_d = len(tuple(grid)) == 2
    cols = min(5, len(panels))
    rows = -(-len(panels) // cols)
    fig = Figure(figsize=(2.3 * cols + 0.8, 2.4 * rows + 0.5), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    top = max(float(p[1].values.abs().max()) for p in panels if p[1] is not None) or 1.0
    image = None
    for ax, (label, smap, rule_map) in zip(axes.flat, panels):
        ax.set_xticks([])
        ax.set_yticks([])
        if smap is None:
            ax.text(0.5, 0.5, "not defined\nfor this encoder", ha="center", va="center", fontsize=7)
            ax.set_title(label, fontsize=8)
            continue
        values = smap.on_grid().numpy()
        caption = label if rule_map is None else f"{label}: drift {rule_map.drift:.3f}"
        if two_d:
            image = ax.imshow(values, cmap="coolwarm", vmin=-top, vmax=top, interpolation="nearest")
            cell = smap.query_cell
            ax.plot(cell[-1], cell[-2], marker="+", color="k", ms=6)
        else:
            ax.plot([i / len(values) for i in range(len(values))], values, lw=1)
            ax.set_ylim(-top, top)
        ax.set_title(caption, fontsize=7)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    if image is not None:
        fig.colorbar(image, ax=list(axes.flat), shrink=0.8)
    sides = "x".join(str(g * factor) for g in grid)
    fig.suptitle(title or f"q·k / |u|² on {sides} ({factor}x the training grid), per scaling rule", fontsize=9)
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=dpi)
    return train, maps
