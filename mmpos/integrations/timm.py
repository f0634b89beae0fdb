"""mmpos position encoders in timm's ``VisionTransformer``.

``create_vit("vit_small_patch16_224", pos="rope", dynamic_img_size=True)`` builds a timm
ViT and converts it; ``convert(model, pos=...)`` converts one in place. What changes:

* every ``Block`` becomes a :class:`PositionalBlock` and every ``Attention`` a
  :class:`PositionalAttention` that keeps the same ``qkv`` / ``q_norm`` / ``k_norm`` /
  ``norm`` / ``proj`` modules (same state-dict keys) and runs
  :func:`mmpos.nn.attention` with the rotary and bias encoders of its layer;
* encoders are placed by :class:`mmpos.nn.placement.Placement`: fixed-plan rotary encoders
  sit once in ``pos_rotary`` and their cos / sin are computed once per forward and handed
  to every block; bias encoders and learnable rotary plans (RoPE-Mixed) sit in each
  block's ``attn.pos_encoders``;
* additive encoders (``learned``, ``sincos``, ...) are added to the tokens after the
  embedding stage, conv encoders (``peg``) run after the blocks in ``conv_after``;
* the model's own absolute ``pos_embed`` is removed, or kept with ``keep_abs_pos=True``
  (by default it is kept only when all encoders are bias encoders, as iRPE keeps DeiT's);
* the token coordinates are ``Coords.grid(h, w, num_prefix_tokens=num_prefix_tokens)`` from the
  patch grid of the input's static shape, so class and register tokens carry no
  position and ``dynamic_img_size=True`` models take any (non-square) image size.

Reference: timm ``models/vision_transformer.py`` (``VisionTransformer._pos_embed``,
``forward_features``, ``forward_intermediates``, ``Block``), ``layers/attention.py``
(``Attention``) and, for the pattern of a ViT with a position-aware attention,
``models/vision_transformer_relpos.py`` (``RelPosAttention``).

Shapes: images ``(B, C, H, W)``; tokens ``(B, prefix + h * w, embed_dim)`` with
``(h, w) = patch_embed.dynamic_feat_size((H, W))``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import timm
import torch
from timm.layers import Attention
from timm.models._features import feature_take_indices
from timm.models._manipulate import checkpoint
from timm.models.vision_transformer import Block, VisionTransformer
from torch import Tensor, nn

from ..coords import Coords
from ..encoders.registry import list_encoders
from ..nn import placement
from ..nn.attention import attention
from ..nn.placement import PositionalBackbone, convert_backbone, model_context, module_key
from ..rotary import Rotation
from .checkpoint import TransferReport
from .checkpoint import load_state_dict_report as _load_report

__all__ = [
    "TIMM_ALIASES",
    "PositionalAttention",
    "PositionalBlock",
    "PositionalVisionTransformer",
    "convert",
    "create_vit",
    "load_state_dict_report",
]


def table_aliases(own: str) -> tuple[tuple[str, str], ...]:
    """``(own, "pos_encoders.<name>.<table>")`` for every encoder whose record names an absolute table
    (:attr:`mmpos.EncoderInfo.abs_table`): a backbone's own table ``own`` and that encoder's hold the same
    ``(1, prefix + N, D)`` (or ``(prefix + N, D)``) tensor."""
    return tuple(
        (own, f"pos_encoders.{module_key(info.name)}.{info.abs_table}") for info in list_encoders() if info.abs_table
    )


#: timm's own learned table and mmpos's ``learned`` encoder hold the same ``(1, N, D)`` tensor.
TIMM_ALIASES = table_aliases("pos_embed")


class PositionalAttention(nn.Module):
    """timm ``Attention`` whose q/k go through mmpos rotary and bias encoders.

    Takes over the projections and norms of ``attn`` (a plain ``timm.layers.Attention``),
    so state-dict keys are unchanged. ``forward(x (B, N, C), coords, attn_mask=None,
    is_causal=False, rotations=()) -> (B, N, C)``; ``attn_mask`` is a bool mask (``True`` = attend),
    ``rotations`` the model's shared rotary encoders at ``coords`` (applied before ``pos_encoders``).
    """

    def __init__(self, attn: Attention, encoders: nn.ModuleDict | None = None) -> None:
        super().__init__()
        if type(attn) is not Attention:
            raise ValueError(f"attn must be a timm.layers.Attention, got {type(attn).__name__}")
        self.num_heads = attn.num_heads
        self.head_dim = attn.head_dim
        # timm < 1.0.21 has no attn_dim (head_dim = dim // num_heads): the inner width is num_heads * head_dim
        self.attn_dim = getattr(attn, "attn_dim", attn.num_heads * attn.head_dim)
        self.qkv = attn.qkv
        self.q_norm = attn.q_norm
        self.k_norm = attn.k_norm
        self.attn_drop = attn.attn_drop
        self.norm = attn.norm
        self.gate = getattr(attn, "gate", None)
        self.proj = attn.proj
        self.proj_drop = attn.proj_drop
        self.pos_encoders = encoders if encoders is not None else nn.ModuleDict()

    def forward(
        self,
        x: Tensor,
        coords: Coords | None,
        attn_mask: Tensor | None = None,
        is_causal: bool = False,
        rotations: Sequence[Rotation] = (),
    ) -> Tensor:
        b, n, _ = x.shape
        gate = self.gate(x).sigmoid() if self.gate is not None else None
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        q, k = self.q_norm(q), self.k_norm(k)  # (B, H, N, Dh)
        dropout = self.attn_drop.p if self.training else 0.0
        encoders = [*rotations, *self.pos_encoders.values()]
        out = attention(q, k, v, coords, encoders, is_causal, attn_mask, dropout)
        out = self.norm(out.transpose(1, 2).reshape(b, n, self.attn_dim))
        if gate is not None:
            out = out * gate
        return self.proj_drop(self.proj(out))


class PositionalBlock(nn.Module):
    """timm ``Block`` (pre-norm, layer scale, drop path) around a :class:`PositionalAttention`.

    ``forward(x (B, N, C), coords, attn_mask=None, is_causal=False, rotations=()) -> (B, N, C)``.
    """

    def __init__(self, block: Block, encoders: nn.ModuleDict | None = None) -> None:
        super().__init__()
        if type(block) is not Block:
            raise ValueError(f"block must be a timm vision_transformer.Block, got {type(block).__name__}")
        self.norm1 = block.norm1
        self.attn = PositionalAttention(block.attn, encoders)
        self.ls1 = block.ls1
        self.drop_path1 = block.drop_path1
        self.norm2 = block.norm2
        self.mlp = block.mlp
        self.ls2 = block.ls2
        self.drop_path2 = block.drop_path2

    def forward(
        self,
        x: Tensor,
        coords: Coords | None,
        attn_mask: Tensor | None = None,
        is_causal: bool = False,
        rotations: Sequence[Rotation] = (),
    ) -> Tensor:
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x), coords, attn_mask, is_causal, rotations)))
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


class PositionalVisionTransformer(PositionalBackbone, VisionTransformer):
    """A timm ``VisionTransformer`` with mmpos position encoders (see the module docstring).

    Built by :func:`convert` / :func:`create_vit`, or directly: the arguments of timm's
    ``VisionTransformer`` plus ``pos``, ``pos_kwargs``, ``keep_abs_pos`` and ``conv_after``
    of :func:`convert`. Extra modules: ``pos_encoders`` (additive, by name), ``pos_rotary``
    (fixed-plan rotary encoders shared by all blocks, by name; no state-dict entries) and
    ``pos_convs`` (``{str(block): {name: conv encoder}}``).
    """

    pos_encoders: nn.ModuleDict
    pos_rotary: nn.ModuleDict
    pos_convs: nn.ModuleDict

    def __init__(
        self,
        *args: Any,
        pos: str | Sequence[str] | None,
        pos_kwargs: dict[str, dict[str, Any]] | None = None,
        keep_abs_pos: bool | None = None,
        conv_after: Sequence[int] = (0,),
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        convert(self, pos, pos_kwargs, keep_abs_pos, conv_after)

    def token_coords(self, image_size: Sequence[int], device: torch.device | None = None) -> Coords:
        """Coordinates of the tokens of images of size ``(H, W)``: prefix tokens, then the patch grid."""
        h, w = self.patch_embed.dynamic_feat_size(tuple(image_size))
        return Coords.grid(h, w, num_prefix_tokens=self.num_prefix_tokens, device=device)

    def embed_positions(self, x: Tensor, coords: Coords) -> Tensor:
        """Patch tokens ``(B, h, w, C)`` or ``(B, h * w, C)`` -> ``(B, N, C)`` with prefix tokens and positions."""
        if self.pos_embed is None:
            # prefix tokens, then the patches, as timm >= 1.0.26 does (older _pos_embed drops the prefix tokens here)
            prefix = [t.expand(x.shape[0], -1, -1) for t in (self.cls_token, self.reg_token) if t is not None]
            x = torch.cat([*prefix, x.reshape(x.shape[0], -1, x.shape[-1])], dim=1)
        else:
            x = self._pos_embed(x)  # timm: prefix tokens, the kept absolute embedding, then pos_drop
        if len(self.pos_encoders):
            x = self.pos_add(x, coords)
            if self.pos_embed is None:
                x = self.pos_drop(x)
        return x

    def _run_block(
        self,
        i: int,
        x: Tensor,
        coords: Coords,
        attn_mask: Tensor | None,
        is_causal: bool,
        rot: Sequence[Rotation],
    ) -> Tensor:
        block = self.blocks[i]
        if self.grad_checkpointing and not torch.jit.is_scripting():
            x = checkpoint(block, x, coords, attn_mask, is_causal, rot)
        else:
            x = block(x, coords, attn_mask, is_causal, rot)
        return self.pos_after_block(i, x, coords)

    def _tokens(self, images: Tensor) -> tuple[Tensor, Coords, list[Rotation]]:
        coords = self.token_coords(images.shape[-2:], images.device)
        x = self.embed_positions(self.patch_embed(images), coords)
        rot = self.pos_rotations(coords)  # cos / sin once, for every block
        return self.norm_pre(self.patch_drop(x)), coords, rot

    def forward_features(self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        x, coords, rot = self._tokens(x)
        for i in range(len(self.blocks)):
            x = self._run_block(i, x, coords, attn_mask, is_causal, rot)
        return self.norm(x)

    def forward_intermediates(
        self,
        x: Tensor,
        indices: int | list[int] | None = None,
        return_prefix_tokens: bool = False,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
        output_dict: bool = False,
        attn_mask: Tensor | None = None,
        is_causal: bool = False,
    ) -> Any:
        """timm's ``forward_intermediates`` (same arguments and outputs) with positions."""
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        batch = x.shape[0]
        x, coords, rot = self._tokens(x)
        intermediates = []
        for i in range(max_index + 1 if stop_early else len(self.blocks)):
            x = self._run_block(i, x, coords, attn_mask, is_causal, rot)
            if i in take_indices:
                intermediates.append(self.norm(x) if norm else x)
        p = self.num_prefix_tokens
        prefix_tokens = [y[:, :p] for y in intermediates] if p else None
        intermediates = [y[:, p:] for y in intermediates]
        if output_fmt == "NCHW":
            h, w = coords.grid_shape
            intermediates = [y.reshape(batch, h, w, -1).permute(0, 3, 1, 2).contiguous() for y in intermediates]
        if output_dict:
            out = {"image_intermediates": intermediates}
            if prefix_tokens is not None and return_prefix_tokens:
                out["image_intermediates_prefix"] = prefix_tokens
            if not intermediates_only:
                out["image_features"] = self.norm(x)
            return out
        if return_prefix_tokens and prefix_tokens is not None:
            intermediates = list(zip(intermediates, prefix_tokens))
        if intermediates_only:
            return intermediates
        return self.norm(x), intermediates

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        """timm's set plus :func:`mmpos.nn.placement.no_weight_decay`: additive and conv encoders
        (tables and PEG, as CPVT) and learnable rotary frequencies (RoPE-Mixed, as rope-vit)."""
        return super().no_weight_decay() | placement.no_weight_decay(self)


