"""Rotary encoders: k of another length refused; learnable frequencies stay float32 under casts."""

from __future__ import annotations

import pytest
import torch

import mmpos
from mmpos import Coords


@pytest.mark.parametrize("k_len", [1, 7])
def test_rotary_k_of_other_length_is_refused(k_len):
    enc = mmpos.create("rope", head_dim=8)
    q = torch.randn(1, 2, 5, 8)
    with pytest.raises(ValueError, match="k has batch 1 x"):
        enc.rotate(q, torch.randn(1, 2, k_len, 8), Coords.sequence(5))


def test_rope_mixed_frequencies_stay_float32_under_bfloat16():
    torch.manual_seed(0)
    enc = mmpos.create("rope-mixed", dim=64, num_heads=4)
    before = enc.weight.detach().clone()
    enc.to(torch.bfloat16)
    assert enc.weight.dtype == torch.float32 and isinstance(enc.weight, torch.nn.Parameter)
    assert torch.equal(enc.weight.detach(), before)
    coords = Coords.grid(64, 64)
    assert (enc.angles(coords) - _angles(before, coords)).abs().max() < 1e-3
    enc.weight.grad = torch.ones_like(enc.weight)
    enc.half()
    assert enc.weight.dtype == torch.float32 and enc.weight.grad.dtype == torch.float32


def _angles(weight, coords):
    return (coords.pos[:, None, :, :, None] * weight[None, :, None]).sum(-2)


def test_bfloat16_rounding_would_be_visible():
    torch.manual_seed(0)
    w = mmpos.create("rope-mixed", dim=64, num_heads=4).weight.detach()
    coords = Coords.grid(64, 64)
    assert (_angles(w, coords) - _angles(w.bfloat16().float(), coords)).abs().max() > 0.05  # what the cast cost
