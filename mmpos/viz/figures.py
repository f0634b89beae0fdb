"""PNG figures of what an encoder does (matplotlib, Agg canvas: no display needed).

Each ``plot_*`` function computes its arrays with :mod:`mmpos.viz.maps`, draws them to
``path`` and returns the arrays, so what a figure shows can be checked as numbers.

* :func:`plot_similarity` -- a :func:`~mmpos.viz.maps.similarity_map` on the token grid
  (2-D: an image; 3-D: a strip of frames; no grid or 1-D: a curve), averaged over heads or
  one panel per head, the query marked.
* :func:`plot_extrapolation` -- the training grid and ``factor`` times it, side by side.
* :func:`plot_plan` -- the axis every rotary pair reads (per head) and its frequency.
* :func:`plot_layout` -- one row per position axis of a layout, coloured by value along the
  token sequence, vision blocks marked; several layouts (schemes) stacked.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from torch import Tensor

from .._extras import requires
from ..coords import Coords, Modality
from ..encoders.base import PositionEncoder, RotaryEncoder
from ..rotary import FrequencyPlan
from .maps import LayoutRows, PlanTable, SimilarityMap, extrapolation_maps, layout_rows, plan_table, similarity_map

with requires("viz"):  # one line naming the package and the extra when it is missing
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

__all__ = ["plot_extrapolation", "plot_layout", "plot_plan", "plot_similarity", "plot_similarity_map"]

_TITLES = {
    "rotary": "q·k / |u|² (rotated content)",
    "bias": "attention-logit bias",
    "additive": "cosine similarity of embeddings",
    "conv": "impulse response (channel RMS)",
}
_MODALITY_COLOURS = {int(Modality.IMAGE): "tab:orange", int(Modality.VIDEO): "tab:green"}


def _save(fig: Figure, path: str | Path, dpi: int) -> None:
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise ValueError(f"path must name a .png file, got {str(path)!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=dpi)


def _shared(smap: SimilarityMap) -> bool:
    """Whether every head has the same map (one shared plan or table, or identical per-head ones)."""
    return smap.values.shape[0] == 1 or bool((smap.values == smap.values[:1]).all())


def _heads(smap: SimilarityMap, head: int | str) -> list[int | str]:
    """The heads to draw: ``"all"`` gives one panel per head only where the heads' maps differ."""
    if head == "all":
        return [0] if _shared(smap) else list(range(smap.values.shape[0]))
    smap.on_grid(head)  # validates
    return [head]


def _panel_name(label: str, smap: SimilarityMap, head: int | str, asked: int | str) -> str:
    if asked == "all" and _shared(smap):
        return f"{label} (one map: the heads do not differ)"
    if smap.values.shape[0] == 1:
        return label
    return f"{label}, {'mean of heads' if head == 'mean' else f'head {head}'}"


def _limits(values: Tensor, kind: str) -> tuple[str, float, float]:
    top = float(values.abs().max()) or 1.0
    if kind == "conv":
        return "viridis", 0.0, top
    return "coolwarm", -top, top


def _side_by_side(rows) -> bool:
    return len(rows) > 1 and all(smap.grid_shape is not None and len(smap.grid_shape) == 2 for _, smap, _ in rows)


