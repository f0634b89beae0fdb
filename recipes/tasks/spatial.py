"""``spatial_relations``: a small ViT learns where a red square is relative to a blue one.

Data: :mod:`recipes.data.squares`, grid placement (fresh scenes every step, a fixed evaluation set).
Model: :class:`mmpos.nn.VisionTransformer` with the run's encoder(s) (``"a+b"`` combines).
Metrics: ``acc`` at the training resolution (ranks runs) and ``acc@<s>x`` on the same
evaluation scenes rendered at ``s`` times the resolution (``data.eval_scales``).

Without position encoding the model sees a bag of patches and stays at chance
(``1 / num_relations``); see :mod:`recipes.data.squares` for why.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from mmpos.nn import VisionTransformer
from mmpos.runner.tasks import Task, encoder_names, register_task

from ..data.squares import render, sample_grid

DEFAULTS: dict[str, Any] = {
    "model": {
        "patch_size": 8,
        "dim": 64,
        "depth": 2,
        "num_heads": 4,
        "mlp_ratio": 2.0,
        "class_token": True,
        "global_pool": "token",
        "pos_kwargs": {},  # per encoder name, e.g. {learned: {std: 0.2}}; entries of unused encoders are ignored
    },
    "data": {
        "image_size": 32,
        "cells": 4,
        "num_relations": 4,
        "noise": 0.5,
        "min_side": 0.5,
        "eval_size": 512,
        "eval_seed": 20_240_601,
        "eval_scales": [1.0, 1.5, 2.0],
        "eval_batch": 256,
    },
}


def _scale_name(scale: float) -> str:
    return "acc" if scale == 1 else f"acc@{scale:g}x"


@register_task("spatial_relations", defaults=DEFAULTS)
def build(cfg: dict[str, Any], encoder: str, seed: int, device: torch.device) -> Task:
    m, d = cfg["model"], cfg["data"]
    names = encoder_names(encoder)
    pos_kwargs = {k: dict(v) for k, v in (m["pos_kwargs"] or {}).items() if k in names}
    size = d["image_size"]
    model = VisionTransformer(
        img_size=size,
        patch_size=m["patch_size"],
        num_classes=d["num_relations"],
        dim=m["dim"],
        depth=m["depth"],
        num_heads=m["num_heads"],
        mlp_ratio=m["mlp_ratio"],
        pos=[] if names == ["none"] else names,
        pos_kwargs=pos_kwargs or None,
        class_token=m["class_token"],
        global_pool=m["global_pool"],
    )
    kw = {"cells": d["cells"], "num_relations": d["num_relations"], "min_side": d["min_side"]}
    scenes = sample_grid(d["eval_size"], d["eval_seed"], **kw)
    evals = {}
    for scale in d["eval_scales"]:
        px = round(size * scale)
        if px % m["patch_size"] or px % d["cells"]:
            raise ValueError(
                f"data.eval_scales: {scale} x {size} px = {px} px is not a multiple of "
                f"model.patch_size={m['patch_size']} and data.cells={d['cells']}"
            )
        evals[_scale_name(scale)] = render(scenes, px, d["eval_seed"] + 1, noise=d["noise"])
    if "acc" not in evals:
        raise ValueError(f"data.eval_scales must include 1.0 (the ranking metric acc), got {d['eval_scales']}")

    def train_batch(step: int):
        data_seed = (seed + 1) * 1_000_003 + step
        return render(sample_grid(cfg["batch_size"], data_seed, **kw), size, data_seed, noise=d["noise"])

    def loss(model: nn.Module, batch):
        images, labels = batch
        logits = model(images)
        return F.cross_entropy(logits, labels), {"train_acc": (logits.argmax(-1) == labels).float().mean().item()}

    def evaluate(model: nn.Module) -> dict[str, float]:
        out = {}
        for name, (images, labels) in evals.items():
            correct = 0
            for i in range(0, len(labels), d["eval_batch"]):
                x = images[i : i + d["eval_batch"]].to(device)
                correct += (model(x).argmax(-1).cpu() == labels[i : i + d["eval_batch"]]).sum().item()
            out[name] = correct / len(labels)
        return out

    return Task(
        model=model, train_batch=train_batch, loss=loss, evaluate=evaluate, metric="acc", chance=1 / d["num_relations"]
    )
