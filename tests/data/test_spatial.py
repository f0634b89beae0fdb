"""Spatial relations data: determinism, any resolution, correct labels, and no answer without positions."""

from __future__ import annotations

import pytest
import torch

from mmpos.data.spatial import RELATIONS, relation, render, sample_layout, spatial_relations
from mmpos.nn import VisionTransformer


def test_deterministic_from_seed_and_global_rng_untouched():
    state = torch.get_rng_state()
    a = spatial_relations(16, 32, seed=5)
    b = spatial_relations(16, 32, seed=5)
    c = spatial_relations(16, 32, seed=6)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.parametrize("size, cells", [(32, 4), (48, 4), (64, 8), ((32, 64), (4, 8))])
def test_any_image_size(size, cells):
    x, y = spatial_relations(3, size, seed=0, cells=cells)
    h, w = (size, size) if isinstance(size, int) else size
    assert x.shape == (3, 3, h, w) and x.dtype == torch.float32 and y.shape == (3,) and y.dtype == torch.int64


def _centers(images: torch.Tensor) -> torch.Tensor:
    """(B, 2 squares, (row, col)) centroid of the red and the blue pixels of noise-free images."""
    red = (images[:, 0] > 0.5) & (images[:, 2] < -0.5)
    blue = (images[:, 2] > 0.5) & (images[:, 0] < -0.5)
    ys, xs = torch.meshgrid(torch.arange(images.shape[-2]), torch.arange(images.shape[-1]), indexing="ij")
    out = []
    for m in (red, blue):
        n = m.sum((1, 2)).float()
        assert (n > 0).all()
        out.append(torch.stack([(m * ys).sum((1, 2)) / n, (m * xs).sum((1, 2)) / n], -1))
    return torch.stack(out, 1)


@pytest.mark.parametrize("num_relations", [4, 8])
def test_labels_are_balanced_and_match_the_drawn_squares(num_relations):
    layout = sample_layout(1000, seed=1, cells=8, num_relations=num_relations)
    counts = layout.label.bincount(minlength=num_relations)
    assert counts.min() > 0.7 * 1000 / num_relations
    x, y = render(layout, 64, seed=0, noise=0.0)
    c = _centers(x)
    d_cell = (layout.cell[:, 0] - layout.cell[:, 1]).float()
    assert torch.equal(relation(d_cell[:, 0], d_cell[:, 1], num_relations), y)
    if num_relations == 4:  # the pixels agree: e.g. "left" means the red square's pixels are left of the blue's
        names = RELATIONS[4]
        dy, dx = (c[:, 0] - c[:, 1]).unbind(-1)
        assert (dx[y == names.index("left")] < 0).all() and (dx[y == names.index("right")] > 0).all()
        assert (dy[y == names.index("above")] < 0).all() and (dy[y == names.index("below")] > 0).all()
    # every square stays inside its cell, at every resolution
    for size in (32, 48, 64):
        cell_px = size // 8
        xs, _ = render(layout, size, seed=0, noise=0.0)
        cs = _centers(xs)
        assert torch.equal((cs // cell_px).long(), layout.cell)


def test_same_scenes_at_several_resolutions():
    layout = sample_layout(8, seed=3, cells=4)
    small, y1 = render(layout, 32, seed=0, noise=0.0)
    large, y2 = render(layout, 64, seed=0, noise=0.0)
    assert torch.equal(y1, y2)
    assert torch.allclose(_centers(small) * 2, _centers(large), atol=2.0)  # pixel rounding


def test_bad_arguments():
    with pytest.raises(ValueError, match="num_relations"):
        sample_layout(2, 0, num_relations=5)
    with pytest.raises(ValueError, match="multiple of the layout's cells"):
        render(sample_layout(2, 0, cells=8), 30, seed=0)
    with pytest.raises(ValueError, match="cells"):
        sample_layout(2, 0, cells=0)


def _swap_cells(images: torch.Tensor, layout, cell_px: int) -> torch.Tensor:
    """Exchange the pixel blocks of the red and the blue cells (a permutation of patches)."""
    out = images.clone()
    for b in range(images.shape[0]):
        (r1, c1), (r2, c2) = layout.cell[b].tolist()
        a = (slice(None), slice(r1 * cell_px, (r1 + 1) * cell_px), slice(c1 * cell_px, (c1 + 1) * cell_px))
        z = (slice(None), slice(r2 * cell_px, (r2 + 1) * cell_px), slice(c2 * cell_px, (c2 + 1) * cell_px))
        out[b][a], out[b][z] = images[b][z], images[b][a]
    return out


def test_a_bag_of_patches_cannot_tell_the_relation():
    """Swapping the two cells turns a scene of one relation into an equally likely scene of the
    opposite relation with the same set of patches: a ViT without position encoding gives both the
    same answer, so it cannot beat chance; a position-aware ViT can tell them apart."""
    torch.manual_seed(0)
    layout = sample_layout(16, seed=2, cells=4)
    images, labels = render(layout, 32, seed=0)
    swapped = _swap_cells(images, layout, 8)
    opposite = {0: 1, 1: 0, 2: 3, 3: 2}
    assert all(
        relation(*(layout.cell[b, 1] - layout.cell[b, 0]).float(), 4).item() == opposite[labels[b].item()]
        for b in range(16)
    )
    bag = VisionTransformer(32, patch_size=8, num_classes=4, dim=32, depth=2, num_heads=2, pos=[]).eval()
    torch.testing.assert_close(bag(images), bag(swapped), atol=1e-5, rtol=1e-5)
    aware = VisionTransformer(32, patch_size=8, num_classes=4, dim=32, depth=2, num_heads=2, pos="sincos").eval()
    assert (aware(images) - aware(swapped)).abs().max() > 1e-3
