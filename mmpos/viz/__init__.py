"""See an encoder: similarity maps, frequency plans and layout position ids as arrays and PNGs.

:mod:`mmpos.viz.maps` computes the arrays (pure functions), :mod:`mmpos.viz.figures` draws
them with matplotlib (Agg canvas) and returns the arrays. The CLI: ``mmpos plot ...``
(:mod:`mmpos.viz.cli`). See ``docs/viz.md``.
"""

from .figures import plot_extrapolation, plot_layout, plot_plan, plot_similarity, plot_similarity_map
from .maps import (
    CONTENTS,
    LayoutRows,
    PlanTable,
    SimilarityMap,
    extrapolation_maps,
    layout_rows,
    plan_table,
    query_index,
    similarity_map,
)

__all__ = [
    "CONTENTS",
    "LayoutRows",
    "PlanTable",
    "SimilarityMap",
    "extrapolation_maps",
    "layout_rows",
    "plan_table",
    "plot_extrapolation",
    "plot_layout",
    "plot_plan",
    "plot_similarity",
    "plot_similarity_map",
    "query_index",
    "similarity_map",
]
