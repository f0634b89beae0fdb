"""The recipe runner: configs, the task contract, training runs, sweeps (see ``docs/recipes.md``).

Nothing else in the library imports this package, and it imports no recipe by name: recipes
(YAML configs and the task modules that build them) live in installed *recipe packages* --
mmpos's own is the top-level :mod:`recipes` -- found through the ``mmpos.recipes`` entry point
(:func:`recipe_packages`, :func:`list_recipes`, :func:`find_recipe`). Entry points of this package:
:func:`run_recipe` (what ``mmpos run`` calls), :func:`resolve_config`, and
:mod:`mmpos.runner.tasks` for the task contract and registry.

Only the config module (PyYAML) loads with the package; the runner, sweeps and tasks load
on first use of their names, so ``mmpos list recipes`` and ``mmpos cp`` start quickly.
"""

from .._lazy import lazy_attributes
from .config import (
    ConfigError,
    find_recipe,
    list_recipes,
    load_yaml,
    parse_overrides,
    resolve_config,
)
from .packages import recipe_packages

# name -> submodule that defines it (imported on first access, PEP 562)
_LAZY = {
    "train_run": ".train",
    "run_recipe": ".sweep",
    "Task": ".tasks",
    "get_task": ".tasks",
    "list_tasks": ".tasks",
    "register_task": ".tasks",
}

__all__ = [
    "ConfigError",
    "Task",
    "find_recipe",
    "get_task",
    "list_recipes",
    "list_tasks",
    "load_yaml",
    "parse_overrides",
    "recipe_packages",
    "register_task",
    "resolve_config",
    "run_recipe",
    "train_run",
]

__getattr__, __dir__ = lazy_attributes(__name__, globals(), _LAZY)