def convert(
    model: VisionTransformer,
    pos: str | Sequence[str] | None,
    pos_kwargs: dict[str, dict[str, Any]] | None = None,
    keep_abs_pos: bool | None = None,
    conv_after: Sequence[int] = (0,),
) -> PositionalVisionTransformer:
    """Convert a timm ``VisionTransformer`` in place to use mmpos encoders; returns it.

    Args:
        model: a ``timm.models.vision_transformer.VisionTransformer`` with plain ``Block`` /
            ``Attention`` layers (or an already converted model, whose encoders are replaced).
        pos: encoder name or list of names (``mmpos.list_encoders()``); ``"none"`` adds none.
        pos_kwargs: keyword arguments per encoder name, e.g. ``{"rope-axial": {"theta": 100}}``.
        keep_abs_pos: keep the model's own ``pos_embed`` (``None``: only when every encoder
            is a bias encoder). ``pos="none", keep_abs_pos=True`` leaves the model's outputs unchanged.
        conv_after: block indices after which conv encoders run (CPVT: after block 0).

    Encoders get what their record reads of the model context (:func:`mmpos.nn.placement.model_context`):
    ``dim``, ``num_heads``, ``num_kv_heads``, ``head_dim``, ``depth``, ``grid_size`` (the model's patch
    grid), ``axes=("h", "w")``, ``prefix_rows`` (the rows of timm's table: ``num_prefix_tokens``, 0 with
    ``no_embed_class``; ``learned`` reads it) and, for attention and conv encoders, ``layer``. Placement and
    conversion: :func:`mmpos.nn.placement.convert_backbone`, shared with open_clip.
    """
    if type(model) not in (VisionTransformer, PositionalVisionTransformer):
        raise ValueError(f"model must be a timm VisionTransformer, got {type(model).__name__}")
    blocks = [b if isinstance(b, PositionalBlock) else PositionalBlock(b) for b in model.blocks]
    attn = blocks[0].attn
    context = model_context(
        model.embed_dim,
        attn.num_heads,
        len(blocks),
        head_dim=attn.head_dim,
        grid_size=model.patch_embed.grid_size,
        axes=("h", "w"),
        prefix_rows=0 if model.no_embed_class else model.num_prefix_tokens,  # the rows of timm's table
    )

    def install() -> None:
        model.blocks = nn.Sequential(*blocks)

    convert_backbone(
        model,
        [b.attn for b in blocks],
        context,
        pos,
        pos_kwargs,
        keep_abs_pos,
        conv_after,
        patch_drop=model.patch_drop,
        patch_drop_arg="patch_drop_rate",
        install=install,
        abs_pos="pos_embed",
        cls=PositionalVisionTransformer,
        device=model.patch_embed.proj.weight.device,
    )
    return model


