import numpy as np
import pytest
import scipy.sparse as sp
import torch

from mmpos.graph import maglap_eigenpairs, maglap_eigenpairs_many, magnetic_laplacian, normalize_phase


def _random_digraph(n, m, seed):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, m), generator=g)
    return ei[:, ei[0] != ei[1]]


def _path_plus(n):
    """A connected DAG with a simple spectrum: a path 0 -> ... -> n-1 plus chords i -> i+2 on even i."""
    src = list(range(n - 1)) + list(range(0, n - 2, 2))
    dst = list(range(1, n)) + list(range(2, n, 2))
    return torch.tensor([src, dst])


@pytest.mark.parametrize("q", [0.0, 0.25, [0.0, 0.1, 0.25]])
def test_eigenpairs_solve_the_laplacian(q):
    ei = _random_digraph(30, 80, 0)
    eig = maglap_eigenpairs(ei, 30, 6, q)
    assert eig.eigvec.shape == (30, eig.q.numel(), 6) and eig.eigval.shape == (eig.q.numel(), 6)
    for j, qq in enumerate(eig.q.tolist()):
        lap = magnetic_laplacian(ei, 30, qq).to_dense().to(torch.complex128)
        vec = eig.eigvec[:, j]
        torch.testing.assert_close(lap @ vec, vec * eig.eigval[j], atol=1e-10, rtol=0)
        full = torch.linalg.eigvalsh(lap)[:6]
        torch.testing.assert_close(eig.eigval[j], full, atol=1e-10, rtol=0)


def test_relative_q_rule_used():
    ei = _path_plus(10)  # 13 one-way edges, n = 10 -> q = q' / 10
    assert maglap_eigenpairs(ei, 10, 3, 0.25).q.tolist() == [0.025]
    assert maglap_eigenpairs(ei, 10, 3, 0.25, q_relative=False).q.tolist() == [0.25]
    undirected = torch.cat([ei, ei.flip(0)], dim=1)  # no one-way edge: L_q is real for every q
    assert maglap_eigenpairs(undirected, 10, 3, 0.25).q.tolist() == [0.0]


def test_reversed_graph_gives_conjugate_eigenvectors():
    ei = _path_plus(12)
    fwd, bwd = maglap_eigenpairs(ei, 12, 5, 0.25), maglap_eigenpairs(ei.flip(0), 12, 5, 0.25)
    torch.testing.assert_close(bwd.eigval, fwd.eigval)
    torch.testing.assert_close(bwd.eigvec, fwd.eigvec.conj(), atol=1e-10, rtol=0)
    assert fwd.eigvec[:, 0, 1:].imag.abs().max() > 1e-3  # direction really is in the phases


@pytest.mark.parametrize("q", [0.0, 0.25])
def test_dense_and_arpack_agree(q):
    ei = _random_digraph(300, 1500, 3)
    dense = maglap_eigenpairs(ei, 300, 8, q, solver="dense")
    lanczos = maglap_eigenpairs(ei, 300, 8, q, solver="arpack")
    assert (dense.eigval[0, 1:] - dense.eigval[0, :-1]).min() > 1e-4  # simple spectrum: vectors are defined
    torch.testing.assert_close(lanczos.eigval, dense.eigval, atol=1e-10, rtol=0)
    torch.testing.assert_close(lanczos.eigvec, dense.eigvec, atol=1e-8, rtol=0)


def test_deterministic_across_runs():
    ei = _random_digraph(600, 2400, 4)  # auto -> Lanczos
    a, b = maglap_eigenpairs(ei, 600, 6, 0.25), maglap_eigenpairs(ei, 600, 6, 0.25)
    assert torch.equal(a.eigvec, b.eigvec) and torch.equal(a.eigval, b.eigval)


def test_many_equals_one_by_one():
    graphs = [(_random_digraph(n, 3 * n, s), n) for s, n in enumerate([5, 7, 5, 3, 9, 7])]
    for (ei, n), got in zip(graphs, maglap_eigenpairs_many(graphs, 4, [0.0, 0.25])):
        ref = maglap_eigenpairs(ei, n, 4, [0.0, 0.25], solver="dense")
        torch.testing.assert_close(got.eigvec, ref.eigvec, atol=1e-12, rtol=0)
        torch.testing.assert_close(got.eigval, ref.eigval, atol=1e-12, rtol=0)
        assert torch.equal(got.mask, ref.mask)


