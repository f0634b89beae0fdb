"""``tpe_neighbours``: dense "value of the cell above / to the left" on real tables wider than in training.

Paper: Li et al. 2024, "2D-TPE: Two-Dimensional Positional Encoding Enhances Table Understanding
for Large Language Models" (arXiv:2409.19700). Sec. 3 routes every attention head between the
row-major and the column-major order of the table (a router with an entropy loss), Sec. 4.4
(Figs. 4-5) reports that 2D-TPE keeps its accuracy on tables larger than seen in training
where 1-D RoPE over the row-major serialisation does not. In row-major order the cell above is
``cols + 1`` tokens back (the width changes with the table); in column-major order it is the
previous token, and in ``(row, col)`` coordinates a fixed ``(-1, 0)`` offset.

Task: every cell of a table predicts the value of the cell above it (rows after the first) and of
the cell to its left (columns after the first): dense targets, one hop. Values are real:
windows of scikit-learn's bundled breast-cancer table, each column in ``data.num_values``
quantile bins (:mod:`recipes.data.real_tables`; needs scikit-learn, the ``data`` extra).
Train on ``data.train_rows`` x ``data.train_cols`` (widths 3-8), evaluate on ``data.eval_sizes``
(widths 12 and 16, rows from held-out table rows); ``wide_above`` (the mean "above"
accuracy over the eval sizes wider than any training table) ranks runs.

Encoders (:class:`recipes.tasks.tables.TableLM` with one output per token): ``rope`` (flat 1-D
RoPE, the baseline), ``rope-axial`` (RoPE over ``(row, col)``, the positive control: the
offset is constant in its coordinates, it must reach 90 %), ``2d-tpe`` (router entropy weight
``data.entropy_weight`` throughout, as the paper) and ``2d-tpe@anneal`` (the weight decays
linearly to 0 over the first ``data.anneal_fraction`` of the steps).

Shapes: tokens ``(B, L)``; targets ``(B, L, 2)`` (above, left; ``-100`` where there is none).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmpos.nn import router_entropy_loss
from mmpos.runner.tasks import Task, parse_encoders, register_task
from mmpos.table import TableLayout

from ..data.real_tables import binned_table, table_windows
from .tables import TableLM, table_layout

__all__ = ["DenseTableLM", "neighbour_batch"]

ENCODERS = ("rope", "rope-axial", "2d-tpe")

DEFAULTS: dict[str, Any] = {
    "model": {"dim": 64, "depth": 2, "num_heads": 4, "mlp_ratio": 2.0, "theta": 10000.0, "axial_theta": 100.0},
    "data": {
        "dataset": "breast_cancer",
        "num_values": 10,
        "train_rows": [3, 6],
        "train_cols": [3, 8],
        "eval_sizes": [[6, 6], [6, 12], [6, 16]],
        "eval_size": 64,
        "entropy_weight": 1.0,
        "anneal_fraction": 0.5,
    },
}


class DenseTableLM(TableLM):
    """:class:`~recipes.tasks.tables.TableLM` with its head on every token: ``(B, L, num_classes)``."""

    def forward(self, tokens: Tensor, layout: TableLayout) -> Tensor:
        return self.head(self.norm(self.features(tokens, layout)))


def neighbour_batch(values: Tensor, num_values: int) -> tuple[Tensor, Tensor]:
    """``(tokens (B, L), targets (B, L, 2))`` of windows ``values (B, R, C)``.

    Tokens: ``BOS``, each row's cells then ``ROW_END``, a final ``END`` token (ids ``num_values``,
    ``+1``, ``+2``); targets: the value above and to the left of each cell, ``-100`` elsewhere.
    """
    b, r, _ = values.shape
    above = torch.full_like(values, -100)
    above[:, 1:] = values[:, :-1]
    left = torch.full_like(values, -100)
    left[:, :, 1:] = values[:, :, :-1]
    pad = torch.full((b, r, 1), -100)
    targets = torch.stack([torch.cat([above, pad], 2).flatten(1), torch.cat([left, pad], 2).flatten(1)], -1)
    row_end = torch.full((b, r, 1), num_values + 1)
    tokens = torch.cat([torch.full((b, 1), num_values), torch.cat([values, row_end], 2).flatten(1)], 1)
    tokens = torch.cat([tokens, torch.full((b, 1), num_values + 2)], 1)
    none = torch.full((b, 1, 2), -100)
    return tokens, torch.cat([none, targets, none], 1)


@register_task("tpe_neighbours", defaults={**DEFAULTS, "validation": {}})
def build_task(cfg: dict[str, Any], encoder: str, seed: int, device: torch.device) -> Task:
    ((name, option),) = parse_encoders(encoder, {"2d-tpe": ("anneal",)}, combine=False).items
    if name not in ENCODERS:
        raise ValueError(f"tpe_neighbours: encoder must be one of {ENCODERS} or '2d-tpe@anneal', got {encoder!r}")
    m, d = cfg["model"], cfg["data"]
    v = d["num_values"]
    table = binned_table(d["dataset"], v)
    model = DenseTableLM(v + 3, 2 * v, name, **{k: m[k] for k in DEFAULTS["model"]})
    w0, steps = float(d["entropy_weight"]), max(1, int(cfg["steps"] * float(d["anneal_fraction"])))

    def layout_of(rows: int, cols: int, b: int) -> TableLayout:
        lay = table_layout(1, rows, cols, 1, 0).expand(b)
        on = {"order_coords": lay.order_coords.to(device), "grid_coords": lay.grid_coords.to(device)}
        return replace(lay, **on, table_mask=lay.table_mask.to(device))

    def weight(step: int) -> float:
        if name != "2d-tpe":
            return 0.0
        return w0 * max(0.0, 1.0 - step / steps) if option == "anneal" else w0

    def train_batch(step: int):
        g = torch.Generator().manual_seed(seed * 1_000_003 + step)
        rows = int(torch.randint(d["train_rows"][0], d["train_rows"][1] + 1, (1,), generator=g))
        cols = int(torch.randint(d["train_cols"][0], d["train_cols"][1] + 1, (1,), generator=g))
        tokens, targets = neighbour_batch(table_windows(table, cfg["batch_size"], rows, cols, g, "train"), v)
        b = tokens.shape[0]
        return {
            "tokens": tokens,
            "targets": targets,
            "shape": torch.tensor([[rows, cols]]).expand(b, 2),
            "weight": torch.full((b,), weight(step)),
        }

    def logits_of(model: nn.Module, tokens: Tensor, rows: int, cols: int) -> tuple[Tensor, TableLayout]:
        lay = layout_of(rows, cols, tokens.shape[0])
        return model(tokens, lay).unflatten(-1, (2, v)), lay  # (B, L, 2, V)

    def loss(model: nn.Module, batch):
        tokens, targets = batch["tokens"], batch["targets"]
        rows, cols = (int(x) for x in batch["shape"][0])
        logits, lay = logits_of(model, tokens, rows, cols)
        keep = targets >= 0
        ce = F.cross_entropy(logits[keep], targets[keep])
        stats = {"train_acc": (logits[keep].argmax(-1) == targets[keep]).float().mean().item()}
        w = float(batch["weight"][0])
        if name == "2d-tpe":
            ent = router_entropy_loss(getattr(model, "module", model), lay.table_mask)
            stats["router_entropy"], stats["entropy_weight"] = ent.item(), w
            return ce + w * ent, stats
        return ce, stats

    held = {}
    for i, (rows, cols) in enumerate(d["eval_sizes"]):
        g = torch.Generator().manual_seed(10_000 + i)
        held[(rows, cols)] = neighbour_batch(table_windows(table, d["eval_size"], rows, cols, g, "test"), v)
    widest = max(d["train_cols"][1], 0)

    def evaluate(model: nn.Module) -> dict[str, float]:
        out = {}
        for (rows, cols), (tokens, targets) in held.items():
            hits, total = torch.zeros(2), torch.zeros(2)
            for i in range(0, len(tokens), 32):
                t, y = tokens[i : i + 32].to(device), targets[i : i + 32].to(device)
                pred = logits_of(model, t, rows, cols)[0].argmax(-1)
                keep = y >= 0
                hits += ((pred == y) & keep).sum((0, 1)).cpu().float()
                total += keep.sum((0, 1)).cpu().float()
            out[f"above@{rows}x{cols}"], out[f"left@{rows}x{cols}"] = (hits / total).tolist()
        wide = [out[f"above@{r}x{c}"] for r, c in held if c > widest]
        out["wide_above"] = sum(wide) / len(wide) if wide else float("nan")
        return out

    return Task(model=model, train_batch=train_batch, loss=loss, evaluate=evaluate, metric="wide_above")
