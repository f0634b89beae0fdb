"""The task contract of the recipe runner, and the task registry.

A task module registers a builder ``build(cfg, encoder, seed, device) -> Task`` with
:func:`register_task`. The task modules of every installed recipe package
(``<package>.tasks.*``, see :func:`mmpos.runner.packages.recipe_packages`) are imported on demand:
first the ones named after the task or a prefix of it (``spatial_relations`` ->
``spatial_relations``, ``spatial``), then, if the name is still unknown, all of them. A new file
is all it takes to add tasks; a module elsewhere is named by the recipe's ``task_module`` key.
See ``docs/recipes.md``.
"""

from __future__ import annotations

import importlib
import math
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from . import packages

__all__ = [
    "NUMBER",
    "EncoderSpec",
    "Task",
    "TaskInfo",
    "encoder_names",
    "get_task",
    "list_tasks",
    "parse_encoders",
    "register_task",
]


@dataclass
class Task:
    """What a builder returns; the runner owns the optimizer, devices, DDP and files.

    Attributes:
        model: the model to train (the runner moves it to the device and wraps it for DDP).
        train_batch: ``step -> batch``, the *global* batch of training step ``step``; a pure
            function of the task's seed and ``step``. Tensors (possibly nested in tuples,
            lists, dicts) with the batch as first dimension.
        loss: ``(model, batch) -> loss`` or ``(loss, {name: float})``.
        evaluate: ``model -> {metric: float}``; called in eval mode under ``no_grad``.
        metric: the key of ``evaluate``'s dict that ranks runs and selects ``best.pt``.
        higher_is_better: direction of ``metric``.
        param_groups: optional ``model -> optimizer parameter groups``.
        chance: the value of ``metric`` (and of the task's other accuracies) by guessing, e.g.
            ``0.25`` for four balanced classes; ``results.png`` draws it as a line. ``None``: no such value.
    """

    model: nn.Module
    train_batch: Callable[[int], Any]
    loss: Callable[[nn.Module, Any], Tensor | tuple[Tensor, dict[str, float]]]
    evaluate: Callable[[nn.Module], dict[str, float]]
    metric: str
    higher_is_better: bool = True
    param_groups: Callable[[nn.Module], list[dict[str, Any]]] | None = None
    chance: float | None = None

    def __post_init__(self) -> None:
        if self.chance is not None and not (isinstance(self.chance, (int, float)) and math.isfinite(self.chance)):
            raise ValueError(f"Task.chance must be a finite number or None, got {self.chance!r}")


Builder = Callable[[dict, str, int, torch.device], Task]


@dataclass(frozen=True)
class TaskInfo:
    """A registered task: its builder and the config keys it owns (with defaults)."""

    name: str
    build: Builder
    defaults: dict[str, Any]


_TASKS: dict[str, TaskInfo] = {}
_IMPORT_ERRORS: dict[str, str] = {}


def register_task(name: str, defaults: dict[str, Any] | None = None) -> Callable[[Builder], Builder]:
    """Decorator registering ``build(cfg, encoder, seed, device) -> Task`` under ``name``.

    ``defaults`` holds the config keys the task owns (e.g. ``{"model": {...}, "data": {...}}``);
    the config validator accepts them besides the runner's keys.
    """

    def wrap(build: Builder) -> Builder:
        if name in _TASKS and _TASKS[name].build is not build:
            raise ValueError(f"task name {name!r} is already registered")
        _TASKS[name] = TaskInfo(name, build, dict(defaults or {}))
        return build

    return wrap


def _task_packages() -> list[str]:
    """``<package>.tasks`` of every installed recipe package."""
    return [f"{package}.tasks" for package in packages.recipe_packages()]


def _modules(package: str) -> list[str]:
    """The public module names of ``package`` (``[]`` if it cannot be imported: reported when a task stays unknown)."""
    try:
        path = importlib.import_module(package).__path__
    except ImportError as e:
        _IMPORT_ERRORS[package] = f"{type(e).__name__}: {e}"
        return []
    return [m.name for m in pkgutil.iter_modules(path) if not m.name.startswith("_")]


def _import(package: str, modules: list[str]) -> None:
    for name in modules:
        try:
            importlib.import_module(f"{package}.{name}")
        except ImportError as e:  # e.g. an optional dependency; reported if the task stays unknown
            _IMPORT_ERRORS[f"{package}.{name}"] = f"{type(e).__name__}: {e}"


