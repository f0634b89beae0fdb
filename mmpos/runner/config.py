"""Recipe configs: YAML (a ``yaml.SafeLoader``), profiles, dotted ``key=value`` overrides, validation.

Shipped recipes are package data of the installed *recipe packages* (:mod:`mmpos.runner.packages`;
mmpos's own is the top-level :mod:`recipes` package): each holds ``configs/NAME.yaml`` and a ``tasks``
subpackage. They are found with :mod:`importlib.resources` (:func:`list_recipes`,
:func:`find_recipe`): a YAML file added to such a folder is a recipe, with no registration, and the
library never imports a recipe package by its name.

Resolution order: the recipe file, then ``profiles[profile]`` merged over it (the profile
may be chosen by an override, ``profile=smoke``), then the command-line overrides. The
result is checked against the runner's keys (:data:`RUNNER_DEFAULTS`) plus the keys the
task declares in :func:`mmpos.runner.tasks.register_task`; defaults fill what is missing.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import importlib.resources
import json
import math
import re
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._extras import requires
from .._validate import is_int, is_real
from . import packages

with requires("recipes"):  # one line naming the package and the extra when it is missing
    import yaml

if TYPE_CHECKING:  # importlib.resources.abc is Python >= 3.11
    from importlib.resources.abc import Traversable

__all__ = [
    "LOGGERS",
    "RESUME_OVERRIDABLE",
    "RUNNER_DEFAULTS",
    "ConfigError",
    "RunError",
    "check_folder_name",
    "config_digest",
    "dump_run_config",
    "find_recipe",
    "list_recipes",
    "load_yaml",
    "merge",
    "parse_overrides",
    "read_run_config",
    "recipe_description",
    "resolve_config",
    "shipped_recipe",
]

#: Keys the runner owns, with their defaults (tasks add their own, see docs/recipes.md).
RUNNER_DEFAULTS: dict[str, Any] = {
    "task": None,
    "task_module": None,
    "description": None,
    "name": None,
    "encoders": ["none"],
    "baseline": None,
    "seeds": [0],
    "steps": 100,
    "batch_size": 32,
    "eval_every": 0,
    "log_every": 10,
    "optim": {
        "lr": 1.0e-3,
        "weight_decay": 0.05,
        "betas": [0.9, 0.999],
        "warmup_steps": 0,
        "min_lr_ratio": 0.0,
        "grad_clip": 1.0,
    },
    "device": "auto",
    "threads": 0,
    "deterministic": False,
    "progress": True,
    "logger": "jsonl",
    "out": "runs",
    "profile": None,
    "profiles": {},
}


#: Values of the ``logger`` key: ``metrics.jsonl`` only, or also TensorBoard event files.
LOGGERS = ("jsonl", "tensorboard")


#: Keys that may change when resuming (they do not change the results; ``baseline`` changes only the table).
RESUME_OVERRIDABLE = ("device", "threads", "progress", "baseline")


class ConfigError(ValueError):
    """A recipe config that cannot be used; the message names the key."""


class RunError(ValueError):
    """A run folder that cannot be used (damaged beyond recovery, busy, not a folder); names the file."""


class SafeLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that also reads ``3e-4`` and ``1e5`` as floats (YAML 1.2), not strings.

    Only the resolver of plain scalars changes; constructors stay the safe ones.
    """


SafeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def safe_load(text: str) -> Any:
    """``yaml.safe_load`` with :class:`SafeLoader` (exponent floats without a dot)."""
    return yaml.load(text, Loader=SafeLoader)


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping with :func:`safe_load` (an empty file gives ``{}``)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason}); save the file as UTF-8") from None
    except IsADirectoryError:
        raise ConfigError(f"{path} is a folder, not a YAML file") from None
    try:
        data = safe_load(text)
    except yaml.YAMLError as e:  # one line: where and what
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise ConfigError(f"{path}: not valid YAML{where}: {getattr(e, 'problem', None) or e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a recipe must be a YAML mapping, got {type(data).__name__}")
    return data


_DIGEST_LINE = "# mmpos sha256 "  # the last line of a run folder's config.yaml: the digest of the lines above


