"""Visual grounding questions on cell scenes: answers need 2-D position.

Each sample is one image of ``rows x cols`` cells (sizes vary between batches, so a
model cannot read a cell off a fixed raster index) and a question, as token ids:

* ``WHAT r c`` -> ``[shape, colour]`` of the object at row ``r``, column ``c``;
* ``WHERE shape colour`` -> ``[row r, column c]`` of that (unique) object.

Token ids: :mod:`recipes.data.vocab` (the first :data:`~recipes.data.vocab.VOCAB_SIZE` ids:
``PAD``, ``WHAT``, ``WHERE``, ``ANSWER``, ``EMPTY``, one id per shape, per colour and per
row/column index ``0 .. MAX_CELLS-1``); the names stay importable from here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .scenes import random_scene, render_scene
from .vocab import ANSWER, COLOR0, EMPTY, INDEX0, MAX_CELLS, PAD, SHAPE0, VOCAB_SIZE, WHAT, WHERE, object_ids

__all__ = [
    "ANSWER",
    "COLOR0",
    "EMPTY",
    "INDEX0",
    "MAX_CELLS",
    "PAD",
    "SHAPE0",
    "VOCAB_SIZE",
    "WHAT",
    "WHERE",
    "GroundingBatch",
    "make_grounding",
]


@dataclass(frozen=True)
class GroundingBatch:
    """``images`` ``(B, 3, rows*cell, cols*cell)``; ``question`` ``(B, 4)`` = ``[kind, a, b, ANSWER]``;
    ``answer`` ``(B, 2)``; ``grid`` = ``(rows, cols)`` shared by the batch."""

    images: Tensor
    question: Tensor
    answer: Tensor
    grid: tuple[int, int]


def make_grounding(
    n: int, rows: int, cols: int, seed: int, cell: int = 16, num_objects: int | None = None, noise: float = 0.05
) -> GroundingBatch:
    """``n`` samples on a ``rows x cols`` grid, half ``WHAT`` and half ``WHERE`` questions."""
    if not (1 <= rows <= MAX_CELLS and 1 <= cols <= MAX_CELLS):
        raise ValueError(f"rows and cols must be in [1, {MAX_CELLS}], got {(rows, cols)}")
    if n <= 0:
        raise ValueError(f"n must be positive, got {n}")
    rng = np.random.default_rng(seed)
    k = num_objects or max(2, (rows * cols) // 2)
    images, questions, answers = [], [], []
    for i in range(n):
        scene = random_scene(rows, cols, k, rng)
        images.append(render_scene(scene, cell, rng, noise))
        if i % 2 == 0:
            r, c = int(rng.integers(rows)), int(rng.integers(cols))
            answer = object_ids(int(scene[r, c]))
            questions.append([WHAT, INDEX0 + r, INDEX0 + c, ANSWER])
        else:
            r, c = (int(v[0]) for v in np.nonzero(scene == rng.choice(scene[scene >= 0])))
            questions.append([WHERE, *object_ids(int(scene[r, c])), ANSWER])
            answer = [INDEX0 + r, INDEX0 + c]
        answers.append(answer)
    return GroundingBatch(
        torch.from_numpy(np.stack(images)),
        torch.tensor(questions, dtype=torch.long),
        torch.tensor(answers, dtype=torch.long),
        (rows, cols),
    )
