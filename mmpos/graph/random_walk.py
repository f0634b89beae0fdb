"""Directional random walks and personalised PageRank (plain tensors; no PyG types).

Geisler et al., "Transformers Meet Directed Graphs", ICML 2023; reference
google-deepmind/digraph_transformer ``utils.py`` (``dense_random_walk_matrix``,
``k_step_random_walk``, ``exact_ppr_from_trans``) and ``models.py`` (forward and
reverse walks concatenated), read for the formulas.

* ``T = D_out^-1 A`` (row-stochastic; ``A`` binarised, multi-edges collapse; a sink,
  i.e. a node without out-edges, gets a self-loop ``T[u, u] = 1``);
* walks ``T^1 ... T^L`` and personalised PageRank ``alpha (I - (1 - alpha) T)^-1``;
* the same for the reversed graph (``A^T``), so direction is visible both ways.

Relative form (pairwise, for an attention bias): ``(n, n, F)`` with
``F = 2 (L + [alpha given])``, channel order ``[T^1..T^L, PPR, Tr^1..Tr^L, PPRr]``;
entry ``[u, v]`` is the probability of going from ``u`` to ``v``.

Absolute form (per node): the column sums of the same ``F`` matrices, ``(n, F)``:
entry ``[v, c]`` is the expected number of walkers at ``v`` when one walker starts on
every node (for PPR: ``n`` times the PageRank with uniform restarts). It needs only
sparse products, so it also runs on large graphs.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from .._extras import requires
from .._validate import check_float, check_int
from .laplacian import binary_adjacency, edge_array

with requires("graph"):  # one line naming the package and the extra when it is missing
    import scipy.sparse as sp

__all__ = ["directional_random_walk_node_pe", "directional_random_walks", "transition_matrix"]


def check_walk(walk_length: int, ppr_alpha: float | None) -> None:
    check_int(walk_length, "walk_length")
    check_float(ppr_alpha, "ppr_alpha", high=1.0, none_ok=True)


def _transition(a: sp.csr_matrix) -> sp.csr_matrix:
    out = np.asarray(a.sum(axis=1)).ravel()
    sinks = out == 0
    t = sp.diags(np.where(sinks, 0.0, 1.0 / np.where(sinks, 1.0, out))) @ a + sp.diags(sinks.astype(np.float64))
    return t.tocsr()


def transition_matrix(edge_index: Tensor, num_nodes: int, reverse: bool = False) -> Tensor:
    """Dense ``(n, n)`` float64 ``T = D_out^-1 A`` (of ``A^T`` when ``reverse``), sinks self-looped."""
    a = binary_adjacency(edge_array(edge_index, num_nodes), num_nodes)
    return torch.from_numpy(_transition(a.T.tocsr() if reverse else a).toarray())


def directional_random_walks(
    edge_index: Tensor, num_nodes: int, walk_length: int = 3, ppr_alpha: float | None = 0.1, max_nodes: int = 4096
) -> Tensor:
    """Relative form ``(n, n, F)`` float64 (see the module docstring); dense, so ``n <= max_nodes``."""
    check_walk(walk_length, ppr_alpha)
    if num_nodes > max_nodes:
        raise ValueError(
            f"the relative random-walk form is dense (n, n, F); num_nodes={num_nodes} exceeds max_nodes={max_nodes} "
            "(use directional_random_walk_node_pe for large graphs)"
        )
    a = binary_adjacency(edge_array(edge_index, num_nodes), num_nodes)
    mats = []
    for adj in (a, a.T.tocsr()):
        t = _transition(adj).toarray()
        power = t
        mats.append(power)
        for _ in range(walk_length - 1):
            power = power @ t
            mats.append(power)
        if ppr_alpha is not None:
            mats.append(ppr_alpha * np.linalg.inv(np.eye(num_nodes) - (1 - ppr_alpha) * t))
    return torch.from_numpy(np.stack(mats, axis=-1))


def directional_random_walk_node_pe(
    edge_index: Tensor, num_nodes: int, walk_length: int = 3, ppr_alpha: float | None = 0.1, tol: float = 1e-12
) -> Tensor:
    """Absolute form ``(n, F)`` float64: column sums of the relative form, by sparse products.

    PPR column sums solve ``p = alpha 1 + (1 - alpha) T^T p`` by fixed-point iteration
    (contraction factor ``1 - alpha``) until the update is below ``tol * n``.
    """
    check_walk(walk_length, ppr_alpha)
    a = binary_adjacency(edge_array(edge_index, num_nodes), num_nodes)
    cols = []
    for adj in (a, a.T.tocsr()):
        tt = _transition(adj).T.tocsr()
        p = np.ones(num_nodes)
        for _ in range(walk_length):
            p = tt @ p
            cols.append(p)
        if ppr_alpha is not None:
            ones = np.ones(num_nodes)
            p = ones.copy()
            for _ in range(100_000):
                new = ppr_alpha * ones + (1 - ppr_alpha) * (tt @ p)
                done = np.abs(new - p).max() <= tol * num_nodes
                p = new
                if done:
                    break
            cols.append(p)
    return torch.from_numpy(np.stack(cols, axis=-1))
