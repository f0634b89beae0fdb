"""Swap another multimodal rotary scheme into a Hugging Face Qwen2-VL-family model.

:func:`use_rope` ``(model, scheme)`` re-points, on that model *instance* only, the two
places where a Qwen2-VL / Qwen2.5-VL / Qwen3-VL model decides positions:

* ``model.get_rope_index`` (the position ids of a prompt, and ``rope_deltas`` for
  decoding) becomes the vectorised :mod:`mmpos.layout` rule of ``scheme``;
* the text model's ``rotary_emb`` (position ids -> ``cos``, ``sin``) becomes
  :class:`HFRotaryEmbedding`, the scheme's :class:`~mmpos.rotary.FrequencyPlan`.

Plans shared by all heads (M-RoPE, MRoPE-I, VRoPE, HoPE, V2PE, flat) are handed to the
model's own attention in the layout it expects (``(3, B, L, D)`` with three equal rows for
Qwen2/2.5-VL, whose ``apply_multimodal_rotary_pos_emb`` then picks any row per section;
``(B, L, D)`` for Qwen3-VL), so the attention code is untouched. MHRoPE's per-head plan
cannot travel that way: its ``cos``/``sin`` are ``(B, Hkv, L, D/2)`` and every attention
layer's ``forward`` is replaced, on the instance, by :func:`per_head_attention_forward`.

Position ids keep the Hugging Face ``(3, B, L)`` shape, so ``generate`` works unchanged:
HoPE ids are float32, V2PE ids float64 (angles then in float64), and VRoPE's four
per-pair combinations travel as ``(c0, c1, c2)``: ``c3 = c1 + c2 - c0`` holds for every
VRoPE position (``i + j + (H-1-i) + (W-1-j) = i + (W-1-j) + (H-1-i) + j``; text has four
equal values), and :class:`HFRotaryEmbedding` rebuilds it.

``use_rope(model, "own")`` restores the model's own modules. The scheme names of the
models themselves (``"qwen2-vl"``, ``"qwen2.5-vl"``, ``"qwen3-vl"``) install mmpos's
implementation of that scheme, which gives the same logits as the model's own (tests).
"""

from __future__ import annotations

import inspect
import sys
import types
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from ..encoders.base import RotaryEncoder
from ..encoders.mrope import default_mrope_section
from ..layout import ADVANCES, HOPE_SCALES, V2PE_DELTAS, VisionBlocks, token_positions
from ..registry import create
from ..rotary import apply_rotary, plan_angles

__all__ = [
    "SCHEMES",
    "HFRotaryEmbedding",
    "RopeIndexOptions",
    "current_rope",
    "per_head_attention_forward",
    "scheme_rope_index",
    "use_rope",
]

#: scheme -> mmpos encoder (the layout scheme has the same name)
SCHEMES: dict[str, str] = {
    "qwen2-vl": "mrope",
    "qwen2.5-vl": "mrope",
    "qwen3-vl": "mrope-i",
    "mrope-i": "mrope-i",
    "mhrope": "mhrope",
    "vrope": "vrope",
    "hope": "hope",
    "v2pe": "v2pe",
    "flat": "rope",
}
_FAMILIES = {"qwen2_vl": "qwen2", "qwen2_5_vl": "qwen2", "qwen3_vl": "qwen3", "qwen3_vl_moe": "qwen3"}

# how the plan's axes are read from the three HF position rows (r0, r1, r2)
_ROWS_TO_AXES: dict[tuple[str, ...], list[list[float]]] = {
    ("t", "h", "w"): [[1, 0, 0], [0, 1, 0], [0, 0, 1]],
    ("h", "w"): [[0, 1, 0], [0, 0, 1]],
    ("c0", "c1", "c2", "c3"): [[1, 0, 0], [0, 1, 0], [0, 0, 1], [-1, 1, 1]],  # c3 = c1 + c2 - c0
    ("seq",): [[1, 0, 0]],
}


