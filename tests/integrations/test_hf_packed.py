"""Packed / variable-length batches for every family of the scheme registry (issue #26 item 5): several
samples in one row with ``cu_seqlens`` (int32, FlashAttention-varlen form); the position ids and
``rope_deltas`` of each sample equal the installed release's own ``get_rope_index`` of that sample alone.

The front ends: :func:`mmpos.integrations.hf_rope_index.packed_rope_index` (the Qwen-VL rules: every
``model_type`` of the ``qwen2-vl``, ``qwen2.5-vl`` and ``qwen3-vl`` entries),
:func:`mmpos.integrations.hf_families.packed_rope_index` (``hy_v4_vl``, ``hunyuan_vl``, ``glm_image``,
``minicpmv4_7``) and :func:`mmpos.integrations.hf_omni.packed_rope_index` (the Omni families).

transformers' packed-sequence path: a model that takes ``(4, 1, N)`` position ids reads the first row
(the text positions, restarting at 0 per sample) to find the samples -- ``find_packed_sequence_indices``
(masking_utils, the SDPA / eager mask) and ``prepare_fa_kwargs_from_position_ids`` /
``_is_packed_sequence`` (modeling_flash_attention_utils, flash attention) -- read in 4.57.1 and 5.24.0.
The tests check that the text row of ``Layout.packed("4d")`` gives those functions the same boundaries as
mmpos's ``cu_seqlens``, and that a tiny random model run on the packed row (no attention mask) gives every
sample the logits it has alone. A family the installed release lacks is skipped, with the reason.
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

transformers = pytest.importorskip("transformers")
from transformers.masking_utils import find_packed_sequence_indices
from transformers.modeling_flash_attention_utils import _is_packed_sequence, prepare_fa_kwargs_from_position_ids

from mmpos import layout
from mmpos.integrations import hf_families, hf_omni
from mmpos.integrations.hf_families import video_markers
from mmpos.integrations.hf_rope_index import installed_rule, packed_rope_index, scheme_for_config
from mmpos.schemes import SCHEMES, model_types

pytestmark = pytest.mark.hf
RULE = installed_rule()
NEW = RULE == "hf-5.3"
#: every model_type served through the Qwen-VL rules of hf_rope_index
QWEN_RULE_FAMILIES = sorted(m for m, s in model_types().items() if s in ("qwen2-vl", "qwen2.5-vl", "qwen3-vl"))


def _modules(model_type: str):
    try:
        cm = importlib.import_module(f"transformers.models.{model_type}.configuration_{model_type}")
        mm = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    except ImportError:
        pytest.skip(f"transformers {transformers.__version__} has no {model_type} (added in a later release)")
    return cm, mm


def _cu(lengths) -> torch.Tensor:
    return torch.tensor([0, *np.cumsum(lengths).tolist()], dtype=torch.int32)


def _text_row(cu: torch.Tensor) -> torch.Tensor:
    """``(1, N)`` text positions of a packed row: 0 .. n_b - 1 per sample (what transformers reads first)."""
    lengths = cu.diff().long()
    return (torch.arange(int(cu[-1])) - cu[:-1].long().repeat_interleave(lengths)).view(1, -1)


def _assert_transformers_boundaries(text_row: torch.Tensor, cu: torch.Tensor):
    """transformers' packed-sequence detection on ``text_row`` finds the samples of ``cu``."""
    lengths = cu.diff().long()
    assert bool(_is_packed_sequence(text_row, batch_size=1)) == (lengths.numel() > 1)
    (cu_q, cu_k), (max_q, _) = prepare_fa_kwargs_from_position_ids(text_row)
    assert torch.equal(cu_q, cu.to(torch.int32)) and torch.equal(cu_k, cu_q) and int(max_q) == int(lengths.max())
    sample = torch.arange(lengths.numel()).repeat_interleave(lengths).view(1, -1)
    found = find_packed_sequence_indices(text_row)
    assert (found is None and lengths.numel() == 1) or torch.equal(found, sample)


