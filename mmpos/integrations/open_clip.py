"""mmpos position encoders in the visual tower of an open_clip model.

``create_model("ViT-B-32", pos="rope-axial")`` builds an open_clip model (random
initialisation unless ``pretrained`` is given) and converts its visual tower;
``create_model_and_transforms("ViT-B-32", pos="rope-axial")`` also returns open_clip's train and
validation transforms;
``convert(model, pos=...)`` converts a ``CLIP`` / ``CustomTextCLIP`` (its ``.visual``)
or an ``open_clip.transformer.VisionTransformer`` in place. What changes:

* every ``ResidualAttentionBlock`` / ``CustomResidualAttentionBlock`` becomes a
  :class:`PositionalResidualBlock` whose :class:`PositionalCLIPAttention` keeps the
  block's ``in_proj_weight`` / ``in_proj_bias`` / ``out_proj`` (and ``ln_q`` / ``ln_k``,
  ``head_scale``, ``ln_inner`` of the custom block): same state-dict keys; it runs
  :func:`mmpos.nn.attention` with the rotary and bias encoders of its layer (placed by
  :class:`mmpos.nn.placement.Placement`: fixed-plan rotary encoders once in the tower's
  ``pos_rotary``, their cos / sin computed once per forward and handed to every block);
* additive encoders are added after ``positional_embedding``, conv encoders run after the
  blocks in ``conv_after``;
* ``positional_embedding`` is removed, or kept with ``keep_abs_pos=True`` (by default only
  when every encoder is a bias encoder); a kept table is resampled (bicubic, timm's
  ``resample_abs_pos_embed``) when the image grid differs from the training grid;
* tokens get ``Coords.grid(h, w, num_prefix_tokens=1)``: the class token carries no position, and
  without a kept table any image size (non-square included) works.

A tower built on timm (``vision_cfg["timm_model_name"]`` naming a timm ViT) is
converted by :func:`mmpos.integrations.timm.convert` on its ``trunk``.

Reference: open_clip ``src/open_clip/transformer.py`` (``VisionTransformer._embeds``,
``forward``, ``forward_intermediates``, ``ResidualAttentionBlock``,
``CustomResidualAttentionBlock``, ``Attention``) and ``torch.nn.MultiheadAttention``.

Shapes: images ``(B, 3, H, W)``; tokens ``(B, 1 + h * w, width)``, ``h = H // patch``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from .._extras import requires
from ..coords import Coords
from ..nn import placement
from ..nn.attention import attention
from ..nn.placement import PositionalBackbone, grid_scaled_kwargs
from ..rotary import Rotation
from ..scaling import RopeScaling
from . import timm as mmpos_timm
from ._vit_common import check_output_fmt, convert_vit, split_intermediates
from .checkpoint import TransferReport
from .checkpoint import load_state_dict_report as _load_report

with requires("clip"):  # one line naming the package and the extra when it is missing
    import open_clip
    from open_clip.timm_model import TimmModel
    from open_clip.transformer import (
        Attention,
        CustomResidualAttentionBlock,
        ResidualAttentionBlock,
        VisionTransformer,
    )
    from timm.layers import resample_abs_pos_embed
    from timm.models._features import feature_take_indices
    from timm.models.vision_transformer import VisionTransformer as TimmVisionTransformer

__all__ = [
    "OPEN_CLIP_ALIASES",
    "PositionalCLIPAttention",
    "PositionalCLIPVisionTransformer",
    "PositionalResidualBlock",
    "convert",
    "create_model",
    "create_model_and_transforms",
    "load_state_dict_report",
]

#: open_clip's ``positional_embedding`` ``(N, D)`` and the ``learned`` encoder's table ``(1, N, D)``;
#: timm's aliases serve towers with a timm trunk.
OPEN_CLIP_ALIASES = mmpos_timm.table_aliases("positional_embedding") + mmpos_timm.TIMM_ALIASES


class PositionalCLIPAttention(nn.Module):
    """open_clip self-attention with mmpos rotary and bias encoders; the parameters are the source's.

    ``attn`` is the ``nn.MultiheadAttention`` of a ``ResidualAttentionBlock`` (batch first,
    packed projection, no ``bias_k`` / ``add_zero_attn``) or the ``Attention`` of a
    ``CustomResidualAttentionBlock`` without scaled cosine attention.
    ``forward(x (B, N, C), coords, attn_mask=None, rotations=()) -> (B, N, C)``; ``attn_mask`` is
    bool (``True`` = attend); ``rotations``: the tower's shared rotary encoders at ``coords``.
    """

    def __init__(self, attn: nn.Module, encoders: nn.ModuleDict | None = None) -> None:
        super().__init__()
        if isinstance(attn, nn.MultiheadAttention):
            if not attn.batch_first or not attn._qkv_same_embed_dim or attn.bias_k is not None or attn.add_zero_attn:
                raise ValueError(
                    "attn must be a batch-first nn.MultiheadAttention with a packed in-projection, "
                    "no bias_k/bias_v and add_zero_attn=False"
                )
            self.ln_q, self.ln_k, self.ln_inner = nn.Identity(), nn.Identity(), nn.Identity()
            self.head_scale = None
            self.attn_drop, self.out_drop = nn.Dropout(attn.dropout), nn.Identity()
        elif type(attn) is Attention:
            if attn.logit_scale is not None:
                raise ValueError("attn uses scaled cosine attention, which mmpos attention does not express")
            self.ln_q, self.ln_k, self.ln_inner = attn.ln_q, attn.ln_k, attn.ln_inner
            self.head_scale = attn.head_scale  # (H, 1, 1) or None
            self.attn_drop, self.out_drop = attn.attn_drop, attn.out_drop
        else:
            raise ValueError(f"attn must be nn.MultiheadAttention or open_clip Attention, got {type(attn).__name__}")
        self.num_heads = attn.num_heads
        self.head_dim = attn.head_dim
        self.in_proj_weight = attn.in_proj_weight  # (3 C, C): q, k, v stacked
        self.in_proj_bias = attn.in_proj_bias
        self.out_proj = attn.out_proj
        self.pos_encoders = encoders if encoders is not None else nn.ModuleDict()

    def forward(
        self, x: Tensor, coords: Coords | None, attn_mask: Tensor | None = None, rotations: Sequence[Rotation] = ()
    ) -> Tensor:
        b, n, c = x.shape
        qkv = F.linear(x, self.in_proj_weight, self.in_proj_bias)
        q, k, v = qkv.reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)  # (B, H, N, Dh)
        q, k = self.ln_q(q), self.ln_k(k)
        dropout = self.attn_drop.p if self.training else 0.0
        out = attention(q, k, v, coords, [*rotations, *self.pos_encoders.values()], False, attn_mask, dropout)
        if self.head_scale is not None:
            out = out * self.head_scale
        out = self.ln_inner(out.transpose(1, 2).reshape(b, n, c))
        return self.out_drop(self.out_proj(out))


class PositionalResidualBlock(nn.Module):
    """open_clip residual block (pre-norm, layer scale) around a :class:`PositionalCLIPAttention`.

    ``forward(x (B, N, C), coords, attn_mask=None, rotations=()) -> (B, N, C)``.
    """

    def __init__(self, block: nn.Module, encoders: nn.ModuleDict | None = None) -> None:
        super().__init__()
        if type(block) not in (ResidualAttentionBlock, CustomResidualAttentionBlock) or hasattr(block, "ln_1_kv"):
            raise ValueError(
                "block must be an open_clip ResidualAttentionBlock (self-attention) or CustomResidualAttentionBlock, "
                f"got {type(block).__name__}"
            )
        self.ln_1 = block.ln_1
        self.attn = PositionalCLIPAttention(block.attn, encoders)
        self.ln_attn = getattr(block, "ln_attn", nn.Identity())
        self.ls_1 = block.ls_1
        self.ln_2 = block.ln_2
        self.mlp = block.mlp
        self.ls_2 = block.ls_2

    def forward(
        self, x: Tensor, coords: Coords | None, attn_mask: Tensor | None = None, rotations: Sequence[Rotation] = ()
    ) -> Tensor:
        x = x + self.ls_1(self.ln_attn(self.attn(self.ln_1(x), coords, attn_mask, rotations)))
        return x + self.ls_2(self.mlp(self.ln_2(x)))


class PositionalCLIPVisionTransformer(PositionalBackbone, VisionTransformer):
    """open_clip ``VisionTransformer`` with mmpos position encoders, made by :func:`convert`.

    Extra modules: ``pos_encoders`` (additive, by name), ``pos_rotary`` (fixed-plan rotary
    encoders shared by all blocks; no state-dict entries) and ``pos_convs``
    (``{str(block): {name: conv encoder}}``); ``positional_embedding`` may be ``None``.
    """

    pos_encoders: nn.ModuleDict
    pos_rotary: nn.ModuleDict
    pos_convs: nn.ModuleDict

    def token_coords(self, image_size: Sequence[int], device: torch.device | None = None) -> Coords:
        """Coordinates of the tokens of images of size ``(H, W)``: the class token, then the patch grid."""
        h, w = image_size[0] // self.patch_size[0], image_size[1] // self.patch_size[1]
        return Coords.grid(h, w, num_prefix_tokens=1, device=device)

    def _abs_pos_embed(self, grid: tuple[int, ...]) -> Tensor:
        """The kept ``positional_embedding`` ``(1 + h * w, C)``, resampled when ``grid`` is not the training grid."""
        table = self.positional_embedding
        if tuple(grid) == tuple(self.grid_size):
            return table
        return resample_abs_pos_embed(table.unsqueeze(0), list(grid), list(self.grid_size), num_prefix_tokens=1)[0]

    def _tokens(self, images: Tensor) -> tuple[Tensor, Coords, list[Rotation]]:
        coords = self.token_coords(images.shape[-2:], images.device)
        x = self.conv1(images)  # (B, C, h, w)
        b, c, h, w = x.shape
        x = x.reshape(b, c, h * w).permute(0, 2, 1)  # (B, h * w, C)
        x = torch.cat([self.class_embedding.view(1, 1, c).expand(b, -1, -1).to(x.dtype), x], dim=1)
        if self.positional_embedding is not None:
            x = x + self._abs_pos_embed((h, w)).to(x.dtype)
        x = self.pos_add(x, coords)
        rot = self.pos_rotations(coords)  # cos / sin once, for every block
        return self.ln_pre(self.patch_dropout(x)), coords, rot

    def _run_block(self, i: int, x: Tensor, coords: Coords, rot: Sequence[Rotation]) -> Tensor:
        block = self.transformer.resblocks[i]
        if self.transformer.grad_checkpointing and not torch.jit.is_scripting():
            x = checkpoint(block, x, coords, None, rot, use_reentrant=False)
        else:
            x = block(x, coords, None, rot)
        return self.pos_after_block(i, x, coords)

    def forward(self, x: Tensor) -> Tensor | tuple[Tensor, Tensor]:
        x, coords, rot = self._tokens(x)
        for i in range(len(self.transformer.resblocks)):
            x = self._run_block(i, x, coords, rot)
        pooled, tokens = self._pool(x)
        if self.proj is not None:
            pooled = pooled @ self.proj
        return (pooled, tokens) if self.output_tokens else pooled

    def forward_intermediates(
        self,
        x: Tensor,
        indices: int | list[int] | None = None,
        stop_early: bool = False,
        normalize_intermediates: bool = False,
        intermediates_only: bool = False,
        output_fmt: str = "NCHW",
        output_extra_tokens: bool = False,
    ) -> dict[str, Tensor | list[Tensor]]:
        """open_clip's ``forward_intermediates`` (same arguments and outputs) with positions."""
        check_output_fmt(output_fmt)
        take_indices, max_index = feature_take_indices(len(self.transformer.resblocks), indices)
        x, coords, rot = self._tokens(x)
        intermediates = []
        for i in range(max_index + 1 if stop_early else len(self.transformer.resblocks)):
            x = self._run_block(i, x, coords, rot)
            if i in take_indices:
                intermediates.append(self.ln_post(x) if normalize_intermediates else x)
        prefix_tokens, intermediates = split_intermediates(intermediates, 1, coords.grid_shape, output_fmt)
        output: dict[str, Any] = {"image_intermediates": intermediates}
        if output_extra_tokens:
            output["image_intermediates_prefix"] = prefix_tokens
        if intermediates_only:
            return output
        pooled, _ = self._pool(x)
        output["image_features"] = pooled @ self.proj if self.proj is not None else pooled
        return output

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        """open_clip's set plus :func:`mmpos.nn.placement.no_weight_decay` (additive and conv
        encoders, learnable rotary frequencies)."""
        return super().no_weight_decay() | placement.no_weight_decay(self)


