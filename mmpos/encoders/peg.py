"""``peg`` / ``peg3d``: conditional position encoding by a depthwise convolution (CPE/PEG).

Paper: Chu et al., "Conditional Positional Encodings for Vision Transformers",
ICLR 2023, https://arxiv.org/abs/2102.10882. References read: Twins ``gvt.py``
(``PosCNN``) and timm ``models/twins.py`` (``PosConv``, init in
``Twins._init_weights``); tests compare with timm's ``PosConv``.

The Position Encoding Generator (PEG) reshapes the grid tokens to a feature map, applies
a depthwise ``k x k`` convolution (stride 1, zero padding ``k // 2``, bias) and adds it
back: ``f + conv(f)``. Zero padding at the borders is what lets the network recover
absolute position; away from the borders the map is translation equivariant. Prefix
(class/register) tokens are passed through unchanged. CPVT places one PEG after block 0
(``mmpos.nn.Transformer(conv_after=(0,))``) or after several blocks (``conv_after=(0,
1, 2, 3, 4, 5)`` for CPVT-Ti with PEG after blocks 0-5).

``peg3d`` is the same on a ``(t, h, w)`` video grid with a depthwise ``Conv3d``.

Shapes: ``x`` ``(B, prefix + prod(grid_shape), D)`` -> same shape; the grid is read from
``coords.grid_shape`` (any size, non-square included) in row-major order.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .._validate import check_int
from ..coords import Coords
from .base import ConvEncoder
from .registry import register_encoder

__all__ = ["PositionEncodingGenerator", "peg2d", "peg3d"]

_CONVS = {2: nn.Conv2d, 3: nn.Conv3d}


class PositionEncodingGenerator(ConvEncoder):
    """Depthwise convolution over the token grid with a residual: ``f + conv(f)``.

    Args:
        dim: token width ``D`` (channels of the depthwise convolution).
        kernel_size: odd kernel size ``k`` (CPVT: 3), padding ``k // 2`` keeps the grid.
        grid_dims: 2 for ``(h, w)`` image grids, 3 for ``(t, h, w)`` video grids.

    Init as Twins/CPVT: weight ``N(0, sqrt(2 / fan_out))`` with ``fan_out = k**grid_dims``
    for a depthwise kernel, bias zero. CPVT trains it without weight decay
    (:meth:`no_weight_decay`).
    """

    def __init__(self, dim: int, kernel_size: int = 3, grid_dims: int = 2) -> None:
        super().__init__()
        dim = check_int(dim, "dim")
        if check_int(kernel_size, "kernel_size") % 2 == 0:
            raise ValueError(f"kernel_size must be a positive odd int, got {kernel_size!r}")
        if grid_dims not in _CONVS:
            raise ValueError(f"grid_dims must be 2 (h, w) or 3 (t, h, w), got {grid_dims!r}")
        self.dim = dim
        self.kernel_size = kernel_size
        self.grid_dims = grid_dims
        self.proj = _CONVS[grid_dims](dim, dim, kernel_size, 1, kernel_size // 2, groups=dim, bias=True)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        fan_out = self.kernel_size**self.grid_dims  # k^d * out_channels / groups, groups = out_channels
        nn.init.normal_(self.proj.weight, 0.0, math.sqrt(2.0 / fan_out))
        nn.init.zeros_(self.proj.bias)

    def no_weight_decay(self) -> set[str]:
        """Parameter names CPVT excludes from weight decay."""
        return {"proj.weight", "proj.bias"}

    def forward(self, x: Tensor, coords: Coords) -> Tensor:
        grid = coords.grid_shape
        if grid is None:
            raise ValueError("PEG needs grid coordinates (Coords.grid): got grid_shape=None")
        if len(grid) != self.grid_dims:
            raise ValueError(
                f"this PEG convolves {self.grid_dims}-D grids but coords.grid_shape={grid}; "
                f"use {'peg3d' if len(grid) == 3 else 'peg'} for a {len(grid)}-D grid"
            )
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"x must have shape (B, N, D={self.dim}), got {tuple(x.shape)}")
        coords.check_tokens(x.shape[0], x.shape[1])
        b, _, d = x.shape
        prefix, tokens = x[:, : coords.num_prefix_tokens], x[:, coords.num_prefix_tokens :]
        feat = tokens.transpose(1, 2).reshape(b, d, *grid)  # (B, D, *grid)
        feat = self.proj(feat) + feat
        return torch.cat([prefix, feat.flatten(2).transpose(1, 2)], dim=1)  # (B, N, D)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, kernel_size={self.kernel_size}, grid_dims={self.grid_dims}"


@register_encoder(
    "peg",
    paper="Chu et al. 2023, CPVT (arXiv:2102.10882)",
    reference="huggingface/pytorch-image-models timm/models/twins.py (PosConv); Meituan-AutoML/Twins gvt.py (PosCNN)",
)
def peg2d(dim: int, kernel_size: int = 3) -> PositionEncodingGenerator:
    """PEG on ``(h, w)`` image grids (depthwise ``Conv2d``)."""
    return PositionEncodingGenerator(dim, kernel_size, grid_dims=2)


@register_encoder(
    "peg3d",
    paper="Chu et al. 2023, CPVT (arXiv:2102.10882), 3-D for video",
    reference="huggingface/pytorch-image-models timm/models/twins.py (PosConv), one dimension up",
)
def peg3d(dim: int, kernel_size: int = 3) -> PositionEncodingGenerator:
    """PEG on ``(t, h, w)`` video grids (depthwise ``Conv3d``)."""
    return PositionEncodingGenerator(dim, kernel_size, grid_dims=3)
