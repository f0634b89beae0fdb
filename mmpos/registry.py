"""Encoder registry: ``create(name, **kwargs)`` and ``list_encoders()``.

Encoder modules register a factory (a class or a function) with
:func:`register_encoder`; :mod:`mmpos.encoders` imports every module of its package,
so a new file is all it takes to add an encoder.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from ._deprecate import renamed_arguments_of

__all__ = [
    "KINDS",
    "EncoderInfo",
    "check_arguments",
    "create",
    "encoder_info",
    "list_encoders",
    "register_encoder",
]

KINDS = ("none", "additive", "conv", "rotary", "bias")


@dataclass(frozen=True)
class EncoderInfo:
    """What ``list_encoders()`` reports for one registered name."""

    name: str
    kind: str
    paper: str
    factory: Callable[..., nn.Module | None]


_REGISTRY: dict[str, EncoderInfo] = {}


def register_encoder(name: str, kind: str, paper: str) -> Callable:
    """Decorator registering ``factory`` under ``name`` (kind: one of :data:`KINDS`)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")

    def wrap(factory: Callable) -> Callable:
        if name in _REGISTRY and _REGISTRY[name].factory is not factory:
            raise ValueError(f"encoder name {name!r} is already registered")
        _REGISTRY[name] = EncoderInfo(name, kind, paper, factory)
        return factory

    return wrap


def _load() -> None:
    from . import encoders  # noqa: F401  (imports every encoder module once)


def encoder_info(name: str) -> EncoderInfo:
    """The registry entry for ``name``; ``ValueError`` listing the known names otherwise."""
    _load()
    if name not in _REGISTRY:
        raise ValueError(
            f"unknown encoder {name!r}{_did_you_mean(name, _REGISTRY)}; known encoders: {sorted(_REGISTRY)}"
        )
    return _REGISTRY[name]


def _did_you_mean(word: object, known) -> str:
    close = difflib.get_close_matches(str(word), list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_arguments(name: str, kwargs: Any) -> None:
    """``ValueError`` naming encoder ``name`` and its accepted arguments if ``kwargs`` has one it does not take."""
    factory = encoder_info(name).factory
    params = inspect.signature(factory).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    accepted = [n for n, p in params.items() if p.kind is not inspect.Parameter.VAR_POSITIONAL]
    for arg in kwargs:
        if arg not in accepted and arg not in renamed_arguments_of(factory):  # a deprecated name: it warns
            raise ValueError(
                f"encoder {name!r} takes no argument {arg!r}{_did_you_mean(arg, accepted)}; it takes {accepted}"
            )


def list_encoders() -> list[EncoderInfo]:
    """All registered encoders, sorted by name."""
    _load()
    return [_REGISTRY[k] for k in sorted(_REGISTRY)]


def create(name: str, **kwargs: Any) -> nn.Module | None:
    """Build encoder ``name`` with ``kwargs`` (``none`` gives ``None``).

    Typical keyword arguments are ``dim`` (model width), ``num_heads`` and, for
    encoders with a learned grid, ``grid_size``; each encoder documents its own.
    """
    check_arguments(name, kwargs)
    return encoder_info(name).factory(**kwargs)


def create_in_model(name: str, context: dict[str, Any], **kwargs: Any) -> nn.Module | None:
    """Like :func:`create`, also passing the entries of ``context`` the factory accepts.

    Models use it to hand every encoder ``dim``, ``num_heads``, ``grid_size``, ``layer``...
    without every encoder having to accept all of them. ``kwargs`` win over ``context``.
    """
    check_arguments(name, kwargs)
    factory = encoder_info(name).factory
    params = inspect.signature(factory).parameters
    takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    chosen = {k: v for k, v in context.items() if takes_all or k in params}
    chosen.update(kwargs)
    return factory(**chosen)
