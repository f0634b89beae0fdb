"""Run a recipe: every (encoder, seed) pair, then a ranked results table and a plot.

``run_recipe("quickstart", ["profile=smoke"])`` resolves the config, makes
the run folder ``<out>/<recipe>/<name or timestamp>/`` (rank 0 only under torchrun),
trains each pair with :func:`mmpos.runner.train.train_run` and writes ``results.md``
(printed too; with the recipe's ``baseline``, each encoder's :func:`paired_differences` from
it), ``results.json`` and ``results.png`` (:func:`mmpos.runner.plots.plot_results`).

Everything a config can get wrong is checked before the run folder is made (the run name,
``--out``, ``model.pos_kwargs`` against the encoders' signatures, then one build of every
encoder's task); a folder whose first run fails is removed. A running folder is locked
(``.lock``), so a second ``--resume`` of it is refused. ``config.yaml`` holds the resolved
config; resuming reads it back as is (the profile is not applied again).
"""

from __future__ import annotations

import contextlib
import difflib
import json
import math
import os
import shutil
import statistics
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from .config import (
    RESUME_OVERRIDABLE,
    ConfigError,
    check_folder_name,
    dump_run_config,
    find_recipe,
    load_yaml,
    read_run_config,
    resolve_config,
)
from .stats import check_validation, learning_curve_area, paired_differences, summarize, verdicts
from .train import (
    Dist,
    RunError,
    WriteFailed,
    atomic_write,
    init_distributed,
    remove_temporaries,
    require_tensorboard,
    seed_everything,
    train_run,
)

__all__ = [
    "RESUME_OVERRIDABLE",
    "results_table",
    "run_recipe",
]


def _cell(row: dict[str, Any], key: str, seeds: int) -> str:
    """``mean ± std`` of ``key`` (``mean`` alone for one seed); ``–`` where the run has no such metric."""
    if key not in row["mean"]:
        return "–"
    return f"{row['mean'][key]:.4f} ± {row['std'][key]:.4f}" if seeds > 1 else f"{row['mean'][key]:.4f}"


def _diff_cell(d: dict[str, float] | None) -> str:
    """``+0.1234 [+0.0100, +0.2000] *`` (``*``: the interval excludes 0); the mean alone for one seed."""
    if d is None:
        return "–"
    if math.isnan(d["low"]):
        return f"{d['mean']:+.4f}"
    real = " *" if d["low"] > 0 or d["high"] < 0 else ""
    return f"{d['mean']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}]{real}"


def results_table(
    finals: list[dict[str, Any]],
    title: str = "",
    baseline: str | None = None,
    validation: Mapping[str, Any] | None = None,
) -> str:
    """Markdown table: one row per encoder, ranked, ``mean ± std`` over seeds for each metric.

    With ``baseline`` (an encoder of ``finals``), a second table gives every other encoder's
    :func:`paired_differences` from it: mean difference and 95% bootstrap interval over seeds.
    With ``validation`` (a recipe's ``validation:`` section), a last table gives the
    :func:`~mmpos.runner.stats.verdicts` of its claims.
    """
    text = _results_table(finals, title, baseline)
    return text if not validation else text + _verdict_table(finals, validation)


