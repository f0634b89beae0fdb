"""Swap another multimodal rotary scheme into a Hugging Face Qwen2-VL-family model.

:func:`use_rope` ``(model, scheme)`` re-points, on that model *instance* only, the two
places where a Qwen2-VL / Qwen2.5-VL / Qwen3-VL model decides positions:

* ``model.get_rope_index`` (the position ids of a prompt, and ``rope_deltas`` for
  decoding) becomes :func:`~mmpos.integrations.hf_rope_index.scheme_rope_index`, the
  vectorised core of :func:`~mmpos.integrations.hf_rope_index.get_rope_index`, run with
  ``scheme``'s :mod:`mmpos.layout` rule;
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
from ..encoders.mrope import SCHEME_ENCODERS, default_mrope_section
from ..registry import create
from ..rotary import apply_rotary, plan_angles
from .hf_rope_index import MODEL_SCHEMES, RopeIndexOptions, scheme_rope_index

__all__ = [
    "SCHEMES",
    "HFRotaryEmbedding",
    "RopeIndexOptions",
    "current_rope",
    "per_head_attention_forward",
    "scheme_rope_index",
    "use_rope",
]

#: scheme -> mmpos encoder (the layout scheme has the same name); every layout scheme
SCHEMES: dict[str, str] = SCHEME_ENCODERS

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
            bound.get("mm_token_type_ids"),  # transformers >= 5.3
        )


# ------------------------------------------------------------------------- use_rope
@dataclass
class _Installed:
    scheme: str
    rotary_emb: nn.Module
    attentions: list[nn.Module] = field(default_factory=list)


def _parts(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """``(core, text_model)``: the module holding ``get_rope_index`` and the text model."""
    core = model.model if hasattr(model, "model") and hasattr(model.model, "get_rope_index") else model
    model_type = getattr(core.config, "model_type", None)
    if model_type not in MODEL_SCHEMES or not hasattr(core, "get_rope_index") or not hasattr(core, "language_model"):
        raise ValueError(
            f"model must be a Qwen2-VL, Qwen2.5-VL or Qwen3-VL model (model_type one of {tuple(MODEL_SCHEMES)}), "
            f"got {type(model).__name__} with model_type {model_type!r}"
        )
    return core, core.language_model


def current_rope(model: nn.Module) -> str:
    """The scheme :func:`use_rope` installed on ``model``, or ``"own"``."""
    core, _ = _parts(model)
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
    core, text = _parts(model)
    if scheme != "own" and scheme not in SCHEMES:
        raise ValueError(f"scheme must be 'own' or one of {tuple(SCHEMES)}, got {scheme!r}")
    options = RopeIndexOptions.from_config(  # checks advance, delta and temporal_scale
        core.config, None if scheme == "own" else scheme,
        delta=delta, temporal_scale=temporal_scale, training=training, advance=advance,
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
        own_interleaved = options.family == "qwen3"
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
    layout = "per_head" if per_head else options.family
    rotary = HFRotaryEmbedding(encoder, layout).to(text.embed_tokens.weight.device)
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
