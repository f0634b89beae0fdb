"""Encoders and the token merger against definitions written here from the papers, not from mmpos code.

* 3-D ``sincos``: MAE's 1-D sin-cos embedding (``get_1d_sincos_pos_embed_from_grid`` of
  facebookresearch/mae ``util/pos_embed.py``, as ViViT/VideoMAE use per axis) in NumPy float64, one per axis,
  arranged as :mod:`mmpos.encoders.sincos` documents: ``[sin(a0 w), sin(a1 w), ..., cos(a0 w), cos(a1 w), ...]``.
* 3-D ``learned`` resampling: a separable trilinear interpolation written from the ``align_corners=False``
  formula (source = (target + 0.5) * in / out - 0.5, clamped to the grid), and ``F.interpolate(mode="trilinear")``.
* ViTAR's token merger (arXiv:2403.18361, section 3.1): each output cell's members recovered by brute force
  from one-hot tokens, checked to be a product of contiguous row and column runs of ceil/floor sizes covering
  the grid exactly once, with the paper's cell counts.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mmpos import Coords
from mmpos.encoders.learned import LearnedPositionEmbedding
from mmpos.encoders.sincos import SinCosPositionEmbedding
from mmpos.layers.token_merger import AdaptiveTokenMerger, merge_schedule


def _mae_1d(dim: int, pos: np.ndarray, temperature: float = 10000.0) -> np.ndarray:
    """MAE's 1-D embedding of positions ``(M,)``: ``[sin(pos * omega), cos(pos * omega)]``, ``(M, dim)``."""
    omega = np.arange(dim // 2, dtype=np.float64) / (dim / 2.0)
    omega = 1.0 / temperature**omega
    out = np.einsum("m,d->md", pos.astype(np.float64), omega)
    return np.concatenate([np.sin(out), np.cos(out)], axis=1)


def _sincos_3d_reference(dim: int, pos: np.ndarray) -> np.ndarray:
    """Per-axis MAE embeddings of width ``dim / 3``, sines of all axes first, then cosines (the documented order)."""
    per_axis = [_mae_1d(dim // 3, pos[:, a]) for a in range(3)]
    half = dim // 6
    return np.concatenate([e[:, :half] for e in per_axis] + [e[:, half:] for e in per_axis], axis=1)


@pytest.mark.parametrize("dim", [36, 96])
def test_sincos_3d_matches_per_axis_mae_embedding(dim):
    coords = Coords.grid(3, 4, 5, num_prefix_tokens=1)  # axes (t, h, w)
    got = SinCosPositionEmbedding(dim).embed(coords)[0].double().numpy()  # (1 + 60, dim)
    cells = np.array(list(itertools.product(range(3), range(4), range(5))), dtype=np.float64)  # raster (t, h, w)
    np.testing.assert_allclose(got[1:], _sincos_3d_reference(dim, cells), rtol=0, atol=2e-6)
    assert not got[0].any()  # the class token gets no position


def test_sincos_3d_free_points_and_mae_concatenation_is_a_permutation():
    gen = torch.Generator().manual_seed(0)
    xyz = torch.rand(1, 20, 3, generator=gen) * 10 - 5
    got = SinCosPositionEmbedding(48).embed(Coords.points(xyz))[0].double().numpy()
    ref = _sincos_3d_reference(48, xyz[0].double().numpy())
    np.testing.assert_allclose(got, ref, rtol=0, atol=5e-6)
    # MAE/ViViT concatenate whole per-axis embeddings [sin t, cos t, sin h, cos h, ...]: the same channels, reordered
    mae = np.concatenate([_mae_1d(16, xyz[0, :, a].double().numpy()) for a in range(3)], axis=1)
    perm = [a * 16 + s * 8 + k for s in range(2) for a in range(3) for k in range(8)]
    np.testing.assert_allclose(got, mae[:, perm], rtol=0, atol=5e-6)


def _linear_weights(n_in: int, n_out: int) -> torch.Tensor:
    """``(n_out, n_in)`` 1-D linear interpolation matrix, ``align_corners=False``, edges clamped."""
    w = torch.zeros(n_out, n_in, dtype=torch.float64)
    for i in range(n_out):
        src = max((i + 0.5) * n_in / n_out - 0.5, 0.0)
        lo = min(math.floor(src), n_in - 1)
        hi = min(lo + 1, n_in - 1)
        frac = src - lo
        w[i, lo] += 1.0 - frac
        w[i, hi] += frac
    return w


@pytest.mark.parametrize("new", [(4, 6, 7), (2, 3, 3), (3, 5, 4)])
def test_learned_3d_resampling_is_trilinear(new):
    torch.manual_seed(0)
    old, dim = (3, 4, 5), 8
    enc = LearnedPositionEmbedding(dim, old, num_prefix_tokens=1)
    table = enc.table_for(new)  # (1, 1 + prod(new), D)
    assert table.shape == (1, 1 + math.prod(new), dim)
    torch.testing.assert_close(table[:, :1], enc.pos_embed[:, :1])  # the prefix vector is not resampled
    grid = enc.pos_embed[0, 1:].detach().double().reshape(*old, dim)  # (T, H, W, D), raster order
    wt, wh, ww = (_linear_weights(o, n) for o, n in zip(old, new))
    ref = torch.einsum("at,bh,cw,thwd->abcd", wt, wh, ww, grid).reshape(-1, dim)
    torch.testing.assert_close(table[0, 1:].double(), ref, rtol=0, atol=1e-6)
    tri = F.interpolate(grid.permute(3, 0, 1, 2)[None], size=new, mode="trilinear", align_corners=False)
    torch.testing.assert_close(table[0, 1:].double(), tri[0].permute(1, 2, 3, 0).reshape(-1, dim), rtol=0, atol=1e-6)
    # embed() at that grid serves the same table
    torch.testing.assert_close(enc.embed(Coords.grid(*new, num_prefix_tokens=1)), table)


def _members(merger: AdaptiveTokenMerger, h: int, w: int, size: tuple[int, int]) -> list[list[set[int]]]:
    """Each output cell's members, by brute force: a merge step on one-hot tokens with the attention and FFN
    outputs zeroed returns the mean of each cell's tokens, so its support is the cell and its value 1 / size."""
    x = torch.eye(h * w, dtype=torch.float64).reshape(1, h, w, h * w)
    y = merger.merge_step(x, size)[0]  # (gh, gw, h * w)
    cells = []
    for i in range(size[0]):
        row = []
        for j in range(size[1]):
            members = set(torch.nonzero(y[i, j]).flatten().tolist())
            torch.testing.assert_close(y[i, j][list(members)], torch.full((len(members),), 1.0 / len(members)).double())
            row.append(members)
        cells.append(row)
    return cells


def _expected_cells(n: int, g: int) -> int:
    """The paper's cell count along an axis of ``n`` tokens merged towards ``g``."""
    return math.ceil(n / 2) if n >= 2 * g else g


@pytest.mark.parametrize(("h", "w", "target"), [(9, 8, (3, 3)), (7, 5, (4, 3)), (6, 11, (6, 4)), (5, 5, (3, 5))])
def test_token_merger_cells_partition_the_grid(h, w, target):
    d = h * w
    merger = AdaptiveTokenMerger(d, target, num_heads=1).double()
    with torch.no_grad():  # zero the attention and FFN outputs: each cell becomes the mean of its real tokens
        for p in (merger.proj.weight, merger.proj.bias, merger.mlp.fc2.weight, merger.mlp.fc2.bias):
            p.zero_()
    size = merge_schedule((h, w), target)[0]
    assert size == (_expected_cells(h, target[0]), _expected_cells(w, target[1]))
    cells = _members(merger, h, w, size)
    # every grid token in exactly one cell
    everyone = sorted(t for row in cells for c in row for t in c)
    assert everyone == list(range(h * w))
    rows = [sorted({t // w for t in cells[i][0]}) for i in range(size[0])]
    cols = [sorted({t % w for t in cells[0][j]}) for j in range(size[1])]
    for (i, r), (j, c) in itertools.product(enumerate(rows), enumerate(cols)):
        assert cells[i][j] == {a * w + b for a in r for b in c}  # a cell is rows_i x cols_j
    for runs, n, m in ((rows, h, size[0]), (cols, w, size[1])):
        assert [t for run in runs for t in run] == list(range(n))  # contiguous runs, in order, covering the axis
        assert {len(run) for run in runs} <= {n // m, -(-n // m)}  # of floor / ceil sizes
        assert max(len(run) for run in runs) <= 2  # at most 2 x 2 tokens per cell


def test_merge_schedule_follows_the_paper():
    assert merge_schedule((64, 64), (14, 14)) == [(32, 32), (16, 16), (14, 14)]  # the paper's example
    assert merge_schedule((14, 14), (14, 14)) == []
    for h, w in itertools.product(range(3, 40, 3), range(4, 40, 5)):
        grid, steps = (h, w), merge_schedule((h, w), (3, 4))
        assert steps[-1] == (3, 4) if steps else grid == (3, 4)
        for step in steps:
            assert step == tuple(_expected_cells(n, g) for n, g in zip(grid, (3, 4)))
            grid = step
