"""Run a recipe: every (encoder, seed) pair, then a ranked results table and a plot.

``run_recipe("quickstart", ["profile=smoke"])`` resolves the config, makes
the run folder ``<out>/<recipe>/<name or timestamp>/`` (rank 0 only under torchrun),
trains each pair with :func:`mmpos.recipes.runner.train_run` and writes ``results.md``
(printed too), ``results.json`` and ``results.png``.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import yaml

from .config import ConfigError, find_recipe, load_yaml, resolve_config
from .runner import Dist, init_distributed, train_run

__all__ = ["RESUME_OVERRIDABLE", "find_recipe", "plot_results", "results_table", "run_recipe"]

#: Keys that may change when resuming (they do not change the results).
RESUME_OVERRIDABLE = ("device", "threads", "progress")


def _summary(finals: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str, bool]:
    """Per-encoder statistics ranked by the task's metric (best first)."""
    metric, higher = finals[0]["metric"], finals[0]["higher_is_better"]
    rows: dict[str, dict[str, Any]] = {}
    for f in finals:
        row = rows.setdefault(
            f["encoder"], {"encoder": f["encoder"], "values": {}, "seconds": [], "params": f["params"]}
        )
        for k, v in f["metrics"].items():
            row["values"].setdefault(k, []).append(v)
        row["seconds"].append(f["seconds"])
    for row in rows.values():
        row["mean"] = {k: statistics.fmean(v) for k, v in row["values"].items()}
        row["std"] = {k: statistics.stdev(v) if len(v) > 1 else 0.0 for k, v in row["values"].items()}
    ranked = sorted(rows.values(), key=lambda r: r["mean"][metric], reverse=higher)
    return ranked, metric, higher


def _cell(row: dict[str, Any], key: str, seeds: int) -> str:
    """``mean ± std`` of ``key`` (``mean`` alone for one seed); ``–`` where the run has no such metric."""
    if key not in row["mean"]:
        return "–"
    return f"{row['mean'][key]:.4f} ± {row['std'][key]:.4f}" if seeds > 1 else f"{row['mean'][key]:.4f}"


