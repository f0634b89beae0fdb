"""The arrays behind the figures of :mod:`mmpos.viz`: pure functions, no drawing.

* :func:`similarity_map` -- how strongly one query token relates to every token from
  position alone, for any encoder kind:

  - rotary: ``q_i . k_j / |u|^2`` with ``q = k = u`` the same content vector ``u`` at every
    token, rotated by the encoder (``content="constant"``: ``u = 1``, which is also the
    expectation over ``u ~ N(0, I)``: ``(sum_p 2 cos(theta_i,p - theta_j,p) + unrotated) / D``;
    ``content="random"``: one seeded draw of ``u`` per head). 1 at the query itself.
  - bias: the query's row of ``encoder.bias(q, k, coords)`` (logit units, same ``q = k = u``
    for contextual modes).
  - additive: cosine similarity of the embeddings ``embed(coords)`` (0 for a zero embedding).
  - conv: the response to an impulse at the query token, ``|f(x0 + e_q) - f(x0)|`` per
    token (channel RMS) with ``x0 = 0`` and ``e_q`` one in every channel at the query: where
    the query's features reach after one application (the kernel's support, clipped at
    the zero-padded border).

* :func:`extrapolation_maps` -- the similarity map on the training grid and on a grid
  ``factor`` times larger (query at the same relative place).
* :func:`plan_table` -- which axis and frequency every rotary pair (and head) reads.
* :func:`layout_rows` -- the position of every token along every axis of a
  :func:`mmpos.layout.build` output, and its vision blocks.

Shapes: :class:`SimilarityMap` ``values`` ``(H, N)`` float64 over all ``N`` tokens of the
first sample (``H`` = heads of the encoder, 1 when it has none or shares one map);
:meth:`SimilarityMap.on_grid` ``grid_shape`` (or ``(N - num_prefix_tokens,)``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from .._validate import check_int, is_int
from ..coords import Coords, Modality
from ..encoders.base import AdditiveEncoder, BiasEncoder, ConvEncoder, PositionEncoder, RotaryEncoder
from ..rotary import FrequencyPlan

__all__ = [
    "CONTENTS",
    "LayoutRows",
    "PlanTable",
    "SimilarityMap",
    "extrapolation_maps",
    "layout_rows",
    "plan_table",
    "query_index",
    "similarity_map",
]

#: content vectors :func:`similarity_map` can put at every token (rotary and contextual bias)
CONTENTS = ("constant", "random")
#: the largest ``seed`` the maps take (``torch.Generator.manual_seed`` reads a 64-bit unsigned int)
SEED_MAX = 2**64 - 1


@dataclass(frozen=True)
class SimilarityMap:
    """One query's map over the tokens.

    Attributes:
        values: ``(H, N)`` float64, one row per head (``H = 1`` for additive / conv encoders
            and for rotary plans and bias tables shared by all heads).
        query: token index of the query.
        grid_shape: the token grid after the prefix tokens, or ``None`` (then drawn as a curve).
        num_prefix_tokens: leading position-less tokens (not drawn).
        kind: the encoder kind (``"rotary"``, ``"bias"``, ``"additive"``, ``"conv"``).
    """

    values: Tensor
    query: int
    grid_shape: tuple[int, ...] | None
    num_prefix_tokens: int
    kind: str

    def on_grid(self, head: int | str = "mean") -> Tensor:
        """The grid tokens' values, ``grid_shape`` (or ``(N - num_prefix_tokens,)``): one head or the mean."""
        if head == "mean":
            row = self.values.mean(0)
        elif is_int(head) and 0 <= head < self.values.shape[0]:
            row = self.values[head]
        else:
            raise ValueError(f"head must be 'mean' or an int in [0, {self.values.shape[0] - 1}], got {head!r}")
        row = row[self.num_prefix_tokens :]
        return row if self.grid_shape is None else row.reshape(self.grid_shape)

    @property
    def query_cell(self) -> tuple[int, ...]:
        """The query's index on the grid (``(n - num_prefix_tokens,)`` without a grid)."""
        flat = self.query - self.num_prefix_tokens
        if self.grid_shape is None:
            return (flat,)
        return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), self.grid_shape))


@dataclass(frozen=True)
class PlanTable:
    """A rotary plan per pair: ``axis`` ``(H, P)`` long (index into ``axes``, the axis with the
    largest weight; ``-1`` for an unrotated pair), ``freq`` ``(H, P)`` float64 (the norm of the
    pair's weight over the axes, radians per unit), ``weight`` ``(H, A, P)`` float64."""

    axis: Tensor
    freq: Tensor
    weight: Tensor
    axes: tuple[str, ...]


