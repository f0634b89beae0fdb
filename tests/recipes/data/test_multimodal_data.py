import numpy as np
import pytest
import torch

from recipes.data import grounding as G
from recipes.data.haystack import make_haystack
from recipes.data.scenes import COLORS, random_scene, render_scene
from recipes.data.video import EVENT, WHEN, make_event_clips, read_video, write_video

RGB = torch.tensor(list(COLORS.values()), dtype=torch.float32) / 255


def _cell_colour(image, r, c, cell=16):
    """Nearest palette colour at the centre of cell (r, c), or None for background."""
    px = image[:, r * cell + cell // 2, c * cell + cell // 2]
    if px.max() < 0.3:
        return None
    return int((RGB - px).norm(dim=1).argmin())


def test_grounding_answers_match_the_pixels():
    batch = G.make_grounding(40, 3, 4, seed=1, noise=0.0)
    assert batch.images.shape == (40, 3, 48, 64) and batch.grid == (3, 4)
    for img, q, a in zip(batch.images, batch.question, batch.answer):
        if q[0] == G.WHAT:
            r, c = int(q[1]) - G.INDEX0, int(q[2]) - G.INDEX0
            colour = _cell_colour(img, r, c)
            assert (a[0] == G.EMPTY) == (colour is None)
            if colour is not None:
                assert int(a[1]) - G.COLOR0 == colour
        else:
            r, c = int(a[0]) - G.INDEX0, int(a[1]) - G.INDEX0
            assert _cell_colour(img, r, c) == int(q[2]) - G.COLOR0


def test_grounding_deterministic_and_errors():
    a, b = G.make_grounding(4, 2, 2, seed=3), G.make_grounding(4, 2, 2, seed=3)
    assert torch.equal(a.images, b.images) and torch.equal(a.answer, b.answer)
    with pytest.raises(ValueError, match="rows and cols"):
        G.make_grounding(4, 0, 2, seed=0)
    with pytest.raises(ValueError, match="num_objects"):
        random_scene(2, 2, 5, np.random.default_rng(0))
    with pytest.raises(ValueError, match="scene"):
        render_scene(np.zeros(3, dtype=np.int64), 16, np.random.default_rng(0))


def _structured_frames(num_frames: int, seed: int, rows: int = 3, cols: int = 4, cell: int = 16) -> np.ndarray:
    """``(T, 3, H, W)``: a different cell scene in every frame, its background a colour gradient that moves."""
    rng = np.random.default_rng(seed)
    h, w = rows * cell, cols * cell
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    frames = []
    for t in range(num_frames):
        scene = render_scene(random_scene(rows, cols, 6, rng), cell, rng, noise=0.0)  # (3, H, W)
        gradient = 0.1 + 0.6 * np.stack([x / w, y / h, ((x + y + 8 * t) % w) / w])
        background = (scene == scene[:, :1, :1]).all(axis=0)  # the corner is always outside the cell margins
        frames.append(np.where(background, gradient, scene))
    return np.stack(frames).astype(np.float32)


def _psnr(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Peak signal-to-noise ratio in dB of every frame, ``(T,)``, for values in [0, 1]."""
    mse = ((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean(axis=(1, 2, 3))
    return 10 * np.log10(1.0 / mse)


def test_video_roundtrip_through_opencv(tmp_path):
    """Every decoded frame is its own frame, through the lossy MJPG codec: per-frame PSNR >= 22 dB.

    Measured (20 seeds, OpenCV's MJPG): 24.2-25.4 dB for the worst frame of a clip. What the bound rejects
    (worst frame, same 20 seeds): the frames shifted by one pixel <= 20.4 dB, two pixels <= 17.6, another
    frame order (frames rolled by one) <= 12.4, a constant frame of the mean colour <= 13.5, a black frame ~7.
    """
    frames = _structured_frames(6, seed=0)
    path = str(tmp_path / "clip.avi")
    write_video(path, frames)
    back = read_video(path)
    assert back.shape == frames.shape and back.dtype == np.float32
    assert _psnr(back, frames).min() >= 22.0, _psnr(back, frames)
    # the bound can fail: the same decoded frames, wrong in the ways above, fall far below it
    assert _psnr(np.roll(back, 1, axis=-1), frames).min() < 21.0  # one pixel to the right
    assert _psnr(back[::-1], frames).min() < 15.0  # reversed order
    assert _psnr(np.full_like(frames, frames.mean()), frames).min() < 15.0
    assert _psnr(np.zeros_like(frames), frames).max() < 10.0


def test_event_clips_flash_where_and_when_the_answer_says():
    clips = make_event_clips(6, frames=6, rows=3, cols=3, seed=0, noise=0.0)
    assert clips.clips.shape == (6, 6, 3, 48, 48)
    for clip, q, a, (f, r, c) in zip(clips.clips, clips.question, clips.answer, clips.event.tolist()):
        centre = clip[:, :, r * 16 + 8, c * 16 + 8]  # (T, 3)
        white = centre.min(dim=1).values > 0.85
        assert white[f] and int(white.float().argmax()) == f
        if q[0] == WHEN:
            assert int(a[0]) - G.INDEX0 == f
        else:
            assert q[0] == EVENT and [int(a[0]) - G.INDEX0, int(a[1]) - G.INDEX0] == [r, c]


def test_haystack_needle_image_holds_the_answer():
    hay = make_haystack(8, num_images=5, seed=2, noise=0.0)
    assert hay.images.shape == (8, 5, 3, 32, 32)
    for images, a, k in zip(hay.images, hay.answer, hay.needle.tolist()):
        whites = [(img.min(0).values > 0.95).any().item() for img in images]
        assert whites == [i == k for i in range(5)]
        colours = {_cell_colour(images[k], r, c) for r in range(2) for c in range(2)}
        assert int(a[1]) - G.COLOR0 in colours
    with pytest.raises(ValueError, match="num_images"):
        make_haystack(2, 0, seed=0)