# --------------------------------------------------------------------------- the Qwen-VL rules
def _qwen_family(model_type: str):
    cm, mm = _modules(model_type)
    config_cls = next(
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


def _qwen_reference(config, model_cls, input_ids, mm_types, images, videos, seconds):
    owner = SimpleNamespace(config=config)
    if hasattr(model_cls, "get_vision_position_ids"):
        owner.get_vision_position_ids = types.MethodType(model_cls.get_vision_position_ids, owner)
    params = inspect.signature(model_cls.get_rope_index).parameters
    kwargs = {"input_ids": input_ids, "image_grid_thw": images, "video_grid_thw": videos, "attention_mask": None}
    if "mm_token_type_ids" in params:
        kwargs["mm_token_type_ids"] = mm_types
    if "second_per_grid_ts" in params:
        kwargs["second_per_grid_ts"] = seconds
    kwargs = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
    return model_cls.get_rope_index(owner, **kwargs)


def _qwen_sample(rng: random.Random, config, scheme: str):
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


def _cat(parts, i):
    got = [p[i] for p in parts if p[i] is not None]
    return torch.cat(got) if got else None


@pytest.mark.parametrize("model_type", QWEN_RULE_FAMILIES)
def test_qwen_rule_packed_rows_equal_each_sample_alone(model_type):
    """Every Qwen-VL-rule family: ``packed_rope_index`` (from the token types and from the token ids) gives
    each sample the ids and ``rope_deltas`` of the installed ``get_rope_index`` of the sample alone;
    ``layout.build(...).packed("4d")`` gives the same rows, the same ``cu_seqlens`` and a text row from which
    transformers finds the same samples."""
    config, model_cls = _qwen_family(model_type)
    scheme = scheme_for_config(config)
    rng = random.Random(f"packed-{model_type}")
    for trial in range(3):
        parts = [_qwen_sample(rng, config, scheme) for _ in range(rng.randint(2, 4))]
        row, types_row = torch.cat([p[0] for p in parts], 1), torch.cat([p[1] for p in parts], 1)
        images, videos, seconds = _cat(parts, 2), _cat(parts, 3), _cat(parts, 4)
        cu = _cu([p[0].shape[1] for p in parts])
        extras = [{"mm_token_type_ids": types_row}, {}] if NEW else [{}]
        for extra in extras:
            ids, deltas = packed_rope_index(config, row, cu, images, videos, seconds, rule="installed", **extra)
            assert ids.shape == (3, 1, row.shape[1]) and deltas.shape == (len(parts), 1)
            for k, p in enumerate(parts):
                want_ids, want_deltas = _qwen_reference(config, model_cls, p[0], p[1], p[2], p[3], p[4])
                assert torch.equal(ids[:, :, cu[k] : cu[k + 1]], want_ids), (model_type, trial, k, extra.keys())
                assert torch.equal(deltas[k], want_deltas.reshape(-1).to(deltas.dtype)), (model_type, trial, k)
        lay = layout.build([p[5] for p in parts], scheme, rule=RULE)
        pos4, cu4, longest = lay.packed("4d")
        assert cu4.dtype == torch.int32 and torch.equal(cu4, cu) and longest == int(cu.diff().max())
        assert torch.equal(pos4[1:], ids) and torch.equal(pos4[0], _text_row(cu))
        _assert_transformers_boundaries(pos4[0], cu)


def test_packed_validation_and_the_three_rows_alone_do_not_mark_samples():
    """Bad ``cu_seqlens`` are refused; the scheme's own rows do not tell transformers where samples start
    (an image at a sample's start repeats its first position), which is why the text row comes first."""
    config, _ = _qwen_family("qwen2_vl")
    img = config.image_token_id
    row = torch.tensor([[img] * 4 + [11, 12] + [13, img, img, img, img, 14]])  # two samples, each with a 4 x 4 image
    cu = _cu([6, 6])
    grids = torch.tensor([[1, 4, 4], [1, 4, 4]])
    ids, _ = packed_rope_index(config, row, cu, grids, rule="installed")
    (cu_t, _), _ = prepare_fa_kwargs_from_position_ids(ids[0])  # the temporal row read as text positions
    assert not torch.equal(cu_t, cu)
    _assert_transformers_boundaries(_text_row(cu), cu)
    with pytest.raises(ValueError, match="cu_seqlens must rise strictly from 0"):
        packed_rope_index(config, row, torch.tensor([0, 6, 6, 12]), grids)
    with pytest.raises(ValueError, match=r"input_ids must be a packed \(1, N\)"):
        packed_rope_index(config, row.expand(2, -1), cu, grids)


# --------------------------------------------------------------------------- the families with their own front ends
CLASSES = {
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


def _own_family(model_type: str):
    cm, mm = _modules(model_type)
    config_name, model_name = CLASSES[model_type]
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


def _own_sample(rng, model_type, config):
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


def _own_reference(model_type, model_cls, owner, ids, kinds, inputs):
    inputs = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
    if model_type == "glm_image":
        return model_cls.get_rope_index(owner, ids, inputs["image_grid_thw"], inputs["images_per_sample"], None)
    if model_type == "minicpmv4_7":
        return model_cls.get_rope_index(owner, ids, kinds, inputs["target_sizes"], inputs["target_sizes_videos"],
                                        downsample_mode="16x", attention_mask=None)  # fmt: skip
    if model_type == "hunyuan_vl":
        return model_cls.get_rope_index(owner, ids, kinds, inputs["image_grid_thw"], None)
    return model_cls.get_rope_index(owner, ids, kinds, inputs["image_grid_thw"], inputs["video_grid_thw"], None)


@pytest.mark.parametrize("model_type", sorted(CLASSES))
def test_family_packed_rows_equal_each_sample_alone(model_type):
    """``hf_families.packed_rope_index``: each sample of the row has the ids (HunYuan-VL: its image index
    from 0) and ``rope_deltas`` of the installed ``get_rope_index`` of the sample alone, from the token
    types and from the token ids; the text row gives transformers the samples."""
    config, model_cls, owner = _own_family(model_type)
    rng = random.Random(f"packed-{model_type}")
    for trial in range(4):
        parts = [_own_sample(rng, model_type, config) for _ in range(rng.randint(2, 4))]
        row, kinds = torch.cat([p[0] for p in parts], 1), torch.cat([p[1] for p in parts], 1)
        inputs = {}
        for key in parts[0][2]:
            if key == "downsample_mode":
                inputs[key] = "16x"
            else:
                got = [p[2][key] for p in parts if p[2][key] is not None]
                inputs[key] = torch.cat(got) if got else None
        cu = _cu([p[0].shape[1] for p in parts])
        extras = [{}] if model_type == "glm_image" else [{"mm_token_type_ids": kinds}, {}]
        for extra in extras:
            ids, deltas = hf_families.packed_rope_index(config, row, cu, **inputs, **extra)
            assert ids.shape[1:] == (1, row.shape[1]) and deltas.shape == (len(parts), 1)
            for k, (p_ids, p_kinds, p_inputs) in enumerate(parts):
                want_ids, want_deltas = _own_reference(model_type, model_cls, owner, p_ids, p_kinds, p_inputs)
                assert torch.equal(ids[:, :, cu[k] : cu[k + 1]], want_ids), (model_type, trial, k, extra.keys())
                assert torch.equal(deltas[k], want_deltas.reshape(-1).to(deltas.dtype)), (model_type, trial, k)
        _assert_transformers_boundaries(_text_row(cu), cu)
    with pytest.raises(ValueError, match="attention_mask must not be given"):
        hf_families.packed_rope_index(config, row, cu, attention_mask=torch.ones_like(row), **inputs)
    with pytest.raises(ValueError, match="cu_seqlens must rise strictly"):
        hf_families.packed_rope_index(config, row, torch.tensor([0, 1, 1, row.shape[1]]), **inputs)


def test_family_packed_refuses_other_families():
    with pytest.raises(ValueError, match="config.model_type must be one of"):
        hf_families.packed_rope_index(SimpleNamespace(model_type="qwen2_vl"), torch.zeros(1, 2, dtype=torch.long),
                                      torch.tensor([0, 2]))  # fmt: skip


# --------------------------------------------------------------------------- the Omni families
OMNI = {
    "qwen2_5_omni": ("Qwen2_5OmniThinkerConfig", "Qwen2_5OmniPreTrainedModelForConditionalGeneration"),
    "qwen3_omni_moe": ("Qwen3OmniMoeThinkerConfig", "Qwen3OmniMoePreTrainedModelForConditionalGeneration"),
}


@pytest.mark.parametrize("model_type", sorted(OMNI))
def test_omni_packed_rows_equal_each_sample_alone(model_type):
    """``hf_omni.packed_rope_index`` on rows of samples with images, videos (seconds per grid) and audio:
    each sample as the installed ``get_rope_index`` of it alone (videos with their audio:
    tests/integrations/test_hf_omni.py)."""
    cm, mm = _modules(model_type)
    config_name, model_name = OMNI[model_type]
    config, model_cls = getattr(cm, config_name)(), getattr(mm, model_name)
    for name, value in (("vision_start_token_id", 151652), ("vision_end_token_id", 151653),
                        ("audio_end_token_id", 151648)):  # fmt: skip
        if getattr(config, name, None) is None:
            setattr(config, name, value)
    owner = SimpleNamespace(config=config, spatial_merge_size=config.vision_config.spatial_merge_size)
    for name in ("get_llm_pos_ids_for_vision", "get_chunked_index"):
        setattr(owner, name, types.MethodType(getattr(model_cls, name), owner))
    m = config.vision_config.spatial_merge_size
    vs, ve, a_s, a_e = (config.vision_start_token_id, config.vision_end_token_id, config.audio_start_token_id,
                        config.audio_end_token_id)  # fmt: skip
    rng = random.Random(f"packed-{model_type}")
    for trial in range(3):
        parts = []
        for _ in range(rng.randint(2, 4)):
            ids, images, videos, seconds, seqlens = [rng.randrange(10, 1000)], [], [], [], []
            for kind in rng.sample(["image", "video", "audio"], rng.randint(1, 3)):
                if kind == "image":
                    g = (1, m * rng.randint(1, 3), m * rng.randint(1, 3))
                    images.append(g)
                    ids += [vs] + [config.image_token_id] * (g[1] * g[2] // m**2) + [ve]
                elif kind == "video":
                    g = (rng.randint(1, 3), m * rng.randint(1, 2), m * rng.randint(1, 2))
                    videos.append(g)
                    seconds.append(rng.choice([0.5, 1.0, 2.0]))
                    ids += [vs] + [config.video_token_id] * (g[0] * g[1] * g[2] // m**2) + [ve]
                else:
                    n = rng.randint(3, 400)
                    seqlens.append(n)
                    tokens = int(hf_omni.audio_token_counts(config, torch.tensor([n]))[0])
                    ids += [a_s] + [config.audio_token_id] * tokens + [a_e]
                ids += [rng.randrange(10, 1000) for _ in range(rng.randint(0, 2))]
            if not images and not videos:  # the text branch is not a packed sample's reference
                g = (1, m, m)
                images.append(g)
                ids += [vs, config.image_token_id, ve]
            t = lambda g, w=3: torch.tensor(g).view(-1, w) if g else None
            parts.append({
                "input_ids": torch.tensor([ids]),
                "image_grid_thw": t(images),
                "video_grid_thw": t(videos),
                "audio_seqlens": torch.tensor(seqlens, dtype=torch.long) if seqlens else None,
                "second_per_grids": torch.tensor(seconds) if seconds else None,
            })  # fmt: skip
        row = torch.cat([p["input_ids"] for p in parts], 1)
        cat = {k: _cat([[p[k]] for p in parts], 0) for k in parts[0] if k != "input_ids"}
        cu = _cu([p["input_ids"].shape[1] for p in parts])
        ids, deltas = hf_omni.packed_rope_index(config, row, cu, **cat)
        for k, p in enumerate(parts):
            kwargs = {key: (v.clone() if isinstance(v, torch.Tensor) else v) for key, v in p.items()}
            want_ids, want_deltas = model_cls.get_rope_index(
                owner, **kwargs, attention_mask=torch.ones_like(p["input_ids"])
            )
            assert torch.equal(ids[:, :, cu[k] : cu[k + 1]], want_ids), (model_type, trial, k)
            assert torch.equal(deltas[k].to(want_deltas.dtype), want_deltas.reshape(-1)), (model_type, trial, k)
        _assert_transformers_boundaries(_text_row(cu), cu)


# --------------------------------------------------------------------------- a packed forward
def _tiny_qwen2_vl():
    text = {
        "vocab_size": 128,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "rope_theta": 10000.0,
        "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    vision = {"depth": 1, "embed_dim": 32, "hidden_size": 32, "num_heads": 2, "patch_size": 2}
    tokens = {"image_token_id": 120, "video_token_id": 121, "vision_start_token_id": 122, "vision_end_token_id": 123}
    torch.manual_seed(0)
    return transformers.Qwen2VLForConditionalGeneration(
        transformers.Qwen2VLConfig(text_config=text, vision_config=vision, **tokens)
    ).eval()


@torch.no_grad()
def test_packed_forward_gives_each_sample_its_own_logits():
    """A tiny random Qwen2-VL run on one packed row -- ``(4, 1, N)`` position ids from
    ``packed_rope_index`` with the text row first, no attention mask -- gives every sample the logits it
    has alone: transformers' mask reads the samples off the text row (SDPA / eager path; the flash-attention
    path reads the same row through ``prepare_fa_kwargs_from_position_ids``, checked above). transformers
    looks for packed rows only without an attention mask and without a cache (``use_cache=False``)."""
    model = _tiny_qwen2_vl()
    img, vid, vs, ve = 120, 121, 122, 123
    g = torch.Generator().manual_seed(3)
    samples = [  # (ids, image grids, video grids)
        ([5, vs] + [img] * 6 + [ve, 7, 8], [[1, 4, 6]], []),
        ([9, 10, 11, vs] + [vid] * 8 + [ve, 12], [], [[2, 4, 4]]),
        ([vs] + [img] * 4 + [ve, 13, 14, vs] + [img] * 2 + [ve, 15], [[1, 4, 4], [1, 2, 4]], []),
    ]
    pix = lambda grids: torch.randn(sum(int(np.prod(x)) for x in grids), 24, generator=g)
    alone, rows = [], []
    for ids, images, videos in samples:
        inputs = {"input_ids": torch.tensor([ids])}
        if images:
            inputs.update(pixel_values=pix(images), image_grid_thw=torch.tensor(images))
        if videos:
            inputs.update(pixel_values_videos=pix(videos), video_grid_thw=torch.tensor(videos))
        if NEW:
            inputs["mm_token_type_ids"] = (inputs["input_ids"] == img).long() + 2 * (inputs["input_ids"] == vid).long()
        alone.append(model(**inputs).logits[0])
        rows.append(inputs)
    row = torch.cat([r["input_ids"] for r in rows], 1)
    cu = _cu([r["input_ids"].shape[1] for r in rows])
    cat = lambda key: torch.cat([r[key] for r in rows if key in r])
    images, videos = cat("image_grid_thw"), cat("video_grid_thw")
    ids, _ = packed_rope_index(model.config, row, cu, images, videos,
                               rule="installed")  # fmt: skip
    packed = {
        "input_ids": row,
        "position_ids": torch.cat([_text_row(cu)[None], ids]),  # (4, 1, N): the text row first
        "pixel_values": cat("pixel_values"),
        "image_grid_thw": images,
        "pixel_values_videos": cat("pixel_values_videos"),
        "video_grid_thw": videos,
    }
    if NEW:
        packed["mm_token_type_ids"] = torch.cat([r["mm_token_type_ids"] for r in rows], 1)
    logits = model(**packed, use_cache=False).logits[0]  # transformers reads packed rows without a cache
    for k, want in enumerate(alone):
        torch.testing.assert_close(logits[cu[k] : cu[k + 1]], want, rtol=1e-5, atol=1e-5)
    # without the text row the samples attend to each other: the logits of the later samples change
    packed["position_ids"] = ids
    crossed = model(**packed, use_cache=False).logits[0]
    assert not torch.allclose(crossed[cu[1] :], logits[cu[1] :], atol=1e-4)


def _left_padding_module():
    """tests/integrations/test_hf_left_padding.py (its tiny models and prompts), loaded by path."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).with_name("test_hf_left_padding.py")
    spec = importlib.util.spec_from_file_location("_mmpos_packed_left_padding", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# test_hf_left_padding.py loads this module too (its samples): that copy does not load it back
LP = None if __name__.startswith("_mmpos_") else _left_padding_module()
#: the models whose text layers carry state across the row (linear attention: its recurrence and short convolution
#: read no sample boundaries), so a packed row is not each sample alone in the model itself (run here: the later
#: samples' logits move by up to 0.1 on Qwen3.5, 7e-3 on Qwen4-Exp, with transformers' own positions too)
RECURRENT = {"qwen3_5", "qwen3_5_moe", "qwen4_exp"}


@torch.no_grad()
@pytest.mark.parametrize("mode", ["unpatched", "own scheme"])
@pytest.mark.parametrize("name", sorted(LP.MODELS) if LP else [])
def test_packed_forward_of_every_tiny_family(name, mode):
    """The packed forward of :func:`test_packed_forward_gives_each_sample_its_own_logits` on the tiny model of
    every family ``use_rope`` reaches (three prompts: images, and a video where the family takes the Qwen
    layout), unpatched and under ``use_rope(model, <own scheme>)``: each sample's logits as alone, to 1e-5."""
    build, cls, scheme, shape, video = LP.MODELS[name]
    if not hasattr(transformers, cls):
        pytest.skip(f"transformers {transformers.__version__} has no {name} (added in a later release)")
    if name in RECURRENT:
        pytest.skip(f"{name}: its linear-attention layers carry their state across samples (no packed rows)")
    torch.manual_seed(0)
    model = build().eval()
    text_model = model.model.language_model if hasattr(model.model, "language_model") else model.model
    if "text_position_ids" not in inspect.getsource(type(text_model).forward):
        pytest.skip(
            f"transformers {transformers.__version__}: {name}'s text model hands its multi-row position ids to the "
            "mask as they are (no text row split off): no packed-sequence path"
        )
    LP._use(model, name, "own" if mode == "unpatched" else scheme)
    prompts = LP._prompts(video)
    pixels = LP._pixels(prompts, shape)
    alone = []
    for i, prompt in enumerate(prompts):
        inputs = LP._inputs(name, [prompt], pixels[i])  # (the Omni thinkers place positions only with a mask)
        alone.append(model(**inputs, use_cache=False).logits[0])
    cat = {k: torch.cat([p[k] for p in pixels]) for k in ("images", "videos")}
    batch = LP._inputs(name, prompts, cat)  # left-padded: its real tokens, sample after sample, are the row
    real = batch.pop("attention_mask").bool()
    row = batch["input_ids"][real].view(1, -1)
    cu = torch.cat([torch.zeros(1, dtype=torch.int32), real.sum(1).cumsum(0).to(torch.int32)])
    if name in CLASSES:  # HY-V4-VL
        types = batch["mm_token_type_ids"][real].view(1, -1)
        ids, _ = hf_families.packed_rope_index(model.config, row, cu, image_grid_thw=batch.get("image_grid_thw"),
                                               video_grid_thw=batch.get("video_grid_thw"),
                                               mm_token_type_ids=types)  # fmt: skip
    elif name in LP.OMNI:
        ids, _ = hf_omni.packed_rope_index(model.config, row, cu, batch.get("image_grid_thw"),
                                           batch.get("video_grid_thw"),
                                           second_per_grids=batch.get("video_second_per_grid"))  # fmt: skip
    else:
        types = batch["mm_token_type_ids"][real].view(1, -1) if "mm_token_type_ids" in batch else None
        ids, _ = packed_rope_index(model.config, row, cu, batch.get("image_grid_thw"), batch.get("video_grid_thw"),
                                   batch.get("second_per_grid_ts"), types, rule="installed")  # fmt: skip
    packed = dict(batch, input_ids=row, position_ids=torch.cat([_text_row(cu)[None].to(ids.dtype), ids]))
    if "mm_token_type_ids" in batch:
        packed["mm_token_type_ids"] = batch["mm_token_type_ids"][real].view(1, -1)
    logits = model(**packed, use_cache=False).logits[0]
    for k, want in enumerate(alone):
        torch.testing.assert_close(logits[cu[k] : cu[k + 1]], want, rtol=1e-5, atol=1e-5)
    LP.use_rope(model, "own")
