"""``sincos``: fixed sine-cosine position embedding on 1-D, 2-D and 3-D coordinates.

Paper: Vaswani et al., "Attention Is All You Need", 2017,
https://arxiv.org/abs/1706.03762 (1-D); the 2-D form of MoCo v3 / MAE (He et al.,
"Masked Autoencoders Are Scalable Vision Learners", 2022, https://arxiv.org/abs/2111.06377).
Reference: timm ``layers/pos_embed_sincos.py`` (``build_sincos2d_pos_embed``); the
2-D layout here equals it (tests compare): channels ``[sin(a0 w), sin(a1 w), ...,
cos(a0 w), cos(a1 w), ...]`` with ``w_k = temperature ** (-k / (D / 2A))``.
Continuous coordinates, so any grid size (and free 3-D points) work.

Shapes: ``embed(coords)`` ``(B, N, D)``; ``D`` divisible by ``2 * A``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._validate import check_float, check_int
from ..coords import Coords
from .base import AdditiveEncoder
from .registry import register_encoder

__all__ = ["SinCosPositionEmbedding", "sincos_embed"]


def sincos_embed(pos: Tensor, dim: int, temperature: float = 10000.0) -> Tensor:
    """``pos`` ``(B, N, A)`` -> ``(B, N, dim)`` sine-cosine features (float32)."""
    a = pos.shape[-1]
    if dim % (2 * a):
        raise ValueError(f"dim={dim} must be divisible by 2 * num_axes = {2 * a}")
    per_axis = dim // (2 * a)
    bands = 1.0 / temperature ** (torch.arange(per_axis, dtype=torch.float32, device=pos.device) / per_axis)
    angle = pos.float().unsqueeze(-1) * bands  # (B, N, A, per_axis)
    return torch.stack([angle.sin(), angle.cos()], dim=-3).flatten(-3)  # (B, N, 2, A, k) -> (B, N, D)


@register_encoder(
    "sincos",
    paper="Vaswani et al. 2017; 2-D form of MAE (arXiv:2111.06377)",
    reference="huggingface/pytorch-image-models timm/layers/pos_embed_sincos.py (build_sincos2d_pos_embed)",
)
class SinCosPositionEmbedding(AdditiveEncoder):
    """Fixed sine-cosine embedding of every coordinate axis; prefix tokens get none.

    Args:
        dim: embedding width ``D`` (divisible by twice the number of axes).
        temperature: base of the band frequencies.
    """

    def __init__(self, dim: int, temperature: float = 10000.0) -> None:
        super().__init__()
        self.dim = check_int(dim, "dim")
        self.temperature = check_float(temperature, "temperature")

    def embed(self, coords: Coords) -> Tensor:
        emb = sincos_embed(coords.pos, self.dim, self.temperature)
        if coords.num_prefix_tokens:
            emb = emb * coords.positioned().to(emb.dtype)
        return emb
