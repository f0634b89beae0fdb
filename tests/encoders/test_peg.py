import math

import pytest
import torch
from timm.models.twins import PosConv

import mmpos
from mmpos.coords import Coords
from mmpos.encoders.peg import PositionEncodingGenerator
from mmpos.encoders.registry import create, encoder_info
from mmpos.nn.blocks import Transformer
from mmpos.nn.vit import VisionTransformer


def _tokens(b, grid, dim, prefix=0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, prefix + math.prod(grid), dim, generator=g)


@pytest.mark.parametrize("grid, prefix", [((5, 7), 0), ((6, 4), 1), ((3, 3), 2)])
def test_matches_timm_posconv(grid, prefix):
    dim = 8
    ref = PosConv(dim, dim, stride=1)
    peg = create("peg", dim=dim)
    peg.proj.weight.data.copy_(ref.proj[0].weight)
    peg.proj.bias.data.copy_(torch.randn(dim))  # bias is zero at init: make it count
    ref.proj[0].bias.data.copy_(peg.proj.bias)
    x = _tokens(2, grid, dim, prefix)
    out = peg(x, Coords.grid(*grid, num_prefix_tokens=prefix))
    expected = ref(x[:, prefix:], grid)
    torch.testing.assert_close(out[:, prefix:], expected, rtol=1e-5, atol=1e-6)
    assert torch.equal(out[:, :prefix], x[:, :prefix])  # prefix tokens untouched


def test_init_as_reference():
    peg = PositionEncodingGenerator(512, 3)
    assert peg.proj.groups == 512 and peg.proj.padding == (1, 1) and peg.proj.stride == (1, 1)
    assert torch.equal(peg.proj.bias, torch.zeros(512))
    assert abs(peg.proj.weight.std().item() - math.sqrt(2 / 9)) < 0.03
    peg3 = PositionEncodingGenerator(512, 3, grid_dims=3)
    assert isinstance(peg3.proj, torch.nn.Conv3d)
    assert abs(peg3.proj.weight.std().item() - math.sqrt(2 / 27)) < 0.02
    assert peg.no_weight_decay() == {name for name, _ in peg.named_parameters()}


def test_translation_equivariance_in_interior():
    dim, (h, w), shift = 4, (9, 11), (2, 3)
    peg = create("peg", dim=dim)
    coords = Coords.grid(h, w, num_prefix_tokens=1)
    x = _tokens(2, (h, w), dim, prefix=1)
    cls, grid = x[:, :1], x[:, 1:].reshape(2, h, w, dim)
    shifted = torch.cat([cls, grid.roll(shift, dims=(1, 2)).reshape(2, h * w, dim)], 1)
    out = peg(x, coords)[:, 1:].reshape(2, h, w, dim)
    out_shifted = peg(shifted, coords)[:, 1:].reshape(2, h, w, dim)
    # rows r in [shift + 1, h - 2]: neither zero padding nor the roll's wrap-around is in reach
    rows, cols = slice(shift[0] + 1, h - 1), slice(shift[1] + 1, w - 1)
    torch.testing.assert_close(out_shifted[:, rows, cols], out.roll(shift, dims=(1, 2))[:, rows, cols])
    # at the border the zero padding breaks equivariance: position is recoverable there
    assert not torch.allclose(out_shifted[:, 0], out.roll(shift, dims=(1, 2))[:, 0])


def test_non_square_grid_row_major():
    dim, (h, w) = 3, (2, 5)
    peg = create("peg", dim=dim)
    x = _tokens(1, (h, w), dim)
    feat = x.transpose(1, 2).reshape(1, dim, h, w)
    expected = torch.nn.functional.conv2d(feat, peg.proj.weight, peg.proj.bias, padding=1, groups=dim) + feat
    torch.testing.assert_close(peg(x, Coords.grid(h, w)), expected.flatten(2).transpose(1, 2))


