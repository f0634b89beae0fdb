"""The encoder registry: one record (:class:`EncoderInfo`) per encoder name.

Encoder modules register a factory (a class, or a function returning one) with
:func:`register_encoder`; a new file in :mod:`mmpos.encoders` is all it takes to add an
encoder (the registry imports the package's modules on first use, so ``import mmpos``
stays light). Each record carries what the outer parts of the package need to know about
the encoder, so that they read it here instead of deciding for themselves:

==================  ==================================================================  ======================
field               what                                                                read by
==================  ==================================================================  ======================
``kind``            hook point, read from the class (``PositionEncoder.kind``)           placement, attention
``paper``           the paper (authors, year, arXiv id)                                  ``mmpos list``, docs
``reference``       reference implementation: ``repo path`` (and names)                  docs, tests
``static_grid``     why the encoder needs static token shapes (``None``: it does not)    :mod:`mmpos.export`
``shared``          one instance serves every layer (fixed rotary plans)                 :mod:`mmpos.nn.placement`
``context``         model-context keys it reads, ``{key: argument}``                     :func:`create_in_model`
``no_weight_decay`` parameter names (of the module) that take no weight decay, ``"*"``   ``no_weight_decay``
``mrope_section``   it takes ``mrope_section`` (a Hugging Face config value)             ``integrations.hf_rope``
``abs_table``       its parameter that holds a ViT absolute table ``(1, prefix + N, D)``  checkpoint aliases
==================  ==================================================================  ======================

The model context is what a backbone hands every encoder (:data:`CONTEXT_KEYS`):
``dim``, ``num_heads``, ``num_kv_heads``, ``head_dim``, ``depth``, ``grid_size``, ``axes``,
``layer`` and ``prefix_rows`` (how many leading prefix tokens the backbone's own absolute
table gives a row: timm's ``num_prefix_tokens``, 0 with ``no_embed_class``; 1 in open_clip).
"""

from __future__ import annotations

import difflib
import fnmatch
import importlib
import inspect
import pkgutil
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from torch import nn

from .._validate import check_axes, check_int, check_ints
from .base import PositionEncoder

__all__ = [
    "CONTEXT_KEYS",
    "KINDS",
    "EncoderInfo",
    "check_arguments",
    "create",
    "create_in_model",
    "default_no_weight_decay",
    "encoder_info",
    "info_of",
    "list_encoders",
    "make_info",
    "model_context",
    "register_encoder",
]

KINDS = ("none", "additive", "conv", "rotary", "bias")

#: what a backbone may hand an encoder (see the module docstring)
CONTEXT_KEYS = ("dim", "num_heads", "num_kv_heads", "head_dim", "depth", "grid_size", "axes", "layer", "prefix_rows")

#: by default, which parameters of an encoder of each kind take no weight decay: all of additive
#: tables and conv encoders (timm excludes ``pos_embed``, CPVT its PEG), a rotary plan's ``weight``
#: when it is learned (rope-vit excludes its ``freqs``), none of bias tables
_NO_DECAY_BY_KIND = {"none": (), "additive": ("*",), "conv": ("*",), "rotary": ("weight",), "bias": ()}


def default_no_weight_decay(kind: str) -> tuple[str, ...]:
    """The parameter names that take no weight decay in an encoder of ``kind`` whose record does not say."""
    if kind not in _NO_DECAY_BY_KIND:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    return _NO_DECAY_BY_KIND[kind]


@dataclass(frozen=True)
class EncoderInfo:
    """The registry's record of one encoder name (see the module docstring for each field)."""

    name: str
    kind: str
    paper: str
    factory: Callable[..., nn.Module | None] = field(repr=False)
    reference: str = ""
    cls: type | None = field(default=None, repr=False)
    static_grid: str | None = None
    shared: bool = False
    context: Mapping[str, str] = field(default_factory=dict, repr=False)
    no_weight_decay: tuple[str, ...] = ()
    mrope_section: bool = False
    abs_table: str | None = None

    @property
    def prefix_rows(self) -> bool:
        """``True`` when the encoder takes the backbone's ``prefix_rows`` (its table has rows for prefix tokens)."""
        return "prefix_rows" in self.context


_REGISTRY: dict[str, EncoderInfo] = {}
_BY_CLASS: dict[type, EncoderInfo] = {}
_LOADED = False


def _built_class(factory: Callable) -> type | None:
    """The class ``factory`` builds: itself, or its return annotation (``type(None)`` for ``-> None``)."""
    if isinstance(factory, type):
        return factory
    try:
        returns = typing.get_type_hints(factory).get("return")
    except (NameError, TypeError, AttributeError):  # an annotation that does not resolve: give kind=
        return None
    if returns is type(None):
        return type(None)
    return returns if isinstance(returns, type) else None


