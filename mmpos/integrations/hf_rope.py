"""Swap another multimodal rotary scheme into a Hugging Face Qwen2-VL-family model (or :data:`FAMILY_ROTARY`'s).

:func:`use_rope` ``(model, scheme)`` re-points, on that model *instance* only, the two
places where a Qwen2-VL / Qwen2.5-VL / Qwen3-VL (and Qwen3-VL-MoE) model decides positions:

* ``model.get_rope_index`` (the position ids of a prompt, and ``rope_deltas`` for
  decoding) becomes :func:`~mmpos.integrations.hf_rope_index.scheme_rope_index` run with
  ``scheme``'s :mod:`mmpos.schemes` rule and the installed release's conventions;
* the text model's ``rotary_emb`` (position ids -> ``cos``, ``sin``) becomes
  :class:`HFRotaryEmbedding`, the scheme's :class:`~mmpos.rotary.FrequencyPlan`.

Code paths are chosen by feature detection, never by version strings, and nothing
module-level is patched (a patched function silently stops working when it moves):

* the shape of the rotary output (``cos_sin_shape``) is read by calling the model's own ``rotary_emb`` once:
  ``(3, B, L, D)`` (transformers < 5.17 Qwen2/2.5-VL, whose attention picks a row per
  ``mrope_section``) or ``(B, L, D)`` (Qwen3-VL, and Qwen2/2.5-VL from 5.17 on, whose
  attention calls the plain ``apply_rotary_pos_emb``); mmpos returns the same shape with
  every row equal, so the model's attention code runs untouched;
* the RoPE config is read from ``rope_parameters`` (transformers 5) or ``rope_theta`` +
  ``rope_scaling`` (4.x);
* the position-id conventions (padding value, ``rope_deltas``) follow the installed
  ``get_rope_index`` (:func:`~mmpos.integrations.hf_rope_index.installed_rule`);
* MHRoPE's per-head plan cannot travel through ``cos``/``sin`` ``(B, L, D)``: the model gets
  the identity rotation (``cos = 1``, ``sin = 0``, exact) and forward hooks on each attention
  layer's ``q_norm``/``k_norm`` (Qwen3-VL: the rotation follows the per-head norm) or
  ``q_proj``/``k_proj`` (Qwen2/2.5-VL) rotate every head by the angles of its KV head.

Position ids keep the Hugging Face ``(3, B, L)`` shape, so ``generate`` works unchanged:
HoPE ids are float32, V2PE ids float64 (angles then in float64), and VRoPE's four
per-pair combinations travel as ``(c0, c1, c2)``: ``c3 = c1 + c2 - c0`` holds for every
VRoPE position (``i + j + (H-1-i) + (W-1-j) = i + (W-1-j) + (H-1-i) + j``; text has four
equal values), and :class:`HFRotaryEmbedding` rebuilds it (``Scheme.rows_to_axes``).

GLM-4V, GLM-4V-MoE and GLM-4.6V (:data:`FAMILY_ROTARY`) take Qwen3-VL's positions but rotate
the first ``partial_rotary_factor`` of each head with chunked M-RoPE sections, pairing adjacent
channels: the rotated width and ``cos`` layout are read by calling their rotary module once, every
scheme's plan spans that width, and their own scheme name ``"qwen3-vl"`` installs chunked ``mrope``.
PaddleOCR-VL (Qwen2-VL's rotation), Qwen3.5 / Qwen3.5-MoE (partial rotary, full-attention layers only)
and ERNIE-4.5-VL (VideoRoPE's allocation, adjacent pairs, ``mrope_section`` ordered h, w, t) are in the same table,
with Cosmos3-Omni (a Qwen3-VL text model) and Qwen4-Exp (Qwen3.5's rotation; its QSA indexer scores keys with the
same ``cos`` / ``sin``, so MHRoPE, which has no shared rotation, is refused there).

Cohere-Compass has one frequency set per layer type (``rope_parameters[layer_type]``: theta and interleaved
sections, ``None`` for a layer type without positions) and calls its rotary as ``rotary_emb(x, position_ids,
layer_type)``: it gets one :class:`HFRotaryEmbedding` per layer type (``_LayerTypeRotary``), each built from that
layer type's config and probed with it. HunYuan-VL's ids are ``(N, B, L)``, ``N = len(mrope_section)``: its own
rotation cuts the ``2 P`` channels of ``cos`` / ``sin`` into ``N`` chunks of ``2 * section[k]`` channels, chunk ``k``
reading row ``k`` (the two channels that ``rotate_half`` pairs may read different rows; ``per_channel``), and another
scheme's three rows go into the last three (``rows_to_axes`` ``(A, N)``). HunYuan-VL and HY-V4-VL (XD-RoPE: a newline
token ends every merged row) take their own positions from :mod:`~mmpos.integrations.hf_families`; another scheme
packs the same blocks, in tokens with the newline column, by its rule (HunYuan-VL's two boundary tokens as text).
``cos`` / ``sin`` take the dtype the model's own rotary returns (``x.dtype``; ERNIE-4.5-VL keeps float32).
GLM-Image's patched ``get_rope_index`` also writes its generated images' positions (``_cached_decode_position_ids``):
another scheme packs the prompt's source images and, after the prompt, the images it generates (their grids, then
the end token) as blocks by its rule (``hf_families.glm_image_blocks``). MiniCPM-V 4.7's reads ``target_sizes``:
another scheme places every crop (thumbnail, slice, video frame) as a block of its own grid, the markers as text
(``hf_families.minicpmv4_7_blocks``); the canvas (a thumbnail stretched over its slices) is its own rule only.

The Omni thinkers (Qwen2.5-Omni, Qwen3-Omni-MoE; ``*ThinkerForConditionalGeneration``) take their TMRoPE positions
from :mod:`mmpos.integrations.hf_omni` with the model's own arguments (audio included): the thinker and its inner
model both get the index (``generate`` calls the thinker's, ``forward`` the inner model's). Another scheme places
the same blocks (:func:`~mmpos.integrations.hf_omni.omni_layout` ``scheme=``; audio tokens advance as text), with
the Omni padding and ``rope_deltas`` conventions. On a full Omni model (``Qwen2_5OmniForConditionalGeneration``,
``Qwen3OmniMoeForConditionalGeneration``) the thinker and the talker take the same scheme: the talker has its own
``get_rope_index`` (the Omni rule over the thinker's token ids, read with the talker config's token ids) and rotary
module, both replaced (:data:`mmpos.integrations.hf_omni.TALKERS`); the vocoders (token2wav, code2wav) and Qwen3-Omni's
code predictor rotate 1-D positions of their own codec sequence and are not patched.

``use_rope(model, "own")`` restores the model's own modules. The scheme names of the
models themselves (``"qwen2-vl"``, ``"qwen2.5-vl"``, ``"qwen3-vl"``) install mmpos's
implementation of that scheme, which gives the same logits as the model's own (tests).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from .._arrays import ids_in_dtype
from .._validate import check_choice
from ..age import age_layers
from ..encoders.base import RotaryEncoder
from ..encoders.mrope import default_mrope_section
from ..encoders.registry import create, encoder_info, list_encoders
from ..layout import Layout, VisionBlocks, pack
from ..rotary import FrequencyPlan, apply_rotary, plan_angles, rope_frequencies
from ..scaling import RopeScaling, as_scaling
from ..schemes import (
    ADVANCES,
    RULES,
    SCHEMES,
    THW,
    Rule,
    Scheme,
    SchemeOptions,
    get_scheme,
    model_types,
    resolve_options,
    scheme_for_model_type,
)
from . import hf_omni
from ._hf_age import AGE_DECODINGS, AgeIndex, AgeRotary, caller_ids_hook, own_layer_hook, past_length_hook
from ._token_blocks import new_ids
from .hf_families import (
    glm_image_blocks,
    glm_image_decode_position_ids,
    minicpmv4_7_blocks,
    minicpmv4_7_rope_index,
    newline_blocks,
)
from .hf_rope_index import RopeIndexOptions, get_rope_index, installed_rule, scheme_rope_index

__all__ = [
    "CONFIG_KEY",
    "FAMILY_ROTARY",
    "HFRotaryEmbedding",
    "apply_config_rope",
    "current_rope",
    "from_pretrained",
    "use_rope",
]

#: the model-config attribute (a key of ``config.json``) where :func:`use_rope` writes the swapped
#: scheme and its arguments, so that ``save_pretrained`` keeps them and :func:`from_pretrained` restores them
CONFIG_KEY = "mmpos_rope"

_COS_SIN_SHAPES = ("rows", "flat")  # cos / sin (3, B, L, D) (Qwen2/2.5-VL before transformers 5.17), (B, L, D)


class HFRotaryEmbedding(nn.Module):
    """Drop-in for a Qwen-VL text rotary embedding computing the angles of an mmpos rotary
    encoder's plan.

    ``forward(x, position_ids)``: ``position_ids`` ``(R, B, L)`` (``R = 3``; HunYuan-VL's ``N``), or ``(B, L)``
    read as text -> ``(cos, sin)`` in ``x.dtype`` (``cos_dtype`` where the model's rotary keeps another: ERNIE-4.5-VL's
    float32), shaped as the model's attention consumes them
    (``cos_sin_shape``): ``"rows"`` ``(3, B, L, D)`` (three equal rows), ``"flat"`` ``(B, L, D)``.
    With ``per_head=True`` (MHRoPE) it returns the identity rotation in that shape and keeps the
    per-head ``cos``/``sin`` ``(B, Hkv, L, D/2)`` in :attr:`per_head_angles` for the
    projection hooks. Angles are float32, float64 for float64 ids. ``rows_to_axes``
    ``(A, R)``: how the scheme's ``axes`` are read from the ``R`` rows (the plan reads a subset). With
    ``per_channel=True`` the plan's "pairs" are the ``cos`` / ``sin`` channels themselves, not repeated
    (HunYuan-VL's own rotation, whose two halves read different rows).

    A scaled encoder (``scaling=``, :mod:`mmpos.scaling`) is carried whole: ``cos`` / ``sin`` are multiplied
    by its ``attention_factor`` (YaRN's ``mscale``, LongRoPE's factor), as Hugging Face multiplies them by
    ``attention_scaling``, and a dynamic rule (``dynamic``, ``longrope``, ``ref-shape``) rescales the plan at
    every call from the current length on the device (no host sync). The length of a ``"shared"`` spectrum
    (the M-RoPE family) is Hugging Face's ``max(position_ids) + 1`` over every row and axis; an ``"axis"``
    spectrum reads each axis's own. Unlike Hugging Face's ``dynamic``, which keeps the frequencies of the
    longest length seen until a call is shorter than ``L0``, the rule depends on the current call only
    (equal for a growing length: a fresh model, ``generate``).
    """

    def __init__(
        self,
        encoder: RotaryEncoder,
        cos_sin_shape: str,
        rows_to_axes: Any,
        axes: tuple[str, ...],
        per_head: bool = False,
        per_channel: bool = False,
        cos_dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        check_choice(cos_sin_shape, "cos_sin_shape", _COS_SIN_SHAPES)
        rows_to_axes = torch.as_tensor(rows_to_axes, dtype=torch.float32)  # (A, R) for the scheme's axes
        missing = [a for a in encoder.axes if a not in axes]
        if rows_to_axes.dim() != 2 or rows_to_axes.shape[0] != len(axes) or rows_to_axes.shape[1] < 1 or missing:
            raise ValueError(f"rows_to_axes must be ({len(axes)}, R) for axes {axes} covering {encoder.axes}")
        rows_to_axes = rows_to_axes[[axes.index(a) for a in encoder.axes]]  # (A_enc, R) the axes the plan reads
        self.rows = rows_to_axes.shape[1]  # R: the rows of the model's position ids (3; HunYuan-VL's N)
        self.encoder = encoder
        self.cos_sin_shape = cos_sin_shape
        self.per_head = per_head
        self.per_channel = per_channel
        self.cos_dtype = cos_dtype  # None: x.dtype (most families); ERNIE-4.5-VL's rotary returns float32
        self.per_head_angles: tuple[Tensor, Tensor] | None = None
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
        out_dtype = x.dtype if self.cos_dtype is None else self.cos_dtype
        if position_ids.dim() == 2:
            position_ids = position_ids.unsqueeze(0)
        if position_ids.dim() != 3 or position_ids.shape[0] not in (1, self.rows):
            raise ValueError(
                f"position_ids must be (B, L), (1, B, L) or ({self.rows}, B, L), got {tuple(position_ids.shape)}"
            )
        position_ids = position_ids.expand(self.rows, -1, -1)
        dtype = torch.float64 if position_ids.dtype == torch.float64 else torch.float32
        device_type = x.device.type if x.device.type != "mps" else "cpu"
        with torch.autocast(device_type=device_type, enabled=False):
            rows = position_ids.permute(1, 2, 0).to(dtype)  # (B, L, R)
            pos = (rows.unsqueeze(-2) * self.rows_to_axes.to(dtype)).sum(-1)  # (B, L, A)
            weight = self.encoder.weight
            if self.encoder.rescale is not None:  # a dynamic rule: the plan at the current length, on the device
                shared = self.encoder.scaling_spectrum == "shared"
                weight = self.encoder.rescale(weight, pos.amax(-1, keepdim=True).expand_as(pos) if shared else pos)
            angles = plan_angles(weight, pos, dtype)  # (B, L, P) or (B, Hkv, L, P)
            cos, sin = angles.cos(), angles.sin()
            if self.encoder.attention_factor != 1.0:  # YaRN / LongRoPE, as Hugging Face's attention_scaling
                cos, sin = cos * self.encoder.attention_factor, sin * self.encoder.attention_factor
        if self.per_head:
            self.per_head_angles = (cos.to(x.dtype), sin.to(x.dtype))
            b, _, n, p = cos.shape
            cos, sin = (
                torch.ones(b, n, 2 * p, dtype=out_dtype, device=x.device),
                torch.zeros(b, n, 2 * p, dtype=out_dtype, device=x.device),
            )
        elif self.per_channel:  # the plan's pairs are the channels of cos / sin (HunYuan-VL)
            cos, sin = cos.to(out_dtype), sin.to(out_dtype)
        else:
            cos, sin = torch.cat((cos, cos), -1).to(out_dtype), torch.cat((sin, sin), -1).to(out_dtype)
        if self.cos_sin_shape == "rows":
            cos, sin = cos.expand(3, *cos.shape), sin.expand(3, *sin.shape)
        return cos, sin


def _model_scaling(cfg: Any, layer_type: str | None = None) -> RopeScaling | None:
    """The scaling rule of a text config's own ``rope_parameters`` (transformers 5; of ``layer_type`` where the
    model has one set per layer type, Cohere-Compass) or ``rope_scaling`` (4.x), read by
    :meth:`RopeScaling.from_hf` against its ``max_position_embeddings``; ``None`` for ``default`` / ``mrope``."""
    params = getattr(cfg, "rope_parameters", None)
    if layer_type is not None:
        params = params[layer_type]
    elif not (isinstance(params, dict) and "rope_theta" in params):
        params = getattr(cfg, "rope_scaling", None) or {}
    return RopeScaling.from_hf(params, getattr(cfg, "max_position_embeddings", None))


def _scaling_entry(scaling: Any) -> tuple[Any] | None:
    """What :data:`CONFIG_KEY` records of ``use_rope``'s ``scaling`` (checked here): ``None`` for the default
    ``"own"``, else a 1-tuple of ``None`` or the rule's non-default arguments (JSON: tuples as lists)."""
    if isinstance(scaling, str):
        if scaling != "own":
            raise ValueError(
                f"scaling must be 'own', None, a RopeScaling or a mapping of its arguments, got {scaling!r}"
            )
        return None
    rule = as_scaling(scaling)  # TypeError / ValueError naming the bad argument
    if rule is None:
        return (None,)
    kept = {f.name: getattr(rule, f.name) for f in fields(rule) if getattr(rule, f.name) != f.default}
    return ({k: list(v) if isinstance(v, tuple) else v for k, v in kept.items()},)


def _rotate_heads_hook(rotary: HFRotaryEmbedding, head_dim: int, convention: str = "half"):
    """Forward hook rotating a ``(B, L, H * D)`` or ``(B, L, H, D)`` projection / norm output
    by the per-head angles the rotary module computed for this forward (the first ``2P`` channels
    of each head, paired per ``convention``: the model's own layout)."""

    def hook(module: nn.Module, args: Any, out: Tensor) -> Tensor:
        cos, sin = rotary.per_head_angles  # (B, Hkv, L, P)
        shape = out.shape
        heads = out.reshape(shape[0], shape[1], -1, head_dim).transpose(1, 2)  # (B, H, L, D)
        return apply_rotary(heads, cos, sin, convention).transpose(1, 2).reshape(shape)

    return hook


# ------------------------------------------------------------------------- position ids
class _BoundIndex:
    """A ``get_rope_index`` bound to a model instance: takes the model's own method's signature (``original``)."""

    def __init__(self, original: Any) -> None:
        self.signature = inspect.signature(original)

    def _arguments(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        """The call's arguments by name (transformers >= 5.3 collects the rest in ``**kwargs``: merged in)."""
        arguments = dict(self.signature.bind(*args, **kwargs).arguments)
        arguments.update(arguments.pop("kwargs", {}))
        return arguments


def _in_ids_dtype(lay: Layout, input_ids: Tensor) -> tuple[Tensor, Tensor]:
    """``(position_ids (3, B, L), rope_deltas (B, 1))`` of ``lay`` (VRoPE's rows ``c0, c1, c2``, ``Scheme.hf_rows``),
    integer ids in the dtype of ``input_ids`` (fractional schemes keep their float ids)."""
    ids, deltas = lay.hf_position_ids("3d"), lay.rope_deltas
    if not ids.dtype.is_floating_point:
        ids, deltas = ids_in_dtype(ids, deltas, input_ids.dtype)
    return ids, deltas


class _SchemeIndex(_BoundIndex):
    """Bound to a model instance as ``get_rope_index``; accepts the model's own signature."""

    def __init__(self, original: Any, options: RopeIndexOptions) -> None:
        super().__init__(original)
        self.options = options

    def __call__(self, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        get = self._arguments(args, kwargs).get
        return scheme_rope_index(
            self.options,
            get("input_ids"),
            get("image_grid_thw"),
            get("video_grid_thw"),
            get("attention_mask"),
            get("second_per_grid_ts"),
            get("mm_token_type_ids"),
        )


class _OmniIndex(_BoundIndex):
    """Bound to an Omni thinker (and its inner model) as ``get_rope_index``: the model's own arguments
    (``use_audio_in_video``, ``audio_seqlens``, ``second_per_grids``) to :func:`mmpos.integrations.hf_omni.get_rope_index`
    (the model's own scheme) or to :func:`~mmpos.integrations.hf_omni.omni_layout` under another scheme."""

    def __init__(self, original: Any, config: Any, scheme: str | None, scheme_options: dict[str, Any]) -> None:
        super().__init__(original)
        self.config, self.scheme, self.scheme_options = config, scheme, scheme_options

    def __call__(self, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        arguments = self._arguments(args, kwargs)
        names = ("image_grid_thw", "video_grid_thw", "attention_mask", "use_audio_in_video", "audio_seqlens")
        call = [arguments.get("input_ids"), *(arguments.get(n) for n in names), arguments.get("second_per_grids")]
        call[4] = bool(call[4])
        if self.scheme is None or (call[1] is None and call[2] is None):  # the own scheme; text: 1-D for all
            return hf_omni.get_rope_index(self.config, *call)
        return _in_ids_dtype(
            hf_omni.omni_layout(self.config, *call, scheme=self.scheme, **self.scheme_options), call[0]
        )


#: the families whose vision tokens end every merged row with a newline token (a grid ``(t, h / m, w / m + 1)`` of
#: tokens), positioned by :mod:`mmpos.integrations.hf_families` (another scheme: :func:`~.hf_families.newline_blocks`)
_NEWLINE_FAMILIES = ("hunyuan_vl", "hy_v4_vl")


class _FamilyIndex(_BoundIndex):
    """Bound to a HunYuan-VL / HY-V4-VL model as ``get_rope_index`` (the model's own signature): the model's own
    scheme from :func:`mmpos.integrations.hf_rope_index.get_rope_index` (:mod:`~mmpos.integrations.hf_families`);
    another scheme packs the same blocks (:func:`~mmpos.integrations.hf_families.newline_blocks`) by its rule, its
    ``Scheme.hf_rows`` in the last three of the model's ``rows`` rows (HunYuan-VL's leading ``N - 3`` rows repeat the
    first; no plan reads them)."""

    def __init__(self, original: Any, config: Any, options: SchemeOptions | None, scheme: str, rows: int) -> None:
        super().__init__(original)
        self.config, self.options, self.scheme, self.rows = config, options, scheme, rows

    def __call__(self, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        arguments = self._arguments(args, kwargs)
        input_ids = arguments["input_ids"]
        if self.options is None:  # the model's own scheme
            names = ("image_grid_thw", "video_grid_thw", "attention_mask")
            call = (arguments.get(n) for n in names)
            return get_rope_index(self.config, input_ids, *call, mm_token_type_ids=arguments.get("mm_token_type_ids"))
        names = ("image_grid_thw", "video_grid_thw", "attention_mask", "mm_token_type_ids")
        out = new_ids(input_ids, get_scheme(self.scheme))  # before any temporary (new_ids)
        real, blocks = newline_blocks(self.config, input_ids, *(arguments.get(n) for n in names))
        lay = pack(real, blocks, self.scheme, self.options, device=input_ids.device, out=out)
        ids, deltas = _in_ids_dtype(lay, input_ids)
        return torch.cat([ids[:1].expand(self.rows - 3, -1, -1), ids]), deltas  # (rows, B, L)


class _GlmImageIndex(_BoundIndex):
    """Bound to a GLM-Image model as ``get_rope_index``: the prompt's positions and, as the model's own method does,
    the positions of the images it generates written to ``_cached_decode_position_ids`` ``(B, 3, D)`` with
    ``_prefill_len``, which its decoding reads. The model's own scheme (``options`` ``None``):
    :func:`mmpos.integrations.hf_rope_index.get_rope_index` and ``hf_families.glm_image_decode_position_ids``.
    Another scheme packs, per sample, the prompt's source images, then its generated grids and their end token
    right after the prompt (``hf_families.glm_image_blocks``), in one batch ``(B, L + D)``: the generated image
    is a block placed by that scheme's rule where the prompt ends (the positions past a sample's own ``D`` repeat
    its last, as the model's own); ``rope_deltas`` 0, as the model's (its decoding reads the cached positions)."""

    def __init__(self, original: Any, core: nn.Module, scheme: str, options: SchemeOptions | None) -> None:
        super().__init__(original)
        self.core, self.scheme, self.options = core, scheme, options

    def __call__(self, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        arguments = self._arguments(args, kwargs)
        names = ("input_ids", "image_grid_thw", "images_per_sample", "attention_mask")
        input_ids, grids, per_sample, mask = (arguments.get(n) for n in names)
        config = self.core.config
        if self.options is None:  # the model's own scheme
            ids, deltas = get_rope_index(config, input_ids, grids, None, mask, images_per_sample=per_sample)
            if grids is not None:
                decode = glm_image_decode_position_ids(config, input_ids, grids, per_sample, mask)
            else:
                decode = None
        else:
            ids, decode = self._scheme_positions(input_ids, grids, per_sample, mask)
            deltas = torch.zeros(input_ids.shape[0], 1, dtype=input_ids.dtype, device=input_ids.device)
        self.core._cached_decode_position_ids = decode  # (B, 3, D): the generated images' positions
        self.core._prefill_len = input_ids.shape[1]
        return ids, deltas

    def _scheme_positions(self, input_ids: Tensor, grids: Tensor | None, per_sample: Any, mask: Tensor | None):
        """``(prompt ids (3, B, L), decode ids (B, 3, D) or None without grids)`` under ``self.scheme``."""
        real, prompt, generated, sample = glm_image_blocks(self.core.config, input_ids, grids, per_sample, mask)
        b, length = real.shape
        tokens = generated.prod(-1)  # (G,) h * w each
        per = np.bincount(sample, weights=tokens, minlength=b).astype(np.int64) + 1  # (B,) tokens + the end token
        width = int(per.max()) if grids is not None else 0  # D
        total = length + width
        n_dec = np.bincount(sample, minlength=b)  # (B,) generated grids per sample
        before = np.cumsum(tokens) - tokens - np.repeat(np.cumsum(per - 1) - (per - 1), n_dec)  # (G,) within D
        at = np.asarray(prompt.first)  # (K,) flat in (B, L)
        # flat indices in the (B, L + D) batch: the prompt's images, then the generated ones
        first = np.concatenate([at // length * total + at % length, sample * total + length + before])
        grid = np.concatenate([np.asarray(prompt.grid), generated]).astype(np.int64)
        first = first.astype(np.int64)
        k = grid.shape[0]
        both = np.concatenate([real, np.arange(width)[None, :] < per[:, None]], 1)  # (B, L + D), right padding
        blocks = VisionBlocks(grid, first, np.zeros(k, np.float32), np.ones(k, dtype=bool))
        lay = pack(both, blocks, self.scheme, self.options, device=input_ids.device)
        ids = lay.hf_position_ids("3d")  # (3, B, L + D): VRoPE's c0, c1, c2 (Scheme.hf_rows)
        if not ids.dtype.is_floating_point:
            ids = ids.to(input_ids.dtype)
        if grids is None:
            return ids[:, :, :length], None
        last = torch.from_numpy(per - 1).to(ids.device).view(1, b, 1).expand(ids.shape[0], -1, -1)
        decode = ids[:, :, length:]
        shorter = torch.from_numpy(both[:, length:]).to(ids.device)[None]
        decode = torch.where(shorter, decode, decode.gather(2, last))  # past a sample's D: its end token's
        return ids[:, :, :length], decode.permute(1, 0, 2).contiguous()


class _MiniCPMIndex(_BoundIndex):
    """Bound to a MiniCPM-V 4.7 model as ``get_rope_index``, with the model's own arguments (``target_sizes``,
    ``target_sizes_videos``, ``downsample_mode``). Its own scheme (``options`` ``None``): the canvas positions of
    :func:`mmpos.integrations.hf_families.minicpmv4_7_rope_index`. Another scheme places every crop (thumbnail,
    slice, video frame) as a vision block of its own grid, the markers and newlines as text
    (:func:`~mmpos.integrations.hf_families.minicpmv4_7_blocks`), by its rule."""

    def __init__(self, original: Any, config: Any, scheme: str, options: SchemeOptions | None) -> None:
        super().__init__(original)
        self.config, self.scheme, self.options = config, scheme, options

    def __call__(self, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        arguments = self._arguments(args, kwargs)
        names = ("mm_token_type_ids", "target_sizes", "target_sizes_videos", "downsample_mode", "attention_mask")
        input_ids = arguments["input_ids"]
        if self.options is None:
            return minicpmv4_7_rope_index(self.config, input_ids, *(arguments.get(n) for n in names))
        out = new_ids(input_ids, get_scheme(self.scheme))  # before any temporary (new_ids)
        real, blocks = minicpmv4_7_blocks(self.config, input_ids, *(arguments.get(n) for n in names))
        return _in_ids_dtype(pack(real, blocks, self.scheme, self.options, device=input_ids.device, out=out), input_ids)


#: the families whose prompts hf_families lays out its own way besides the newline ones (another scheme: their
#: blocks, :class:`_GlmImageIndex`, :class:`_MiniCPMIndex`)
_TOKEN_LAYOUT_FAMILIES = ("glm_image", "minicpmv4_7")


# ------------------------------------------------------------------------- use_rope
@dataclass
class _Installed:
    scheme: str
    rotary_emb: nn.Module
    hooks: list[Any] = field(default_factory=list)
    patched: list[nn.Module] = field(default_factory=list)  # the modules given a get_rope_index


#: families whose own rotary embedding is not their position scheme's ``Scheme.encoder``: model_type ->
#: (the mmpos encoder of the model's own rotation, how its attention pairs channels). GLM-4V: Qwen3-VL's
#: positions, chunked M-RoPE sections, adjacent channels paired (``rotate_half_llm``) on the first
#: ``partial_rotary_factor`` of each head (the rotated width is read from the model's rotary module).
FAMILY_ROTARY: dict[str, tuple[str, str]] = {
    "glm4v": ("mrope", "interleaved"),
    "glm4v_moe": ("mrope", "interleaved"),
    "glm46v": ("mrope", "interleaved"),
    "glm_ocr": ("mrope", "interleaved"),
    # PaddleOCR-VL: Qwen2-VL's positions and rotation (its scheme is qwen2-vl, whose record does not name it)
    "paddleocr_vl": ("mrope", "half"),
    # Qwen3.5: Qwen3-VL's cyclic sections on the first partial_rotary_factor of each head, in its
    # full-attention layers only (its linear-attention layers take no positions)
    "qwen3_5": ("mrope-i", "half"),
    "qwen3_5_moe": ("mrope-i", "half"),
    "cosmos3_edge": ("mrope-i", "half"),  # Qwen3-VL's rotation
    "cosmos3_omni": ("mrope-i", "half"),  # its text model is a Qwen3-VL text model
    # Qwen4-Exp: Qwen3.5's rotation in its indexed-attention layers; the rotary module returns cos / sin of the
    # whole sequence (the cache's position history and the new tokens: its QSA indexer scores every key)
    "qwen4_exp": ("mrope-i", "half"),
    # the Omni thinkers (TMRoPE positions, :mod:`mmpos.integrations.hf_omni`): Qwen2.5-Omni rotates as Qwen2-VL,
    # Qwen3-Omni as Qwen3-VL
    "qwen2_5_omni_thinker": ("mrope", "half"),
    "qwen3_omni_moe_thinker": ("mrope-i", "half"),
    # their talkers (the full Omni models' speech decoders): the same positions (their own get_rope_index, the
    # thinker's token ids with the talker config's) and the same rotation as their thinkers
    "qwen2_5_omni_talker": ("mrope", "half"),
    "qwen3_omni_moe_talker": ("mrope-i", "half"),
    # ERNIE-4.5-VL: Qwen2-VL's positions (t merged); h, w alternating on the high frequencies and t on the lowest
    # (VideoRoPE's allocation; its config's mrope_section is ordered h, w, t), adjacent channels paired
    "ernie4_5_vl_moe": ("videorope", "interleaved"),
    # Cohere-Compass: Qwen3-VL's positions and interleaved sections, one theta / mrope_section per layer type
    # (rope_parameters[layer_type]; a None entry is a layer type without positions)
    "cohere_compass": ("mrope-i", "half"),
    # HunYuan-VL: chunked sections over its N = len(mrope_section) rows, the leading N - 3 the 1-D position, the
    # last three (w, h, image) (Scheme.encoder_kwargs); HY-V4-VL: XD-RoPE positions, Qwen3-VL's interleaved rotation
    "hunyuan_vl": ("mrope", "half"),
    "hy_v4_vl": ("mrope-i", "half"),
    # GLM-Image: chunked sections on its partial rotary (its positions: _GlmImageIndex)
    "glm_image": ("mrope", "half"),
    # MiniCPM-V 4.7: a Qwen3.5 text backbone (interleaved sections, partial rotary); its positions: _MiniCPMIndex
    "minicpmv4_7": ("mrope-i", "half"),
}
#: the families whose own ``mrope_section`` cuts the ``2 P`` channels of ``cos`` / ``sin`` rather than the ``P`` pairs
#: (HunYuan-VL, :class:`_SectionsOverRows`)
_CHANNEL_SECTIONS = ("hunyuan_vl",)
#: the families whose rotary reads ``rope_type "dynamic"`` with an ``alpha`` as a fixed stretch of theta,
#: ``theta * alpha ** (d / (d - 2))`` (HunYuan-VL's ``compute_ntk_alpha_rope_parameters``), not as dynamic NTK
_NTK_ALPHA = ("hunyuan_vl",)
#: the order of a family's config ``mrope_section`` where it is not (t, h, w): the indices of t, h, w in it
_SECTION_ORDER: dict[str, tuple[int, int, int]] = {"ernie4_5_vl_moe": (2, 0, 1)}


def _swappable() -> list[str]:
    """The families whose rotary mmpos reproduces (``Scheme.rotary_model_types`` and :data:`FAMILY_ROTARY`)."""
    return [m for s in SCHEMES.values() for m in s.rotary_model_types] + list(FAMILY_ROTARY)


def _parts(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """``(core, text_model)``: the module holding ``get_rope_index`` and the text model."""
    core = model.model if hasattr(model, "model") and hasattr(model.model, "get_rope_index") else model
    model_type = _model_type(core)
    swappable = _swappable()
    if model_type not in swappable:
        raise ValueError(
            f"model must be a Qwen2-VL, Qwen2.5-VL, Qwen3-VL or GLM-4V model (model_type one of "
            f"{tuple(swappable)}), got {type(model).__name__} with model_type {model_type!r}"
        )
    text = getattr(core, "language_model", None)
    if text is None and hasattr(getattr(core, "model", None), "rotary_emb"):  # 4.57's Omni thinkers: .model is text
        text = core.model
    missing = [
        name
        for name, ok in (
            ("get_rope_index", hasattr(core, "get_rope_index")),
            ("language_model", text is not None),
            ("language_model.rotary_emb", hasattr(text, "rotary_emb")),
            ("language_model.embed_tokens", _embedding(text) is not None),  # Qwen3-Omni's talker: codec_embedding
            (
                "language_model.layers[i].self_attn",  # Qwen3.5: only its full-attention layers have one
                any(hasattr(layer, "self_attn") for layer in getattr(text, "layers", None) or ()),
            ),
        )
        if not ok
    ]
    if missing:
        raise ValueError(
            f"{type(model).__name__} (model_type {model_type!r}) has an unknown layout: not found {missing}; "
            "mmpos supports the Qwen-VL layouts of transformers 4.57 to 5.24"
        )
    return core, text


def _model_type(core: nn.Module) -> str | None:
    """``core.config.model_type``; for an Omni talker (:data:`mmpos.integrations.hf_omni.TALKERS`) its family's
    ``"<omni model_type>_talker"`` (:data:`FAMILY_ROTARY`), whatever its config's own (Qwen3-Omni's is empty)."""
    cfg = getattr(core, "config", None)
    talker = hf_omni.TALKERS.get(type(cfg).__name__)
    return f"{talker}_talker" if talker is not None else getattr(cfg, "model_type", None)


def _embedding(text: nn.Module) -> nn.Module | None:
    """The text model's token embedding (``embed_tokens``; Qwen3-Omni's talker: ``codec_embedding``)."""
    return getattr(text, "embed_tokens", None) or getattr(text, "codec_embedding", None)


def _device(text: nn.Module) -> torch.device:
    return _embedding(text).weight.device


def current_rope(model: nn.Module) -> str:
    """The scheme :func:`use_rope` installed on ``model`` (a full Omni model: on its thinker), or ``"own"``."""
    core, _ = _parts(model.thinker if _is_full_omni(model) else model)
    installed = core.__dict__.get("_mmpos_rope")
    return installed.scheme if installed is not None else "own"


def _restore(core: nn.Module, text: nn.Module) -> None:
    installed = core.__dict__.pop("_mmpos_rope", None)
    if installed is None:
        return
    device = _device(text)  # the model may have moved while swapped
    text.rotary_emb = installed.rotary_emb.to(device)
    for module in installed.patched:
        del module.get_rope_index  # the class method shows again
    for handle in installed.hooks:
        handle.remove()
    core.rope_deltas = None


def _rope_config(cfg: Any, layer_type: str | None = None) -> tuple[float, str, list[int] | None]:
    """``(theta, rope_type, mrope_section)`` of a text config: ``rope_parameters``
    (transformers 5; ``rope_parameters[layer_type]`` where the model has one set per layer type) or
    ``rope_theta`` + ``rope_scaling`` (4.x)."""
    params = getattr(cfg, "rope_parameters", None)
    if layer_type is not None:
        params = params[layer_type]  # a dict: _rotary_layer_types kept the layer types that have one
    if isinstance(params, dict) and "rope_theta" in params:
        theta, scaling = params["rope_theta"], params
    elif getattr(cfg, "rope_theta", None) is not None:
        theta, scaling = cfg.rope_theta, getattr(cfg, "rope_scaling", None) or {}
    else:
        raise ValueError(
            f"{type(cfg).__name__} has neither rope_parameters['rope_theta'] nor rope_theta: unknown config layout"
        )
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    section = scaling.get("mrope_section")
    return float(theta), rope_type, None if section is None else list(section)


def _rotary_cos_sin_shape(rotary: Any, rows: int, device: torch.device) -> str:
    """Call the model's own rotary module (``rotary(x, position_ids)``) once: ``"rows"`` for ``(3, B, L, D)``,
    ``"flat"`` for ``(B, L, D)``."""
    x = torch.zeros(1, dtype=torch.float32, device=device)
    with torch.no_grad():
        cos, _ = rotary(x, torch.zeros(rows, 1, 1, dtype=torch.long, device=device))
    if cos.dim() == 4 and cos.shape[0] == 3:
        return "rows"
    if cos.dim() == 3:
        return "flat"
    raise ValueError(f"{_name(rotary)} returns cos of shape {tuple(cos.shape)}: unknown cos / sin shape")


def _rotary_cos_dtype(rotary: Any, rows: int, device: torch.device) -> torch.dtype | None:
    """Call the model's own rotary module once with a bfloat16 ``x``: ``None`` where its ``cos`` / ``sin`` take
    ``x.dtype`` (most families), else the dtype they keep (ERNIE-4.5-VL's float32, which its attention reads)."""
    x = torch.zeros(1, dtype=torch.bfloat16, device=device)
    with torch.no_grad():
        cos, _ = rotary(x, torch.zeros(rows, 1, 1, dtype=torch.long, device=device))
    return None if cos.dtype == x.dtype else cos.dtype


def _name(rotary: Any) -> str:
    return type(getattr(rotary, "func", rotary)).__name__  # a module, or a partial of one (its layer type)


def _rotary_channels(rotary: Any, rows: int, device: torch.device) -> tuple[int, str]:
    """Call the model's own rotary module once at position 1 (``rows`` rows of ids): ``(rotary_dim, convention)``,
    the channels it rotates (fewer than ``head_dim`` under partial rotary, GLM-4V's half) and how its ``cos``
    pairs them: ``"half"`` (``c0 .. c{P-1}, c0 .. c{P-1}``, Qwen) or ``"interleaved"`` (``c0, c0, c1, c1, ..``,
    GLM-4V's ``rotate_half_llm`` from transformers 5; in 4.57 its attention interleaves a half layout itself)."""
    x = torch.zeros(1, dtype=torch.float32, device=device)
    with torch.no_grad():
        cos, _ = rotary(x, torch.ones(rows, 1, 1, dtype=torch.long, device=device))
    row = cos.reshape(-1, cos.shape[-1])[0]  # (rotary_dim,): pair 0 has frequency 1, pair 1 a lower one
    width = row.shape[0]
    if width >= 4 and row[0] == row[1] and row[0] != row[width // 2]:
        return width, "interleaved"
    if width >= 4 and row[0] == row[width // 2] and row[0] != row[1]:
        return width, "half"
    raise ValueError(f"{_name(rotary)} returns cos {row.tolist()}: unknown pair layout")


def _rotary_layer_types(rotary: nn.Module, cfg: Any) -> list[str] | None:
    """The layer types of a rotary module called as ``rotary(x, position_ids, layer_type)`` (Cohere-Compass: one
    theta / ``mrope_section`` per layer type in ``rope_parameters[layer_type]``), those that rotate (a ``None``
    entry is a layer type without positions, NoPE); ``None`` for a rotary without layer types."""
    if "layer_type" not in inspect.signature(rotary.forward).parameters:
        return None
    params, types = getattr(cfg, "rope_parameters", None), getattr(cfg, "layer_types", None)
    if (
        not isinstance(params, dict)
        or not types
        or any(not isinstance(params.get(t), (dict, type(None))) for t in types)
    ):
        raise ValueError(
            f"{type(rotary).__name__} takes a layer_type, but {type(cfg).__name__} has no rope_parameters per "
            f"config.layer_types (got layer_types {types!r}): unknown config layout"
        )
    return [t for t in dict.fromkeys(types) if params.get(t) is not None]


class _LayerTypeRotary(nn.Module):
    """Drop-in for a rotary module with one frequency set per layer type (Cohere-Compass):
    ``forward(x, position_ids, layer_type)`` -> the ``(cos, sin)`` of that layer type's
    :class:`HFRotaryEmbedding` (``per_type``)."""

    def __init__(self, per_type: Mapping[str, HFRotaryEmbedding]) -> None:
        super().__init__()
        self.per_type = nn.ModuleDict(per_type)

    def forward(self, x: Tensor, position_ids: Tensor, layer_type: str | None = None) -> tuple[Tensor, Tensor]:
        if layer_type not in self.per_type:
            raise ValueError(f"layer_type must be one of {tuple(self.per_type)}, got {layer_type!r}")
        return self.per_type[layer_type](x, position_ids)


class _InterleavedRotaryEmbedding(HFRotaryEmbedding):
    """:class:`HFRotaryEmbedding` for attention that pairs adjacent channels (GLM-4V's
    ``rotate_half_llm``): ``cos`` / ``sin`` ``(..., 2P)`` as ``c0, c0, c1, c1, ...``."""

    def forward(self, x: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        cos, sin = super().forward(x, position_ids)  # (..., 2P) as c0 .. c{P-1} twice
        p = cos.shape[-1] // 2
        return cos[..., :p].repeat_interleave(2, -1), sin[..., :p].repeat_interleave(2, -1)


def _axis_order(encoder: str) -> str:
    """The M-RoPE axis order of a registered encoder class (``MRoPE.axis_order``); ``"chunked"`` (HoPE's sections)."""
    return getattr(encoder_info(encoder).factory, "axis_order", "chunked")


def _hook_targets(attn: nn.Module) -> tuple[nn.Module, nn.Module]:
    for q, k in (("q_norm", "k_norm"), ("q_proj", "k_proj")):  # the rotation follows a per-head norm
        if isinstance(getattr(attn, q, None), nn.Module) and isinstance(getattr(attn, k, None), nn.Module):
            return getattr(attn, q), getattr(attn, k)
    raise ValueError(f"{type(attn).__name__} has neither q_norm/k_norm nor q_proj/k_proj: unknown attention layout")


class _SectionsOverRows(RotaryEncoder):
    """HunYuan-VL's own rotation (``HunYuanVLRotaryEmbedding.recomposition_frequencies``): the ``2 P`` channels of
    ``cos`` / ``sin`` (the spectrum twice) cut into ``N = len(mrope_section)`` chunks of ``2 * section[k]``
    channels, chunk ``k`` reading row ``k``; the two channels ``c`` and ``c + P`` that ``rotate_half`` pairs may
    read different rows. The plan's ``(N, 2 P)`` weight is per channel (:class:`HFRotaryEmbedding`
    ``per_channel``)."""

    def __init__(self, rotary_dim: int, mrope_section: list[int], axes: tuple[str, ...], theta: float) -> None:
        pairs = rotary_dim // 2
        if len(mrope_section) != len(axes) or sum(mrope_section) != pairs:
            raise ValueError(f"mrope_section must hold {len(axes)} counts summing to {pairs}, got {mrope_section}")
        index = torch.repeat_interleave(torch.arange(len(axes)), 2 * torch.tensor(mrope_section))  # (2P,) channel row
        freq = rope_frequencies(pairs, theta).repeat(2)  # (2P,) the spectrum on both halves
        super().__init__(FrequencyPlan.from_assignment(index, freq, axes, 2 * rotary_dim))


@dataclass
class _RotaryBuilder:
    """Builds the :class:`HFRotaryEmbedding` that replaces a model's rotary module (one per layer type where the
    model has several): the plan of ``encoder`` over the channels the model rotates, its theta, sections and
    scaling read from the config (of that layer type)."""

    cfg: Any
    model_type: str
    scheme: Scheme
    own: Scheme  # the model's own scheme (its position rule)
    encoder: str
    own_encoder: str
    own_rotation: bool
    mrope_section: list[int] | None
    head_sections: list[int] | None
    scaling: Any
    device: torch.device
    encoder_options: Mapping[str, Any] = field(default_factory=dict)  # use_rope's, for mmpos.create

    def __call__(self, probe: Any, layer_type: str | None = None) -> HFRotaryEmbedding:
        cfg, name = self.cfg, self.encoder
        theta, _, own_section = _rope_config(cfg, layer_type)
        params = getattr(cfg, "rope_parameters", None) or {}
        ntk = self.model_type in _NTK_ALPHA and params.get("rope_type") == "dynamic"
        alpha = params.get("alpha") if ntk else None
        if isinstance(self.scaling, str) and alpha:  # HunYuan-VL's "dynamic" with a fixed alpha: theta stretched
            theta, scaling = theta * alpha ** (cfg.head_dim / (cfg.head_dim - 2)), None
        elif isinstance(self.scaling, str):  # "own": the model's
            scaling = _model_scaling(cfg, layer_type)
        else:
            scaling = as_scaling(self.scaling)
        # the rows of the model's position ids: one per mrope_section entry (HunYuan-VL's N >= 3), else 3
        rows = len(own_section) if own_section is not None and len(own_section) > 3 else 3
        rotary_dim, convention = _rotary_channels(probe, rows, self.device)  # partial rotary: the plan spans it
        kwargs: dict[str, Any] = {"head_dim": rotary_dim, "theta": theta, **self.scheme.encoder_kwargs}
        axes, rows_to_axes = self.scheme.axes, [[0] * (rows - 3) + list(r) for r in self.scheme.rows_to_axes]
        if self.own_rotation and self.model_type in _CHANNEL_SECTIONS:  # HunYuan-VL: its sections cut the channels
            # the leading N - 3 rows are axes of their own (the 1-D position), the last three the scheme's
            axes = tuple(f"seq{k}" for k in range(rows - 3)) + tuple(self.own.encoder_kwargs.get("axes", THW))
            if scaling is not None:
                raise ValueError(
                    f"scaling must be None on model_type {self.model_type!r}'s own rotation (its sections give the "
                    f"two channels of a rotary pair different rows), got {scaling!r}"
                )
            encoder = _SectionsOverRows(rotary_dim, own_section, axes, theta)
            shape = _rotary_cos_sin_shape(probe, rows, self.device)
            cos_dtype = _rotary_cos_dtype(probe, rows, self.device)
            rotary = HFRotaryEmbedding(encoder, shape, torch.eye(rows), axes, per_channel=True, cos_dtype=cos_dtype)
            return rotary.to(self.device)
        if encoder_info(name).mrope_section:  # the record says it takes mrope_section
            own_order, wants_order = _axis_order(self.own_encoder), _axis_order(name)
            section = self.mrope_section
            order = _SECTION_ORDER.get(self.model_type)
            if order is not None and own_section is not None:  # the config's sections as (t, h, w), its own encoder
                own_section = [own_section[i] for i in order] if name == self.own_encoder else None
            if own_section is not None and len(own_section) != len(axes):  # N sections read the own plan only
                own_section = None
            if section is None and own_order == wants_order and own_section is not None:
                section = own_section
            kwargs["mrope_section"] = section if section is not None else default_mrope_section(rotary_dim, wants_order)
        if name == "mhrope":
            kwargs.update(
                num_heads=cfg.num_attention_heads,
                num_kv_heads=cfg.num_key_value_heads,
                head_sections=self.head_sections,
            )
        clash = sorted(set(self.encoder_options) & {*kwargs, "dim", "num_heads", "head_dim", "scaling"})
        if clash:
            raise ValueError(f"encoder_options must not set {clash}: use_rope reads them from the model")
        kwargs.update(self.encoder_options)
        encoder = create(name, **kwargs, **({} if scaling is None else {"scaling": scaling}))
        per_head = encoder.weight.dim() == 3
        cos_sin_shape = _rotary_cos_sin_shape(probe, rows, self.device)
        rotary_cls = _InterleavedRotaryEmbedding if convention == "interleaved" else HFRotaryEmbedding
        cos_dtype = _rotary_cos_dtype(probe, rows, self.device)
        return rotary_cls(encoder, cos_sin_shape, rows_to_axes, axes, per_head, cos_dtype=cos_dtype).to(self.device)


def use_rope(
    model: nn.Module,
    scheme: str,
    *,
    mrope_section: list[int] | None = None,
    head_sections: list[int] | None = None,
    delta: float | None = None,
    temporal_scale: float | None = None,
    training: bool = False,
    advance: str | None = None,
    visual_stride: float | None = None,
    scaling: RopeScaling | Mapping[str, Any] | str | None = "own",
    encoder_options: Mapping[str, Any] | None = None,
    age: str | list[bool] | None = None,
    age_decoding: str = "per-layer",
    **scheme_options: Any,
) -> nn.Module:
    """Make a Qwen2-VL / Qwen2.5-VL / Qwen3-VL / GLM-4V (or :data:`FAMILY_ROTARY`) model use ``scheme``
    (in place; returns it).

    Args:
        model: ``Qwen2VLForConditionalGeneration`` / ``Qwen2VLModel`` (and the 2.5 / 3 / 3-MoE classes), a
            :data:`FAMILY_ROTARY` family's model, or an Omni thinker (``Qwen2_5OmniThinkerForConditionalGeneration``,
            ``Qwen3OmniMoeThinkerForConditionalGeneration``; ``advance`` does not apply there), or a full Omni model
            (``Qwen2_5OmniForConditionalGeneration``, ``Qwen3OmniMoeForConditionalGeneration``: its thinker and
            talker take ``scheme``; if either refuses it, both are restored to their own and the error is raised).
        scheme: ``"own"`` (restore the model's modules), one of :data:`SCHEMES`: ``"mrope-i"``,
            ``"mhrope"``, ``"vrope"``, ``"hope"``, ``"v2pe"``, ``"flat"``, or a model's own scheme
            name (``"qwen2-vl"``, ``"qwen2.5-vl"``, ``"qwen3-vl"``) implemented by mmpos.
        mrope_section: rotary pairs per (t, h, w) for ``qwen*-vl``, ``mrope-i``, ``hope``
            (default: the model's ``mrope_section`` where it has that kind, else
            :func:`~mmpos.encoders.mrope.default_mrope_section`).
        head_sections: KV heads per (t, h, w) for ``mhrope`` (default: ``[H/4, 3H/8, 3H/8]``).
        delta: V2PE visual step in (0, 1] (required for ``v2pe`` unless ``training``).
        temporal_scale: HoPE temporal scale (required for ``hope`` unless ``training``), or the
            integer MRoPE-I temporal stride.
        training: draw V2PE's delta / HoPE's scale per vision block, as in their training.
        advance: ``"max"`` or ``"spatial"`` (:mod:`mmpos.schemes`); default: for the model's own
            scheme names the installed release's rule (``max`` before transformers 5.3, ``spatial``
            from 5.3 on), for the other schemes ``max`` (their reference rule). The padding and
            ``rope_deltas`` conventions always follow the installed release.
        visual_stride: V2PE's block-span form instead of ``delta`` (the position span of one
            vision block, divided by its token count).
        scheme_options: the scheme's own options (names in its ``Scheme.options``), e.g.
            ``circlerope``'s ``radius``, ``alpha``, ``move_to_origin``, ``move_to_positive``,
            ``dff_rate``, ``method`` (:func:`mmpos.schemes.resolve_options`).
        scaling: the length-scaling rule of the installed plan (:mod:`mmpos.scaling`): ``"own"`` (default) the
            model's own ``rope_scaling`` / ``rope_parameters`` (``yarn``, ``dynamic``, ``linear``, ``llama3``,
            ``longrope``: :meth:`~mmpos.scaling.RopeScaling.from_hf`; none for ``default`` / ``mrope``), applied
            to whichever scheme is installed; ``None`` no scaling; or a :class:`~mmpos.scaling.RopeScaling` (or a
            mapping of its arguments) for the installed scheme. The attention factor and dynamic rules travel
            with it (:class:`HFRotaryEmbedding`).
        encoder_options: more arguments of the scheme's rotary encoder (``mmpos.create``), beyond those ``use_rope``
            reads from the model (``head_dim``, ``theta``, ``mrope_section``, ``scaling``, ...), e.g.
            ``{"log_freq_scale": 2.0}`` for ``grape`` / ``grape-i``; recorded in the config with the others.
        age: CircleRoPE's AGE with ``scheme="circlerope"`` (:mod:`mmpos.age`): a strategy of
            :data:`~mmpos.age.AGE_STRATEGIES` or one bool per decoder layer; the layers it marks read the
            Circle-RoPE positions, the others the model's own (its scheme through mmpos, with the installed
            release's rule), both rotated by the installed plan (:mod:`mmpos.integrations._hf_age`). Qwen-VL
            layouts only (not the Omni, HunYuan / HY-V4, GLM-Image, MiniCPM-V or Cohere-Compass models).
        age_decoding: under ``age``, the positions of the tokens decoded after the prompt: ``"per-layer"``
            (default; each layer keeps its layout, so a cached ``generate`` equals a full forward) or
            ``"reference"`` (every layer reads their Circle-RoPE positions, as the reference's decoding steps).

    Returns:
        ``model``, whose ``rope_deltas`` cache is cleared. The scheme and the arguments given are
        written into ``model.config`` under :data:`CONFIG_KEY` (``"own"`` removes the entry), so
        ``save_pretrained`` stores them in ``config.json`` and :func:`from_pretrained` restores
        the swap.
    """
    if encoder_options is not None and not isinstance(encoder_options, Mapping):
        raise TypeError(f"encoder_options must be a mapping of encoder argument -> value, got {encoder_options!r}")
    if _is_full_omni(model):  # thinker and talker, the same scheme
        arguments = {
            "mrope_section": mrope_section,
            "head_sections": head_sections,
            "delta": delta,
            "temporal_scale": temporal_scale,
            "training": training,
            "advance": advance,
            "visual_stride": visual_stride,
            "scaling": scaling,
            "encoder_options": encoder_options,
            "age": age,
            "age_decoding": age_decoding,
            **scheme_options,
        }
        return _use_rope_full_omni(model, scheme, arguments)
    given = {
        "mrope_section": None if mrope_section is None else list(mrope_section),
        "head_sections": None if head_sections is None else list(head_sections),
        "delta": delta,
        "temporal_scale": temporal_scale,
        "training": training or None,
        "advance": advance,
        "visual_stride": visual_stride,
        "encoder_options": None if encoder_options is None else dict(encoder_options),
        "age": age if age is None or isinstance(age, str) else list(age),
        "age_decoding": None if age_decoding == "per-layer" else age_decoding,
        **scheme_options,
    }
    scaling_entry = _scaling_entry(scaling)  # checks scaling; None where it is the default "own"
    core, text = _parts(model)
    model_type = _model_type(core)
    if scheme != "own" and scheme not in SCHEMES:
        info = {i.name: i for i in list_encoders()}.get(scheme)
        if info is not None and info.kind == "rotary" and not info.shared:  # grape-learned, rope-mixed
            raise ValueError(
                f"scheme {scheme!r} is a rotary encoder with learned parameters in every layer, which use_rope cannot "
                "install: a Hugging Face attention takes the (cos, sin) of channel pairs from the model's one "
                "rotary_emb, and its planes would be parameters the model class does not have (save_pretrained / "
                "from_pretrained would not restore them); use it in mmpos.nn.Transformer, or a scheme with a fixed "
                "plan (e.g. 'grape')"
            )
        raise ValueError(f"scheme must be 'own' or one of {tuple(SCHEMES)}, got {scheme!r}")
    if advance is not None and advance not in ADVANCES:
        raise ValueError(f"advance must be None or one of {ADVANCES}, got {advance!r}")
    own_scheme = scheme_for_model_type(hf_omni.omni_model_type(core.config) or model_type)
    check_choice(age_decoding, "age_decoding", AGE_DECODINGS)
    if age is None and age_decoding != "per-layer":
        raise ValueError(f"age_decoding applies with age (CircleRoPE's AGE), got age_decoding={age_decoding!r}")
    if age is not None:  # CircleRoPE's AGE: two layouts of the prompt through the Qwen-VL get_rope_index
        if scheme != "circlerope":
            raise ValueError(f"age (CircleRoPE's AGE) applies to scheme='circlerope', got scheme={scheme!r}")
        layer_typed = "layer_type" in inspect.signature(text.rotary_emb.forward).parameters
        if own_scheme.audio or model_type in (*_TOKEN_LAYOUT_FAMILIES, *_NEWLINE_FAMILIES) or layer_typed:
            raise ValueError(
                f"age needs the Qwen-VL get_rope_index and one rotary module for every layer, not model_type "
                f"{model_type!r}'s layout"
            )
        age_flags = age_layers(age, len(text.layers))  # checks the strategy against the decoder's depth
    if own_scheme.audio:  # an Omni thinker: TMRoPE positions (hf_omni), the audio blocks' conventions
        if advance is not None:
            raise ValueError(f"advance applies to the Qwen-VL families, not model_type {model_type!r}")
        names = ("delta", "temporal_scale", "training", "visual_stride")
        omni_options = {k: given[k] for k in names if given[k] is not None}
        if scheme not in ("own", own_scheme.name):  # checks the options now (the index resolves them per call)
            resolve_options(scheme, rule=RULES[own_scheme.name], **omni_options, **scheme_options)
        omni_options.update(scheme_options)
        model_scheme = own_scheme.name
    else:
        base = RULES[installed_rule(core)]
        if advance is None:  # the model's own scheme follows the release; the others their reference ("max")
            advance = base.advance if scheme in ("own", *model_types().values()) else "max"
        rule = (
            base
            if advance == base.advance
            else Rule(f"{base.name}+{advance}", advance, base.seconds, base.padding_value, base.deltas)
        )
        if model_type in (*_TOKEN_LAYOUT_FAMILIES, *_NEWLINE_FAMILIES):  # their own token layout (hf_families)
            model_scheme = own_scheme.name
            own_layout = scheme in ("own", model_scheme)  # hf_families' one rule: no advance to choose
            if own_layout and given["advance"] is not None:
                raise ValueError(
                    f"advance applies to another scheme's blocks, not to model_type {model_type!r}'s own "
                    f"scheme {model_scheme!r} (one rule), got advance={given['advance']!r}"
                )
            checked = resolve_options(  # checks delta, temporal_scale and the scheme's options (own ones too)
                model_scheme if scheme == "own" else scheme,
                delta=delta,
                temporal_scale=temporal_scale,
                training=training,
                rule=rule,
                visual_stride=visual_stride,
                **scheme_options,
            )
            family_options = None if own_layout else checked
        else:
            options = RopeIndexOptions.from_config(  # checks delta and temporal_scale
                core.config,
                None if scheme == "own" else scheme,
                delta=delta,
                temporal_scale=temporal_scale,
                training=training,
                rule=rule,
                visual_stride=visual_stride,
                scheme_options=scheme_options or None,
            )
            model_scheme = options.model_scheme
            if age is not None:  # AGE's other layers: the model's own scheme (advance= where given)
                own_rule = base if given["advance"] is None else rule
                own_options = RopeIndexOptions.from_config(core.config, None, rule=own_rule)
    if scheme != "own" and get_scheme(scheme).encoder == "mhrope":
        indexed = [
            type(layer.self_attn).__name__
            for layer in text.layers
            if hasattr(getattr(layer, "self_attn", None), "indexer")
        ]
        if indexed:  # Qwen4-Exp: the indexer rotates its own keys by the shared cos / sin, no per-head angles
            raise ValueError(
                f"scheme 'mhrope' cannot reach {indexed[0]}: its token indexer rotates keys by the shared cos / sin "
                "(a per-head rotation has none); use a scheme with one rotation for every head"
            )
    _restore(core, text)
    if scheme == "own":
        if hasattr(core.config, CONFIG_KEY):
            delattr(core.config, CONFIG_KEY)
        return model

    cfg = getattr(core.config, "text_config", core.config)
    attention = [(i, layer.self_attn) for i, layer in enumerate(text.layers) if hasattr(layer, "self_attn")]
    family_encoder, pairing = FAMILY_ROTARY.get(model_type, (None, "half"))
    own_encoder = family_encoder or get_scheme(model_scheme).encoder
    own_rotation = scheme == model_scheme  # the model's own scheme name: its own rotation, through mmpos
    build = _RotaryBuilder(
        cfg=cfg,
        model_type=model_type,
        scheme=get_scheme(scheme),
        own=get_scheme(model_scheme),
        encoder=own_encoder if family_encoder and own_rotation else get_scheme(scheme).encoder,
        own_encoder=own_encoder,
        own_rotation=own_rotation,
        mrope_section=mrope_section,
        head_sections=head_sections,
        scaling=scaling,
        device=_device(text),
        encoder_options=dict(encoder_options or {}),
    )
    layer_types = _rotary_layer_types(text.rotary_emb, cfg)
    if layer_types is None:
        rotary = build(text.rotary_emb)
        per_layer = [rotary] * len(attention)
    else:  # Cohere-Compass: a plan per layer type, from that layer type's theta and sections
        per_type = {t: build(functools.partial(text.rotary_emb, layer_type=t), t) for t in layer_types}
        rotary = _LayerTypeRotary(per_type)
        per_layer = [per_type.get(cfg.layer_types[i]) for i, _ in attention]  # None: a layer type without RoPE
    if hasattr(text.rotary_emb, "mrope_section"):  # HunYuan-VL's text model reads its row count there
        rotary.mrope_section = text.rotary_emb.mrope_section
    targets = [(*_hook_targets(attn), r) for (_, attn), r in zip(attention, per_layer) if r is not None and r.per_head]
    head_dim = getattr(attention[0][1], "head_dim", None)  # the hooks cut each projection into heads of head_dim
    if targets and not isinstance(head_dim, int):
        raise ValueError(f"{type(attention[0][1]).__name__} has no int head_dim: unknown attention layout")
    installed = _Installed(scheme, text.rotary_emb)
    if own_scheme.audio:  # the thinker's generate calls its own get_rope_index, its forward the inner model's
        thinker = getattr(core.config, "thinker_config", core.config)
        index_scheme = None if scheme == model_scheme else scheme
        for module in dict.fromkeys(m for m in (model, core) if hasattr(type(m), "get_rope_index")):
            original = type(module).get_rope_index.__get__(module)
            module.get_rope_index = _OmniIndex(original, thinker, index_scheme, omni_options)
            installed.patched.append(module)
    elif model_type == "glm_image":
        core.get_rope_index = _GlmImageIndex(type(core).get_rope_index.__get__(core), core, scheme, family_options)
        installed.patched.append(core)
    elif model_type == "minicpmv4_7":
        original = type(core).get_rope_index.__get__(core)
        core.get_rope_index = _MiniCPMIndex(original, core.config, scheme, family_options)
        installed.patched.append(core)
    elif model_type in _NEWLINE_FAMILIES:
        original = type(core).get_rope_index.__get__(core)
        core.get_rope_index = _FamilyIndex(original, core.config, family_options, scheme, rotary.rows)
        installed.patched.append(core)
    else:
        original = type(core).get_rope_index.__get__(core)
        core.get_rope_index = _SchemeIndex(original, options)
        if age is not None:  # Circle-RoPE ids for the model, the own layout's for the layers age_flags leaves out
            rotary = AgeRotary(rotary, age_flags, age_decoding)
            core.get_rope_index = AgeIndex(core.get_rope_index, _SchemeIndex(original, own_options), rotary)
            installed.hooks.append(text.register_forward_pre_hook(past_length_hook(rotary), with_kwargs=True))
            caller = caller_ids_hook(rotary, core.forward)
            installed.hooks.append(core.register_forward_pre_hook(caller, with_kwargs=True))
            for layer, circle in zip(text.layers, age_flags):
                if not circle:
                    installed.hooks.append(layer.register_forward_pre_hook(own_layer_hook(rotary), with_kwargs=True))
        installed.patched.append(core)
    text.rotary_emb = rotary
    for q_module, k_module, layer_rotary in targets:
        for module in (q_module, k_module):
            hook = _rotate_heads_hook(layer_rotary, head_dim, pairing)  # the attention's pairing (cos may be re-laid)
            installed.hooks.append(module.register_forward_hook(hook))
    core.__dict__["_mmpos_rope"] = installed
    core.rope_deltas = None
    entry = {"scheme": scheme, **{k: v for k, v in given.items() if v is not None}}
    setattr(core.config, CONFIG_KEY, entry if scaling_entry is None else {**entry, "scaling": scaling_entry[0]})
    return model


#: the full Omni models (thinker, talker and the speech vocoder): model_type -> the vocoder's attribute
_FULL_OMNI = {"qwen2_5_omni": "token2wav", "qwen3_omni_moe": "code2wav"}


def _is_full_omni(model: nn.Module) -> bool:
    """A full Omni model (``Qwen2_5OmniForConditionalGeneration``, ``Qwen3OmniMoeForConditionalGeneration``): a
    ``thinker`` module, and a ``talker`` unless the audio output is disabled."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    return model_type in _FULL_OMNI and isinstance(getattr(model, "thinker", None), nn.Module)


def _use_rope_full_omni(model: nn.Module, scheme: str, arguments: dict[str, Any]) -> nn.Module:
    """:func:`use_rope` on a full Omni model: the thinker and the talker (when present) get the same scheme.

    The talker has its own ``get_rope_index`` (the Omni rule over the thinker's token ids -- Qwen2.5-Omni: the
    prompt, the speaker's start token and the first reply token; Qwen3-Omni: the user turns and the assistant
    turn -- read with the talker config's token ids) and its own rotary module: both are replaced, as the
    thinker's, so that the talker's positions come from the same scheme. The vocoder (Qwen2.5-Omni's
    ``token2wav``: a DiT over mel frames and BigVGAN; Qwen3-Omni's ``code2wav`` and the talker's code predictor)
    rotates 1-D positions over its own codec / mel sequence, which no multimodal scheme defines: it is not patched.
    If either part refuses the scheme, both are restored to their own and the error is raised."""
    parts = [model.thinker] + ([model.talker] if isinstance(getattr(model, "talker", None), nn.Module) else [])
    done = []
    try:
        for part in parts:
            use_rope(part, scheme, **arguments)
            done.append(part)
    except (ValueError, TypeError):
        for part in done:
            use_rope(part, "own")
        raise
    entry = getattr(_parts(model.thinker)[0].config, CONFIG_KEY, None)
    if entry is None:
        if hasattr(model.config, CONFIG_KEY):
            delattr(model.config, CONFIG_KEY)
    else:
        setattr(model.config, CONFIG_KEY, entry)
    return model


def apply_config_rope(model: nn.Module) -> nn.Module:
    """Install the scheme recorded under :data:`CONFIG_KEY` in ``model.config`` (what
    :func:`use_rope` wrote before ``save_pretrained``); a model without the entry is returned as is.

    A full Omni model: each part (thinker, talker) takes the entry of its own config, which records what it ran
    (:func:`use_rope` on the full model writes the same entry into both parts' configs and the top-level one, on
    one part into that part's only); the top-level entry goes on both parts where neither part's config has one."""
    if _is_full_omni(model):
        parts = [model.thinker] + ([model.talker] if isinstance(getattr(model, "talker", None), nn.Module) else [])
        if any(hasattr(_parts(part)[0].config, CONFIG_KEY) for part in parts):
            for part in parts:
                apply_config_rope(part)
            return model
    core = model if _is_full_omni(model) else _parts(model)[0]
    spec = getattr(core.config, CONFIG_KEY, None)
    if spec is None:
        return model
    if not isinstance(spec, dict) or not isinstance(spec.get("scheme"), str):
        raise TypeError(f"config.{CONFIG_KEY} must be a dict with a 'scheme' name (written by use_rope), got {spec!r}")
    options = {k: v for k, v in spec.items() if k != "scheme"}
    return use_rope(model, spec["scheme"], **options)


def from_pretrained(model_class: Any, pretrained_model_name_or_path: Any, *args: Any, **kwargs: Any) -> nn.Module:
    """``model_class.from_pretrained(...)``, then the swapped scheme its config records
    (:func:`apply_config_rope`): a model saved after :func:`use_rope` comes back with the same
    rotary scheme (logits equal). ``model_class``: e.g. ``Qwen2VLForConditionalGeneration``."""
    if not hasattr(model_class, "from_pretrained"):
        raise TypeError(f"model_class must be a transformers model class, got {model_class!r}")
    return apply_config_rope(model_class.from_pretrained(pretrained_model_name_or_path, *args, **kwargs))
