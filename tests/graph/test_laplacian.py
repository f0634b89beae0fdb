import math

import numpy as np
import pytest
import torch
from torch_geometric.utils import get_laplacian, to_dense_adj, to_undirected

from mmpos.graph import magnetic_laplacian, num_one_way_edges, relative_q

pytestmark = pytest.mark.pyg  # compared with torch-geometric's get_laplacian


def _random_digraph(n, m, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, n, (2, m), generator=g)


def _dense(edge_index, n, q, **kw):
    return magnetic_laplacian(edge_index, n, q, **kw).to_dense()


def test_q0_equals_pyg_sym_laplacian_of_symmetrised_graph():
    ei = _random_digraph(30, 70, 0)
    ei = ei[:, ei[0] != ei[1]]  # PyG's get_laplacian drops self-loops; we keep them
    lap = _dense(ei, 30, 0.0)
    assert lap.dtype == torch.float64
    e, w = get_laplacian(to_undirected(ei), normalization="sym", num_nodes=30)
    ref = to_dense_adj(e, edge_attr=w.double(), max_num_nodes=30)[0]
    torch.testing.assert_close(lap, ref)


@pytest.mark.parametrize("q", [0.05, 0.25, 0.5])
def test_hermitian_with_spectrum_in_0_2(q):
    ei = _random_digraph(40, 120, 1)  # has self-loops and multi-edges
    lap = _dense(ei, 40, q)
    torch.testing.assert_close(lap, lap.conj().T)
    val = torch.linalg.eigvalsh(lap)
    assert val.min() > -1e-12 and val.max() < 2 + 1e-12


def test_entries_follow_the_formula():
    # 0 -> 1 one way, 1 <-> 2 both ways; degrees of A_s: 1, 2, 1
    ei = torch.tensor([[0, 1, 2], [1, 2, 1]])
    lap = _dense(ei, 3, 0.125)
    assert lap[0, 1] == pytest.approx(-(2**-0.5) * complex(math.cos(math.pi / 4), math.sin(math.pi / 4)))
    assert lap[1, 0] == pytest.approx(-(2**-0.5) * complex(math.cos(math.pi / 4), -math.sin(math.pi / 4)))
    assert lap[1, 2] == pytest.approx(-(2**-0.5))  # two-way pair: no phase
    assert lap[0, 2] == 0 and lap[0, 0] == 1


def test_reversing_edges_conjugates():
    ei = _random_digraph(25, 60, 2)
    torch.testing.assert_close(_dense(ei.flip(0), 25, 0.2), _dense(ei, 25, 0.2).conj())


def test_directed_cycle_analytic_spectrum():
    n, q = 12, 0.3
    ei = torch.stack([torch.arange(n), (torch.arange(n) + 1) % n])
    val = torch.linalg.eigvalsh(_dense(ei, n, q)).numpy()
    ref = np.sort(1 - np.cos(2 * np.pi * (np.arange(n) + q * n) / n))
    np.testing.assert_allclose(val, ref, atol=1e-12)
    # relative q: q' / min(m_dir, n) = q' / n shifts the phases by 2 pi q' / n
    val = torch.linalg.eigvalsh(_dense(ei, n, 0.25, q_relative=True)).numpy()
    np.testing.assert_allclose(val, np.sort(1 - np.cos(2 * np.pi * (np.arange(n) + 0.25) / n)), atol=1e-12)


def test_relative_q_counts_one_way_edges_once():
    ei = torch.tensor([[0, 0, 1, 2, 1], [1, 1, 2, 1, 3]])  # 0->1 (twice), 1<->2, 1->3
    assert num_one_way_edges(ei, 4) == 2
    assert relative_q(0.25, 2, 4) == 0.125
    assert relative_q(0.25, 0, 4) == 0.25 and relative_q(0.25, 100, 4) == 0.0625


def test_multi_edges_collapse_and_self_loops_are_defined():
    ei = torch.tensor([[0, 1, 2], [1, 2, 2]])
    doubled = torch.cat([ei, ei], dim=1)
    torch.testing.assert_close(_dense(doubled, 3, 0.25), _dense(ei, 3, 0.25))
    lap = _dense(ei, 3, 0.25)
    assert lap[2, 2].real == pytest.approx(1 - 1 / 2)  # self-loop counts once in A_s and the degree


def test_empty_single_and_isolated():
    torch.testing.assert_close(
        _dense(torch.zeros(2, 0, dtype=torch.long), 4, 0.25), torch.eye(4, dtype=torch.complex128)
    )
    assert _dense(torch.zeros(2, 0, dtype=torch.long), 1, 0.25).tolist() == [[1.0]]


@pytest.mark.parametrize(
    "edge_index, n, err, match",
    [
        (torch.tensor([[0, 5], [1, 0]]), 3, ValueError, "outside"),
        (torch.tensor([[-1], [0]]), 3, ValueError, "outside"),
        (torch.tensor([0, 1]), 3, ValueError, r"shape \(2, m\)"),
        (torch.tensor([[0.0], [1.0]]), 3, TypeError, "integer"),
        ([[0], [1]], 3, TypeError, "tensor or numpy"),
        (torch.tensor([[0], [0]]), 0, ValueError, "num_nodes"),
    ],
)
def test_bad_input(edge_index, n, err, match):
    with pytest.raises(err, match=match):
        magnetic_laplacian(edge_index, n, 0.25)


def test_bad_q_and_normalization():
    ei = torch.tensor([[0], [1]])
    with pytest.raises(ValueError, match="q must be"):
        magnetic_laplacian(ei, 2, float("nan"))
    with pytest.raises(ValueError, match="normalization"):
        magnetic_laplacian(ei, 2, 0.25, normalization="rw")


def test_unnormalized_is_degree_minus_weighted_adjacency():
    ei = torch.tensor([[0, 1], [1, 2]])
    lap = _dense(ei, 3, 0.25, normalization=None)
    assert lap[1, 1] == 2 and lap[0, 1] == pytest.approx(-1j) and lap[1, 0] == pytest.approx(1j)


def test_unnormalized_isolated_node_has_degree_zero_as_the_reference():
    # reference (use_symmetric_norm=False): deg = symmetric_adj.sum(-2), no clip; "sym" clips inside D^-1/2
    ei = torch.tensor([[0], [1]])
    lap = _dense(ei, 3, 0.25, normalization=None)
    assert lap[2].abs().max() == 0 and lap[0, 0] == 1
    assert _dense(ei, 3, 0.25)[2, 2] == 1
