"""Vision recipes: a timm ViT on layout images, trained at one resolution, evaluated at several.

Tasks (see ``docs/recipes.md`` for the contract and ``docs/results/vision.md`` for results):

* ``vit_spatial`` -- a small timm ``VisionTransformer`` built by
  :func:`mmpos.integrations.timm.create_vit` with the run's encoder, trained on
  :mod:`recipes.data.squares` (free placement) at ``data.image_size`` and evaluated, without
  fine-tuning, on the same held-out scenes rendered at ``1x`` and at every factor of
  ``data.eval_scales``. Metrics: ``acc``, ``acc@1.5x``, ``acc@2x`` (squares keep their
  pixel size, the recipes' resolution protocol) and ``acc@1.5x:image``, ``acc@2x:image``
  (squares scale with the image) for the object scales listed after the first in
  ``data.eval_object_scales``; ``acc@1.5x:interp``, ``acc@2x:interp``: the pixel-scale images
  with the coordinate values rescaled to the training grid (``pos * train_grid / grid``, the
  rule of timm's ``ref_feat_shape``) for the encoders in ``data.interpolate_encoders``
  (sincos and RoPE, which read coordinate values and otherwise extrapolate), equal to
  ``acc@<s>x`` for the others (they resample by grid shape or read no values).
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
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmpos.integrations.timm import create_vit, load_state_dict_report
from mmpos.nn.placement import no_weight_decay
from mmpos.runner.plots import scale_key
from mmpos.runner.tasks import Task, encoder_names, parse_encoders, register_task

from ..data.squares import make_squares, render, sample_free

__all__ = ["build_vit_finetune", "build_vit_spatial", "scratch_suffix"]

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
    # acc@<s>x:interp: the acc@<s>x images with coordinate values rescaled to the training grid
    # (pos * train_grid / grid, timm's ref_feat_shape rule) for these encoders; the same as
    # acc@<s>x for the others, which resample by grid shape (learned, fuzzy) or ignore values (irpe, peg)
    "interpolate_encoders": ["sincos", "rope-axial", "rope-mixed"],
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


def build_model(cfg: dict, names: list[str], num_classes: int = _NUM_CLASSES) -> nn.Module:
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
        num_classes=num_classes,
        dynamic_img_size=True,
    )


def param_groups(weight_decay: float):
    """``model -> groups``: decay only on weight matrices outside the position encoders."""

    def groups(model: nn.Module) -> list[dict[str, Any]]:
        skip = set(model.no_weight_decay()) if hasattr(model, "no_weight_decay") else set()
        skip |= no_weight_decay(model)  # additive / conv encoders, RoPE-Mixed frequencies (mmpos.nn.placement)
        decay, no_decay = [], []
        for name, p in model.named_parameters():
            if not p.requires_grad:
                continue
            (no_decay if p.ndim <= 1 or name.endswith(".bias") or name in skip else decay).append(p)
        return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]

    return groups


def train_batch_fn(cfg: dict, seed: int):
    """``step -> (images (B, 3, S, S), labels (B,))``, a pure function of ``(seed, step)``."""
    data = cfg["data"]

    def train_batch(step: int) -> tuple[Tensor, Tensor]:
        base = 2 * (seed * 1_000_003 + step)
        return make_squares(
            cfg["batch_size"],
            data["image_size"],
            base,
            placement="free",
            base_size=data["image_size"],
            **_scene_kwargs(data),
            **_render_kwargs(data),
        )

    return train_batch


def loss_fn(model: nn.Module, batch: tuple[Tensor, Tensor]) -> tuple[Tensor, dict[str, float]]:
    images, labels = batch
    logits = model(images)
    loss = F.cross_entropy(logits, labels)
    return loss, {"train_acc": (logits.argmax(-1) == labels).float().mean().item()}


def eval_sets(cfg: dict, seed: int) -> dict[str, tuple[Tensor, Tensor]]:
    """``{metric: (images, labels)}``: the same held-out scenes at every resolution and object scale."""
    data, patch = cfg["data"], cfg["model"]["patch_size"]
    size = data["image_size"]
    scales = [float(s) for s in data["eval_scales"]]
    object_scales = list(data["eval_object_scales"])
    if not object_scales:
        raise ValueError("data.eval_object_scales must name at least one object scale, e.g. [pixels]")
    scene = sample_free(data["eval_size"], 2 * (10**9 + seed), size, **_scene_kwargs(data))
    render_seed = 2 * (10**9 + seed) + 1
    sets = {"acc": render(scene, size, render_seed, object_scale=object_scales[0], **_render_kwargs(data))}
    for scale in scales:
        pixels = size * scale
        if pixels != round(pixels) or round(pixels) % patch or scale <= 0:
            raise ValueError(
                f"data.eval_scales: {scale} x image_size={size} must give a positive multiple of patch_size={patch}"
            )
        for i, mode in enumerate(object_scales):
            key = f"acc@{scale_key(scale)}" + ("" if i == 0 else f":{mode}")
            sets[key] = render(scene, round(pixels), render_seed, object_scale=mode, **_render_kwargs(data))
    return sets


@contextmanager
def interpolated_positions(model: nn.Module, train_grid: tuple[int, int]):
    """Inside: ``model.token_coords`` positions scaled by ``train_grid / grid`` per axis (prefix stays 0)."""
    original = model.token_coords

    def token_coords(image_size, device=None):
        coords = original(image_size, device)
        return coords.scaled([t / g for t, g in zip(train_grid, coords.grid_shape)])

    model.token_coords = token_coords
    try:
        yield model
    finally:
        del model.token_coords  # back to the class's method


def _accuracy(model: nn.Module, images: Tensor, labels: Tensor, device: torch.device) -> float:
    correct = 0
    for start in range(0, len(labels), _EVAL_CHUNK):
        x = images[start : start + _EVAL_CHUNK].to(device)
        correct += (model(x).argmax(-1).cpu() == labels[start : start + _EVAL_CHUNK]).sum().item()
    return correct / len(labels)


def evaluate_fn(cfg: dict, names: list[str], sets: dict[str, tuple[Tensor, Tensor]], device: torch.device):
    """``model -> {metric: accuracy}`` over the fixed sets (chunks of 256 images), plus ``:interp`` keys."""
    data = cfg["data"]
    interpolate = bool(set(names) & set(data["interpolate_encoders"]))
    train_grid = (data["image_size"] // cfg["model"]["patch_size"],) * 2

    def evaluate(model: nn.Module) -> dict[str, float]:
        out = {key: _accuracy(model, images, labels, device) for key, (images, labels) in sets.items()}
        for scale in data["eval_scales"]:
            key = f"acc@{scale_key(float(scale))}"
            if interpolate:
                with interpolated_positions(model, train_grid):
                    out[f"{key}:interp"] = _accuracy(model, *sets[key], device)
            else:
                out[f"{key}:interp"] = out[key]
        return out

    return evaluate


def _task(cfg: dict, names: list[str], model: nn.Module, seed: int, device: torch.device) -> Task:
    return Task(
        model=model,
        train_batch=train_batch_fn(cfg, seed),
        loss=loss_fn,
        evaluate=evaluate_fn(cfg, names, eval_sets(cfg, seed), device),
        metric="acc",
        param_groups=param_groups(cfg["optim"]["weight_decay"]),
        chance=1 / _NUM_CLASSES,
    )


@register_task("vit_spatial", defaults={"model": _MODEL, "data": _DATA})
def build_vit_spatial(cfg: dict, encoder: str, seed: int, device: torch.device) -> Task:
    """A timm ViT with ``encoder`` (``"a+b"`` for several) on layout images, evaluated at several resolutions."""
    names = encoder_names(encoder)
    return _task(cfg, names, build_model(cfg, names), seed, device)


# --------------------------------------------------------------------------- fine-tuning
_PRETRAINED: dict[tuple[str, int], dict[str, Tensor]] = {}


def pretrain_learned(cfg: dict, seed: int, device: torch.device) -> dict[str, Tensor]:
    """State dict of a ``learned`` model trained for ``finetune.pretrain_steps`` steps (cached).

    The ``vit_spatial`` task with encoder ``learned``, trained by the runner's own loop
    (:func:`mmpos.runner.train.fit`: same optimizer, schedule and steps as a run) from
    ``torch.manual_seed(seed)`` inside a forked RNG, so the global RNG of the run is left as it was.
    """
    from mmpos.runner.train import fit  # the runner imports the task registry, not the reverse

    steps = cfg["finetune"]["pretrain_steps"]
    if not isinstance(steps, int) or steps <= 0:
        raise ValueError(f"finetune.pretrain_steps must be a positive int, got {steps!r}")
    key = (json.dumps({k: cfg[k] for k in ("model", "data", "finetune", "optim", "batch_size")}, sort_keys=True), seed)
    if key in _PRETRAINED:
        return _PRETRAINED[key]
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        model = fit(build_vit_spatial(cfg, "learned", seed, device), cfg, device, steps)
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


def initial_weights(
    cfg: dict, seed: int, device: torch.device, pretrain: Callable[..., dict[str, Tensor]] | None = None
) -> dict[str, Tensor]:
    """The learned-APE weights to start from: ``finetune.init_from`` or ``pretrain(cfg, seed, device)``
    (default :func:`pretrain_learned`; the digits task passes its own)."""
    path = cfg["finetune"]["init_from"]
    if path is not None:
        path = Path(str(path).format(seed=seed))
        if path.is_file():
            return load_checkpoint(path)
        log.warning("finetune.init_from=%s is missing: pretraining a learned-APE model in the task", path)
    return (pretrain or pretrain_learned)(cfg, seed, device)


@register_task("vit_finetune", defaults={"model": _MODEL, "data": _DATA, "finetune": _FINETUNE})
def build_vit_finetune(cfg: dict, encoder: str, seed: int, device: torch.device) -> Task:
    """``encoder``: converted from the learned-APE checkpoint and fine-tuned; ``"<enc>@scratch"``: from scratch."""
    spec = parse_encoders(encoder, (scratch_suffix[1:],), whole_run=True)  # "learned+irpe@scratch"
    scratch, names = spec.variant is not None, spec.names
    model = build_model(cfg, names)
    if not scratch:
        report = load_state_dict_report(model, initial_weights(cfg, seed, device))
        log.info("%s seed %d from the learned checkpoint: %s", encoder, seed, report)
    return _task(cfg, names, model, seed, device)