def config_digest(cfg: Mapping[str, Any]) -> str:
    """SHA-256 of the resolved config ``cfg`` without the :data:`RESUME_OVERRIDABLE` keys (canonical JSON).

    Each checkpoint records it; a resume whose config has another digest is refused.
    """
    kept = {k: v for k, v in cfg.items() if k not in RESUME_OVERRIDABLE}
    text = json.dumps(kept, sort_keys=True, separators=(",", ":"), default=repr, allow_nan=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def dump_run_config(cfg: Mapping[str, Any]) -> str:
    """The text of a run folder's ``config.yaml``: the resolved config, then a line with its SHA-256.

    :func:`read_run_config` checks that line, so a file cut short or changed on disk is named
    on ``--resume`` instead of being filled with defaults.
    """
    body = yaml.safe_dump(dict(cfg), sort_keys=False, allow_unicode=True)
    return f"{body}{_DIGEST_LINE}{hashlib.sha256(body.encode('utf-8')).hexdigest()} (checked on --resume)\n"


def read_run_config(path: str | Path) -> dict[str, Any]:
    """Read back a run folder's ``config.yaml`` written by :func:`dump_run_config`, verifying its digest.

    Raises :class:`RunError` naming the file when it is missing, not UTF-8, cut short, edited
    or otherwise damaged (its last line does not hold the digest of the lines above).
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise RunError(f"{path} is missing; the run folder cannot be resumed without it") from None
    except OSError as e:
        raise RunError(f"{path} cannot be read ({e.strerror or e})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RunError(
            f"{path} is damaged: not UTF-8 text (byte {e.start}); the run cannot be resumed from it"
        ) from None
    body, _, last = text.rstrip("\n").rpartition("\n")
    body += "\n"
    if not last.startswith(_DIGEST_LINE):
        raise RunError(
            f"{path} is damaged: its last line is not the '{_DIGEST_LINE.strip()}' line (cut short?); "
            "the run cannot be resumed from it"
        )
    digest = last[len(_DIGEST_LINE) :].split()[0] if last[len(_DIGEST_LINE) :].split() else ""
    if hashlib.sha256(body.encode("utf-8")).hexdigest() != digest:
        raise RunError(
            f"{path} is damaged or was edited (its content does not match its sha256 line); "
            "the run cannot be resumed from it"
        )
    cfg = safe_load(body)
    if not isinstance(cfg, dict):
        raise RunError(f"{path} is damaged: not a YAML mapping")
    return cfg


def check_folder_name(value: Any, what: str) -> str:
    """A name that becomes one folder of a run path: a non-empty string, no separators, not ``.`` / ``..``."""
    if not isinstance(value, str):
        raise ConfigError(f"{what} must be a string (it names a folder), got {value!r}")
    if (
        not value
        or value.strip() != value
        or value in (".", "..")
        or any(c in value for c in "/\\\0:")
        or Path(value).is_absolute()
    ):
        raise ConfigError(f"{what} must be one folder name inside --out (no '/', '\\', ':' or '..'), got {value!r}")
    return value


def _shipped() -> dict[str, Traversable]:
    """``{recipe name: its YAML resource}`` over every recipe package; a name two packages ship is an error."""
    found: dict[str, Traversable] = {}
    owner: dict[str, str] = {}
    for package in packages.recipe_packages():
        folder = importlib.resources.files(package) / "configs"
        if not folder.is_dir():
            continue
        for item in folder.iterdir():
            if not (item.name.endswith(".yaml") and item.is_file()):
                continue
            stem = item.name.removesuffix(".yaml")
            if stem in found:
                raise ConfigError(f"recipe {stem!r} is shipped by two recipe packages: {owner[stem]!r} and {package!r}")
            found[stem], owner[stem] = item, package
    return found


def list_recipes() -> list[str]:
    """Names of the shipped recipes (every ``configs/*.yaml`` of every recipe package), sorted."""
    return sorted(_shipped())


def shipped_recipe(name: str) -> Traversable:
    """The package resource of the shipped recipe ``name`` (``quickstart`` or ``quickstart.yaml``)."""
    stem = name.removesuffix(".yaml")
    shipped = _shipped()
    if stem not in shipped:
        close = difflib.get_close_matches(stem, list(shipped), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise FileNotFoundError(f"no shipped recipe {name!r}{hint} (shipped: {sorted(shipped)})")
    return shipped[stem]


def recipe_description(name: str) -> str:
    """The ``description:`` of the shipped recipe ``name`` (``""`` where it has none)."""
    data = safe_load(shipped_recipe(name).read_text(encoding="utf-8"))
    text = data.get("description") if isinstance(data, dict) else None
    return " ".join(str(text).split()) if text else ""


def find_recipe(recipe: str | Path) -> Path:
    """A recipe file: ``recipe`` itself when it is a file, else the shipped recipe of that name.

    Raises ``FileNotFoundError`` naming the shipped recipes when it is neither.
    """
    path = Path(recipe)
    if path.is_file():
        return path
    try:
        resource = shipped_recipe(str(recipe))
    except FileNotFoundError as e:
        raise FileNotFoundError(f"no recipe {str(recipe)!r}: not a file, and {e}") from None
    # A wheel installs package data as plain files, so the resource is a filesystem path.
    return Path(str(resource))


def merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """Deep merge: nested mappings merge key by key, everything else in ``update`` replaces."""
    out = copy.deepcopy(dict(base))
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def parse_overrides(items: Iterable[str]) -> dict[str, Any]:
    """``["optim.lr=3e-4", "encoders=[none,rope]"]`` -> nested dict; values parsed as YAML."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        parts = key.split(".")
        if not sep or not key or not all(parts):
            raise ConfigError(f"override must look like key=value or a.b=value, got {item!r}")
        try:
            value = safe_load(text) if text.strip() else None
        except yaml.YAMLError as e:
            raise ConfigError(f"override {item!r}: the value is not valid YAML ({e})") from None
        node = out
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r} conflicts with an earlier override of {part!r}")
            node = child
        node[parts[-1]] = value
    return out


def _check_keys(cfg: Mapping[str, Any], known: Mapping[str, Any], where: str = "") -> None:
    for key, value in cfg.items():
        name = f"{where}{key}"
        if key not in known:
            close = difflib.get_close_matches(str(key), [str(k) for k in known], n=1)
            hint = f"; did you mean {where + close[0]!r}?" if close else ""
            raise ConfigError(f"unknown config key {name!r}{hint} (known: {sorted(map(str, known))})")
        if isinstance(known[key], Mapping) and known[key]:  # a section with declared keys
            if not isinstance(value, Mapping):
                raise ConfigError(f"config key {name!r} must be a mapping, got {value!r}")
            _check_keys(value, known[key], f"{name}.")


def _check_runner_values(cfg: Mapping[str, Any]) -> None:
    def fail(key: str, expected: str) -> None:
        raise ConfigError(f"config key {key!r} must be {expected}, got {cfg_get(cfg, key)!r}")

    if not isinstance(cfg["task"], str) or not cfg["task"]:
        fail("task", "the name of a registered task")
    for key in ("encoders", "seeds"):
        value = cfg[key]
        if isinstance(value, str) or is_real(value):  # a scalar where a list is wanted
            raise ConfigError(
                f"config key {key!r} must be a list, got the single value {value!r}; write {key}=[{value}] "
                f"(in YAML: {key}: [{value}])"
            )
        if not isinstance(value, list) or not value:
            fail(key, "a non-empty list")
    if not all(isinstance(e, str) and e for e in cfg["encoders"]):
        fail("encoders", "a list of encoder names")
    for e in cfg["encoders"]:
        check_folder_name(e, f"encoder name {e!r} (config key 'encoders')")
    if not all(is_int(s) for s in cfg["seeds"]):
        fail("seeds", "a list of integers")
    for key in ("encoders", "seeds"):
        if len(set(cfg[key])) != len(cfg[key]):
            fail(key, "a list without repeats")
    if cfg["baseline"] is not None and cfg["baseline"] not in cfg["encoders"]:
        raise ConfigError(
            f"config key 'baseline' must be one of the swept encoders {cfg['encoders']} or null, got "
            f"{cfg['baseline']!r}; add it to encoders or set baseline=null"
        )
    if cfg["logger"] not in LOGGERS:
        fail("logger", " or ".join(map(repr, LOGGERS)))
    for key, low in (("steps", 1), ("batch_size", 1), ("eval_every", 0), ("log_every", 0), ("threads", 0)):
        if not is_int(cfg[key]) or cfg[key] < low:
            fail(key, f"an integer >= {low}")
    o = cfg["optim"]
    for key in ("lr", "weight_decay", "min_lr_ratio", "grad_clip"):
        if not is_real(o[key]) or not 0 <= o[key] < math.inf:
            fail(f"optim.{key}", "a finite number >= 0")
    if not is_int(o["warmup_steps"]) or o["warmup_steps"] < 0:
        fail("optim.warmup_steps", "an integer >= 0")
    betas = o["betas"]
    if not (isinstance(betas, list) and len(betas) == 2 and all(is_real(b) and 0 <= b < 1 for b in betas)):
        fail("optim.betas", "a list of two numbers in [0, 1)")
    if not isinstance(cfg["device"], str):
        fail("device", "'auto', 'cpu', 'cuda' or 'cuda:N'")
    if cfg["description"] is not None and not isinstance(cfg["description"], str):
        fail("description", "a one-line string")


def cfg_get(cfg: Mapping[str, Any], dotted: str) -> Any:
    """``cfg_get(cfg, "optim.lr")``; ``None`` where a part is missing."""
    node: Any = cfg
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return node


def _drop_unswept_baseline(cfg: dict[str, Any], over: Mapping[str, Any]) -> str | None:
    """The recipe's ``baseline`` gives way when the caller sweeps other encoders; returns the warning to give.

    A baseline the caller names itself must be swept (checked with the other values). The
    warning is given once the config is valid, so a mistake is not preceded by it.
    """
    baseline, encoders = cfg.get("baseline"), cfg.get("encoders")
    if "baseline" in over or baseline is None or not isinstance(encoders, list) or baseline in encoders:
        return None
    cfg["baseline"] = None
    return (
        f"the recipe's baseline {baseline!r} is not among encoders {encoders}: no paired-difference table "
        "(name one with baseline=<encoder>)"
    )


def resolve_config(
    recipe: Mapping[str, Any],
    overrides: Iterable[str] | Mapping[str, Any] = (),
    task_defaults: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Recipe + profile + overrides, filled with defaults and validated.

    ``task_defaults`` are the keys the task declares; when ``None`` they are looked up
    from the task registry with the resolved ``task`` / ``task_module``.
    """
    over = dict(overrides) if isinstance(overrides, Mapping) else parse_overrides(overrides)
    cfg = merge(recipe, over)
    profile = cfg.get("profile")
    profiles = cfg.get("profiles") or {}
    if not isinstance(profiles, Mapping):
        raise ConfigError(f"config key 'profiles' must map profile names to partial configs, got {profiles!r}")
    if profile is not None:
        if profile not in profiles:
            raise ConfigError(f"unknown profile {profile!r}; this recipe has profiles {sorted(profiles)}")
        if not isinstance(profiles[profile], Mapping):
            raise ConfigError(f"profiles.{profile} must be a mapping, got {profiles[profile]!r}")
        if "profile" in profiles[profile] or "profiles" in profiles[profile]:
            raise ConfigError(f"profiles.{profile} may not set 'profile' or 'profiles'")
        cfg = merge(merge(recipe, profiles[profile]), over)  # overrides win over the profile
    dropped = _drop_unswept_baseline(cfg, over)
    if not cfg.get("task"):
        raise ConfigError("the recipe must name its task: task: <name> (see docs/recipes.md)")
    if task_defaults is None:
        from .tasks import get_task

        try:
            task_defaults = get_task(cfg["task"], cfg.get("task_module")).defaults
        except ImportError as e:
            raise ConfigError(f"config key 'task_module': cannot import {cfg.get('task_module')!r} ({e})") from None
    clash = set(task_defaults) & set(RUNNER_DEFAULTS)
    if clash:
        raise ConfigError(f"task {cfg['task']!r} declares keys the runner owns: {sorted(clash)}")
    defaults = merge(RUNNER_DEFAULTS, task_defaults)
    for name, partial in profiles.items():  # a typo in an unused profile is still a typo
        if isinstance(partial, Mapping):
            try:
                _check_keys(partial, defaults)
            except ConfigError as e:
                raise ConfigError(f"profiles.{name}: {e}") from None
    _check_keys(cfg, defaults)
    cfg = merge(defaults, cfg)
    _check_runner_values(cfg)
    if dropped:
        warnings.warn(dropped, UserWarning, stacklevel=2)
    return cfg