def _kind_of(name: str, factory: Callable, kind: str | None) -> tuple[str, type | None]:
    cls = _built_class(factory)
    if cls is type(None):
        found = "none"
    elif cls is not None and issubclass(cls, PositionEncoder) and cls.kind:
        found = cls.kind
    else:
        found = None
    if found is None:
        if kind is None:
            raise ValueError(
                f"encoder {name!r}: cannot read its kind (the factory is not a PositionEncoder subclass and has no "
                "return annotation naming one); pass kind="
            )
        found, cls = kind, None
    elif kind is not None and kind != found:
        raise ValueError(f"encoder {name!r}: kind={kind!r} disagrees with the class's kind {found!r}; drop kind=")
    if found not in KINDS:
        raise ValueError(f"encoder {name!r}: kind must be one of {KINDS}, got {found!r}")
    return found, None if cls is type(None) else cls


def _parameters(factory: Callable) -> Mapping[str, inspect.Parameter]:
    return inspect.signature(factory).parameters


def make_info(
    name: str,
    factory: Callable,
    paper: str,
    *,
    reference: str = "",
    kind: str | None = None,
    static_grid: str | None = None,
    shared: bool | None = None,
    context: Mapping[str, str] | None = None,
    no_weight_decay: Sequence[str] | None = None,
    mrope_section: bool | None = None,
    abs_table: str | None = None,
) -> EncoderInfo:
    """The checked record of ``factory`` (arguments: :func:`register_encoder`), not registered.

    A backbone with encoders of its own hands such records to :class:`mmpos.nn.placement.Placement`.
    """
    if kind is not None and kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    found, cls = _kind_of(name, factory, kind)
    params = _parameters(factory)
    ctx = {k: k for k in CONTEXT_KEYS if k in params and k != "prefix_rows"} if context is None else dict(context)
    bad = {k: a for k, a in ctx.items() if k not in CONTEXT_KEYS or a not in params}
    if bad:
        raise ValueError(
            f"encoder {name!r}: context must map keys of {CONTEXT_KEYS} to arguments of the factory, got {bad}"
        )
    shared = found == "rotary" and "layer" not in ctx if shared is None else bool(shared)
    if shared and (found != "rotary" or "layer" in ctx):
        raise ValueError(f"encoder {name!r}: only rotary encoders that read no layer index are shared across layers")
    return EncoderInfo(
        name=name,
        kind=found,
        paper=paper,
        factory=factory,
        reference=reference,
        cls=cls,
        static_grid=static_grid,
        shared=shared,
        context=MappingProxyType(ctx),
        no_weight_decay=default_no_weight_decay(found) if no_weight_decay is None else tuple(no_weight_decay),
        mrope_section="mrope_section" in params if mrope_section is None else bool(mrope_section),
        abs_table=abs_table,
    )


def register_encoder(name: str, paper: str, **fields: Any) -> Callable:
    """Decorator registering ``factory`` (a class, or a function returning one) under ``name``.

    Args:
        name: the encoder name (``mmpos.create(name)``).
        paper: the paper (authors, year, arXiv id).
        reference: the reference implementation, ``"owner/repo path/to/file.py"`` (and names).
        kind: only for a factory whose class cannot be read (a function without a return annotation);
            otherwise read from the class (``PositionEncoder.kind``), and a ``kind`` that disagrees is an error.
        static_grid: why the encoder needs static token shapes (read by :mod:`mmpos.export`).
        shared: one instance for all layers; default: ``True`` for rotary encoders that read no ``layer``.
            Placement refuses a shared encoder that has parameters.
        context: model-context keys read, ``{key: argument}``; default: the factory's arguments named like a
            key of :data:`CONTEXT_KEYS` other than ``prefix_rows``.
        no_weight_decay: parameter names (of the module) without weight decay; ``("*",)``: all. Default by
            kind (:func:`default_no_weight_decay`).
        mrope_section: takes ``mrope_section``; default: read from the factory's arguments.
        abs_table: the parameter holding a ViT absolute table ``(1, prefix + N, D)``.
    """
    unknown = set(fields) - {
        "reference",
        "kind",
        "static_grid",
        "shared",
        "context",
        "no_weight_decay",
        "mrope_section",
        "abs_table",
    }
    if unknown:
        raise TypeError(f"register_encoder() got unexpected arguments {sorted(unknown)}")
    if fields.get("kind") is not None and fields["kind"] not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {fields['kind']!r}")

    def wrap(factory: Callable) -> Callable:
        if name in _REGISTRY and _REGISTRY[name].factory is not factory:
            raise ValueError(f"encoder name {name!r} is already registered")
        info = make_info(name, factory, paper, **fields)
        if info.cls is not None:
            other = _BY_CLASS.get(info.cls)
            if other is not None and (other.static_grid, other.no_weight_decay) != (
                info.static_grid,
                info.no_weight_decay,
            ):
                raise ValueError(
                    f"encoder {name!r} builds {info.cls.__name__} like {other.name!r} but records another "
                    "static_grid or no_weight_decay"
                )
            _BY_CLASS.setdefault(info.cls, info)
        _REGISTRY[name] = info
        return factory

    return wrap