def test_phase_normalisation_removes_phase_and_sign():
    rng = np.random.default_rng(0)
    vec = rng.normal(size=(9, 4)) + 1j * rng.normal(size=(9, 4))
    rotated = vec * np.exp(1j * rng.uniform(0, 2 * np.pi, size=4))
    np.testing.assert_allclose(normalize_phase(rotated), normalize_phase(vec), atol=1e-12)
    out = normalize_phase(vec)
    anchor = np.abs(out).argmax(0)
    assert np.all(out[anchor, range(4)].real > 0) and np.allclose(out[anchor, range(4)].imag, 0)
    real = rng.normal(size=(9, 3))
    np.testing.assert_allclose(normalize_phase(-real), normalize_phase(real))
    tie = np.array([[0.5], [-0.5], [0.5], [-0.5]])  # equal magnitudes: the first node is the anchor
    np.testing.assert_allclose(normalize_phase(-tie), tie)


def test_k_larger_than_n_pads_with_mask():
    eig = maglap_eigenpairs(torch.tensor([[0, 1], [1, 2]]), 3, 5, 0.25)
    assert eig.mask.tolist() == [True, True, True, False, False]
    assert eig.eigvec[:, :, 3:].abs().max() == 0 and eig.eigval[:, 3:].abs().max() == 0


def test_single_node_empty_isolated_and_disconnected():
    one = maglap_eigenpairs(torch.zeros(2, 0, dtype=torch.long), 1, 3, 0.25)
    assert one.eigval[0].tolist() == [1.0, 0.0, 0.0] and one.mask.tolist() == [True, False, False]
    empty = maglap_eigenpairs(torch.zeros(2, 0, dtype=torch.long), 4, 2, 0.25)
    torch.testing.assert_close(empty.eigval, torch.ones(1, 2, dtype=torch.float64))
    # two directed triangles and an isolated node: two zero eigenvalues at q = 0, the isolated node gives 1
    ei = torch.tensor([[0, 1, 2, 3, 4, 5], [1, 2, 0, 4, 5, 3]])
    val = maglap_eigenpairs(ei, 7, 7, 0.0).eigval[0]
    assert (val.abs() < 1e-12).sum() == 2 and (val - 1).abs().min() < 1e-12


def test_bad_arguments():
    ei = torch.tensor([[0], [1]])
    with pytest.raises(ValueError, match="k must be"):
        maglap_eigenpairs(ei, 2, 0)
    with pytest.raises(ValueError, match="solver"):
        maglap_eigenpairs(ei, 2, 1, solver="lanczos")
    with pytest.raises(ValueError, match="dtype"):
        maglap_eigenpairs(ei, 2, 1, dtype=torch.float16)
    with pytest.raises(ValueError, match="normalize"):
        maglap_eigenpairs(ei, 2, 1, normalize="sign")
    with pytest.raises(ValueError, match="q must be"):
        maglap_eigenpairs(ei, 2, 1, q=[])


def _pieces_graph(sizes, num_isolated, seed, dup=0):
    """Disjoint union of connected random digraphs (a directed spanning path plus 2n random edges each),
    ``num_isolated`` isolated nodes and ``dup`` repeated edges, under a random node numbering.

    Returns ``edge_index``, ``n`` and the node sets of the pieces (from the construction, not from a solver).
    """
    rng = np.random.default_rng(seed)
    n = sum(sizes) + num_isolated
    perm = rng.permutation(n)
    edges, pieces, start = [], [], 0
    for s in sizes:
        nodes = perm[start : start + s]
        start += s
        src, dst = rng.integers(0, s, 2 * s), rng.integers(0, s, 2 * s)
        path = np.stack([np.arange(s - 1), np.arange(1, s)])
        e = np.concatenate([path, np.stack([src, dst])[:, src != dst]], axis=1)
        edges.append(nodes[e])
        pieces.append(np.sort(nodes))
    ei = np.concatenate(edges, axis=1)
    if dup:
        ei = np.concatenate([ei, ei[:, rng.integers(0, ei.shape[1], dup)]], axis=1)
    return torch.from_numpy(ei), n, pieces


