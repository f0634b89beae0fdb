import networkx as nx
import numpy as np
import pytest
import torch

from recipes.data.digraphs import directed_distances, random_digraph, reachability


@pytest.mark.parametrize("acyclic", [False, True])
def test_graphs_and_targets_match_networkx(acyclic):
    rng = np.random.default_rng(0)
    for _ in range(5):
        edge_index, n = random_digraph(18, rng, acyclic=acyclic)
        g = nx.DiGraph()
        g.add_nodes_from(range(n))
        g.add_edges_from(edge_index.t().tolist())
        assert nx.is_weakly_connected(g) and (not acyclic or nx.is_directed_acyclic_graph(g))
        lengths = dict(nx.all_pairs_shortest_path_length(g))
        ref = torch.tensor([[lengths[u].get(v, -1) for v in range(n)] for u in range(n)])
        assert torch.equal(directed_distances(edge_index, n), ref)
        reach = reachability(edge_index, n)
        off = ~torch.eye(n, dtype=torch.bool)
        assert torch.equal(reach[off], (ref > 0)[off])


def test_cycle_reaches_itself_and_determinism():
    ring = torch.tensor([[0, 1, 2], [1, 2, 0]])
    assert reachability(ring, 3).all()
    path = torch.tensor([[0, 1], [1, 2]])
    assert not reachability(path, 3).diagonal().any()
    a = random_digraph(12, np.random.default_rng(3))
    b = random_digraph(12, np.random.default_rng(3))
    assert torch.equal(a[0], b[0]) and a[1] == b[1]


def test_bad_arguments():
    with pytest.raises(ValueError, match="num_nodes"):
        random_digraph(1, np.random.default_rng(0))
    with pytest.raises(TypeError, match="rng"):
        random_digraph(5, 0)
    with pytest.raises(ValueError, match="avg_degree"):
        random_digraph(5, np.random.default_rng(0), avg_degree=10)
