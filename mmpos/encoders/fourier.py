"""``fourier``: learnable Fourier features for multi-dimensional positions (points, voxels, grids).

Paper: Li et al., "Learnable Fourier Features for Multi-Dimensional Spatial Positional
Encoding", NeurIPS 2021, https://arxiv.org/abs/2106.02795 (Algorithm 1). No official code; the
unofficial willGuimont/learnable_fourier_positional_encoding
(``learnable_fourier_pos_encoding.py``) was read and differs in one place: it initialises
``W_r`` with standard deviation ``gamma ** -2``; the paper's ``N(0, gamma ** -2)`` is a
variance, so here the standard deviation is ``1 / gamma`` (the tests check the Gaussian kernel
``exp(-|dx|^2 / (2 gamma^2))`` that this gives).

The ``A = G * M`` coordinate axes of a token form ``G`` independent groups of ``M`` axes::

    r[g] = 1 / sqrt(F) * [cos(x[g] W_r^T), sin(x[g] W_r^T)]     W_r (F / 2, M), learned
    y[g] = GeLU(r[g] W_1 + b_1) W_2 + b_2                        (F -> H -> D / G), shared by groups
    PE   = concat_g y[g]                                         (D,)

Shapes: ``embed(coords)`` ``(B, N, D)`` from ``pos`` ``(B, N, A)``; prefix tokens get zeros.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .._validate import check_axes, check_float, check_int
from ..coords import Coords
from .base import AdditiveEncoder
from .registry import register_encoder

__all__ = ["LearnableFourierFeatures"]


@register_encoder(
    "fourier",
    paper="Li et al. 2021, learnable Fourier features (arXiv:2106.02795)",
    reference="willGuimont/learnable_fourier_positional_encoding learnable_fourier_pos_encoding.py (unofficial)",
)
class LearnableFourierFeatures(AdditiveEncoder):
    """Learnable Fourier features of ``G`` groups of ``M`` coordinates, then a GeLU MLP.

    Args:
        dim: output width ``D`` (divisible by ``groups``).
        axes: the coordinate axes read, group after group (``("x", "y", "z")`` for points;
            ``("h", "w")`` for image grids, ``("t", "h", "w")`` for video).
        groups: ``G``; ``len(axes)`` must be a multiple of it.
        fourier_dim: ``F`` (even), the number of Fourier features (default ``dim``).
        hidden_dim: ``H``, the MLP's hidden width (a hyperparameter in the paper).
        gamma: ``W_r`` starts as ``N(0, gamma ** -2)``: the features' dot product approximates
            a Gaussian kernel of width ``gamma`` in coordinate units.
    """

    def __init__(
        self,
        dim: int,
        axes: Sequence[str] = ("x", "y", "z"),
        groups: int = 1,
        fourier_dim: int | None = None,
        hidden_dim: int = 32,
        gamma: float = 1.0,
    ) -> None:
        super().__init__()
        self.axes = check_axes(axes)
        gamma = check_float(gamma, "gamma")
        dim, groups, hidden_dim = (
            check_int(dim, "dim"),
            check_int(groups, "groups"),
            check_int(hidden_dim, "hidden_dim"),
        )
        fourier_dim = dim if fourier_dim is None else check_int(fourier_dim, "fourier_dim", even=True)
        if not self.axes or len(self.axes) % groups:
            raise ValueError(
                f"groups must be a positive int dividing the {len(self.axes)} axes {self.axes}, got {groups!r}"
            )
        if dim % groups:
            raise ValueError(f"dim must be a positive int divisible by groups={groups}, got {dim!r}")
        if fourier_dim % 2:
            raise ValueError(f"fourier_dim must be a positive even int, got {fourier_dim!r}")
        if not gamma > 0:
            raise ValueError(f"gamma must be positive, got {gamma!r}")
        self.dim, self.groups, self.gamma = dim, groups, float(gamma)
        group_axes = len(self.axes) // groups
        self.freqs = nn.Parameter(torch.randn(fourier_dim // 2, group_axes) / self.gamma)  # W_r (F/2, M)
        self.mlp = nn.Sequential(nn.Linear(fourier_dim, hidden_dim), nn.GELU(), nn.Linear(hidden_dim, dim // groups))

    def features(self, pos: Tensor) -> Tensor:
        """``pos`` ``(B, N, A)`` -> Fourier features ``(B, N, G, F)`` (float32 or float64)."""
        if pos.shape[-1] != len(self.axes):
            raise ValueError(f"pos must hold {len(self.axes)} axes {self.axes}, got {pos.shape[-1]}")
        x = pos.unflatten(-1, (self.groups, -1))  # (B, N, G, M)
        w = self.freqs.to(torch.float64 if pos.dtype == torch.float64 else torch.float32)
        phase = x.to(w.dtype) @ w.T  # (B, N, G, F/2)
        return torch.cat([phase.cos(), phase.sin()], dim=-1) / math.sqrt(2 * w.shape[0])

    def embed(self, coords: Coords) -> Tensor:
        if not set(self.axes) <= set(coords.axes):
            raise ValueError(f"coords have axes {coords.axes} but this encoder reads axes={self.axes}")
        pos = coords.pos if coords.axes == self.axes else coords.select(*self.axes).pos
        feats = self.features(pos)  # (B, N, G, F)
        out = self.mlp(feats.to(self.mlp[0].weight.dtype)).flatten(-2)  # (B, N, G, D/G) -> (B, N, D)
        if coords.num_prefix_tokens:
            out = out * coords.positioned().to(out.dtype)
        return out

    def extra_repr(self) -> str:
        return f"axes={self.axes}, groups={self.groups}, fourier_dim={2 * self.freqs.shape[0]}, gamma={self.gamma}"
