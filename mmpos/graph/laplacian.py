"""The magnetic Laplacian of a directed graph (plain tensors; no PyG types).

Geisler et al., "Transformers Meet Directed Graphs", ICML 2023 (arXiv 2302.00049);
reference implementation google-deepmind/digraph_transformer, ``utils.py``
(``eigv_magnetic_laplacian_numba``), read for the formulas. With ``A`` the binarised
adjacency (``A[s, r] = 1`` for an edge ``s -> r``; multi-edges collapse to one):

* ``A_s = 1[A + A^T > 0]`` (the symmetrised graph), ``d = A_s 1``;
* with ``"sym"``, ``d`` is clipped at 1 inside ``D^-1/2`` (an isolated node's diagonal entry
  is then 1, as in the reference); with ``None`` it is not (an isolated node's row is 0,
  eigenvalue 0, as the reference's ``use_symmetric_norm=False`` branch);
* ``Theta = 2 pi q (A - A^T)``;
* ``L_q = I - (D^-1/2 A_s D^-1/2) * exp(i Theta)`` (``normalization="sym"``) or
  ``L_q = D - A_s * exp(i Theta)`` (``normalization=None``).

``L_q`` is Hermitian; with ``"sym"`` its eigenvalues lie in ``[0, 2]``; ``q = 0`` gives
the normalised Laplacian of the symmetrised graph. Self-loops are kept as in the
reference (``A_s[i, i] = 1`` counts once in the degree and has phase 0); PyG's
``get_laplacian`` drops them.

Relative ``q`` (the reference's default): ``q = q' / max(min(m_dir, n), 1)`` where
``m_dir`` counts the one-way edges (``A[u, v] = 1`` and ``A[v, u] = 0``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from .._extras import requires
from .._validate import check_finite, check_finites, check_int

with requires("graph"):  # one line naming the package and the extra when it is missing
    import scipy.sparse as sp

__all__ = ["NORMALIZATIONS", "magnetic_laplacian", "num_one_way_edges", "relative_q"]

# Package helpers (used by eigen.py, random_walk.py and the transforms; not re-exported):
# edge_array, binary_adjacency, check_q, scipy_magnetic_laplacian.

NORMALIZATIONS = ("sym", None)


def edge_array(edge_index: Tensor | np.ndarray, num_nodes: int) -> np.ndarray:
    """Validated ``(2, m)`` int64 numpy copy of ``edge_index``."""
    check_int(num_nodes, "num_nodes")
    if isinstance(edge_index, Tensor):
        if edge_index.is_floating_point() or edge_index.is_complex() or edge_index.dtype == torch.bool:
            raise TypeError(f"edge_index must be an integer tensor, got {edge_index.dtype}")
        ei = edge_index.detach().cpu().numpy()
    elif isinstance(edge_index, np.ndarray):
        if not np.issubdtype(edge_index.dtype, np.integer):
            raise TypeError(f"edge_index must be an integer array, got {edge_index.dtype}")
        ei = edge_index
    else:
        raise TypeError(f"edge_index must be a tensor or numpy array of shape (2, m), got {type(edge_index).__name__}")
    if ei.ndim != 2 or ei.shape[0] != 2:
        raise ValueError(f"edge_index must have shape (2, m), got {tuple(ei.shape)}")
    ei = ei.astype(np.int64, copy=False)
    if ei.size and (ei.min() < 0 or ei.max() >= num_nodes):
        raise ValueError(f"edge_index holds node ids outside [0, num_nodes={num_nodes}): [{ei.min()}, {ei.max()}]")
    return ei


def binary_adjacency(ei: np.ndarray, n: int) -> sp.csr_matrix:
    """Binarised directed adjacency ``A`` ``(n, n)`` float64 (multi-edges collapse)."""
    a = sp.csr_matrix((np.ones(ei.shape[1]), (ei[0], ei[1])), shape=(n, n))
    a.data[:] = 1.0  # duplicates were summed by the constructor
    return a


def num_one_way_edges(edge_index: Tensor | np.ndarray, num_nodes: int) -> int:
    """Number of edges ``u -> v`` without the reverse edge ``v -> u`` (multi-edges count once)."""
    a = binary_adjacency(edge_array(edge_index, num_nodes), num_nodes)
    return int((a - a.T).maximum(0).nnz)


def relative_q(q: float, num_one_way: int, num_nodes: int) -> float:
    """The reference's graph-relative potential ``q / max(min(num_one_way, num_nodes), 1)``."""
    return q / max(min(num_one_way, num_nodes), 1)


def check_q(q: float | Sequence[float]) -> tuple[float, ...]:
    """One potential or a non-empty sequence of them, as a tuple of floats (``ValueError`` otherwise)."""
    return check_finites(q, "q")


def scipy_magnetic_laplacian(a: sp.csr_matrix, q: float, normalization: str | None) -> sp.csr_matrix:
    """``L_q`` as a scipy CSR matrix (complex128, or float64 when ``q == 0``)."""
    n = a.shape[0]
    a_s = ((a + a.T) > 0).astype(np.float64).tocsr()
    deg = np.asarray(a_s.sum(axis=1)).ravel()
    if normalization == "sym":
        dinv = sp.diags(np.maximum(deg, 1.0) ** -0.5)  # the reference's clip: isolated nodes get L[u, u] = 1
        w = (dinv @ a_s @ dinv).tocsr()
        eye = sp.identity(n, format="csr")
    else:
        w, eye = a_s, sp.diags(deg).tocsr()  # no clip (reference): an isolated node's row is 0
    if q == 0:
        return (eye - w).tocsr()
    # exp(i Theta) - 1 is non-zero only on one-way pairs (Theta = +-2 pi q there, 0 elsewhere)
    phase = (a - a.T).tocsr()
    phase.eliminate_zeros()
    phase.data = np.exp(2j * math.pi * q * phase.data) - 1.0
    wq = w.astype(np.complex128) + w.multiply(phase)
    return (eye.astype(np.complex128) - wq).tocsr()


def magnetic_laplacian(
    edge_index: Tensor,
    num_nodes: int,
    q: float = 0.25,
    normalization: str | None = "sym",
    q_relative: bool = False,
) -> Tensor:
    """The magnetic Laplacian ``L_q`` of a directed graph as a sparse COO tensor.

    Args:
        edge_index: ``(2, m)`` integer tensor, edges ``edge_index[0] -> edge_index[1]``.
        num_nodes: ``n`` (at least 1).
        q: the potential (absolute, or ``q'`` when ``q_relative``).
        normalization: ``"sym"`` (``I - D^-1/2 ... D^-1/2``) or ``None`` (``D - ...``).
        q_relative: use :func:`relative_q` (the reference's default for its data sets).

    Returns:
        coalesced sparse COO ``(n, n)``, complex128 (float64 when the effective ``q`` is 0).
    """
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {normalization!r}")
    q = check_finite(q, "q")
    ei = edge_array(edge_index, num_nodes)
    a = binary_adjacency(ei, num_nodes)
    if q_relative:
        q = relative_q(q, int((a - a.T).maximum(0).nnz), num_nodes)
    lap = scipy_magnetic_laplacian(a, q, normalization).tocoo()
    idx = torch.from_numpy(np.vstack([lap.row, lap.col]).astype(np.int64))
    return torch.sparse_coo_tensor(
        idx, torch.from_numpy(lap.data), (num_nodes, num_nodes), check_invariants=False
    ).coalesce()
