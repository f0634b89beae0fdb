"""Random directed graphs and directed pairwise targets (the "playground" of Geisler et al.).

Geisler et al., "Transformers Meet Directed Graphs", ICML 2023; generator read in
google-deepmind/digraph_transformer ``script_generate_distance_np.py``
(``_random_er_graph``, ``generate_sample``): Erdős–Rényi digraphs with edge probability
``p = d / (n - 1)`` for an average degree ``d`` drawn from ``(1, 1.5, 2)``
(``(1, 1.5, 2, 2.5, 3)`` for DAGs, which keep the upper triangle and then permute the
nodes), restricted to the largest weakly connected component; targets for every ordered
pair: reachability (``u`` reaches ``v`` along edges) and the directed shortest-path
distance (``-1`` when unreachable). The graphs carry no node features.

Shapes: ``edge_index`` ``(2, m)`` long; targets ``(n, n)``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

__all__ = ["DAG_DEGREES", "ER_DEGREES", "directed_distances", "random_digraph", "reachability"]

ER_DEGREES = (1.0, 1.5, 2.0)
DAG_DEGREES = (1.0, 1.5, 2.0, 2.5, 3.0)


def _largest_weak_component(adj: np.ndarray) -> np.ndarray:
    n = adj.shape[0]
    und = adj | adj.T
    label = -np.ones(n, dtype=np.int64)
    for start in range(n):
        if label[start] >= 0:
            continue
        frontier = np.zeros(n, dtype=bool)
        frontier[start] = True
        seen = frontier.copy()
        while frontier.any():
            frontier = und[frontier].any(0) & ~seen
            seen |= frontier
        label[seen] = start
    sizes = np.bincount(label, minlength=n)
    return np.flatnonzero(label == sizes.argmax())  # ties: the component of the smallest node


def random_digraph(
    num_nodes: int, rng: np.random.Generator, avg_degree: float | None = None, acyclic: bool = False
) -> tuple[Tensor, int]:
    """``(edge_index (2, m), n)``: an ER digraph's largest weakly connected component (``n <= num_nodes``).

    ``avg_degree`` ``None`` draws it from :data:`ER_DEGREES` (:data:`DAG_DEGREES` when ``acyclic``).
    """
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 2:
        raise ValueError(f"num_nodes must be an int >= 2, got {num_nodes!r}")
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    if avg_degree is None:
        avg_degree = float(rng.choice(DAG_DEGREES if acyclic else ER_DEGREES))
    if not 0 < avg_degree <= num_nodes - 1:
        raise ValueError(f"avg_degree must be in (0, num_nodes - 1], got {avg_degree!r}")
    adj = rng.random((num_nodes, num_nodes)) < avg_degree / (num_nodes - 1)
    np.fill_diagonal(adj, False)
    if acyclic:
        perm = rng.permutation(num_nodes)
        adj = np.triu(adj, k=1)[perm][:, perm]
    keep = _largest_weak_component(adj)
    sub = adj[np.ix_(keep, keep)]
    return torch.from_numpy(np.stack(np.nonzero(sub)).astype(np.int64)), int(keep.size)


def directed_distances(edge_index: Tensor, num_nodes: int) -> Tensor:
    """``(n, n)`` long: hops of the shortest directed path ``u -> v`` (0 on the diagonal, -1 if none)."""
    adj = np.zeros((num_nodes, num_nodes), dtype=bool)
    ei = edge_index.numpy()
    adj[ei[0], ei[1]] = True
    dist = np.full((num_nodes, num_nodes), -1, dtype=np.int64)
    np.fill_diagonal(dist, 0)
    reached = np.eye(num_nodes, dtype=bool)
    frontier = reached.copy()
    hops = 0
    while frontier.any():
        hops += 1
        frontier = (frontier.astype(np.int64) @ adj.astype(np.int64) > 0) & ~reached
        dist[frontier] = hops
        reached |= frontier
    return torch.from_numpy(dist)


def reachability(edge_index: Tensor, num_nodes: int) -> Tensor:
    """``(n, n)`` bool: ``u`` reaches ``v`` by a directed path of at least one edge."""
    dist = directed_distances(edge_index, num_nodes)
    reach = dist > 0
    adj = torch.zeros(num_nodes, num_nodes, dtype=torch.bool)
    adj[edge_index[0], edge_index[1]] = True
    diag = (adj.float() @ (dist >= 0).float() > 0).diagonal()  # on a cycle through u
    return reach | torch.diag(diag)