def _convert_tower(
    tower: VisionTransformer,
    pos: str | Sequence[str] | None,
    pos_kwargs: dict[str, dict[str, Any]] | None,
    keep_abs_pos: bool | None,
    conv_after: Sequence[int],
) -> None:
    resblocks = tower.transformer.resblocks
    if not tower.transformer.batch_first:
        raise ValueError("the tower's transformer must be batch_first")
    blocks = [b if isinstance(b, PositionalResidualBlock) else PositionalResidualBlock(b) for b in resblocks]

    def install() -> None:
        tower.transformer.resblocks = nn.ModuleList(blocks)

    convert_vit(
        tower,
        blocks,
        tower.transformer.width,
        tower.grid_size,
        1,  # open_clip's table has a row for the class token
        pos,
        pos_kwargs,
        keep_abs_pos,
        conv_after,
        patch_drop=tower.patch_dropout,
        patch_drop_arg="patch_dropout",
        install=install,
        abs_pos="positional_embedding",
        cls=PositionalCLIPVisionTransformer,
        device=tower.conv1.weight.device,
    )


def convert(
    model: nn.Module,
    pos: str | Sequence[str] | None,
    pos_kwargs: dict[str, dict[str, Any]] | None = None,
    keep_abs_pos: bool | None = None,
    conv_after: Sequence[int] = (0,),
    *,
    scaling: str | RopeScaling | Mapping[str, Any] | None = None,
    train_grid: Sequence[int] | None = None,
    target_grid: Sequence[int] | None = None,
) -> nn.Module:
    """Convert the visual tower of ``model`` in place to use mmpos encoders; returns ``model``.

    Args:
        model: an open_clip model with a ``.visual`` tower, or the tower itself: an
            ``open_clip.transformer.VisionTransformer`` (or one already converted), or a
            ``TimmModel`` whose ``trunk`` is a timm ``VisionTransformer``.
        pos, pos_kwargs, keep_abs_pos, conv_after: as in :func:`mmpos.integrations.timm.convert`;
            ``pos="none", keep_abs_pos=True`` leaves the outputs unchanged.
        scaling, train_grid, target_grid: one length-scaling rule for every rotary encoder, its factor from the
            grid the weights were trained on and the grid the tower runs at (each defaults to the tower's patch
            grid; :func:`mmpos.nn.placement.grid_scaled_kwargs`), as in :func:`mmpos.integrations.timm.convert`.

    Encoders get ``dim`` (the tower width), ``num_heads``, ``num_kv_heads``, ``head_dim``,
    ``depth``, ``grid_size`` (the tower's patch grid), ``axes=("h", "w")`` and ``layer``;
    ``learned`` defaults to one row for the class token, like ``positional_embedding``.
    """
    tower = getattr(model, "visual", model)
    if isinstance(tower, TimmModel) and type(tower.trunk) in (
        TimmVisionTransformer,
        mmpos_timm.PositionalVisionTransformer,
    ):
        grids = {"scaling": scaling, "train_grid": train_grid, "target_grid": target_grid}
        mmpos_timm.convert(tower.trunk, pos, pos_kwargs, keep_abs_pos, conv_after, **grids)
    elif type(tower) in (VisionTransformer, PositionalCLIPVisionTransformer):
        pos_kwargs = grid_scaled_kwargs(pos, pos_kwargs, scaling, tuple(tower.grid_size), train_grid, target_grid)
        _convert_tower(tower, pos, pos_kwargs, keep_abs_pos, conv_after)
    else:
        raise ValueError(
            "model must be an open_clip model whose visual tower is an open_clip VisionTransformer or a timm "
            f"VisionTransformer trunk, got a tower of type {type(tower).__name__}"
        )
    return model


