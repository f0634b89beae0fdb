"""Random samples of every registry family and the installed release's own ``get_rope_index`` of them,
shared by test_hf_packed.py (packed rows), test_hf_left_padding.py (left-padded batches) and test_hf_families.py
(the Qwen-VL-rule families' loader and reference).

Each sample generator returns the token ids, the token types, the grids and the ``mmpos.layout`` segments of
one random sample; each reference calls the installed model's own ``get_rope_index`` on one sample alone.
"""

from __future__ import annotations

import importlib
import inspect
import random
import types
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import transformers
from transformers.masking_utils import find_packed_sequence_indices
from transformers.modeling_flash_attention_utils import _is_packed_sequence, prepare_fa_kwargs_from_position_ids

from mmpos import layout
from mmpos.integrations.hf_families import video_markers
from mmpos.integrations.hf_rope_index import installed_rule
from mmpos.schemes import SCHEMES, model_types

RULE = installed_rule()
NEW = RULE == "hf-5.3"
#: every model_type served through the Qwen-VL rules of hf_rope_index
QWEN_RULE_FAMILIES = sorted(m for m, s in model_types().items() if s in ("qwen2-vl", "qwen2.5-vl", "qwen3-vl"))


def family_modules(model_type: str):
    try:
        cm = importlib.import_module(f"transformers.models.{model_type}.configuration_{model_type}")
        mm = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    except ImportError:
        pytest.skip(f"transformers {transformers.__version__} has no {model_type} (added in a later release)")
    return cm, mm


def cu_seqlens(lengths) -> torch.Tensor:
    return torch.tensor([0, *np.cumsum(lengths).tolist()], dtype=torch.int32)


def text_row(cu: torch.Tensor) -> torch.Tensor:
    """``(1, N)`` text positions of a packed row: 0 .. n_b - 1 per sample (what transformers reads first)."""
    lengths = cu.diff().long()
    return (torch.arange(int(cu[-1])) - cu[:-1].long().repeat_interleave(lengths)).view(1, -1)


def assert_transformers_boundaries(text_row: torch.Tensor, cu: torch.Tensor):
    """transformers' packed-sequence detection on ``text_row`` finds the samples of ``cu``."""
    lengths = cu.diff().long()
    assert bool(_is_packed_sequence(text_row, batch_size=1)) == (lengths.numel() > 1)
    (cu_q, cu_k), (max_q, _) = prepare_fa_kwargs_from_position_ids(text_row)
    assert torch.equal(cu_q, cu.to(torch.int32)) and torch.equal(cu_k, cu_q) and int(max_q) == int(lengths.max())
    sample = torch.arange(lengths.numel()).repeat_interleave(lengths).view(1, -1)
    found = find_packed_sequence_indices(text_row)
    assert (found is None and lengths.numel() == 1) or torch.equal(found, sample)


# --------------------------------------------------------------------------- the Qwen-VL rules
def qwen_family(model_type: str):
    """``(config, model class)`` of a family served through the Qwen-VL rules, from the installed transformers:
    the model's config class built bare and the class that defines ``get_rope_index`` (skip if it lacks them)."""
    cm, mm = family_modules(model_type)
    config_cls = next(  # the model's config (in 4.57 the vision config may carry the family's model_type too)
        c
        for c in vars(cm).values()
        if isinstance(c, type)
        and issubclass(c, transformers.PretrainedConfig)
        and c.model_type == model_type
        and "vision_config" in getattr(c, "sub_configs", {})
    )
    owners = [c for c in vars(mm).values() if isinstance(c, type) and "get_rope_index" in c.__dict__]
    if not owners:
        pytest.skip(f"transformers {transformers.__version__}: {model_type} has no get_rope_index")
    config = config_cls()
    if model_type == "qwen2_5_vl":
        config.vision_config.tokens_per_second = 2  # the released checkpoints
    return config, owners[0]


def qwen_reference(config, model_cls, input_ids, mm_types, images, videos, seconds=None, attention_mask=None):
    """The installed family's own ``get_rope_index`` (called with the arguments its signature takes)."""
    owner = SimpleNamespace(config=config)
    if hasattr(model_cls, "get_vision_position_ids"):
        owner.get_vision_position_ids = types.MethodType(model_cls.get_vision_position_ids, owner)
    params = inspect.signature(model_cls.get_rope_index).parameters
    kwargs = {
        "input_ids": input_ids,
        "image_grid_thw": images,
        "video_grid_thw": videos,
        "attention_mask": attention_mask,
    }
    if "mm_token_type_ids" in params:
        kwargs["mm_token_type_ids"] = mm_types
    if "second_per_grid_ts" in params:
        kwargs["second_per_grid_ts"] = seconds
    kwargs = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
    return model_cls.get_rope_index(owner, **kwargs)


