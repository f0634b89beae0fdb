"""``learned``: a learned absolute position embedding on a grid, resampled to other grids.

Paper: Dosovitskiy et al., "An Image is Worth 16x16 Words", ICLR 2021,
https://arxiv.org/abs/2010.11929. Reference: timm ``models/vision_transformer.py``
(``pos_embed``) and ``layers/pos_embed.py`` (``resample_abs_pos_embed``), which is used
here for 2-D grids; 1-D and 3-D grids are resampled with ``F.interpolate``.

Shapes: table ``(1, prefix + prod(grid_size), D)``; ``embed(coords)`` ``(1, N, D)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._validate import check_choice, check_float, check_int, check_ints
from ..coords import Coords
from .base import AdditiveEncoder
from .registry import register_encoder

__all__ = ["LearnedPositionEmbedding"]


# F.interpolate modes of a 2-D grid (timm's resample_abs_pos_embed); 1-D / 3-D grids resample (tri)linearly
_INTERPOLATIONS = ("bicubic", "bilinear", "nearest", "nearest-exact", "area")


@register_encoder(
    "learned",
    paper="Dosovitskiy et al. 2021, ViT (arXiv:2010.11929)",
    reference="huggingface/pytorch-image-models timm/models/vision_transformer.py (pos_embed), "
    "timm/layers/pos_embed.py (resample_abs_pos_embed)",
    static_grid="picks or resamples its table by the token grid size in Python",
    # the backbone's own table gives its prefix tokens rows (timm: num_prefix_tokens, 0 with no_embed_class)
    context={"dim": "dim", "grid_size": "grid_size", "prefix_rows": "num_prefix_tokens"},
    abs_table="pos_embed",
)
class LearnedPositionEmbedding(AdditiveEncoder):
    """One learned vector per grid cell (and per prefix token), resampled to other grids.

    Args:
        dim: embedding width ``D``.
        grid_size: the training grid, e.g. ``(14, 14)`` or ``(8, 14, 14)``.
        num_prefix_tokens: learned vectors for the leading class/register tokens (timm
            gives the class token a position vector; 0 leaves prefix tokens unchanged).
        interpolation: resampling mode for other grid sizes (``"bicubic"`` as in timm).
        std: init standard deviation (timm: 0.02).
    """

    def __init__(
        self,
        dim: int,
        grid_size: Sequence[int],
        num_prefix_tokens: int = 0,
        interpolation: str = "bicubic",
        std: float = 0.02,
    ) -> None:
        super().__init__()
        dim = check_int(dim, "dim")
        self.grid_size = check_ints(grid_size, "grid_size", length=(1, 3))
        self.num_prefix_tokens = check_int(num_prefix_tokens, "num_prefix_tokens", low=0)
        self.interpolation = check_choice(interpolation, "interpolation", _INTERPOLATIONS)
        std = check_float(std, "std", strict=False)
        n = num_prefix_tokens + math.prod(self.grid_size)
        self.pos_embed = nn.Parameter(torch.randn(1, n, dim) * std)

    def table_for(self, grid_shape: tuple[int, ...]) -> Tensor:
        """The table ``(1, prefix + prod(grid_shape), D)`` resampled to ``grid_shape``."""
        if len(grid_shape) != len(self.grid_size):
            raise ValueError(
                f"coords grid_shape {grid_shape} must have {len(self.grid_size)} axes like grid_size {self.grid_size}"
            )
        if tuple(grid_shape) == self.grid_size:
            return self.pos_embed
        if len(grid_shape) == 2:
            from timm.layers import resample_abs_pos_embed  # here, so `mmpos list` does not load timm

            return resample_abs_pos_embed(
                self.pos_embed,
                list(grid_shape),
                list(self.grid_size),
                self.num_prefix_tokens,
                self.interpolation,
                antialias=self.interpolation in ("bilinear", "bicubic"),  # F.interpolate refuses it for other modes
            )
        prefix, cells = self.pos_embed[:, : self.num_prefix_tokens], self.pos_embed[:, self.num_prefix_tokens :]
        grid = cells.reshape(1, *self.grid_size, -1).movedim(-1, 1)  # (1, D, *grid)
        mode = {1: "linear", 3: "trilinear"}[len(grid_shape)]
        grid = F.interpolate(grid.float(), size=tuple(grid_shape), mode=mode, align_corners=False).to(cells.dtype)
        return torch.cat([prefix, grid.movedim(1, -1).flatten(1, -2)], dim=1)

    def embed(self, coords: Coords) -> Tensor:
        if coords.grid_shape is None:
            raise ValueError("the learned encoder needs grid coordinates (Coords.grid); got grid_shape=None")
        table = self.table_for(coords.grid_shape)
        prefix = coords.num_prefix_tokens
        if prefix == self.num_prefix_tokens:
            return table
        if self.num_prefix_tokens == 0:
            return F.pad(table, (0, 0, prefix, 0))  # prefix tokens get no position vector
        raise ValueError(
            f"coords have num_prefix_tokens={prefix} but this table has num_prefix_tokens={self.num_prefix_tokens}"
        )