def _reference_spectrum(ei, n, q, pieces, normalization="sym"):
    """Sorted union of the pieces' dense spectra, plus the isolated nodes (1 with "sym", 0 without)."""
    coo = magnetic_laplacian(ei, n, q, normalization)
    lap = sp.csr_matrix((coo.values().numpy(), tuple(coo.indices().numpy())), shape=(n, n))
    vals = [np.linalg.eigvalsh(lap[p][:, p].toarray()) for p in pieces]
    covered = sum(len(p) for p in pieces)
    vals.append(np.full(n - covered, 1.0 if normalization == "sym" else 0.0))
    return np.sort(np.concatenate(vals))


def _check_pairs(eig, ei, n, k, pieces):
    for j, qq in enumerate(eig.q.tolist()):
        lap = magnetic_laplacian(ei, n, qq).to_dense().to(torch.complex128)
        vec, val = eig.eigvec[:, j], eig.eigval[j]
        assert (lap @ vec - vec * val).abs().max() < 1e-8
        torch.testing.assert_close(vec.conj().T @ vec, torch.eye(k, dtype=torch.complex128), atol=1e-8, rtol=0)
        owner = np.full(n, -1)
        for i, p in enumerate(pieces):
            owner[p] = i
        for col in range(k):  # each vector lives on one component (or one isolated node)
            support = np.flatnonzero(vec[:, col].abs().numpy() > 1e-12)
            assert len(set(owner[support])) == 1 and (owner[support[0]] >= 0 or len(support) == 1)


@pytest.mark.parametrize("solver", ["dense", "arpack", "auto"])
@pytest.mark.parametrize("q", [0.0, 0.25])
def test_k_smallest_on_many_components(solver, q):
    # 10 components of 2+ nodes (two larger than dense_max_nodes), 11 isolated nodes, repeated edges
    sizes = [150, 90, 40, 40, 25, 12, 7, 3, 2, 2, 1, 1]
    ei, n, pieces = _pieces_graph(sizes, 9, seed=1, dup=30)
    k = 16
    eig = maglap_eigenpairs(ei, n, k, q, q_relative=False, solver=solver, dense_max_nodes=60)
    full = np.linalg.eigvalsh(magnetic_laplacian(ei, n, q).to_dense().numpy())[:k]  # independent: whole matrix
    np.testing.assert_allclose(eig.eigval[0].numpy(), full, atol=1e-10, rtol=0)
    np.testing.assert_allclose(full, _reference_spectrum(ei, n, q, pieces)[:k], atol=1e-10, rtol=0)
    if q == 0:
        assert (eig.eigval[0].abs() < 1e-10).sum() == 10  # one zero per component of 2+ nodes
    _check_pairs(eig, ei, n, k, pieces)


@pytest.mark.parametrize("q", [0.0, 0.25])
def test_ten_thousand_nodes_twenty_components(q):
    sizes = [700] * 4 + [150] * 16  # 20 components (5200 nodes) plus 4800 isolated nodes
    ei, n, pieces = _pieces_graph(sizes, 4800, seed=2)
    k = 24  # more than the 20 zero eigenvalues at q = 0
    eig = maglap_eigenpairs(ei, n, k, q, q_relative=False, dense_max_nodes=200)  # ARPACK on the 700-node ones
    ref = _reference_spectrum(ei, n, q, pieces)[:k]
    np.testing.assert_allclose(eig.eigval[0].numpy(), ref, atol=1e-10, rtol=0)
    vec, val = eig.eigvec[:, 0], eig.eigval[0]
    lap = magnetic_laplacian(ei, n, q).to(torch.complex128)
    assert (torch.sparse.mm(lap, vec) - vec * val).abs().max() < 1e-8


def test_dense_and_arpack_vectors_agree_on_many_components():
    ei, n, _ = _pieces_graph([120, 100, 80, 30, 5], 4, seed=3)
    for q in (0.0, 0.25):
        dense = maglap_eigenpairs(ei, n, 12, q, q_relative=False, solver="dense")
        arpack = maglap_eigenpairs(ei, n, 12, q, q_relative=False, solver="arpack")
        torch.testing.assert_close(arpack.eigval, dense.eigval, atol=1e-10, rtol=0)
        torch.testing.assert_close(arpack.eigvec, dense.eigvec, atol=1e-8, rtol=0)


