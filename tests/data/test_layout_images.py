import pytest
import torch

from mmpos.data.layout_images import RELATIONS, layout_images, relation, render, sample_scenes


def _boxes(images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Masks of the red and blue squares of noise-free images ``(B, 3, H, W)`` -> ``(B, H, W)`` each."""
    red = (images[:, 0] > 0.5) & (images[:, 2] < -0.5)
    blue = (images[:, 2] > 0.5) & (images[:, 0] < -0.5)
    return red, blue


def _centroids(mask: torch.Tensor) -> torch.Tensor:
    """``(B, H, W)`` bool -> ``(B, 2)`` centroid ``(y, x)`` in pixels."""
    h, w = mask.shape[-2:]
    ys = torch.arange(h, dtype=torch.float32).view(1, h, 1)
    xs = torch.arange(w, dtype=torch.float32).view(1, 1, w)
    area = mask.sum((1, 2)).float()
    return torch.stack([(mask * ys).sum((1, 2)) / area, (mask * xs).sum((1, 2)) / area], -1)


def test_relation_on_hand_made_displacements():
    dy = torch.tensor([0.0, 0.0, -2.0, 3.0, 1.0, -5.0])
    dx = torch.tensor([-3.0, 2.0, 1.0, -1.0, 1.0, 4.0])
    assert relation(dy, dx).tolist() == [0, 1, 2, 3, -1, 2]
    assert RELATIONS == ("left", "right", "above", "below")


def test_deterministic_and_seed_dependent():
    a = layout_images(16, 32, seed=3)
    b = layout_images(16, 32, seed=3)
    c = layout_images(16, 32, seed=4)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])
    assert a[0].shape == (16, 3, 32, 32) and a[0].dtype == torch.float32 and a[1].dtype == torch.int64


def test_global_rng_untouched():
    state = torch.get_rng_state()
    layout_images(4, 48, seed=0)
    assert torch.equal(state, torch.get_rng_state())


def test_labels_balanced():
    labels = sample_scenes(4000, seed=0).label
    counts = torch.bincount(labels, minlength=4)
    assert counts.sum() == 4000 and counts.min() > 900  # 1000 expected per class


@pytest.mark.parametrize("object_scale", ["pixels", "image"])
@pytest.mark.parametrize("size", [32, 48, 64])
def test_label_correct_by_construction_at_every_resolution(object_scale, size):
    scene = sample_scenes(64, seed=1)
    images, labels = render(scene, size, seed=2, object_scale=object_scale, noise=0.0, color_jitter=0.0)
    red, blue = _boxes(images)
    assert bool(red.any((1, 2)).all() and blue.any((1, 2)).all())
    assert not bool((red & blue).any())
    d = _centroids(red) - _centroids(blue)
    assert torch.equal(relation(d[:, 0], d[:, 1]), labels)


def test_geometry_guarantees_at_base_resolution():
    scene = sample_scenes(256, seed=5, min_gap=8.0, min_margin=4.0)
    d = (scene.center[:, 0] - scene.center[:, 1]) * scene.base_size  # (B, yx) base pixels
    assert bool(((d[:, 0].abs() - d[:, 1].abs()).abs() >= 4.0).all())
    dominant = torch.maximum(d[:, 0].abs(), d[:, 1].abs())
    assert bool((dominant - scene.side.sum(1) / 2 >= 8.0).all())
    # no 8 x 8 patch holds both squares: a bag of patches carries no relation
    images, _ = render(scene, 32, seed=0, noise=0.0, color_jitter=0.0)
    red, blue = _boxes(images)
    red_patches = red.view(-1, 4, 8, 4, 8).any(2).any(-1)
    blue_patches = blue.view(-1, 4, 8, 4, 8).any(2).any(-1)
    assert not bool((red_patches & blue_patches).any())


def test_object_scale_pixels_keeps_sizes_image_scales_them():
    scene = sample_scenes(32, seed=7)
    kw = {"seed": 0, "noise": 0.0, "color_jitter": 0.0}
    red32 = _boxes(render(scene, 32, **kw)[0])[0].sum((1, 2))
    red64 = _boxes(render(scene, 64, object_scale="pixels", **kw)[0])[0].sum((1, 2))
    red64_image = _boxes(render(scene, 64, object_scale="image", **kw)[0])[0].sum((1, 2))
    assert torch.equal(red32, red64)
    assert torch.equal(red64_image, torch.round(2 * scene.side[:, 0]) ** 2)
    assert torch.equal(red32, torch.round(scene.side[:, 0]) ** 2)


def test_one_scene_centre_scales_with_the_image():
    scene = sample_scenes(8, seed=9)
    kw = {"seed": 0, "noise": 0.0, "color_jitter": 0.0}
    c32 = _centroids(_boxes(render(scene, 32, **kw)[0])[1])
    c64 = _centroids(_boxes(render(scene, 64, **kw)[0])[1])
    assert torch.allclose(c64 + 0.5, 2 * (c32 + 0.5), atol=2.0)  # rounding to pixels


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: render(sample_scenes(2, 0), 24, 0), "image_size"),
        (lambda: render(sample_scenes(2, 0), 64, 0, object_scale="meters"), "object_scale"),
        (lambda: render(sample_scenes(2, 0), (32, 64), 0), "square"),
        (lambda: sample_scenes(-1, 0), "n must"),
        (lambda: sample_scenes(2, 0, side=(8.0, 4.0)), "side"),
        (lambda: sample_scenes(2, 0, base_size=16, side=(4.0, 8.0), min_gap=8.0), "do not fit"),
        (lambda: sample_scenes(2, 0, min_gap=0), "min_gap"),
    ],
)
def test_bad_input_raises(call, match):
    with pytest.raises(ValueError, match=match):
        call()
