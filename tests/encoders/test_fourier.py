"""Learnable Fourier features: Algorithm 1 of Li et al. 2021, its kernel claims, groups, gradients, errors."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mmpos.coords import Coords
from mmpos.encoders.fourier import LearnableFourierFeatures
from mmpos.encoders.registry import create
from mmpos.nn import Transformer


def algorithm_1(enc, x):
    """Li et al. 2021, Algorithm 1 on X (N, G, M), written from the paper with the module's weights."""
    w_r = enc.freqs.detach().double()  # (F/2, M)
    f_dim = 2 * w_r.shape[0]
    proj = x.double() @ w_r.T
    feats = torch.cat([torch.cos(proj), torch.sin(proj)], dim=-1) / f_dim**0.5  # (N, G, F)
    lin1, lin2 = enc.mlp[0], enc.mlp[2]
    hidden = torch.nn.functional.gelu(feats @ lin1.weight.double().T + lin1.bias.double())
    y = hidden @ lin2.weight.double().T + lin2.bias.double()  # (N, G, D / G)
    return y.reshape(x.shape[0], -1)  # (N, D)


def test_embed_equals_algorithm_1_on_points_with_groups():
    torch.manual_seed(0)
    enc = LearnableFourierFeatures(48, axes=("x1", "y1", "x2", "y2"), groups=2, fourier_dim=20, hidden_dim=16)
    boxes = torch.randn(3, 7, 4)
    out = enc.embed(Coords.points(boxes, axes=("x1", "y1", "x2", "y2")))
    assert out.shape == (3, 7, 48)
    for b in range(3):
        want = algorithm_1(enc, boxes[b].view(7, 2, 2)).float()
        torch.testing.assert_close(out[b], want, rtol=1e-5, atol=1e-6)
    # groups are independent: moving the second box corner leaves the first half of the code unchanged
    moved = boxes.clone()
    moved[..., 2:] += 1.0
    out2 = enc.embed(Coords.points(moved, axes=("x1", "y1", "x2", "y2")))
    torch.testing.assert_close(out2[..., :24], out[..., :24], rtol=0, atol=0)
    assert not torch.allclose(out2[..., 24:], out[..., 24:])


def test_grids_prefix_and_axis_selection():
    enc = LearnableFourierFeatures(32, axes=("h", "w"))
    coords = Coords.grid(3, 5, num_prefix_tokens=1)
    out = enc.embed(coords)
    assert out.shape == (1, 16, 32)
    assert torch.equal(out[:, 0], torch.zeros(1, 32))  # class token gets no position
    video = Coords.grid(2, 3, 5)  # reads only (h, w): every frame gets the same code
    v = enc.embed(video)
    torch.testing.assert_close(v[:, :15], v[:, 15:], rtol=0, atol=0)
    torch.testing.assert_close(v[:, :15], out[:, 1:], rtol=0, atol=0)
    enc3 = LearnableFourierFeatures(32, axes=("t", "h", "w"))
    assert not torch.allclose(enc3.embed(video)[:, :15], enc3.embed(video)[:, 15:])


