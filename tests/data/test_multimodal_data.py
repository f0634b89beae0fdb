import numpy as np
import pytest
import torch

from mmpos.data import grounding as G
from mmpos.data.haystack import make_haystack
from mmpos.data.scenes import COLORS, random_scene, render_scene
from mmpos.data.video import EVENT, WHEN, make_event_clips, read_video, write_video

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


def test_video_roundtrip_through_opencv(tmp_path):
    frames = np.random.default_rng(0).random((5, 3, 32, 48)).astype(np.float32)
    path = str(tmp_path / "clip.avi")
    write_video(path, frames)
    back = read_video(path)
    assert back.shape == frames.shape
    assert np.abs(back - frames).mean() < 0.2  # lossy codec, same content


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
