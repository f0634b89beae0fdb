"""Oracle-token data for the vision validation tasks (``recipes.tasks.validate_vision``).

Each token is the *identity* of what sits in a cell (an integer id, embedded by the model), so the
only thing a model has to learn is where things are (docs/recipes.md, "Validation that decides").
Every target is dense (one per cell or point) and single-hop; cells without a target hold
:data:`IGNORE` and are left out of the loss and the metric. All randomness comes from the
``torch.Generator`` passed in (a pure function of its seed).

Shapes: grids ``(B, H, W)`` int64; point sets ``xy`` ``(B, N, 2)`` float32, ``tokens`` / ``target``
``(B, N)`` int64.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "IGNORE",
    "bands",
    "border",
    "diagonal_pairs",
    "directed_neighbour",
    "left_neighbour",
    "nearest_neighbour_points",
]

#: target of a cell that is not scored (``F.cross_entropy(ignore_index=IGNORE)``)
IGNORE = -100

#: (row, col) steps of the four directions of :func:`directed_neighbour`: up, down, left, right
DIRECTIONS = ((-1, 0), (1, 0), (0, -1), (0, 1))


def _check(batch: int, h: int, w: int) -> None:
    for name, v in (("batch", batch), ("h", h), ("w", w)):
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ValueError(f"{name} must be a positive int, got {v!r}")


def _shifted(x: Tensor, dr: int, dc: int, fill: int) -> Tensor:
    """``out[b, i, j] = x[b, i + dr, j + dc]``, ``fill`` where that cell is outside the grid."""
    h, w = x.shape[-2:]
    out = torch.full_like(x, fill)
    rows = slice(max(0, -dr), min(h, h - dr))
    cols = slice(max(0, -dc), min(w, w - dc))
    src_rows = slice(rows.start + dr, rows.stop + dr)
    src_cols = slice(cols.start + dc, cols.stop + dc)
    out[..., rows, cols] = x[..., src_rows, src_cols]
    return out


def diagonal_pairs(batch: int, size: int, generator: torch.Generator, density: float = 0.5) -> tuple[Tensor, Tensor]:
    """Binary marks; each cell counts the marks at its two diagonal neighbours ``(+1, +1)`` and ``(-1, -1)``.

    Returns ``(marks (B, S, S) in {0, 1}, target (B, S, S) in {0, 1, 2})``; only cells with both
    neighbours inside the grid (rows and columns ``1 .. S - 2``) are scored. The anti-diagonal
    neighbours ``(+1, -1)``, ``(-1, +1)`` are as likely marked and must not be counted: a single
    attention head whose logits are a row term plus a column term (axial RoPE) weighs them as
    much as the diagonal ones (see :mod:`recipes.tasks.validate_vision`).
    """
    _check(batch, size, size)
    if size < 3:
        raise ValueError(f"size must be at least 3 (a cell with both diagonal neighbours), got {size}")
    marks = (torch.rand(batch, size, size, generator=generator) < density).long()
    target = _shifted(marks, 1, 1, 0) + _shifted(marks, -1, -1, 0)
    target[:, [0, -1], :] = IGNORE
    target[:, :, [0, -1]] = IGNORE
    return marks, target


def left_neighbour(
    batch: int,
    h: int,
    w: int,
    cols: tuple[int, int],
    num_objects: int,
    generator: torch.Generator,
    density: float = 0.5,
) -> tuple[Tensor, Tensor]:
    """Objects ``1 .. num_objects`` (0 = empty) only in columns ``cols[0] <= j < cols[1]``; copy the left neighbour.

    Returns ``(tokens (B, H, W), target (B, H, W))``: the target of cell ``(i, j)`` is the object
    at ``(i, j - 1)``, scored where that cell holds an object. Chu et al.'s translation split:
    train with ``cols`` the left half, test with the right half.
    """
    _check(batch, h, w)
    if not 0 <= cols[0] < cols[1] <= w:
        raise ValueError(f"cols must be 0 <= start < stop <= w={w}, got {cols!r}")
    ids = torch.randint(1, num_objects + 1, (batch, h, w), generator=generator)
    present = torch.rand(batch, h, w, generator=generator) < density
    inside = torch.zeros(w, dtype=torch.bool)
    inside[cols[0] : cols[1]] = True
    tokens = torch.where(present & inside, ids, torch.zeros_like(ids))
    left = _shifted(tokens, 0, -1, 0)
    target = torch.where(left > 0, left, torch.full_like(left, IGNORE))
    return tokens, target


def border(batch: int, h: int, w: int, num_tokens: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Random tokens everywhere; each cell says whether it lies on the grid's border (1) or not (0).

    An absolute-position task: with tokens drawn independently of position, only a cue about
    the grid's edge (PEG's zero padding, an absolute table) can solve it.
    """
    _check(batch, h, w)
    tokens = torch.randint(0, num_tokens, (batch, h, w), generator=generator)
    edge = torch.zeros(h, w, dtype=torch.long)
    edge[[0, -1], :] = 1
    edge[:, [0, -1]] = 1
    return tokens, edge.expand(batch, h, w).clone()