def test_features_have_the_papers_normalisation():
    enc = LearnableFourierFeatures(16, fourier_dim=64)
    pos = torch.randn(2, 11, 3, dtype=torch.float64) * 5
    r = enc.features(pos)  # (B, N, 1, F)
    assert r.shape == (2, 11, 1, 64) and r.dtype == torch.float64
    torch.testing.assert_close(r.square().sum(-1), torch.full((2, 11, 1), 0.5, dtype=torch.float64))


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    shift=st.lists(st.floats(-100, 100), min_size=3, max_size=3),
    gamma=st.floats(0.1, 10),
)
def test_feature_dot_product_depends_only_on_differences(seed, shift, gamma):
    torch.manual_seed(seed)
    enc = LearnableFourierFeatures(8, fourier_dim=32, gamma=gamma)
    pos = torch.randn(1, 6, 3, dtype=torch.float64) * 10
    r = enc.features(pos)[:, :, 0]
    r_moved = enc.features(pos + torch.tensor(shift, dtype=torch.float64))[:, :, 0]
    torch.testing.assert_close(r_moved @ r_moved.mT, r @ r.mT, rtol=1e-9, atol=1e-9)
    # ... and equals (1 / F) sum_k cos(w_k . (x - y))
    w = enc.freqs.detach().double()
    diff = pos[0, :, None] - pos[0, None, :]  # (N, N, 3)
    torch.testing.assert_close(r[0] @ r[0].T, torch.cos(diff @ w.T).sum(-1) / 32, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("gamma", [0.5, 2.0])
def test_init_gives_the_gaussian_kernel_of_width_gamma(gamma):
    # W_r ~ N(0, gamma^-2) (std 1 / gamma): E[r_x . r_y] = exp(-|x - y|^2 / (2 gamma^2)) / 2
    torch.manual_seed(0)
    half = 20000
    enc = LearnableFourierFeatures(8, fourier_dim=2 * half, gamma=gamma)
    dist = torch.tensor([0.0, 0.5, 1.0, 2.0, 3.0], dtype=torch.float64) * gamma
    pos = torch.stack([torch.zeros(5, 3, dtype=torch.float64), torch.zeros(5, 3, dtype=torch.float64)], 1)
    pos[:, 1, 0] = dist
    r = enc.features(pos)[:, :, 0]  # (5 pairs, 2 points, F)
    dots = (r[:, 0] * r[:, 1]).sum(-1)
    kernel = 0.5 * torch.exp(-(dist**2) / (2 * gamma**2))
    # Monte Carlo over F/2 frequencies: std of the mean <= 0.5 / sqrt(F/2)
    torch.testing.assert_close(dots, kernel, rtol=0, atol=5 * 0.5 / math.sqrt(half))


def test_gradients_reach_frequencies_and_mlp():
    enc = LearnableFourierFeatures(24, axes=("x", "y", "z"), fourier_dim=16, hidden_dim=8)
    xyz = torch.randn(2, 10, 3, requires_grad=True)
    enc.embed(Coords.points(xyz)).square().sum().backward()
    for name, p in enc.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert xyz.grad is not None and xyz.grad.abs().sum() > 0  # continuous in the coordinates
    pos = torch.randn(1, 4, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(enc.features, (pos,))


def test_registered_and_used_in_a_transformer_on_a_point_cloud():
    enc = create("fourier", dim=32)
    assert isinstance(enc, LearnableFourierFeatures) and enc.axes == ("x", "y", "z")
    model = Transformer(32, depth=2, num_heads=4, pos="fourier", pos_kwargs={"fourier": {"gamma": 0.5}})
    xyz = torch.rand(2, 50, 3)
    tokens = torch.randn(2, 50, 32)
    out = model(tokens, Coords.points(xyz))
    assert out.shape == (2, 50, 32)
    assert not torch.allclose(out, model(tokens, Coords.points(xyz.flip(1))))  # position changes the output


def test_errors():
    with pytest.raises(ValueError, match="groups"):
        LearnableFourierFeatures(32, axes=("x", "y", "z"), groups=2)
    with pytest.raises(ValueError, match="dim"):
        LearnableFourierFeatures(30, axes=("x", "y", "z", "w"), groups=4)
    with pytest.raises(ValueError, match="fourier_dim"):
        LearnableFourierFeatures(32, fourier_dim=7)
    with pytest.raises(ValueError, match="hidden_dim"):
        LearnableFourierFeatures(32, hidden_dim=0)
    with pytest.raises(ValueError, match="gamma"):
        LearnableFourierFeatures(32, gamma=0.0)
    enc = LearnableFourierFeatures(32)
    with pytest.raises(ValueError, match="axes="):
        enc.embed(Coords.grid(4, 4))
    with pytest.raises(ValueError, match="3 axes"):
        enc.features(torch.zeros(1, 2, 2))
    with pytest.raises(ValueError, match="tokens"):
        enc(torch.zeros(1, 5, 32), Coords.points(torch.zeros(1, 4, 3)))


def test_embed_compiles_without_graph_breaks():
    torch._dynamo.reset()
    enc = LearnableFourierFeatures(32, axes=("h", "w"))
    coords = Coords.grid(3, 4, num_prefix_tokens=1)
    compiled = torch.compile(enc.embed, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(coords), enc.embed(coords))