class HFRotaryEmbedding(nn.Module):
    """Drop-in for ``Qwen2VLRotaryEmbedding`` / ``Qwen3VLTextRotaryEmbedding`` computing the
    angles of an mmpos rotary encoder's plan.

    ``forward(x, position_ids)``: ``position_ids`` ``(3, B, L)`` (or ``(B, L)``, read as text)
    -> ``(cos, sin)`` in ``x.dtype``, shaped for the attention that consumes them
    (``layout``): ``"qwen2"`` ``(3, B, L, D)`` (three equal rows), ``"qwen3"`` ``(B, L, D)``,
    ``"per_head"`` ``(B, Hkv, L, D/2)``. Angles are float32, float64 for float64 ids.
    """

    def __init__(self, encoder: RotaryEncoder, layout: str) -> None:
        super().__init__()
        if encoder.axes not in _ROWS_TO_AXES:
            raise ValueError(f"encoder axes must be one of {tuple(_ROWS_TO_AXES)}, got {encoder.axes}")
        if layout not in ("qwen2", "qwen3", "per_head"):
            raise ValueError(f"layout must be 'qwen2', 'qwen3' or 'per_head', got {layout!r}")
        self.encoder = encoder
        self.layout = layout
        rows_to_axes = torch.tensor(_ROWS_TO_AXES[encoder.axes], dtype=torch.float32)  # (A, 3)
        self.register_buffer("rows_to_axes", rows_to_axes, persistent=False)
        self._float32 = (encoder.weight.detach().float().cpu(), self.rows_to_axes.clone())  # masters, see _apply

    def _apply(self, fn, recurse=True):
        """Follow ``model.to(device)`` but keep the plan float32 under ``model.to(bfloat16)``
        or ``.half()`` (frequencies rounded to 8 bits would move every angle)."""
        super()._apply(fn, recurse)
        device = self.rows_to_axes.device
        self.encoder.weight = self._float32[0].to(device)
        self.rows_to_axes = self._float32[1].to(device)
        return self

    @torch.no_grad()
    def forward(self, x: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        if position_ids.dim() == 2:
            position_ids = position_ids.unsqueeze(0).expand(3, -1, -1)
        dtype = torch.float64 if position_ids.dtype == torch.float64 else torch.float32
        device_type = x.device.type if x.device.type != "mps" else "cpu"
        with torch.autocast(device_type=device_type, enabled=False):
            rows = position_ids.permute(1, 2, 0).to(dtype)  # (B, L, 3)
            pos = (rows.unsqueeze(-2) * self.rows_to_axes.to(dtype)).sum(-1)  # (B, L, A)
            angles = plan_angles(self.encoder.weight, pos, dtype)  # (B, L, P) or (B, Hkv, L, P)
            cos, sin = angles.cos(), angles.sin()
        if self.layout == "per_head":
            return cos.to(x.dtype), sin.to(x.dtype)
        cos, sin = torch.cat((cos, cos), -1).to(x.dtype), torch.cat((sin, sin), -1).to(x.dtype)
        if self.layout == "qwen2":
            cos, sin = cos.expand(3, *cos.shape), sin.expand(3, *sin.shape)
        return cos, sin


def per_head_attention_forward(
    self: nn.Module,
    hidden_states: Tensor,
    position_embeddings: tuple[Tensor, Tensor],
    attention_mask: Tensor | None = None,
    past_key_values: Any = None,
    cache_position: Tensor | None = None,
    position_ids: Tensor | None = None,
    output_attentions: bool = False,
    use_cache: bool = False,
    **kwargs: Any,
) -> tuple[Tensor, Tensor | None]:
    """``forward`` of a Qwen2-VL / Qwen2.5-VL / Qwen3-VL text attention layer with per-head
    ``cos``/``sin`` ``(B, Hkv, L, D/2)`` (MHRoPE): the same steps as the model's own forward
    (projections, Qwen3-VL's per-head q/k norms, rotation, cache update, the configured
    attention function, output projection), with :func:`mmpos.rotary.apply_rotary` rotating
    query heads by the angles of their KV head."""
    b, n, _ = hidden_states.shape
    heads = (b, n, -1, self.head_dim)
    q = self.q_proj(hidden_states).view(heads)
    k = self.k_proj(hidden_states).view(heads)
    v = self.v_proj(hidden_states).view(heads).transpose(1, 2)
    if hasattr(self, "q_norm"):  # Qwen3-VL normalises every head before the rotation
        q, k = self.q_norm(q), self.k_norm(k)
    cos, sin = position_embeddings
    q, k = apply_rotary(q.transpose(1, 2), cos, sin), apply_rotary(k.transpose(1, 2), cos, sin)
    if past_key_values is not None:
        k, v = past_key_values.update(k, v, self.layer_idx, {"cache_position": cache_position})
    impl = self.config._attn_implementation
    if impl == "eager":
        attention = sys.modules[type(self).__module__].eager_attention_forward
    else:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        attention = ALL_ATTENTION_FUNCTIONS[impl]
    if hasattr(self, "sliding_window"):  # Qwen2/2.5-VL pass these to the attention function
        kwargs.update(sliding_window=self.sliding_window, position_ids=position_ids)
    out, weights = attention(
        self, q, k, v, attention_mask, dropout=0.0 if not self.training else self.attention_dropout,
        scaling=self.scaling, **kwargs,
    )
    return self.o_proj(out.reshape(b, n, -1).contiguous()), weights


# ------------------------------------------------------------------------- position ids
@dataclass(frozen=True)
class RopeIndexOptions:
    """What :func:`scheme_rope_index` needs besides the prompt: the scheme and its options
    (see :func:`use_rope`), the model family (``"qwen2"`` or ``"qwen3"``) and the config's
    spatial merge size, placeholder token ids and ``tokens_per_second``."""

    scheme: str
    family: str
    merge: int
    image_token_id: int
    video_token_id: int
    tokens_per_second: float
    delta: float | None
    temporal_scale: float | None
    training: bool
    advance: str


def _grid(grid: Tensor | None, name: str, device: torch.device) -> Tensor:
    if grid is None:
        return torch.zeros(0, 3, dtype=torch.long, device=device)
    if not isinstance(grid, Tensor) or grid.dim() != 2 or grid.shape[1] != 3:
        raise ValueError(f"{name} must be a tensor of shape (num, 3), got {getattr(grid, 'shape', grid)}")
    return grid.long().to(device)


def _flat_index(is_token: Tensor, tokens: Tensor, name: str) -> Tensor:
    """Flat indices ``b * L + l`` of the marked tokens, in reading order (they fill the blocks in turn)."""
    index = is_token.reshape(-1).nonzero().squeeze(1)
    if index.shape[0] != int(tokens.sum()):
        raise ValueError(
            f"{name} describes {int(tokens.sum())} tokens, but input_ids holds {index.shape[0]} such tokens"
        )
    return index


def scheme_rope_index(
    options: RopeIndexOptions,
    input_ids: Tensor,
    image_grid_thw: Tensor | None = None,
    video_grid_thw: Tensor | None = None,
    attention_mask: Tensor | None = None,
    second_per_grid_ts: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """HF-shaped ``(position_ids (3, B, L), rope_deltas (B, 1))`` of a Qwen-VL prompt under
    ``options.scheme`` (1 on padding), from :func:`mmpos.layout.token_positions`. Vision tokens
    are found by their placeholder ids; for the Qwen3-VL family (and the ``qwen3-vl`` scheme)
    every video frame is its own block."""
    device = input_ids.device
    real = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask == 1
    images = _grid(image_grid_thw, "image_grid_thw", device)
    videos = _grid(video_grid_thw, "video_grid_thw", device)
    if second_per_grid_ts is None:
        seconds = torch.ones(videos.shape[0], dtype=torch.float32, device=device)
    else:
        seconds = torch.as_tensor(second_per_grid_ts, device=device).reshape(-1).float()
        if seconds.shape[0] != videos.shape[0]:
            raise ValueError(
                f"second_per_grid_ts must hold one value per video ({videos.shape[0]}), got {seconds.shape[0]}"
            )
    if options.family == "qwen3" or options.scheme == "qwen3-vl":
        seconds = torch.repeat_interleave(seconds, videos[:, 0])
        videos = torch.repeat_interleave(videos, videos[:, 0], dim=0)
        videos[:, 0] = 1
    grid = torch.cat([images, videos]) // torch.tensor([1, options.merge, options.merge], device=device)  # merged
    tokens = grid.prod(-1)
    k_img, k = images.shape[0], grid.shape[0]
    token_index = torch.cat([
        _flat_index((input_ids == options.image_token_id) & real, tokens[:k_img], "image_grid_thw"),
        _flat_index((input_ids == options.video_token_id) & real, tokens[k_img:], "video_grid_thw"),
    ])
    f64 = {"dtype": torch.float64, "device": device}
    delta = torch.full((k,), 1.0 if options.delta is None else float(options.delta), **f64)
    scale = torch.full((k,), 1.0 if options.temporal_scale is None else float(options.temporal_scale), **f64)
    if options.training and options.scheme == "v2pe":
        delta = torch.tensor(V2PE_DELTAS, **f64)[torch.randint(len(V2PE_DELTAS), (k,), device=device)]
    if options.training and options.scheme == "hope":
        scale = torch.tensor(HOPE_SCALES, **f64)[torch.randint(len(HOPE_SCALES), (k,), device=device)]
    blocks = VisionBlocks(grid, torch.cat([torch.zeros(k_img, device=device), seconds]), delta, scale, token_index)
    stride = int(options.temporal_scale) if options.scheme == "mrope-i" and options.temporal_scale else 1
    pos, nxt = token_positions(real, blocks, options.scheme, options.tokens_per_second, stride, options.advance)
    rows = pos[:3].expand(3, -1, -1)  # (A, B, L) -> (3, B, L); VRoPE: c0, c1, c2 (c3 is rebuilt)
    fractional = k > 0 and options.scheme in ("v2pe", "hope")  # text-only prompts keep integer ids
    id_dtype = {"v2pe": torch.float64, "hope": torch.float32}[options.scheme] if fractional else input_ids.dtype
    position_ids = rows.masked_fill(~real, 1).to(id_dtype)
    deltas = (nxt - input_ids.shape[1]).unsqueeze(1)
    return position_ids, deltas.to(torch.float32) if fractional and options.scheme == "hope" else deltas.long()


class _SchemeIndex:
    """Bound to a model instance as ``get_rope_index``; accepts the model's own signature."""

    def __init__(self, original: Any, options: RopeIndexOptions) -> None:
        self.signature = inspect.signature(original)
        self.options = options

    def __call__(self, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        bound = self.signature.bind(*args, **kwargs).arguments
        return scheme_rope_index(
            self.options,
            bound["input_ids"],
            bound.get("image_grid_thw"),
            bound.get("video_grid_thw"),
            bound.get("attention_mask"),
            bound.get("second_per_grid_ts"),
        )


# ------------------------------------------------------------------------- use_rope
@dataclass
class _Installed:
    scheme: str
    rotary_emb: nn.Module
    attentions: list[nn.Module] = field(default_factory=list)


def _parts(model: nn.Module) -> tuple[nn.Module, nn.Module, str]:
    """``(core, text_model, family)``: the module holding ``get_rope_index`` and the text model."""
    core = model.model if hasattr(model, "model") and hasattr(model.model, "get_rope_index") else model
    family = _FAMILIES.get(getattr(core.config, "model_type", None))
    if family is None or not hasattr(core, "get_rope_index") or not hasattr(core, "language_model"):
        raise ValueError(
            f"model must be a Qwen2-VL, Qwen2.5-VL or Qwen3-VL model (model_type one of {tuple(_FAMILIES)}), "
            f"got {type(model).__name__} with model_type {getattr(core.config, 'model_type', None)!r}"
        )
    return core, core.language_model, family


def current_rope(model: nn.Module) -> str:
    """The scheme :func:`use_rope` installed on ``model``, or ``"own"``."""
    core, _, _ = _parts(model)
    installed = core.__dict__.get("_mmpos_rope")
    return installed.scheme if installed is not None else "own"


def _restore(core: nn.Module, text: nn.Module) -> None:
    installed = core.__dict__.pop("_mmpos_rope", None)
    if installed is None:
        return
    device = text.embed_tokens.weight.device  # the model may have moved while swapped
    text.rotary_emb = installed.rotary_emb.to(device)
    del core.get_rope_index  # the class method shows again
    for attn in installed.attentions:
        del attn.forward
    core.rope_deltas = None


def use_rope(
    model: nn.Module,
    scheme: str,
    *,
    mrope_section: list[int] | None = None,
    head_sections: list[int] | None = None,
    delta: float | None = None,
    temporal_scale: float | None = None,
    training: bool = False,
    advance: str = "max",
) -> nn.Module:
    """Make a Qwen2-VL / Qwen2.5-VL / Qwen3-VL model use ``scheme`` (in place; returns it).

    Args:
        model: ``Qwen2VLForConditionalGeneration`` / ``Qwen2VLModel`` (and the 2.5 / 3 classes).
        scheme: ``"own"`` (restore the model's modules), one of :data:`SCHEMES`: ``"mrope-i"``,
            ``"mhrope"``, ``"vrope"``, ``"hope"``, ``"v2pe"``, ``"flat"``, or a model's own scheme
            name (``"qwen2-vl"``, ``"qwen2.5-vl"``, ``"qwen3-vl"``) implemented by mmpos.
        mrope_section: rotary pairs per (t, h, w) for ``qwen*-vl``, ``mrope-i``, ``hope``
            (default: the model's ``rope_scaling["mrope_section"]`` where it has that kind,
            else :func:`~mmpos.encoders.mrope.default_mrope_section`).
        head_sections: KV heads per (t, h, w) for ``mhrope`` (default: ``[H/4, 3H/8, 3H/8]``).
        delta: V2PE visual step in (0, 1] (required for ``v2pe`` unless ``training``).
        temporal_scale: HoPE temporal scale (required for ``hope`` unless ``training``), or the
            integer MRoPE-I temporal stride.
        training: draw V2PE's delta / HoPE's scale per vision block, as in their training.
        advance: ``"max"`` or ``"spatial"`` (transformers >= 5.3 rule), for the Qwen schemes.

    Returns:
        ``model``, whose ``rope_deltas`` cache is cleared.
    """
    core, text, family = _parts(model)
    if scheme != "own" and scheme not in SCHEMES:
        raise ValueError(f"scheme must be 'own' or one of {tuple(SCHEMES)}, got {scheme!r}")
    if advance not in ADVANCES:
        raise ValueError(f"advance must be one of {ADVANCES}, got {advance!r}")
    if scheme == "v2pe" and not training and not (isinstance(delta, (int, float)) and 0 < delta <= 1):
        raise ValueError(f"delta must be a number in (0, 1] for scheme='v2pe' (or pass training=True), got {delta!r}")
    if scheme == "hope" and not training and not (isinstance(temporal_scale, (int, float)) and temporal_scale > 0):
        raise ValueError(
            f"temporal_scale must be a positive number for scheme='hope' (or pass training=True), "
            f"got {temporal_scale!r}"
        )
    _restore(core, text)
    if scheme == "own":
        return model

    cfg = getattr(core.config, "text_config", core.config)
    rope_scaling = getattr(cfg, "rope_scaling", None) or {}
    if rope_scaling.get("rope_type", rope_scaling.get("type", "default")) not in ("default", "mrope"):
        raise ValueError(f"use_rope supports the default rope_type only, got rope_scaling={rope_scaling}")
    attn0 = text.layers[0].self_attn
    head_dim, theta = attn0.head_dim, float(cfg.rope_theta)
    encoder_name = SCHEMES[scheme]
    kwargs: dict[str, Any] = {"head_dim": head_dim, "theta": theta}
    if encoder_name in ("mrope", "mrope-i", "hope"):
        own_interleaved = family == "qwen3"
        wants_interleaved = encoder_name == "mrope-i"
        section = mrope_section
        if section is None and own_interleaved == wants_interleaved and "mrope_section" in rope_scaling:
            section = list(rope_scaling["mrope_section"])
        kwargs["mrope_section"] = section if section is not None else default_mrope_section(head_dim, wants_interleaved)
    if encoder_name == "mhrope":
        kwargs.update(
            num_heads=cfg.num_attention_heads, num_kv_heads=cfg.num_key_value_heads, head_sections=head_sections
        )
    encoder = create(encoder_name, **kwargs)
    per_head = encoder.weight.dim() == 3
    rotary = HFRotaryEmbedding(encoder, "per_head" if per_head else family).to(text.embed_tokens.weight.device)

    vision = core.config.vision_config
    options = RopeIndexOptions(
        scheme=scheme, family=family, merge=int(vision.spatial_merge_size),
        image_token_id=int(core.config.image_token_id), video_token_id=int(core.config.video_token_id),
        tokens_per_second=float(getattr(vision, "tokens_per_second", 1)), delta=delta,
        temporal_scale=temporal_scale, training=training, advance=advance,
    )
    installed = _Installed(scheme, text.rotary_emb)
    core.get_rope_index = _SchemeIndex(type(core).get_rope_index.__get__(core), options)
    text.rotary_emb = rotary
    if per_head:
        for layer in text.layers:
            layer.self_attn.forward = types.MethodType(per_head_attention_forward, layer.self_attn)
            installed.attentions.append(layer.self_attn)
    core.__dict__["_mmpos_rope"] = installed
    core.rope_deltas = None
    return model
