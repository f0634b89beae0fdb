"""Token ids of the questions and answers on cell scenes, defined once for every multimodal task.

================  =====  ==================================================================
id                value  meaning
================  =====  ==================================================================
``PAD``           0      padding, and the first token the answer decoder reads
``WHAT``          1      :mod:`~recipes.data.grounding`: ``WHAT r c`` -> ``[shape, colour]``
``WHERE``         2      :mod:`~recipes.data.grounding`: ``WHERE shape colour`` -> ``[r, c]``
``ANSWER``        3      ends every question: the answer follows
``EMPTY``         4      answer for an empty cell (or an unused answer slot)
``SHAPE0 + s``    5-8    shape ``s`` of :data:`recipes.data.scenes.SHAPES`
``COLOR0 + c``    9-12   colour ``c`` of :data:`recipes.data.scenes.COLORS`
``INDEX0 + i``    13-20  row / column / frame index ``i`` in ``0 .. MAX_CELLS - 1``
``WHEN``          21     :mod:`~recipes.data.video`: ``WHEN`` -> ``[index f, EMPTY]``
``EVENT``         22     :mod:`~recipes.data.video`: ``EVENT`` -> ``[r, c]`` of the flash
``BELOW``         23     :mod:`~recipes.data.relations`: the object below the mark
``RIGHT``         24     :mod:`~recipes.data.relations`: the object right of the mark
``HIDDEN``        25     :mod:`~recipes.data.relations`: the object the flash hides
``NEEDLE``        21     :mod:`~recipes.data.haystack`: the object beside the white square
``IMAGE_SEP``     22     :mod:`~recipes.data.haystack`: precedes each image
================  =====  ==================================================================

Vocabulary sizes: :data:`VOCAB_SIZE` (21, grounding), :data:`VIDEO_VOCAB_SIZE` (23, + video),
:data:`RELATION_VOCAB_SIZE` (26, + relations: the grounding and video recipes, one vocabulary
for every question they mix), :data:`HAYSTACK_VOCAB_SIZE` (23, the haystack recipe). The
haystack's two ids reuse 21 and 22: that recipe never meets the video questions, and the
values are kept as recorded results were produced with them.
"""

from __future__ import annotations

from .scenes import COLORS, SHAPES

__all__ = [
    "ANSWER",
    "BELOW",
    "COLOR0",
    "EMPTY",
    "EVENT",
    "HAYSTACK_VOCAB_SIZE",
    "HIDDEN",
    "IMAGE_SEP",
    "INDEX0",
    "MAX_CELLS",
    "NEEDLE",
    "PAD",
    "RELATION_VOCAB_SIZE",
    "RIGHT",
    "SHAPE0",
    "VIDEO_VOCAB_SIZE",
    "VOCAB_SIZE",
    "WHAT",
    "WHEN",
    "WHERE",
    "object_ids",
]

MAX_CELLS = 8  # rows, columns and frame indices that have an id
PAD, WHAT, WHERE, ANSWER, EMPTY = range(5)
SHAPE0 = 5
COLOR0 = SHAPE0 + len(SHAPES)
INDEX0 = COLOR0 + len(COLORS)
VOCAB_SIZE = INDEX0 + MAX_CELLS
WHEN, EVENT = VOCAB_SIZE, VOCAB_SIZE + 1
VIDEO_VOCAB_SIZE = VOCAB_SIZE + 2
BELOW, RIGHT, HIDDEN = VIDEO_VOCAB_SIZE, VIDEO_VOCAB_SIZE + 1, VIDEO_VOCAB_SIZE + 2
RELATION_VOCAB_SIZE = VIDEO_VOCAB_SIZE + 3
NEEDLE, IMAGE_SEP = VOCAB_SIZE, VOCAB_SIZE + 1
HAYSTACK_VOCAB_SIZE = VOCAB_SIZE + 2


def object_ids(obj: int) -> list[int]:
    """The answer ``[shape, colour]`` for scene object id ``obj`` (``[EMPTY, EMPTY]`` when ``obj < 0``)."""
    return [EMPTY, EMPTY] if obj < 0 else [SHAPE0 + obj // len(COLORS), COLOR0 + obj % len(COLORS)]
