"""Coords: reordered axes drop the grid, huge grids refused before allocating, half-precision warning."""

from __future__ import annotations

import warnings

import pytest
import torch

import mmpos
from mmpos import Coords


def test_select_reordering_axes_drops_grid_shape():
    c = Coords.grid(3, 5)
    wh = c.select("w", "h")
    assert wh.grid_shape is None  # tokens stay in (h, w) row-major order; (5, 3) would misdescribe them
    assert c.select("h", "w").grid_shape == (3, 5)
    # encoders that read the grid refuse it instead of reading a wrong layout
    with pytest.raises(ValueError, match="grid"):
        mmpos.create("peg", dim=4)(torch.zeros(1, 15, 4), wh)
    with pytest.raises(ValueError, match="grid"):
        mmpos.create("learned", dim=4, grid_size=(5, 3)).embed(wh)


def test_grid_too_large_is_refused_before_allocating():
    with pytest.raises(ValueError, match="10,000,000,000 tokens"):
        Coords.grid(100000, 100000)
    with pytest.raises(ValueError, match="n="):
        Coords.sequence(2**31)


@pytest.mark.parametrize("dtype, exact", [(torch.float16, 2048), (torch.bfloat16, 256)])
def test_half_precision_coordinates_warn(dtype, exact):
    with pytest.warns(UserWarning, match=f"exactly only up to {exact}"):
        c = Coords.sequence(4000, dtype=dtype)
    assert c.pos.unique().numel() < 4000  # what the warning is about
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Coords.sequence(4000)  # float32: no warning