def _load() -> None:
    """Import every encoder module of this package once (their ``@register_encoder`` entries)."""
    global _LOADED
    if _LOADED:
        return
    package = importlib.import_module(__package__)
    for module in pkgutil.iter_modules(package.__path__):
        if not module.name.startswith("_") and module.name not in ("base", "registry"):
            importlib.import_module(f"{__package__}.{module.name}")
    _LOADED = True


def encoder_info(name: str) -> EncoderInfo:
    """The record of ``name``; ``ValueError`` listing the known names otherwise."""
    _load()
    if name not in _REGISTRY:
        raise ValueError(
            f"unknown encoder {name!r}{_did_you_mean(name, _REGISTRY)}; known encoders: {sorted(_REGISTRY)}"
        )
    return _REGISTRY[name]


def info_of(module: nn.Module) -> EncoderInfo | None:
    """The record of the registered encoder whose class ``module`` is (``None`` for other modules)."""
    _load()
    return _BY_CLASS.get(type(module))


def _did_you_mean(word: object, known) -> str:
    close = difflib.get_close_matches(str(word), list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_arguments(name: str | EncoderInfo, kwargs: Any) -> None:
    """``ValueError`` naming encoder ``name`` and its accepted arguments if ``kwargs`` has one it does not take."""
    info = name if isinstance(name, EncoderInfo) else encoder_info(name)
    name = info.name
    params = _parameters(info.factory)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    accepted = [n for n, p in params.items() if p.kind is not inspect.Parameter.VAR_POSITIONAL]
    for arg in kwargs:
        if arg not in accepted:
            raise ValueError(
                f"encoder {name!r} takes no argument {arg!r}{_did_you_mean(arg, accepted)}; it takes {accepted}"
            )


def list_encoders(pattern: str | None = None) -> list[EncoderInfo]:
    """All registered encoders, sorted by name; ``pattern``: only names matching a glob (``"rope*"``)."""
    if pattern is not None and not isinstance(pattern, str):
        raise TypeError(f"pattern must be a glob string such as 'rope*', got {type(pattern).__name__}")
    _load()
    names = sorted(_REGISTRY) if pattern is None else sorted(fnmatch.filter(_REGISTRY, pattern))
    return [_REGISTRY[k] for k in names]


def create(name: str, **kwargs: Any) -> nn.Module | None:
    """Build encoder ``name`` with ``kwargs`` (``none`` gives ``None``).

    Typical keyword arguments are ``dim`` (model width), ``num_heads`` and, for
    encoders with a learned grid, ``grid_size``; each encoder documents its own.
    """
    check_arguments(name, kwargs)
    return encoder_info(name).factory(**kwargs)


def model_context(
    dim: int,
    num_heads: int,
    depth: int,
    *,
    num_kv_heads: int | None = None,
    head_dim: int | None = None,
    grid_size: Sequence[int] | None = None,
    axes: Sequence[str] | None = None,
    prefix_rows: int | None = None,
) -> dict[str, Any]:
    """The context a backbone hands its encoders (keys of :data:`CONTEXT_KEYS`; ``layer`` is added per block).

    Args:
        dim: model width; num_heads: query heads; depth: number of blocks.
        num_kv_heads: key/value heads (default ``num_heads``); head_dim: default ``dim // num_heads``.
        grid_size: the training token grid; axes: the coordinate axes the tokens carry.
        prefix_rows: how many prefix tokens the backbone's own absolute table gives a row.
    """
    dim, num_heads, depth = check_int(dim, "dim"), check_int(num_heads, "num_heads"), check_int(depth, "depth")
    if head_dim is None:
        if dim % num_heads:
            raise ValueError(f"dim={dim} must be divisible by num_heads={num_heads} (or pass head_dim)")
        head_dim = dim // num_heads
    context = {
        "dim": dim,
        "num_heads": num_heads,
        "num_kv_heads": num_heads if num_kv_heads is None else check_int(num_kv_heads, "num_kv_heads"),
        "head_dim": check_int(head_dim, "head_dim"),
        "depth": depth,
    }
    if grid_size is not None:
        context["grid_size"] = check_ints(grid_size, "grid_size")
    if axes is not None:
        context["axes"] = check_axes(axes)
    if prefix_rows is not None:
        context["prefix_rows"] = check_int(prefix_rows, "prefix_rows", low=0)
    return context


def create_in_model(name: str | EncoderInfo, context: Mapping[str, Any], **kwargs: Any) -> nn.Module | None:
    """Like :func:`create`, also passing the entries of the model ``context`` the record says it reads.

    ``name``: a registered name, or a record (:func:`make_info`). Models use it to hand every encoder
    ``dim``, ``num_heads``, ``grid_size``, ``layer``... without every encoder having to accept all of them.
    ``kwargs`` win over ``context``.
    """
    unknown = set(context) - set(CONTEXT_KEYS)
    if unknown:
        raise ValueError(f"context keys must be among {CONTEXT_KEYS}, got {sorted(unknown)}")
    info = name if isinstance(name, EncoderInfo) else encoder_info(name)
    check_arguments(info, kwargs)
    chosen = {arg: context[key] for key, arg in info.context.items() if key in context}
    chosen.update(kwargs)
    return info.factory(**chosen)
