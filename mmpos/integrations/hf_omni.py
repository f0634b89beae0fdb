"""Qwen2.5-Omni and Qwen3-Omni ``get_rope_index`` (TMRoPE with audio), vectorised over the batch.

References: Hugging Face transformers
``Qwen2_5OmniPreTrainedModelForConditionalGeneration.get_rope_index``
(``models/qwen2_5_omni/modeling_qwen2_5_omni.py``) and
``Qwen3OmniMoePreTrainedModelForConditionalGeneration.get_rope_index``
(``models/qwen3_omni_moe/modeling_qwen3_omni_moe.py``), read in releases 4.57.1 and 5.24.0 (the same
rule in both; 4.57.1's Qwen3-Omni audio length fixes the audio encoder's window at 100 features,
5.24.0 reads ``audio_config.n_window``, default 50, i.e. the same 100). Paper: Xu et al.,
"Qwen2.5-Omni Technical Report", https://arxiv.org/abs/2503.20215 (TMRoPE).

The prompt, as the Omni processors write it (``vs``/``ve``: vision start / end tokens, ``as``/``ae``:
audio start / end)::

    text  vs IMAGE... ve  text  vs VIDEO... ve  text  as AUDIO... ae  text
    vs as VIDEO/AUDIO interleaved by time ae ve      (a video with its audio: use_audio_in_video=True)

Text and the start / end tokens advance the position by 1; an image or a video is a vision block
(temporal index ``f * seconds * position_id_per_seconds``, floored by Qwen2.5-Omni, float32 ids in
Qwen3-Omni); an audio's tokens sit on consecutive positions (every axis alike, 40 ms per position at
25 per second), i.e. as text; a video with its audio is one *audio-visual* block
(:class:`mmpos.layout.VisionBlocks` ``audio``), its tokens interleaved by time (scheme entries
``qwen2.5-omni`` and ``qwen3-omni`` of :mod:`mmpos.schemes` place them). The blocks are found
with a few array operations over the whole batch and the positions come from the packer
:func:`mmpos.layout.pack`, as for the Qwen-VL families (:mod:`mmpos.integrations.hf_rope_index`).
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .._arrays import host, ids_in_dtype
from .._validate import check_bool, is_int
from ..coords import Modality
from ..layout import Layout, VisionBlocks, pack
from ..schemes import RULES, get_scheme, resolve_options, scheme_for_model_type
from ._token_blocks import block_first, check_grid, packed_rows, real_tokens

__all__ = ["TALKERS", "audio_token_counts", "get_rope_index", "omni_layout", "omni_model_type", "packed_rope_index"]

#: the Omni talkers' config classes -> the model_type of the Omni model whose position rule they take: the talker's
#: own ``get_rope_index`` runs that rule with the talker config's token ids, over the thinker's token ids
#: (Qwen3-Omni's talker config has an empty ``model_type`` in transformers 4.57 and 5.24, so the class names it)
TALKERS = {"Qwen2_5OmniTalkerConfig": "qwen2_5_omni", "Qwen3OmniMoeTalkerConfig": "qwen3_omni_moe"}


def omni_model_type(config: Any) -> str | None:
    """The Omni ``model_type`` whose rule ``config`` takes: its own, that of the Omni model a talker config
    (:data:`TALKERS`) belongs to, or ``None`` for a config that is neither."""
    talker = TALKERS.get(type(config).__name__)
    if talker is not None:
        return talker
    model_type = getattr(config, "model_type", None)
    return (
        model_type
        if model_type in get_scheme("qwen2.5-omni").model_types + get_scheme("qwen3-omni").model_types
        else None
    )


def _thinker(config: Any) -> tuple[Any, str]:
    """The config holding the token ids (an Omni model's thinker config, a thinker or talker config itself) and the
    scheme name of an Omni ``config``."""
    sch = scheme_for_model_type(omni_model_type(config) or getattr(config, "model_type", None))
    if not sch.audio:
        raise ValueError(
            f"config.model_type {config.model_type!r} is not an Omni model (audio); use "
            "mmpos.integrations.hf_rope_index.get_rope_index"
        )
    return getattr(config, "thinker_config", config), sch.name


def _token(thinker: Any, name: str) -> int:
    value = getattr(thinker, name, None)
    if not is_int(value):  # missing from the config: a value error
        raise ValueError(
            f"the Omni (thinker) config lacks {name} (the checkpoints' config.json sets it), got {value!r}"
        )
    return value


def _audio_window(thinker: Any) -> int:
    """Qwen3-Omni's audio window in features: ``2 * audio_config.n_window`` where the installed
    transformers reads it (5.x), else 100, the window transformers 4.57 fixes."""
    try:
        from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as reference
    except ImportError:  # pragma: no cover - transformers is this module's extra
        reference = None
    fn = getattr(reference, "_get_feat_extract_output_lengths", None)
    if fn is not None and "n_window" not in inspect.signature(fn).parameters:
        return 100
    return 2 * int(getattr(getattr(thinker, "audio_config", None), "n_window", 50))


def audio_token_counts(config: Any, audio_seqlens: Tensor) -> Tensor:
    """``(num_audios,)`` int64: the LLM tokens of each audio, from its feature lengths (mel frames),
    as the model's audio encoder computes them.

    Qwen2.5-Omni: two stride-2 stages, ``((n - 1) // 2 + 1 - 2) // 2 + 1``. Qwen3-Omni: the features
    in windows of ``2 * audio_config.n_window`` (100 by default; transformers 4.57 fixes 100 whatever
    the config says, and the installed release is followed), 13 tokens per full window and three
    stride-2 stages on the rest."""
    thinker, scheme = _thinker(config)
    if not isinstance(audio_seqlens, Tensor) or audio_seqlens.dim() != 1:
        raise ValueError(
            f"audio_seqlens must be a 1-D tensor (num_audios,), got {getattr(audio_seqlens, 'shape', audio_seqlens)}"
        )
    if audio_seqlens.is_floating_point() or audio_seqlens.is_complex() or audio_seqlens.dtype == torch.bool:
        raise ValueError(f"audio_seqlens must hold integers, got dtype {audio_seqlens.dtype}")
    n = host(audio_seqlens).astype(np.int64)
    if (n < 1).any():
        raise ValueError(f"audio_seqlens must hold lengths >= 1, got {n.tolist()}")
    if scheme == "qwen2.5-omni":
        out = ((n - 1) // 2 + 1 - 2) // 2 + 1
    else:
        window = _audio_window(thinker)
        rest = (n % window - 1) // 2 + 1
        out = ((rest - 1) // 2 + 1 - 1) // 2 + 1 + (n // window) * 13
    return torch.from_numpy(out)


#: why a scheme without ``Scheme.audio`` refuses a video with its audio, and what to pass instead
_NO_AUDIO_VISUAL_RULE = (
    "use_audio_in_video=True under scheme {scheme!r}: a video with its audio is one audio-visual block whose video "
    "and audio tokens the processor interleaves by time, a rule of TMRoPE (Qwen2.5-Omni: 2-s chunks; Qwen3-Omni: "
    "merged by time), which only the Omni schemes ('qwen2.5-omni', 'qwen3-omni') define; scheme {scheme!r} places a "
    "video's t * h * w tokens as one block in raster order and no reference (its paper, its reference code, "
    "Multimodal-RoPEs) says where audio tokens go inside it, so mmpos does not make one up. Pass "
    "use_audio_in_video=False to the processor and to the model (the video is then a block of {scheme!r} and its "
    "audio its own run of audio tokens, consecutive positions as text), or keep the model's own scheme {own!r}"
)


def omni_layout(
    config: Any,
    input_ids: Tensor,
    image_grid_thw: Tensor | None = None,
    video_grid_thw: Tensor | None = None,
    attention_mask: Tensor | None = None,
    use_audio_in_video: bool = False,
    audio_seqlens: Tensor | None = None,
    second_per_grids: Tensor | None = None,
    *,
    scheme: str | None = None,
    **scheme_options: Any,
) -> Layout:
    """The :class:`~mmpos.layout.Layout` of a tokenised Omni batch (arguments as :func:`get_rope_index`).

    Audio tokens get :attr:`~mmpos.coords.Modality.AUDIO` in ``Layout.modality``. ``scheme`` (default: the
    model's own) places the same blocks by another :mod:`mmpos.schemes` rule, with its ``scheme_options``
    (``use_rope`` on an Omni thinker); the padding and ``rope_deltas`` conventions stay the model's. A video with
    its audio (``use_audio_in_video=True``) takes the Omni schemes only (``Scheme.audio``): another scheme raises a
    ``ValueError`` saying why (no reference defines audio tokens inside its video blocks) and what to pass instead."""
    thinker, own = _thinker(config)
    scheme = own if scheme is None else scheme
    sch = get_scheme(scheme)  # checks the name
    if not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
        raise ValueError(f"input_ids must be a (B, L) tensor, got {getattr(input_ids, 'shape', input_ids)}")
    check_bool(use_audio_in_video, "use_audio_in_video")
    if attention_mask is not None and (
        not isinstance(attention_mask, Tensor) or tuple(attention_mask.shape) != tuple(input_ids.shape)
    ):
        raise ValueError(f"attention_mask must have the shape of input_ids {tuple(input_ids.shape)}")
    vision = getattr(thinker, "vision_config", None)  # a talker config holds its own spatial_merge_size
    merge = thinker.spatial_merge_size if vision is None else vision.spatial_merge_size
    images = check_grid(image_grid_thw, "image_grid_thw", merge)
    videos = check_grid(video_grid_thw, "video_grid_thw", merge)
    if second_per_grids is None:
        seconds = np.ones(videos.shape[0], dtype=np.float32)
    else:
        seconds = host(torch.as_tensor(second_per_grids)).reshape(-1).astype(np.float32)
        if seconds.shape[0] != videos.shape[0] or not (np.isfinite(seconds) & (seconds >= 0)).all():
            raise ValueError(
                f"second_per_grids must hold one finite value >= 0 per video ({videos.shape[0]}), got {seconds.tolist()}"
            )
    b, length = input_ids.shape
    ids = host(input_ids).reshape(-1)
    real = real_tokens(attention_mask, input_ids.shape).reshape(-1)
    is_image = (ids == _token(thinker, "image_token_id")) & real
    is_video = (ids == _token(thinker, "video_token_id")) & real
    is_audio = (ids == _token(thinker, "audio_token_id")) & real
    audio_start = np.flatnonzero(
        (ids == _token(thinker, "audio_start_token_id")) & real
    )  # (num_audios,) in reading order
    after_vision = np.zeros(ids.shape, dtype=bool)  # tokens right after a vision start token of the same sample
    vs = np.flatnonzero((ids == _token(thinker, "vision_start_token_id")) & real)
    vs = vs[(vs + 1) % length != 0]
    after_vision[vs + 1] = True
    av_start = np.flatnonzero(
        after_vision & (ids == _token(thinker, "audio_start_token_id")) & real
    )  # "vs as": audio in video
    if not use_audio_in_video and av_start.size:
        raise ValueError(
            "input_ids hold a video with its audio (a vision start token followed by an audio start token): "
            "pass use_audio_in_video=True"
        )
    counts = np.zeros(0, dtype=np.int64)
    if audio_start.size or audio_seqlens is not None:
        if audio_seqlens is None:
            raise ValueError(f"input_ids hold {audio_start.size} audio start tokens: audio_seqlens is required")
        counts = host(audio_token_counts(config, audio_seqlens))
        if counts.shape[0] != audio_start.shape[0]:
            raise ValueError(
                f"audio_seqlens holds {counts.shape[0]} audios, but input_ids holds {audio_start.shape[0]} audio start tokens"
            )
    grid_images = images // np.array([1, merge, merge])
    grid_videos = videos // np.array([1, merge, merge])
    k_img = images.shape[0]
    first_images = block_first(is_image.reshape(-1, length), grid_images.prod(-1), "image_grid_thw")
    in_video = np.isin(audio_start, av_start)  # (num_audios,) the audios that belong to a video
    v_tokens = grid_videos.prod(-1)
    audio = np.zeros(videos.shape[0], dtype=np.int64)
    if use_audio_in_video and videos.shape[0] and not sch.audio:
        raise ValueError(_NO_AUDIO_VISUAL_RULE.format(scheme=scheme, own=own))
    if use_audio_in_video:
        if av_start.shape[0] != videos.shape[0]:
            raise ValueError(
                f"use_audio_in_video=True: every video must follow a vision start and an audio start token; "
                f"input_ids hold {av_start.shape[0]} such pairs for {videos.shape[0]} videos"
            )
        audio = counts[in_video]  # the k-th audio-visual pair holds the k-th video
        first_videos = av_start + 1  # the block's first content token
        mixed = np.concatenate([[0], np.cumsum(is_video)]), np.concatenate([[0], np.cumsum(is_audio)])
        end = first_videos + v_tokens + audio
        if (end > b * length).any() or ((end - 1) // length != first_videos // length).any():
            raise ValueError("use_audio_in_video=True: a video's tokens and its audio's must lie in one sample")
        got_v, got_a = (m[end] - m[first_videos] for m in mixed)
        if (got_v != v_tokens).any() or (got_a != audio).any() or is_video.sum() != v_tokens.sum():
            raise ValueError(
                "use_audio_in_video=True: after each 'vision start, audio start' pair input_ids must hold the video's "
                f"{v_tokens.tolist()} video tokens and its audio's {audio.tolist()} audio tokens, interleaved"
            )
    else:
        first_videos = block_first(is_video.reshape(-1, length), v_tokens, "video_grid_thw")
    alone = ~in_video
    covered = np.zeros(ids.shape[0] + 1, dtype=np.int64)  # audio tokens inside audio-visual blocks
    np.add.at(covered, first_videos[audio > 0], 1)
    np.add.at(covered, (first_videos + v_tokens + audio)[audio > 0], -1)
    lone_audio = is_audio & ~np.cumsum(covered[:-1]).astype(bool)
    first_audio = block_first(lone_audio.reshape(-1, length), counts[alone], "audio_seqlens (audio tokens per audio)")
    if (first_audio != audio_start[alone] + 1).any():
        raise ValueError("every audio's tokens must follow its audio start token")

    markers = 1 if own == "qwen2.5-omni" else 0  # Qwen2.5-Omni: the audio start / end tokens join the block
    block_audio = np.where(audio > 0, audio + 2 * markers, 0)
    firsts = np.concatenate([first_images, first_videos - markers * (audio > 0)])
    blocks = VisionBlocks(
        np.concatenate([grid_images, grid_videos]),
        firsts,
        np.concatenate([np.zeros(k_img, dtype=np.float32), seconds]),
        np.arange(k_img + videos.shape[0]) < k_img,
        np.concatenate([np.zeros(k_img, dtype=np.int64), block_audio]),
    )

    def modality() -> np.ndarray:
        codes = np.zeros(ids.shape, dtype=np.int64)
        codes[is_image], codes[is_video], codes[is_audio] = Modality.IMAGE, Modality.VIDEO, Modality.AUDIO
        return codes.reshape(b, length)

    options = resolve_options(
        scheme,
        tokens_per_second=thinker.position_id_per_seconds,
        rule=RULES[own],
        **({"seconds_per_chunk": thinker.seconds_per_chunk} if markers and scheme == own else {}),
        **scheme_options,
    )
    return pack(real.reshape(b, length), blocks, scheme, options, modality=modality, device=input_ids.device)


def get_rope_index(
    config: Any,
    input_ids: Tensor,
    image_grid_thw: Tensor | None = None,
    video_grid_thw: Tensor | None = None,
    attention_mask: Tensor | None = None,
    use_audio_in_video: bool = False,
    audio_seqlens: Tensor | None = None,
    second_per_grids: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """3-D position ids ``(3, B, L)`` and ``rope_deltas`` ``(B, 1)`` of a Qwen2.5-Omni / Qwen3-Omni batch,
    equal to the model's own ``get_rope_index`` (same arguments).

    Args:
        config: a ``Qwen2_5OmniConfig`` / ``Qwen3OmniMoeConfig`` or their thinker config (read:
            ``model_type``; from the thinker: the image, video, audio, vision start and audio start
            token ids, ``position_id_per_seconds``, ``seconds_per_chunk`` (Qwen2.5-Omni),
            ``vision_config.spatial_merge_size``, ``audio_config.n_window`` (Qwen3-Omni)).
        input_ids: ``(B, L)`` token ids, as the Omni processor writes them (module docstring).
        image_grid_thw, video_grid_thw: ``(num, 3)`` patch grids, in order of appearance.
        attention_mask: ``(B, L)``, 1 on real tokens; left or right padding.
        use_audio_in_video: every video comes with its audio, interleaved (``vs as ... ae ve``).
        audio_seqlens: ``(num_audios,)`` feature lengths (mel frames) of every audio, in order of
            appearance (the audios of videos included); :func:`audio_token_counts` gives their tokens.
        second_per_grids: ``(num_videos,)`` seconds per temporal patch (default 1).

    Returns:
        ``position_ids`` ``(3, B, L)`` (Qwen2.5-Omni: dtype of ``input_ids``, 1 on padding; Qwen3-Omni:
        float32, 0 on padding) and ``rope_deltas`` ``(B, 1)`` (largest position + 1 - real length).
        Without image and video grids, the reference's text branch: the attention-mask cumsum, 1 on padding.
    """
    _, scheme = _thinker(config)
    float_ids = get_scheme(scheme).id_dtype.is_floating_point
    if image_grid_thw is None and video_grid_thw is None:  # the reference's text-only branch
        if not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
            raise ValueError(f"input_ids must be a (B, L) tensor, got {getattr(input_ids, 'shape', input_ids)}")
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        ids = (mask.float() if float_ids else mask.long()).cumsum(-1) - 1
        ids = ids.masked_fill(mask == 0, 1).unsqueeze(0).expand(3, -1, -1)
        return ids, ids[0].max(-1, keepdim=True).values + 1 - mask.sum(-1, keepdim=True)
    lay = omni_layout(
        config, input_ids, image_grid_thw, video_grid_thw, attention_mask, use_audio_in_video, audio_seqlens,
        second_per_grids,
    )  # fmt: skip
    ids, deltas = lay.position_ids, lay.rope_deltas
    if not float_ids:
        ids, deltas = ids_in_dtype(ids, deltas, input_ids.dtype)
    return ids, deltas


def packed_rope_index(
    config: Any,
    input_ids: Tensor,
    cu_seqlens: Tensor,
    image_grid_thw: Tensor | None = None,
    video_grid_thw: Tensor | None = None,
    use_audio_in_video: bool = False,
    audio_seqlens: Tensor | None = None,
    second_per_grids: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Position ids of a packed Omni batch: several samples in one row, each with the positions it
    has alone (as :func:`mmpos.integrations.hf_rope_index.packed_rope_index` for the Qwen-VL families).

    Args:
        input_ids: ``(1, N)`` the samples one after the other, no padding.
        cu_seqlens: ``(B + 1,)`` sample offsets (0, then the running sum of the sample lengths).
        the others: as :func:`get_rope_index`, the grids, seconds and audio lengths in order of
            appearance across the row.

    Returns:
        ``position_ids`` ``(3, 1, N)`` and ``rope_deltas`` ``(B, 1)`` (each sample's own).
    """
    if not isinstance(input_ids, Tensor) or input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"input_ids must be a packed (1, N) tensor, got {getattr(input_ids, 'shape', input_ids)}")
    total = input_ids.shape[1]
    _, unpack = packed_rows(cu_seqlens, total, input_ids.device)
    ids, mask = unpack(input_ids), unpack(torch.ones_like(input_ids))  # right padding
    lay = omni_layout(
        config, ids, image_grid_thw, video_grid_thw, mask, use_audio_in_video, audio_seqlens, second_per_grids
    )
    position_ids, _, _ = lay.packed("3d")
    deltas = lay.rope_deltas  # largest position + 1 - real length: each sample's own
    if not position_ids.is_floating_point():
        position_ids, deltas = ids_in_dtype(position_ids, deltas, input_ids.dtype)
    return position_ids, deltas
