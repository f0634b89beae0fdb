"""Recipe packages: where the runner finds recipes (``configs/*.yaml``) and their task modules (``tasks/``).

A recipe package is any importable package registered under the entry-point group
:data:`ENTRY_POINT_GROUP` (``pyproject.toml``: ``[project.entry-points."mmpos.recipes"]``); mmpos's own is
the top-level :mod:`recipes`. The library never imports one by name: :mod:`mmpos.runner.config` and
:mod:`mmpos.runner.tasks` read this list.
"""

from __future__ import annotations

__all__ = ["ENTRY_POINT_GROUP", "recipe_packages"]

#: The entry-point group under which packages of recipes register; each value names an importable package.
ENTRY_POINT_GROUP = "mmpos.recipes"


def recipe_packages() -> list[str]:
    """Names of the installed recipe packages (the values of :data:`ENTRY_POINT_GROUP`), sorted."""
    from importlib.metadata import entry_points

    return sorted({ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)})
