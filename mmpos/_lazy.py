"""Names of a package that load on first access (PEP 562), for packages whose submodules are heavy.

    __getattr__, __dir__ = lazy_attributes(__name__, globals(), {"Transformer": ".blocks"})

``{name: submodule}`` (relative to the package): the first ``package.name`` imports the submodule and
caches the value in the package's namespace; ``dir(package)`` lists the lazy names too.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_attributes"]


def lazy_attributes(
    package: str, namespace: dict[str, Any], names: Mapping[str, str], *, submodules: bool = False
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``; ``submodules=True`` also resolves ``package.<submodule>``."""

    def __getattr__(name: str) -> Any:
        if name in names:
            value = getattr(importlib.import_module(names[name], package), name)
        elif submodules and not name.startswith("_") and importlib.util.find_spec(f"{package}.{name}") is not None:
            value = importlib.import_module(f".{name}", package)
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(names))

    return __getattr__, __dir__
