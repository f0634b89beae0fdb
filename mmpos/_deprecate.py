"""Deprecation helpers for what changes after a release: each old name warns, names the new one and the
release that removes it.

Nothing released before 0.1.0 keeps an alias (renames before the first release are listed in the
CHANGELOG only). After a release, a rename keeps its old name for a while with these helpers:

* :func:`module_aliases` -- a module ``__getattr__`` for renamed classes / functions;
* :func:`renamed_arguments` -- a decorator for renamed keyword arguments (old and new together are a
  ``TypeError``).

Both take ``remove_in``, the release that deletes the old name (e.g. ``"0.3.0"``).
"""

from __future__ import annotations

import functools
import re
import sys
import warnings
from collections.abc import Callable
from typing import Any

__all__: list[str] = []

_VERSION = re.compile(r"\d+\.\d+\.\d+")


def _check_version(remove_in: object) -> str:
    if not isinstance(remove_in, str) or not _VERSION.fullmatch(remove_in):
        raise ValueError(f"remove_in must be a release such as '0.3.0', got {remove_in!r}")
    return remove_in


def module_aliases(module: str, aliases: dict[str, str], remove_in: str) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` that resolves ``old`` to the module's ``aliases[old]``, with a warning."""
    remove_in = _check_version(remove_in)

    def __getattr__(name: str) -> Any:
        if name not in aliases:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        new = aliases[name]
        warnings.warn(
            f"{module}.{name} is deprecated and will be removed in mmpos {remove_in}; use {module}.{new}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(sys.modules[module], new)

    return __getattr__


def renamed_arguments(remove_in: str, **renames: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Accept each old keyword ``old=`` (``renames = {old: new}``) as ``new=``, with a warning."""
    remove_in = _check_version(remove_in)

    def wrap(func: Callable[..., Any]) -> Callable[..., Any]:
        where = func.__qualname__.removesuffix(".__init__")

        @functools.wraps(func)
        def call(*args: Any, **kwargs: Any) -> Any:
            for old, new in renames.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(f"{where}() got both {new}= and its deprecated name {old}=; pass {new}= only")
                    warnings.warn(
                        f"{where}({old}=...) is deprecated and will be removed in mmpos {remove_in}; use {new}=",
                        DeprecationWarning,
                        stacklevel=2,
                    )
                    kwargs[new] = kwargs.pop(old)
            return func(*args, **kwargs)

        return call

    return wrap