def _three_paths_graph(n0: int = 300, length: int = 120):
    """``(edge_index, num_nodes)``: three identical paths of ``length`` nodes hanging off node 0 of a random
    directed graph on ``n0`` nodes (every antisymmetric mode of the paths is a double eigenvalue)."""
    rng = np.random.default_rng(4)
    src, dst = rng.integers(0, n0, 4 * n0), rng.integers(0, n0, 4 * n0)
    parts = [np.stack([np.r_[np.arange(n0 - 1), src], np.r_[np.arange(1, n0), dst]])]
    for b in range(3):
        path = n0 + b * length + np.arange(length)
        parts.append(np.stack([np.r_[0, path[:-1]], path]))
    ei = np.concatenate(parts, axis=1)
    return torch.from_numpy(ei[:, ei[0] != ei[1]]), n0 + 3 * length


def test_repeated_eigenvalues_inside_one_component():
    # three identical paths hanging off node 0 of a random graph: every antisymmetric mode is a double eigenvalue
    ei, n = _three_paths_graph()
    for q in (0.0, 0.1):
        ref = np.linalg.eigvalsh(magnetic_laplacian(ei, n, q).to_dense().numpy())[:12]
        assert np.diff(ref).min() < 1e-10  # the spectrum really is degenerate
        eig = maglap_eigenpairs(ei, n, 12, q, q_relative=False, solver="arpack")
        np.testing.assert_allclose(eig.eigval[0].numpy(), ref, atol=1e-10, rtol=0)
        vec = eig.eigvec[:, 0]
        torch.testing.assert_close(vec.conj().T @ vec, torch.eye(12, dtype=torch.complex128), atol=1e-8, rtol=0)


def test_float32_arpack_matches_float64():
    ei, n, _ = _pieces_graph([400, 300], 3, seed=5)
    for q in (0.0, 0.25):
        ref = maglap_eigenpairs(ei, n, 8, q, q_relative=False, solver="arpack")
        got = maglap_eigenpairs(ei, n, 8, q, q_relative=False, solver="arpack", dtype=torch.float32)
        torch.testing.assert_close(got.eigval, ref.eigval, atol=1e-9, rtol=0)
        torch.testing.assert_close(got.eigvec, ref.eigvec, atol=1e-4, rtol=0)


def test_unnormalized_isolated_node_and_arpack():
    ei, n, pieces = _pieces_graph([80, 40], 2, seed=6)
    for solver in ("dense", "arpack"):
        eig = maglap_eigenpairs(ei, n, 6, 0.25, q_relative=False, normalization=None, solver=solver)
        ref = _reference_spectrum(ei, n, 0.25, pieces, normalization=None)[:6]
        np.testing.assert_allclose(eig.eigval[0].numpy(), ref, atol=1e-9, rtol=0)
        assert (eig.eigval[0].abs() < 1e-9).sum() == 2  # the isolated nodes: degree 0, eigenvalue 0


def test_sign_rotate_rule_follows_the_reference():
    ei = _path_plus(9)
    raw = maglap_eigenpairs(ei, 9, 4, 0.25, normalize=False)
    got = maglap_eigenpairs(ei, 9, 4, 0.25, normalize="sign_rotate").eigvec[:, 0].numpy()
    vec = raw.eigvec[:, 0].numpy()
    # the reference's steps, written out
    for i in range(4):
        vec[:, i] *= np.sign(vec[np.abs(vec[:, i].real).argmax(), i].real)
    u = vec[:, 0].imag.argmax()
    np.testing.assert_allclose(got, vec * np.exp(-1j * np.angle(vec[u : u + 1])), atol=1e-12)
    assert abs(got[u, 0].imag) < 1e-12  # the first vector is real at u*
    q0 = maglap_eigenpairs(ei, 9, 4, 0.0, normalize="sign_rotate")  # the reference skips it at q = 0
    torch.testing.assert_close(q0.eigvec, maglap_eigenpairs(ei, 9, 4, 0.0, normalize=False).eigvec)


