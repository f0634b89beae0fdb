"""Fixtures shared by the backbone integration tests (timm, open_clip)."""

import pytest

from mmpos.encoders import registry
from mmpos.encoders.base import BiasEncoder


class SpyBias(BiasEncoder):
    """A zero bias that records the model context it was built with and the coordinates of every call."""

    def __init__(self, dim, num_heads, head_dim, depth, grid_size, layer, axes):
        super().__init__()
        self.context = {
            "dim": dim,
            "num_heads": num_heads,
            "head_dim": head_dim,
            "depth": depth,
            "grid_size": grid_size,
            "layer": layer,
            "axes": axes,
        }
        self.seen = []

    def bias(self, q, k, coords):
        self.seen.append(coords)
        return q.new_zeros(1, 1, q.shape[2], k.shape[2])


@pytest.fixture
def spy(monkeypatch):
    """The name of :class:`SpyBias`, registered for the test."""
    registry._load()
    monkeypatch.setitem(registry._REGISTRY, "spy", registry.make_info("spy", SpyBias, "test"))
    return "spy"
