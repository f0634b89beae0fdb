"""mmpos.table: serialisation, cell coordinates, orders of ragged and multi-token tables."""

import pytest
import torch

from mmpos.layout import Image, Text
from mmpos.table import ORDERS, Table, build, order_axes, serialise


def test_orders_of_a_rectangular_table_follow_the_reference_tx_ty():
    # 2 x 2 cells of one token, '|' after each cell, '<SEP>' per row: items per row [c, |, c, |, SEP]
    layout = build([[Text(2), Table.grid(2, 2, rule_rows=False), Text(2)]], orders=("row", "col"))
    row, col = layout.order_coords.pos[0].long().unbind(-1)
    assert row.tolist() == list(range(14))
    # column-major over items: (0,c0)=2 (1,c0)=3 (0,|)=4 (1,|)=5 (0,c1)=6 (1,c1)=7 (0,|)=8 (1,|)=9 (0,SEP)=10 (1,SEP)=11
    assert col.tolist() == [0, 1, 2, 4, 6, 8, 10, 3, 5, 7, 9, 11, 12, 13]
    assert layout.next_position.tolist() == [14]
    assert layout.cell[0, 2:12].tolist() == [
        [0, 0, 0], [-1, -1, -1], [0, 1, 0], [-1, -1, -1], [-1, -1, -1],
        [1, 0, 0], [-1, -1, -1], [1, 1, 0], [-1, -1, -1], [-1, -1, -1],
    ]  # fmt: skip


def test_default_layout_has_the_references_rule_rows():
    # the reference serialises a rule row after every row; the compact layout is rule_rows=False
    assert Table.grid(2, 2) == Table.grid(2, 2, rule_rows=True)
    ser, compact = serialise(Table.grid(2, 2)), serialise(Table.grid(2, 2, rule_rows=False))
    assert (ser.num_tokens, compact.num_tokens) == (20, 10)  # 4 item rows [c, |, c, |, SEP] instead of 2
    assert int(ser.item_row.max()) == 3 and int(compact.item_row.max()) == 1


def test_multi_token_cells_stay_contiguous_in_every_order():
    t = Table(((1, 3), (2, 1)), col_sep=0, row_end=0, rule_rows=False)
    ser = serialise(t)
    for name in ORDERS:
        pos = ser.orders[name]
        assert sorted(pos.tolist()) == list(range(7))  # a permutation of the table's positions
        for r, c in [(0, 1), (1, 0)]:
            tokens = (ser.cell[:, 0] == r) & (ser.cell[:, 1] == c)
            assert pos[tokens].diff().eq(1).all()
    assert ser.orders["col"].tolist() == [0, 3, 4, 5, 1, 2, 6]  # (0,0) (1,0)x2 (0,1)x3 (1,1)
    assert ser.cell[:, 2].tolist() == [0, 0, 1, 2, 0, 1, 0]


def test_ragged_tables_keep_every_token_and_end_rows_in_one_column():
    t = Table(((1, 1, 1), (1,), (1, 1)), rule_rows=True)
    layout = build([[Text(1), t, Text(3)]], orders=ORDERS)
    pos = layout.order_coords.pos[0].long()
    n = layout.order_coords.num_tokens
    for k in range(len(ORDERS)):
        assert sorted(pos[:, k].tolist()) == list(range(n))
        assert torch.equal(pos[-3:, k], torch.arange(n - 3, n))  # text after: same positions in every order
    grid = layout.grid_coords.pos[0].long()
    ends = torch.tensor([False] * 1 + [False] * (n - 4) + [False] * 3)
    ser = serialise(t)
    ends[1 : 1 + ser.num_tokens] = ser.item_col == 6  # 3 cells with '|' -> row end in item column 6
    assert ends.sum() == 6  # every data and rule row ends there
    assert (grid[ends, 1] == 1 + 6).all()
    assert layout.next_grid.tolist() == [1 + max(6, 7) + 3]  # 6 item rows, 7 item columns