def qwen_sample(rng: random.Random, config, scheme: str):
    """One sample (ids, types, images, videos, seconds, segments) tokenised as the family's processor
    does: Qwen3-VL's rule splits a video into timestamped one-frame blocks; GLM-4V writes a frame as image
    tokens between its video markers; ERNIE merges ``temporal_merge_size`` frames. At least one block."""
    image_id, video_id = config.image_token_id, config.video_token_id
    markers = video_markers(config)
    frame_id = image_id if markers is not None else video_id
    merge_t = getattr(config.vision_config, "temporal_merge_size", None) or 1
    frames = SCHEMES[scheme].frames
    wrap = None
    if getattr(config, "vision_start_token_id", None) is not None and markers is None:
        wrap = (config.vision_start_token_id, config.vision_end_token_id)
    text_ids = [i for i in range(10, 1000) if i not in (image_id, video_id)]
    ids, kinds, segs, images, videos, seconds = [], [], [], [], [], []

    def text(n):
        ids.extend(rng.choice(text_ids) for _ in range(n))
        kinds.extend([0] * n)
        segs.append(layout.Text(n))

    def put(token, kind, n, seg):
        if kind and wrap is not None:  # Qwen's <|vision_start|> ... <|vision_end|> (transformers 4.57 reads them)
            ids.append(wrap[0])
            kinds.append(0)
            segs.append(layout.Text(1))
        ids.extend([token] * n)
        kinds.extend([kind] * n)
        segs.append(seg)
        if kind and wrap is not None:
            ids.append(wrap[1])
            kinds.append(0)
            segs.append(layout.Text(1))

    text(rng.randint(1, 3))
    for _ in range(rng.randint(1, 3)):
        h, w = 2 * rng.randint(1, 3), 2 * rng.randint(1, 3)
        if rng.random() < 0.5:
            images.append((1, h, w))
            put(image_id, 1, h * w // 4, layout.Image((1, h, w)))
        else:
            t = merge_t * rng.randint(1, 2)
            s = rng.choice([0.5, 1.0, 1.5, 2.0])
            videos.append((t, h, w))
            seconds.append(s)
            if frames:
                if markers is not None:
                    put(markers[0], 0, 1, layout.Text(1))
                for _ in range(t):
                    text(rng.randint(1, 2))
                    put(frame_id, 2, h * w // 4, layout.Video((1, h, w)))
                if markers is not None:
                    put(markers[1], 0, 1, layout.Text(1))
            else:
                put(video_id, 2, t // merge_t * h * w // 4, layout.Video((t // merge_t, h, w), second_per_grid=s))
        text(rng.randint(1, 3))
    grid = lambda g: torch.tensor(g, dtype=torch.long).view(-1, 3) if g else None
    has_seconds = scheme == "qwen2.5-vl" and bool(seconds)
    return (
        torch.tensor([ids]),
        torch.tensor([kinds]),
        grid(images),
        grid(videos),
        torch.tensor(seconds) if has_seconds else None,
        segs,
    )


def cat_grids(parts, i):
    got = [p[i] for p in parts if p[i] is not None]
    return torch.cat(got) if got else None


# --------------------------------------------------------------------------- the families with their own front ends
OWN_CLASSES = {
    "hy_v4_vl": ("HYV4VLConfig", "HYV4VLModel"),
    "hunyuan_vl": ("HunYuanVLConfig", "HunYuanVLModel"),
    "glm_image": ("GlmImageConfig", "GlmImageModel"),
    "minicpmv4_7": ("MiniCPMV4_7Config", "MiniCPMV4_7Model"),
}
MINICPM_IDS = {
    "image_token_id": 5001,
    "video_token_id": 5002,
    "image_start_id": 5003,
    "image_end_id": 5004,
    "slice_start_id": 5005,
    "slice_end_id": 5006,
    "newline_id": 5007,
}


def own_family(model_type: str):
    cm, mm = family_modules(model_type)
    config_name, model_name = OWN_CLASSES[model_type]
    kwargs = {}
    if model_type == "hunyuan_vl":
        rope = {"rope_theta": 10000.0, "rope_type": "default", "mrope_section": [16, 16, 16, 16]}
        kwargs = {"text_config": {"rope_parameters": rope, "head_dim": 128}}
    elif model_type == "minicpmv4_7":
        kwargs = MINICPM_IDS
    config, model_cls = getattr(cm, config_name)(**kwargs), getattr(mm, model_name)
    owner = SimpleNamespace(config=config)
    owner.get_vision_position_ids = types.MethodType(model_cls.get_vision_position_ids, owner)
    if model_type == "minicpmv4_7":
        owner._group_visual_frames = types.MethodType(model_cls._group_visual_frames, owner)
        owner._frame_end_idx = model_cls._frame_end_idx
    return config, model_cls, owner


def own_sample(rng, model_type, config):
    """One sample of the family as its processor writes it: ``(ids, types, inputs)`` with ``inputs`` the
    grids / crop sizes its function reads."""
    ids, kinds = [], []
    grids = {"images": [], "videos": []}

    def text(n):
        ids.extend(rng.randrange(10, 1000) for _ in range(n))
        kinds.extend([0] * n)

    def put(token, kind, n=1):
        ids.extend([token] * n)
        kinds.extend([kind] * n)

    text(rng.randint(1, 3))
    m = getattr(config.vision_config, "spatial_merge_size", 2)
    for _ in range(rng.randint(1, 3)):
        if model_type == "hy_v4_vl":
            h, w = m * rng.randint(1, 3), m * rng.randint(1, 3)
            if rng.random() < 0.5:
                grids["images"].append((1, h, w))
                put(config.image_token_id, 1, (h // m) * (w // m + 1))
            else:
                t = rng.randint(1, 3)
                grids["videos"].append((t, h, w))
                put(config.video_token_id, 2, t * (h // m) * (w // m + 1))
        elif model_type == "hunyuan_vl":
            h, w = m * rng.randint(1, 3), m * rng.randint(1, 3)
            grids["images"].append((1, h, w))
            put(config.im_start_id, 0)
            put(config.image_token_id, 1, (h // m) * (w // m + 1) + rng.choice((0, 2)))
            put(config.im_end_id, 0)
        elif model_type == "glm_image":  # source images
            g = (1, rng.randint(1, 3), rng.randint(1, 3))
            grids["images"].append(g)
            put(config.image_start_token_id, 0)
            put(config.image_token_id, 0, g[1] * g[2])
            put(config.image_end_token_id, 0)
        else:  # minicpmv4_7, 16x: a thumbnail and 1 x 2 slices, or a video frame without slices
            video = rng.random() < 0.4
            token, kind, table = (
                (config.video_token_id, 2, grids["videos"]) if video else (config.image_token_id, 1, grids["images"])
            )
            th, tw = rng.randint(1, 3), rng.randint(1, 3)
            table.append((4 * th, 4 * tw))
            put(MINICPM_IDS["image_start_id"], 0)
            put(token, kind, th * tw)
            put(MINICPM_IDS["image_end_id"], 0)
            for _ in range(0 if video else rng.choice((0, 2))):
                sh, sw = rng.randint(1, 2), rng.randint(1, 2)
                table.append((4 * sh, 4 * sw))
                put(MINICPM_IDS["slice_start_id"], 0)
                put(token, kind, sh * sw)
                put(MINICPM_IDS["slice_end_id"], 0)
        text(rng.randint(1, 3))
    if model_type == "glm_image":  # the generation starts: an image start and the target grid(s)
        put(config.image_start_token_id, 0)
        grids["images"] += [(1, rng.randint(1, 3), rng.randint(1, 3)) for _ in range(rng.randint(1, 2))]
    width = 2 if model_type == "minicpmv4_7" else 3
    as_grid = lambda g: torch.tensor(g, dtype=torch.long).view(-1, width) if g else None
    images, videos = as_grid(grids["images"]), as_grid(grids["videos"])
    if model_type == "minicpmv4_7":
        inputs = {"target_sizes": images, "target_sizes_videos": videos, "downsample_mode": "16x"}
    elif model_type == "glm_image":
        inputs = {"image_grid_thw": images, "images_per_sample": torch.tensor([len(grids["images"])])}
    elif model_type == "hunyuan_vl":
        inputs = {"image_grid_thw": images}
    else:
        inputs = {"image_grid_thw": images, "video_grid_thw": videos}
    return torch.tensor([ids]), torch.tensor([kinds]), inputs


def own_reference(model_type, model_cls, owner, ids, kinds, inputs):
    inputs = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
    if model_type == "glm_image":
        return model_cls.get_rope_index(owner, ids, inputs["image_grid_thw"], inputs["images_per_sample"], None)
    if model_type == "minicpmv4_7":
        return model_cls.get_rope_index(owner, ids, kinds, inputs["target_sizes"], inputs["target_sizes_videos"],
                                        downsample_mode="16x", attention_mask=None)  # fmt: skip
    if model_type == "hunyuan_vl":
        return model_cls.get_rope_index(owner, ids, kinds, inputs["image_grid_thw"], None)
    return model_cls.get_rope_index(owner, ids, kinds, inputs["image_grid_thw"], inputs["video_grid_thw"], None)


# --------------------------------------------------------------------------- the Omni families
OMNI_CLASSES = {
    "qwen2_5_omni": ("Qwen2_5OmniThinkerConfig", "Qwen2_5OmniPreTrainedModelForConditionalGeneration"),
    "qwen3_omni_moe": ("Qwen3OmniMoeThinkerConfig", "Qwen3OmniMoePreTrainedModelForConditionalGeneration"),
}
