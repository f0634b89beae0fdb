"""Transformer blocks and stacks that take position encoders by name.

``Transformer(dim, depth, num_heads, pos="rope")`` places its encoders with
:class:`mmpos.nn.placement.Placement`: rotary encoders with a fixed plan are shared by all
layers and their cos / sin computed once per forward; bias encoders and learnable rotary
plans (RoPE-Mixed) have one instance per layer; additive encoders apply to the input
tokens, conv encoders after the blocks listed in ``conv_after`` (CPVT: after block 0).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from timm.layers import DropPath, Mlp
from torch import Tensor, nn

from ..coords import Coords
from ..rotary import Rotation
from .attention import Attention
from .placement import Placement, apply_additive, apply_convs, rotations

__all__ = ["Block", "Transformer"]


class Block(nn.Module):
    """Pre-norm block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``; ``x`` ``(B, N, dim)``."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        num_kv_heads: int | None = None,
        encoders: Sequence[nn.Module] = (),
        causal: bool = False,
        qkv_bias: bool = True,
        drop_path: float = 0.0,
        attn: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        if attn is not None and encoders:
            raise ValueError("attn replaces the block's attention: give its encoders to that module, not to Block")
        # attn: e.g. a multi-order attention (mmpos.nn.TPEAttention); called as attn(x, coords, attn_mask, rotations)
        self.attn = Attention(dim, num_heads, num_kv_heads, encoders, causal, qkv_bias) if attn is None else attn
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=nn.GELU)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(
        self,
        x: Tensor,
        coords: Coords | None = None,
        attn_mask: Tensor | None = None,
        rotations: Sequence[Rotation] = (),
    ) -> Tensor:
        x = x + self.drop_path(self.attn(self.norm1(x), coords, attn_mask, rotations))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class Transformer(nn.Module):
    """A stack of :class:`Block` with position encoders at their hook points.

    Args:
        dim, depth, num_heads, mlp_ratio, num_kv_heads, causal, qkv_bias: the stack.
        pos: encoder name or list of names (see ``mmpos.list_encoders()``).
        pos_kwargs: keyword arguments per encoder name, e.g. ``{"rope": {"theta": 100}}``.
        grid_size: the training token grid, handed to encoders that learn a grid.
        axes: the coordinate axes the model's tokens carry (e.g. ``("h", "w")``), handed
            to encoders that read named axes.
        conv_after: block indices after which conv encoders run.
        drop_path: stochastic depth, linearly increasing to this rate.
        attn_layer: ``block index -> attention module`` replacing :class:`Attention` in every block,
            e.g. ``lambda i: TPEAttention(dim, num_heads)`` (the multi-order hook point, 2D-TPE);
            rotary and bias encoders cannot be combined with it.

    Modules: ``additive`` (input encoders), ``rotary`` (fixed-plan rotary encoders shared by all
    blocks, by name; no state-dict entries), ``blocks[i].attn.encoders`` (the encoders block ``i``
    owns), ``convs`` (``{str(block): conv encoders}``).

    ``forward(x (B, N, dim), coords, attn_mask=None) -> (B, N, dim)`` (final norm applied).
    """

    # 2: shared rotary encoders left the per-block lists (older state dicts are renumbered on load)
    _version = 2

    def __init__(
        self,
        dim: int,
        depth: int,
        num_heads: int,
        pos: str | Sequence[str] | None = None,
        pos_kwargs: dict[str, dict[str, Any]] | None = None,
        grid_size: Sequence[int] | None = None,
        mlp_ratio: float = 4.0,
        axes: Sequence[str] | None = None,
        num_kv_heads: int | None = None,
        causal: bool = False,
        qkv_bias: bool = True,
        conv_after: Sequence[int] = (0,),
        drop_path: float = 0.0,
        attn_layer: Callable[[int], nn.Module] | None = None,
    ) -> None:
        super().__init__()
        context = {
            "dim": dim,
            "num_heads": num_heads,
            "num_kv_heads": num_kv_heads or num_heads,
            "head_dim": dim // num_heads,
            "depth": depth,
        }
        if grid_size is not None:
            context["grid_size"] = tuple(grid_size)
        if axes is not None:
            context["axes"] = tuple(axes)
        placement = Placement(pos, pos_kwargs, context, conv_after)
        if attn_layer is not None and any(placement.kinds[n] in ("rotary", "bias") for n in placement.names):
            raise ValueError("attn_layer replaces the attention: pos may then hold additive and conv encoders only")
        self.additive = nn.ModuleList(placement.additive().values())
        self.conv_after = placement.conv_after
        self.convs = nn.ModuleDict({i: nn.ModuleList(group.values()) for i, group in placement.convs().items()})
        self.blocks = nn.ModuleList(
            Block(
                dim,
                num_heads,
                mlp_ratio,
                num_kv_heads,
                list(placement.layer(i).values()),
                causal,
                qkv_bias,
                drop_path * i / max(depth - 1, 1),
                None if attn_layer is None else attn_layer(i),
            )
            for i in range(depth)
        )
        self.rotary = placement.shared()
        self.norm = nn.LayerNorm(dim)
        # index of each per-block encoder in version-1 state dicts (shared ones were listed there too)
        attn_names = [n for n in placement.names if placement.kinds[n] in ("rotary", "bias")]
        owned = [n for n in attn_names if n.replace(".", "_") not in self.rotary]
        self._v1_index = {attn_names.index(n): j for j, n in enumerate(owned) if attn_names.index(n) != j}

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, *args, **kwargs) -> None:
        version = local_metadata.get("version")
        if self._v1_index and (version is None or version < 2):
            pattern = re.compile(re.escape(prefix) + r"blocks\.(\d+)\.attn\.encoders\.(\d+)\.(.+)")
            own = self.state_dict(prefix=prefix, keep_vars=True)
            for key in [k for k in state_dict if pattern.fullmatch(k)]:
                block, old, rest = pattern.fullmatch(key).groups()
                if int(old) not in self._v1_index:
                    continue
                new = f"{prefix}blocks.{block}.attn.encoders.{self._v1_index[int(old)]}.{rest}"
                # without metadata (a plain dict), renumber only keys that fit the old numbering alone
                if version is not None or (key not in own and new in own and new not in state_dict):
                    state_dict[new] = state_dict.pop(key)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, *args, **kwargs)

    def forward(self, x: Tensor, coords: Coords | None = None, attn_mask: Tensor | None = None) -> Tensor:
        if coords is not None:
            coords.check_tokens(x.shape[0], x.shape[1])
            x = apply_additive(x, self.additive, coords)
        rot = rotations(self.rotary, coords)  # cos / sin once, for every block
        for i, block in enumerate(self.blocks):
            x = block(x, coords, attn_mask, rot)
            if coords is not None:
                x = apply_convs(x, self.convs, i, coords)
        return self.norm(x)
