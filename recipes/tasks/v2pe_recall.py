"""``v2pe_recall``: V2PE against flat positions with random strides, on oracle-token multi-image recall.

Paper: Ge et al. 2024, "V2PE: Improving Multimodal Long-Context Capability of Vision-Language
Models with Variable Visual Position Encoding" (arXiv:2412.09616). Sec. 3 gives visual tokens a
position increment ``delta < 1`` (text keeps 1), Sec. 4 trains with ``delta`` drawn per image
from ``{1, 1/2, ..., 1/256}`` and reports that long multimodal contexts then stay within the
trained position range. The question this task settles: does a gain come from the *small*
visual increment, or from *randomising* the positions in training? The control
``stride@rand`` randomises the positions without shrinking them: each image's tokens step by
an integer stride drawn per image from ``data.strides`` in training (1 at evaluation: flat).

Task (:mod:`recipes.data.recall`): ``K`` images of ``data.cells`` oracle tokens (each a
(key, value) pair), then ``data.queries`` query tokens, each answering the value of the cell
with its key (content-only retrieval). Train on ``data.train_images`` images, evaluate on
``data.eval_images`` (``acc@K``; the largest ranks runs).

Encoders: ``none`` (no position encoding, the positive control: the answer needs no position,
so it must reach 90 %), ``flat`` (1-D RoPE, the baseline), ``v2pe@<delta>`` (fixed visual step),
``v2pe@rand`` (V2PE's draw in training, ``data.eval_delta`` at evaluation), ``stride@rand``.
Positions come from :func:`mmpos.layout.build` (``flat``, ``v2pe``) or, for ``stride@rand``, the
same rule as V2PE's with an integer step: token ``n`` of an image starting at ``p`` sits at
``p - 1 + (n + 1) s``, the text resumes at the next integer.

Shapes: keys / values of the tokens ``(B, L)`` long, positions ``(B, L)`` float64, targets
``(B, Q)`` (the last ``Q`` tokens); logits ``(B, L, num_values)``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmpos.coords import Coords
from mmpos.layout import Image, Text, build
from mmpos.nn import Transformer
from mmpos.runner.tasks import NUMBER, Task, parse_encoders, register_task

from ..data.recall import make_recall

__all__ = ["RecallModel", "recall_positions"]

DEFAULTS: dict[str, Any] = {
    "model": {"dim": 64, "depth": 2, "num_heads": 4, "theta": 100.0},
    "data": {
        "cells": 4,
        "queries": 4,
        "num_keys": 128,
        "num_values": 16,
        "train_images": [2, 4],
        "eval_images": [4, 8, 16],
        "eval_size": 128,
        "eval_delta": 0.0625,
        "strides": [1, 2, 4, 8],
    },
}
_VARIANTS = {"v2pe": ("rand", NUMBER), "stride": ("rand",)}
_ENCODER = {"none": "none", "flat": "rope", "stride": "rope", "v2pe": "v2pe"}


class RecallModel(nn.Module):
    """Key + value embeddings -> causal :class:`mmpos.nn.Transformer` (``pos``) -> value logits.

    ``forward(keys (B, L), values (B, L), pos (B, L)) -> (B, L, num_values)``; keys ``num_keys``
    (BOS) and ``num_keys + 1`` (SEP), value ``num_values`` (none: specials and queries).
    """

    def __init__(self, pos: str, num_keys: int, num_values: int, dim: int, depth: int, num_heads: int, theta: float):
        super().__init__()
        self.key = nn.Embedding(num_keys + 2, dim)
        self.value = nn.Embedding(num_values + 1, dim)
        kwargs = {pos: {"theta": float(theta)}} if pos != "none" else None
        self.decoder = Transformer(dim, depth, num_heads, pos=pos, pos_kwargs=kwargs, causal=True, conv_after=())
        self.head = nn.Linear(dim, num_values)

    def forward(self, keys: Tensor, values: Tensor, pos: Tensor) -> Tensor:
        coords = Coords(pos=pos.unsqueeze(-1), axes=("seq",))
        return self.head(self.decoder(self.key(keys) + self.value(values), coords))


def _segments(images: int, cells: int, queries: int) -> list:
    out: list = [Text(1)]
    for _ in range(images):
        out += [Text(1), Image((1, 1, cells))]
    return [*out, Text(queries)]


def recall_positions(strides: Tensor, cells: int, queries: int) -> Tensor:
    """``(B, L)`` float64 positions of ``stride@rand``: ``strides (B, K)`` the integer step of each image."""
    b, k = strides.shape
    pos = torch.zeros(b, 1 + k * (cells + 1) + queries, dtype=torch.float64)
    nxt = torch.ones(b, dtype=torch.float64)  # the next text position (BOS at 0)
    col = 1
    steps = torch.arange(1, cells + 1, dtype=torch.float64)
    for i in range(k):
        pos[:, col] = nxt  # SEP
        start = nxt + 1
        pos[:, col + 1 : col + 1 + cells] = start[:, None] - 1 + steps[None] * strides[:, i : i + 1].double()
        nxt = pos[:, col + cells] + 1
        col += cells + 1
    pos[:, col:] = nxt[:, None] + torch.arange(queries, dtype=torch.float64)[None]
    return pos


@register_task("v2pe_recall", defaults={**DEFAULTS, "validation": {}})
def build_task(cfg: dict, encoder: str, seed: int, device: torch.device) -> Task:
    ((name, option),) = parse_encoders(encoder, _VARIANTS, combine=False).items
    if name not in _ENCODER:
        raise ValueError(
            f"v2pe_recall: encoder must be none, flat, v2pe@<delta>, v2pe@rand or stride@rand, got {encoder!r}"
        )
    if name in ("v2pe", "stride") and option is None:
        raise ValueError(f"v2pe_recall: {name!r} needs an option: 'v2pe@<delta>', 'v2pe@rand' or 'stride@rand'")
    if name == "v2pe" and option != "rand" and not 0 < float(option) <= 1:
        raise ValueError(f"v2pe_recall: the V2PE step must be in (0, 1], got {encoder!r}")
    m, d = cfg["model"], cfg["data"]
    cells, queries, nk, nv = d["cells"], d["queries"], d["num_keys"], d["num_values"]
    strides = torch.tensor([int(s) for s in d["strides"]])
    if (strides < 1).any():
        raise ValueError(f"data.strides must be integers >= 1, got {d['strides']!r}")
    model = RecallModel(_ENCODER[name], nk, nv, m["dim"], m["depth"], m["num_heads"], m["theta"])

    def positions(n: int, images: int, training: bool, gen: torch.Generator) -> Tensor:
        if name == "stride":
            s = strides[torch.randint(len(strides), (n, images), generator=gen)] if training else torch.ones(n, images)
            return recall_positions(s, cells, queries)
        scheme = "v2pe" if name == "v2pe" else "flat"
        options: dict[str, Any] = {}
        if name == "v2pe":
            rand = option == "rand"
            if rand and training:
                options = {"training": True, "generator": gen}
            else:
                options = {"delta": float(d["eval_delta"]) if rand else float(option)}
        layout = build([_segments(images, cells, queries)] * n, scheme, spatial_merge_size=1, **options)
        return layout.coords.pos[..., 0].double()

    def sample(n: int, images: int, training: bool, gen: torch.Generator):
        r = make_recall(n, images, cells, queries, nk, nv, gen)
        keys = [torch.full((n, 1), nk)]
        values = [torch.full((n, 1), nv)]
        for i in range(images):
            keys += [torch.full((n, 1), nk + 1), r.keys[:, i]]
            values += [torch.full((n, 1), nv), r.values[:, i]]
        keys.append(r.keys.flatten(1).gather(1, r.query))
        values.append(torch.full((n, queries), nv))
        return torch.cat(keys, 1), torch.cat(values, 1), positions(n, images, training, gen), r.answer

    lo, hi = d["train_images"]

    def train_batch(step: int):
        gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
        images = int(torch.randint(lo, hi + 1, (1,), generator=gen))
        return sample(cfg["batch_size"], images, True, gen)

    def loss(model: nn.Module, batch):
        keys, values, pos, answer = batch
        logits = model(keys, values, pos)[:, -queries:]
        out = F.cross_entropy(logits.flatten(0, 1), answer.flatten())
        return out, {"train_acc": (logits.argmax(-1) == answer).float().mean().item()}

    held = {k: sample(d["eval_size"], k, False, torch.Generator().manual_seed(10_000 + k)) for k in d["eval_images"]}

    def evaluate(model: nn.Module) -> dict[str, float]:
        out = {}
        for k, (keys, values, pos, answer) in held.items():
            hits = 0
            for i in range(0, len(keys), 32):
                sl = slice(i, i + 32)
                pred = model(keys[sl].to(device), values[sl].to(device), pos[sl].to(device))[:, -queries:].argmax(-1)
                hits += (pred == answer[sl].to(device)).sum().item()
            out[f"acc@{k}"] = hits / answer.numel()
        return out

    return Task(
        model=model,
        train_batch=train_batch,
        loss=loss,
        evaluate=evaluate,
        metric=f"acc@{max(d['eval_images'])}",
        chance=1.0 / nv,  # values drawn uniformly
    )
