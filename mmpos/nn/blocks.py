"""Transformer blocks and stacks that take position encoders by name.

``Transformer(dim, depth, num_heads, pos="rope")`` builds one encoder per layer for
rotary and bias kinds (each layer may learn its own, e.g. RoPE-Mixed), one additive
encoder applied to the input tokens, and conv encoders after the blocks listed in
``conv_after`` (CPVT places its PEG after block 0).
"""

from __future__ import annotations

from typing import Any, Sequence

from timm.layers import DropPath, Mlp
from torch import Tensor, nn

from ..coords import Coords
from ..registry import create_in_model, encoder_info
from .attention import Attention

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
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, num_heads, num_kv_heads, encoders, causal, qkv_bias)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=nn.GELU)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: Tensor, coords: Coords | None = None, attn_mask: Tensor | None = None) -> Tensor:
        x = x + self.drop_path(self.attn(self.norm1(x), coords, attn_mask))
        return x + self.drop_path(self.mlp(self.norm2(x)))


def _as_list(pos: str | Sequence[str] | None) -> list[str]:
    if pos is None:
        return []
    return [pos] if isinstance(pos, str) else list(pos)


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

    ``forward(x (B, N, dim), coords, attn_mask=None) -> (B, N, dim)`` (final norm applied).
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
    ) -> None:
        super().__init__()
        names = _as_list(pos)
        pos_kwargs = dict(pos_kwargs or {})
        unknown = set(pos_kwargs) - set(names)
        if unknown:
            raise ValueError(f"pos_kwargs names encoders {sorted(unknown)} that are not in pos={names}")
        if any(not 0 <= i < depth for i in conv_after):
            raise ValueError(f"conv_after must hold block indices in [0, {depth}), got {list(conv_after)}")
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
        kinds = {name: encoder_info(name).kind for name in names}

        def build(name: str, **extra: Any) -> nn.Module | None:
            return create_in_model(name, {**context, **extra}, **pos_kwargs.get(name, {}))

        self.additive = nn.ModuleList(
            [m for n in names if kinds[n] == "additive" for m in [build(n)] if m is not None]
        )
        self.conv_after = tuple(conv_after)
        self.convs = nn.ModuleDict(
            {str(i): nn.ModuleList([build(n, layer=i) for n in names if kinds[n] == "conv"]) for i in self.conv_after}
        )
        self.blocks = nn.ModuleList(
            Block(
                dim,
                num_heads,
                mlp_ratio,
                num_kv_heads,
                [build(n, layer=i) for n in names if kinds[n] in ("rotary", "bias")],
                causal,
                qkv_bias,
                drop_path * i / max(depth - 1, 1),
            )
            for i in range(depth)
        )
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: Tensor, coords: Coords | None = None, attn_mask: Tensor | None = None) -> Tensor:
        if coords is not None:
            coords.check_tokens(x.shape[0], x.shape[1])
        for enc in self.additive:
            x = enc(x, coords)
        for i, block in enumerate(self.blocks):
            x = block(x, coords, attn_mask)
            if str(i) in self.convs:
                for conv in self.convs[str(i)]:
                    x = conv(x, coords)
        return self.norm(x)
