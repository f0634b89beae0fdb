"""The question vocabulary: ids defined once, documented as defined, and still importable from the task modules."""

import re

import pytest

from recipes.data import grounding, haystack, relations, video, vocab
from recipes.data.scenes import COLORS, NUM_OBJECTS, SHAPES


def test_the_documented_table_gives_the_defined_ids():
    rows = re.findall(r"^``(\w+)(?: \+ \w)?``\s+(\d+)(?:-(\d+))?\s", vocab.__doc__, re.MULTILINE)
    assert len(rows) == 15
    for name, first, last in rows:
        assert getattr(vocab, name) == int(first), name
    spans = {name: int(last) - int(first) + 1 for name, first, last in rows if last}
    assert spans == {"SHAPE0": len(SHAPES), "COLOR0": len(COLORS), "INDEX0": vocab.MAX_CELLS}


def _base_ids() -> list[int]:
    fixed = [vocab.PAD, vocab.WHAT, vocab.WHERE, vocab.ANSWER, vocab.EMPTY]
    return (
        fixed
        + [vocab.SHAPE0 + i for i in range(len(SHAPES))]
        + [vocab.COLOR0 + i for i in range(len(COLORS))]
        + [vocab.INDEX0 + i for i in range(vocab.MAX_CELLS)]
    )


def test_each_recipe_vocabulary_is_dense_and_without_collisions():
    base = _base_ids()
    assert sorted(base) == list(range(vocab.VOCAB_SIZE))
    video_ids = base + [vocab.WHEN, vocab.EVENT]
    assert sorted(video_ids) == list(range(vocab.VIDEO_VOCAB_SIZE))
    relation_ids = video_ids + [vocab.BELOW, vocab.RIGHT, vocab.HIDDEN]  # grounding and video recipes
    assert sorted(relation_ids) == list(range(vocab.RELATION_VOCAB_SIZE))
    haystack_ids = base + [vocab.NEEDLE, vocab.IMAGE_SEP]  # the haystack recipe
    assert sorted(haystack_ids) == list(range(vocab.HAYSTACK_VOCAB_SIZE))


@pytest.mark.parametrize(
    "module, names",
    [
        (
            grounding,
            ["ANSWER", "COLOR0", "EMPTY", "INDEX0", "MAX_CELLS", "PAD", "SHAPE0", "VOCAB_SIZE", "WHAT", "WHERE"],
        ),
        (video, ["EVENT", "VIDEO_VOCAB_SIZE", "WHEN"]),
        (relations, ["BELOW", "HIDDEN", "RELATION_VOCAB_SIZE", "RIGHT"]),
        (haystack, ["HAYSTACK_VOCAB_SIZE", "IMAGE_SEP", "NEEDLE"]),
    ],
)
def test_old_names_stay_importable_from_the_task_modules(module, names):
    for name in names:
        assert getattr(module, name) == getattr(vocab, name), f"{module.__name__}.{name}"
        assert name in module.__all__


def test_object_ids_decode_shape_and_colour():
    for obj in range(NUM_OBJECTS):
        shape, colour = vocab.object_ids(obj)
        assert (shape - vocab.SHAPE0) * len(COLORS) + (colour - vocab.COLOR0) == obj
        assert vocab.SHAPE0 <= shape < vocab.COLOR0 <= colour < vocab.INDEX0
    assert vocab.object_ids(-1) == [vocab.EMPTY, vocab.EMPTY]
