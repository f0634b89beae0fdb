"""Qwen2-VL / Qwen2.5-VL / Qwen3-VL ``get_rope_index``, vectorised over the batch.

Reference: Hugging Face transformers 4.57.1, ``Qwen2VLModel.get_rope_index``
(``models/qwen2_vl/modeling_qwen2_vl.py``), ``Qwen2_5_VLModel.get_rope_index``
(``models/qwen2_5_vl/modeling_qwen2_5_vl.py``) and ``Qwen3VLModel.get_rope_index``
(``models/qwen3_vl/modeling_qwen3_vl.py``); tests compare against them directly.
Papers: Wang et al., "Qwen2-VL", https://arxiv.org/abs/2409.12191; Bai et al.,
"Qwen2.5-VL Technical Report", https://arxiv.org/abs/2502.13923.

The reference walks every sample and every vision block in Python (``.tolist()``,
``.item()``, ``list.index``). Here the vision tokens of the whole batch are assigned to
their blocks with one ``nonzero`` per modality and the positions come from
:func:`mmpos.layout.token_positions` (one ``cumsum`` along the sequence), so the work is
a handful of tensor operations whatever the batch holds.

One core, :func:`scheme_rope_index`, serves both uses: :func:`get_rope_index` runs it with
the config's own scheme, and the ``get_rope_index`` that
:func:`mmpos.integrations.hf_rope.use_rope` installs runs it with the swapped scheme.

Two deliberate differences from transformers, both documented in ``docs/layouts.md``:

* ``advance``: ``"max"`` (default) continues the text after a vision block at the block's
  maximum over t, h and w plus one -- the rule the Qwen checkpoints were trained with and
  transformers <= 5.2 implements. transformers >= 5.3 moves the text after a block by
  ``max(h, w)`` only (for a video the temporal extent is ignored; huggingface/transformers
  #45381); ``advance="spatial"`` reproduces that.
* Qwen2.5-VL time index: ``floor(t * second_per_grid * tokens_per_second)``, multiplied
  first. transformers 4.57.1 casts ``second_per_grid_ts`` to an integer *before* the
  product (0.5 s becomes 0; fixed by huggingface/transformers #48669); the results agree
  whenever ``second_per_grid_ts`` holds whole seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..layout import ADVANCES, HOPE_SCALES, SCHEMES, V2PE_DELTAS, VisionBlocks, token_positions

__all__ = ["MODEL_SCHEMES", "RopeIndexOptions", "get_rope_index", "scheme_for_config", "scheme_rope_index"]

#: ``config.model_type`` -> the model's own :mod:`mmpos.layout` scheme
MODEL_SCHEMES = {
    "qwen2_vl": "qwen2-vl",
    "qwen2_5_vl": "qwen2.5-vl",
    "qwen3_vl": "qwen3-vl",
    "qwen3_vl_moe": "qwen3-vl",
}


def scheme_for_config(config: Any) -> str:
    """The :mod:`mmpos.layout` scheme of a Qwen-VL config (by ``config.model_type``)."""
    model_type = getattr(config, "model_type", None)
    if model_type not in MODEL_SCHEMES:
        raise ValueError(f"config.model_type must be one of {tuple(MODEL_SCHEMES)}, got {model_type!r}")
    return MODEL_SCHEMES[model_type]


@dataclass(frozen=True)
class RopeIndexOptions:
    """What :func:`scheme_rope_index` needs besides the prompt: the scheme and its options
    (see :func:`mmpos.integrations.hf_rope.use_rope`), the model family (``"qwen2"`` or
    ``"qwen3"``; on ``"qwen3"`` every video frame is its own block) and the config's spatial
    merge size, placeholder token ids and ``tokens_per_second``. Checked on creation."""

    scheme: str
    family: str
    merge: int
    image_token_id: int
    video_token_id: int
    tokens_per_second: float
    delta: float | None = None
    temporal_scale: float | None = None
    training: bool = False
    advance: str = "max"

    def __post_init__(self) -> None:
        if self.scheme not in SCHEMES:
            raise ValueError(f"scheme must be one of {SCHEMES}, got {self.scheme!r}")
        if self.advance not in ADVANCES:
            raise ValueError(f"advance must be one of {ADVANCES}, got {self.advance!r}")
        delta, scale = self.delta, self.temporal_scale
        if self.scheme == "v2pe" and not self.training and not (isinstance(delta, (int, float)) and 0 < delta <= 1):
            raise ValueError(f"delta must be a number in (0, 1] for scheme='v2pe' (or pass training=True), got {delta!r}")
        if self.scheme == "hope" and not self.training and not (isinstance(scale, (int, float)) and scale > 0):
            raise ValueError(
                f"temporal_scale must be a positive number for scheme='hope' (or pass training=True), got {scale!r}"
            )

    @classmethod
    def from_config(cls, config: Any, scheme: str | None = None, **options: Any) -> RopeIndexOptions:
        """The options of a Qwen-VL ``config`` for ``scheme`` (default: the model's own,
        :func:`scheme_for_config`); ``options``: ``delta``, ``temporal_scale``, ``training``,
        ``advance``."""
        own = scheme_for_config(config)
        vision = config.vision_config
        return cls(
            scheme=own if scheme is None else scheme,
            family="qwen3" if own == "qwen3-vl" else "qwen2",
            merge=int(vision.spatial_merge_size),
            image_token_id=int(config.image_token_id),
            video_token_id=int(config.video_token_id),
            tokens_per_second=float(getattr(vision, "tokens_per_second", 1)),
            **options,
        )


def _check_grid(grid: Tensor | None, name: str, device: torch.device) -> Tensor:
    if grid is None:
        return torch.zeros(0, 3, dtype=torch.long, device=device)
    if not isinstance(grid, Tensor) or grid.dim() != 2 or grid.shape[1] != 3:
        raise ValueError(f"{name} must be a tensor of shape (num, 3), got {getattr(grid, 'shape', grid)}")
    if grid.numel() and bool((grid <= 0).any()):
        raise ValueError(f"{name} must hold positive sizes")
    return grid.long().to(device)


def _token_index(is_token: Tensor, block_tokens: Tensor, name: str) -> Tensor:
    """Flat indices of the marked tokens of a ``(B, L)`` batch in reading order; they fill
    the blocks one after the other (as the reference consumes its grids)."""
    index = is_token.reshape(-1).nonzero().squeeze(1)  # row-major: sample by sample, in order
    total = int(block_tokens.sum())
    if index.shape[0] != total:
        raise ValueError(f"{name} describes {total} tokens, but input_ids holds {index.shape[0]} such tokens")
    return index


def _text_only(input_ids: Tensor, attention_mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """The reference's branch without vision grids (padding gets position 1)."""
    b, length = input_ids.shape
    if attention_mask is None:
        ids = torch.arange(length, device=input_ids.device).view(1, 1, -1).expand(3, b, -1)
        return ids, torch.zeros(b, 1, dtype=input_ids.dtype, device=input_ids.device)
    ids = attention_mask.long().cumsum(-1) - 1
    ids = ids.masked_fill(attention_mask == 0, 1).unsqueeze(0).expand(3, -1, -1)
    return ids, ids[0].max(-1, keepdim=True).values + 1 - length


