"""Synthetic tables: answers recomputed from the tokens, layout agreement with mmpos.table."""

import pytest
import torch

from mmpos.layout import Text
from mmpos.table import Table, build
from recipes.data.tables import table_batch, vocab


def _cells(b, v):
    """(B, R, C) values and marks decoded from the tokens (cell_tokens=1 or 2, col_sep 0 or 1)."""
    table = b.tokens[:, b.prefix : -1].view(b.tokens.shape[0], b.rows, -1)
    assert (table[:, :, -1] == v["row_end"]).all()
    cells = table[:, :, :-1].reshape(b.tokens.shape[0], b.rows, b.cols, -1)
    if b.col_sep:
        assert (cells[..., -1] == v["col_sep"]).all()
    if b.cell_tokens == 1:
        return cells[..., 0] % 10, cells[..., 0] // 10
    return cells[..., 0], cells[..., 1] - 10


@pytest.mark.parametrize(("cell_tokens", "col_sep"), [(1, 0), (2, 1)])
def test_count_answers(cell_tokens, col_sep):
    v = vocab()
    b = table_batch("count", 5, 7, 64, seed=0, cell_tokens=cell_tokens, col_sep=col_sep)
    _values, marks = _cells(b, v)
    assert (b.tokens[:, :2] == torch.tensor([v["bos"], v["task_count"]])).all() and (
        b.tokens[:, -1] == v["query"]
    ).all()
    for i in range(64):
        (r,), (c,) = torch.nonzero(marks[i] == 2, as_tuple=True)
        stars = (marks[i] == 1).clone()
        assert b.answer[i] == stars[r].sum() + stars[:, c].sum()
    assert set(b.answer.tolist()) == {0, 1, 2, 3}


@pytest.mark.parametrize("axis_aligned", [False, True])
def test_offset_answers(axis_aligned):
    v = vocab()
    b = table_batch("offset", 4, 6, 64, seed=1, cell_tokens=2, col_sep=1, axis_aligned=axis_aligned)
    values, marks = _cells(b, v)
    dr, dc = b.tokens[:, 2] - v["dr0"], b.tokens[:, 3] - v["dc0"]
    assert ((dr > 0) | (dc > 0)).all() and dr.max() <= 2 and dc.max() <= 2
    if axis_aligned:
        assert ((dr == 0) | (dc == 0)).all()
    for i in range(64):
        (r,), (c,) = torch.nonzero(marks[i] == 1, as_tuple=True)
        assert b.answer[i] == values[i, r + dr[i], c + dc[i]]


def test_deterministic_and_matches_table_layout():
    a = table_batch("offset", 3, 4, 8, seed=5)
    assert torch.equal(a.tokens, table_batch("offset", 3, 4, 8, seed=5).tokens)
    lay = build([[Text(a.prefix), Table.grid(3, 4, 1, col_sep=0, row_end=1, rule_rows=False), Text(1)]])
    assert lay.order_coords.num_tokens == a.tokens.shape[1]
    cell_tokens = lay.cell[0, :, 0] >= 0
    assert (a.tokens[:, cell_tokens] < 30).all() and (a.tokens[:, ~cell_tokens] >= 30).all()


def test_validation():
    with pytest.raises(ValueError, match="task"):
        table_batch("sum", 3, 3, 2, 0)
    with pytest.raises(ValueError, match="max_offset"):
        table_batch("offset", 2, 5, 2, 0)
    with pytest.raises(ValueError, match="cell_tokens"):
        table_batch("count", 3, 3, 2, 0, cell_tokens=3)
