"""Transformer blocks and stacks that take position encoders by name.

``Transformer(dim, depth, num_heads, pos="rope")`` places its encoders with
:class:`mmpos.nn.placement.Placement` (the adapter every backbone shares, keyed by encoder name): rotary encoders with a fixed plan are shared by all
layers and their cos / sin computed once per forward; bias encoders and learnable rotary
plans (RoPE-Mixed) have one instance per layer; additive encoders apply to the input
tokens, conv encoders after the blocks listed in ``conv_after`` (CPVT: after block 0).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import Tensor, nn

from .._extras import requires
from .._validate import check_bool, check_float, check_int
from ..coords import Coords
from ..encoders.registry import model_context
from ..rotary import Rotation
from .attention import Attention
from .multi_order import TPEAttention
from .placement import Placement, PositionalBackbone, attach

with requires("timm"):  # one line naming the package and the extra when it is missing
    from timm.layers import DropPath, Mlp

__all__ = ["TPE_NAME", "Block", "Transformer"]

#: The ``pos=`` name of 2D-TPE (multi-order attention in every block; see :class:`Transformer`).
TPE_NAME = "2d-tpe"


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
        check_float(mlp_ratio, "mlp_ratio")
        check_float(drop_path, "drop_path", strict=False, high=1.0)
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


class Transformer(PositionalBackbone, nn.Module):
    """A stack of :class:`Block` with position encoders at their hook points.

    Args:
        dim, depth, num_heads, mlp_ratio, num_kv_heads, causal, qkv_bias: the stack.
        pos: encoder name or list of names (see ``mmpos.list_encoders()``), or :data:`TPE_NAME`
            (``"2d-tpe"``): every block's attention becomes a :class:`~mmpos.nn.TPEAttention`
            ``(dim, num_heads, num_kv_heads=num_kv_heads, causal=causal, **pos_kwargs["2d-tpe"])``
            (its own defaults otherwise, e.g. no qkv bias as the reference's Llama; ``forward``
            then takes the order coordinates of :func:`mmpos.table.build`); the shorthand of
            ``attn_layer=lambda i: TPEAttention(...)``, combinable with additive and conv encoders only.
        pos_kwargs: keyword arguments per encoder name, e.g. ``{"rope": {"theta": 100}}``.
        grid_size: the training token grid, handed to encoders that learn a grid.
        axes: the coordinate axes the model's tokens carry (e.g. ``("h", "w")``), handed
            to encoders that read named axes.
        conv_after: block indices after which conv encoders run.
        drop_path: stochastic depth, linearly increasing to this rate.
        attn_layer: ``block index -> attention module`` replacing :class:`Attention` in every block,
            e.g. ``lambda i: TPEAttention(dim, num_heads)`` (the multi-order hook point, 2D-TPE);
            rotary and bias encoders cannot be combined with it.
        prefix_rows: prefix tokens that get a row of a learned table (``learned``'s ``num_prefix_tokens``;
            :class:`mmpos.nn.VisionTransformer` passes its class token).

    Modules (placed by :class:`~mmpos.nn.placement.Placement`, keyed by encoder name):
    ``pos_encoders`` (additive), ``pos_rotary`` (fixed-plan rotary encoders shared by all blocks; no
    state-dict entries), ``blocks[i].attn.encoders`` (the encoders block ``i`` owns) and ``pos_convs``
    (``{str(block): {name: conv encoder}}``).

    ``forward(x (B, N, dim), coords, attn_mask=None) -> (B, N, dim)`` (final norm applied). ``coords``: one
    :class:`~mmpos.coords.Coords` for every block, or a sequence of one per block (layouts of the same tokens on
    the same axes; CircleRoPE's AGE: :func:`mmpos.age.age_coords`): block ``i`` and the conv encoders after it
    read ``coords[i]``, the additive encoders ``coords[0]``, and the rotations are computed once per distinct
    ``Coords`` object.
    """

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
        prefix_rows: int | None = None,
    ) -> None:
        super().__init__()
        dim, depth, num_heads = check_int(dim, "dim"), check_int(depth, "depth"), check_int(num_heads, "num_heads")
        if dim % num_heads:
            raise ValueError(f"dim={dim} must be divisible by num_heads={num_heads}")
        if num_kv_heads is not None:
            check_int(num_kv_heads, "num_kv_heads")
            if num_heads % num_kv_heads:
                raise ValueError(f"num_heads={num_heads} must be a multiple of num_kv_heads={num_kv_heads}")
        check_float(mlp_ratio, "mlp_ratio")
        check_float(drop_path, "drop_path", strict=False, high=1.0)
        check_bool(causal, "causal")
        check_bool(qkv_bias, "qkv_bias")
        if attn_layer is not None and (isinstance(attn_layer, nn.Module) or not callable(attn_layer)):  # a factory
            raise TypeError(f"attn_layer must be a callable block index -> attention module, got {attn_layer!r}")
        if pos_kwargs is not None and not isinstance(pos_kwargs, dict):
            raise TypeError(f"pos_kwargs must be a dict of encoder name -> keyword arguments, got {pos_kwargs!r}")
        if not (
            pos is None or isinstance(pos, str) or (isinstance(pos, Sequence) and all(isinstance(p, str) for p in pos))
        ):
            raise TypeError(f"pos must be an encoder name or a sequence of names, got {pos!r}")
        names = [] if pos is None else [pos] if isinstance(pos, str) else list(pos)
        if TPE_NAME in names:
            if attn_layer is not None:
                raise ValueError(f"pos={TPE_NAME!r} sets every block's attention: give it or attn_layer, not both")
            tpe_kwargs = dict((pos_kwargs or {}).get(TPE_NAME) or {})
            names.remove(TPE_NAME)
            pos = names or None
            pos_kwargs = {n: kw for n, kw in (pos_kwargs or {}).items() if n != TPE_NAME}

            def attn_layer(i: int) -> nn.Module:
                return TPEAttention(dim, num_heads, num_kv_heads=num_kv_heads, causal=causal, **tpe_kwargs)

        context = model_context(
            dim, num_heads, depth, num_kv_heads=num_kv_heads, grid_size=grid_size, axes=axes, prefix_rows=prefix_rows
        )
        placement = Placement(pos, pos_kwargs, context, conv_after)
        if attn_layer is not None and placement.attends:
            raise ValueError("attn_layer replaces the attention: pos may then hold additive and conv encoders only")
        additive = placement.additive()
        convs = placement.convs()
        self.conv_after = placement.conv_after
        layers, blocks = [], []
        for i in range(depth):  # each block's encoders, then the block (the order of the random init)
            layers.append(placement.layer(i))
            blocks.append(
                Block(
                    dim,
                    num_heads,
                    mlp_ratio,
                    num_kv_heads,
                    (),
                    causal,
                    qkv_bias,
                    drop_path * i / max(depth - 1, 1),
                    None if attn_layer is None else attn_layer(i),
                )
            )
        self.blocks = nn.ModuleList(blocks)
        attentions = [b.attn for b in blocks] if attn_layer is None else []
        attach(self, additive, placement.shared(), convs, attentions, layers if attentions else [], attr="encoders")
        self.norm = nn.LayerNorm(dim)

    def forward(
        self, x: Tensor, coords: Coords | Sequence[Coords] | None = None, attn_mask: Tensor | None = None
    ) -> Tensor:
        if coords is None or isinstance(coords, Coords):
            layers = [coords] * len(self.blocks)
        else:
            layers = self._per_layer(coords)
        distinct = {id(c): c for c in layers}  # by object: a Coords holds tensors
        for c in distinct.values():
            if c is not None:
                c.check_tokens(x.shape[0], x.shape[1])
        if layers[0] is not None:
            x = self.pos_add(x, layers[0])  # additive encoders: the input tokens, at the first layer's positions
        rot = {key: self.pos_rotations(c) for key, c in distinct.items()}  # cos / sin once per distinct Coords
        for i, (block, c) in enumerate(zip(self.blocks, layers)):
            x = block(x, c, attn_mask, rot[id(c)])
            if c is not None:
                x = self.pos_after_block(i, x, c)
        return self.norm(x)

    def _per_layer(self, coords: Sequence[Coords]) -> list[Coords]:
        """``coords`` as one ``Coords`` per block; ``ValueError`` / ``TypeError`` otherwise."""
        if not isinstance(coords, Sequence):
            raise TypeError(f"coords must be a Coords, a sequence of one Coords per block or None, got {coords!r}")
        layers = list(coords)
        if len(layers) != len(self.blocks):
            raise ValueError(f"coords must hold one Coords per block ({len(self.blocks)}), got {len(layers)}")
        wrong = [i for i, c in enumerate(layers) if not isinstance(c, Coords)]
        if wrong:
            raise TypeError(f"coords[{wrong[0]}] must be a Coords, got {type(layers[wrong[0]]).__name__}")
        first = layers[0]
        if any(c.axes != first.axes or c.pos.shape[:2] != first.pos.shape[:2] for c in layers):
            raise ValueError("coords must be layouts of the same tokens on the same axes (one per block)")
        return layers
