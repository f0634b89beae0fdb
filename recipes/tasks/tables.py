"""``table_proxy``: the 2D-TPE proxy tasks (Counting-Stars, Locating-Values) on synthetic tables.

Data: :mod:`recipes.data.tables` (``R x C`` tables, the two tasks of 2D-TPE, arXiv:2409.19700).
Training tables have ``R, C`` drawn uniformly in ``[data.train_min, data.train_max]`` (one
shape and one task per step, the tasks alternating); evaluation on fixed sets at each of
``data.eval_sizes`` (also larger than any training table, without fine-tuning).

Model: a small causal pre-norm transformer (:class:`TableLM`); the answer is read at the last
token. Encoders (``encoders:`` of the recipe):

* ``rope`` -- flat 1-D RoPE on the serialised (row-major) token positions;
* ``rope-axial`` -- axial RoPE over ``("row", "col")`` (:attr:`mmpos.table.TableLayout.grid_coords`:
  text on the diagonal, each table token at its item row and column);
* ``2d-tpe`` -- :class:`mmpos.nn.TPEAttention` over the row-major and column-major orders, with
  the router entropy over table tokens added to the loss (weight ``data.entropy_weight``; 1 in
  the paper).

Metrics: ``acc`` (both tasks, at ``data.eval_sizes[0]``, ranks runs) and ``<task>@RxC``.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from typing import Any

import torch
import torch.nn.functional as F
from timm.layers import Mlp
from torch import Tensor, nn

from mmpos import create
from mmpos.coords import Coords
from mmpos.layout import Text
from mmpos.nn import Attention, TPEAttention, router_entropy_loss
from mmpos.runner.tasks import Task, register_task
from mmpos.table import Table, TableLayout, build, order_axes

from ..data.tables import TASKS, table_batch, vocab

__all__ = ["ENCODERS", "TableLM", "table_layout"]

ENCODERS = ("rope", "rope-axial", "2d-tpe")

DEFAULTS: dict[str, Any] = {
    "model": {"dim": 64, "depth": 3, "num_heads": 4, "mlp_ratio": 2.0, "theta": 10000.0, "axial_theta": 100.0},
    "data": {
        "tasks": ["count", "offset"],
        "num_values": 10,
        "cell_tokens": 1,
        "col_sep": 0,
        "max_count": 3,
        "max_offset": 2,
        "axis_aligned": True,
        "train_min": 3,
        "train_max": 8,
        "eval_sizes": [[6, 6], [12, 12], [16, 16]],
        "eval_size": 256,
        "eval_batch": 64,
        "eval_seed": 20_240_929,
        "entropy_weight": 1.0,
    },
}


@lru_cache(maxsize=256)
def table_layout(prefix: int, rows: int, cols: int, cell_tokens: int, col_sep: int) -> TableLayout:
    """The layout of one sample of :mod:`recipes.data.tables`: ``prefix`` text tokens, the table, one token."""
    table = Table.grid(rows, cols, cell_tokens, col_sep=col_sep, row_end=1, rule_rows=False)
    return build([[Text(prefix), table, Text(1)]], orders=("row", "col"))


class _Block(nn.Module):
    def __init__(self, dim: int, attn: nn.Module, mlp_ratio: float) -> None:
        super().__init__()
        self.norm1, self.attn, self.norm2 = nn.LayerNorm(dim), attn, nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=nn.GELU)

    def forward(self, x: Tensor, coords: Coords) -> Tensor:
        x = x + self.attn(self.norm1(x), coords)
        return x + self.mlp(self.norm2(x))


class TableLM(nn.Module):
    """Token embedding, ``depth`` causal pre-norm blocks, the answer head on the last token.

    ``forward(tokens (B, L), layout) -> (B, num_classes)``; ``encoder`` is one of :data:`ENCODERS`.
    """

    def __init__(
        self,
        vocab_size: int,
        num_classes: int,
        encoder: str,
        dim: int = 64,
        depth: int = 3,
        num_heads: int = 4,
        mlp_ratio: float = 2.0,
        theta: float = 10000.0,
        axial_theta: float = 100.0,
    ) -> None:
        super().__init__()
        if encoder not in ENCODERS:
            raise ValueError(f"encoder must be one of {ENCODERS}, got {encoder!r}")
        self.encoder = encoder

        def attn() -> nn.Module:
            if encoder == "2d-tpe":
                return TPEAttention(
                    dim, num_heads, order_axes(("row", "col")), qkv_bias=True, proj_bias=True, theta=theta
                )
            if encoder == "rope":
                rot = create("rope", dim=dim, num_heads=num_heads, theta=theta)
            else:
                rot = create("rope-axial", dim=dim, num_heads=num_heads, axes=("row", "col"), theta=axial_theta)
            return Attention(dim, num_heads, encoders=[rot], causal=True)

        self.embed = nn.Embedding(vocab_size, dim)
        self.blocks = nn.ModuleList(_Block(dim, attn(), mlp_ratio) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def coords(self, layout: TableLayout) -> Coords:
        """The coordinates this model's encoder reads from a :class:`~mmpos.table.TableLayout`."""
        if self.encoder == "2d-tpe":
            return layout.order_coords
        if self.encoder == "rope-axial":
            return layout.grid_coords
        return layout.order_coords.select(*order_axes(("row",)))  # the serialisation order, read as 1-D positions

    def features(self, tokens: Tensor, layout: TableLayout) -> Tensor:
        """``(B, L, dim)``: every token after the blocks (before the final norm)."""
        coords = self.coords(layout)
        if self.encoder == "rope":
            coords = Coords(coords.pos, ("seq",), mask=coords.mask)
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, coords)
        return x

    def forward(self, tokens: Tensor, layout: TableLayout) -> Tensor:
        return self.head(self.norm(self.features(tokens, layout)[:, -1]))