def results_table(finals: list[dict[str, Any]], title: str = "") -> str:
    """Markdown table: one row per encoder, ranked, ``mean ± std`` over seeds for each metric."""
    ranked, metric, higher = _summary(finals)
    keys = [metric] + sorted({k for r in ranked for k in r["mean"]} - {metric})
    seeds = max(len(r["seconds"]) for r in ranked)
    head = ["rank", "encoder", *keys, "params", "s/run"]
    lines = [f"### {title}\n" if title else "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, r in enumerate(ranked, 1):
        cells = [_cell(r, k, seeds) for k in keys]
        secs = statistics.fmean(r["seconds"])
        lines.append(f"| {i} | {r['encoder']} | " + " | ".join(cells) + f" | {r['params']:,} | {secs:.1f} |")
    note = f"\nRanked by `{metric}` ({'higher' if higher else 'lower'} is better)"
    note += f", mean ± std over {seeds} seeds." if seeds > 1 else ", one seed."
    return "\n".join(line for line in lines if line) + "\n" + note + "\n"


def plot_results(finals: list[dict[str, Any]], path: str | Path, title: str = "") -> Path:
    """Grouped bars (one group per encoder, ranked; one bar per metric) with std error bars, as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranked, metric, _ = _summary(finals)
    keys = [metric] + sorted({k for r in ranked for k in r["mean"]} - {metric})
    width = 0.8 / len(keys)
    fig, ax = plt.subplots(figsize=(max(5.0, 1.0 + 0.9 * len(ranked)), 3.6), dpi=120)
    for j, k in enumerate(keys):
        xs = [i + (j - (len(keys) - 1) / 2) * width for i in range(len(ranked))]
        means = [r["mean"].get(k, math.nan) for r in ranked]
        stds = [r["std"].get(k, 0.0) for r in ranked]
        ax.bar(xs, means, width, yerr=stds, capsize=2, label=k)
    ax.set_xticks(range(len(ranked)), [r["encoder"] for r in ranked], rotation=30, ha="right")
    ax.set_ylabel("metric")
    ax.set_title(title or "results")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize="small", ncols=min(len(keys), 4))
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


def _new_run_dir(root: Path, recipe_name: str, name: str | None) -> Path:
    base = root / recipe_name
    if name:
        folder = base / name
        if folder.exists():
            raise FileExistsError(
                f"run folder {folder} exists; pick another name= or continue it with --resume {folder}"
            )
        return folder
    stamp = time.strftime("%Y%m%d-%H%M%S")
    folder, i = base / stamp, 1
    while folder.exists():
        folder, i = base / f"{stamp}-{i}", i + 1
    return folder


def _resume_dir(path: str | Path) -> Path:
    """The run folder holding ``path`` (the folder itself, a pair folder or a file inside)."""
    path = Path(path).resolve()
    for folder in [path, *path.parents]:
        if (folder / "config.yaml").is_file():
            return folder
    raise FileNotFoundError(f"--resume {path}: no config.yaml in it or in a folder above it; is it a run folder?")


def run_recipe(
    recipe: str | Path | Mapping[str, Any],
    overrides: Iterable[str] = (),
    out: str | Path | None = None,
    resume: str | Path | None = None,
    name: str = "recipe",
) -> dict[str, Any]:
    """Run a recipe (a path, the name of a shipped recipe, or a dict) and return its results.

    Returns ``{"folder", "config", "finals", "table"}`` (``table``/``folder`` are ``None`` on ranks > 0).
    ``resume``: a run folder to continue (its ``config.yaml`` is used; only
    :data:`RESUME_OVERRIDABLE` keys may be overridden).
    """
    overrides = list(overrides)
    folder = None
    if resume is not None:
        folder = _resume_dir(resume)
        bad = [o for o in overrides if o.partition("=")[0].strip() not in RESUME_OVERRIDABLE]
        if bad:
            raise ConfigError(f"with --resume only {list(RESUME_OVERRIDABLE)} may be overridden, got {bad}")
        cfg = resolve_config(load_yaml(folder / "config.yaml"), overrides)
        recipe_name = folder.parent.name
    else:
        if isinstance(recipe, Mapping):
            raw = dict(recipe)
        else:
            path = find_recipe(recipe)
            raw, name = load_yaml(path), path.stem
        cfg = resolve_config(raw, overrides)
        recipe_name = name
    owns_group = not (dist.is_available() and dist.is_initialized())
    ddp, device = init_distributed(cfg["device"])
    try:
        return _run(cfg, recipe_name, folder, out, ddp, device)
    finally:
        if ddp.enabled and owns_group:
            dist.destroy_process_group()


def _run(
    cfg: dict[str, Any], recipe_name: str, folder: Path | None, out: str | Path | None, ddp: Dist, device: torch.device
) -> dict[str, Any]:
    """The body of :func:`run_recipe`; ``folder`` is the run folder to resume, or ``None`` for a new run."""
    resume = folder is not None
    if not resume:
        root = Path(out if out is not None else cfg["out"])
        folder = _new_run_dir(root, recipe_name, cfg["name"]) if ddp.is_main else None
        if ddp.enabled:
            shared = [str(folder) if folder else None]
            dist.broadcast_object_list(shared, src=0)
            folder = Path(shared[0])  # type: ignore[arg-type]
        if ddp.is_main:
            folder.mkdir(parents=True)  # type: ignore[union-attr]
            (folder / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")  # type: ignore[operator]
    assert folder is not None
    pairs = [(e, s) for e in cfg["encoders"] for s in cfg["seeds"]]
    finals = []
    for i, (encoder, seed) in enumerate(pairs, 1):
        if ddp.is_main and cfg["progress"]:
            print(f"[{i}/{len(pairs)}] {recipe_name}: encoder={encoder} seed={seed} device={device}", flush=True)
        finals.append(train_run(cfg, encoder, seed, folder / encoder / f"seed{seed}", device, ddp, resume))
    table = None
    if ddp.is_main:
        title = f"{recipe_name} ({cfg['task']}, {cfg['steps']} steps)"
        table = results_table(finals, title)
        (folder / "results.md").write_text(table, encoding="utf-8")
        (folder / "results.json").write_text(json.dumps(finals, indent=2) + "\n", encoding="utf-8")
        plot_results(finals, folder / "results.png", title)
        print("\n" + table + f"\nrun folder: {folder}", flush=True)
    return {"folder": folder if ddp.is_main else None, "config": cfg, "finals": finals, "table": table}