def _draw_map(fig: Figure, smaps: Sequence[tuple[str, SimilarityMap]], head: int | str) -> None:
    """One row per (label, head), one column per frame (3-D) or a single panel (2-D, 1-D)."""
    rows = [(label, smap, h) for label, smap in smaps for h in _heads(smap, head)]
    frames = max((smap.grid_shape[0] if smap.grid_shape and len(smap.grid_shape) == 3 else 1) for _, smap, _ in rows)
    side = _side_by_side(rows)  # several 2-D maps: one row of panels, indexed [r, 0] all the same
    axes = fig.subplots(1, len(rows), squeeze=False).T if side else fig.subplots(len(rows), frames, squeeze=False)
    for r, (label, smap, h) in enumerate(rows):
        grid = smap.on_grid(h).numpy()
        cmap, lo, hi = _limits(smap.values, smap.kind)
        cell = smap.query_cell
        name = _panel_name(label, smap, h, head)
        if smap.grid_shape is None or len(smap.grid_shape) == 1:
            ax = axes[r, 0]
            ax.plot(grid, lw=1)
            ax.axvline(cell[0], color="k", lw=0.6, ls="--")
            ax.set_xlabel("token")
            ax.set_title(name, fontsize=8)
            for extra in axes[r, 1:]:
                extra.axis("off")
            continue
        images = grid[None] if grid.ndim == 2 else grid
        for f in range(frames):
            ax = axes[r, f]
            if f >= images.shape[0]:
                ax.axis("off")
                continue
            im = ax.imshow(images[f], cmap=cmap, vmin=lo, vmax=hi, interpolation="nearest")
            ax.xaxis.set_major_locator(MaxNLocator(nbins=5, integer=True))
            ax.yaxis.set_major_locator(MaxNLocator(nbins=5, integer=True))
            ax.tick_params(labelsize=7)
            ax.set_xlabel("column (w)", fontsize=7)
            if f == 0:
                ax.set_ylabel("row (h)", fontsize=7)
            if len(cell) == 2 or cell[0] == f:
                ax.plot(cell[-1], cell[-2], marker="+", color="k", ms=6)
            title = name if images.shape[0] == 1 else (f"t={f}" if r else f"{name}\nt={f}")
            ax.set_title(title, fontsize=7)
        if not side or r == len(rows) - 1:
            bar = fig.colorbar(im, ax=list(axes.flat) if side else list(axes[r]), shrink=0.8)
            bar.ax.tick_params(labelsize=7)
    fig.suptitle(_TITLES.get(rows[0][1].kind, ""), fontsize=9)


def plot_similarity_map(
    smap: SimilarityMap, path: str | Path, head: int | str = "mean", title: str = "", dpi: int = 120
):
    """Draw an already computed :class:`~mmpos.viz.maps.SimilarityMap` to ``path``; returns it.

    Panels of about 3.4 x 3.4 in (at the default 120 dpi about 400 px each) with row and column
    labels and a colour bar; ``head="all"`` draws one panel per head only where the heads differ.
    """
    heads = len(_heads(smap, head))
    frames = smap.grid_shape[0] if smap.grid_shape and len(smap.grid_shape) == 3 else 1
    if smap.grid_shape is not None and len(smap.grid_shape) == 2:
        frames, heads = heads, 1  # heads side by side
    fig = Figure(figsize=(min(3.4 * frames + 1.4, 24), 3.4 * heads + 0.6), layout="constrained")
    _draw_map(fig, [(title or smap.kind, smap)], head)
    _save(fig, path, dpi)
    return smap


def plot_similarity(
    encoder: PositionEncoder,
    coords: Coords,
    query: Sequence[float],
    path: str | Path,
    head: int | str = "mean",
    content: str | Tensor = "constant",
    seed: int = 0,
    title: str = "",
    dpi: int = 120,
) -> SimilarityMap:
    """:func:`~mmpos.viz.maps.similarity_map` drawn to ``path`` (``head``: an index, ``"mean"`` or ``"all"``)."""
    smap = similarity_map(encoder, coords, query, content, seed)
    return plot_similarity_map(smap, path, head, title or type(encoder).__name__, dpi)


def plot_extrapolation(
    encoder: PositionEncoder,
    grid: Sequence[int],
    query: Sequence[int],
    path: str | Path,
    factor: int = 2,
    num_prefix_tokens: int = 0,
    head: int | str = "mean",
    content: str | Tensor = "constant",
    dpi: int = 90,
) -> tuple[SimilarityMap, SimilarityMap]:
    """:func:`~mmpos.viz.maps.extrapolation_maps` side by side (2-D grids) or stacked (others)."""
    train, wide = extrapolation_maps(encoder, grid, query, factor, num_prefix_tokens, content)
    labels = (f"train grid {'x'.join(map(str, grid))}", f"{factor}x: {'x'.join(str(g * factor) for g in grid)}")
    if len(tuple(grid)) == 2:
        fig = Figure(figsize=(7, 3.4), layout="constrained")
        for sub, label, smap in zip(fig.subfigures(1, 2), labels, (train, wide)):
            _draw_map(sub, [(label, smap)], head)
    else:
        fig = Figure(figsize=(10, 5), layout="constrained")
        _draw_map(fig, list(zip(labels, (train, wide))), head)
    _save(fig, path, dpi)
    return train, wide


