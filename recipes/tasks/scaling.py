"""Scaling-rule recipes: one trained model per (encoder, seed), evaluated beyond its training size with every rule.

The rules of :mod:`mmpos.scaling` act at inference, so each run trains once and evaluates the same
weights with each rule swapped into its rotary encoders (:func:`scaled_encoders`); the comparison
"rule vs no scaling" is paired within a run, and over seeds.

Tasks:

* ``vit_scaling`` -- ``vit_spatial``'s timm ViT and layout images (:mod:`recipes.tasks.vision`), trained at
  ``data.image_size`` and evaluated at every ``data.eval_scales`` factor (squares keep their pixel size).
  Metrics: ``acc`` (1x), ``acc@<s>x`` (no rule) and ``acc@<s>x:<rule>`` for every rule of ``data.rules``, with
  ``factor = s`` per axis and ``original_size`` the training grid.
* ``text_scaling`` -- a causal byte-level language model (:class:`mmpos.nn.Transformer`, 1-D rotary encoder)
  on real text: the Python standard library's source files installed with the interpreter (sorted paths,
  concatenated; the last ``data.eval_fraction`` of the bytes held out). Trained on windows of
  ``data.train_len`` bytes, evaluated on held-out windows of ``data.eval_factor * train_len`` bytes.
  Metrics: ``bpb`` (bits per byte on training-length windows), ``bpb@<f>L`` (no rule) and
  ``bpb@<f>L:<rule>``, each over the positions beyond ``train_len`` only (the extrapolated part);
  lower is better.

Batches are pure functions of ``(seed, step)``; evaluation windows are fixed per seed.
"""

from __future__ import annotations

import math
import sysconfig
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmpos import Coords
from mmpos.encoders.base import RotaryEncoder
from mmpos.nn import Transformer
from mmpos.rotary import FrequencyPlan
from mmpos.runner.plots import scale_key
from mmpos.runner.tasks import Task, encoder_names, get_task, register_task
from mmpos.scaling import POSITION_RULES, build_scaling

from . import vision

__all__ = [
    "build_text_scaling",
    "build_vit_scaling",
    "defined_rules",
    "rule_scaling",
    "scaled_encoders",
    "stdlib_bytes",
]

#: the rules evaluated by default (``ref-shape`` equals ``linear`` at exactly ``factor`` times the training size)
RULES = ("linear", "ntk", "theta", "dynamic", "ntk-by-parts", "yarn", "llama3")


def rule_scaling(rule: str, factor: float, original: tuple[float, ...]) -> dict:
    """The :class:`~mmpos.scaling.RopeScaling` arguments for "trained at ``original``, run at ``factor`` times it".

    ``"<rule>@ratio"`` (``ntk-by-parts``, ``yarn``): the paper's ramp in ``L0 / wavelength`` (``ramp="ratio"``).
    A one-axis ``original`` (text) is a number, so it applies to every axis of the plan (HoPE reads text as
    ``(h, w)``).
    """
    rule, at, variant = rule.partition("@")
    size = float(original[0]) if len(original) == 1 else list(original)  # one number: every axis of the plan
    if rule == "ref-shape":
        return {"rule": rule, "original_size": size}
    out = {"rule": rule, "factor": float(factor), "original_size": size}
    if at:
        if variant != "ratio":
            raise ValueError(f"data.rules: a variant after '@' must be 'ratio' (the paper's ramp), got {variant!r}")
        out["ramp"] = variant
    return out


def defined_rules(model: nn.Module, rules: list[str]) -> list[str]:
    """The rules of ``rules`` defined on every rotary encoder of ``model``: a learned plan (RoPE-Mixed) takes the
    position rules only (:data:`mmpos.scaling.POSITION_RULES`); the others are left out of its metrics."""
    learned = any(isinstance(m, RotaryEncoder) and isinstance(m.weight, nn.Parameter) for m in model.modules())
    return [r for r in rules if not learned or r.partition("@")[0] in POSITION_RULES]


@contextmanager
def scaled_encoders(model: nn.Module, scaling: dict | None):
    """Inside: every rotary encoder of ``model`` runs with ``scaling`` applied to its current (trained) plan."""
    saved = []
    try:
        for enc in model.modules():
            if not isinstance(enc, RotaryEncoder) or scaling is None:
                continue
            learned = isinstance(enc.weight, nn.Parameter)
            plan = FrequencyPlan(enc.weight.detach(), enc.axes, enc.head_dim, enc.convention)
            new, factor, rescale = build_scaling(plan, scaling, enc.scaling_spectrum, learned)
            saved.append((enc, None if learned else enc.weight, enc.attention_factor, enc.rescale))
            if not learned:
                enc.weight = new.weight
            enc.attention_factor, enc.rescale = factor, rescale
        yield model
    finally:
        for enc, weight, factor, rescale in saved:
            if weight is not None:
                enc.weight = weight
            enc.attention_factor, enc.rescale = factor, rescale


