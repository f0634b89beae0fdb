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

import random
import types
from types import SimpleNamespace

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
from _hf_samples import (
    NEW,
    OMNI_CLASSES,
    OWN_CLASSES,
    QWEN_RULE_FAMILIES,
    RULE,
    assert_transformers_boundaries,
    cat_grids,
    cu_seqlens,
    family_modules,
    own_family,
    own_reference,
    own_sample,
    qwen_family,
    qwen_reference,
    qwen_sample,
    text_row,
)
from transformers.modeling_flash_attention_utils import prepare_fa_kwargs_from_position_ids

from mmpos import layout
from mmpos.integrations import hf_families, hf_omni
from mmpos.integrations.hf_rope_index import packed_rope_index, scheme_for_config

pytestmark = pytest.mark.hf


@pytest.mark.parametrize("model_type", QWEN_RULE_FAMILIES)
def test_qwen_rule_packed_rows_equal_each_sample_alone(model_type):
    """Every Qwen-VL-rule family: ``packed_rope_index`` (from the token types and from the token ids) gives
    each sample the ids and ``rope_deltas`` of the installed ``get_rope_index`` of the sample alone;
    ``layout.build(...).packed("4d")`` gives the same rows, the same ``cu_seqlens`` and a text row from which
    transformers finds the same samples."""
    config, model_cls = qwen_family(model_type)
    scheme = scheme_for_config(config)
    rng = random.Random(f"packed-{model_type}")
    for trial in range(3):
        parts = [qwen_sample(rng, config, scheme) for _ in range(rng.randint(2, 4))]
        row, types_row = torch.cat([p[0] for p in parts], 1), torch.cat([p[1] for p in parts], 1)
        images, videos, seconds = cat_grids(parts, 2), cat_grids(parts, 3), cat_grids(parts, 4)
        cu = cu_seqlens([p[0].shape[1] for p in parts])
        extras = [{"mm_token_type_ids": types_row}, {}] if NEW else [{}]
        for extra in extras:
            ids, deltas = packed_rope_index(config, row, cu, images, videos, seconds, rule="installed", **extra)
            assert ids.shape == (3, 1, row.shape[1]) and deltas.shape == (len(parts), 1)
            for k, p in enumerate(parts):
                want_ids, want_deltas = qwen_reference(config, model_cls, p[0], p[1], p[2], p[3], p[4])
                assert torch.equal(ids[:, :, cu[k] : cu[k + 1]], want_ids), (model_type, trial, k, extra.keys())
                assert torch.equal(deltas[k], want_deltas.reshape(-1).to(deltas.dtype)), (model_type, trial, k)
        lay = layout.build([p[5] for p in parts], scheme, rule=RULE)
        pos4, cu4, longest = lay.packed("4d")
        assert cu4.dtype == torch.int32 and torch.equal(cu4, cu) and longest == int(cu.diff().max())
        assert torch.equal(pos4[1:], ids) and torch.equal(pos4[0], text_row(cu))
        assert_transformers_boundaries(pos4[0], cu)


def test_packed_validation_and_the_three_rows_alone_do_not_mark_samples():
    """Bad ``cu_seqlens`` are refused; the scheme's own rows do not tell transformers where samples start
    (an image at a sample's start repeats its first position), which is why the text row comes first."""
    config, _ = qwen_family("qwen2_vl")
    img = config.image_token_id
    row = torch.tensor([[img] * 4 + [11, 12] + [13, img, img, img, img, 14]])  # two samples, each with a 4 x 4 image
    cu = cu_seqlens([6, 6])
    grids = torch.tensor([[1, 4, 4], [1, 4, 4]])
    ids, _ = packed_rope_index(config, row, cu, grids, rule="installed")
    (cu_t, _), _ = prepare_fa_kwargs_from_position_ids(ids[0])  # the temporal row read as text positions
    assert not torch.equal(cu_t, cu)
    assert_transformers_boundaries(text_row(cu), cu)
    with pytest.raises(ValueError, match="cu_seqlens must rise strictly from 0"):
        packed_rope_index(config, row, torch.tensor([0, 6, 6, 12]), grids)
    with pytest.raises(ValueError, match=r"input_ids must be a packed \(1, N\)"):
        packed_rope_index(config, row.expand(2, -1), cu, grids)