def test_batch_padding_and_decode_positions():
    samples = [[Text(1), Table.grid(1, 2, rule_rows=False)], [Text(2), Table(((2,), (1, 1)), rule_rows=False), Text(1)]]
    for side in ("right", "left"):
        layout = build(samples, orders=("row", "col"), padding_side=side)
        mask = layout.mask
        assert mask.sum(1).tolist() == [6, 12]
        assert (layout.order_coords.pos[~mask] == 0).all() and (layout.cell[~mask] == -1).all()
        assert layout.next_position.tolist() == [6, 12]
        assert layout.decode(2)[:, :, 0].tolist() == [[6, 7], [12, 13]]
        assert layout.table_mask.sum(1).tolist() == [5, 9]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"cells": ()}, ValueError, "non-empty"),
        ({"cells": ((1,), ())}, ValueError, r"cells\[1\]"),
        ({"cells": ((1, 0),)}, ValueError, r"cells\[0\]\[1\]"),
        ({"cells": ((1,),), "col_sep": -1}, ValueError, "col_sep"),
        ({"cells": ((1,),), "rule_rows": 1}, TypeError, "rule_rows"),
        ({"cells": ((True,),)}, ValueError, r"Table.cells\[0\]\[0\] must be a positive int, got True"),
        ({"cells": ((2.0,),)}, ValueError, r"Table.cells\[0\]\[0\] must be a positive int, got 2.0"),
        ({"cells": ((1,),), "row_end": 1.0}, ValueError, r"Table.row_end must be an int >= 0, got 1.0"),
        ({"cells": ((1,),), "header": "yes"}, TypeError, r"Table.header must be a bool \(True or False\)"),
    ],
)
def test_table_validation(kwargs, error, match):
    with pytest.raises(error, match=match):
        Table(**kwargs)


def test_table_counts_accept_numpy_ints_as_plain_ints():
    np = pytest.importorskip("numpy")
    t = Table(((np.int64(2), 1),), col_sep=np.int32(0))
    assert t == Table(((2, 1),), col_sep=0) and type(t.cells[0][0]) is int and type(t.col_sep) is int
    assert build([[t]]).order_coords.num_tokens == build([[Table(((2, 1),), col_sep=0)]]).order_coords.num_tokens


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: Table.grid(0, 2), "rows must be a positive int, got 0"),
        (lambda: Table.grid(2, True), "cols must be a positive int, got True"),
        (lambda: Table.grid(2, 2, cell_tokens=1.5), "cell_tokens must be a positive int, got 1.5"),
        (lambda: build([[Table.grid(2, 2)]]).decode(0), "num_new must be a positive int, got 0"),
    ],
)
def test_grid_and_decode_counts(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_build_validation():
    t = Table.grid(2, 2)
    with pytest.raises(ValueError, match="orders"):
        build([[t]], orders=("row", "zigzag"))
    with pytest.raises(TypeError, match="orders"):
        order_axes("row")
    with pytest.raises(ValueError, match="padding_side"):
        build([[t]], padding_side="up")
    with pytest.raises(TypeError, match="Image"):
        build([[Text(1), Image((1, 2, 2))]])
    with pytest.raises(ValueError, match="samples"):
        build([t])


def test_layout_build_reads_tables_as_text_runs_under_every_scheme():
    from mmpos import layout as mm

    t = Table(((1, 2), (3,)), rule_rows=True)
    sample = [Text(2), t, Text(3)]
    flat = mm.build([sample], "flat")
    rows = build([sample], orders=("row",))
    assert torch.equal(flat.coords.pos[..., 0], rows.order_coords.pos[..., 0])
    mixed = mm.build([[Text(2), t, mm.Image((1, 4, 4)), Text(1)]], "qwen2-vl")
    n = 2 + serialise(t).num_tokens
    pos = mixed.position_ids[:, 0, :n]
    assert torch.equal(pos, torch.arange(n).expand(3, n))  # table tokens: text positions on every axis
    assert (mixed.modality[0, n : n + 4] == 1).all() and mixed.position_ids[0, 0, -1] == n + 2


def test_expand_gives_one_samples_layout_to_a_batch_without_a_copy():
    one = build([[Text(2), Table.grid(2, 2)]])
    three = one.expand(3)
    assert three.order_coords.pos.shape[0] == three.cell.shape[0] == three.next_grid.shape[0] == 3
    for name in ("cell", "table_mask", "next_position", "next_grid"):
        assert torch.equal(getattr(three, name)[2], getattr(one, name)[0]), name
        assert getattr(three, name).data_ptr() == getattr(one, name).data_ptr(), name  # a view
    assert torch.equal(three.order_coords.pos[1], one.order_coords.pos[0]) and three.orders == one.orders
    assert torch.equal(three.decode(2)[1], one.decode(2)[0])
    with pytest.raises(ValueError, match="expand\\(\\) needs batch size 1, got 3"):
        three.expand(4)
    with pytest.raises(ValueError, match="expand\\(\\) needs a positive int batch, got 0"):
        one.expand(0)


def test_order_and_grid_coordinates_have_distinct_axes():
    layout = build([[Text(1), Table.grid(2, 2)]], orders=("col", "diag"))
    assert layout.order_coords.axes == order_axes(("col", "diag")) == ("col_order", "diag_order")
    assert layout.grid_coords.axes == ("row", "col") and layout.orders == ("col", "diag")
    assert not set(layout.order_coords.axes) & set(layout.grid_coords.axes)