def create_vit(
    model_name: str,
    pos: str | Sequence[str] | None,
    pos_kwargs: dict[str, dict[str, Any]] | None = None,
    keep_abs_pos: bool | None = None,
    conv_after: Sequence[int] = (0,),
    **timm_kwargs: Any,
) -> PositionalVisionTransformer:
    """``timm.create_model(model_name, **timm_kwargs)`` converted by :func:`convert`.

    Example: ``create_vit("vit_tiny_patch16_224", pos="rope", img_size=64, dynamic_img_size=True)``.
    """
    model = timm.create_model(model_name, **timm_kwargs)
    if type(model) is not VisionTransformer:
        raise ValueError(f"model_name {model_name!r} builds a {type(model).__name__}, not a timm VisionTransformer")
    return convert(model, pos, pos_kwargs, keep_abs_pos, conv_after)


def load_state_dict_report(model: nn.Module, state_dict: Mapping[str, Tensor]) -> TransferReport:
    """Load what fits of ``state_dict`` (e.g. trained with another encoder) into ``model``.

    Shared weights are kept, the model's other weights keep their initialisation, the
    checkpoint's other weights are dropped; timm's ``pos_embed`` and the ``learned``
    encoder's table map onto each other (:data:`TIMM_ALIASES`). See
    :func:`mmpos.integrations.checkpoint.load_state_dict_report`.
    """
    return _load_report(model, state_dict, TIMM_ALIASES)
