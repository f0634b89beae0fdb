"""Tables in a token sequence: serialisation, cell coordinates and the 1-D orders of 2D-TPE.

Paper: Li et al., "2D-TPE: Two-Dimensional Positional Encoding Enhances Table Understanding
for Large Language Models", 2024, https://arxiv.org/abs/2409.19700. Reference:
JinaLeejnl/2D-TPE ``src/sft_minicpm.py`` (``encode_and_insert_separators`` and the ``tx`` /
``ty`` / ``px`` / ``py`` ids of ``SupervisedDataset``), read for the conventions below.

A :class:`Table` is given by the token count of every cell, row by row (row 0 is the header
when ``header=True``); rows may hold different numbers of cells (ragged tables). It is
serialised row by row, as in the reference: each row is ``cell, '|', cell, '|', ..., '<SEP>'``
(``col_sep`` tokens after every cell, ``row_end`` tokens closing the row), optionally
followed by a rule row of one-token ``'-'`` items (``rule_rows=True``). The serialised
*items* (a cell, a separator) form a grid with item rows ``r`` and item columns ``c``
(cell ``j`` of a row at ``c = 2 j`` when ``col_sep > 0``, else ``c = j``; the row end in the
last item column of the whole table, so that ragged rows end in one column).

:func:`build` turns a batch of samples -- lists of :class:`~mmpos.layout.Text` and
:class:`Table` segments -- into a :class:`TableLayout`:

* ``orders`` -- one 1-D position per token under each traversal of the table items
  (:data:`ORDERS`), on the axes :func:`order_axes` names (``"row_order"``, ``"col_order"``,
  ``"diag_order"``: never the grid's ``"row"`` / ``"col"``, so order positions and grid
  coordinates cannot be mistaken for each other): ``"row"`` (row-major, the serialisation order), ``"col"``
  (column-major), ``"diag"`` (anti-diagonals ``r + c``, top to bottom). The tokens of an item
  stay contiguous in every order. Text before and after a table gets the same sequential
  positions under every order (the reference's ``tx`` / ``ty``); a table occupies as many
  positions as it has tokens under every order, so text after it continues at the same
  position everywhere.
* ``grid`` -- axial coordinates ``("row", "col")``: a table token gets ``start + r`` and
  ``start + c`` (every token of an item shares them, as the reference's ``px`` / ``py``), text
  gets its sequential position on both axes, and text after a table continues at
  ``start + max(rows, cols)`` (the Qwen2-VL convention for a vision block).
* ``cell`` -- ``(row, column, token-in-cell)`` of every token of a table *cell* (table row
  and table column, not item indices), ``-1`` elsewhere (separators, text, padding).

Importing this module also teaches :func:`mmpos.layout.build` the :class:`Table` segment
(through :func:`mmpos.layout.register_segment`): under every multimodal scheme a table is a run
of text tokens at its serialised positions (its ``"row"`` order), so tables mix with text,
images and videos in one sequence; the other orders and the cell coordinates come from
:func:`build`, which lays out text and tables.

Shapes: ``B`` samples padded to ``L`` tokens; ``K = len(orders)``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ._validate import check_bool, check_int
from .coords import Coords, Modality
from .layout import Image, Text, Unit, Video, register_segment

__all__ = ["ORDERS", "ORDER_SUFFIX", "Table", "TableLayout", "build", "order_axes", "serialise"]

#: the traversals a :class:`TableLayout` can hold (see the module docstring)
ORDERS = ("row", "col", "diag")
#: the suffix of every order axis: traversal ``"row"`` is the axis ``"row_order"`` of :attr:`TableLayout.order_coords`
ORDER_SUFFIX = "_order"
_CELL, _SEP = 0, 1


def order_axes(orders: Sequence[str] = ("row", "col")) -> tuple[str, ...]:
    """The :class:`~mmpos.coords.Coords` axis names of the traversals ``orders`` (names from :data:`ORDERS`).

    ``order_axes(("row", "col")) == ("row_order", "col_order")``: the axes of
    :attr:`TableLayout.order_coords` and the default ``orders`` of :class:`mmpos.nn.TPEAttention`.
    """
    if isinstance(orders, str) or not isinstance(orders, Sequence):
        raise TypeError(f"orders must be a sequence of names from {ORDERS}, got {orders!r}")
    orders = tuple(orders)
    if not orders or any(o not in ORDERS for o in orders) or len(set(orders)) != len(orders):
        raise ValueError(f"orders must be distinct names from {ORDERS}, got {orders!r}")
    return tuple(o + ORDER_SUFFIX for o in orders)


@dataclass(frozen=True)
class Table:
    """A table segment: ``cells[i][j]`` is the token count of cell ``j`` of row ``i``.

    Args:
        cells: rows of cell token counts (each ``>= 1``); rows may differ in length (ragged),
            but each row holds at least one cell.
        header: row 0 is a header row (recorded; it is serialised like the other rows).
        col_sep: tokens of the separator after every cell (the reference's ``'|'``; 0 for none).
        row_end: tokens closing every row (the reference's ``'<SEP>'``; 0 for none).
        rule_rows: a rule row after every row (``'-'`` per cell, with the same separators), as
            the reference's serialisation always inserts (JinaLeejnl/2D-TPE); ``False`` for the
            compact layout without them.
    """

    cells: tuple[tuple[int, ...], ...]
    header: bool = False
    col_sep: int = 1
    row_end: int = 1
    rule_rows: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.cells, (str, bytes)) or not isinstance(self.cells, Sequence) or len(self.cells) == 0:
            raise ValueError(f"Table.cells must be a non-empty sequence of rows, got {self.cells!r}")
        rows = []
        for i, row in enumerate(self.cells):
            if isinstance(row, (str, bytes)) or not isinstance(row, Sequence) or len(row) == 0:
                raise ValueError(f"Table.cells[{i}] must be a non-empty sequence of cell token counts, got {row!r}")
            rows.append(tuple(check_int(n, f"Table.cells[{i}][{j}]") for j, n in enumerate(row)))
        object.__setattr__(self, "cells", tuple(rows))
        for name in ("col_sep", "row_end"):
            object.__setattr__(self, name, check_int(getattr(self, name), f"Table.{name}", 0))
        for name in ("header", "rule_rows"):
            check_bool(getattr(self, name), f"Table.{name}")

    @classmethod
    def grid(cls, rows: int, cols: int, cell_tokens: int = 1, **kwargs) -> Table:
        """A rectangular ``rows x cols`` table whose cells all hold ``cell_tokens`` tokens."""
        rows, cols, cell_tokens = (
            check_int(rows, "rows"),
            check_int(cols, "cols"),
            check_int(cell_tokens, "cell_tokens"),
        )
        return cls(tuple((cell_tokens,) * cols for _ in range(rows)), **kwargs)

    @property
    def num_rows(self) -> int:
        return len(self.cells)

    @property
    def num_cols(self) -> int:
        """The longest row's cell count."""
        return max(len(r) for r in self.cells)

    @property
    def num_tokens(self) -> int:
        return serialise(self).num_tokens


@dataclass(frozen=True, eq=False)
class _Serialised:
    """One table's tokens in serialisation (row-major) order; all tensors ``(T,)`` int64."""

    item_row: Tensor
    item_col: Tensor
    cell: Tensor  # (T, 3) table row, table column, token in cell; -1 on separators
    orders: dict[str, Tensor] = field(default_factory=dict)  # rank of each token per traversal
    grid_extent: int = 0  # max(item rows, item cols)

    @property
    def num_tokens(self) -> int:
        return self.item_row.shape[0]


def _rank(*keys: Tensor) -> Tensor:
    """Rank of each item under the lexicographic order of ``keys`` (first key most significant)."""
    order = torch.arange(keys[0].shape[0])
    for key in reversed(keys):  # stable sorts, least significant key first
        order = order[torch.sort(key[order], stable=True).indices]
    return torch.empty_like(order).scatter_(0, order, torch.arange(order.shape[0]))


@functools.lru_cache(maxsize=4096)
def serialise(table: Table) -> _Serialised:
    """Serialise ``table`` (row-major) into per-token item coordinates, cell coordinates and orders."""
    if not isinstance(table, Table):
        raise TypeError(f"table must be a Table, got {type(table).__name__}")
    step = 2 if table.col_sep else 1
    last_col = step * table.num_cols  # item column of the row ends
    items = []  # (item row, item col, tokens, table row or -1, table col or -1)
    rows = [(i, row, False) for i, row in enumerate(table.cells)]
    if table.rule_rows:
        rows = [r for i, row, _ in rows for r in ((i, row, False), (i, (1,) * len(row), True))]
    for r, (i, row, rule) in enumerate(rows):
        for j, n in enumerate(row):
            items.append((r, step * j, n, -1 if rule else i, -1 if rule else j))
            if table.col_sep:
                items.append((r, step * j + 1, table.col_sep, -1, -1))
        if table.row_end:
            items.append((r, last_col, table.row_end, -1, -1))
    item = torch.tensor(items, dtype=torch.long)  # (I, 5)
    size = item[:, 2]
    t = int(size.sum())
    token_item = torch.repeat_interleave(torch.arange(item.shape[0]), size, output_size=t)
    first = torch.cumsum(size, 0) - size
    in_item = torch.arange(t) - first[token_item]
    r, c = item[token_item, 0], item[token_item, 1]
    is_cell = item[token_item, 3] >= 0
    cell = torch.stack([item[token_item, 3], item[token_item, 4], torch.where(is_cell, in_item, -1)], dim=-1)
    ranks = {
        "row": _rank(item[:, 0], item[:, 1]),
        "col": _rank(item[:, 1], item[:, 0]),
        "diag": _rank(item[:, 0] + item[:, 1], item[:, 0]),
    }
    orders = {}
    for name, rank in ranks.items():  # token position = tokens of the items before it + index in the item
        before = torch.zeros_like(size).scatter_(0, rank, size)  # sizes in traversal order
        start = (torch.cumsum(before, 0) - before)[rank]  # (I,) first position of each item
        orders[name] = start[token_item] + in_item
    extent = max(len(rows), last_col + (1 if table.row_end else 0))
    return _Serialised(r, c, cell, orders, extent)


def _layout_units(table: Table, scheme: object, merge: int, where: str) -> list[Unit]:
    """:func:`mmpos.layout.build` reads a table as its serialised tokens, in row-major order, as text."""
    return [Unit(int(Modality.TEXT), serialise(table).num_tokens)]


register_segment(Table, _layout_units)


@dataclass(frozen=True, eq=False)
class TableLayout:
    """Positions of a batch of samples with tables (``B`` samples padded to ``L`` tokens).

    Attributes:
        order_coords: :class:`~mmpos.coords.Coords` with ``pos`` ``(B, L, K)``, axes
            :func:`order_axes` ``(orders)`` (e.g. ``("row_order", "col_order")``): axis ``k`` is
            each token's 1-D position under traversal ``k`` (what :class:`mmpos.nn.MultiOrderAttention`
            reads); ``mask`` = real tokens.
        grid_coords: :class:`~mmpos.coords.Coords` with axes ``("row", "col")`` (axial RoPE).
        cell: ``(B, L, 3)`` int64 ``(row, column, token-in-cell)`` of cell tokens, ``-1`` elsewhere.
        table_mask: ``(B, L)`` bool, tokens of a table (cells and separators).
        next_position: ``(B,)`` int64, the position of the token after each sample (the same
            under every order).
        next_grid: ``(B,)`` int64, the same for ``grid_coords``.
        orders: the traversal names (e.g. ``("row", "col")``; the axes of ``order_coords`` are
            :func:`order_axes` of them).
    """

    order_coords: Coords
    grid_coords: Coords
    cell: Tensor
    table_mask: Tensor
    next_position: Tensor
    next_grid: Tensor
    orders: tuple[str, ...]

    @property
    def mask(self) -> Tensor:
        return self.order_coords.token_mask

    def expand(self, batch: int) -> TableLayout:
        """The same layout for ``batch`` samples (from a layout of 1 sample, without a copy), as :meth:`Coords.expand`."""
        order_coords = self.order_coords.expand(batch)  # validates batch and the batch size 1
        n = self.table_mask.shape[1]
        return TableLayout(
            order_coords,
            self.grid_coords.expand(batch),
            self.cell.expand(batch, n, 3),
            self.table_mask.expand(batch, n),
            self.next_position.expand(batch),
            self.next_grid.expand(batch),
            self.orders,
        )

    def decode(self, num_new: int = 1) -> Tensor:
        """Positions ``(B, num_new, K)`` of ``num_new`` text tokens generated after each sample
        (the same under every order, as in the reference's ``tx[-1] + 1``, ``ty[-1] + 1``)."""
        num_new = check_int(num_new, "num_new")
        steps = torch.arange(num_new, device=self.next_position.device)
        pos = (self.next_position[:, None] + steps).to(self.order_coords.pos.dtype)
        return pos.unsqueeze(-1).expand(-1, -1, len(self.orders))


def _sample(segments: Sequence[Text | Table], orders: tuple[str, ...], index: int):
    if isinstance(segments, (Text, Table)) or not isinstance(segments, Sequence) or not segments:
        raise ValueError(f"samples[{index}] must be a non-empty list of Text / Table segments, got {segments!r}")
    order_pos, grid_pos, cell, table = [], [], [], []
    seq = grid = 0  # next position under the orders / on the grid
    for s, seg in enumerate(segments):
        if isinstance(seg, Text):
            ar = torch.arange(seg.n)
            order_pos.append((seq + ar).unsqueeze(-1).expand(-1, len(orders)))
            grid_pos.append((grid + ar).unsqueeze(-1).expand(-1, 2))
            cell.append(torch.full((seg.n, 3), -1, dtype=torch.long))
            table.append(torch.zeros(seg.n, dtype=torch.bool))
            seq, grid = seq + seg.n, grid + seg.n
        elif isinstance(seg, Table):
            ser = serialise(seg)
            order_pos.append(seq + torch.stack([ser.orders[o] for o in orders], dim=-1))
            grid_pos.append(grid + torch.stack([ser.item_row, ser.item_col], dim=-1))
            cell.append(ser.cell)
            table.append(torch.ones(ser.num_tokens, dtype=torch.bool))
            seq, grid = seq + ser.num_tokens, grid + ser.grid_extent
        elif isinstance(seg, (Image, Video)):
            raise TypeError(
                f"samples[{index}][{s}] is an {type(seg).__name__}: mmpos.table.build lays out Text and Table "
                "segments; samples with images and videos go through mmpos.layout.build (tables as text runs)"
            )
        else:
            raise TypeError(f"samples[{index}][{s}] must be a Text or a Table, got {type(seg).__name__}")
    return torch.cat(order_pos), torch.cat(grid_pos), torch.cat(cell), torch.cat(table), seq, grid


def build(
    samples: Sequence[Sequence[Text | Table]],
    orders: Sequence[str] = ("row", "col"),
    padding_side: str = "right",
) -> TableLayout:
    """Lay out a batch of samples made of :class:`~mmpos.layout.Text` and :class:`Table` segments.

    Args:
        samples: one list of segments per sample (any number of tables, any sizes).
        orders: the traversals to compute, names from :data:`ORDERS`, no repeats.
        padding_side: ``"right"`` or ``"left"``; padding gets position 0 and ``mask=False``.
    """
    axes = order_axes(orders)
    orders = tuple(orders)
    if padding_side not in ("right", "left"):
        raise ValueError(f"padding_side must be 'right' or 'left', got {padding_side!r}")
    if isinstance(samples, (Text, Table)) or not isinstance(samples, Sequence) or not samples:
        raise ValueError("samples must be a non-empty list of samples, each a list of Text / Table segments")
    parts = [_sample(segs, orders, i) for i, segs in enumerate(samples)]
    length = max(p[0].shape[0] for p in parts)

    def pad(t: Tensor, value) -> Tensor:
        n = length - t.shape[0]
        filler = t.new_full((n, *t.shape[1:]), value)
        return torch.cat([t, filler] if padding_side == "right" else [filler, t])

    real = torch.stack([pad(torch.ones(p[0].shape[0], dtype=torch.bool), False) for p in parts])
    order_pos = torch.stack([pad(p[0], 0) for p in parts]).float()
    grid_pos = torch.stack([pad(p[1], 0) for p in parts]).float()
    modality = torch.full(real.shape, int(Modality.TEXT), dtype=torch.long)
    return TableLayout(
        order_coords=Coords(order_pos, axes, mask=real, modality=modality),
        grid_coords=Coords(grid_pos, ("row", "col"), mask=real, modality=modality),
        cell=torch.stack([pad(p[2], -1) for p in parts]),
        table_mask=torch.stack([pad(p[3], False) for p in parts]),
        next_position=torch.tensor([p[4] for p in parts], dtype=torch.long),
        next_grid=torch.tensor([p[5] for p in parts], dtype=torch.long),
        orders=orders,
    )