@dataclass(frozen=True)
class LayoutRows:
    """Positions of one sample of a layout, real tokens only.

    Attributes:
        values: ``(A, L)`` float64, position of token ``l`` along axis ``a``.
        axes: the ``A`` axis names.
        modality: ``(L,)`` long :class:`~mmpos.coords.Modality` codes.
        blocks: ``(start, stop, modality)`` of every run of consecutive vision tokens.
        scheme: the layout's scheme.
    """

    values: Tensor
    axes: tuple[str, ...]
    modality: Tensor
    blocks: tuple[tuple[int, int, int], ...]
    scheme: str


def _first(coords: Coords) -> Coords:
    """The first sample of ``coords`` (batch 1)."""
    if coords.batch_size == 1:
        return coords
    return replace(
        coords,
        pos=coords.pos[:1],
        mask=None if coords.mask is None else coords.mask[:1],
        modality=None if coords.modality is None else coords.modality[:1],
    )


def query_index(coords: Coords, query: Sequence[float]) -> int:
    """Index of the (first sample's, non-prefix, real) token at coordinates ``query``, one value per axis."""
    if not isinstance(coords, Coords):
        raise TypeError(f"coords must be a mmpos.Coords, got {type(coords).__name__}")
    try:
        target = torch.tensor([float(v) for v in query], dtype=torch.float64)
    except (TypeError, ValueError):
        raise ValueError(f"query must be a sequence of numbers, one per axis {coords.axes}, got {query!r}") from None
    if target.numel() != coords.num_axes:
        raise ValueError(f"query must hold one coordinate per axis {coords.axes}, got {tuple(query)}")
    pos = coords.pos[0].to(torch.float64)  # (N, A)
    ok = torch.isclose(pos, target, atol=1e-6, rtol=0).all(-1) & coords.token_mask[0]
    ok[: coords.num_prefix_tokens] = False
    hits = ok.nonzero().flatten()
    if hits.numel() == 0:
        real = pos[coords.num_prefix_tokens :][coords.token_mask[0, coords.num_prefix_tokens :]]
        ranges = ", ".join(f"{a} in [{lo:g}, {hi:g}]" for a, lo, hi in zip(coords.axes, real.min(0)[0], real.max(0)[0]))
        raise ValueError(f"query {tuple(query)} is not the position of any token ({ranges})")
    return int(hits[0])


def _content(content: str | Tensor, heads: int, head_dim: int, seed: int) -> Tensor:
    """``(heads, head_dim)`` float64 content vectors."""
    if isinstance(content, Tensor):
        u = content.to(torch.float64)
        if u.shape not in ((head_dim,), (heads, head_dim)):
            raise ValueError(f"content must have shape ({head_dim},) or ({heads}, {head_dim}), got {tuple(u.shape)}")
        return u.expand(heads, head_dim)
    if content == "constant":
        return torch.ones(heads, head_dim, dtype=torch.float64)
    if content == "random":
        g = torch.Generator().manual_seed(seed)
        return torch.randn(heads, head_dim, generator=g, dtype=torch.float64)
    raise ValueError(f"content must be one of {CONTENTS} or a tensor, got {content!r}")


def _qk(u: Tensor, n: int, dtype: torch.dtype) -> Tensor:
    return u[None, :, None, :].expand(1, u.shape[0], n, u.shape[1]).to(dtype)  # (1, H, N, D)


