"""One backbone adapter: encoder names -> modules at their hook points, for every backbone.

:class:`Placement` serves :class:`mmpos.nn.Transformer`, :class:`mmpos.nn.GraphTransformer` and
the timm and open_clip integrations alike. Resolved once from ``pos`` (a name or a list of names,
see ``mmpos.list_encoders()``), ``pos_kwargs`` and the backbone's context (built by
:func:`mmpos.encoders.registry.model_context`, the one builder), it builds what each encoder's registry record
(:class:`mmpos.EncoderInfo`) asks for:

* :meth:`Placement.additive`: additive encoders for the embedding stage;
* :meth:`Placement.shared`: encoders whose record says ``shared`` (rotary encoders with a fixed
  plan, no parameters). One instance serves every layer; :func:`rotations` computes their cos /
  sin once per forward and the stack hands them to every block (as timm's EVA and Hugging Face
  models do);
* :meth:`Placement.layer`: the encoders each attention layer owns: bias encoders and learnable
  rotary plans (RoPE-Mixed learns frequencies per layer, as in its paper);
* :meth:`Placement.convs`: conv encoders (CPE / PEG) after the blocks in ``conv_after``.

:func:`attach` puts them on a backbone under name-keyed ``nn.ModuleDict`` s: ``pos_encoders``
(additive), ``pos_rotary`` (shared), ``pos_convs`` (``{str(block): {name: conv}}``) and each
attention layer's own dict; :func:`convert_backbone` is the conversion that the timm and
open_clip integrations share, :class:`PositionalBackbone` the forward side (add, rotate, convolve).
Modules are keyed by encoder name, so a checkpoint keeps an encoder's weights when it moves to a
model with another set of encoders (:mod:`mmpos.integrations.checkpoint`). A fixed plan is a
non-persistent buffer: sharing it changes no state-dict key.

:func:`no_weight_decay` names the parameters that take no weight decay in any backbone, as the
records say: additive tables and conv encoders (timm excludes ``pos_embed``, CPVT its PEG) and
learnable rotary frequencies (rope-vit's ``no_weight_decay`` returns ``freqs``: naver-ai/rope-vit
``models/vit_rope.py``).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from .._validate import check_bool, check_ints
from ..coords import Coords
from ..encoders.base import PositionEncoder
from ..encoders.registry import (
    EncoderInfo,
    create_in_model,
    default_no_weight_decay,
    encoder_info,
    info_of,
)
from ..rotary import Rotation
from ..scaling import RopeScaling, as_scaling, grid_scaling

__all__ = [
    "Placement",
    "PositionalBackbone",
    "apply_additive",
    "apply_convs",
    "attach",
    "convert_backbone",
    "grid_scaled_kwargs",
    "module_key",
    "no_weight_decay",
    "rotations",
]


def module_key(name: str) -> str:
    """The ``nn.ModuleDict`` key of encoder ``name`` (keys may not hold dots)."""
    return name.replace(".", "_")


def _names(pos: str | Sequence[str] | None) -> list[str]:
    names = [] if pos is None else [pos] if isinstance(pos, str) else list(pos)
    if any(not isinstance(n, str) for n in names):
        raise ValueError(f"pos must be an encoder name or a list of names, got {pos!r}")
    if len(set(names)) != len(names):
        raise ValueError(f"pos must not repeat an encoder, got {names}")
    return names


def grid_scaled_kwargs(
    pos: str | Sequence[str] | None,
    pos_kwargs: Mapping[str, Mapping[str, Any]] | None,
    scaling: str | RopeScaling | Mapping[str, Any] | None,
    grid_size: Sequence[int] | None,
    train_grid: Sequence[int] | None = None,
    target_grid: Sequence[int] | None = None,
    axes: Sequence[str] = ("h", "w"),
) -> dict[str, dict[str, Any]]:
    """``pos_kwargs`` with one scaling rule (:mod:`mmpos.scaling`) set for every rotary encoder of ``pos``.

    ``scaling``: a rule name (:data:`mmpos.scaling.RULES`) whose factor comes from the grids,
    :func:`mmpos.scaling.grid_scaling` ``(rule, train_grid, target_grid)``: "train at 14x14, run at 28x28" is
    ``train_grid=(14, 14)`` on a model built for 28x28 (``grid_size``), or ``target_grid=(28, 28)`` on a model
    built for 14x14 (each grid defaults to ``grid_size``, the model's patch grid); or a
    :class:`~mmpos.scaling.RopeScaling` (or a mapping of its arguments) used as is (no grids then). ``None``:
    ``pos_kwargs`` unchanged. Returns a new dict; the rule is stored as plain data (``RopeScaling.to_dict``), so
    checkpoints and YAML records keep it. Raises ``ValueError`` when ``pos`` has no rotary encoder, when a rotary
    encoder takes no ``scaling`` or already has one in ``pos_kwargs``, and for grids without a rule name.
    """
    kwargs = {k: dict(v) for k, v in (pos_kwargs or {}).items()}
    if scaling is None:
        if train_grid is not None or target_grid is not None:
            raise ValueError("train_grid and target_grid set the factor of a scaling rule: pass scaling='<rule>'")
        return kwargs
    if isinstance(scaling, str):
        if train_grid is None and target_grid is None:
            raise ValueError(
                f"scaling={scaling!r} needs train_grid or target_grid (its factor is target_grid / train_grid; "
                f"the other one defaults to the model's grid {None if grid_size is None else list(grid_size)})"
            )
        train, target = train_grid or grid_size, target_grid or grid_size
        if train is None or target is None:
            raise ValueError("the model has no grid_size: pass both train_grid and target_grid")
        rule = grid_scaling(scaling, train, None if scaling == "ref-shape" else target, axes)
    else:
        if train_grid is not None or target_grid is not None:
            raise ValueError(
                "train_grid and target_grid apply to a rule name (scaling='yarn', ...); a RopeScaling carries its "
                "own factor"
            )
        rule = as_scaling(scaling)
    rotary = []
    for name in _names(pos):
        info = encoder_info(name)
        if info.kind != "rotary":
            continue
        if "scaling" not in inspect.signature(info.factory).parameters:
            raise ValueError(f"encoder {name!r} takes no scaling rule; scaling applies to the rotary encoders")
        if "scaling" in kwargs.get(name, {}):
            raise ValueError(f"scaling is given twice for {name!r}: as scaling= and in pos_kwargs[{name!r}]")
        kwargs.setdefault(name, {})["scaling"] = rule.to_dict()
        rotary.append(name)
    if not rotary:
        raise ValueError(f"scaling applies to rotary encoders, but pos={pos!r} has none")
    return kwargs


class Placement:
    """Encoder names resolved for one backbone.

    Args:
        pos: encoder name or list of names (``"none"`` or ``None``: no mmpos encoder).
        pos_kwargs: keyword arguments per encoder name, e.g. ``{"rope": {"theta": 100}}``.
        context: what the backbone hands every encoder that reads it (:func:`~mmpos.encoders.registry.model_context`;
            ``depth`` is required).
        conv_after: block indices after which conv encoders (CPE/PEG) run.
        keep_abs_pos: for backbones with their own absolute embedding: keep it; ``None``
            keeps it only when every encoder is a bias encoder (iRPE's reference keeps
            DeiT's absolute embedding).
        records: a backbone's own encoder records (:func:`mmpos.encoders.registry.make_info`), looked up
            before the registry (e.g. the graph transformer's node and pair encoders).
    """

    def __init__(
        self,
        pos: str | Sequence[str] | None,
        pos_kwargs: dict[str, dict[str, Any]] | None,
        context: Mapping[str, Any],
        conv_after: Sequence[int] = (0,),
        keep_abs_pos: bool | None = None,
        records: Mapping[str, EncoderInfo] | None = None,
    ) -> None:
        names = _names(pos)
        local = dict(records or {})
        self.records = {n: local[n] if n in local else encoder_info(n) for n in names}  # ValueError for unknown
        self.kinds = {n: info.kind for n, info in self.records.items()}
        self.names = [n for n in names if self.kinds[n] != "none"]
        if pos_kwargs is not None and not isinstance(pos_kwargs, Mapping):
            raise ValueError(f"pos_kwargs must map encoder names to dicts of arguments, got {pos_kwargs!r}")
        self.pos_kwargs = {k: dict(v) for k, v in (pos_kwargs or {}).items()}
        unknown = set(self.pos_kwargs) - set(names)
        if unknown:
            raise ValueError(f"pos_kwargs names encoders {sorted(unknown)} that are not in pos={names}")
        check_bool(keep_abs_pos, "keep_abs_pos", none_ok=True)
        if keep_abs_pos is None:
            keep_abs_pos = bool(self.names) and all(self.kinds[n] == "bias" for n in self.names)
        self.keep_abs_pos = keep_abs_pos
        depth = context["depth"]
        conv_after = check_ints(
            conv_after, "conv_after", low=0, high=depth - 1, length=(0, math.inf), what="block indices"
        )
        self.conv_after = conv_after
        self.context = dict(context)
        self._shared: nn.ModuleDict | None = None

    @property
    def needs_coords(self) -> bool:
        """``True`` when some encoder reads token coordinates."""
        return bool(self.names)

    @property
    def attends(self) -> bool:
        """``True`` when some encoder acts inside attention (rotary or bias)."""
        return any(self.kinds[n] in ("rotary", "bias") for n in self.names)

    def _create(self, name: str, **extra: Any) -> nn.Module | None:
        return create_in_model(self.records[name], {**self.context, **extra}, **self.pos_kwargs.get(name, {}))

    def _build(self, kinds: tuple[str, ...], **extra: Any) -> nn.ModuleDict:
        modules = {}
        for name in self.names:
            if self.kinds[name] in kinds:
                module = self._create(name, **extra)
                if module is not None:
                    modules[module_key(name)] = module
        return nn.ModuleDict(modules)

    def additive(self) -> nn.ModuleDict:
        """Additive encoders, added to the tokens after the embedding stage."""
        return self._build(("additive",))

    def shared(self) -> nn.ModuleDict:
        """Encoders shared by all layers (fixed-plan rotary encoders), built on first use."""
        if self._shared is None:
            modules = {}
            for name in self.names:
                if self.records[name].shared:
                    module = self._create(name)
                    if module is not None and next(module.parameters(), None) is not None:
                        raise ValueError(
                            f"encoder {name!r} is registered shared=True (one instance for all layers) but has "
                            "parameters; register it with shared=False to build one per layer"
                        )
                    if module is not None:
                        modules[module_key(name)] = module
            self._shared = nn.ModuleDict(modules)
        return self._shared

    def layer(self, layer: int) -> nn.ModuleDict:
        """The encoders attention layer ``layer`` owns: bias encoders and per-layer rotary plans."""
        self.shared()
        modules = {}
        for name in self.names:
            if self.kinds[name] in ("rotary", "bias") and not self.records[name].shared:
                module = self._create(name, layer=layer)
                if module is not None:
                    modules[module_key(name)] = module
        return nn.ModuleDict(modules)

    def convs(self) -> nn.ModuleDict:
        """``{str(block): ModuleDict of conv encoders}`` for the blocks in ``conv_after``."""
        if not any(self.kinds[n] == "conv" for n in self.names):
            return nn.ModuleDict()
        return nn.ModuleDict({str(i): self._build(("conv",), layer=i) for i in self.conv_after})


def attach(
    owner: nn.Module,
    additive: nn.ModuleDict,
    shared: nn.ModuleDict,
    convs: nn.ModuleDict,
    attentions: Sequence[nn.Module] = (),
    layers: Sequence[nn.ModuleDict] = (),
    attr: str = "pos_encoders",
    device: torch.device | None = None,
) -> None:
    """Put placed encoders on a backbone: ``owner.pos_encoders`` (additive), ``owner.pos_rotary``
    (shared), ``owner.pos_convs``, and ``attentions[i].<attr>`` = ``layers[i]`` (on ``device``)."""
    if len(attentions) != len(layers):
        raise ValueError(f"got {len(layers)} per-layer encoder dicts for {len(attentions)} attention layers")
    for attn, encoders in zip(attentions, layers):
        setattr(attn, attr, encoders.to(device))
    owner.pos_encoders = additive.to(device)
    owner.pos_rotary = shared.to(device)
    owner.pos_convs = convs.to(device)


def convert_backbone(
    model: nn.Module,
    attentions: Sequence[nn.Module],
    context: Mapping[str, Any],
    pos: str | Sequence[str] | None,
    pos_kwargs: dict[str, dict[str, Any]] | None,
    keep_abs_pos: bool | None,
    conv_after: Sequence[int],
    *,
    patch_drop: nn.Module,
    patch_drop_arg: str,
    install: Callable[[], None],
    abs_pos: str,
    cls: type,
    device: torch.device,
) -> Placement:
    """The conversion the timm and open_clip integrations share; returns the placement.

    ``attentions``: the converted attention layers (they get ``pos_encoders``); ``patch_drop``: the
    model's patch-dropout module (refused unless ``nn.Identity`` when encoders read coordinates);
    ``install``: puts the converted blocks in place, called once everything is checked (a refused
    conversion leaves the model as it was); ``abs_pos``: the attribute of the model's own absolute table (set to ``None`` unless kept);
    ``cls``: the class the model becomes.
    """
    setup = Placement(pos, pos_kwargs, context, conv_after, keep_abs_pos)
    if setup.needs_coords and not isinstance(patch_drop, nn.Identity):
        raise ValueError(
            f"{patch_drop_arg} must be 0 with mmpos encoders (dropped patches would lose their coordinates)"
        )
    layers = [setup.layer(i) for i in range(len(attentions))]
    additive, convs = setup.additive(), setup.convs()
    install()
    attach(model, additive, setup.shared(), convs, attentions, layers, device=device)
    if not setup.keep_abs_pos:
        setattr(model, abs_pos, None)
    model.__class__ = cls
    return setup


class PositionalBackbone:
    """The forward side of the adapter, for a module that :func:`attach` gave ``pos_encoders``,
    ``pos_rotary`` and ``pos_convs``: add, rotate once per forward, convolve after a block."""

    pos_encoders: nn.ModuleDict
    pos_rotary: nn.ModuleDict
    pos_convs: nn.ModuleDict

    def pos_add(self, x: Tensor, coords: Coords) -> Tensor:
        """``x`` ``(B, N, D)`` plus every additive encoder at ``coords``."""
        return apply_additive(x, self.pos_encoders, coords)

    def pos_rotations(self, coords: Coords | None) -> list[Rotation]:
        """cos / sin of the shared rotary encoders at ``coords``, once per forward, for every block."""
        return rotations(self.pos_rotary, coords)

    def pos_after_block(self, block: int, x: Tensor, coords: Coords) -> Tensor:
        """The conv encoders placed after ``block`` applied to ``x`` ``(B, N, D)``."""
        return apply_convs(x, self.pos_convs, block, coords)


def rotations(shared: nn.ModuleDict | Sequence[PositionEncoder], coords: Coords | None) -> list[Rotation]:
    """cos / sin of every shared rotary encoder at ``coords``, once per forward (``[]`` without coords)."""
    if coords is None:
        return []
    encoders = shared.values() if isinstance(shared, nn.ModuleDict) else shared
    return [encoder.rotation(coords) for encoder in encoders]


def apply_additive(x: Tensor, encoders: nn.ModuleDict | Sequence[nn.Module], coords: Coords) -> Tensor:
    """``x`` ``(B, N, D)`` plus every additive encoder's ``embed(coords)``."""
    for encoder in encoders.values() if isinstance(encoders, nn.ModuleDict) else encoders:
        x = encoder(x, coords)
    return x


def apply_convs(x: Tensor, convs: nn.ModuleDict, block: int, coords: Coords) -> Tensor:
    """Run the conv encoders placed after ``block`` on ``x`` ``(B, N, D)``."""
    if str(block) in convs:
        group = convs[str(block)]
        for encoder in group.values() if isinstance(group, nn.ModuleDict) else group:
            x = encoder(x, coords)
    return x


def no_weight_decay(model: nn.Module) -> set[str]:
    """Names (as in ``model.named_parameters()``) of position parameters that take no weight decay.

    For every encoder in ``model``, the parameters its record lists (:attr:`EncoderInfo.no_weight_decay`:
    all of additive and conv encoders, the learnable frequencies of RoPE-Mixed); an encoder class that
    is not registered follows the default of its kind. Bias encoders' tables decay.
    """
    names = set()
    for prefix, module in model.named_modules():
        if not isinstance(module, PositionEncoder):
            continue
        info = info_of(module)
        listed = info.no_weight_decay if info is not None else default_no_weight_decay(module.kind)
        dot = f"{prefix}." if prefix else ""
        own = {n for n, _ in module.named_parameters()}
        names |= {dot + n for n in (own if "*" in listed else own & set(listed))}
    return names
