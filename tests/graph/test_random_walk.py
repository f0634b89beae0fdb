import pytest
import torch

from mmpos.graph import directional_random_walk_node_pe, directional_random_walks, transition_matrix


def test_transition_of_a_path_self_loops_the_sink():
    ei = torch.tensor([[0, 1, 0, 0], [1, 2, 2, 2]])  # 0 -> 1, 1 -> 2, 0 -> 2 (twice: collapses)
    t = transition_matrix(ei, 3)
    torch.testing.assert_close(t, torch.tensor([[0, 0.5, 0.5], [0, 0, 1], [0, 0, 1]], dtype=torch.float64))
    tr = transition_matrix(ei, 3, reverse=True)
    torch.testing.assert_close(tr, torch.tensor([[1, 0, 0], [1, 0, 0], [0.5, 0.5, 0]], dtype=torch.float64))


def test_relative_channels_are_powers_and_pagerank():
    g = torch.Generator().manual_seed(0)
    ei = torch.randint(0, 12, (2, 30), generator=g)
    rel = directional_random_walks(ei, 12, walk_length=3, ppr_alpha=0.2)
    assert rel.shape == (12, 12, 8)
    for reverse, off in ((False, 0), (True, 4)):
        t = transition_matrix(ei, 12, reverse)
        torch.testing.assert_close(rel[..., off], t)
        torch.testing.assert_close(rel[..., off + 2], t @ t @ t)
        ppr = rel[..., off + 3]
        torch.testing.assert_close(ppr, 0.2 * torch.eye(12, dtype=torch.float64) + 0.8 * t @ ppr)  # fixed point
    torch.testing.assert_close(rel.sum(1), torch.ones(12, 8, dtype=torch.float64))  # rows are distributions


def test_absolute_is_column_sums_of_relative():
    g = torch.Generator().manual_seed(1)
    ei = torch.randint(0, 20, (2, 50), generator=g)
    rel = directional_random_walks(ei, 20, 3, 0.1)
    torch.testing.assert_close(directional_random_walk_node_pe(ei, 20, 3, 0.1), rel.sum(0), atol=1e-9, rtol=0)
    assert directional_random_walk_node_pe(ei, 20, 2, None).shape == (20, 4)


def test_direction_is_visible():
    ei = torch.tensor([[0, 1, 2], [1, 2, 3]])
    fwd = directional_random_walks(ei, 4, 2, None)
    bwd = directional_random_walks(ei.flip(0), 4, 2, None)
    assert not torch.equal(fwd, bwd)
    torch.testing.assert_close(fwd[..., :2], bwd[..., 2:])  # reversing swaps the forward and reverse halves


def test_bad_arguments():
    ei = torch.tensor([[0], [1]])
    with pytest.raises(ValueError, match="walk_length"):
        directional_random_walks(ei, 2, 0)
    with pytest.raises(ValueError, match="ppr_alpha"):
        directional_random_walks(ei, 2, 3, 1.5)
    with pytest.raises(ValueError, match="max_nodes"):
        directional_random_walks(ei, 50, 3, 0.1, max_nodes=10)
