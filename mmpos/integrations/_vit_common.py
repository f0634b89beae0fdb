"""What the timm and open_clip ViT integrations share beyond :func:`mmpos.nn.placement.convert_backbone`.

Private to :mod:`mmpos.integrations.timm` and :mod:`mmpos.integrations.open_clip`: the conversion of a
ViT's blocks (its model context read from the first block) and the split of ``forward_intermediates``
outputs into prefix tokens and patch maps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor, nn

from ..encoders.registry import model_context
from ..nn.placement import Placement, convert_backbone

__all__: list[str] = []

#: the ``output_fmt`` values of timm's and open_clip's ``forward_intermediates``
OUTPUT_FMTS = ("NCHW", "NLC")


def convert_vit(
    model: nn.Module,
    blocks: Sequence[nn.Module],
    width: int,
    grid_size: Sequence[int],
    prefix_rows: int,
    pos: str | Sequence[str] | None,
    pos_kwargs: dict[str, dict[str, Any]] | None,
    keep_abs_pos: bool | None,
    conv_after: Sequence[int],
    **backbone: Any,
) -> Placement:
    """:func:`~mmpos.nn.placement.convert_backbone` on the converted ``blocks`` of a ViT (each with an ``.attn``
    holding ``num_heads`` and ``head_dim``), whose encoders get the model context of a ``width``-wide ViT on
    the 2-D patch grid ``grid_size`` (axes ``("h", "w")``) with ``prefix_rows`` rows of a learned table for
    the prefix tokens; ``backbone``: the other keyword arguments of ``convert_backbone``."""
    attn = blocks[0].attn
    context = model_context(
        width,
        attn.num_heads,
        len(blocks),
        head_dim=attn.head_dim,
        grid_size=grid_size,
        axes=("h", "w"),
        prefix_rows=prefix_rows,
    )
    attentions = [b.attn for b in blocks]
    return convert_backbone(model, attentions, context, pos, pos_kwargs, keep_abs_pos, conv_after, **backbone)


def check_output_fmt(output_fmt: str) -> None:
    """``forward_intermediates``' ``output_fmt``: ``"NCHW"`` (patch maps) or ``"NLC"`` (token rows)."""
    if output_fmt not in OUTPUT_FMTS:
        raise ValueError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")


def split_intermediates(
    intermediates: Sequence[Tensor], num_prefix: int, grid_shape: Sequence[int], output_fmt: str
) -> tuple[list[Tensor], list[Tensor]]:
    """``(prefix tokens, patches)`` of blocks' outputs ``(B, num_prefix + h * w, C)``: prefix ``(B, num_prefix, C)``;
    patches ``(B, C, h, w)`` for ``"NCHW"`` (``grid_shape = (h, w)``), ``(B, h * w, C)`` for ``"NLC"``."""
    prefix = [y[:, :num_prefix] for y in intermediates]
    patches = [y[:, num_prefix:] for y in intermediates]
    if output_fmt == "NCHW":
        h, w = grid_shape
        patches = [y.reshape(y.shape[0], h, w, -1).permute(0, 3, 1, 2).contiguous() for y in patches]
    return prefix, patches
