"""The eager attention path (bias encoders with an output term) in float16: no overflow."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import mmpos
from mmpos import Coords
from mmpos.nn.attention import attention


def test_eager_path_does_not_overflow_in_float16():
    torch.manual_seed(0)
    enc = mmpos.create("irpe", head_dim=64, rpe_on="kv", mode="ctx")  # iRPE on values: eager path
    coords = Coords.grid(4, 4)
    q = torch.randn(1, 2, 16, 64) * 100  # |q . k| ~ 1e5 > float16 max (65504) before scaling
    k = torch.randn(1, 2, 16, 64) * 100
    v = torch.randn(1, 2, 16, 64)
    out = attention(q.half(), k.half(), v.half(), coords, [enc])
    assert out.dtype == torch.float16 and torch.isfinite(out).all()
    ref = F.scaled_dot_product_attention(q, k, v)  # tables are zero: the reference is plain attention
    assert torch.allclose(out.float(), ref, atol=2e-2)
