"""Multi-image needle in a haystack.

A sample is ``num_images`` small cell scenes (``rows x cols`` cells, two objects
each). Exactly one image, the needle, holds a white square; the question ``NEEDLE``
asks for ``[shape, colour]`` of the other object *in the same image*. Answering needs
binding tokens to their image, so it depends on positions, and the context length
grows with ``num_images`` while the answer vocabulary does not: train on few images,
test on many.

Token ids: :mod:`recipes.data.vocab` (``NEEDLE``, ``IMAGE_SEP`` after the grounding ids,
:data:`~recipes.data.vocab.HAYSTACK_VOCAB_SIZE` in all); the names stay importable from here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .scenes import NUM_OBJECTS, add_noise, paint_mark, render_scene
from .vocab import ANSWER, HAYSTACK_VOCAB_SIZE, IMAGE_SEP, NEEDLE, object_ids

__all__ = ["HAYSTACK_VOCAB_SIZE", "IMAGE_SEP", "NEEDLE", "Haystack", "make_haystack"]


@dataclass(frozen=True)
class Haystack:
    """``images`` ``(B, K, 3, rows*cell, cols*cell)``; ``question`` ``(B, 2)`` = ``[NEEDLE, ANSWER]``;
    ``answer`` ``(B, 2)``; ``needle`` ``(B,)`` index of the needle image."""

    images: Tensor
    question: Tensor
    answer: Tensor
    needle: Tensor


def make_haystack(
    n: int, num_images: int, seed: int, rows: int = 2, cols: int = 2, cell: int = 16, noise: float = 0.05
) -> Haystack:
    """``n`` samples of ``num_images`` images each."""
    if num_images < 1 or n < 1:
        raise ValueError(f"n and num_images must be positive, got n={n}, num_images={num_images}")
    if rows * cols < 2:
        raise ValueError(f"an image needs at least 2 cells, got rows={rows}, cols={cols}")
    rng = np.random.default_rng(seed)
    images, answers, needles = [], [], []
    for _ in range(n):
        needle = int(rng.integers(num_images))
        sample = []
        for k in range(num_images):
            scene = np.full(rows * cols, -1, dtype=np.int64)
            cells = rng.choice(rows * cols, size=2, replace=False)
            scene[cells] = rng.choice(NUM_OBJECTS, size=2, replace=False)
            if k == needle:
                scene[cells[0]] = -1  # the white square goes here
                answers.append(object_ids(int(scene[cells[1]])))
            image = render_scene(scene.reshape(rows, cols), cell, rng, noise=0.0)
            if k == needle:
                paint_mark(image, *divmod(int(cells[0]), cols), cell)
            sample.append(add_noise(image, noise, rng))
        images.append(np.stack(sample))
        needles.append(needle)
    return Haystack(
        torch.from_numpy(np.stack(images)),
        torch.tensor([[NEEDLE, ANSWER]] * n, dtype=torch.long),
        torch.tensor(answers, dtype=torch.long),
        torch.tensor(needles, dtype=torch.long),
    )
