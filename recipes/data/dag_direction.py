"""Direction-only node labels on random DAGs, every graph with its reversal.

The decisive check of Geisler et al., "Transformers Meet Directed Graphs" (ICML 2023, Sec. 3:
the magnetic Laplacian's phases carry the edge direction that the symmetric Laplacian drops).
A node's *depth* is the longest path into it from a source, its *height* the longest path out
of it to a sink; the label is ``depth > height`` ("nearer the sinks than the sources"), nodes
with ``depth == height`` are masked out. Reversing every edge swaps depth and height, so it
flips every label while leaving the undirected graph (and so every symmetric PE, and a model
without node features) unchanged: an encoder blind to direction gives the same output for a
graph and its reversal and is exactly at chance on the pair.

Graphs: :func:`recipes.data.digraphs.random_digraph` with ``acyclic=True`` (the reference
playground's DAGs: largest weakly connected component, average degree from
:data:`recipes.data.digraphs.DAG_DEGREES`).

Shapes: ``edge_index`` ``(2, m)`` long; ``depth``, ``height``, ``label`` ``(n,)`` long; ``mask`` ``(n,)`` bool.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from .digraphs import random_digraph

__all__ = ["depth_height", "direction_pairs"]


def depth_height(edge_index: Tensor, num_nodes: int) -> tuple[Tensor, Tensor]:
    """``(depth (n,), height (n,))``: longest path from any source into each node, and out of it to any sink.

    Raises ``ValueError`` if the graph has a cycle.
    """
    src, dst = edge_index[0].tolist(), edge_index[1].tolist()
    indeg = [0] * num_nodes
    out: list[list[int]] = [[] for _ in range(num_nodes)]
    for u, v in zip(src, dst):
        out[u].append(v)
        indeg[v] += 1
    order, stack = [], [u for u in range(num_nodes) if indeg[u] == 0]
    while stack:  # Kahn's topological order
        u = stack.pop()
        order.append(u)
        for v in out[u]:
            indeg[v] -= 1
            if indeg[v] == 0:
                stack.append(v)
    if len(order) != num_nodes:
        raise ValueError("edge_index must describe a DAG (it has a cycle)")
    depth, height = [0] * num_nodes, [0] * num_nodes
    for u in order:
        for v in out[u]:
            depth[v] = max(depth[v], depth[u] + 1)
    for u in reversed(order):
        for v in out[u]:
            height[u] = max(height[u], height[v] + 1)
    return torch.tensor(depth), torch.tensor(height)


def direction_pairs(num: int, sizes: tuple[int, int], seed: int) -> list[dict[str, Tensor | int]]:
    """``2 * num`` graphs: ``num`` random DAGs, each followed by its reversal.

    Each item: ``{"edge_index", "num_nodes", "label" (n,), "mask" (n,), "depth", "height"}``.
    """
    if not isinstance(num, int) or num < 1:
        raise ValueError(f"num must be a positive int, got {num!r}")
    if len(sizes) != 2 or not 2 <= sizes[0] <= sizes[1]:
        raise ValueError(f"sizes must be (min_nodes, max_nodes) with 2 <= min <= max, got {sizes!r}")
    rng = np.random.default_rng(seed)
    items: list[dict[str, Tensor | int]] = []
    while len(items) < 2 * num:
        edge_index, n = random_digraph(int(rng.integers(sizes[0], sizes[1] + 1)), rng, acyclic=True)
        depth, height = depth_height(edge_index, n)
        mask = depth != height
        if not mask.any():
            continue
        for ei, d, h in ((edge_index, depth, height), (edge_index.flip(0), height, depth)):
            items.append(
                {"edge_index": ei, "num_nodes": n, "label": (d > h).long(), "mask": mask, "depth": d, "height": h}
            )
    return items
