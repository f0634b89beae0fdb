"""torch.export of mmpos.nn.Attention / Transformer with every encoder kind (ONNX: test_onnx.py)."""

import pytest
import torch
from torch import nn
from torch.export import Dim

import mmpos
from mmpos import Coords
from mmpos.export import export, static_grid_encoders
from mmpos.nn import Attention, Transformer

AXES = {2: ("h", "w"), 3: ("t", "h", "w")}


class GridNet(nn.Module):
    """Tokens ``(B, *grid, D)`` on a grid read from the input's shape (dynamic when the shape is)."""

    def __init__(self, pos: str, grid: tuple[int, ...], **kwargs):
        super().__init__()
        kw = {pos: kwargs} if kwargs else None
        self.net = Transformer(16, 1, 2, pos=pos, pos_kwargs=kw, grid_size=grid, axes=AXES[len(grid)], mlp_ratio=2)

    def forward(self, x):
        return self.net(x.flatten(1, -2), Coords.grid(*x.shape[1:-1], device=x.device))


class PosAttention(nn.Module):
    """``Attention`` with coordinates given as a tensor ``pos`` ``(B, N, A)``."""

    def __init__(self, pos: str, axes: tuple[str, ...], **kwargs):
        super().__init__()
        self.axes = axes
        self.attn = Attention(16, 2, encoders=[mmpos.create(pos, dim=16, num_heads=2, **kwargs)])

    def forward(self, x, pos):
        return self.attn(x, Coords(pos, self.axes))


def _batch_and_grid(ndim: int) -> dict:
    return {0: Dim("b", min=1, max=8), **{i + 1: Dim(f"g{i}", min=2, max=16) for i in range(ndim)}}


DYNAMIC = [
    ("rope", (4, 5), {}),
    ("rope-axial", (4, 5), {}),
    ("rope-mixed", (4, 5), {}),
    ("sincos", (4, 5), {}),
    ("fourier", (4, 5), {"axes": ("h", "w")}),
    ("fuzzy", (4, 5), {}),
    ("peg", (4, 5), {}),
    ("peg3d", (2, 3, 3), {}),
]


@pytest.mark.parametrize(("name", "grid", "kwargs"), DYNAMIC, ids=[d[0] for d in DYNAMIC])
def test_transformer_exports_with_a_dynamic_grid(name, grid, kwargs):
    torch.manual_seed(0)
    model = GridNet(name, grid, **kwargs).eval()
    ep = export(model, (torch.randn(2, *grid, 16),), dynamic_shapes=(_batch_and_grid(len(grid)),))
    other = torch.randn(3, *(g + 2 for g in grid), 16)  # another batch and grid size
    torch.testing.assert_close(ep.module()(other), model(other))


@pytest.mark.parametrize(("name", "kwargs"), [("irpe", {"rpe_on": "qkv"}), ("learned", {})])
def test_static_grid_encoders_export_static_and_explain_dynamic(name, kwargs):
    torch.manual_seed(0)
    model = GridNet(name, (4, 5), **kwargs).eval()
    for p in model.parameters():  # iRPE tables start at zero
        nn.init.normal_(p, std=0.2)
    assert len(static_grid_encoders(model)) == 1
    x = torch.randn(2, 4, 5, 16)
    ep = export(model, (x,), dynamic_shapes=({0: Dim("b", min=1, max=8)},))  # dynamic batch is fine
    x3 = torch.randn(3, 4, 5, 16)
    torch.testing.assert_close(ep.module()(x3), model(x3))
    with pytest.raises(ValueError, match="need static token shapes"):
        export(model, (x,), dynamic_shapes=(_batch_and_grid(2),))


MULTIMODAL = [
    ("mrope", ("t", "h", "w"), {}),
    ("mrope-i", ("t", "h", "w"), {}),
    ("mhrope", ("t", "h", "w"), {"head_sections": [1, 0, 1]}),
    ("hope", ("h", "w"), {}),
    ("vrope", ("c0", "c1", "c2", "c3"), {}),
    ("v2pe", ("seq",), {}),
]


@pytest.mark.parametrize(("name", "axes", "kwargs"), MULTIMODAL, ids=[m[0] for m in MULTIMODAL])
def test_attention_with_multimodal_rotary_exports_with_dynamic_tokens(name, axes, kwargs):
    torch.manual_seed(0)
    model = PosAttention(name, axes, **kwargs).eval()
    n = Dim("n", min=2, max=256)
    pos = torch.rand(1, 9, len(axes)) * 20
    ep = export(model, (torch.randn(2, 9, 16), pos), dynamic_shapes=({1: n}, {1: n}))
    x2, pos2 = torch.randn(2, 21, 16), torch.rand(1, 21, len(axes)) * 50
    torch.testing.assert_close(ep.module()(x2, pos2), model(x2, pos2))


def test_attention_with_bias_encoder_exports():
    torch.manual_seed(0)
    model = Attention(16, 2, encoders=[mmpos.create("irpe", dim=16, num_heads=2, mode="bias", rpe_on="qk")]).eval()
    nn.init.normal_(model.encoders[0].k_table)
    nn.init.normal_(model.encoders[0].q_table)
    coords = Coords.grid(3, 4, num_prefix_tokens=1)

    class Wrap(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = model

        def forward(self, x):
            return self.attn(x, coords)

    x = torch.randn(2, 13, 16)
    ep = export(Wrap(), (x,))
    torch.testing.assert_close(ep.module()(x), model(x, coords))
