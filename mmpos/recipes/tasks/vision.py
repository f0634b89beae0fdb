"""Vision recipes: a timm ViT on layout images, trained at one resolution, evaluated at several.

Tasks (see ``docs/recipes.md`` for the contract and ``docs/results/vision.md`` for results):

* ``vit_spatial`` -- a small timm ``VisionTransformer`` built by
  :func:`mmpos.integrations.timm.create_vit` with the run's encoder, trained on
  :mod:`mmpos.data.layout_images` at ``data.image_size`` and evaluated, without
  fine-tuning, on the same held-out scenes rendered at ``1x`` and at every factor of
  ``data.eval_scales``. Metrics: ``acc``, ``acc@1.5x``, ``acc@2x`` (squares keep their
  pixel size, the recipes' resolution protocol) and ``acc@1.5x:image``, ``acc@2x:image``
  (squares scale with the image) for the object scales listed after the first in
  ``data.eval_object_scales``.
* ``vit_finetune`` -- starts from a ``learned``-APE checkpoint (``finetune.init_from``, a
  path that may hold ``{seed}``, e.g. ``runs/vit_spatial/cpu/learned/seed{seed}/best.pt``),
  converts it to the run's encoder (:func:`mmpos.integrations.timm.load_state_dict_report`:
  shared weights kept, the new encoder's weights initialised, the old table dropped unless
  the new model keeps an absolute embedding, as iRPE does) and fine-tunes it for ``steps``.
  The encoder ``"<name>@scratch"`` trains the same model from scratch for the same steps,
  the baseline of the comparison. When ``init_from`` is ``null`` or names a missing
  file, the checkpoint is produced inside the task: ``finetune.pretrain_steps`` steps of
  ``learned`` training, exactly as ``vit_spatial`` trains (same data stream, optimizer
  and schedule, seeded by the run's seed), done once per seed and process and cached.

Batches: ``train_batch(step)`` renders the scenes of seed ``2 * (seed * 1_000_003 + step)``
(noise from the next integer); the evaluation scenes come from ``2 * (10**9 + seed)``.
No weight decay on biases, norms, tokens and position-encoder parameters (tables, PEG,
RoPE-Mixed frequencies, iRPE tables), so that no encoder's parameters are pulled to zero.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...data.layout_images import layout_images, render, sample_scenes
from ...integrations.timm import create_vit, load_state_dict_report
from . import Task, encoder_names, register_task

__all__ = ["build_vit_spatial", "build_vit_finetune", "scratch_suffix"]

log = logging.getLogger(__name__)

scratch_suffix = "@scratch"
_NUM_CLASSES = 4
_EVAL_CHUNK = 256

_MODEL = {
    "timm_model": "vit_tiny_patch16_224",  # the architecture; the keys below override its sizes
    "embed_dim": 64,
    "depth": 3,
    "num_heads": 4,
    "patch_size": 8,
    "mlp_ratio": 4.0,
    "weight_init": "jax",  # timm's init mode ("jax": the original ViT's xavier-uniform linears, zero head)
    "keep_abs_pos": None,  # None: timm's pos_embed kept only for bias-only encoders (iRPE, as its reference)
    "conv_after": [0],  # PEG after block 0 (CPVT)
    "pos_kwargs": {},  # per encoder name, e.g. {"rope-axial": {"theta": 100}}; ignored for absent encoders
}
_DATA = {
    "image_size": 32,  # training resolution = base_size of the scenes
    "eval_scales": [1.5, 2.0],  # evaluation resolutions besides 1x, as factors of image_size
    "eval_object_scales": ["pixels", "image"],  # the first gives acc@<s>x, the others acc@<s>x:<scale>
    "eval_size": 512,
    "side": [4.0, 8.0],  # square sides, base pixels
    "min_gap": 8.0,  # >= patch_size: no patch holds both squares
    "min_margin": 4.0,
    "noise": 0.3,
    "color_jitter": 0.2,
}
_FINETUNE = {
    "init_from": None,  # learned-APE checkpoint, "{seed}" is replaced; null or missing: pretrain in the task
    "pretrain_steps": 250,
}


def _scene_kwargs(data: dict) -> dict:
    return {"side": tuple(data["side"]), "min_gap": data["min_gap"], "min_margin": data["min_margin"]}


def _render_kwargs(data: dict) -> dict:
    return {"noise": data["noise"], "color_jitter": data["color_jitter"]}


def build_model(cfg: dict, names: list[str]) -> nn.Module:
    """The timm ViT of ``cfg["model"]`` with encoders ``names``, for ``cfg["data"]["image_size"]`` images."""
    m, size = cfg["model"], cfg["data"]["image_size"]
    if size % m["patch_size"]:
        raise ValueError(f"data.image_size={size} must be a multiple of model.patch_size={m['patch_size']}")
    pos_kwargs = {k: dict(v) for k, v in (m["pos_kwargs"] or {}).items() if k in names}
    return create_vit(
        m["timm_model"],
        pos=names,
        pos_kwargs=pos_kwargs,
        keep_abs_pos=m["keep_abs_pos"],
        conv_after=tuple(m["conv_after"]),
        img_size=size,
        patch_size=m["patch_size"],
        embed_dim=m["embed_dim"],
        depth=m["depth"],
        num_heads=m["num_heads"],
        mlp_ratio=m["mlp_ratio"],
        weight_init=m["weight_init"],
        num_classes=_NUM_CLASSES,
        dynamic_img_size=True,
    )


def param_groups(weight_decay: float):
    """``model -> groups``: decay only on weight matrices outside the position encoders."""

    def groups(model: nn.Module) -> list[dict[str, Any]]:
        skip = set(model.no_weight_decay()) if hasattr(model, "no_weight_decay") else set()
        decay, no_decay = [], []
        for name, p in model.named_parameters():
            if not p.requires_grad:
                continue
            positional = "pos_encoders." in name or "pos_convs." in name or name in skip
            (no_decay if p.ndim <= 1 or name.endswith(".bias") or positional else decay).append(p)
        return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]

    return groups


def train_batch_fn(cfg: dict, seed: int):
    """``step -> (images (B, 3, S, S), labels (B,))``, a pure function of ``(seed, step)``."""
    data = cfg["data"]

    def train_batch(step: int) -> tuple[Tensor, Tensor]:
        base = 2 * (seed * 1_000_003 + step)
        return layout_images(
            cfg["batch_size"], data["image_size"], base, data["image_size"],
            **_scene_kwargs(data), **_render_kwargs(data),
        )

    return train_batch


def loss_fn(model: nn.Module, batch: tuple[Tensor, Tensor]) -> tuple[Tensor, dict[str, float]]:
    images, labels = batch
    logits = model(images)
    loss = F.cross_entropy(logits, labels)
    return loss, {"train_acc": (logits.argmax(-1) == labels).float().mean().item()}


def _scale_key(scale: float) -> str:
    return f"{scale:g}x"


def eval_sets(cfg: dict, seed: int) -> dict[str, tuple[Tensor, Tensor]]:
    """``{metric: (images, labels)}``: the same held-out scenes at every resolution and object scale."""
    data, patch = cfg["data"], cfg["model"]["patch_size"]
    size = data["image_size"]
    scales = [float(s) for s in data["eval_scales"]]
    object_scales = list(data["eval_object_scales"])
    if not object_scales:
        raise ValueError("data.eval_object_scales must name at least one object scale, e.g. [pixels]")
    scene = sample_scenes(data["eval_size"], 2 * (10**9 + seed), size, **_scene_kwargs(data))
    render_seed = 2 * (10**9 + seed) + 1
    sets = {"acc": render(scene, size, render_seed, object_scales[0], **_render_kwargs(data))}
    for scale in scales:
        pixels = size * scale
        if pixels != round(pixels) or round(pixels) % patch or scale <= 0:
            raise ValueError(
                f"data.eval_scales: {scale} x image_size={size} must give a positive multiple of patch_size={patch}"
            )
        for i, mode in enumerate(object_scales):
            key = f"acc@{_scale_key(scale)}" + ("" if i == 0 else f":{mode}")
            sets[key] = render(scene, int(round(pixels)), render_seed, mode, **_render_kwargs(data))
    return sets


def evaluate_fn(sets: dict[str, tuple[Tensor, Tensor]], device: torch.device):
    """``model -> {metric: accuracy}`` over the fixed sets (chunks of 256 images)."""

    def evaluate(model: nn.Module) -> dict[str, float]:
        out = {}
        for key, (images, labels) in sets.items():
            correct = 0
            for start in range(0, len(labels), _EVAL_CHUNK):
                x = images[start : start + _EVAL_CHUNK].to(device)
                correct += (model(x).argmax(-1).cpu() == labels[start : start + _EVAL_CHUNK]).sum().item()
            out[key] = correct / len(labels)
        return out

    return evaluate


def _task(cfg: dict, model: nn.Module, seed: int, device: torch.device) -> Task:
    return Task(
        model=model,
        train_batch=train_batch_fn(cfg, seed),
        loss=loss_fn,
        evaluate=evaluate_fn(eval_sets(cfg, seed), device),
        metric="acc",
        param_groups=param_groups(cfg["optim"]["weight_decay"]),
    )


@register_task("vit_spatial", defaults={"model": _MODEL, "data": _DATA})
def build_vit_spatial(cfg: dict, encoder: str, seed: int, device: torch.device) -> Task:
    """A timm ViT with ``encoder`` (``"a+b"`` for several) on layout images, evaluated at several resolutions."""
    return _task(cfg, build_model(cfg, encoder_names(encoder)), seed, device)


# --------------------------------------------------------------------------- fine-tuning
_PRETRAINED: dict[tuple[str, int], dict[str, Tensor]] = {}


def _lr_lambda(cfg: dict, steps: int):
    """The runner's schedule: linear warm-up, then cosine decay to ``min_lr_ratio``."""
    optim = cfg["optim"]
    warmup, floor = optim["warmup_steps"], optim["min_lr_ratio"]

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(steps - warmup, 1)
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))

    return factor


