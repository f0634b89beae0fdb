"""ViTAR's Adaptive Token Merger (ATM): grid attention repeated until a target grid.

Paper: Fan et al., "ViTAR: Vision Transformer with Any Resolution", 2024,
https://arxiv.org/abs/2403.18361 (section 3.1). There is no official code; the choices
made here are written down in ``docs/encoders/fuzzy.md``.

One merge step splits an ``h x w`` token grid into cells of at most ``2 x 2`` tokens. Per
axis of size ``n`` and target ``g`` (paper's rules):

* ``n >= 2 g``: ``ceil(n / 2)`` cells of two tokens (one cell of one token when ``n`` is odd);
* ``g < n < 2 g``: ``g`` cells of one or two tokens (the paper pads to ``2 g``; here the
  padding slots are spread so that every cell holds at least one real token);
* ``n == g``: cells of one token, the axis is not merged;
* ``n < g``: a ``ValueError`` (ATM only merges).

For each cell the mean of its real tokens ``x_avg`` is the query and the cell's tokens
are keys and values (padding slots are masked out)::

    y = x_avg + Attn(q = norm(x_avg), kv = norm(cell))
    y = y + FFN(norm2(y))

The same weights are used at every step; steps repeat until the grid equals the target
(e.g. ``64 x 64 -> 32 x 32 -> 16 x 16 -> 14 x 14``).

Shapes: ``x`` ``(B, prefix + h * w, D)`` -> ``(B, prefix + gh * gw, D)`` plus the new grid
:class:`~mmpos.Coords`; prefix tokens pass through unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._extras import requires
from ..coords import Coords

with requires("timm"):  # one line naming the package and the extra when it is missing
    from timm.layers import Mlp

__all__ = ["AdaptiveTokenMerger", "merge_schedule"]


def _next_size(n: int, g: int) -> int:
    if n >= 2 * g:
        return -(-n // 2)
    return g


def merge_schedule(grid_shape: Sequence[int], target_size: Sequence[int]) -> list[tuple[int, int]]:
    """The grids after each merge step, ending with ``target_size`` (empty if already there)."""
    grid, target = tuple(grid_shape), tuple(target_size)
    if len(target) != 2 or any(not isinstance(g, int) or g <= 0 for g in target):
        raise ValueError(f"target_size must be two positive ints (gh, gw), got {target!r}")
    if len(grid) != 2 or any(n < g for n, g in zip(grid, target)):
        raise ValueError(f"the token grid {grid} must be 2-D and at least target_size={target} on both axes")
    steps = []
    while grid != target:
        grid = tuple(_next_size(n, g) for n, g in zip(grid, target))
        steps.append(grid)
    return steps


def _cell_slots(n: int, m: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Split ``n`` positions into ``m`` cells of 1 or 2 (``m <= n <= 2 m``).

    Returns ``index (m, k)`` into the positions, ``n`` marking a padding slot, and
    ``valid (m, k)`` bool; ``k = 2`` when merging (``n > m``), else ``1``.
    """
    bounds = torch.arange(m + 1, device=device) * n // m  # cell i holds [bounds[i], bounds[i + 1])
    start, size = bounds[:-1], bounds[1:] - bounds[:-1]
    if n == m:
        return start.unsqueeze(1), torch.ones(m, 1, dtype=torch.bool, device=device)
    second = torch.where(size == 2, start + 1, torch.full_like(start, n))
    return torch.stack([start, second], 1), torch.stack([size >= 1, size == 2], 1)