def scheme_rope_index(
    options: RopeIndexOptions,
    input_ids: Tensor,
    image_grid_thw: Tensor | None = None,
    video_grid_thw: Tensor | None = None,
    attention_mask: Tensor | None = None,
    second_per_grid_ts: Tensor | None = None,
    mm_token_type_ids: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """HF-shaped ``(position_ids (3, B, L), rope_deltas (B, 1))`` of a Qwen-VL prompt under
    ``options.scheme`` (1 on padding), from :func:`mmpos.layout.token_positions`.

    Arguments as :func:`get_rope_index`. Without grids the reference's text-only branch
    runs, whatever the scheme (every scheme places text alike). VRoPE's rows are
    ``c0, c1, c2`` (``c3 = c1 + c2 - c0``); 1-D schemes repeat their row. Ids are float64
    for ``v2pe`` and float32 for ``hope`` (``rope_deltas`` too) when the prompt has vision
    blocks, else the dtype of ``input_ids``.
    """
    if not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
        raise ValueError(f"input_ids must be a (B, L) tensor, got {getattr(input_ids, 'shape', input_ids)}")
    for name, t in (("attention_mask", attention_mask), ("mm_token_type_ids", mm_token_type_ids)):
        if t is not None and tuple(t.shape) != tuple(input_ids.shape):
            raise ValueError(f"{name} must have the shape of input_ids {tuple(input_ids.shape)}, got {tuple(t.shape)}")
    if image_grid_thw is None and video_grid_thw is None:
        return _text_only(input_ids, attention_mask)

    scheme, device = options.scheme, input_ids.device
    images = _check_grid(image_grid_thw, "image_grid_thw", device)
    videos = _check_grid(video_grid_thw, "video_grid_thw", device)
    if second_per_grid_ts is None:
        seconds = torch.ones(videos.shape[0], dtype=torch.float32, device=device)
    else:
        seconds = torch.as_tensor(second_per_grid_ts, device=device).reshape(-1).float()
        if seconds.shape[0] != videos.shape[0]:
            raise ValueError(
                f"second_per_grid_ts must hold one value per video ({videos.shape[0]}), got {seconds.shape[0]}"
            )
    if options.family == "qwen3" or scheme == "qwen3-vl":  # one block per frame (timestamps between are text)
        seconds = torch.repeat_interleave(seconds, videos[:, 0])
        videos = torch.repeat_interleave(videos, videos[:, 0], dim=0)
        videos[:, 0] = 1
    grid = torch.cat([images, videos]) // torch.tensor([1, options.merge, options.merge], device=device)  # (K, 3)
    tokens = grid.prod(-1)

    real = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask == 1
    if mm_token_type_ids is not None:
        is_image, is_video = (mm_token_type_ids == 1) & real, (mm_token_type_ids == 2) & real
    else:
        is_image = (input_ids == options.image_token_id) & real
        is_video = (input_ids == options.video_token_id) & real
    k_img, k = images.shape[0], grid.shape[0]
    token_index = torch.cat([
        _token_index(is_image, tokens[:k_img], "image_grid_thw"),
        _token_index(is_video, tokens[k_img:], "video_grid_thw"),
    ])

    f64 = {"dtype": torch.float64, "device": device}

    def per_block(value: float | None, choices: tuple[float, ...], draw: bool) -> Tensor:  # (K,) float64
        if draw:  # training: one choice per block
            return torch.tensor(choices, **f64)[torch.randint(len(choices), (k,), device=device)]
        return torch.full((k,), 1.0 if value is None else float(value), **f64)

    blocks = VisionBlocks(
        grid=grid,
        second_per_grid=torch.cat([torch.zeros(k_img, device=device), seconds]),  # images: no time scaling
        delta=per_block(options.delta, V2PE_DELTAS, options.training and scheme == "v2pe"),
        scale=per_block(options.temporal_scale, HOPE_SCALES, options.training and scheme == "hope"),
        token_index=token_index,
    )
    stride = int(options.temporal_scale) if scheme == "mrope-i" and options.temporal_scale else 1
    pos, nxt = token_positions(real, blocks, scheme, options.tokens_per_second, stride, options.advance)
    rows = pos[:3].expand(3, -1, -1)  # (A, B, L) -> (3, B, L); VRoPE: c0, c1, c2 (c3 is rebuilt)
    fractional = k > 0 and scheme in ("v2pe", "hope")  # prompts without vision blocks keep integer ids
    id_dtype = {"v2pe": torch.float64, "hope": torch.float32}[scheme] if fractional else input_ids.dtype
    position_ids = rows.masked_fill(~real, 1).to(id_dtype)
    deltas = (nxt - input_ids.shape[1]).unsqueeze(1)
    return position_ids, deltas.to(torch.float32) if fractional and scheme == "hope" else deltas.long()


def get_rope_index(
    config: Any,
    input_ids: Tensor,
    image_grid_thw: Tensor | None = None,
    video_grid_thw: Tensor | None = None,
    attention_mask: Tensor | None = None,
    second_per_grid_ts: Tensor | None = None,
    mm_token_type_ids: Tensor | None = None,
    advance: str = "max",
) -> tuple[Tensor, Tensor]:
    """3-D position ids ``(3, B, L)`` and ``rope_deltas`` ``(B, 1)`` of a Qwen-VL batch.

    Args:
        config: a ``Qwen2VLConfig``, ``Qwen2_5_VLConfig`` or ``Qwen3VLConfig`` (read:
            ``model_type``, ``image_token_id``, ``video_token_id``,
            ``vision_config.spatial_merge_size``, ``vision_config.tokens_per_second``).
        input_ids: ``(B, L)`` token ids; every image / video has ``t * h * w / merge**2``
            consecutive placeholder tokens (for Qwen3-VL: per frame).
        image_grid_thw: ``(num_images, 3)`` patch grids, in order of appearance.
        video_grid_thw: ``(num_videos, 3)`` patch grids.
        attention_mask: ``(B, L)``, 1 on real tokens; left or right padding.
        second_per_grid_ts: ``(num_videos,)`` seconds per temporal patch (Qwen2.5-VL; default 1).
        mm_token_type_ids: ``(B, L)`` 0 text, 1 image, 2 video (transformers >= 5.3 input);
            when given it locates the vision tokens instead of the token ids.
        advance: ``"max"`` or ``"spatial"`` (see the module docstring).

    Returns:
        ``position_ids`` ``(3, B, L)`` (dtype of ``input_ids``; 1 on padding) and
        ``rope_deltas`` ``(B, 1)`` int64, equal to the model's own ``get_rope_index`` (up to
        the two differences in the module docstring).
    """
    options = RopeIndexOptions.from_config(config, advance=advance)
    return scheme_rope_index(
        options, input_ids, image_grid_thw, video_grid_thw, attention_mask, second_per_grid_ts, mm_token_type_ids
    )
