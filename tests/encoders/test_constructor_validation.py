"""Encoder constructors refuse nonsense with a ValueError naming the argument (issue 10, item 9)."""

from __future__ import annotations

import math

import pytest
import torch

import mmpos
from mmpos import Coords
from mmpos.encoders import irpe

BAD = [
    ("sincos", {"dim": 64, "temperature": 0}, "temperature"),
    ("sincos", {"dim": 64, "temperature": -1.0}, "temperature"),
    ("sincos", {"dim": 64, "temperature": math.nan}, "temperature"),
    ("sincos", {"dim": 0}, "dim"),
    ("sincos", {"dim": "64"}, "dim"),
    ("learned", {"dim": 8, "grid_size": (4, 4), "std": math.nan}, "std"),
    ("learned", {"dim": 8, "grid_size": (4.7, 4)}, "grid_size"),
    ("learned", {"dim": 8, "grid_size": (4, 4), "interpolation": "bicubik"}, "interpolation"),
    ("learned", {"dim": 0, "grid_size": (4, 4)}, "dim"),
    ("learned", {"dim": 8, "grid_size": (4, 4), "num_prefix_tokens": 1.5}, "num_prefix_tokens"),
    ("rope", {"head_dim": 8, "theta": math.inf}, "theta"),
    ("rope", {"head_dim": 8, "theta": math.nan}, "theta"),
    ("rope", {"dim": 0, "num_heads": 4}, "dim"),
    ("rope", {"dim": "64", "num_heads": 4}, "dim"),
    ("rope", {"dim": 64, "num_heads": 4.0}, "num_heads"),
    ("rope", {"head_dim": True}, "head_dim"),
    ("rope-axial", {"head_dim": 8, "axes": ()}, "axes"),
    ("rope-axial", {"head_dim": 8, "axes": "hw"}, "axes"),
    ("rope-axial", {"head_dim": 8, "axes": ("h", "h")}, "axes"),
    ("rope-axial", {"head_dim": 8, "sections": (1.5, 2.5)}, "sections"),
    ("rope-axial", {"head_dim": 8, "theta": math.inf}, "theta"),
    ("rope-mixed", {"dim": 64, "num_heads": 4, "axes": ("h",)}, "axes"),
    ("rope-mixed", {"dim": 64, "num_heads": 4, "theta": -10.0}, "theta"),
    ("fuzzy", {"dim": 8, "grid_size": (4, 4), "std": 0}, "std"),
    ("fuzzy", {"dim": 8, "grid_size": (4, 4), "jitter": math.nan}, "jitter"),
    ("fuzzy", {"dim": 8, "grid_size": (True, 4)}, "grid_size"),
    ("irpe", {"dim": 64, "num_heads": 4, "head_dim": 15}, "head_dim=15"),
    ("irpe", {"head_dim": 8, "grid_size": (4.5, 4)}, "grid_size"),
    ("irpe", {"head_dim": 8, "mode": ["ctx"]}, "mode"),
    ("peg", {"dim": True}, "dim"),
    ("peg", {"dim": 8, "kernel_size": 2.0}, "kernel_size"),
    ("fourier", {"dim": 8, "gamma": math.inf}, "gamma"),
    ("fourier", {"dim": 8, "axes": ()}, "axes"),
]


@pytest.mark.parametrize("name, kwargs, argument", BAD, ids=[f"{n}-{a}-{i}" for i, (n, _, a) in enumerate(BAD)])
def test_bad_constructor_argument_is_named(name, kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        mmpos.create(name, **kwargs)


def test_irpe_id_cache_is_bounded_by_bytes(monkeypatch):
    cache = irpe._BytesLRU(400_000)
    monkeypatch.setattr(irpe, "_ID_CACHE", cache)
    enc = mmpos.create("irpe", head_dim=8)
    q = torch.zeros(1, 1, 1, 8)
    for side in range(4, 16):  # ids of a 15 x 15 grid + 1 prefix: 8 * 226^2 = 408 kB, over the budget
        n = side * side + 1
        out = enc.bias(q.expand(1, 1, n, 8), q.expand(1, 1, n, 8), Coords.grid(side, side, num_prefix_tokens=1))
        assert out.shape[-1] == n
        assert cache.bytes <= cache.max_bytes
    assert 0 < len(cache._items) < 12
    again = irpe._shared_table_ids("product", 1.9, enc.num_buckets, (6, 6), 1)
    assert torch.equal(again, irpe._table_ids("product", 1.9, enc.num_buckets, (6, 6), 1))


def test_irpe_shared_head_must_be_a_bool():
    with pytest.raises(TypeError, match="shared_head"):
        mmpos.create("irpe", head_dim=8, num_heads=2, shared_head="no")
