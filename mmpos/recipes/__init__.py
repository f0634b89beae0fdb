"""The recipe runner: configs, tasks, training runs, sweeps (see ``docs/recipes.md``).

Nothing in the library imports this package. Shipped recipes are package data in
``configs/`` (:func:`list_recipes`, :func:`find_recipe`). Entry points: :func:`run_recipe` (what
``mmpos run`` calls), :func:`resolve_config`, and :mod:`mmpos.recipes.tasks` for the
task contract and registry.
"""

from .config import ConfigError, find_recipe, list_recipes, load_yaml, parse_overrides, resolve_config
from .runner import train_run
from .sweep import run_recipe
from .tasks import Task, get_task, list_tasks, register_task

__all__ = [
    "ConfigError",
    "Task",
    "find_recipe",
    "get_task",
    "list_recipes",
    "list_tasks",
    "load_yaml",
    "parse_overrides",
    "register_task",
    "resolve_config",
    "run_recipe",
    "train_run",
]
