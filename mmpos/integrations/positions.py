"""Turn encoder names into modules for the hook points of a backbone (timm, open_clip).

A :class:`PositionSetup` is resolved once per conversion from ``pos`` (a name or a list
of names, see ``mmpos.list_encoders()``), ``pos_kwargs`` and ``keep_abs_pos``; it then
builds, with the backbone's context (``dim``, ``num_heads``, ``head_dim``, ``depth``,
``grid_size``, ``layer``):

* ``additive()``: one ``nn.ModuleDict`` of additive encoders for the embedding stage;
* ``attention(layer)``: the rotary / bias encoders of one attention layer;
* ``convs()``: ``{str(block): {name: conv encoder}}`` run after the listed blocks.

Modules are keyed by encoder name, so a checkpoint keeps an encoder's weights when it
moves to a model with a different set of encoders (see :mod:`mmpos.integrations.checkpoint`).
"""

from __future__ import annotations

from typing import Any, Sequence

from torch import Tensor, nn

from ..coords import Coords
from ..registry import create_in_model, encoder_info

__all__ = ["PositionSetup", "apply_additive", "apply_convs"]


def _module_key(name: str) -> str:
    return name.replace(".", "_")  # nn.ModuleDict keys may not hold dots


class PositionSetup:
    """Encoder names resolved for one backbone conversion.

    Args:
        pos: encoder name or list of names (``"none"`` or ``None``: no mmpos encoder).
        pos_kwargs: keyword arguments per encoder name, e.g. ``{"rope": {"theta": 100}}``.
        keep_abs_pos: keep the backbone's own absolute position embedding; ``None``
            keeps it only when every encoder is a bias encoder (iRPE's reference keeps
            DeiT's absolute embedding) and removes it otherwise.
        conv_after: block indices after which conv encoders (CPE/PEG) run.
        depth: number of blocks of the backbone.
    """

    def __init__(
        self,
        pos: str | Sequence[str] | None,
        pos_kwargs: dict[str, dict[str, Any]] | None,
        keep_abs_pos: bool | None,
        conv_after: Sequence[int],
        depth: int,
    ) -> None:
        names = [] if pos is None else [pos] if isinstance(pos, str) else list(pos)
        if any(not isinstance(n, str) for n in names):
            raise ValueError(f"pos must be an encoder name or a list of names, got {pos!r}")
        if len(set(names)) != len(names):
            raise ValueError(f"pos must not repeat an encoder, got {names}")
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
        conv_after = tuple(conv_after)
        if any(not isinstance(i, int) or not 0 <= i < depth for i in conv_after):
            raise ValueError(f"conv_after must hold block indices in [0, {depth}), got {list(conv_after)}")
        self.conv_after = conv_after

    @property
    def needs_coords(self) -> bool:
        """``True`` when some encoder reads token coordinates."""
        return bool(self.names)

    def set_default(self, name: str, key: str, value: Any) -> None:
        """Give encoder ``name`` (if requested) the keyword ``key=value`` unless the user set it."""
        if name in self.names:
            self.pos_kwargs.setdefault(name, {}).setdefault(key, value)

    def _build(self, kinds: tuple[str, ...], context: dict[str, Any]) -> nn.ModuleDict:
        modules = {}
        for name in self.names:
            if self.kinds[name] in kinds:
                module = create_in_model(name, context, **self.pos_kwargs.get(name, {}))
                if module is not None:
                    modules[_module_key(name)] = module
        return nn.ModuleDict(modules)

    def additive(self, context: dict[str, Any]) -> nn.ModuleDict:
        """Additive encoders, added to the tokens after the embedding stage."""
        return self._build(("additive",), context)

    def attention(self, context: dict[str, Any], layer: int) -> nn.ModuleDict:
        """Rotary and bias encoders of attention layer ``layer``."""
        return self._build(("rotary", "bias"), {**context, "layer": layer})

    def convs(self, context: dict[str, Any]) -> nn.ModuleDict:
        """``{str(block): ModuleDict of conv encoders}`` for the blocks in ``conv_after``."""
        if not any(self.kinds[n] == "conv" for n in self.names):
            return nn.ModuleDict()
        return nn.ModuleDict({str(i): self._build(("conv",), {**context, "layer": i}) for i in self.conv_after})


def apply_additive(x: Tensor, encoders: nn.ModuleDict, coords: Coords) -> Tensor:
    """``x`` ``(B, N, D)`` plus every additive encoder's ``embed(coords)``."""
    for encoder in encoders.values():
        x = encoder(x, coords)
    return x


def apply_convs(x: Tensor, convs: nn.ModuleDict, block: int, coords: Coords) -> Tensor:
    """Run the conv encoders placed after ``block`` on ``x`` ``(B, N, D)``."""
    if str(block) in convs:
        for encoder in convs[str(block)].values():
            x = encoder(x, coords)
    return x
