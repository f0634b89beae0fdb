"""The one mark painter and noise of the cell scenes."""

import numpy as np
import pytest

from recipes.data.scenes import COLORS, add_noise, paint_mark, render_scene

BACKGROUND = 20 / 255


@pytest.mark.parametrize("cell", [6, 8, 16, 23])
def test_the_mark_covers_exactly_the_pixels_of_a_square_object(cell):
    scene = np.full((3, 4), -1, dtype=np.int64)
    scene[1, 2] = 0  # shape 0 (square), colour 0
    drawn = render_scene(scene, cell, np.random.default_rng(0), noise=0.0)
    square = (np.abs(drawn - BACKGROUND) > 1e-6).any(0)
    marked = render_scene(np.full((3, 4), -1, dtype=np.int64), cell, np.random.default_rng(0), noise=0.0)
    paint_mark(marked, 1, 2, cell)
    assert np.array_equal((marked == 1.0).all(0), square) and square.any()
    assert np.allclose(marked[:, ~square], BACKGROUND)  # nothing else changed
    assert np.allclose(drawn[:, square], np.array(COLORS["red"])[:, None] / 255)


def test_the_mark_paints_every_leading_index_of_a_view():
    clip = np.zeros((5, 3, 32, 48), dtype=np.float32)
    paint_mark(clip[1:3], 0, 2, 16)  # frames 1 and 2 of a clip
    hit = (clip == 1.0).all(1)  # (T, H, W)
    assert hit[1].sum() == hit[2].sum() > 0 and not hit[[0, 3, 4]].any()
    ys, xs = np.nonzero(hit[1])
    assert ys.min() >= 0 and ys.max() < 16 and xs.min() >= 32 and xs.max() < 48


def test_add_noise():
    image = np.full((3, 8, 8), 0.5, dtype=np.float32)
    rng = np.random.default_rng(1)
    assert add_noise(image, 0.0, rng) is image
    assert rng.bit_generator.state == np.random.default_rng(1).bit_generator.state  # no draw without noise
    noisy = add_noise(image, 2.0, rng)
    assert noisy.dtype == np.float32 and noisy.min() >= 0.0 and noisy.max() <= 1.0 and noisy.std() > 0.1
    expected = np.clip(image + np.random.default_rng(1).normal(0.0, 2.0, image.shape).astype(np.float32), 0.0, 1.0)
    assert np.array_equal(noisy, expected)
