"""Synthetic tables and the two proxy tasks of 2D-TPE (Li et al. 2024, arXiv:2409.19700, Sec. 4.4).

A table is ``R x C`` cells, each holding a random value in ``0 .. num_values - 1`` and a mark
(plain, star ``*``, or reference). It is serialised row by row as in the 2D-TPE reference
(JinaLeejnl/2D-TPE ``src/sft_minicpm.py``): every cell is followed by ``col_sep`` (0 or 1)
``'|'`` tokens and every row ends with one ``'<SEP>'`` token; a cell is one token
``value + num_values * mark`` (``cell_tokens=1``) or two tokens ``value``, ``mark``
(``cell_tokens=2``). The layout of these tokens is :class:`mmpos.table.Table`
``.grid(R, C, cell_tokens, col_sep=col_sep, row_end=1)``.

A sample is ``[BOS, task, *question] + table + [QUERY]``; the answer (a value token
``0 .. num_values - 1``) is predicted at the last token:

* ``count`` (Counting-Stars): one cell is the reference (mark 2); the answer is the number of
  starred cells in its row and its column. The answer ``a`` is drawn uniformly in
  ``0 .. max_count`` first, then ``a`` stars are placed in the reference's row and column and
  ``0 .. max_count`` distractor stars elsewhere. Question: none.
* ``offset`` (Locating-Values): exactly one starred cell; the question is an offset
  ``(dr, dc)`` with ``0 <= dr, dc <= max_offset``, not both 0; the answer is the value of the
  cell ``dr`` rows below and ``dc`` columns right of the star (drawn so that it exists).
  Question: ``[DR_dr, DC_dc]``. With ``axis_aligned=True`` the offset lies along one axis
  (``(dr, 0)`` or ``(0, dc)``, ``dr, dc >= 1``): a column offset is ``dr`` rows away in the
  column-major order but ``dr (C + 1)`` tokens away in the serialisation.

Vocabulary (``num_values = V``): ``0 .. 3V - 1`` cell tokens (values are ``0 .. V - 1``, also
the answers; with ``cell_tokens=2`` marks are ``V .. V + 2``), then the specials of
:func:`vocab`. Shapes: tokens ``(B, L)`` int64, answers ``(B,)`` int64.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["TASKS", "TableBatch", "table_batch", "vocab"]

TASKS = ("count", "offset")
_PLAIN, _STAR, _REF = 0, 1, 2


def vocab(num_values: int = 10, max_offset: int = 2) -> dict[str, int]:
    """Token ids of the special tokens and ``"size"`` (the vocabulary size)."""
    base = 3 * num_values
    names = ["bos", "query", "col_sep", "row_end", "task_count", "task_offset"]
    names += [f"dr{i}" for i in range(max_offset + 1)] + [f"dc{i}" for i in range(max_offset + 1)]
    ids = {n: base + i for i, n in enumerate(names)}
    ids["size"] = base + len(names)
    return ids


@dataclass(frozen=True, eq=False)
class TableBatch:
    """A batch of same-shaped samples: ``tokens`` ``(B, L)``, ``answer`` ``(B,)``; the text before
    the table has ``prefix`` tokens, the table ``rows x cols`` cells, the text after it 1 token."""

    tokens: Tensor
    answer: Tensor
    task: str
    rows: int
    cols: int
    prefix: int
    cell_tokens: int
    col_sep: int


def _check(value: object, name: str, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def _choose(weights: Tensor, counts: Tensor, g: torch.Generator) -> Tensor:
    """Per row, a bool mask with ``counts[b]`` of the positions where ``weights[b] > 0`` (uniformly)."""
    keys = torch.rand(weights.shape, generator=g).masked_fill(weights <= 0, 2.0)
    rank = keys.argsort(-1).argsort(-1)
    return rank < counts[:, None]


def table_batch(
    task: str,
    rows: int,
    cols: int,
    batch: int,
    seed: int,
    num_values: int = 10,
    cell_tokens: int = 1,
    col_sep: int = 0,
    max_count: int = 3,
    max_offset: int = 2,
    axis_aligned: bool = False,
) -> TableBatch:
    """``batch`` samples of ``task`` on ``rows x cols`` tables, deterministic from ``seed``.

    ``axis_aligned``: ``offset`` questions only along one axis, ``(dr, 0)`` or ``(0, dc)``.
    """
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    for value, name, low in ((rows, "rows", 1), (cols, "cols", 1), (batch, "batch", 1), (max_count, "max_count", 0)):
        _check(value, name, low)
    _check(max_offset, "max_offset", 1)
    _check(num_values, "num_values", max(2, max_count + 1))
    if cell_tokens not in (1, 2):
        raise ValueError(f"cell_tokens must be 1 or 2, got {cell_tokens!r}")
    if col_sep not in (0, 1):
        raise ValueError(f"col_sep must be 0 or 1, got {col_sep!r}")
    if task == "offset" and (rows <= max_offset or cols <= max_offset):
        raise ValueError(f"offset tables need rows and cols > max_offset={max_offset}, got {rows} x {cols}")
    if task == "count" and rows + cols - 2 < max_count:
        raise ValueError(f"count tables need rows + cols - 2 >= max_count={max_count}, got {rows} x {cols}")
    g = torch.Generator().manual_seed(seed)
    v = vocab(num_values, max_offset)
    n = rows * cols
    values = torch.randint(num_values, (batch, n), generator=g)
    marks = torch.zeros(batch, n, dtype=torch.long)
    r = torch.arange(n) // cols
    c = torch.arange(n) % cols
    if task == "count":
        ref = torch.randint(n, (batch,), generator=g)
        cross = (r[None] == r[ref][:, None]) | (c[None] == c[ref][:, None])
        cross[torch.arange(batch), ref] = False
        answer = torch.randint(max_count + 1, (batch,), generator=g)
        stars = _choose(cross.float(), answer, g)
        others = ~cross
        others[torch.arange(batch), ref] = False
        stars |= _choose(others.float(), torch.randint(max_count + 1, (batch,), generator=g), g)
        marks[stars] = _STAR
        marks[torch.arange(batch), ref] = _REF
        question = torch.empty(batch, 0, dtype=torch.long)
        task_token = v["task_count"]
    else:
        if axis_aligned:
            k = torch.randint(2 * max_offset, (batch,), generator=g)
            dr, dc = torch.where(k < max_offset, k + 1, 0), torch.where(k >= max_offset, k - max_offset + 1, 0)
        else:
            flat = torch.randint((max_offset + 1) ** 2 - 1, (batch,), generator=g) + 1  # not (0, 0)
            dr, dc = flat // (max_offset + 1), flat % (max_offset + 1)
        star_r = (torch.rand(batch, generator=g) * (rows - dr)).long()
        star_c = (torch.rand(batch, generator=g) * (cols - dc)).long()
        star = star_r * cols + star_c
        marks[torch.arange(batch), star] = _STAR
        answer = values[torch.arange(batch), star + dr * cols + dc]
        question = torch.stack([v["dr0"] + dr, v["dc0"] + dc], dim=1)
        task_token = v["task_offset"]
    if cell_tokens == 1:
        cells = (values + num_values * marks).unsqueeze(-1)  # (B, n, 1)
    else:
        cells = torch.stack([values, num_values + marks], dim=-1)  # (B, n, 2)
    if col_sep:
        cells = torch.cat([cells, cells.new_full((batch, n, 1), v["col_sep"])], dim=-1)
    table = cells.view(batch, rows, -1)
    table = torch.cat([table, table.new_full((batch, rows, 1), v["row_end"])], dim=-1).view(batch, -1)
    head = torch.tensor([v["bos"], task_token]).expand(batch, 2)
    tokens = torch.cat([head, question, table, torch.full((batch, 1), v["query"])], dim=1)
    return TableBatch(tokens, answer, task, rows, cols, 2 + question.shape[1], cell_tokens, col_sep)
