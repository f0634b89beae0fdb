"""The real fine-tune chain: a small timm ViT pretrained on real digits, converted to other encoders, fine-tuned.

No pretrained weights can be downloaded, so the chain makes its own (issue #20.4): the path users
take with a pretrained backbone -- load it, swap its position encoding with
:func:`mmpos.integrations.timm.load_state_dict_report`, fine-tune -- on real data that installs
from a registry (scikit-learn's bundled digits, :mod:`recipes.data.digits`, the optional ``data``
extra; train and test images are disjoint).

* ``digits_vit`` -- pretraining: the timm ``VisionTransformer`` of
  :func:`recipes.tasks.vision.build_model` (class token, ``dynamic_img_size``) with the run's
  encoder, classifying real 8 x 8 digits enlarged to ``data.image_size`` pixels (pixels repeated,
  so a patch of ``patch_size`` pixels covers one or a few digit pixels). Metrics: ``acc`` on the
  360 held-out digits, ``acc@<s>x`` on the same digits enlarged ``s`` times more (a larger patch
  grid with the same patch contents: the recipes' resolution protocol).
* ``digits_vit_finetune`` -- starts from a ``learned``-APE ``digits_vit`` checkpoint
  (``finetune.init_from``, ``{seed}`` replaced; ``null`` or a missing file: pretrained inside the
  task for ``finetune.pretrain_steps`` steps with the runner's own loop, once per seed and
  process), converts it to the run's encoder and fine-tunes it for ``steps``. ``acc@start`` is
  the held-out accuracy right after the conversion (before any fine-tuning step): how much of the
  pretrained model survives the swap; ``acc`` after fine-tuning: how it recovers.
  ``<encoder>@scratch`` trains the same model from scratch for the same steps.

Batches: ``train_batch(step)`` draws training digits with a ``torch.Generator`` seeded
``seed * 1_000_003 + step``; evaluation uses every held-out digit.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmpos.integrations.timm import load_state_dict_report
from mmpos.runner.plots import scale_key
from mmpos.runner.tasks import Task, encoder_names, parse_encoders, register_task

from ..data.digits import digit_batch, split_images
from .vision import build_model, initial_weights, param_groups

__all__ = ["build_digits_vit", "build_digits_vit_finetune"]

log = logging.getLogger(__name__)

_CLASSES = 10
_MODEL = {
    "timm_model": "vit_tiny_patch16_224",  # the architecture; the keys below override its sizes
    "embed_dim": 48,
    "depth": 2,
    "num_heads": 3,
    "patch_size": 4,
    "mlp_ratio": 2.0,
    "weight_init": "jax",
    "keep_abs_pos": None,  # None: timm's pos_embed kept only for bias-only encoders (iRPE, as its reference)
    "conv_after": [0],  # PEG after block 0 (CPVT)
    "pos_kwargs": {},  # per encoder name; ignored for absent encoders
}
_DATA = {"image_size": 16, "eval_scales": [1.5, 2.0]}
_FINETUNE = {"init_from": None, "pretrain_steps": 300}


def _loss(model: nn.Module, batch: tuple[Tensor, Tensor]) -> tuple[Tensor, dict[str, float]]:
    images, labels = batch
    logits = model(images)
    return F.cross_entropy(logits, labels), {"train_acc": (logits.argmax(-1) == labels).float().mean().item()}


def _eval_sets(cfg: dict) -> dict[str, tuple[Tensor, Tensor]]:
    data, patch = cfg["data"], cfg["model"]["patch_size"]
    size = data["image_size"]
    sets = {"acc": split_images("test", size)}
    for scale in data["eval_scales"]:
        px = size * float(scale)
        if px != round(px) or round(px) % 8 or round(px) % patch:
            raise ValueError(
                f"data.eval_scales: {scale} x image_size={size} must give a multiple of 8 and of patch_size={patch}"
            )
        sets[f"acc@{scale_key(float(scale))}"] = split_images("test", round(px))
    return sets


def _accuracy(model: nn.Module, images: Tensor, labels: Tensor, device: torch.device) -> float:
    return (model(images.to(device)).argmax(-1).cpu() == labels).float().mean().item()


def _task(cfg: dict, model: nn.Module, seed: int, device: torch.device, start: dict[str, float] | None = None) -> Task:
    size = cfg["data"]["image_size"]
    if size % 8 or size % cfg["model"]["patch_size"]:
        raise ValueError(f"data.image_size={size} must be a multiple of 8 and of model.patch_size")
    sets = _eval_sets(cfg)

    def train_batch(step: int) -> tuple[Tensor, Tensor]:
        return digit_batch(cfg["batch_size"], "train", size, torch.Generator().manual_seed(seed * 1_000_003 + step))

    def evaluate(model: nn.Module) -> dict[str, float]:
        out = {k: _accuracy(model, x, y, device) for k, (x, y) in sets.items()}
        return {**out, **(start or {})}

    return Task(
        model=model,
        train_batch=train_batch,
        loss=_loss,
        evaluate=evaluate,
        metric="acc",
        param_groups=param_groups(cfg["optim"]["weight_decay"]),
        chance=1 / _CLASSES,
    )


@register_task("digits_vit", defaults={"model": _MODEL, "data": _DATA, "validation": {}})
def build_digits_vit(cfg: dict, encoder: str, seed: int, device: torch.device) -> Task:
    """A timm ViT with ``encoder`` classifying real digits; the pretraining step of the chain."""
    return _task(cfg, build_model(cfg, encoder_names(encoder), _CLASSES), seed, device)


_PRETRAINED: dict[tuple[str, int], dict[str, Tensor]] = {}


def _pretrain(cfg: dict, seed: int, device: torch.device) -> dict[str, Tensor]:
    """``digits_vit`` with ``learned`` for ``finetune.pretrain_steps`` (runner's loop; global RNG left as it was)."""
    from mmpos.runner.train import fit  # the runner imports the task registry, not the reverse

    steps = cfg["finetune"]["pretrain_steps"]
    if not isinstance(steps, int) or isinstance(steps, bool) or steps <= 0:
        raise ValueError(f"finetune.pretrain_steps must be a positive int, got {steps!r}")
    key = (json.dumps({k: cfg[k] for k in ("model", "data", "finetune", "optim", "batch_size")}, sort_keys=True), seed)
    if key not in _PRETRAINED:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(seed)
            model = fit(build_digits_vit(cfg, "learned", seed, device), {**cfg, "steps": steps}, device, steps)
        _PRETRAINED[key] = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    return _PRETRAINED[key]


@register_task(
    "digits_vit_finetune", defaults={"model": _MODEL, "data": _DATA, "finetune": _FINETUNE, "validation": {}}
)
def build_digits_vit_finetune(cfg: dict, encoder: str, seed: int, device: torch.device) -> Task:
    """``encoder`` converted from the learned-APE digits checkpoint and fine-tuned; ``"<enc>@scratch"``: from scratch."""
    spec = parse_encoders(encoder, ("scratch",), whole_run=True)
    model = build_model(cfg, spec.names, _CLASSES)
    start: dict[str, float] = {}
    if spec.variant is None:
        report: Any = load_state_dict_report(model, initial_weights(cfg, seed, device, pretrain=_pretrain))
        log.info("%s seed %d from the learned digits checkpoint: %s", encoder, seed, report)
        images, labels = split_images("test", cfg["data"]["image_size"])
        model.to(device).eval()
        with torch.no_grad():
            start["acc@start"] = _accuracy(model, images, labels, device)  # before any fine-tuning step
        model.train()
    return _task(cfg, model, seed, device, start)