# --------------------------------------------------------------------------- vision
_VIT = get_task("vit_spatial").defaults
_VIT_DATA = {**_VIT["data"], "eval_scales": [2.0], "eval_object_scales": ["pixels"], "rules": list(RULES)}


def _accuracy(model: nn.Module, images: Tensor, labels: Tensor, device: torch.device) -> float:
    correct = 0
    for start in range(0, len(labels), 256):
        x = images[start : start + 256].to(device)
        correct += (model(x).argmax(-1).cpu() == labels[start : start + 256]).sum().item()
    return correct / len(labels)


@register_task("vit_scaling", defaults={"model": _VIT["model"], "data": _VIT_DATA})
def build_vit_scaling(cfg: dict, encoder: str, seed: int, device: torch.device) -> Task:
    """``vit_spatial``'s model and data; evaluated at each scale with each scaling rule."""
    names = encoder_names(encoder)
    data = cfg["data"]
    model = vision.build_model(cfg, names)
    sets = vision.eval_sets(cfg, seed)
    grid = data["image_size"] // cfg["model"]["patch_size"]

    def evaluate(model: nn.Module) -> dict[str, float]:
        out = {"acc": _accuracy(model, *sets["acc"], device)}
        for scale in data["eval_scales"]:
            key = f"acc@{scale_key(float(scale))}"
            out[key] = _accuracy(model, *sets[key], device)
            for rule in defined_rules(model, data["rules"]):
                with scaled_encoders(model, rule_scaling(rule, float(scale), (grid, grid))):
                    out[f"{key}:{rule}"] = _accuracy(model, *sets[key], device)
        return out

    return Task(
        model=model,
        train_batch=vision.train_batch_fn(cfg, seed),
        loss=vision.loss_fn,
        evaluate=evaluate,
        metric="acc",
        param_groups=vision.param_groups(cfg["optim"]["weight_decay"]),
        chance=0.25,
    )


