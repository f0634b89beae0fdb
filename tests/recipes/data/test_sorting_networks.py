import itertools

import numpy as np
import pytest
import torch

from recipes.data.sorting_networks import build_dataset, is_sorting_network, network_graph, sample_network


def _brute_force_sorts(comparators, n):
    for values in itertools.product(range(3), repeat=n):
        v = list(values)
        for i, j in comparators:
            if v[i] > v[j]:
                v[i], v[j] = v[j], v[i]
        if v != sorted(v):
            return False
    return True


def test_known_networks():
    four = [(0, 1), (2, 3), (0, 2), (1, 3), (1, 2)]  # the optimal 4-channel network
    assert is_sorting_network(four, 4)
    assert not is_sorting_network(four[:-1], 4)
    bubble = [(i, i + 1) for k in range(5, 0, -1) for i in range(k)]
    assert is_sorting_network(bubble, 6) and not is_sorting_network([], 6)


def test_zero_one_check_agrees_with_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(150):
        n = int(rng.integers(2, 6))
        comps = [tuple(sorted(int(c) for c in rng.choice(n, 2, replace=False))) for _ in range(rng.integers(0, 10))]
        assert is_sorting_network(comps, n) == _brute_force_sorts(comps, n)


@pytest.mark.parametrize("n", [3, 7, 11])
def test_sampled_networks_sort_and_need_their_last_comparator(n):
    rng = np.random.default_rng(n)
    for _ in range(3):
        net = sample_network(n, rng)
        assert all(0 <= i < j < n for i, j in net)
        assert all(a != b for a, b in itertools.pairwise(net))  # never the previous comparator again
        assert is_sorting_network(net, n) and not is_sorting_network(net[:-1], n)


def test_sampling_is_deterministic_and_capped():
    a = sample_network(8, np.random.default_rng(5))
    assert a == sample_network(8, np.random.default_rng(5))
    assert sample_network(8, np.random.default_rng(5), max_comparators=3) is None


def test_graph_edges_come_from_the_previous_comparator_per_channel():
    edge_index, chans = network_graph([(0, 1), (2, 3), (1, 2), (0, 1), (1, 2)], 4)
    assert chans.tolist() == [[0, 1], [2, 3], [1, 2], [0, 1], [1, 2]]
    edges = set(map(tuple, edge_index.t().tolist()))
    assert edges == {(0, 2), (1, 2), (0, 3), (2, 3), (3, 4), (2, 4)}
    assert edge_index.dtype == torch.long and (edge_index[0] < edge_index[1]).all()  # a DAG in comparator order
    same, feats = network_graph([(0, 1), (2, 3), (1, 2), (0, 1), (1, 2)], 4, order_index=True)
    assert torch.equal(same, edge_index)  # the reference's node_feat: (order_idx, i, j)
    assert feats.tolist() == [[0, 0, 1], [1, 2, 3], [2, 1, 2], [3, 0, 1], [4, 1, 2]]


def test_dataset_has_positives_negatives_and_reversed():
    data = build_dataset([5, 6], 4, seed=1, reverse=True)
    assert len(data) == 12
    for pos, neg, rev in zip(data[::3], data[1::3], data[2::3]):
        assert pos.label and not neg.label and neg.comparators == pos.comparators[:-1]
        assert rev.comparators == pos.comparators[::-1] and rev.label == is_sorting_network(
            rev.comparators, pos.num_channels
        )
    assert [d.comparators for d in build_dataset([5, 6], 4, seed=1, reverse=True)] == [d.comparators for d in data]


def test_bad_arguments():
    with pytest.raises(ValueError, match="num_channels"):
        sample_network(1, np.random.default_rng(0))
    with pytest.raises(TypeError, match="rng"):
        sample_network(4, 0)
    with pytest.raises(ValueError, match="comparators"):
        is_sorting_network([(2, 1)], 4)
    with pytest.raises(ValueError, match="num_networks"):
        build_dataset([4], 0, seed=0)
