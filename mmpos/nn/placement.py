"""One placement path: encoder names -> modules at their hook points, for every backbone.

:class:`Placement` serves :class:`mmpos.nn.Transformer` and the timm and open_clip
integrations alike. Resolved once from ``pos`` (a name or a list of names, see
``mmpos.list_encoders()``), ``pos_kwargs`` and the backbone's context (``dim``,
``num_heads``, ``num_kv_heads``, ``head_dim``, ``depth``, ``grid_size``, ``axes``), it builds:

* :meth:`Placement.additive`: additive encoders for the embedding stage;
* :meth:`Placement.shared`: rotary encoders with a fixed plan (no parameters). One instance
  serves every layer; :func:`rotations` computes their cos / sin once per forward and the
  stack hands them to every block (as timm's EVA and Hugging Face models do);
* :meth:`Placement.layer`: the encoders each attention layer owns: bias encoders and
  learnable rotary plans (RoPE-Mixed learns frequencies per layer, as in its paper);
* :meth:`Placement.convs`: conv encoders (CPE / PEG) after the blocks in ``conv_after``.

Modules are keyed by encoder name, so a checkpoint keeps an encoder's weights when it moves
to a model with another set of encoders (:mod:`mmpos.integrations.checkpoint`). A fixed
plan is a non-persistent buffer: sharing it changes no state-dict key.

:func:`no_weight_decay` names the parameters that take no weight decay in any backbone:
additive tables and conv encoders (timm excludes ``pos_embed``, CPVT its PEG) and learnable
rotary frequencies (rope-vit's ``no_weight_decay`` returns ``freqs``: naver-ai/rope-vit
``models/vit_rope.py``).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

from torch import Tensor, nn

from ..coords import Coords
from ..encoders.base import AdditiveEncoder, ConvEncoder, RotaryEncoder
from ..registry import create_in_model, encoder_info
from ..rotary import Rotation

__all__ = ["Placement", "apply_additive", "apply_convs", "no_weight_decay", "rotations"]


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


def _is_shared(name: str, module: nn.Module) -> bool:
    """A rotary encoder with a fixed plan: no parameters, not built per layer."""
    takes_layer = "layer" in inspect.signature(encoder_info(name).factory).parameters
    return isinstance(module, RotaryEncoder) and not takes_layer and next(module.parameters(), None) is None


class Placement:
    """Encoder names resolved for one backbone.

    Args:
        pos: encoder name or list of names (``"none"`` or ``None``: no mmpos encoder).
        pos_kwargs: keyword arguments per encoder name, e.g. ``{"rope": {"theta": 100}}``.
        context: what the backbone hands every encoder that accepts it: ``dim``, ``num_heads``,
            ``num_kv_heads``, ``head_dim``, ``depth`` (required), ``grid_size``, ``axes``.
        conv_after: block indices after which conv encoders (CPE/PEG) run.
        keep_abs_pos: for backbones with their own absolute embedding: keep it; ``None``
            keeps it only when every encoder is a bias encoder (iRPE's reference keeps
            DeiT's absolute embedding).
    """

    def __init__(
        self,
        pos: str | Sequence[str] | None,
        pos_kwargs: dict[str, dict[str, Any]] | None,
        context: dict[str, Any],
        conv_after: Sequence[int] = (0,),
        keep_abs_pos: bool | None = None,
    ) -> None:
        names = _names(pos)
        self.kinds = {n: encoder_info(n).kind for n in names}  # ValueError for unknown names
        self.names = [n for n in names if self.kinds[n] != "none"]
        self.pos_kwargs = {k: dict(v) for k, v in (pos_kwargs or {}).items()}
        unknown = set(self.pos_kwargs) - set(names)
        if unknown:
            raise ValueError(f"pos_kwargs names encoders {sorted(unknown)} that are not in pos={names}")
        if keep_abs_pos is not None and not isinstance(keep_abs_pos, bool):
            raise ValueError(f"keep_abs_pos must be True, False or None, got {keep_abs_pos!r}")
        if keep_abs_pos is None:
            keep_abs_pos = bool(self.names) and all(self.kinds[n] == "bias" for n in self.names)
        self.keep_abs_pos = keep_abs_pos
        depth = context["depth"]
        conv_after = tuple(conv_after)
        if any(not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < depth for i in conv_after):
            raise ValueError(f"conv_after must hold block indices in [0, {depth}), got {list(conv_after)}")
        self.conv_after = conv_after
        self.context = dict(context)
        self._shared: nn.ModuleDict | None = None

    @property
    def needs_coords(self) -> bool:
        """``True`` when some encoder reads token coordinates."""
        return bool(self.names)

    def set_default(self, name: str, key: str, value: Any) -> None:
        """Give encoder ``name`` (if requested) the keyword ``key=value`` unless the user set it."""
        if name in self.names:
            self.pos_kwargs.setdefault(name, {}).setdefault(key, value)

    def _create(self, name: str, **extra: Any) -> nn.Module | None:
        return create_in_model(name, {**self.context, **extra}, **self.pos_kwargs.get(name, {}))

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
        """Fixed-plan rotary encoders, one instance for all layers (built on first use)."""
        if self._shared is None:
            modules = {}
            for name in self.names:
                if self.kinds[name] == "rotary":
                    module = self._create(name, layer=0)
                    if module is not None and _is_shared(name, module):
                        modules[module_key(name)] = module
            self._shared = nn.ModuleDict(modules)
        return self._shared

    def layer(self, layer: int) -> nn.ModuleDict:
        """The encoders attention layer ``layer`` owns: bias encoders and learnable rotary plans."""
        shared = self.shared()
        modules = {}
        for name in self.names:
            key = module_key(name)
            if self.kinds[name] in ("rotary", "bias") and key not in shared:
                module = self._create(name, layer=layer)
                if module is not None:
                    modules[key] = module
        return nn.ModuleDict(modules)

    def convs(self) -> nn.ModuleDict:
        """``{str(block): ModuleDict of conv encoders}`` for the blocks in ``conv_after``."""
        if not any(self.kinds[n] == "conv" for n in self.names):
            return nn.ModuleDict()
        return nn.ModuleDict({str(i): self._build(("conv",), layer=i) for i in self.conv_after})


def rotations(shared: nn.ModuleDict | Sequence[RotaryEncoder], coords: Coords | None) -> list[Rotation]:
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

    All parameters of additive and conv encoders, and learnable rotary frequencies (the
    ``weight`` of RoPE-Mixed), wherever they sit in ``model``. Bias encoders' tables decay.
    """
    names = set()
    for prefix, module in model.named_modules():
        dot = f"{prefix}." if prefix else ""
        if isinstance(module, (AdditiveEncoder, ConvEncoder)):
            names |= {dot + n for n, _ in module.named_parameters()}
        elif isinstance(module, RotaryEncoder) and isinstance(module.weight, nn.Parameter):
            names.add(dot + "weight")
    return names