@torch.no_grad()
def similarity_map(
    encoder: PositionEncoder,
    coords: Coords,
    query: Sequence[float],
    content: str | Tensor = "constant",
    seed: int = 0,
) -> SimilarityMap:
    """The map of query token ``query`` (its coordinates, one per axis) against every token.

    Args:
        encoder: a rotary, bias, additive or conv encoder (see the module docstring).
        coords: token coordinates; only the first sample is used.
        query: the query's coordinates, e.g. ``(7, 7)`` on a ``(h, w)`` grid.
        content: ``"constant"``, ``"random"`` (seeded) or a ``(D,)`` / ``(H, D)`` tensor:
            the content vector at every token for rotary and bias encoders.
        seed: seed of ``content="random"`` (an int in ``[0, 2**64 - 1]``, as ``torch.Generator.manual_seed`` takes).
    """
    seed = check_int(seed, "seed", 0, SEED_MAX)
    coords = _first(coords)
    q = query_index(coords, query)
    n = coords.num_tokens
    if isinstance(encoder, RotaryEncoder):
        heads = encoder.weight.shape[0] if encoder.weight.dim() == 3 else 1
        u = _content(content, heads, encoder.head_dim, seed)
        c64 = coords.to(dtype=torch.float64)
        qr, kr = encoder.rotate(_qk(u, n, torch.float64), _qk(u, n, torch.float64), c64)  # (1, H, N, D)
        values = (qr[0, :, q : q + 1] * kr[0]).sum(-1) / (u * u).sum(-1, keepdim=True)  # (H, N)
    elif isinstance(encoder, BiasEncoder):
        head_dim = getattr(encoder, "head_dim", None)
        if not isinstance(head_dim, int):
            raise TypeError(f"{type(encoder).__name__} must expose an int head_dim to draw its bias")
        heads = getattr(encoder, "num_heads", None) or 1
        u = _content(content, heads, head_dim, seed)
        dtype = next((p.dtype for p in encoder.parameters()), torch.float32)
        qk = _qk(u, n, dtype)
        values = encoder.bias(qk, qk, coords)[0, :, q].to(torch.float64)  # (H or 1, N)
    elif isinstance(encoder, AdditiveEncoder):
        emb = encoder.embed(coords)[0].to(torch.float64)  # (N, D)
        norm = emb.norm(dim=-1)
        values = (emb @ emb[q]) / (norm * norm[q]).clamp_min(1e-300)
        values = torch.where(norm > 0, values, torch.zeros_like(values)).unsqueeze(0)  # (1, N)
    elif isinstance(encoder, ConvEncoder):
        dim = getattr(encoder, "dim", None)
        if not isinstance(dim, int):
            raise TypeError(f"{type(encoder).__name__} must expose an int dim (token width) to draw its response")
        dtype = next((p.dtype for p in encoder.parameters()), torch.float32)
        x0 = torch.zeros(1, n, dim, dtype=dtype)
        impulse = x0.clone()
        impulse[0, q] = 1
        response = (encoder(impulse, coords) - encoder(x0, coords))[0].to(torch.float64)  # (N, D)
        values = (response.pow(2).mean(-1).sqrt()).unsqueeze(0)  # (1, N)
    else:
        raise TypeError(f"encoder must be a rotary, bias, additive or conv encoder, got {type(encoder).__name__}")
    return SimilarityMap(values.contiguous(), q, coords.grid_shape, coords.num_prefix_tokens, encoder.kind)


def extrapolation_maps(
    encoder: PositionEncoder,
    grid: Sequence[int],
    query: Sequence[int],
    factor: int = 2,
    num_prefix_tokens: int = 0,
    content: str | Tensor = "constant",
    seed: int = 0,
) -> tuple[SimilarityMap, SimilarityMap]:
    """Maps on the training ``grid`` and on ``factor`` times the grid, the query at ``query * factor``.

    Grids are :meth:`Coords.grid` (integer positions), so a coordinate-reading encoder meets
    positions beyond its training range on the larger grid, and a grid-resampling one is
    resampled.
    """
    check_int(factor, "factor")
    seed = check_int(seed, "seed", 0, SEED_MAX)
    grid = tuple(grid)
    big = tuple(s * factor for s in grid)
    train = similarity_map(encoder, Coords.grid(*grid, num_prefix_tokens=num_prefix_tokens), query, content, seed)
    wide = similarity_map(
        encoder, Coords.grid(*big, num_prefix_tokens=num_prefix_tokens), [v * factor for v in query], content, seed
    )
    return train, wide


def plan_table(plan: FrequencyPlan | RotaryEncoder) -> PlanTable:
    """Per-pair axis and frequency of a :class:`~mmpos.rotary.FrequencyPlan` or rotary encoder."""
    if isinstance(plan, RotaryEncoder):
        weight, axes = plan.weight.detach(), plan.axes
    elif isinstance(plan, FrequencyPlan):
        weight, axes = plan.weight, plan.axes
    else:
        raise TypeError(f"plan must be a FrequencyPlan or a rotary encoder, got {type(plan).__name__}")
    w = weight.to(torch.float64)
    w = w.unsqueeze(0) if w.dim() == 2 else w  # (H, A, P)
    freq = w.norm(dim=1)  # (H, P)
    axis = torch.where(freq > 0, w.abs().argmax(dim=1), torch.full_like(freq, -1, dtype=torch.long))
    return PlanTable(axis, freq, w, tuple(axes))


def layout_rows(layout, sample: int = 0) -> LayoutRows:
    """Positions of sample ``sample`` of a :func:`mmpos.layout.build` result (real tokens only)."""
    coords = getattr(layout, "coords", None)
    if not isinstance(coords, Coords):
        raise TypeError(f"layout must be a mmpos.layout.Layout, got {type(layout).__name__}")
    check_int(sample, f"sample (of a batch of {coords.batch_size})", 0, high=coords.batch_size - 1)
    real = coords.token_mask[sample]
    values = coords.pos[sample][real].to(torch.float64).T.contiguous()  # (A, L)
    modality = layout.modality[sample][real].long()
    blocks = []
    start = None
    for i, m in enumerate([*modality.tolist(), int(Modality.TEXT)]):
        if start is not None and m != modality[start]:
            blocks.append((start, i, int(modality[start])))
            start = None
        if start is None and m != int(Modality.TEXT) and i < modality.numel():
            start = i
    return LayoutRows(values, coords.axes, modality, tuple(blocks), layout.scheme)