@pytest.mark.parametrize("model_type", sorted(OWN_CLASSES))
def test_family_packed_rows_equal_each_sample_alone(model_type):
    """``hf_families.packed_rope_index``: each sample of the row has the ids (HunYuan-VL: its image index
    from 0) and ``rope_deltas`` of the installed ``get_rope_index`` of the sample alone, from the token
    types and from the token ids; the text row gives transformers the samples."""
    config, model_cls, owner = own_family(model_type)
    rng = random.Random(f"packed-{model_type}")
    for trial in range(4):
        parts = [own_sample(rng, model_type, config) for _ in range(rng.randint(2, 4))]
        row, kinds = torch.cat([p[0] for p in parts], 1), torch.cat([p[1] for p in parts], 1)
        inputs = {}
        for key in parts[0][2]:
            if key == "downsample_mode":
                inputs[key] = "16x"
            else:
                got = [p[2][key] for p in parts if p[2][key] is not None]
                inputs[key] = torch.cat(got) if got else None
        cu = cu_seqlens([p[0].shape[1] for p in parts])
        extras = [{}] if model_type == "glm_image" else [{"mm_token_type_ids": kinds}, {}]
        for extra in extras:
            ids, deltas = hf_families.packed_rope_index(config, row, cu, **inputs, **extra)
            assert ids.shape[1:] == (1, row.shape[1]) and deltas.shape == (len(parts), 1)
            for k, (p_ids, p_kinds, p_inputs) in enumerate(parts):
                want_ids, want_deltas = own_reference(model_type, model_cls, owner, p_ids, p_kinds, p_inputs)
                assert torch.equal(ids[:, :, cu[k] : cu[k + 1]], want_ids), (model_type, trial, k, extra.keys())
                assert torch.equal(deltas[k], want_deltas.reshape(-1).to(deltas.dtype)), (model_type, trial, k)
        assert_transformers_boundaries(text_row(cu), cu)
    with pytest.raises(ValueError, match="attention_mask must not be given"):
        hf_families.packed_rope_index(config, row, cu, attention_mask=torch.ones_like(row), **inputs)
    with pytest.raises(ValueError, match="cu_seqlens must rise strictly"):
        hf_families.packed_rope_index(config, row, torch.tensor([0, 1, 1, row.shape[1]]), **inputs)


def test_family_packed_refuses_other_families():
    with pytest.raises(ValueError, match="config.model_type must be one of"):
        hf_families.packed_rope_index(SimpleNamespace(model_type="qwen2_vl"), torch.zeros(1, 2, dtype=torch.long),
                                      torch.tensor([0, 2]))  # fmt: skip


@pytest.mark.parametrize("model_type", sorted(OMNI_CLASSES))
def test_omni_packed_rows_equal_each_sample_alone(model_type):
    """``hf_omni.packed_rope_index`` on rows of samples with images, videos (seconds per grid) and audio:
    each sample as the installed ``get_rope_index`` of it alone (videos with their audio:
    tests/integrations/test_hf_omni.py)."""
    cm, mm = family_modules(model_type)
    config_name, model_name = OMNI_CLASSES[model_type]
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
        cat = {k: cat_grids([[p[k]] for p in parts], 0) for k in parts[0] if k != "input_ids"}
        cu = cu_seqlens([p["input_ids"].shape[1] for p in parts])
        ids, deltas = hf_omni.packed_rope_index(config, row, cu, **cat)
        for k, p in enumerate(parts):
            kwargs = {key: (v.clone() if isinstance(v, torch.Tensor) else v) for key, v in p.items()}
            want_ids, want_deltas = model_cls.get_rope_index(
                owner, **kwargs, attention_mask=torch.ones_like(p["input_ids"])
            )
            assert torch.equal(ids[:, :, cu[k] : cu[k + 1]], want_ids), (model_type, trial, k)
            assert torch.equal(deltas[k].to(want_deltas.dtype), want_deltas.reshape(-1)), (model_type, trial, k)
        assert_transformers_boundaries(text_row(cu), cu)


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
    cu = cu_seqlens([r["input_ids"].shape[1] for r in rows])
    cat = lambda key: torch.cat([r[key] for r in rows if key in r])
    images, videos = cat("image_grid_thw"), cat("video_grid_thw")
    ids, _ = packed_rope_index(model.config, row, cu, images, videos,
                               rule="installed")  # fmt: skip
    packed = {
        "input_ids": row,
        "position_ids": torch.cat([text_row(cu)[None], ids]),  # (4, 1, N): the text row first
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
