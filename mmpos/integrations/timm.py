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

import inspect
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .._extras import requires
from ..coords import Coords
from ..encoders.base import RotaryEncoder
from ..encoders.registry import list_encoders, model_context
from ..nn import placement
from ..nn.attention import attention
from ..nn.placement import Placement, PositionalBackbone, grid_scaled_kwargs, module_key
from ..rotary import Rotation
from ..scaling import RopeScaling
from ._vit_common import check_output_fmt, convert_vit, split_intermediates
from .checkpoint import TransferReport
from .checkpoint import load_state_dict_report as _load_report

with requires("timm"):  # one line naming the package and the extra when it is missing
    import timm
    from timm.layers import Attention
    from timm.models._features import feature_take_indices
    from timm.models._manipulate import checkpoint
    from timm.models.eva import Eva
    from timm.models.vision_transformer import Block, VisionTransformer

__all__ = [
    "FROM_CHECKPOINT",
    "TIMM_ALIASES",
    "EvaRotary",
    "PositionalAttention",
    "PositionalBlock",
    "PositionalVisionTransformer",
    "convert",
    "create_vit",
    "eva_rope",
    "load_state_dict_report",
    "save_checkpoint",
    "table_aliases",
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
        check_output_fmt(output_fmt)
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        x, coords, rot = self._tokens(x)
        intermediates = []
        for i in range(max_index + 1 if stop_early else len(self.blocks)):
            x = self._run_block(i, x, coords, attn_mask, is_causal, rot)
            if i in take_indices:
                intermediates.append(self.norm(x) if norm else x)
        p = self.num_prefix_tokens
        prefix_tokens, intermediates = split_intermediates(intermediates, p, coords.grid_shape, output_fmt)
        prefix_tokens = prefix_tokens if p else None
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


# ---------------------------------------------------------------------------------- timm's Eva RoPE ViTs
def _eva_head_dim(attn: nn.Module) -> int:
    """An Eva attention's head size: ``head_dim`` where timm has it, else its projection width / heads (timm < 1.0.21)."""
    if hasattr(attn, "head_dim"):
        return int(attn.head_dim)
    width = attn.qkv.out_features // 3 if attn.qkv is not None else attn.q_proj.out_features
    return width // attn.num_heads


def _eva_convention(model: Eva) -> str:
    """The rotation layout the Eva blocks apply: ``"half"`` (``rotate_half``) or ``"interleaved"``."""
    attn = model.blocks[0].attn
    return "half" if getattr(attn, "rotate_half", False) else "interleaved"


def _eva_axes(rope: nn.Module) -> tuple[str, str]:
    """mmpos axes in the order of timm's coordinate channels: ``xy`` indexing puts the column (``w``) first."""
    return ("w", "h") if getattr(rope, "grid_indexing", "ij") == "xy" else ("h", "w")


def eva_rope(model: Eva) -> tuple[str, dict[str, Any]]:
    """``(name, kwargs)`` of the mmpos encoder that reproduces ``model``'s own RoPE.

    timm's axial ``RotaryEmbeddingCat`` (``vit_*_rope_*``, EVA-02) is ``rope-axial`` with the model's
    ``temperature`` as ``theta``, its axis order and rotation layout; the learned ``RotaryEmbeddingMixed``
    (``vit_*_rope_mixed_*``) is ``rope-mixed`` (:func:`convert` copies the learned frequencies). Other
    timm RoPE types (DINOv3's, M-RoPE, pixel-frequency bands) raise ``ValueError``.
    """
    if not isinstance(model, Eva):
        raise TypeError(f"model must be a timm Eva model, got {type(model).__name__}")
    rope = model.rope
    if isinstance(rope, EvaRotary) or rope is None:
        raise ValueError("model has no timm RoPE of its own (it has none, or it was converted already)")
    kind = type(rope).__name__
    base = {"theta": float(rope.temperature), "axes": _eva_axes(rope), "convention": _eva_convention(model)}
    if kind == "RotaryEmbeddingMixed" and isinstance(getattr(rope, "freqs", None), Tensor):
        return "rope-mixed", base
    grid_type = getattr(rope, "grid_type", "pixel" if getattr(rope, "in_pixels", True) else "index")
    if kind == "RotaryEmbeddingCat" and grid_type == "index" and not getattr(rope, "linear_bands", False):
        return "rope-axial", base
    raise ValueError(
        f"model's RoPE ({kind}, grid {grid_type!r}) has no mmpos counterpart: axial RotaryEmbeddingCat on an index "
        "grid (vit_*_rope_*, EVA-02) and RotaryEmbeddingMixed (vit_*_rope_mixed_*) are supported"
    )


class EvaRotary(nn.Module):
    """mmpos rotary encoders in place of an Eva model's ``rope`` module (set on the instance by :func:`convert`).

    timm's ``Eva`` asks its ``rope`` for ``get_embed(shape)`` and rotates q / k of the patch tokens (prefix
    tokens are left unrotated) with ``apply_rot_embed_cat``; this module answers with the sin / cos of the
    mmpos encoders at the patch grid, in timm's layout: ``(N, 2 * head_dim)`` for an encoder shared by all
    blocks, ``(H, N, 2 * head_dim)`` for a per-head plan, ``(depth, H, N, 2 * head_dim)`` for per-layer
    encoders (RoPE-Mixed; the model's ``rope_mixed`` flag is set to match).

    Coordinates: patch ``(i, j)`` sits at ``(i + offset, j + offset)``, rescaled by ``ref_feat_shape / grid``
    when the model's RoPE had a reference grid (EVA-02's scheme), computed as timm computes them.

    Args:
        shared: encoders shared by all blocks (by name); layers: each block's encoders (by name).
        feat_shape: the model's patch grid ``(h, w)``; offset, ref_feat_shape: see above.
        convention: the rotation layout of the model's attention.
    """

    def __init__(
        self,
        shared: nn.ModuleDict,
        layers: Sequence[nn.ModuleDict],
        feat_shape: Sequence[int],
        convention: str,
        offset: float = 0.0,
        ref_feat_shape: Sequence[int] | None = None,
    ) -> None:
        super().__init__()
        self.pos_rotary = shared
        self.pos_layers = nn.ModuleList(layers) if any(len(d) for d in layers) else nn.ModuleList()
        encoders = [*shared.values(), *(e for d in self.pos_layers for e in d.values())]
        names = {*shared, *(k for d in self.pos_layers for k in d)}
        if len(names) > 1:
            raise ValueError(f"timm Eva models apply one rotary encoder, got {sorted(names)}")
        for enc in encoders:
            if not isinstance(enc, RotaryEncoder):
                raise TypeError(f"timm Eva models take rotary encoders only, got {type(enc).__name__}")
            if enc.weight.shape[-1] * 2 != enc.head_dim:
                raise ValueError(f"{type(enc).__name__} rotates part of a head (rotary_dim); Eva rotates whole heads")
            if enc.convention != convention:
                raise ValueError(
                    f"{type(enc).__name__} has convention={enc.convention!r} but the model rotates {convention!r} "
                    f"pairs; pass pos_kwargs={{name: {{'convention': {convention!r}}}}}"
                )
        self.feat_shape = list(feat_shape)
        self.convention = convention
        self.offset = float(offset)
        self.ref_feat_shape = None if ref_feat_shape is None else list(ref_feat_shape)

    @property
    def per_layer(self) -> bool:
        """``True`` when every block has its own encoder (the model indexes the table by block)."""
        return len(self.pos_layers) > 0

    def update_feat_shape(self, feat_shape: Sequence[int]) -> None:
        """timm's hook when the model's input size changes."""
        self.feat_shape = list(feat_shape)

    def coords(self, shape: Sequence[int], device: torch.device | None = None) -> Coords:
        """Coordinates of a patch grid ``(h, w)`` (no prefix tokens: Eva leaves them unrotated)."""
        t = [torch.arange(n, device=device, dtype=torch.int64).to(torch.float32) + self.offset for n in shape]
        if self.ref_feat_shape is not None:  # as timm: t / feat_shape * ref_feat_shape
            t = [x / f * r for x, f, r in zip(t, shape, self.ref_feat_shape)]
        pos = torch.stack(torch.meshgrid(t, indexing="ij"), dim=-1).reshape(1, -1, 2)  # (1, h * w, (h, w))
        return Coords(pos, ("h", "w"), grid_shape=tuple(int(n) for n in shape))

    def _table(self, encoder: RotaryEncoder, coords: Coords, dtype: torch.dtype | None) -> Tensor:
        angles = encoder.angles(coords)[0]  # (N, P) or (H, N, P), float32
        sin, cos = angles.sin(), angles.cos()
        if self.convention == "half":  # [f0 f1 .. f0 f1 ..]
            sin, cos = torch.cat([sin, sin], -1), torch.cat([cos, cos], -1)
        else:  # [f0 f0 f1 f1 ..]
            sin, cos = sin.repeat_interleave(2, -1), cos.repeat_interleave(2, -1)
        table = torch.cat([sin, cos], -1)
        return table if dtype is None else table.to(dtype)

    def get_embed(self, shape: Sequence[int] | None = None, dtype: torch.dtype | None = None) -> Tensor:
        """sin / cos of the patch grid ``shape`` (default: the model's grid) in timm's ``cat`` layout."""
        shape = self.feat_shape if shape is None else list(shape)
        encoders = [next(iter(d.values())) for d in self.pos_layers] or list(self.pos_rotary.values())
        if not encoders:
            raise ValueError("EvaRotary holds no encoder")
        coords = self.coords(shape, encoders[0].weight.device)  # the plan's device (a buffer or a parameter)
        if self.per_layer:
            return torch.stack([self._table(encoder, coords, dtype) for encoder in encoders])
        return self._table(encoders[0], coords, dtype)

    def no_weight_decay(self) -> set[str]:
        """Learned frequencies (RoPE-Mixed), as :func:`mmpos.nn.placement.no_weight_decay` names them."""
        return placement.no_weight_decay(self)


def _copy_mixed(own: nn.Module, rope: EvaRotary) -> None:
    """Copy the learned frequencies of timm's ``RotaryEmbeddingMixed`` ``(2, depth, H, P)`` into the
    per-layer ``rope-mixed`` weights ``(H, A, P)`` (axis channels matched by name)."""
    freqs = own.freqs.detach()
    channel = {a: i for i, a in enumerate(_eva_axes(own))}
    for layer, encoders in enumerate(rope.pos_layers):
        for enc in encoders.values():
            weight = torch.stack([freqs[channel[a], layer] for a in enc.axes], dim=1)  # (H, A, P)
            if weight.shape != enc.weight.shape:
                raise ValueError(
                    f"the model's mixed frequencies {tuple(weight.shape)} do not fit {type(enc).__name__}'s weight "
                    f"{tuple(enc.weight.shape)}"
                )
            with torch.no_grad():
                enc.weight.copy_(weight.to(enc.weight.dtype))


def _convert_eva(model: Eva, pos: str | Sequence[str] | None, pos_kwargs: dict[str, dict[str, Any]] | None) -> Eva:
    own = model.rope
    if isinstance(own, EvaRotary):
        offset, ref, own_mixed = own.offset, own.ref_feat_shape, None
    elif own is None:
        offset, ref, own_mixed = 0.0, None, None
    else:
        eva_rope(model)  # ValueError for RoPE types mmpos does not reproduce
        offset = float(getattr(own, "grid_offset", 0.0))
        ref = getattr(own, "ref_feat_shape", None)
        own_mixed = own if type(own).__name__ == "RotaryEmbeddingMixed" else None
    attn = model.blocks[0].attn
    convention = _eva_convention(model)
    context = model_context(
        model.embed_dim,
        attn.num_heads,
        len(model.blocks),
        head_dim=_eva_head_dim(attn),
        grid_size=model.patch_embed.grid_size,
        axes=("h", "w"),
    )
    kwargs = {k: dict(v) for k, v in (pos_kwargs or {}).items()}
    setup = Placement(pos, kwargs, context)
    for name in setup.names:
        if setup.kinds[name] != "rotary":
            raise ValueError(
                f"timm Eva models take rotary encoders only (their RoPE hook); {name!r} is {setup.kinds[name]}"
            )
        if "convention" in inspect.signature(setup.records[name].factory).parameters:
            setup.pos_kwargs.setdefault(name, {}).setdefault("convention", convention)
    layers = [setup.layer(i) for i in range(len(model.blocks))]
    device = model.patch_embed.proj.weight.device
    if not setup.names:
        model.rope, model.rope_mixed = None, False
        return model
    rope = EvaRotary(setup.shared(), layers, model.patch_embed.grid_size, convention, offset, ref).to(device)
    if own_mixed is not None and rope.per_layer and all(k == "rope-mixed" for d in rope.pos_layers for k in d):
        _copy_mixed(own_mixed, rope)
    model.rope = rope
    model.rope_mixed = rope.per_layer
    return model


def _record(model: nn.Module, pos: Any, pos_kwargs: Any, keep_abs_pos: Any, conv_after: Any) -> None:
    """Write the encoder choice into ``model.pretrained_cfg["mmpos"]`` (read back by :func:`create_vit`)."""
    cfg = dict(getattr(model, "pretrained_cfg", None) or {})
    old = cfg.get("mmpos", {})
    cfg["mmpos"] = {
        "model_name": old.get("model_name"),
        "model_kwargs": old.get("model_kwargs"),
        "pos": pos if pos is None or isinstance(pos, str) else list(pos),
        "pos_kwargs": {
            k: {a: b.to_dict() if isinstance(b, RopeScaling) else b for a, b in dict(v).items()}
            for k, v in (pos_kwargs or {}).items()
        },  # plain data (a checkpoint is read with weights_only=True)
        "keep_abs_pos": keep_abs_pos,
        "conv_after": list(conv_after),
    }
    model.pretrained_cfg = cfg


def convert(
    model: VisionTransformer | Eva,
    pos: str | Sequence[str] | None,
    pos_kwargs: dict[str, dict[str, Any]] | None = None,
    keep_abs_pos: bool | None = None,
    conv_after: Sequence[int] = (0,),
    *,
    scaling: str | RopeScaling | Mapping[str, Any] | None = None,
    train_grid: Sequence[int] | None = None,
    target_grid: Sequence[int] | None = None,
) -> PositionalVisionTransformer | Eva:
    """Convert a timm ``VisionTransformer`` (or ``Eva`` RoPE ViT) in place to use mmpos encoders; returns it.

    Args:
        model: a ``timm.models.vision_transformer.VisionTransformer`` with plain ``Block`` /
            ``Attention`` layers (or an already converted model, whose encoders are replaced); or a
            ``timm.models.eva.Eva`` (``vit_*_rope_*``, EVA-02), whose ``rope`` becomes an :class:`EvaRotary`
            holding one mmpos rotary encoder (``pos="none"`` removes it). ``convert(model, *eva_rope(model))``
            reproduces the model's own RoPE (RoPE-Mixed keeps the learned frequencies).
        pos: encoder name or list of names (``mmpos.list_encoders()``); ``"none"`` adds none.
        pos_kwargs: keyword arguments per encoder name, e.g. ``{"rope-axial": {"theta": 100}}``.
        keep_abs_pos: keep the model's own ``pos_embed`` (``None``: only when every encoder
            is a bias encoder). ``pos="none", keep_abs_pos=True`` leaves the model's outputs unchanged.
        conv_after: block indices after which conv encoders run (CPVT: after block 0).
        scaling, train_grid, target_grid: one length-scaling rule for every rotary encoder of ``pos``
            (:func:`mmpos.nn.placement.grid_scaled_kwargs`, the grids default to the model's patch grid): weights
            trained at 14x14 run at 28x28 with ``create_model(..., img_size=448)`` converted with
            ``scaling="yarn", train_grid=(14, 14)`` (factor 2 per axis, ``original_size`` 14); or a
            :class:`~mmpos.scaling.RopeScaling` used as is. Recorded in ``pos_kwargs``.

    Encoders get what their record reads of the model context (:func:`mmpos.encoders.registry.model_context`):
    ``dim``, ``num_heads``, ``num_kv_heads``, ``head_dim``, ``depth``, ``grid_size`` (the model's patch
    grid), ``axes=("h", "w")``, ``prefix_rows`` (the rows of timm's table: ``num_prefix_tokens``, 0 with
    ``no_embed_class``; ``learned`` reads it) and, for attention and conv encoders, ``layer``. Placement and
    conversion: :func:`mmpos.nn.placement.convert_backbone`, shared with open_clip. The encoder choice is
    written into ``model.pretrained_cfg["mmpos"]`` (:func:`save_checkpoint` keeps it, :func:`create_vit`
    rebuilds from it).
    """
    if isinstance(model, (Eva, VisionTransformer)):  # anything else is refused below, grids or not
        grid = tuple(model.patch_embed.grid_size)
        pos_kwargs = grid_scaled_kwargs(pos, pos_kwargs, scaling, grid, train_grid, target_grid)
    if isinstance(model, Eva):
        if keep_abs_pos is not None or tuple(conv_after) != (0,):
            raise ValueError("keep_abs_pos and conv_after do not apply to Eva models (their encoder is rotary)")
        _convert_eva(model, pos, pos_kwargs)
        _record(model, pos, pos_kwargs, keep_abs_pos, conv_after)
        return model
    if type(model) not in (VisionTransformer, PositionalVisionTransformer):
        raise ValueError(f"model must be a timm VisionTransformer or a timm Eva RoPE ViT, got {type(model).__name__}")
    blocks = [b if isinstance(b, PositionalBlock) else PositionalBlock(b) for b in model.blocks]

    def install() -> None:
        model.blocks = nn.Sequential(*blocks)

    convert_vit(
        model,
        blocks,
        model.embed_dim,
        model.patch_embed.grid_size,
        0 if model.no_embed_class else model.num_prefix_tokens,  # the rows of timm's table
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
    _record(model, pos, pos_kwargs, keep_abs_pos, conv_after)
    return model


#: ``create_vit(pos=...)`` left out: the encoders come from the checkpoint
FROM_CHECKPOINT = "from-checkpoint"


def create_vit(
    model_name: str | None = None,
    pos: str | Sequence[str] | None = FROM_CHECKPOINT,
    pos_kwargs: dict[str, dict[str, Any]] | None = None,
    keep_abs_pos: bool | None = None,
    conv_after: Sequence[int] = (0,),
    *,
    checkpoint: str | Path | None = None,
    scaling: str | RopeScaling | Mapping[str, Any] | None = None,
    train_grid: Sequence[int] | None = None,
    target_grid: Sequence[int] | None = None,
    **timm_kwargs: Any,
) -> PositionalVisionTransformer | Eva:
    """``timm.create_model(model_name, **timm_kwargs)`` converted by :func:`convert`.

    ``model_name`` may name a ``VisionTransformer`` or an ``Eva`` RoPE ViT (``vit_*_rope_*``). With
    ``checkpoint`` (a file written by :func:`save_checkpoint`), the model name, the timm arguments and the
    encoders recorded there rebuild the model (arguments given here win) and its weights are loaded
    (strictly); without it, ``pos`` is required. ``scaling``, ``train_grid``, ``target_grid``: as :func:`convert`
    (a checkpoint's recorded rule is in its ``pos_kwargs``).

    Example: ``create_vit("vit_tiny_patch16_224", pos="rope", img_size=64, dynamic_img_size=True)``.
    """
    state = None
    if checkpoint is not None:
        saved = torch.load(checkpoint, map_location="cpu", weights_only=True)
        if not isinstance(saved, Mapping) or "state_dict" not in saved or "mmpos" not in saved:
            raise ValueError(f"checkpoint={str(checkpoint)!r} was not written by save_checkpoint (no 'mmpos' record)")
        record, state = saved["mmpos"], saved["state_dict"]
        model_name = model_name or record.get("model_name")
        timm_kwargs = {**(record.get("model_kwargs") or {}), **timm_kwargs}
        if pos == FROM_CHECKPOINT:
            pos, pos_kwargs = record["pos"], record["pos_kwargs"]
            keep_abs_pos, conv_after = record["keep_abs_pos"], tuple(record["conv_after"])
    if model_name is None:
        raise ValueError("model_name is required (or a checkpoint that records it)")
    if pos == FROM_CHECKPOINT:
        raise ValueError("pos is required without a checkpoint: an encoder name or a list of names")
    model = timm.create_model(model_name, **timm_kwargs)
    if type(model) is not VisionTransformer and not isinstance(model, Eva):
        raise ValueError(f"model_name {model_name!r} builds a {type(model).__name__}, not a timm VisionTransformer")
    model = convert(
        model,
        pos,
        pos_kwargs,
        keep_abs_pos,
        conv_after,
        scaling=scaling,
        train_grid=train_grid,
        target_grid=target_grid,
    )
    model.pretrained_cfg["mmpos"].update(model_name=model_name, model_kwargs=dict(timm_kwargs))
    if state is not None:
        model.load_state_dict(state)
    return model


def save_checkpoint(model: nn.Module, path: str | Path) -> None:
    """Save ``model``'s weights with its encoder record (``pretrained_cfg["mmpos"]``), for ``create_vit(checkpoint=)``.

    The file holds ``{"state_dict": ..., "mmpos": {model_name, model_kwargs, pos, pos_kwargs, keep_abs_pos,
    conv_after}}`` (loadable with ``torch.load(..., weights_only=True)``).
    """
    record = (getattr(model, "pretrained_cfg", None) or {}).get("mmpos")
    if record is None:
        raise ValueError("model has no mmpos record: convert it with convert() or build it with create_vit()")
    torch.save({"state_dict": model.state_dict(), "mmpos": record}, path)


def load_state_dict_report(model: nn.Module, state_dict: Mapping[str, Tensor]) -> TransferReport:
    """Load what fits of ``state_dict`` (e.g. trained with another encoder) into ``model``.

    Shared weights are kept, the model's other weights keep their initialisation, the
    checkpoint's other weights are dropped; timm's ``pos_embed`` and the ``learned``
    encoder's table map onto each other (:data:`TIMM_ALIASES`). See
    :func:`mmpos.integrations.checkpoint.load_state_dict_report`.
    """
    return _load_report(model, state_dict, TIMM_ALIASES)