def bands(
    batch: int,
    h: int,
    w: int,
    num_tokens: int,
    num_bands: int,
    generator: torch.Generator,
    tolerance: float = 0.05,
    shift: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """Random tokens; each cell names its ``num_bands x num_bands`` region of the image (absolute, resolution-free).

    Cell ``(i, j)`` has its centre at ``((i + 0.5 + shift) / h, (j + 0.5 + shift) / w)`` of the image
    (``shift``: the whole grid moved by that fraction of a cell along both axes, ``-0.5 < shift <
    0.5``, the sub-patch shift); the target is ``num_bands * floor(num_bands * row) +
    floor(num_bands * col)``. Cells whose centre lies within ``tolerance`` of a band edge (in band
    units) are not scored: their region is ambiguous.
    """
    _check(batch, h, w)
    if not -0.5 < shift < 0.5:
        raise ValueError(f"shift must be a fraction of a cell, -0.5 < shift < 0.5, got {shift!r}")
    tokens = torch.randint(0, num_tokens, (batch, h, w), generator=generator)

    def axis(n: int) -> tuple[Tensor, Tensor]:
        u = (torch.arange(n, dtype=torch.float64) + 0.5 + shift) / n * num_bands
        frac = u - u.floor()
        return u.floor().long(), (frac < tolerance) | (frac > 1 - tolerance)

    (r, r_edge), (c, c_edge) = axis(h), axis(w)
    target = r[:, None] * num_bands + c[None, :]
    target = target.masked_fill(r_edge[:, None] | c_edge[None, :], IGNORE)
    return tokens, target.expand(batch, h, w).clone()


def directed_neighbour(
    batch: int, h: int, w: int, num_values: int, generator: torch.Generator
) -> tuple[Tensor, Tensor, Tensor]:
    """Each cell holds a value and a direction; its target is the value of the neighbour in that direction.

    Returns ``(values (B, H, W) in 0..num_values-1, directions (B, H, W) in 0..3 (up, down, left,
    right), target (B, H, W))``; cells pointing outside the grid are not scored. The token's
    content decides which neighbour to copy (Wu et al. 2021's case for contextual iRPE).
    """
    _check(batch, h, w)
    values = torch.randint(0, num_values, (batch, h, w), generator=generator)
    directions = torch.randint(0, 4, (batch, h, w), generator=generator)
    target = torch.full_like(values, IGNORE)
    for d, (dr, dc) in enumerate(DIRECTIONS):  # 4 directions, on whole tensors
        target = torch.where(directions == d, _shifted(values, dr, dc, IGNORE), target)
    return values, directions, target


def nearest_neighbour_points(
    batch: int, n: int, num_tokens: int, generator: torch.Generator, scale: float = 1.0, ratio: float = 1.25
) -> tuple[Tensor, Tensor, Tensor]:
    """``n`` points uniform in ``[0, scale]^2`` with random tokens; each names the token of its nearest other point.

    Returns ``(xy (B, N, 2), tokens (B, N), target (B, N))``. A point is scored only when its
    second-nearest point is at least ``ratio`` times farther than the nearest (a clear nearest
    neighbour). Rescaling (``scale``) changes every distance by the same factor and no target.
    """
    _check(batch, n, 1)
    if n < 3:
        raise ValueError(f"n must be at least 3 points, got {n}")
    xy = torch.rand(batch, n, 2, generator=generator) * scale
    tokens = torch.randint(0, num_tokens, (batch, n), generator=generator)
    dist = torch.cdist(xy.double(), xy.double())  # (B, N, N)
    dist.diagonal(dim1=1, dim2=2).fill_(float("inf"))
    two = dist.topk(2, dim=-1, largest=False)
    target = tokens.gather(1, two.indices[..., 0])
    clear = two.values[..., 1] >= ratio * two.values[..., 0]
    return xy, tokens, target.masked_fill(~clear, IGNORE)
