"""Multi-image associative recall on oracle tokens (the long-context probe of V2PE).

A sample is ``[BOS] + K x ([SEP] + image of `cells` tokens) + Q query tokens``: every image
cell is one oracle token carrying a (key, value) pair (keys distinct within a sample, drawn
from ``0..num_keys-1``; values from ``0..num_values-1``); every query token carries the key of
a cell of one of the images and is trained to answer that cell's value. The answer is found by
content alone, wherever the cell is, so a position encoding can only help (by staying inside
the positions seen in training) or hurt (by meeting relative distances never trained on):
the regime of V2PE (Ge et al. 2024, arXiv:2412.09616, Sec. 3-4), where long multimodal contexts
push 1-D RoPE past its training range.

Shapes: ``keys``, ``values`` ``(n, K, cells)`` long; ``query`` ``(n, Q)`` long (indices of the
queried cells in ``0..K*cells-1``); ``answer`` ``(n, Q)`` long.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["RecallBatch", "make_recall"]


@dataclass(frozen=True)
class RecallBatch:
    keys: Tensor
    values: Tensor
    query: Tensor
    answer: Tensor


def make_recall(
    n: int, images: int, cells: int, queries: int, num_keys: int, num_values: int, generator: torch.Generator
) -> RecallBatch:
    """``n`` samples of ``images`` images (see the module docstring)."""
    for name, v in (("n", n), ("images", images), ("cells", cells), ("queries", queries), ("num_values", num_values)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    total = images * cells
    if not isinstance(num_keys, int) or num_keys < total:
        raise ValueError(f"num_keys must be an int >= images * cells = {total} (distinct keys), got {num_keys!r}")
    if queries > total:
        raise ValueError(f"queries must be <= images * cells = {total}, got {queries!r}")
    keys = torch.argsort(torch.rand(n, num_keys, generator=generator), dim=1)[:, :total]
    values = torch.randint(num_values, (n, total), generator=generator)
    query = torch.argsort(torch.rand(n, total, generator=generator), dim=1)[:, :queries]
    answer = values.gather(1, query)
    return RecallBatch(keys.view(n, images, cells), values.view(n, images, cells), query, answer)