class AdaptiveTokenMerger(nn.Module):
    """Merges a token grid of any size into ``target_size`` by repeated grid attention.

    Args:
        dim: token width ``D``.
        target_size: the output grid ``(gh, gw)`` (ViTAR: ``(14, 14)``).
        num_heads: heads of the cell attention (``dim`` divisible by it).
        mlp_ratio: hidden width of the FFN relative to ``dim``.
        qkv_bias: bias of the q/k/v projections.
    """

    def __init__(
        self, dim: int, target_size: Sequence[int], num_heads: int = 8, mlp_ratio: float = 4.0, qkv_bias: bool = True
    ) -> None:
        super().__init__()
        merge_schedule(target_size, target_size)  # validates target_size
        if not isinstance(num_heads, int) or num_heads <= 0 or dim % num_heads:
            raise ValueError(f"dim={dim} must be divisible by num_heads={num_heads!r} (a positive int)")
        self.dim, self.num_heads = dim, num_heads
        self.target_size = tuple(target_size)
        self.norm1 = nn.LayerNorm(dim)
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = nn.Linear(dim, 2 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=nn.GELU)

    def merge_step(self, x: Tensor, size: tuple[int, int]) -> Tensor:
        """One grid attention step: ``x`` ``(B, h, w, D)`` -> ``(B, size[0], size[1], D)``."""
        b, h, w, d = x.shape
        rows, row_ok = _cell_slots(h, size[0], x.device)  # (mh, kh)
        cols, col_ok = _cell_slots(w, size[1], x.device)  # (mw, kw)
        padded = F.pad(x, (0, 0, 0, 1, 0, 1))  # (B, h + 1, w + 1, D); row h / column w are padding
        cells = padded[:, rows[:, None, :, None], cols[None, :, None, :]]  # (B, mh, mw, kh, kw, D)
        valid = row_ok[:, None, :, None] & col_ok[None, :, None, :]  # (mh, mw, kh, kw)
        m, k = size[0] * size[1], valid.shape[-1] * valid.shape[-2]
        cells, valid = cells.reshape(b, m, k, d), valid.reshape(m, k)
        weights = valid.to(x.dtype) / valid.sum(-1, keepdim=True)  # (M, K), mean over real tokens
        mean = torch.einsum("bmkd,mk->bmd", cells, weights)  # (B, M, D)

        heads, dh = self.num_heads, d // self.num_heads
        q = self.q(self.norm1(mean)).reshape(b * m, 1, heads, dh).transpose(1, 2)  # (B*M, H, 1, Dh)
        kv = self.kv(self.norm1(cells)).reshape(b * m, k, 2, heads, dh).permute(2, 0, 3, 1, 4)
        mask = valid.view(1, m, 1, 1, k).expand(b, m, 1, 1, k).reshape(b * m, 1, 1, k)
        out = F.scaled_dot_product_attention(q, kv[0], kv[1], attn_mask=mask)  # (B*M, H, 1, Dh)
        y = mean + self.proj(out.reshape(b, m, d))
        y = y + self.mlp(self.norm2(y))
        return y.reshape(b, size[0], size[1], d)

    def forward(self, x: Tensor, coords: Coords) -> tuple[Tensor, Coords]:
        grid = coords.grid_shape
        if grid is None or len(grid) != 2:
            raise ValueError(
                f"AdaptiveTokenMerger needs 2-D grid coordinates (Coords.grid(h, w)), got grid_shape={grid}"
            )
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"x must have shape (B, N, D={self.dim}), got {tuple(x.shape)}")
        coords.check_tokens(x.shape[0], x.shape[1])
        steps = merge_schedule(grid, self.target_size)
        prefix, tokens = x[:, : coords.num_prefix_tokens], x[:, coords.num_prefix_tokens :]
        tokens = tokens.reshape(x.shape[0], *grid, self.dim)  # (B, h, w, D)
        for size in steps:
            tokens = self.merge_step(tokens, size)
        merged = torch.cat([prefix, tokens.flatten(1, 2)], dim=1)  # (B, prefix + gh * gw, D)
        out_coords = Coords.grid(
            *self.target_size,
            num_prefix_tokens=coords.num_prefix_tokens,
            axes=coords.axes,
            batch=coords.batch_size,
            dtype=coords.pos.dtype,
            device=coords.pos.device,
        )
        return merged, out_coords

    def extra_repr(self) -> str:
        return f"dim={self.dim}, target_size={self.target_size}, num_heads={self.num_heads}"
