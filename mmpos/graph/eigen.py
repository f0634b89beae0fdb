"""Eigenpairs of the magnetic Laplacian: dense batched ``eigh`` and sparse Lanczos.

Geisler et al., ICML 2023 (google-deepmind/digraph_transformer ``utils.py``,
``eigv_magnetic_laplacian_numba``): the ``k`` smallest eigenpairs of ``L_q``, the first
(trivial at ``q = 0``) kept, zero-padded when ``n < k``. Computed in float64/complex128.

Solvers:

* ``"dense"``: LAPACK ``eigh`` on the dense ``(n, n)`` matrix; graphs of one size are
  stacked and solved in one batched call (:func:`maglap_eigenpairs_many`).
* ``"lanczos"``: ARPACK ``eigsh`` (implicitly restarted Lanczos) with the fixed start
  vector ``ones``, on ``2I - L`` (largest algebraic eigenvalues converge fastest). A
  complex Hermitian ``L = X + iY`` is solved as the real symmetric ``2n x 2n`` matrix
  ``[[X, -Y], [Y, X]]``, whose spectrum is that of ``L`` with every eigenvalue twice;
  the ``2k`` Ritz vectors ``[x; y]`` give complex vectors ``x + iy`` that span the
  ``k``-dimensional eigenspace, from which a Rayleigh-Ritz step recovers ``L``'s pairs.

Phase normalisation (``normalize=True``; this package's convention, not the
reference's ``sign_rotate``, which picks the rotation from the argmax of the imaginary
part of the first eigenvector and so still depends on the phase the solver returned):
each eigenvector ``v`` is multiplied by ``conj(v[a]) / |v[a]|`` where the anchor ``a``
is the first node whose magnitude ``|v[a]|`` is within ``tol`` of ``max |v|``. Then
``v[a]`` is real and positive, and the result is the same for ``v`` and
``exp(i phi) v`` (for real vectors: the same for ``v`` and ``-v``). Ties: anchors whose
magnitudes differ by less than ``tol`` are ordered by node index; magnitudes that
differ by about ``tol`` can still flip the choice under rounding. A degenerate
eigenvalue has no canonical basis: its vectors are whatever the solver returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla
import torch
from torch import Tensor

from .laplacian import NORMALIZATIONS, _adjacency, _check_q, _edges, _maglap_scipy, relative_q

__all__ = ["SOLVERS", "MagLapEigen", "maglap_eigenpairs", "maglap_eigenpairs_many", "normalize_phase"]

SOLVERS = ("auto", "dense", "lanczos")


@dataclass(frozen=True)
class MagLapEigen:
    """Eigenpairs of one graph for ``Q`` potentials.

    Attributes:
        eigval: ``(Q, k)`` float64, ascending; padding entries are 0.
        eigvec: ``(n, Q, k)`` complex128 (columns unit norm); padding columns are 0.
        mask: ``(k,)`` bool, ``True`` for real eigenpairs (``False`` for the padding when ``n < k``).
        q: ``(Q,)`` float64, the absolute potentials used (after the relative rule).
    """

    eigval: Tensor
    eigvec: Tensor
    mask: Tensor
    q: Tensor


def normalize_phase(vec: np.ndarray, tol: float = 1e-6) -> np.ndarray:
    """Deterministic phase (sign for real input) of the columns of ``vec`` ``(..., n, k)``.

    See the module docstring for the convention and its ties. Zero columns stay zero.
    """
    mag = np.abs(vec)
    anchor = np.argmax(mag >= mag.max(axis=-2, keepdims=True) - tol, axis=-2)  # (..., k), first index
    ref = np.take_along_axis(vec, anchor[..., None, :], axis=-2)  # (..., 1, k)
    size = np.abs(ref)
    unit = np.where(size > 0, ref / np.where(size > 0, size, 1.0), 1.0)
    return vec * np.conj(unit)


def _check_k(k: int) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    return int(k)


def _solve_dense(lap: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``(..., n, n)`` Hermitian -> ``(..., min(k, n))`` eigenvalues and ``(..., n, min(k, n))`` vectors."""
    if np.iscomplexobj(lap) and not np.any(lap.imag):
        lap = lap.real
    val, vec = np.linalg.eigh(lap)
    return val[..., :k].copy(), vec[..., :, :k].copy()  # copies: views would keep all n eigenvectors alive