def pretrain_learned(cfg: dict, seed: int, device: torch.device) -> dict[str, Tensor]:
    """State dict of a ``learned`` model trained for ``finetune.pretrain_steps`` steps (cached).

    Same model, data stream, AdamW settings and schedule as a ``vit_spatial`` run; the
    model is initialised from ``torch.manual_seed(seed)`` inside a forked RNG, so the
    global RNG of the run is left as it was.
    """
    steps = cfg["finetune"]["pretrain_steps"]
    if not isinstance(steps, int) or steps <= 0:
        raise ValueError(f"finetune.pretrain_steps must be a positive int, got {steps!r}")
    key = (json.dumps({k: cfg[k] for k in ("model", "data", "finetune", "optim", "batch_size")}, sort_keys=True), seed)
    if key in _PRETRAINED:
        return _PRETRAINED[key]
    optim = cfg["optim"]
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        model = build_model(cfg, ["learned"]).to(device).train()
        opt = torch.optim.AdamW(
            param_groups(optim["weight_decay"])(model), lr=optim["lr"], betas=tuple(optim["betas"])
        )
        sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(cfg, steps))
        batch = train_batch_fn(cfg, seed)
        for step in range(steps):
            images, labels = (t.to(device) for t in batch(step))
            loss = F.cross_entropy(model(images), labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if optim["grad_clip"]:
                nn.utils.clip_grad_norm_(model.parameters(), optim["grad_clip"])
            opt.step()
            sched.step()
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    _PRETRAINED[key] = state
    return state


def load_checkpoint(path: str | Path) -> dict[str, Tensor]:
    """Model weights from a runner checkpoint (``best.pt`` / ``last.pt``) or a bare state dict."""
    obj = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(obj, dict) and isinstance(obj.get("model"), dict):
        obj = obj["model"]
    if not isinstance(obj, dict) or not all(isinstance(v, Tensor) for v in obj.values()):
        raise ValueError(f"finetune.init_from={str(path)!r} holds no state dict (a mapping of names to tensors)")
    return {k.removeprefix("module."): v for k, v in obj.items()}


def initial_weights(cfg: dict, seed: int, device: torch.device) -> dict[str, Tensor]:
    """The learned-APE weights to start from: ``finetune.init_from`` or a pretraining run."""
    path = cfg["finetune"]["init_from"]
    if path is not None:
        path = Path(str(path).format(seed=seed))
        if path.is_file():
            return load_checkpoint(path)
        log.warning("finetune.init_from=%s is missing: pretraining a learned-APE model in the task", path)
    return pretrain_learned(cfg, seed, device)


@register_task("vit_finetune", defaults={"model": _MODEL, "data": _DATA, "finetune": _FINETUNE})
def build_vit_finetune(cfg: dict, encoder: str, seed: int, device: torch.device) -> Task:
    """``encoder``: converted from the learned-APE checkpoint and fine-tuned; ``"<enc>@scratch"``: from scratch."""
    scratch = encoder.endswith(scratch_suffix)
    names = encoder_names(encoder.removesuffix(scratch_suffix))
    if any("@" in n for n in names):
        raise ValueError(f"encoder must be '<names>' or '<names>{scratch_suffix}', got {encoder!r}")
    model = build_model(cfg, names)
    if not scratch:
        report = load_state_dict_report(model, initial_weights(cfg, seed, device))
        log.info("%s seed %d from the learned checkpoint: %s", encoder, seed, report)
    return _task(cfg, model, seed, device)