def test_warm_start_is_certified_or_refused(monkeypatch):
    from mmpos.graph import eigen

    taken = []
    real = eigen._solve_warm
    monkeypatch.setattr(eigen, "_solve_warm", lambda *a: taken.append(real(*a) is not None) or real(*a))
    ei, n, pieces = _pieces_graph([600], 5, seed=7)
    spec = _reference_spectrum(ei, n, 0.0, pieces)
    k = 4 + int(np.argmax(np.diff(spec[4:13])))  # the widest q = 0 gap after the k-th of 4..12
    for q, expect in ((1e-5, [True]), (0.01, []), (0.25, [])):  # a small q: certified; larger: not tried
        taken.clear()
        got = maglap_eigenpairs(ei, n, k, q, q_relative=False, solver="arpack", dtype=torch.float32)
        ref = maglap_eigenpairs(ei, n, k, q, q_relative=False, solver="dense")
        assert taken == expect
        torch.testing.assert_close(got.eigval, ref.eigval, atol=1e-8, rtol=0)
        torch.testing.assert_close(got.eigvec, ref.eigvec, atol=1e-3, rtol=0)
    taken.clear()
    maglap_eigenpairs(ei, n, k, 1e-5, q_relative=False, solver="arpack")  # float64: complex ARPACK, no warm start
    assert taken == []


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_chebyshev_filtered_arpack_gives_the_k_smallest(monkeypatch, dtype):
    # the filtered path (ARPACK on p(L), see eigen._solve_arpack) runs on components >= _FILTER_MIN nodes;
    # lowered here so that graphs small enough for an independent dense solve take it
    from mmpos.graph import eigen

    monkeypatch.setattr(eigen, "_FILTER_MIN", 100)
    used = []
    real = eigen._chebyshev_filter
    monkeypatch.setattr(eigen, "_chebyshev_filter", lambda *a: used.append(a[1]) or real(*a))
    ei, n, pieces = _pieces_graph([700, 400, 150], 3, seed=8)
    k = 12
    for q in (0.0, 0.05, 0.25):
        used.clear()
        eig = maglap_eigenpairs(ei, n, k, q, q_relative=False, solver="arpack", dtype=dtype)
        assert len(used) == 3  # the three components of 100+ nodes were filtered
        ref = _reference_spectrum(ei, n, q, pieces)[:k]
        np.testing.assert_allclose(eig.eigval[0].numpy(), ref, atol=1e-9 if dtype == torch.float32 else 1e-10)
        lap = magnetic_laplacian(ei, n, q).to(torch.complex128)
        vec, val = eig.eigvec[:, 0], eig.eigval[0]
        assert (torch.sparse.mm(lap, vec) - vec * val).abs().max() < (1e-5 if dtype == torch.float32 else 1e-8)


def test_chebyshev_filter_keeps_repeated_eigenvalues(monkeypatch):
    from mmpos.graph import eigen

    monkeypatch.setattr(eigen, "_FILTER_MIN", 100)
    ei, n = _three_paths_graph()
    for q in (0.0, 0.1):
        ref = np.linalg.eigvalsh(magnetic_laplacian(ei, n, q).to_dense().numpy())[:12]
        eig = maglap_eigenpairs(ei, n, 12, q, q_relative=False, solver="arpack")
        np.testing.assert_allclose(eig.eigval[0].numpy(), ref, atol=1e-10, rtol=0)


def test_chebyshev_filter_is_the_chebyshev_polynomial():
    from mmpos.graph import eigen

    lap = sp.csr_matrix(np.diag(np.linspace(0.0, 2.0, 9)))
    op = eigen._chebyshev_filter(lap, 0.5, 2.0, 4)
    x = np.linspace(0.0, 2.0, 9)
    y = (2 * x - 2.5) / 1.5
    t4 = 8 * y**4 - 8 * y**2 + 1  # T_4
    t4_0 = 8 * (2.5 / 1.5) ** 4 - 8 * (2.5 / 1.5) ** 2 + 1
    np.testing.assert_allclose(op @ np.eye(9), np.diag(t4 / t4_0), atol=1e-12)
    assert eigen._ritz_bound(lap, 3, 8) >= x[2] - 1e-12  # an upper bound of lambda_3