def _solve_lanczos(lap: sp.csr_matrix, k: int, tol: float) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` smallest eigenpairs of a sparse Hermitian ``L`` (eigenvalues in ``[0, 2]``)."""
    n = lap.shape[0]
    if k >= n:
        raise ValueError(f"solver='lanczos' needs num_nodes > k, got num_nodes={n}, k={k}; use solver='dense'")
    if not np.iscomplexobj(lap.data) or not np.any(lap.data.imag):
        shifted = (2.0 * sp.identity(n) - lap.real).tocsr()
        val, vec = spla.eigsh(shifted, k=k, which="LA", v0=np.ones(n), tol=tol)
        order = np.argsort(2.0 - val, kind="stable")
        return (2.0 - val)[order], vec[:, order]
    x, y = lap.real, lap.imag
    real = sp.bmat([[x, -y], [y, x]], format="csr")
    shifted = (2.0 * sp.identity(2 * n) - real).tocsr()
    _, vec = spla.eigsh(shifted, k=2 * k, which="LA", v0=np.ones(2 * n), tol=tol)
    cvec = vec[:n] + 1j * vec[n:]  # (n, 2k), spans the k-dim eigenspace of L twice
    gram_val, gram_vec = np.linalg.eigh(cvec.conj().T @ cvec)
    basis = cvec @ (gram_vec[:, -k:] / np.sqrt(gram_val[-k:]))  # (n, k) orthonormal
    val, small = np.linalg.eigh(basis.conj().T @ (lap @ basis))  # Rayleigh-Ritz
    return val, basis @ small


def _effective_qs(a: sp.csr_matrix, n: int, qs: tuple[float, ...], q_relative: bool) -> list[float]:
    """Absolute potentials; 0 for a graph without one-way edges (its ``L_q`` is real for every ``q``)."""
    one_way = int((a - a.T).maximum(0).nnz)
    if one_way == 0:
        return [0.0] * len(qs)
    return [relative_q(q, one_way, n) if q_relative else q for q in qs]


def _pack(vals: list[np.ndarray], vecs: list[np.ndarray], n: int, k: int, qs: list[float], normalize: bool, tol: float):
    m = min(k, n)
    eigval = np.zeros((len(qs), k))
    eigvec = np.zeros((n, len(qs), k), dtype=np.complex128)
    for i, (val, vec) in enumerate(zip(vals, vecs)):
        eigval[i, :m] = val[:m]
        eigvec[:, i, :m] = normalize_phase(vec[:, :m], tol) if normalize else vec[:, :m]
    mask = np.arange(k) < n
    return MagLapEigen(
        torch.from_numpy(eigval),
        torch.from_numpy(eigvec),
        torch.from_numpy(mask),
        torch.tensor(qs, dtype=torch.float64),
    )


def maglap_eigenpairs(
    edge_index: Tensor,
    num_nodes: int,
    k: int,
    q: float | Sequence[float] = 0.25,
    q_relative: bool = True,
    normalization: str | None = "sym",
    normalize: bool = True,
    solver: str = "auto",
    dense_max_nodes: int = 512,
    tol: float = 0.0,
    phase_tol: float = 1e-6,
) -> MagLapEigen:
    """The ``k`` smallest eigenpairs of ``L_q`` for each ``q`` (stacked), of one graph.

    Args:
        edge_index: ``(2, m)`` integer tensor; num_nodes: ``n >= 1``.
        k: eigenpairs per ``q`` (``n < k`` pads with zeros and ``mask = False``).
        q: one potential or a sequence (stacked along ``Q``); relative when ``q_relative``.
        normalization: see :func:`mmpos.graph.magnetic_laplacian`.
        normalize: apply :func:`normalize_phase` (off: the solver's phases).
        solver: ``"dense"``, ``"lanczos"`` or ``"auto"`` (dense up to ``dense_max_nodes`` nodes).
        tol: ARPACK tolerance (0 = machine precision). phase_tol: see :func:`normalize_phase`.
    """
    k = _check_k(k)
    qs = _check_q(q)
    if solver not in SOLVERS:
        raise ValueError(f"solver must be one of {SOLVERS}, got {solver!r}")
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {normalization!r}")
    if normalization is None and solver != "dense" and num_nodes > dense_max_nodes:
        raise ValueError("the Lanczos solver needs normalization='sym' (eigenvalues in [0, 2]); use solver='dense'")
    ei = _edges(edge_index, num_nodes)
    use_dense = solver == "dense" or (solver == "auto" and num_nodes <= dense_max_nodes)
    vals, vecs = [], []
    if use_dense and normalization == "sym":  # small graphs: build densely (no sparse-matrix overhead)
        dense = _dense_adjacency(ei, num_nodes)
        eff = _effective_qs_dense(dense, qs, q_relative)
        for lap in _dense_maglaps(dense, eff):
            val, vec = _solve_dense(lap, k)
            vals.append(val)
            vecs.append(vec)
        return _pack(vals, vecs, num_nodes, k, eff, normalize, phase_tol)
    a = _adjacency(ei, num_nodes)
    eff = _effective_qs(a, num_nodes, qs, q_relative)
    for qq in eff:
        lap = _maglap_scipy(a, qq, normalization)
        val, vec = _solve_dense(lap.toarray(), k) if use_dense else _solve_lanczos(lap, k, tol)
        vals.append(val)
        vecs.append(vec)
    return _pack(vals, vecs, num_nodes, k, eff, normalize, phase_tol)


def _dense_adjacency(ei: np.ndarray, n: int) -> np.ndarray:
    """Binary ``(n, n)`` bool adjacency (kept small: many graphs wait in memory for their batch)."""
    a = np.zeros((n, n), dtype=bool)
    a[ei[0], ei[1]] = True
    return a


def _effective_qs_dense(a: np.ndarray, qs: tuple[float, ...], q_relative: bool) -> list[float]:
    """:func:`_effective_qs` for a dense adjacency."""
    one_way = int((a & ~a.T).sum())
    if one_way == 0:
        return [0.0] * len(qs)
    return [relative_q(q, one_way, a.shape[0]) if q_relative else q for q in qs]


def _dense_maglaps(a: np.ndarray, qs: list[float]) -> np.ndarray:
    """``(Q, n, n)`` ``L_q`` (``"sym"``) from a dense bool adjacency; float64 when every ``q`` is 0."""
    n = a.shape[0]
    a = a.astype(np.float64)
    a_s = ((a + a.T) > 0).astype(np.float64)
    dinv = np.maximum(a_s.sum(1), 1.0) ** -0.5
    w = dinv[:, None] * a_s * dinv[None, :]
    if not any(qs):
        return np.broadcast_to(np.eye(n) - w, (len(qs), n, n))
    theta = (2 * np.pi * np.asarray(qs))[:, None, None] * (a - a.T)[None]
    return np.eye(n)[None] - w[None] * np.exp(1j * theta)


def maglap_eigenpairs_many(
    graphs: Sequence[tuple[Tensor, int]],
    k: int,
    q: float | Sequence[float] = 0.25,
    q_relative: bool = True,
    normalize: bool = True,
    phase_tol: float = 1e-6,
) -> list[MagLapEigen]:
    """:func:`maglap_eigenpairs` (dense, ``normalization="sym"``) for many small graphs.

    ``graphs`` holds ``(edge_index, num_nodes)`` pairs. Graphs of the same size are
    stacked and solved by one batched ``eigh`` call (no padding, so the result equals
    the one-graph path's); real problems (effective ``q = 0`` or no one-way edge) use
    the real solver.
    """
    k = _check_k(k)
    qs = _check_q(q)
    prepared = []
    for edge_index, n in graphs:
        a = _dense_adjacency(_edges(edge_index, n), n)
        prepared.append((a, n, _effective_qs_dense(a, qs, q_relative)))
    by_size: dict[tuple[int, bool], list[tuple[int, int]]] = {}
    for g, (ei, n, eff) in enumerate(prepared):
        for j, qq in enumerate(eff):
            by_size.setdefault((n, qq == 0), []).append((g, j))
    vals: list[list] = [[None] * len(qs) for _ in graphs]
    vecs: list[list] = [[None] * len(qs) for _ in graphs]
    for (n, real), members in by_size.items():
        laps = np.stack([_dense_maglaps(prepared[g][0], [prepared[g][2][j]])[0] for g, j in members])
        val, vec = _solve_dense(laps.real if real else laps, k)
        for (g, j), v, w in zip(members, val, vec):
            vals[g][j], vecs[g][j] = v, w
    return [_pack(vals[g], vecs[g], n, k, eff, normalize, phase_tol) for g, (_, n, eff) in enumerate(prepared)]