@register_task("table_proxy", defaults=DEFAULTS)
def build_task(cfg: dict[str, Any], encoder: str, seed: int, device: torch.device) -> Task:
    m, d = cfg["model"], cfg["data"]
    tasks = list(d["tasks"])
    if not tasks or any(t not in TASKS for t in tasks):
        raise ValueError(f"data.tasks must be a non-empty list of {TASKS}, got {tasks!r}")
    if not 1 <= d["train_min"] <= d["train_max"]:
        raise ValueError(f"data.train_min <= data.train_max must hold (>= 1), got {d['train_min']}, {d['train_max']}")
    sizes = [tuple(s) for s in d["eval_sizes"]]
    if not sizes or any(len(s) != 2 for s in sizes):
        raise ValueError(f"data.eval_sizes must be a non-empty list of [rows, cols], got {d['eval_sizes']!r}")
    kw = {k: d[k] for k in ("num_values", "cell_tokens", "col_sep", "max_count", "max_offset", "axis_aligned")}
    v = vocab(d["num_values"], d["max_offset"])
    torch.manual_seed(seed)
    model = TableLM(v["size"], d["num_values"], encoder, **{k: m[k] for k in DEFAULTS["model"]})

    def layout_of(shape: tuple[int, ...], b: int) -> TableLayout:
        lay = table_layout(*shape).expand(b)
        on = {"order_coords": lay.order_coords.to(device), "grid_coords": lay.grid_coords.to(device)}
        return replace(lay, **on, table_mask=lay.table_mask.to(device))

    evals = {}
    for i, (rows, cols) in enumerate(sizes):
        for j, task in enumerate(tasks):
            batch = table_batch(task, rows, cols, d["eval_size"], d["eval_seed"] + 1000 * i + j, **kw)
            evals[(task, rows, cols)] = batch

    def train_batch(step: int):
        g = torch.Generator().manual_seed((seed + 1) * 1_000_003 + step)
        rows, cols = torch.randint(d["train_min"], d["train_max"] + 1, (2,), generator=g).tolist()
        task = tasks[step % len(tasks)]
        batch = table_batch(task, rows, cols, cfg["batch_size"], int(torch.randint(2**62, (1,), generator=g)), **kw)
        return {"tokens": batch.tokens, "answer": batch.answer, "shape": _shape(batch)}

    def loss(model: nn.Module, batch):
        tokens, answer = batch["tokens"], batch["answer"]
        lay = layout_of(tuple(batch["shape"]), tokens.shape[0])
        logits = model(tokens, lay)
        ce = F.cross_entropy(logits, answer)
        stats = {"train_acc": (logits.argmax(-1) == answer).float().mean().item()}
        inner = getattr(model, "module", model)
        if inner.encoder == "2d-tpe" and d["entropy_weight"]:
            ent = router_entropy_loss(inner, lay.table_mask)
            stats["router_entropy"] = ent.item()
            return ce + d["entropy_weight"] * ent, stats
        return ce, stats

    def evaluate(model: nn.Module) -> dict[str, float]:
        out = {}
        for (task, rows, cols), batch in evals.items():
            correct = 0
            for s in range(0, batch.tokens.shape[0], d["eval_batch"]):
                tokens = batch.tokens[s : s + d["eval_batch"]]
                pred = model(tokens.to(device), layout_of(_shape(batch), tokens.shape[0])).argmax(-1).cpu()
                correct += (pred == batch.answer[s : s + d["eval_batch"]]).sum().item()
            out[f"{task}@{rows}x{cols}"] = correct / batch.tokens.shape[0]
        first = sizes[0]
        out["acc"] = sum(out[f"{t}@{first[0]}x{first[1]}"] for t in tasks) / len(tasks)
        return out

    return Task(model=model, train_batch=train_batch, loss=loss, evaluate=evaluate, metric="acc")


def _shape(batch) -> tuple[int, int, int, int, int]:
    """The arguments of :func:`table_layout` for a :class:`~recipes.data.tables.TableBatch`."""
    return batch.prefix, batch.rows, batch.cols, batch.cell_tokens, batch.col_sep
