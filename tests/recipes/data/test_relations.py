import pytest
import torch

from recipes.data import grounding as G
from recipes.data import video as V
from recipes.data.relations import BELOW, HIDDEN, RELATION_VOCAB_SIZE, RIGHT, make_hidden_clips, make_relations
from recipes.data.scenes import COLORS

RGB = torch.tensor(list(COLORS.values()), dtype=torch.float32) / 255
CELL = 16


def _cell(image, r, c):
    """'mark', None (background) or the palette colour index at the centre of cell (r, c)."""
    px = image[:, r * CELL + CELL // 2, c * CELL + CELL // 2]
    if px.min() > 0.9:
        return "mark"
    if px.max() < 0.3:
        return None
    return int((RGB - px).norm(dim=1).argmin())


def test_answers_are_the_neighbour_of_the_mark():
    batch = make_relations(60, 3, 4, seed=2, noise=0.0)
    assert batch.images.shape == (60, 3, 3 * CELL, 4 * CELL) and batch.grid == (3, 4)
    assert batch.question.shape == (60, 2) and (batch.question[:, 1] == G.ANSWER).all()
    assert set(batch.question[:, 0].tolist()) == {BELOW, RIGHT}
    for image, q, a in zip(batch.images, batch.question, batch.answer):
        cells = [(r, c) for r in range(3) for c in range(4) if _cell(image, r, c) == "mark"]
        assert len(cells) == 1
        (r, c), (dr, dc) = cells[0], ((1, 0) if q[0] == BELOW else (0, 1))
        colour = _cell(image, r + dr, c + dc)
        assert (a[0] == G.EMPTY) == (colour is None) and (a[1] == G.EMPTY) == (colour is None)
        if colour is not None:
            assert int(a[1]) - G.COLOR0 == colour and G.SHAPE0 <= int(a[0]) < G.COLOR0


def test_vocabulary_extends_the_video_ids():
    ids = [G.PAD, G.WHAT, G.WHERE, G.ANSWER, G.EMPTY, V.WHEN, V.EVENT, BELOW, RIGHT, HIDDEN]
    assert len(set(ids)) == len(ids) and max(ids) == RELATION_VOCAB_SIZE - 1 and BELOW == V.VIDEO_VOCAB_SIZE


def test_hidden_clips_answer_the_object_under_the_flash():
    clips = make_hidden_clips(16, 4, 2, 3, seed=1, noise=0.0, roundtrip=False)
    assert clips.clips.shape == (16, 4, 3, 2 * CELL, 3 * CELL)
    assert (clips.question == torch.tensor([HIDDEN, G.ANSWER])).all()
    for clip, a, (f, r, c) in zip(clips.clips, clips.answer, clips.event.tolist()):
        assert _cell(clip[f], r, c) == "mark" and _cell(clip[f + 1], r, c) == "mark"
        other = clip[f + 2] if f + 2 < 4 else clip[f - 1]
        colour = _cell(other, r, c)
        assert (a[0] == G.EMPTY) == (colour is None)
        if colour is not None:
            assert int(a[1]) - G.COLOR0 == colour
    coded = make_hidden_clips(4, 3, 2, 2, seed=1)  # through the MJPG file
    assert coded.clips.shape == (4, 3, 3, 2 * CELL, 2 * CELL) and coded.clips.dtype == torch.float32
    with pytest.raises(ValueError, match="frames must exceed duration"):
        make_hidden_clips(4, 2, 2, 2, seed=0)


def test_fill_and_determinism():
    a, b = make_relations(8, 2, 2, seed=5), make_relations(8, 2, 2, seed=5)
    assert torch.equal(a.images, b.images) and torch.equal(a.answer, b.answer)
    full = make_relations(20, 2, 3, seed=0, fill=1.0, noise=0.0)
    assert (full.answer[:, 0] != G.EMPTY).all()  # every cell but the mark holds an object


def test_errors():
    with pytest.raises(ValueError, match="rows and cols"):
        make_relations(4, 1, 3, seed=0)
    with pytest.raises(ValueError, match="n must be positive"):
        make_relations(0, 2, 2, seed=0)
    with pytest.raises(ValueError, match="fill"):
        make_relations(4, 2, 2, seed=0, fill=0.0)
