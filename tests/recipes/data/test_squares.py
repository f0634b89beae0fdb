"""Red/blue squares: one relation vocabulary, both placements, any resolution, and the deprecated old names."""

from __future__ import annotations

import math

import pytest
import torch

from mmpos.nn import VisionTransformer
from recipes.data.squares import (
    RELATIONS,
    FreeSquares,
    GridSquares,
    make_squares,
    relation,
    render,
    sample_free,
    sample_grid,
)

_WORDS = {"left": (0, -1), "right": (0, 1), "above": (-1, 0), "below": (1, 0)}  # (dy, dx), rows grow downwards


def _masks(images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Red and blue pixels of noise-free images ``(B, 3, H, W)`` -> ``(B, H, W)`` each."""
    red = (images[:, 0] > 0.5) & (images[:, 2] < -0.5)
    blue = (images[:, 2] > 0.5) & (images[:, 0] < -0.5)
    return red, blue


def _centroid(mask: torch.Tensor) -> torch.Tensor:
    """``(B, H, W)`` bool -> ``(B, 2)`` centroid ``(y, x)`` in pixels."""
    h, w = mask.shape[-2:]
    ys = torch.arange(h, dtype=torch.float32).view(1, h, 1)
    xs = torch.arange(w, dtype=torch.float32).view(1, 1, w)
    area = mask.sum((1, 2)).float()
    assert bool((area > 0).all())
    return torch.stack([(mask * ys).sum((1, 2)) / area, (mask * xs).sum((1, 2)) / area], -1)


def _centers(images: torch.Tensor) -> torch.Tensor:
    """``(B, 2 squares (red, blue), (y, x))`` centroids."""
    return torch.stack([_centroid(m) for m in _masks(images)], 1)


# ---------------------------------------------------------------- one relation(), both label sets


@pytest.mark.parametrize("num_relations", [4, 8])
def test_relation_names_mean_what_they_say(num_relations):
    """A unit displacement built from each label's words ('above-left' = above + left) gets that label."""
    for label, name in enumerate(RELATIONS[num_relations]):
        dy, dx = (sum(v) for v in zip(*(_WORDS[w] for w in name.split("-"))))
        assert relation(torch.tensor([float(dy)]), torch.tensor([float(dx)]), num_relations).item() == label, name


def test_relation_4_on_hand_made_displacements():
    dy = torch.tensor([0.0, 0.0, -2.0, 3.0, 1.0, -5.0, 0.0])
    dx = torch.tensor([-3.0, 2.0, 1.0, -1.0, 1.0, 4.0, 0.0])
    assert relation(dy, dx).tolist() == [0, 1, 2, 3, -1, 2, -1]
    assert torch.equal(relation(dy.long(), dx.long(), 4), relation(dy, dx, 4))  # cell (int) displacements


def test_relation_8_matches_an_independent_sector_rule():
    """Sector labels against a rule written from slopes: horizontal when |dy| < tan(22.5) |dx|, etc."""
    g = torch.Generator().manual_seed(0)
    dy, dx = (torch.randint(-9, 10, (4000,), generator=g) for _ in range(2))
    dy, dx = dy.float() + 0.37 * torch.rand(4000, generator=g), dx.float()  # off the exact sector borders
    t = math.tan(math.pi / 8)
    expected = []
    for y, x in zip(dy.tolist(), dx.tolist()):
        vertical = "above" if y < 0 else "below"
        horizontal = "left" if x < 0 else "right"
        if abs(y) < t * abs(x):
            name = horizontal
        elif abs(x) < t * abs(y):
            name = vertical
        else:
            name = f"{vertical}-{horizontal}"
        expected.append(RELATIONS[8].index(name))
    assert relation(dy, dx, 8).tolist() == expected
    assert relation(torch.zeros(3), torch.zeros(3), 8).tolist() == [-1, -1, -1]


def test_relation_4_is_the_dominant_axis_of_relation_8():
    """Where both are defined and the 8-way label is a pure direction, the 4-way label is that direction."""
    dy, dx = torch.meshgrid(torch.arange(-6, 7), torch.arange(-6, 7), indexing="ij")
    four, eight = relation(dy.flatten(), dx.flatten(), 4), relation(dy.flatten(), dx.flatten(), 8)
    pure = (eight >= 0) & (eight % 2 == 0)
    names = [RELATIONS[4][i] for i in four[pure].tolist()]
    assert names == [RELATIONS[8][i] for i in eight[pure].tolist()]
    assert ((four == -1) == (dy.flatten().abs() == dx.flatten().abs())).all()


def test_relation_rejects_other_label_sets():
    with pytest.raises(ValueError, match="num_relations"):
        relation(torch.zeros(1), torch.ones(1), 6)


# ---------------------------------------------------------------- grid placement


def test_deterministic_from_seed_and_global_rng_untouched():
    state = torch.get_rng_state()
    for placement in ("grid", "free"):
        a = make_squares(16, 32, seed=5, placement=placement)
        b = make_squares(16, 32, seed=5, placement=placement)
        c = make_squares(16, 32, seed=6, placement=placement)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        assert not torch.equal(a[0], c[0])
        assert a[0].shape == (16, 3, 32, 32) and a[0].dtype == torch.float32 and a[1].dtype == torch.int64
    assert torch.equal(torch.get_rng_state(), state)


def test_make_squares_is_sample_then_render_from_the_next_seed():
    grid = make_squares(8, 48, seed=3, placement="grid", cells=4, num_relations=8, noise=0.1)
    expected = render(sample_grid(8, 3, cells=4, num_relations=8), 48, 4, noise=0.1)
    assert all(torch.equal(x, y) for x, y in zip(grid, expected))
    free = make_squares(8, 64, seed=3, placement="free", object_scale="image", min_gap=6.0)
    expected = render(sample_free(8, 3, min_gap=6.0), 64, 4, object_scale="image")
    assert all(torch.equal(x, y) for x, y in zip(free, expected))


@pytest.mark.parametrize("size, cells", [(32, 4), (48, 4), (64, 8), ((32, 64), (4, 8))])
def test_grid_any_image_size(size, cells):
    x, y = make_squares(3, size, seed=0, cells=cells)
    h, w = (size, size) if isinstance(size, int) else size
    assert x.shape == (3, 3, h, w) and x.dtype == torch.float32 and y.shape == (3,) and y.dtype == torch.int64


@pytest.mark.parametrize("num_relations", [4, 8])
def test_grid_labels_are_balanced_and_match_the_drawn_squares(num_relations):
    scenes = sample_grid(600, seed=1, cells=8, num_relations=num_relations)
    assert isinstance(scenes, GridSquares) and scenes.num_relations == num_relations
    counts = scenes.label.bincount(minlength=num_relations)
    assert counts.min() > 0.7 * 600 / num_relations
    x, y = render(scenes, 64, seed=0, noise=0.0)
    d_cell = scenes.cell[:, 0] - scenes.cell[:, 1]
    assert torch.equal(relation(d_cell[:, 0], d_cell[:, 1], num_relations), y)
    if num_relations == 4:  # the pixels agree: e.g. "left" means the red square's pixels are left of the blue's
        c = _centers(x)
        dy, dx = (c[:, 0] - c[:, 1]).unbind(-1)
        assert (dx[y == 0] < 0).all() and (dx[y == 1] > 0).all() and (dy[y == 2] < 0).all() and (dy[y == 3] > 0).all()
    for size in (32, 48, 64):  # every square stays inside its cell, at every resolution
        xs, _ = render(scenes, size, seed=0, noise=0.0)
        assert torch.equal((_centers(xs) // (size // 8)).long(), scenes.cell)


def test_grid_same_scenes_at_several_resolutions():
    scenes = sample_grid(8, seed=3, cells=4)
    small, y1 = render(scenes, 32, seed=0, noise=0.0)
    large, y2 = render(scenes, 64, seed=0, noise=0.0)
    assert torch.equal(y1, y2)
    assert torch.allclose(_centers(small) * 2, _centers(large), atol=2.0)  # pixel rounding


def _swap_cells(images: torch.Tensor, scenes: GridSquares, cell_px: int) -> torch.Tensor:
    """Exchange the pixel blocks of the red and the blue cells (a permutation of patches)."""
    out = images.clone()
    for b in range(images.shape[0]):
        (r1, c1), (r2, c2) = scenes.cell[b].tolist()
        a = (slice(None), slice(r1 * cell_px, (r1 + 1) * cell_px), slice(c1 * cell_px, (c1 + 1) * cell_px))
        z = (slice(None), slice(r2 * cell_px, (r2 + 1) * cell_px), slice(c2 * cell_px, (c2 + 1) * cell_px))
        out[b][a], out[b][z] = images[b][z], images[b][a]
    return out


def test_grid_a_bag_of_patches_cannot_tell_the_relation():
    """Swapping the two cells turns a scene of one relation into an equally likely scene of the
    opposite relation with the same set of patches: a ViT without position encoding gives both the
    same answer, so it cannot beat chance; a position-aware ViT can tell them apart."""
    torch.manual_seed(0)
    scenes = sample_grid(16, seed=2, cells=4)
    images, labels = render(scenes, 32, seed=0)
    swapped = _swap_cells(images, scenes, 8)
    back = scenes.cell[:, 1] - scenes.cell[:, 0]
    assert relation(back[:, 0], back[:, 1]).tolist() == [{0: 1, 1: 0, 2: 3, 3: 2}[v] for v in labels.tolist()]
    bag = VisionTransformer(32, patch_size=8, num_classes=4, dim=32, depth=2, num_heads=2, pos=[]).eval()
    torch.testing.assert_close(bag(images), bag(swapped), atol=1e-5, rtol=1e-5)
    aware = VisionTransformer(32, patch_size=8, num_classes=4, dim=32, depth=2, num_heads=2, pos="sincos").eval()
    assert (aware(images) - aware(swapped)).abs().max() > 1e-3


# ---------------------------------------------------------------- free placement


def test_free_labels_balanced():
    scenes = sample_free(4000, seed=0)
    assert isinstance(scenes, FreeSquares) and scenes.num_relations == 4
    counts = torch.bincount(scenes.label, minlength=4)
    assert counts.sum() == 4000 and counts.min() > 900  # 1000 expected per class


@pytest.mark.parametrize("object_scale", ["pixels", "image"])
@pytest.mark.parametrize("size", [32, 48, 64])
def test_free_label_correct_by_construction_at_every_resolution(object_scale, size):
    scenes = sample_free(64, seed=1)
    images, labels = render(scenes, size, seed=2, object_scale=object_scale, noise=0.0, color_jitter=0.0)
    red, blue = _masks(images)
    assert not bool((red & blue).any())
    d = _centroid(red) - _centroid(blue)
    assert torch.equal(relation(d[:, 0], d[:, 1]), labels)


def test_free_geometry_guarantees_at_base_resolution():
    scenes = sample_free(256, seed=5, min_gap=8.0, min_margin=4.0)
    d = (scenes.center[:, 0] - scenes.center[:, 1]) * scenes.base_size  # (B, yx) base pixels
    assert bool(((d[:, 0].abs() - d[:, 1].abs()).abs() >= 4.0).all())
    dominant = torch.maximum(d[:, 0].abs(), d[:, 1].abs())
    assert bool((dominant - scenes.side.sum(1) / 2 >= 8.0).all())
    # no 8 x 8 patch holds both squares: a bag of patches carries no relation
    images, _ = render(scenes, 32, seed=0, noise=0.0, color_jitter=0.0)
    red, blue = _masks(images)
    red_patches = red.view(-1, 4, 8, 4, 8).any(2).any(-1)
    blue_patches = blue.view(-1, 4, 8, 4, 8).any(2).any(-1)
    assert not bool((red_patches & blue_patches).any())


def test_free_object_scale_pixels_keeps_sizes_image_scales_them():
    scenes = sample_free(32, seed=7)
    kw = {"seed": 0, "noise": 0.0, "color_jitter": 0.0}
    red32 = _masks(render(scenes, 32, **kw)[0])[0].sum((1, 2))
    red64 = _masks(render(scenes, 64, object_scale="pixels", **kw)[0])[0].sum((1, 2))
    red64_image = _masks(render(scenes, 64, object_scale="image", **kw)[0])[0].sum((1, 2))
    assert torch.equal(red32, red64)
    assert torch.equal(red64_image, torch.round(2 * scenes.side[:, 0]) ** 2)
    assert torch.equal(red32, torch.round(scenes.side[:, 0]) ** 2)


def test_free_scene_centre_scales_with_the_image():
    scenes = sample_free(8, seed=9)
    kw = {"seed": 0, "noise": 0.0, "color_jitter": 0.0}
    c32 = _centroid(_masks(render(scenes, 32, **kw)[0])[1])
    c64 = _centroid(_masks(render(scenes, 64, **kw)[0])[1])
    assert torch.allclose(c64 + 0.5, 2 * (c32 + 0.5), atol=2.0)  # rounding to pixels


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: sample_grid(2, 0, num_relations=5), ValueError, "num_relations"),
        (lambda: sample_grid(2, 0, cells=0), ValueError, "cells"),
        (lambda: render(sample_grid(2, 0, cells=8), 30, seed=0), ValueError, "multiple of the scenes' cells"),
        (lambda: render(sample_grid(2, 0), 32, 0, object_scale="pixels"), ValueError, "object_scale"),
        (lambda: render(sample_free(2, 0), 24, 0), ValueError, "image_size"),
        (lambda: render(sample_free(2, 0), 64, 0, object_scale="meters"), ValueError, "object_scale"),
        (lambda: render(sample_free(2, 0), (32, 64), 0), ValueError, "square"),
        (lambda: render(sample_free(2, 0), 32, 0, noise=-1.0), ValueError, "noise"),
        (lambda: render(torch.zeros(2), 32, 0), TypeError, "GridSquares or FreeSquares"),
        (lambda: sample_free(-1, 0), ValueError, "n must"),
        (lambda: sample_free(2, 0, side=(8.0, 4.0)), ValueError, "side"),
        (lambda: sample_free(2, 0, base_size=16, side=(4.0, 8.0), min_gap=8.0), ValueError, "do not fit"),
        (lambda: sample_free(2, 0, min_gap=0), ValueError, "min_gap"),
        (lambda: make_squares(2, placement="ring"), ValueError, "placement"),
        (lambda: make_squares(2, placement="grid", min_gap=4.0), ValueError, "min_gap"),
    ],
)
def test_bad_input_raises(call, error, match):
    with pytest.raises(error, match=match):
        call()
