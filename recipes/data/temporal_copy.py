"""Clips of oracle tokens for the temporal-copy task (a small V-NIAH-D).

Each clip has ``frames`` frames of a ``rows x cols`` grid of cells; a cell is one token whose
value (an oracle token: an id in ``0..vocab-1``, no pixels) is drawn uniformly. The target of
every cell at frame ``t >= lag`` is the value of the same cell at frame ``t - lag`` (a fixed
``(-lag, 0, 0)`` offset in ``(t, h, w)``; ``lag * rows * cols`` tokens back in raster order);
earlier cells have no target (``-100``). Every other cell of the clip is a distractor of the
same kind as the needle, differing only in its position: the same cell recurs at every frame
(the periodic distractors of V-NIAH-D, Wei et al. 2025, "VideoRoPE", arXiv:2502.05173, Sec. 4),
so a rotary plan must separate offset ``lag`` from every other frame offset of the clip.

``hold`` repeats every content frame ``hold`` times (the clip at ``hold`` x the frame rate;
the copy reaches back ``lag * hold`` frames, the same moment in time).

Shapes: ``values`` ``(n, frames, rows, cols)`` long; ``targets`` ``(n, frames * rows * cols)`` long.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["copy_clips"]


def copy_clips(
    n: int, frames: int, rows: int, cols: int, lag: int, vocab: int, generator: torch.Generator, hold: int = 1
) -> tuple[Tensor, Tensor]:
    """``(values (n, frames, rows, cols), targets (n, frames * rows * cols))``; see the module docstring."""
    for name, value, low in (("n", n, 1), ("rows", rows, 1), ("cols", cols, 1), ("lag", lag, 1), ("hold", hold, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 2:
        raise ValueError(f"vocab must be an int >= 2, got {vocab!r}")
    if isinstance(frames, bool) or not isinstance(frames, int) or frames <= lag * hold:
        raise ValueError(f"frames must be an int > lag * hold = {lag * hold}, got {frames!r}")
    content = -(-frames // hold)
    base = torch.randint(vocab, (n, content, rows, cols), generator=generator)
    values = base.repeat_interleave(hold, dim=1)[:, :frames]
    targets = torch.full_like(values, -100)
    back = lag * hold
    targets[:, back:] = values[:, :-back]
    return values, targets.flatten(1)