def test_peg3d_video_grid():
    dim, grid = 4, (3, 4, 5)
    peg = create("peg3d", dim=dim)
    x = _tokens(2, grid, dim, prefix=1)
    out = peg(x, Coords.grid(*grid, num_prefix_tokens=1))
    feat = x[:, 1:].transpose(1, 2).reshape(2, dim, *grid)
    expected = torch.nn.functional.conv3d(feat, peg.proj.weight, peg.proj.bias, padding=1, groups=dim) + feat
    torch.testing.assert_close(out[:, 1:], expected.flatten(2).transpose(1, 2))
    assert torch.equal(out[:, :1], x[:, :1])
    # temporal shift equivariance away from the borders
    rolled = torch.cat([x[:, :1], x[:, 1:].reshape(2, *grid, dim).roll(1, 1).flatten(1, 3)], 1)
    out_rolled = peg(rolled, Coords.grid(*grid, num_prefix_tokens=1))[:, 1:].reshape(2, *grid, dim)
    ref = out[:, 1:].reshape(2, *grid, dim).roll(1, 1)
    torch.testing.assert_close(out_rolled[:, 2:-1, 1:-1, 1:-1], ref[:, 2:-1, 1:-1, 1:-1])


def test_registry_entries():
    assert encoder_info("peg").kind == "conv" and encoder_info("peg3d").kind == "conv"
    assert create("peg", dim=6, kernel_size=5).proj.padding == (2, 2)
    assert isinstance(mmpos.create("peg3d", dim=6).proj, torch.nn.Conv3d)


def test_errors():
    peg = create("peg", dim=4)
    x = _tokens(1, (3, 3), 4)
    with pytest.raises(ValueError, match="grid_shape=None"):
        peg(x, Coords.sequence(9))
    with pytest.raises(ValueError, match="coords describe"):
        peg(x, Coords.grid(3, 4))
    with pytest.raises(ValueError, match="use peg3d"):
        peg(_tokens(1, (2, 3, 3), 4), Coords.grid(2, 3, 3))
    with pytest.raises(ValueError, match="D=4"):
        peg(_tokens(1, (3, 3), 5), Coords.grid(3, 3))
    for bad in (0, 2, -3):
        with pytest.raises(ValueError, match="kernel_size"):
            PositionEncodingGenerator(4, bad)
    with pytest.raises(ValueError, match="grid_dims"):
        PositionEncodingGenerator(4, 3, grid_dims=1)
    with pytest.raises(ValueError, match="dim"):
        PositionEncodingGenerator(0)


def test_transformer_placement_after_listed_blocks():
    torch.manual_seed(0)
    model = Transformer(16, 3, 2, pos="peg", conv_after=(0, 2)).eval()
    assert set(model.pos_convs) == {"0", "2"}
    assert all(isinstance(m["peg"], PositionEncodingGenerator) and len(m) == 1 for m in model.pos_convs.values())
    coords = Coords.grid(4, 6, num_prefix_tokens=1)
    x = _tokens(2, (4, 6), 16, prefix=1)
    # manual composition: block 0, PEG, block 1, block 2, PEG, norm
    y = model.blocks[0](x, coords)
    y = model.pos_convs["0"]["peg"](y, coords)
    y = model.blocks[2](model.blocks[1](y, coords), coords)
    y = model.norm(model.pos_convs["2"]["peg"](y, coords))
    torch.testing.assert_close(model(x, coords), y)
    # the PEG is not an identity: zeroing its kernel changes the output
    with torch.no_grad():
        model.pos_convs["0"]["peg"].proj.weight.zero_()
    assert not torch.allclose(model(x, coords), y)
    with pytest.raises(ValueError, match="conv_after"):
        Transformer(16, 3, 2, pos="peg", conv_after=(3,))


def test_vit_with_peg_other_resolutions_and_video_stack():
    torch.manual_seed(0)
    vit = VisionTransformer(img_size=16, patch_size=4, dim=16, depth=2, num_heads=2, pos="peg").eval()
    for size in [(16, 16), (24, 16), (12, 32)]:
        assert vit(torch.randn(2, 3, *size)).shape == (2, 10)
    video = Transformer(16, 2, 2, pos="peg3d", conv_after=(0, 1))
    grid = (2, 3, 4)
    out = video(_tokens(2, grid, 16, prefix=1), Coords.grid(*grid, num_prefix_tokens=1))
    assert out.shape == (2, 1 + 24, 16)
    out.sum().backward()
    assert video.pos_convs["1"]["peg3d"].proj.weight.grad.abs().sum() > 0


def test_compiles_without_graph_breaks():
    peg = create("peg", dim=8)
    coords = Coords.grid(4, 5, num_prefix_tokens=1)
    x = _tokens(2, (4, 5), 8, prefix=1)
    compiled = torch.compile(peg, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x, coords), peg(x, coords))