def plot_plan(plan: FrequencyPlan | RotaryEncoder, path: str | Path, title: str = "", dpi: int = 90) -> PlanTable:
    """Axis read by every pair (one row per head) above the pairs' frequencies (log scale)."""
    table = plan_table(plan)
    heads, pairs = table.axis.shape
    fig = Figure(figsize=(8, 1.2 + 0.25 * heads + 2.2), layout="constrained")
    top, bottom = fig.subplots(2, 1, height_ratios=[0.6 + 0.25 * heads, 2.2])
    names = ["none", *table.axes]
    cmap = _categorical(len(names))
    top.imshow(
        table.axis.numpy() + 1, cmap=cmap, vmin=-0.5, vmax=len(names) - 0.5, aspect="auto", interpolation="nearest"
    )
    top.set_yticks(range(heads), [f"head {h}" for h in range(heads)] if heads > 1 else ["all heads"], fontsize=7)
    top.set_xticks([])
    top.set_title(title or "axis read by each rotary pair", fontsize=9)
    for a, name in enumerate(names):
        if a == 0 and not bool((table.axis < 0).any()):
            continue
        top.plot([], [], "s", color=cmap(a), label=name)
    top.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False)
    for h in range(heads):
        for a in range(-1, len(table.axes)):
            sel = table.axis[h] == a
            if bool(sel.any()):
                idx = sel.nonzero().flatten()
                freq = table.freq[h, idx].clamp_min(1e-12).numpy()
                bottom.scatter(idx.numpy(), freq, s=6, color=cmap(a + 1), label=None)
    bottom.set_yscale("log")
    bottom.set_xlim(-0.5, pairs - 0.5)
    bottom.set_xlabel("rotary pair p")
    bottom.set_ylabel("frequency (rad / unit)")
    _save(fig, path, dpi)
    return table


def _categorical(n: int):
    from matplotlib.colors import ListedColormap

    colours = ["lightgrey", "tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"]
    return ListedColormap(colours[:n] if n <= len(colours) else colours + ["black"] * (n - len(colours)))


def plot_layout(layouts, path: str | Path, sample: int = 0, dpi: int = 110) -> list[LayoutRows]:
    """One panel per layout (e.g. per scheme), one row per axis coloured by position value."""
    layouts = list(layouts) if isinstance(layouts, (list, tuple)) else [layouts]
    if not layouts:
        raise ValueError("layouts must hold at least one Layout")
    rows = [layout_rows(layout, sample) for layout in layouts]
    length = max(r.values.shape[1] for r in rows)
    # cells of about 0.28 in (labelled up to 64 tokens), the figure at most 28 in wide
    fig = Figure(figsize=(min(3 + 0.28 * length, 28), 0.6 + sum(0.7 + 0.36 * r.values.shape[0] for r in rows)))
    fig.set_layout_engine("constrained")
    axes = fig.subplots(len(rows), 1, squeeze=False, height_ratios=[0.5 + r.values.shape[0] for r in rows])[:, 0]
    for ax, r in zip(axes, rows):
        values = r.values.numpy()
        im = ax.imshow(values, aspect="auto", cmap="viridis", interpolation="nearest")
        ax.set_yticks(range(len(r.axes)), r.axes, fontsize=8)
        ax.set_title(f"{r.scheme}: position ids along the sequence", fontsize=9, loc="left")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if values.shape[1] <= 64:
            for a in range(values.shape[0]):
                for n in range(values.shape[1]):
                    ax.text(n, a, f"{values[a, n]:g}", ha="center", va="center", fontsize=7, color="w")
        for start, stop, mod in r.blocks:
            colour = _MODALITY_COLOURS.get(mod, "tab:red")
            ax.axvspan(start - 0.5, stop - 0.5, ymin=0, ymax=1, fill=False, edgecolor=colour, lw=1.5)
            ax.annotate(
                Modality(mod).name.lower(),
                ((start + stop - 1) / 2, 1.01),
                xycoords=("data", "axes fraction"),
                ha="center",
                va="bottom",
                fontsize=6,
                color=colour,
            )
        ax.set_xlabel("token index")
        fig.colorbar(im, ax=ax, shrink=0.8, pad=0.01)
    _save(fig, path, dpi)
    return rows