def create_model(
    model_name: str,
    pos: str | Sequence[str] | None,
    pos_kwargs: dict[str, dict[str, Any]] | None = None,
    keep_abs_pos: bool | None = None,
    conv_after: Sequence[int] = (0,),
    *,
    scaling: str | RopeScaling | Mapping[str, Any] | None = None,
    train_grid: Sequence[int] | None = None,
    target_grid: Sequence[int] | None = None,
    **open_clip_kwargs: Any,
) -> nn.Module:
    """``open_clip.create_model(model_name, **open_clip_kwargs)`` with its visual tower converted
    (``scaling``, ``train_grid``, ``target_grid``: as :func:`convert`).

    Example (a tiny random model): ``create_model("ViT-B-32", pos="rope", embed_dim=32,
    vision_cfg={"image_size": 32, "patch_size": 8, "width": 64, "layers": 2, "head_width": 16},
    text_cfg={"context_length": 16, "vocab_size": 100, "width": 32, "heads": 2, "layers": 1})``.
    """
    grids = {"scaling": scaling, "train_grid": train_grid, "target_grid": target_grid}
    return convert(
        open_clip.create_model(model_name, **open_clip_kwargs), pos, pos_kwargs, keep_abs_pos, conv_after, **grids
    )


def create_model_and_transforms(
    model_name: str,
    pretrained: str | None = None,
    *,
    pos: str | Sequence[str] | None,
    pos_kwargs: dict[str, dict[str, Any]] | None = None,
    keep_abs_pos: bool | None = None,
    conv_after: Sequence[int] = (0,),
    scaling: str | RopeScaling | Mapping[str, Any] | None = None,
    train_grid: Sequence[int] | None = None,
    target_grid: Sequence[int] | None = None,
    **open_clip_kwargs: Any,
) -> tuple[nn.Module, Any, Any]:
    """``open_clip.create_model_and_transforms`` with the visual tower converted: ``(model, preprocess_train,
    preprocess_val)``.

    Args:
        model_name, pretrained, open_clip_kwargs: as ``open_clip.create_model_and_transforms`` (``precision``,
            ``device``, ``force_image_size``, ``aug_cfg``, model config overrides, ...); ``jit=True`` is refused
            (a scripted model cannot be converted).
        pos, pos_kwargs, keep_abs_pos, conv_after: as :func:`convert`; a pretrained tower converted to another
            encoder loses its ``positional_embedding`` (``keep_abs_pos=True`` keeps it).
        scaling, train_grid, target_grid: as :func:`convert` (e.g. ``force_image_size=448`` on weights trained at
            224 with ``scaling="yarn", train_grid=(14, 14)``).

    The transforms are open_clip's own, unchanged (they resize to the model's image size).
    """
    if open_clip_kwargs.get("jit"):
        raise ValueError("jit=True gives a TorchScript model, which cannot be converted; pass jit=False")
    model, preprocess_train, preprocess_val = open_clip.create_model_and_transforms(
        model_name, pretrained, **open_clip_kwargs
    )
    grids = {"scaling": scaling, "train_grid": train_grid, "target_grid": target_grid}
    return convert(model, pos, pos_kwargs, keep_abs_pos, conv_after, **grids), preprocess_train, preprocess_val


def load_state_dict_report(model: nn.Module, state_dict: Mapping[str, Tensor]) -> TransferReport:
    """Load what fits of ``state_dict`` into ``model`` and report it (see
    :func:`mmpos.integrations.checkpoint.load_state_dict_report`); ``positional_embedding``
    and the ``learned`` encoder's table map onto each other, and so do timm's ``pos_embed``
    and the table of a timm trunk (:data:`OPEN_CLIP_ALIASES`).
    """
    return _load_report(model, state_dict, OPEN_CLIP_ALIASES)
