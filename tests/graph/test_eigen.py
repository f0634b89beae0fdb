import numpy as np
import pytest
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
def test_dense_and_lanczos_agree(q):
    ei = _random_digraph(300, 1500, 3)
    dense = maglap_eigenpairs(ei, 300, 8, q, solver="dense")
    lanczos = maglap_eigenpairs(ei, 300, 8, q, solver="lanczos")
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
        maglap_eigenpairs(ei, 2, 1, solver="arpack")
    with pytest.raises(ValueError, match="num_nodes > k"):
        maglap_eigenpairs(ei, 2, 2, solver="lanczos")
    with pytest.raises(ValueError, match="q must be"):
        maglap_eigenpairs(ei, 2, 1, q=[])
