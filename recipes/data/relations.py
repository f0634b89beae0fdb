"""Spatial-relation questions on cell scenes: which object is below / right of the marked cell.

The relational sibling of :mod:`recipes.data.grounding`: same scenes, renderer and answer
vocabulary. Each image of ``rows x cols`` cells holds coloured objects and one *mark*,
a white square in an otherwise empty cell (:func:`recipes.data.scenes.paint_mark`, as the
needle of :mod:`recipes.data.haystack`).
Questions, as ids:

* ``BELOW ANSWER`` -> ``[shape, colour]`` of the object one row below the mark, or
  ``[EMPTY, EMPTY]``;
* ``RIGHT ANSWER`` -> the same for the cell one column to the right.

The neighbour sits at a fixed 2-D offset ``(+1, 0)`` / ``(0, +1)`` from the mark; in
raster order that is ``+cols`` / ``+1`` tokens, so ``BELOW`` depends on the grid width
(which varies between batches) while ``RIGHT`` does not.

:func:`make_hidden_clips` asks the same kind of question across time: which object
does the flash of a video clip hide (the other frames show it at the same place)?

Token ids: :mod:`recipes.data.vocab` -- those of :mod:`recipes.data.grounding` and
:mod:`recipes.data.video` plus ``BELOW``, ``RIGHT`` and ``HIDDEN``
(:data:`~recipes.data.vocab.RELATION_VOCAB_SIZE` ids); the names stay importable from here.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np
import torch

from .grounding import GroundingBatch
from .scenes import NUM_OBJECTS, add_noise, paint_mark, random_scene, render_scene
from .video import EventClips, flash_clip, roundtrip_video
from .vocab import ANSWER, BELOW, HIDDEN, MAX_CELLS, RELATION_VOCAB_SIZE, RIGHT, object_ids

__all__ = ["BELOW", "HIDDEN", "RELATION_VOCAB_SIZE", "RIGHT", "make_hidden_clips", "make_relations"]


def make_relations(
    n: int, rows: int, cols: int, seed: int, cell: int = 16, fill: float = 0.75, noise: float = 0.05
) -> GroundingBatch:
    """``n`` samples on a ``rows x cols`` grid, alternately ``BELOW`` and ``RIGHT`` questions.

    ``fill`` is the fraction of the cells other than the mark's holding an object
    (at most the 16 distinct objects). ``question`` ``(n, 2)`` = ``[kind, ANSWER]``,
    ``answer`` ``(n, 2)``.
    """
    if not (1 <= rows <= MAX_CELLS and 1 <= cols <= MAX_CELLS) or rows * cols < 2 or min(rows, cols) < 2:
        raise ValueError(f"rows and cols must be in [2, {MAX_CELLS}], got {(rows, cols)}")
    if n <= 0:
        raise ValueError(f"n must be positive, got {n}")
    if not 0.0 < fill <= 1.0:
        raise ValueError(f"fill must be in (0, 1], got {fill}")
    rng = np.random.default_rng(seed)
    k = min(round(fill * (rows * cols - 1)), NUM_OBJECTS)
    images, questions, answers = [], [], []
    for i in range(n):
        kind, (dr, dc) = (BELOW, (1, 0)) if i % 2 == 0 else (RIGHT, (0, 1))
        r, c = int(rng.integers(rows - dr)), int(rng.integers(cols - dc))  # the mark, with a neighbour cell
        scene = np.full(rows * cols, -1, dtype=np.int64)
        free = np.delete(np.arange(rows * cols), r * cols + c)
        scene[rng.choice(free, size=k, replace=False)] = rng.choice(NUM_OBJECTS, size=k, replace=False)
        scene = scene.reshape(rows, cols)
        image = render_scene(scene, cell, rng, noise=0.0)
        paint_mark(image, r, c, cell)
        images.append(add_noise(image, noise, rng))
        questions.append([kind, ANSWER])
        answers.append(object_ids(int(scene[r + dr, c + dc])))
    return GroundingBatch(
        torch.from_numpy(np.stack(images)),
        torch.tensor(questions, dtype=torch.long),
        torch.tensor(answers, dtype=torch.long),
        (rows, cols),
    )


def make_hidden_clips(
    n: int,
    frames: int,
    rows: int,
    cols: int,
    seed: int,
    cell: int = 16,
    duration: int = 2,
    fill: float = 0.75,
    roundtrip: bool = True,
    noise: float = 0.03,
) -> EventClips:
    """Clips whose flash (the mark) hides an object: ``HIDDEN ANSWER`` -> that object's ``[shape, colour]``.

    As :func:`recipes.data.video.make_event_clips` (static cell scene, a white square over
    cell ``(r, c)`` from frame ``f`` for ``duration`` frames, MJPG round trip), with a
    ``fill`` fraction of the cells holding objects; the flash covers the object of its
    cell, which the other frames show at the same place (or ``[EMPTY, EMPTY]`` for an empty
    cell). Answering needs the token at the same ``(h, w)`` in another frame: a fixed
    3-D offset ``(dt, 0, 0)``, but ``dt * rows * cols`` tokens in raster order.
    ``event`` ``(n, 3)`` = ``(f, r, c)``.
    """
    if not 1 <= frames - duration + 1 <= MAX_CELLS or duration < 1 or frames <= duration:
        raise ValueError(f"frames must exceed duration and frames - duration + 1 be in [1, {MAX_CELLS}], "
                         f"got frames={frames}, duration={duration}")  # fmt: skip
    if not (1 <= rows <= MAX_CELLS and 1 <= cols <= MAX_CELLS):
        raise ValueError(f"rows and cols must be in [1, {MAX_CELLS}], got {(rows, cols)}")
    if n <= 0 or not 0.0 < fill <= 1.0:
        raise ValueError(f"n must be positive and fill in (0, 1], got n={n}, fill={fill}")
    rng = np.random.default_rng(seed)
    k = min(max(1, round(fill * rows * cols)), NUM_OBJECTS)
    clips, answers, events = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(n):
            scene = random_scene(rows, cols, k, rng)
            f, r, c = int(rng.integers(frames - duration + 1)), int(rng.integers(rows)), int(rng.integers(cols))
            clip = flash_clip(render_scene(scene, cell, rng, noise=0.0), frames, (f, r, c), duration, cell, rng, noise)
            clips.append(roundtrip_video(clip, os.path.join(tmp, f"clip{i}.avi")) if roundtrip else clip)
            answers.append(object_ids(int(scene[r, c])))
            events.append([f, r, c])
    return EventClips(
        torch.from_numpy(np.stack(clips)),
        torch.tensor([[HIDDEN, ANSWER]] * n, dtype=torch.long),
        torch.tensor(answers, dtype=torch.long),
        torch.tensor(events, dtype=torch.long),
    )
