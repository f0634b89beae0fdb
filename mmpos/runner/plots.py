"""Figures of recipe runs: the one place the runner and the result pages draw (matplotlib, Agg).

* :func:`plot_results` -- a run's ``results.png``: the final metrics per encoder (grouped bars,
  mean ± std over seeds) and, when the run folder is given, the training loss per step (mean
  over seeds, min–max band) read from every pair's ``metrics.jsonl``.
* :func:`loss_curves` -- those loss curves as arrays.
* :func:`plot_resolution` -- accuracy against evaluation resolution (the vision recipes).

Command line (redraws a figure of a finished run from its ``results.json``)::

    python -m mmpos.runner.plots RUN_FOLDER OUT.png [image|interp] [--chance 0.25]

draws :func:`plot_resolution` for the headline keys (``acc@2x``), ``acc@2x:image`` or
``acc@2x:interp``.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .stats import summarize

__all__ = ["loss_curves", "plot_resolution", "plot_results"]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _losses(path: Path) -> dict[int, float]:
    """``{step: training loss}`` of one pair's ``metrics.jsonl``."""
    records = (json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
    return {int(r["step"]): float(r["loss"]) for r in records if "loss" in r}


def loss_curves(folder: str | Path, finals: list[dict[str, Any]]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{encoder: (steps (S,), losses (seeds, S))}`` from ``<folder>/<encoder>/seed<k>/metrics.jsonl``.

    Only the steps every seed of the encoder logged are kept (they are the same steps unless
    ``log_every`` differed); an encoder with a missing log or no common step is left out.
    """
    folder = Path(folder)
    runs: dict[str, list[dict[int, float] | None]] = {}
    for f in finals:
        path = folder / f["encoder"] / f"seed{f['seed']}" / "metrics.jsonl"
        runs.setdefault(f["encoder"], []).append(_losses(path) if path.is_file() else None)
    curves = {}
    for encoder, seeds in runs.items():
        if any(s is None for s in seeds):
            continue
        steps = sorted(set.intersection(*(set(s) for s in seeds)))  # type: ignore[arg-type]
        if steps:
            curves[encoder] = (np.array(steps), np.array([[s[k] for k in steps] for s in seeds]))  # type: ignore[index]
    return curves


def _bars(ax, finals: list[dict[str, Any]]) -> None:
    """Grouped bars (one group per encoder, ranked; one bar per metric) with std error bars."""
    ranked, metric, _ = summarize(finals)
    keys = [metric] + sorted({k for r in ranked for k in r["mean"]} - {metric})
    width = 0.8 / len(keys)
    for j, k in enumerate(keys):
        xs = [i + (j - (len(keys) - 1) / 2) * width for i in range(len(ranked))]
        means = [r["mean"].get(k, math.nan) for r in ranked]
        stds = [r["std"].get(k, 0.0) for r in ranked]
        ax.bar(xs, means, width, yerr=stds, capsize=2, label=k)
    ax.set_xticks(range(len(ranked)), [r["encoder"] for r in ranked], rotation=30, ha="right")
    chance = finals[0].get("chance")  # written by the runner from Task.chance (absent in older results.json)
    if chance is not None:
        ax.axhline(chance, color="grey", linestyle=":", linewidth=1, label=f"chance ({chance:g})")
    ax.set_ylabel("metric")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize="small", ncols=min(len(keys), 4))


def _curves(ax, curves: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
    """Training loss per step: the mean over seeds, and a band from the lowest to the highest seed."""
    for encoder, (steps, losses) in curves.items():
        (line,) = ax.plot(steps, losses.mean(0), linewidth=1.2, label=encoder)
        if len(losses) > 1:
            ax.fill_between(steps, losses.min(0), losses.max(0), color=line.get_color(), alpha=0.2, linewidth=0)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", ncols=2)


def plot_results(
    finals: list[dict[str, Any]], path: str | Path, title: str = "", folder: str | Path | None = None
) -> Path:
    """``results.png``: the final metrics per encoder and, with the run ``folder``, the training loss curves.

    ``finals``: the runner's ``results.json`` (one dict per (encoder, seed)). Bars: mean ± std
    over seeds of every metric, encoders ranked by the task's metric, with the task's chance level
    (``Task.chance``) as a dotted line. Curves (right panel, when
    ``folder`` holds the pairs' ``metrics.jsonl``): :func:`loss_curves`, mean over seeds with a
    min–max band.
    """
    plt = _pyplot()
    curves = loss_curves(folder, finals) if folder is not None else {}
    encoders = len({f["encoder"] for f in finals})
    bar_width = max(5.0, 1.0 + 0.9 * encoders)
    if curves:
        fig, (bars, lines) = plt.subplots(
            1, 2, figsize=(bar_width + 5.0, 3.8), dpi=120, gridspec_kw={"width_ratios": [bar_width, 5.0]}
        )
        _curves(lines, curves)
        lines.set_title("training loss (mean over seeds, min–max band)", fontsize="medium")
    else:
        fig, bars = plt.subplots(figsize=(bar_width, 3.6), dpi=120)
    _bars(bars, finals)
    bars.set_title("final metrics (mean ± std over seeds)" if curves else (title or "results"), fontsize="medium")
    if curves:
        fig.suptitle(title or "results")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


def scale_key(scale: float) -> str:
    """``1.5`` -> ``"1.5x"``: the resolution suffix of the vision tasks' metric keys (``acc@1.5x``)."""
    return f"{scale:g}x"


def plot_resolution(
    finals: list[dict[str, Any]],
    path: str | Path,
    object_scale: str = "",
    title: str = "",
    chance: float | None = None,
) -> Path:
    """Accuracy against resolution (1x and every ``acc@<s>x`` key), one line per encoder, mean ± std.

    ``finals``: the runner's ``results.json``; ``object_scale``: ``""`` for the headline keys
    (``acc@2x``), ``"image"`` for ``acc@2x:image``, ``"interp"`` for ``acc@2x:interp``;
    ``chance``: the accuracy of guessing, drawn as a dotted line (e.g. ``0.25`` for 4 classes).
    """
    suffix = f":{object_scale}" if object_scale else ""
    runs: dict[str, list[dict[str, float]]] = {}
    for f in finals:
        runs.setdefault(f["encoder"], []).append(f["metrics"])
    scales = sorted({float(k[4:-1 - len(suffix)]) for m in finals for k in m["metrics"]
                     if k.startswith("acc@") and k.endswith("x" + suffix)})  # fmt: skip
    if not scales:
        raise ValueError(f"the results hold no 'acc@<s>x{suffix}' metric; object_scale={object_scale!r}")
    keys = ["acc"] + [f"acc@{scale_key(s)}{suffix}" for s in scales]
    xs = [1.0] + scales
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.0, 4.0), dpi=120)
    for encoder, metrics in runs.items():
        values = np.array([[m[k] for k in keys] for m in metrics])  # (seeds, resolutions)
        std = values.std(0, ddof=1) if len(metrics) > 1 else np.zeros(len(keys))
        ax.errorbar(xs, values.mean(0), yerr=std, marker="o", capsize=3, label=encoder)
    if chance is not None:
        ax.axhline(chance, color="grey", linestyle=":", linewidth=1)
    ax.set_xticks(xs, [scale_key(x) for x in xs])
    ax.set_xlabel("evaluation resolution (trained at 1x)")
    ax.set_ylabel("accuracy")
    ax.set_title(title or "accuracy against resolution")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", ncols=2)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


_WHAT = {
    "": "squares fixed in pixels",
    "image": "squares scale with the image",
    "interp": "squares fixed in pixels, sincos/RoPE positions rescaled",
}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m mmpos.runner.plots RUN_FOLDER OUT.png [image|interp] [--chance P]``: :func:`plot_resolution`."""
    p = argparse.ArgumentParser(prog="python -m mmpos.runner.plots", description="accuracy against resolution")
    p.add_argument("folder", help="a finished run folder (holding results.json)")
    p.add_argument("out", help="the PNG to write")
    p.add_argument("object_scale", nargs="?", default="", choices=("", "image", "interp"))
    p.add_argument("--chance", type=float, default=None, help="accuracy of guessing, drawn as a dotted line")
    args = p.parse_args(argv)
    folder = Path(args.folder)
    results = folder / "results.json"
    if not results.is_file():
        p.error(f"{results} does not exist; is {folder} a finished run folder?")
    finals = json.loads(results.read_text(encoding="utf-8"))
    title = f"{folder.parent.name}: {_WHAT[args.object_scale]}"
    try:
        print(plot_resolution(finals, args.out, args.object_scale, title, args.chance))
    except ValueError as e:
        p.error(str(e))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
