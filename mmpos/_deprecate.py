"""Old names kept as deprecated aliases: each use warns (``DeprecationWarning``) and names the new one.

* :func:`module_aliases` -- a module ``__getattr__`` for renamed classes / functions
  (``from mmpos.encoders.rope import Rope1d`` still works and warns).
* :func:`moved_attributes` -- a module ``__getattr__`` for names moved to another module
  (``recipes.data.spatial.render`` still works and warns).
* :func:`renamed_arguments` -- a decorator for renamed keyword arguments
  (``Coords.grid(14, 14, prefix=1)`` still works and warns); old and new together are a ``TypeError``.
"""

from __future__ import annotations

import functools
import sys
import warnings
from collections.abc import Callable
from typing import Any

__all__: list[str] = []


def module_aliases(module: str, aliases: dict[str, str]) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` that resolves ``old`` to the module's ``aliases[old]``, with a warning."""

    def __getattr__(name: str) -> Any:
        if name not in aliases:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        new = aliases[name]
        warnings.warn(f"{module}.{name} is deprecated; use {module}.{new}", DeprecationWarning, stacklevel=2)
        return getattr(sys.modules[module], new)

    return __getattr__


def moved_attributes(module: str, moved: dict[str, tuple[Any, str]], target: str) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` giving ``moved[old] = (object, new name in target)``, with a warning."""

    def __getattr__(name: str) -> Any:
        if name not in moved:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        obj, new = moved[name]
        warnings.warn(f"{module}.{name} is deprecated; use {target}.{new}", DeprecationWarning, stacklevel=2)
        return obj

    return __getattr__


def renamed_arguments(**renames: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Accept each old keyword ``old=`` (``renames = {old: new}``) as ``new=``, with a warning."""

    def wrap(func: Callable[..., Any]) -> Callable[..., Any]:
        where = func.__qualname__.removesuffix(".__init__")

        @functools.wraps(func)
        def call(*args: Any, **kwargs: Any) -> Any:
            for old, new in renames.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(f"{where}() got both {new}= and its deprecated name {old}=; pass {new}= only")
                    warnings.warn(f"{where}({old}=...) is deprecated; use {new}=", DeprecationWarning, stacklevel=2)
                    kwargs[new] = kwargs.pop(old)
            return func(*args, **kwargs)

        call.__renamed_arguments__ = renames  # read by renamed_arguments_of
        return call

    return wrap


def renamed_arguments_of(factory: Callable[..., Any]) -> dict[str, str]:
    """The ``{old: new}`` keyword renames of a function or a class's ``__init__`` (``{}`` if none)."""
    func = factory.__init__ if isinstance(factory, type) else factory
    return getattr(func, "__renamed_arguments__", {})
