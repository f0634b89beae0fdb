"""``fuzzy``: ViTAR's fuzzy positional encoding, a learned grid read at jittered positions.

Paper: Fan et al., "ViTAR: Vision Transformer with Any Resolution", 2024,
https://arxiv.org/abs/2403.18361 (section 3.2). There is no official code; the choices
made here are written down in ``docs/encoders/fuzzy.md``. The sampling convention
follows timm ``models/naflexvit.py`` (``_apply_learned_naflex_pos_embed_grid_sample``):
bilinear ``F.grid_sample`` with ``align_corners=False`` and ``padding_mode="border"``,
grid in ``(x, y) = (w, h)`` order.

A learnable table ``(1, D, gh, gw)`` holds one vector per cell of the training grid
``grid_size``. Token ``(i, j)`` of an ``h x w`` token grid reads it at its reference
coordinate, the cell centre ``((2 i + 1) / h - 1, (2 j + 1) / w - 1)`` in ``[-1, 1]``
(:meth:`mmpos.Coords.normalized`). During training each token's coordinate is moved by
an offset ``(s1, s2) ~ U(-0.5, 0.5)^2`` in units of one token cell, drawn per token and
per sample; at evaluation the exact coordinate is used. On the training grid the
evaluation PE is the table itself; on any other grid it is the table resampled
bilinearly (equal to ``F.interpolate(..., mode="bilinear", align_corners=False)``).

With ``coordinates="normalized"`` the encoder reads positions that are already in
``[-1, 1]`` (e.g. continuous 2-D points); offsets are then half a cell of the learned
table. Positions outside ``[-1, 1]`` read the border cells (``padding_mode="border"``).

Shapes: table ``(1, D, gh, gw)``; ``embed(coords, batch)`` ``(B or 1, N, D)`` with
zeros on prefix (class/register) tokens and on padding tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._validate import check_float, check_int, check_ints
from ..coords import Coords
from .base import AdditiveEncoder
from .registry import register_encoder

__all__ = ["FuzzyPositionEmbedding"]

_ROW_AXES, _COL_AXES = ("h", "y"), ("w", "x")


def _row_col(coords: Coords) -> list[int]:
    """Indices of the row (``h`` / ``y``) and column (``w`` / ``x``) axes in ``coords.pos``."""
    rows = [a for a in coords.axes if a in _ROW_AXES]
    cols = [a for a in coords.axes if a in _COL_AXES]
    if coords.num_axes != 2 or len(rows) != 1 or len(cols) != 1:
        raise ValueError(
            f"the fuzzy encoder needs 2-D coordinates with axes ('h', 'w') or ('y', 'x'), got {coords.axes}"
        )
    return [coords.axis(rows[0]), coords.axis(cols[0])]


@register_encoder(
    "fuzzy",
    paper="Fan et al. 2024, ViTAR fuzzy PE (arXiv:2403.18361)",
    reference="huggingface/pytorch-image-models timm/models/naflexvit.py (sampling convention; no official code)",
)
class FuzzyPositionEmbedding(AdditiveEncoder):
    """Learned 2-D position table sampled bilinearly at (randomly jittered) token positions.

    Args:
        dim: embedding width ``D``.
        grid_size: the learned grid ``(gh, gw)``, e.g. the training token grid ``(14, 14)``.
        coordinates: ``"grid"`` -- ``coords`` is a 2-D token grid (:meth:`Coords.grid`) of
            any size, positions are cell indices; ``"normalized"`` -- positions are already
            in ``[-1, 1]`` (cell centres at ``(2 i + 1) / n - 1``), any layout.
        jitter: half-width of the training offsets in cell units (ViTAR: 0.5).
        std: init standard deviation of the table (truncated normal, as timm's ``pos_embed``).
    """

    def __init__(
        self,
        dim: int,
        grid_size: Sequence[int],
        coordinates: str = "grid",
        jitter: float = 0.5,
        std: float = 0.02,
    ) -> None:
        super().__init__()
        dim, size = check_int(dim, "dim"), check_ints(grid_size, "grid_size", length=2)
        jitter, std = check_float(jitter, "jitter", strict=False, high=0.5), check_float(std, "std")
        if coordinates not in ("grid", "normalized"):
            raise ValueError(f"coordinates must be 'grid' or 'normalized', got {coordinates!r}")
        self.dim = dim
        self.grid_size = size
        self.coordinates = coordinates
        self.jitter = jitter
        self.pos_embed = nn.Parameter(torch.empty(1, dim, *size))  # (1, D, gh, gw)
        nn.init.trunc_normal_(self.pos_embed, std=std, a=-2 * std, b=2 * std)

    def reference_positions(self, coords: Coords) -> tuple[Tensor, Tensor]:
        """Exact positions of the non-prefix tokens and the size of one cell, both normalized.

        Returns ``(pos (B or 1, M, 2), cell (2,))`` in ``(row, col)`` order, ``M = N - prefix``;
        ``cell`` is the width of one cell in ``[-1, 1]`` units (``2 / n`` per axis).
        """
        axes = _row_col(coords)
        if self.coordinates == "normalized":
            cell = 2.0 / torch.tensor(self.grid_size, dtype=coords.pos.dtype, device=coords.pos.device)
            return coords.pos[:, coords.num_prefix_tokens :, axes], cell
        if coords.grid_shape is None:
            raise ValueError(
                "the fuzzy encoder with coordinates='grid' needs grid coordinates (Coords.grid), got grid_shape=None; "
                "build it with coordinates='normalized' for positions already in [-1, 1]"
            )
        size = torch.tensor(coords.grid_shape, dtype=coords.pos.dtype, device=coords.pos.device)[axes]
        return coords.normalized().pos[:, coords.num_prefix_tokens :, axes], 2.0 / size

    def sample_positions(self, coords: Coords, batch: int | None = None) -> Tensor:
        """Normalized ``(row, col)`` positions ``(B, M, 2)`` at which the table is read.

        In training mode each token (of each of ``batch`` samples) is moved by
        ``U(-jitter, jitter)`` cells per axis; in eval mode the reference positions.
        """
        pos, cell = self.reference_positions(coords)
        if not self.training or self.jitter == 0:
            return pos
        b = batch if batch is not None else pos.shape[0]
        offsets = torch.rand(b, pos.shape[1], 2, dtype=pos.dtype, device=pos.device).sub_(0.5).mul_(2 * self.jitter)
        return pos + offsets * cell  # (B, M, 2)

    def embed(self, coords: Coords, batch: int | None = None) -> Tensor:
        if batch is not None:
            coords.check_tokens(batch, coords.num_tokens)
        pos = self.sample_positions(coords, batch)  # (B, M, 2) (row, col) in [-1, 1]
        grid = pos.flip(-1).unsqueeze(2).float()  # (B, M, 1, 2) in grid_sample's (x, y) order
        table = self.pos_embed.float().expand(grid.shape[0], -1, -1, -1)
        emb = F.grid_sample(table, grid, mode="bilinear", padding_mode="border", align_corners=False)
        emb = F.pad(emb.squeeze(-1).transpose(1, 2), (0, 0, coords.num_prefix_tokens, 0))  # (B, N, D), prefix rows 0
        if coords.mask is not None:
            emb = emb * coords.mask.unsqueeze(-1).to(emb.dtype)
        return emb

    def forward(self, x: Tensor, coords: Coords) -> Tensor:
        coords.check_tokens(x.shape[0], x.shape[1])
        return x + self.embed(coords, batch=x.shape[0]).to(x.dtype)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, grid_size={self.grid_size}, coordinates={self.coordinates!r}, jitter={self.jitter}"