def _import_all() -> None:
    for package in _task_packages():
        _import(package, _modules(package))


def get_task(name: str, module: str | None = None) -> TaskInfo:
    """The task ``name``, importing ``module`` first (if given) and the recipe packages' task modules."""
    if module:
        importlib.import_module(module)
    if name not in _TASKS:  # fast path: a module named after the task or a prefix of it
        parts = name.split("_")
        prefixes = ["_".join(parts[:i]) for i in range(len(parts), 0, -1)]
        for package in _task_packages():
            known = set(_modules(package))
            _import(package, [m for m in prefixes if m in known])
    if name not in _TASKS:
        _import_all()
    if name not in _TASKS:
        failed = "".join(f"\n  could not import {m}: {err}" for m, err in sorted(_IMPORT_ERRORS.items()))
        raise ValueError(f"unknown task {name!r}; known tasks: {sorted(_TASKS)}{failed}")
    return _TASKS[name]


def list_tasks() -> list[str]:
    """Names of every task the recipe packages' task modules register."""
    _import_all()
    return sorted(_TASKS)


#: In a task's accepted variants, any number (``v2pe@0.25``).
NUMBER = "<number>"


@dataclass(frozen=True)
class EncoderSpec:
    """One entry of a recipe's ``encoders:`` list, parsed by :func:`parse_encoders`.

    Grammar: ``spec := item ('+' item)*``, ``item := name ['@' variant]``: ``learned+irpe``
    (encoders combined in one model), ``v2pe@rand`` (a scheme's option), ``peg@scratch`` (how the
    run starts). ``items`` holds ``(name, variant)`` pairs, ``variant`` ``None`` when absent.
    """

    entry: str
    items: tuple[tuple[str, str | None], ...]

    @property
    def names(self) -> list[str]:
        """The encoder names, in order."""
        return [name for name, _ in self.items]

    @property
    def variant(self) -> str | None:
        """The variant of a task whose variant applies to the whole run (written after the last name)."""
        return self.items[-1][1]


def _accepts(variant: str, accepted: tuple[str, ...]) -> bool:
    if variant in accepted:
        return True
    try:
        return NUMBER in accepted and math.isfinite(float(variant))
    except ValueError:
        return False


def parse_encoders(
    entry: str,
    variants: tuple[str, ...] | Mapping[str, tuple[str, ...]] = (),
    *,
    combine: bool = True,
    whole_run: bool = False,
) -> EncoderSpec:
    """Parse ``entry`` (see :class:`EncoderSpec`) and check it against what the task accepts.

    Args:
        variants: the ``@`` variants the task accepts, for every name (a tuple) or per name (a
            mapping); :data:`NUMBER` stands for any number.
        combine: whether the task builds several encoders joined by ``+``.
        whole_run: the variant applies to the whole run, so it is written once, after the last name
            (``learned+irpe@scratch``).

    Raises ``ValueError``, one line naming the entry and what is accepted.
    """
    if not isinstance(entry, str):
        raise TypeError(f"encoders entry must be a string like 'name', 'a+b' or 'name@variant', got {entry!r}")
    items = []
    for item in entry.split("+"):
        name, at, variant = (part.strip() for part in item.partition("@"))
        if not name or (at and not variant):
            raise ValueError(f"encoders entry {entry!r}: each item must be 'name' or 'name@variant', got {item!r}")
        items.append((name, variant or None))
    if len(items) > 1 and not combine:
        raise ValueError(f"encoders entry {entry!r}: this task takes one name, not several joined by '+'")
    for i, (name, variant) in enumerate(items):
        if variant is None:
            continue
        accepted = tuple(variants.get(name, ()) if isinstance(variants, Mapping) else variants)
        if not _accepts(variant, accepted):
            takes = ", ".join(f"'{name}@{v}'" for v in accepted) if accepted else f"'{name}' without '@'"
            raise ValueError(f"encoders entry {entry!r}: '{name}@{variant}' is not accepted; this task takes {takes}")
        if whole_run and i < len(items) - 1:
            last = items[-1][0]
            raise ValueError(
                f"encoders entry {entry!r}: '@{variant}' applies to the whole run: write it once, after {last!r}"
            )
    return EncoderSpec(entry, tuple(items))


def encoder_names(encoder: str) -> list[str]:
    """``"rope-axial+peg"`` -> ``["rope-axial", "peg"]``; ``"none"`` -> ``["none"]`` (no ``@`` variants)."""
    return parse_encoders(encoder).names
