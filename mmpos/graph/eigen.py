"""Eigenpairs of the magnetic Laplacian, per connected component: dense batched ``eigh`` and ARPACK.

Geisler et al., ICML 2023 (google-deepmind/digraph_transformer ``utils.py``,
``eigv_magnetic_laplacian_numba``): the ``k`` smallest eigenpairs of ``L_q``, the first
(trivial at ``q = 0``) kept, zero-padded when ``n < k``. The reference solves the whole
dense matrix; here the graph is first split into its connected components (of the
symmetrised graph, :func:`scipy.sparse.csgraph.connected_components`). ``L_q`` is block
diagonal over them, so its spectrum is the union of the blocks' spectra:

1. every component is solved on its own: dense LAPACK ``eigh`` for the small ones
   (components of one size are stacked into one batched call), ARPACK for the large ones;
2. the ``min(k, n_c)`` smallest pairs of each component are merged and the ``k`` smallest
   kept; each kept eigenvector is supported on its component (zero elsewhere).

Why: a graph with ``c`` components has ``c`` zero eigenvalues at ``q = 0`` (and repeated
eigenvalues whenever two components share one); a Krylov solver started from one vector
finds one vector per distinct eigenvalue, so on the whole matrix it silently returns
higher eigenpairs in place of the missing copies. Per component that cannot happen.

Solvers (``solver=``):

* ``"dense"``: every component dense (float64/complex128).
* ``"arpack"``: ARPACK on every component with more than ``max(2k + 1, 20)`` nodes (the
  smaller ones dense): ``eigsh(L_c, which="SA")`` (implicitly restarted Lanczos) for a real
  ``L_c``; for a complex Hermitian ``L_c`` scipy's ``eigsh`` runs ARPACK's complex Arnoldi
  (``znaupd``) on the ``n_c``-dimensional complex problem directly (no real ``2n`` embedding).
  The start vector is a fixed pseudo-random vector (seed 0), so runs repeat exactly and
  no eigenvector is missed because the start vector is orthogonal to it (the vector
  ``ones`` is, on every graph with a symmetry, to the antisymmetric eigenvectors).
  ``dtype=torch.float32`` runs ARPACK in single precision (as torch-geometric's
  ``AddLaplacianEigenvectorPE`` does) and then a float64 Rayleigh-Ritz step on the
  computed subspace (eigenvalues from float64 Rayleigh quotients).
* ``"auto"``: ARPACK for components larger than ``dense_max_nodes``, dense otherwise.

Chebyshev filter (components of ``_FILTER_MIN = 2000`` nodes or more): ARPACK runs on
``p(L) = T_4((2L - u - a) / (u - a)) / T_4(x_0)`` (``which="LA"``), with ``u`` the Gershgorin
bound and ``a`` the ``k``-th Ritz value of 80 Lanczos steps plus ``1e-3 u`` (an upper bound
of ``lambda_k`` by Courant-Fischer). ``|p| < 1 / T_4(x_0)`` on ``[a, u]`` and ``p`` is strictly
decreasing below ``a``, so the ``k`` largest of ``p(L)`` are the ``k`` smallest of ``L``
(same eigenvectors); a float64 Rayleigh-Ritz step gives ``L``'s eigenvalues, and if one is not
below ``a`` plain ARPACK on ``L`` runs. At 1e5 nodes ARPACK's cost is the reorthogonalisation
of its basis (per step several times a matrix-vector product); the filter trades steps for
products (measured in benchmarks/graphs.py).

Warm start at ``q != 0`` (``warm_start=True``, float32 only): an ARPACK-sized component is first solved at
``q = 0`` (real Lanczos, ``k + 1`` pairs), then LOBPCG on the complex ``L_q`` starts from those
vectors. The result is kept only when it is certified to be the ``k`` smallest: with
``delta = ||L_q - L_0||_inf`` (Weyl: every eigenvalue moves by at most ``delta``) and the
residual ``||R||_2`` of the ``k`` Ritz pairs, all of them must lie below
``lambda_{k+1}(L_0) - delta``. Otherwise (a large ``q``, a small gap at ``q = 0``, LOBPCG not
converged) the component is solved by complex ARPACK. On large graphs the relative ``q`` is
tiny (``q' / m_dir``), so the warm start nearly always holds and costs about one real solve.

Repeated eigenvalues. Across components the merge is deterministic: eigenvalues within
``1e-8`` of each other count as tied and are ordered by component (the component holding
the smallest node id first), then by the component's own order; when a tie straddles the
``k``-th place, the vectors of the first components are kept. Inside one connected
component (graph symmetries), ARPACK may return fewer copies of a repeated eigenvalue than
its multiplicity. When the computed eigenvalues of a component hold a cluster (two within
``1e-6``), the component is solved again on the deflated operator
``L_c + s V V^H`` (found vectors moved above the spectrum) from another start vector, until
no eigenvalue below the current ``k``-th is found (at most 4 rounds). A repeated eigenvalue
inside a component has no canonical basis: the vectors are *some* orthonormal basis of the
eigenspace, which differs between the dense and the ARPACK path (the eigenvalues, the
spanned eigenspace and its projector ``V V^H`` agree).

Phase normalisation (``normalize=True``; this package's convention, not the
reference's ``sign_rotate``, which picks the rotation from the argmax of the imaginary
part of the first eigenvector and so still depends on the phase the solver returned;
``sign_rotate`` is available as :func:`sign_rotate` for the reference preset):
each eigenvector ``v`` is multiplied by ``conj(v[a]) / |v[a]|`` where the anchor ``a``
is the first node whose magnitude ``|v[a]|`` is within ``tol`` of ``max |v|``. Then
``v[a]`` is real and positive, and the result is the same for ``v`` and
``exp(i phi) v`` (for real vectors: the same for ``v`` and ``-v``). Ties: anchors whose
magnitudes differ by less than ``tol`` are ordered by node index; magnitudes that
differ by about ``tol`` can still flip the choice under rounding.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .._extras import requires
from .._validate import check_float, check_int
from .laplacian import NORMALIZATIONS, binary_adjacency, check_q, edge_array, relative_q, scipy_magnetic_laplacian

with requires("graph"):  # one line naming the package and the extra when it is missing
    import scipy.sparse as sp
    import scipy.sparse.linalg as spla
    from scipy.linalg import blas
    from scipy.sparse.csgraph import connected_components

__all__ = [
    "PHASE_RULES",
    "SOLVERS",
    "MagLapEigen",
    "maglap_eigenpairs",
    "maglap_eigenpairs_many",
    "normalize_phase",
    "sign_rotate",
]

SOLVERS = ("auto", "dense", "arpack")
PHASE_RULES = ("anchor", "sign_rotate", None)
_TIE = 1e-8  # eigenvalues closer than this are tied in the merge (ordered by component)
_CLUSTER = 1e-6  # a component whose ARPACK eigenvalues are this close is checked for missing copies
_ROUNDS = 4  # deflation rounds at most
_WARM_DELTA = 1e-3  # warm start tried when ||L_q - L_0||_inf is below this fraction of ||L_0||_inf
_FILTER_MIN = 2000  # components at least this large run ARPACK on a Chebyshev filter of L (see _solve_arpack)
_FILTER_DEGREE = 4  # matvecs per filtered matvec
_FILTER_STEPS = 80  # Lanczos steps of the bound on lambda_k


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


def sign_rotate(vec: np.ndarray) -> np.ndarray:
    """The reference's ``sign_rotate`` phase rule on the columns of ``vec`` ``(n, k)``.

    google-deepmind/digraph_transformer ``utils.py`` (``eigv_magnetic_laplacian_numba``,
    ``sign_rotate=True``, applied only at ``q != 0``): each column is multiplied by the sign
    of its real part at the node of largest ``|Re|``; then, with ``u*`` the node of largest
    imaginary part of the *first* column, every column ``j`` is multiplied by
    ``exp(-i angle(v_j[u*]))``. Unlike :func:`normalize_phase` the result still depends on
    the phase the solver returned (the first column's imaginary part does).
    """
    vec = np.asarray(vec)
    if vec.ndim != 2:
        raise ValueError(f"vec must have shape (n, k), got {vec.shape}")
    if vec.shape[1] == 0:
        return vec.copy()
    cols = np.arange(vec.shape[1])
    sign = np.sign(vec.real[np.abs(vec.real).argmax(0), cols])  # (k,)
    out = vec * sign[None, :]
    anchor = out[:, 0].imag.argmax()
    return out * np.exp(-1j * np.angle(out[anchor]))[None, :]


def check_k(k: int) -> int:
    """A positive int ``k`` (``ValueError`` otherwise); package helper used by the transforms."""
    return check_int(k, "k")


def _check_dtype(dtype: torch.dtype) -> torch.dtype:
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"dtype must be torch.float32 or torch.float64 (ARPACK's working precision), got {dtype!r}")
    return dtype


def _solve_dense(lap: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``(..., n, n)`` Hermitian -> ``(..., min(k, n))`` eigenvalues and ``(..., n, min(k, n))`` vectors."""
    if np.iscomplexobj(lap) and not np.any(lap.imag):
        lap = lap.real
    val, vec = np.linalg.eigh(lap)
    return val[..., :k].copy(), vec[..., :, :k].copy()  # copies: views would keep all n eigenvectors alive


def _start_vector(n: int, complex_: bool, round_: int) -> np.ndarray:
    """Fixed pseudo-random start vector (seeded by the round), unit norm."""
    rng = np.random.default_rng(round_)
    v = rng.standard_normal(n)
    if complex_:
        v = v + 1j * rng.standard_normal(n)
    return v / np.linalg.norm(v)


def _rayleigh_ritz(lap: sp.csr_matrix, basis: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` smallest Ritz pairs of ``lap`` (float64) on the span of ``basis`` ``(n, m)``.

    The basis is orthonormalised by an SVD that drops directions of relative size below
    ``1e-8`` (a Krylov solver can return near-copies of one vector for a repeated eigenvalue).
    """
    u, s, _ = np.linalg.svd(basis, full_matrices=False)
    u = u[:, s > 1e-8 * s[0]]
    val, small = np.linalg.eigh(u.conj().T @ (lap @ u))
    return val[:k], u @ small[:, :k]


def _clustered(val: np.ndarray) -> bool:
    return bool(val.size > 1 and (np.diff(val) < _CLUSTER * np.maximum(1.0, np.abs(val[1:]))).any())


def _ritz_bound(work: sp.csr_matrix, k: int, steps: int) -> float | None:
    """An upper bound of ``lambda_k(L)``: the ``k``-th Ritz value of ``steps`` Lanczos steps, or ``None``.

    Courant-Fischer: the ``k``-th smallest Ritz value on any subspace of dimension ``>= k`` is at
    least ``lambda_k``. Full reorthogonalisation (two classical Gram-Schmidt passes) keeps the basis
    orthonormal in ``work``'s precision; the caller adds a margin far above that rounding.
    """
    n = work.shape[0]
    dt = np.dtype(work.dtype)
    gemv = blas.get_blas_funcs("gemv", dtype=dt)
    trans = 2 if dt.kind == "c" else 1  # conjugate transpose / transpose
    basis = np.empty((n, steps), dtype=dt, order="F")  # (n, m) Lanczos vectors
    basis[:, 0] = _start_vector(n, dt.kind == "c", 0)
    tri = np.zeros((steps, steps))  # (m, m) projected L (tridiagonal up to rounding)
    m = steps
    for j in range(steps):
        w = work @ basis[:, j]
        v = basis[:, : j + 1]
        c = gemv(1.0, v, w, trans=trans)
        w = gemv(-1.0, v, c, beta=1.0, y=w, overwrite_y=True)
        c2 = gemv(1.0, v, w, trans=trans)
        w = gemv(-1.0, v, c2, beta=1.0, y=w, overwrite_y=True)
        tri[j, j] = float((c[j] + c2[j]).real)
        if j + 1 == steps:
            break
        beta = float(np.linalg.norm(w))
        if beta < 1e-5 * max(1.0, abs(tri[j, j])):  # an invariant subspace: stop there
            m = j + 1
            break
        tri[j, j + 1] = tri[j + 1, j] = beta
        basis[:, j + 1] = w / beta
    if m < k:
        return None
    return float(np.linalg.eigvalsh(tri[:m, :m])[k - 1])


def _chebyshev_filter(work: sp.csr_matrix, lower: float, upper: float, degree: int) -> spla.LinearOperator:
    """``p(L) = T_d((2 L - (upper + lower)) / (upper - lower)) / T_d(x_0)``, ``x_0`` the image of ``0``.

    ``|p| <= 1 / T_d(x_0) < 1`` on ``[lower, upper]`` and ``p`` is strictly decreasing below
    ``lower``, where it exceeds that bound: if ``lambda_k(L) < lower <= upper`` and ``upper``
    bounds the spectrum, the ``k`` largest eigenvalues of ``p(L)`` belong to the ``k``
    smallest of ``L``, with the same eigenvectors. (The division keeps ``p <= 1`` on ``[0, upper]``.)
    """
    n = work.shape[0]
    centre, half = (upper + lower) / 2, (upper - lower) / 2
    scale = 1.0 / math.cosh(degree * math.acosh(centre / half))

    def matvec(x):
        x = np.asarray(x).reshape(n, -1)  # (n, b)
        prev, cur = x, (work @ x - centre * x) * (1.0 / half)
        for _ in range(degree - 1):  # T_{j+1}(y) = 2 y T_j(y) - T_{j-1}(y)
            prev, cur = cur, (work @ cur - centre * cur) * (2.0 / half) - prev
        return cur * x.dtype.type(scale)

    return spla.LinearOperator(work.shape, matvec=matvec, matmat=matvec, dtype=work.dtype)


def _solve_arpack(lap: sp.csr_matrix, k: int, tol: float, dtype: torch.dtype) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` smallest eigenpairs of a sparse Hermitian ``L`` of one connected component (``k < n - 1``)."""
    n = lap.shape[0]
    complex_ = np.iscomplexobj(lap.data) and bool(np.any(lap.data.imag))
    lap = lap if complex_ else lap.real.tocsr()
    single = dtype == torch.float32
    work_dtype = (np.complex64 if single else np.complex128) if complex_ else (np.float32 if single else np.float64)
    work = lap.astype(work_dtype)
    v0 = _start_vector(n, complex_, 0).astype(work_dtype)
    ncv = min(n, max(2 * k + 3, 20))  # the Krylov size of torch-geometric's k + 1 call
    bound = float(abs(lap).sum(axis=1).max())  # >= lambda_max (Gershgorin)
    filtered = None
    if n >= _FILTER_MIN:
        ritz = _ritz_bound(work, k, min(_FILTER_STEPS, n - 1))
        lower = None if ritz is None else ritz + 1e-3 * bound  # margin >> the bound's float32 rounding
        if lower is not None and lower < bound / 2:  # else the filter gains little: plain ARPACK
            filtered = lower
    if filtered is not None:
        op = _chebyshev_filter(work, filtered, bound, _FILTER_DEGREE)
        _, vec = spla.eigsh(op, k=k, which="LA", v0=v0, tol=tol, ncv=ncv)
        val, vec = _rayleigh_ritz(lap, vec.astype(np.complex128 if complex_ else np.float64), k)  # L's values
        if len(val) < k or val[-1] >= filtered:  # not the filter's guarantee: solve L itself
            filtered = None
    if filtered is None:
        val, vec = spla.eigsh(work, k=k, which="SA", v0=v0, tol=tol, ncv=ncv)
        order = np.argsort(val, kind="stable")
        val, vec = val[order].astype(np.float64), vec[:, order].astype(np.complex128 if complex_ else np.float64)
        if single or _clustered(val):
            val, vec = _rayleigh_ritz(lap, vec, k)  # float64 values; an orthonormal basis of repeated eigenspaces
    # several start vectors where multiplicities remain: deflate what was found and look again
    bound = bound + 1.0  # above the spectrum
    for round_ in range(1, _ROUNDS + 1):
        if not _clustered(val) and len(val) == k:
            break
        found = vec.astype(work_dtype)

        def matvec(x, found=found):
            x = np.asarray(x).reshape(n, -1)
            return work @ x + bound * (found @ (found.conj().T @ x))

        op = spla.LinearOperator((n, n), matvec=matvec, matmat=matvec, dtype=work_dtype)
        extra = min(k, n - found.shape[1] - 2)
        if extra < 1:
            break
        v0 = _start_vector(n, complex_, round_).astype(work_dtype)
        more_val, more_vec = spla.eigsh(op, k=extra, which="SA", v0=v0, tol=tol)
        if len(val) == k and more_val.min() >= val[-1] - _TIE * max(1.0, abs(val[-1])):
            break  # nothing below the current k-th: the eigenspaces were complete
        val, vec = _rayleigh_ritz(lap, np.concatenate([vec, more_vec.astype(vec.dtype)], axis=1), k)
    return val, vec


def _solve_warm(
    lap: sp.csr_matrix, lap0: sp.csr_matrix, val0: np.ndarray, vec0: np.ndarray, k: int, dtype: torch.dtype
) -> tuple[np.ndarray, np.ndarray] | None:
    """The ``k`` smallest pairs of a complex ``L_q`` by LOBPCG started from ``L_0``'s, or ``None``.

    Certified, else ``None`` (the caller then runs ARPACK): Weyl's inequality puts every
    eigenvalue of ``L_q`` within ``delta = ||L_q - L_0||_inf`` (a bound on the 2-norm of the
    Hermitian difference) of ``L_0``'s; the ``k`` orthonormal Ritz pairs with residual matrix
    ``R`` lie within ``||R||_2`` of ``k`` eigenvalues of ``L_q``. If all of them are below
    ``lambda_{k+1}(L_0) - delta`` (which bounds ``lambda_{k+1}(L_q)`` from below), they are
    the ``k`` smallest. Pays on large graphs with a relative ``q`` (tiny ``delta``).
    """
    if len(val0) < k + 1:
        return None
    delta = float(abs(lap - lap0).sum(axis=1).max())
    if val0[k - 1] + 2 * delta >= val0[k]:
        return None  # the q = 0 gap is too small for the perturbation
    single = dtype == torch.float32
    work = lap.astype(np.complex64 if single else np.complex128)
    # LOBPCG gains little after a few block steps from this start (measured: residual ~2e-6 after 5 steps at
    # 1e5 nodes, no better after 20), so few steps and a residual bound at float32 ARPACK's order
    tol, maxiter = (1e-6, 8) if single else (1e-9, 100)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # lobpcg warns when it stops early; the certificate below decides
        try:
            _, vec = spla.lobpcg(work, vec0[:, :k].astype(work.dtype), largest=False, tol=tol, maxiter=maxiter)
        except (np.linalg.LinAlgError, ValueError):
            return None
    val, vec = _rayleigh_ritz(lap, vec.astype(np.complex128), k)
    if len(val) < k:
        return None
    res = float(np.linalg.norm(lap @ vec - vec * val, 2))
    if res > (1e-5 if single else 10 * tol) or val[-1] + res >= val0[k] - delta:  # unconverged / uncertified
        return None
    return val, vec


@dataclass(frozen=True)
class _Components:
    """Connected components of the symmetrised graph, ranked by their smallest node id."""

    labels: np.ndarray  # (n,) component rank of each node
    sizes: np.ndarray  # (c,)
    local: np.ndarray  # (n,) position of each node within its component (node ids ascending)
    nodes: list[np.ndarray]  # per component: its node ids, ascending


def _components(a: sp.csr_matrix) -> _Components:
    n = a.shape[0]
    num, labels = connected_components(a, directed=True, connection="weak")
    order = np.argsort(labels, kind="stable")  # nodes grouped by label, ascending ids within
    sizes = np.bincount(labels, minlength=num)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    first = order[starts]  # smallest node id of each label
    rank = np.empty(num, dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(num)
    labels = rank[labels]
    order = np.argsort(labels, kind="stable")
    sizes = np.bincount(labels, minlength=num)
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    local = np.empty(n, dtype=np.int64)
    local[order] = np.arange(n) - np.repeat(bounds[:-1], sizes)
    return _Components(labels, sizes, local, [order[bounds[c] : bounds[c + 1]] for c in range(num)])


def _solve_components(
    lap: sp.csr_matrix,
    comps: _Components,
    k: int,
    dense_limit: int,
    tol: float,
    dtype: torch.dtype,
    warm: dict | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The ``min(k, n)`` smallest eigenpairs of block-diagonal ``lap``, merged from its components."""
    n = lap.shape[0]
    iterative_min = max(2 * k + 1, 20)
    parts: list[tuple[np.ndarray, np.ndarray]] = [None] * len(comps.sizes)  # per component: (m_c,), (n_c, m_c)
    coo = lap.tocoo()
    row_comp = comps.labels[coo.row]
    dense_sizes = comps.sizes <= max(dense_limit, iterative_min)
    for size in np.unique(comps.sizes[dense_sizes]):
        members = np.flatnonzero(comps.sizes == size)  # components of this size, by rank
        slot = np.full(len(comps.sizes), -1, dtype=np.int64)
        slot[members] = np.arange(len(members))
        pick = slot[row_comp] >= 0
        blocks = np.zeros((len(members), size, size), dtype=lap.dtype)  # (g, s, s)
        blocks[slot[row_comp[pick]], comps.local[coo.row[pick]], comps.local[coo.col[pick]]] = coo.data[pick]
        val, vec = _solve_dense(blocks, k)  # (g, m), (g, s, m)
        for b, c in enumerate(members):
            parts[c] = (val[b], vec[b])
    for c in np.flatnonzero(~dense_sizes):
        idx = comps.nodes[c]
        whole = len(idx) == n  # a connected graph: no submatrix copy
        sub = lap if whole else lap[idx][:, idx].tocsr()
        got = None
        if warm is not None:  # q != 0: start from the q = 0 pairs where that is certified to pay
            sub0 = warm["lap0"] if whole else warm["lap0"][idx][:, idx].tocsr()
            delta = float(abs(sub - sub0).sum(axis=1).max())
            if delta <= _WARM_DELTA * float(abs(sub0).sum(axis=1).max()):  # small perturbation: worth a try
                if c not in warm["pairs"]:
                    warm["pairs"][c] = (sub0, *_solve_arpack(sub0, k + 1, tol, dtype))
                got = _solve_warm(sub, *warm["pairs"][c], k, dtype)
        parts[c] = got if got is not None else _solve_arpack(sub, k, tol, dtype)
    return _merge(parts, comps, n, k)


def _effective_qs(a: sp.csr_matrix, n: int, qs: tuple[float, ...], q_relative: bool) -> list[float]:
    """Absolute potentials; 0 for a graph without one-way edges (its ``L_q`` is real for every ``q``)."""
    one_way = int((a - a.T).maximum(0).nnz)
    if one_way == 0:
        return [0.0] * len(qs)
    return [relative_q(q, one_way, n) if q_relative else q for q in qs]


def _pack(
    vals: list[np.ndarray],
    vecs: list[np.ndarray],
    n: int,
    k: int,
    qs: list[float],
    phase: str | None,
    tol: float,
) -> MagLapEigen:
    m = min(k, n)
    eigval = np.zeros((len(qs), k))
    eigvec = np.zeros((n, len(qs), k), dtype=np.complex128)
    for i, (val, vec) in enumerate(zip(vals, vecs)):
        eigval[i, :m] = val[:m]
        vec = vec[:, :m]
        if phase == "anchor":
            vec = normalize_phase(vec, tol)
        elif phase == "sign_rotate" and qs[i] != 0:  # the reference applies it at q != 0 only
            vec = sign_rotate(vec)
        eigvec[:, i, :m] = vec
    mask = np.arange(k) < n
    return MagLapEigen(
        torch.from_numpy(eigval),
        torch.from_numpy(eigvec),
        torch.from_numpy(mask),
        torch.tensor(qs, dtype=torch.float64),
    )


def _phase_rule(normalize: bool | str | None) -> str | None:
    """``normalize``: ``True`` / ``"anchor"`` (:func:`normalize_phase`), ``"sign_rotate"``, ``False`` / ``None``."""
    rule = "anchor" if normalize is True else None if normalize is False else normalize
    if rule not in PHASE_RULES:
        raise ValueError(f"normalize must be True, False or one of {PHASE_RULES}, got {normalize!r}")
    return rule


def maglap_eigenpairs(
    edge_index: Tensor,
    num_nodes: int,
    k: int,
    q: float | Sequence[float] = 0.25,
    q_relative: bool = True,
    normalization: str | None = "sym",
    normalize: bool | str | None = True,
    solver: str = "auto",
    dense_max_nodes: int = 512,
    tol: float = 0.0,
    phase_tol: float = 1e-6,
    dtype: torch.dtype = torch.float64,
    warm_start: bool = True,
) -> MagLapEigen:
    """The ``k`` smallest eigenpairs of ``L_q`` for each ``q`` (stacked), of one graph.

    Solved per connected component and merged (see the module docstring), so a
    disconnected graph gets all its zero eigenvalues at ``q = 0``.

    Args:
        edge_index: ``(2, m)`` integer tensor; num_nodes: ``n >= 1``.
        k: eigenpairs per ``q`` (``n < k`` pads with zeros and ``mask = False``).
        q: one potential or a sequence (stacked along ``Q``); relative when ``q_relative``.
        normalization: see :func:`mmpos.graph.magnetic_laplacian`.
        normalize: phase rule: ``True`` or ``"anchor"`` (:func:`normalize_phase`, default),
            ``"sign_rotate"`` (the reference's, :func:`sign_rotate`), ``False`` / ``None``
            (the solver's phases).
        solver: ``"dense"``, ``"arpack"`` or ``"auto"`` (ARPACK for components larger than
            ``dense_max_nodes``).
        tol: ARPACK tolerance (0 = machine precision of ``dtype``). phase_tol: see :func:`normalize_phase`.
        dtype: ARPACK's working precision, ``torch.float64`` (default) or ``torch.float32``
            (as torch-geometric; followed by a float64 Rayleigh-Ritz step). Dense blocks are
            always solved in float64.
        warm_start: with ``dtype=torch.float32`` at ``q != 0``, ARPACK-sized components first
            try LOBPCG started from the ``q = 0`` eigenvectors, kept only when certified (see
            the module docstring); ``False``: complex ARPACK directly. (In float64 LOBPCG
            stalls near a residual of 1e-6, so float64 always runs complex ARPACK.)

    Returns:
        :class:`MagLapEigen` (float64 / complex128).
    """
    k = check_k(k)
    qs = check_q(q)
    phase = _phase_rule(normalize)
    _check_dtype(dtype)
    if solver not in SOLVERS:
        raise ValueError(f"solver must be one of {SOLVERS}, got {solver!r}")
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {normalization!r}")
    check_int(dense_max_nodes, "dense_max_nodes")
    check_float(tol, "tol", strict=False)  # NaN / inf tolerances were accepted
    check_float(phase_tol, "phase_tol", strict=False)
    ei = edge_array(edge_index, num_nodes)
    if solver == "auto" and num_nodes <= dense_max_nodes and normalization == "sym":
        return _dense_graph(ei, num_nodes, k, qs, q_relative, phase, phase_tol)  # small graphs: no sparse overhead
    dense_limit = {"dense": num_nodes, "arpack": 0, "auto": dense_max_nodes}[solver]
    a = binary_adjacency(ei, num_nodes)
    eff = _effective_qs(a, num_nodes, qs, q_relative)
    comps = _components(a)
    vals, vecs = [], []
    warm = None
    if any(eff) and warm_start and dtype == torch.float32:
        warm = {"lap0": scipy_magnetic_laplacian(a, 0.0, normalization), "pairs": {}}
    for qq in eff:
        lap = scipy_magnetic_laplacian(a, qq, normalization)
        val, vec = _solve_components(lap, comps, k, dense_limit, tol, dtype, warm if qq else None)
        vals.append(val)
        vecs.append(vec)
    return _pack(vals, vecs, num_nodes, k, eff, phase, phase_tol)


def _dense_graph(
    ei: np.ndarray, n: int, k: int, qs: tuple[float, ...], q_relative: bool, phase: str | None, phase_tol: float
) -> MagLapEigen:
    """One small graph: dense ``L_q``, split into components (as :func:`maglap_eigenpairs_many`)."""
    return maglap_eigenpairs_many([(ei, n)], k, qs, q_relative, phase, phase_tol)[0]


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
    normalize: bool | str | None = True,
    phase_tol: float = 1e-6,
) -> list[MagLapEigen]:
    """:func:`maglap_eigenpairs` (dense, ``normalization="sym"``) for many small graphs.

    ``graphs`` holds ``(edge_index, num_nodes)`` pairs. Each graph is split into its
    connected components; components of the same size (over all graphs and potentials)
    are stacked and solved by one batched ``eigh`` call (no padding, so the result equals
    the one-graph path's); real problems (effective ``q = 0`` or no one-way edge) use the
    real solver.
    """
    k = check_k(k)
    qs = check_q(q)
    phase = _phase_rule(normalize)
    prepared = []
    for edge_index, n in graphs:
        ei = edge_array(edge_index, n)
        a = _dense_adjacency(ei, n)
        comps = _components(sp.csr_matrix(a))
        prepared.append((a, n, _effective_qs_dense(a, qs, q_relative), comps))
    # blocks (graph, potential, component) grouped by (size, real)
    by_size: dict[tuple[int, bool], list[tuple[int, int, int]]] = {}
    for g, (_, _, eff, comps) in enumerate(prepared):
        for j, qq in enumerate(eff):
            for c, size in enumerate(comps.sizes):
                by_size.setdefault((int(size), qq == 0), []).append((g, j, c))
    laps = [_dense_maglaps(a, eff) for a, _, eff, _ in prepared]  # (Q, n, n) per graph
    solved: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray]] = {}
    for (_, real), members in by_size.items():
        blocks = np.stack([laps[g][j][np.ix_(prepared[g][3].nodes[c], prepared[g][3].nodes[c])] for g, j, c in members])
        val, vec = _solve_dense(blocks.real if real else blocks, k)
        for key, v, w in zip(members, val, vec):
            solved[key] = (v, w)
    out = []
    for g, (_, n, eff, comps) in enumerate(prepared):
        vals, vecs = [], []
        for j in range(len(eff)):
            val, vec = _merge([solved[(g, j, c)] for c in range(len(comps.sizes))], comps, n, k)
            vals.append(val)
            vecs.append(vec)
        out.append(_pack(vals, vecs, n, k, eff, phase, phase_tol))
    return out


def _merge(
    parts: list[tuple[np.ndarray, np.ndarray]], comps: _Components, n: int, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """The ``min(k, n)`` smallest of per-component pairs ``[(val (m_c,), vec (n_c, m_c))]`` (ranked components)."""
    val = np.concatenate([p[0] for p in parts])
    comp = np.concatenate([np.full(len(p[0]), c) for c, p in enumerate(parts)])
    j = np.concatenate([np.arange(len(p[0])) for p in parts])
    order = np.lexsort((j, comp, val))
    val, comp, j = val[order], comp[order], j[order]
    tie_group = np.concatenate([[0], np.cumsum(np.diff(val) > _TIE * np.maximum(1.0, np.abs(val[1:])))])
    order = np.lexsort((j, comp, tie_group))[: min(k, n)]
    complex_ = any(np.iscomplexobj(p[1]) for p in parts)
    out = np.zeros((n, len(order)), dtype=np.complex128 if complex_ else np.float64)
    for col, (c, jj) in enumerate(zip(comp[order], j[order])):
        out[comps.nodes[c], col] = parts[c][1][:, jj]
    return val[order], out