def _verdict_table(finals: list[dict[str, Any]], validation: Mapping[str, Any]) -> str:
    lines = [
        '\nVerdicts (`validation:`; docs/recipes.md, "Validation that decides"):\n',
        "| claim | encoder − baseline | metric | controls | difference [95% CI] | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for v in verdicts(finals, validation):
        controls = ", ".join(f"{e} {m} {x:.3f} (≥ {low:.2f})" for e, m, x, low in v["controls"]) or "–"
        side = ">" if v["direction"] == "higher" else "<"
        lines.append(
            f"| {v['claim']} | {v['encoder']} − {v['baseline']} ({side} 0) | {v['metric']} | {controls} | "
            f"{_diff_cell(v['diff'])} | **{v['verdict']}**: {v['reason']} |"
        )
    return "\n".join(lines) + "\n"


def _results_table(finals: list[dict[str, Any]], title: str, baseline: str | None) -> str:
    ranked, metric, higher = summarize(finals)
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
    text = "\n".join(line for line in lines if line) + "\n" + note + "\n"
    if baseline is None or len(ranked) < 2:
        return text
    rows = paired_differences(finals, baseline)
    lines = [
        f"\nPaired difference from `{baseline}` (encoder − {baseline}, seed by seed):\n",
        "| encoder | " + " | ".join(keys) + " |",
        "|" + "---|" * (len(keys) + 1),
    ]
    for r in rows:
        lines.append(f"| {r['encoder']} | " + " | ".join(_diff_cell(r["diff"].get(k)) for k in keys) + " |")
    if seeds > 1:
        note = (
            "\nMean difference over the seeds both ran and its 95% percentile bootstrap interval (10 000 "
            "resamples of the per-seed differences, numpy seed 0); `*`: the interval excludes 0."
        )
        if seeds <= 3:
            note += f" With {seeds} seeds the interval is the range of the differences: `*` means every seed agrees."
    else:
        note = "\nOne seed: the difference of that seed, no interval."
    return text + "\n".join(lines) + "\n" + note + "\n"


def _check_name(name: Any) -> None:
    """A run name is one folder name: a string, no path separators, not ``.`` / ``..``."""
    if name is None:
        return
    if not isinstance(name, str):
        raise ConfigError(f"config key 'name' must be a string, got {name!r}; quote it: name: '{name}'")
    if not name or name in (".", "..") or any(c in name for c in "/\\\0") or Path(name).is_absolute():
        raise ConfigError(f"config key 'name' must be one folder name inside --out (no '/', '..'), got {name!r}")


def _check_root(root: Path) -> None:
    if root.exists() and not root.is_dir():
        raise ConfigError(f"--out {root} is a file, not a folder")


def _new_run_dir(root: Path, recipe_name: str, name: str | None) -> Path:
    """Make and return a new run folder; ``mkdir`` decides, so two runs started together never share one."""
    base = root / recipe_name
    base.mkdir(parents=True, exist_ok=True)
    if name:
        folder = base / name
        try:
            folder.mkdir()
        except FileExistsError:
            raise FileExistsError(
                f"run folder {folder} exists; pick another name= or continue it with --resume {folder}"
            ) from None
        return folder
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for i in range(1000):
        folder = base / (stamp if i == 0 else f"{stamp}-{i}")
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue
    raise FileExistsError(f"{base}: 1000 run folders named {stamp}-*; name the run with name=")


def _resume_dir(path: str | Path) -> Path:
    """The run folder ``path`` itself: it must hold its own ``config.yaml`` (no folder above is searched)."""
    folder = Path(path).resolve()
    if (folder / "config.yaml").is_file():
        return folder
    if not folder.is_dir():
        raise FileNotFoundError(f"--resume {path}: not a folder; name a run folder (it holds config.yaml)")
    above = next((p for p in folder.parents if (p / "config.yaml").is_file()), None)
    hint = f"; the run folder above it is {above}: --resume {above}" if above else "; is it a run folder?"
    raise FileNotFoundError(f"--resume {path}: no config.yaml in it{hint}")


def _check_pos_kwargs(cfg: Mapping[str, Any]) -> None:
    """``model.pos_kwargs``: registered encoder names, each with arguments its factory accepts."""
    model = cfg.get("model")
    pos_kwargs = model.get("pos_kwargs") if isinstance(model, Mapping) else None
    if pos_kwargs is None:
        return
    if not isinstance(pos_kwargs, Mapping):
        raise ConfigError(f"config key 'model.pos_kwargs' must map encoder names to arguments, got {pos_kwargs!r}")
    from ..encoders.registry import check_arguments, list_encoders

    known = [i.name for i in list_encoders()]
    for enc, kwargs in pos_kwargs.items():
        where = f"model.pos_kwargs.{enc}"
        if enc not in known:
            close = difflib.get_close_matches(str(enc), known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"config key {where!r}: {enc!r} is not an encoder{hint} (mmpos list)")
        if not isinstance(kwargs, Mapping):
            raise ConfigError(f"config key {where!r} must be a mapping of arguments, got {kwargs!r}")
        try:
            check_arguments(enc, kwargs)
        except ValueError as e:
            raise ConfigError(f"config key {where!r}: {e}") from None


def _preflight(cfg: dict[str, Any], device: torch.device) -> None:
    """Build every encoder's task once (and evaluate the first) before anything trains.

    A bad argument value or data setting fails here, in a second, not after a partial sweep.
    The global random state is left to each run's own seeding.
    """
    from .tasks import get_task

    info = get_task(cfg["task"], cfg.get("task_module"))
    for i, encoder in enumerate(cfg["encoders"]):
        seed_everything(cfg["seeds"][0])
        try:
            task = info.build(cfg, encoder, cfg["seeds"][0], device)
            if i == 0:
                task.model.to(device).eval()
                with torch.no_grad():
                    task.evaluate(task.model)
        except (ValueError, TypeError) as e:
            raise ConfigError(f"encoder {encoder!r}: {e}") from e
        except (ArithmeticError, IndexError, KeyError, RuntimeError) as e:  # e.g. data.eval_size=0
            raise ConfigError(
                f"task {cfg['task']!r} with encoder {encoder!r} cannot be built and evaluated with this config "
                f"({type(e).__name__}: {e}); check the model.* and data.* settings"
            ) from e


@contextlib.contextmanager
def _locked(folder: Path, active: bool):
    """Hold an exclusive lock on ``folder/.lock`` while the run runs (released when the process dies)."""
    if not active:
        yield
        return
    path = folder / ".lock"
    f = open(path, "a+", encoding="utf-8")  # noqa: SIM115 -- held for the whole run
    try:
        try:
            import fcntl

            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except ImportError:  # not POSIX: the lock file's content is the best we have
            pass
        except OSError:
            f.seek(0)
            owner = f.read().strip() or "another process"
            raise RunError(f"run folder {folder} is in use by {owner}; wait for it to finish") from None
        f.seek(0)
        f.truncate()
        f.write(f"mmpos run (pid {os.getpid()})")
        f.flush()
        yield
    finally:
        f.close()


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
        recipe_name = folder.parent.name
        if recipe is not None and not isinstance(recipe, Mapping):
            given = Path(str(recipe)).name.removesuffix(".yaml").removesuffix(".yml")
            if given != recipe_name:
                raise ConfigError(
                    f"--resume {folder} continues a run of recipe {recipe_name!r}, not {str(recipe)!r}; "
                    "drop the recipe or name the same one"
                )
        if out is not None and Path(out).resolve() != folder.parent.parent:
            raise ConfigError(f"--out {out} with --resume {folder}: the run stays in {folder.parent.parent}")
        saved = read_run_config(folder / "config.yaml")  # RunError names a cut, edited or damaged file
        # config.yaml is the resolved config: read it as is (its profile was applied when it was written)
        cfg = resolve_config({**saved, "profile": None}, overrides)
        cfg["profile"] = saved.get("profile")
    else:
        if isinstance(recipe, Mapping):
            raw = dict(recipe)
        else:
            path = find_recipe(recipe)
            raw, name = load_yaml(path), path.stem
        cfg = resolve_config(raw, overrides)
        recipe_name = check_folder_name(name, "the recipe name (name=)")
        _check_name(cfg["name"])
        _check_root(Path(out if out is not None else cfg["out"]))
    _check_pos_kwargs(cfg)
    if cfg["logger"] == "tensorboard":
        require_tensorboard()  # a missing package is named now, not after the folder is made
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
        _preflight(cfg, device)
        root = Path(out if out is not None else cfg["out"])
        cfg = {**cfg, "out": str(root)}  # the folder the run went to, whether from out: or --out
        folder = _new_run_dir(root, recipe_name, cfg["name"]) if ddp.is_main else None
        if ddp.enabled:
            shared = [str(folder) if folder else None]
            dist.broadcast_object_list(shared, src=0)
            folder = Path(shared[0])  # type: ignore[arg-type]
        if ddp.is_main:
            try:
                atomic_write(folder / "config.yaml", dump_run_config(cfg))  # type: ignore[operator]
            except WriteFailed:
                shutil.rmtree(folder, ignore_errors=True)  # type: ignore[arg-type]  # no folder without its config
                raise
    assert folder is not None
    try:
        with _locked(folder, ddp.is_main):
            return _train_all(cfg, recipe_name, folder, ddp, device, resume)
    except BaseException as e:
        if ddp.is_main and not resume and _only_config(folder):
            shutil.rmtree(folder, ignore_errors=True)  # nothing was trained: leave no half-written folder
        elif ddp.is_main and isinstance(e, Exception) and not isinstance(e, (RunError, WriteFailed)):
            with contextlib.suppress(WriteFailed):  # not an interruption: mark the run failed, if the disk lets us
                atomic_write(folder / "failed.json", json.dumps({"error": f"{type(e).__name__}: {e}"}, indent=2) + "\n")
        e.run_folder = folder if folder.is_dir() else None  # type: ignore[union-attr]  # mmpos run: the --resume hint
        raise


def _only_config(folder: Path) -> bool:
    """``True`` when the run folder holds nothing but its config (and lock), or no pair wrote a file."""
    if not folder.is_dir():
        return False
    return all(p.name in ("config.yaml", ".lock") or (p.is_dir() and not any(p.rglob("*.*"))) for p in folder.iterdir())


def _train_all(
    cfg: dict[str, Any], recipe_name: str, folder: Path, ddp: Dist, device: torch.device, resume: bool
) -> dict[str, Any]:
    """Train every (encoder, seed) pair into ``folder`` and write the results."""
    if ddp.is_main:
        (folder / "failed.json").unlink(missing_ok=True)
        remove_temporaries(folder)  # left by a killed run (we hold the lock: nobody else writes here)
    validation = cfg.get("validation") or None  # a validation task's section (docs/recipes.md)
    if validation:
        check_validation(validation)  # before anything trains
    pairs = [(e, s) for e in cfg["encoders"] for s in cfg["seeds"]]
    finals = []
    for i, (encoder, seed) in enumerate(pairs, 1):
        if ddp.is_main and cfg["progress"]:
            print(f"[{i}/{len(pairs)}] {recipe_name}: encoder={encoder} seed={seed} device={device}", flush=True)
        finals.append(train_run(cfg, encoder, seed, folder / encoder / f"seed{seed}", device, ddp, resume))
    if validation:
        for f, (encoder, seed) in zip(finals, pairs):  # area under the learning curve of the metric
            path = folder / encoder / f"seed{seed}" / "metrics.jsonl"
            if path.is_file():
                f["metrics"][f"{f['metric']}:aulc"] = learning_curve_area(path, f["metric"])
    table = None
    if ddp.is_main:
        title = f"{recipe_name} ({cfg['task']}, {cfg['steps']} steps)"
        table = results_table(finals, title, cfg["baseline"], validation)
        atomic_write(folder / "results.md", table)
        atomic_write(folder / "results.json", json.dumps(finals, indent=2) + "\n")
        from .plots import plot_results  # matplotlib loads only here

        plot_results(finals, folder / "results.png", title, folder)
        print("\n" + table + f"\nrun folder: {folder}", flush=True)
    return {"folder": folder if ddp.is_main else None, "config": cfg, "finals": finals, "table": table}