# --------------------------------------------------------------------------- text
@lru_cache(maxsize=1)
def stdlib_bytes(max_bytes: int) -> Tensor:
    """The first ``max_bytes`` bytes of the standard library's ``*.py`` files (sorted paths), uint8."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks, total = [], 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts or "test" in path.parts:
            continue
        data = path.read_bytes()
        chunks.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    text = b"".join(chunks)[:max_bytes]
    if len(text) < max_bytes:
        raise ValueError(
            f"data.corpus_bytes={max_bytes} exceeds the {len(text)} bytes of stdlib source found in {root}"
        )
    return torch.frombuffer(bytearray(text), dtype=torch.uint8).clone()


class ByteLM(nn.Module):
    """Byte embedding, :class:`mmpos.nn.Transformer` (causal) with ``pos``, a tied-free linear head."""

    def __init__(self, pos: list[str], dim: int, depth: int, num_heads: int, mlp_ratio: float, pos_kwargs: dict):
        super().__init__()
        self.embed = nn.Embedding(256, dim)
        self.net = Transformer(dim, depth, num_heads, pos=pos, pos_kwargs=pos_kwargs, mlp_ratio=mlp_ratio, causal=True)
        self.head = nn.Linear(dim, 256)

    def forward(self, ids: Tensor) -> Tensor:  # (B, L) -> (B, L, 256)
        coords = Coords.sequence(ids.shape[1], device=ids.device)
        return self.head(self.net(self.embed(ids), coords))


_TEXT_MODEL = {"dim": 64, "depth": 2, "num_heads": 4, "mlp_ratio": 2.0, "pos_kwargs": {}}
_TEXT_DATA = {
    "corpus_bytes": 2_000_000,
    "eval_fraction": 0.1,
    "train_len": 64,
    "eval_factor": 4,
    "eval_windows": 128,
    "rules": list(RULES),
}


def _windows(corpus: Tensor, starts: Tensor, length: int) -> Tensor:
    return corpus[starts[:, None] + torch.arange(length + 1)].long()  # (B, L + 1): inputs and next bytes


def _bits(model: nn.Module, windows: Tensor, device: torch.device, skip: int) -> float:
    """Mean bits per byte of the predictions at positions ``>= skip``."""
    total, count = 0.0, 0
    for chunk in windows.split(32):
        chunk = chunk.to(device)
        logits = model(chunk[:, :-1])[:, skip:]
        nll = F.cross_entropy(logits.reshape(-1, 256), chunk[:, 1 + skip :].reshape(-1), reduction="sum")
        total, count = total + nll.item(), count + logits.shape[0] * logits.shape[1]
    return total / count / math.log(2)


@register_task("text_scaling", defaults={"model": _TEXT_MODEL, "data": _TEXT_DATA})
def build_text_scaling(cfg: dict, encoder: str, seed: int, device: torch.device) -> Task:
    """A byte LM trained at ``train_len``, evaluated at ``eval_factor * train_len`` with each scaling rule."""
    names = encoder_names(encoder)
    m, data = cfg["model"], cfg["data"]
    corpus = stdlib_bytes(int(data["corpus_bytes"]))
    split = int(len(corpus) * (1 - float(data["eval_fraction"])))
    train_len, factor = int(data["train_len"]), int(data["eval_factor"])
    long_len = train_len * factor
    if split - train_len - 1 <= 0 or len(corpus) - split - long_len - 1 <= 0:
        raise ValueError("data.corpus_bytes is too small for the windows of data.train_len and data.eval_factor")
    g = torch.Generator().manual_seed(10**9 + seed)
    eval_starts = split + torch.randint(
        0, len(corpus) - split - long_len - 1, (int(data["eval_windows"]),), generator=g
    )
    short_eval, long_eval = _windows(corpus, eval_starts, train_len), _windows(corpus, eval_starts, long_len)
    pos_kwargs = {k: dict(v) for k, v in (m["pos_kwargs"] or {}).items() if k in names}
    model = ByteLM(names, m["dim"], m["depth"], m["num_heads"], m["mlp_ratio"], pos_kwargs)

    def train_batch(step: int) -> Tensor:
        gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
        return _windows(corpus, torch.randint(0, split - train_len - 1, (cfg["batch_size"],), generator=gen), train_len)

    def loss(model: nn.Module, batch: Tensor) -> Tensor:
        logits = model(batch[:, :-1])
        return F.cross_entropy(logits.reshape(-1, 256), batch[:, 1:].reshape(-1))

    def evaluate(model: nn.Module) -> dict[str, float]:
        key = f"bpb@{factor}L"
        out = {"bpb": _bits(model, short_eval, device, 0), key: _bits(model, long_eval, device, train_len)}
        for rule in defined_rules(model, data["rules"]):
            with scaled_encoders(model, rule_scaling(rule, float(factor), (float(train_len),))):
                out[f"{key}:{rule}"] = _bits(model, long_eval, device, train_len)
        return out

    return Task(
        model=model, train_batch=train_batch, loss=loss, evaluate=evaluate, metric="bpb", higher_is_better=False
    )


# --------------------------------------------------------------------------- the results page
def rule_differences(finals: list[dict], key: str, higher_is_better: bool) -> str:
    """A markdown table: per encoder and rule, ``key:<rule>`` and its paired difference from ``key`` (no rule).

    Differences are seed by seed within a run (same weights), with the 95% bootstrap interval of their mean
    (:func:`mmpos.runner.stats.bootstrap_interval`) and how many seeds the rule improved.
    """
    from statistics import fmean, stdev

    from mmpos.runner.stats import bootstrap_interval

    lines = [
        f"| encoder | rule | {key} mean ± sd | paired diff vs no rule | 95% CI | seeds better |",
        "|---|---|---|---|---|---|",
    ]
    encoders = list(dict.fromkeys(f["encoder"] for f in finals))
    for encoder in encoders:
        runs = [f["metrics"] for f in finals if f["encoder"] == encoder]
        base = [m[key] for m in runs]
        rules = [k.split(":", 1)[1] for k in runs[0] if k.startswith(f"{key}:")]
        lines.append(f"| {encoder} | none | {fmean(base):.4f} ± {stdev(base) if len(base) > 1 else 0:.4f} | | | |")
        for rule in rules:
            values = [m[f"{key}:{rule}"] for m in runs]
            diffs = [v - b for v, b in zip(values, base)]
            low, high = bootstrap_interval(diffs) if len(diffs) > 1 else (math.nan, math.nan)
            better = sum((d > 0) if higher_is_better else (d < 0) for d in diffs)
            spread = stdev(values) if len(values) > 1 else 0.0
            lines.append(
                f"| {encoder} | {rule} | {fmean(values):.4f} ± {spread:.4f} | {fmean(diffs):+.4f} | "
                f"[{low:+.4f}, {high:+.4f}] | {better}/{len(diffs)} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":  # python -m recipes.tasks.scaling runs/<recipe>/<name>/results.json KEY [lower]
    import json
    import sys

    results, metric = sys.argv[1], sys.argv[2]
    print(rule_differences(json.loads(Path(results).read_text()), metric, "lower" not in sys.argv[3:]))
