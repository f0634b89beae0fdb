"""Left-padded batched generation equals one sample at a time, for every family whose attention ``use_rope``
reaches (issue #26 item 5).

Tiny random models of each family (the builders of tests/integrations/test_hf_rope.py and
test_hf_rope_families.py: 1-2 layers, hidden 64, float32): ``generate`` on a left-padded batch of three
prompts of different lengths with images (and a video where the family's processor writes videos the
Qwen way) gives every sample the greedy tokens, and the per-step logits to 1e-5, that it gets alone; the
``rope_deltas`` the model keeps for decoding equal the per-sample ones (transformers >= 5.3: equal; 4.57:
relative to the padded length, so the batch's are the sample's minus its padding). Both with the model
unpatched and under ``use_rope(model, <the family's own scheme>)``.

The position-level half covers every family of the registry, tiny model or not: the ids of a left-padded
batch from mmpos's front ends equal, on each sample's real tokens, the installed ``get_rope_index`` of the
sample alone (the samples of tests/integrations/_hf_samples.py), with ``rope_deltas`` as above.
A family the installed release lacks is skipped, with the reason.
"""

from __future__ import annotations

import inspect
import random
import types

import pytest
import torch

transformers = pytest.importorskip("transformers")
from _hf_samples import (
    NEW,
    OMNI_CLASSES,
    OWN_CLASSES,
    QWEN_RULE_FAMILIES,
    RULE,
    cat_grids,
    family_modules,
    own_family,
    own_reference,
    own_sample,
    qwen_family,
    qwen_reference,
    qwen_sample,
    text_row,
)

from mmpos.integrations import hf_families, hf_omni
from mmpos.integrations.hf_rope import current_rope, use_rope
from mmpos.integrations.hf_rope_index import get_rope_index, packed_rope_index, scheme_for_config
from mmpos.schemes import RULES

pytestmark = pytest.mark.hf


IMG, VID, START, END, VSTART, VEND, PAD = 120, 121, 122, 123, 124, 125, 0
SUPPRESS = [1, 2, IMG, VID, START, END, VSTART, VEND, 110, 111, 112]  # bos / eos, vision, GLM video, Omni audio


# --------------------------------------------------------------------------- tiny models (1-2 layers, hidden 64)
TEXT = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
QWEN_TOKENS = {"image_token_id": IMG, "video_token_id": VID, "vision_start_token_id": START, "vision_end_token_id": END}
GLM_TOKENS = {
    "image_token_id": IMG,
    "video_token_id": VID,
    "image_start_token_id": START,
    "image_end_token_id": END,
    "video_start_token_id": VSTART,
    "video_end_token_id": VEND,
}
VISION = {"patch_size": 2, "spatial_merge_size": 2, "temporal_patch_size": 2, "in_channels": 3}
QWEN2_VISION = dict(VISION, depth=1, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2)
QWEN3_VISION = dict(
    VISION, depth=1, hidden_size=32, out_hidden_size=64, num_heads=2, intermediate_size=64, num_position_embeddings=16
)
SIGLIP = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
          "patch_size": 2, "spatial_merge_size": 2}  # fmt: skip


def _rope(section, **extra):
    """``rope_parameters`` (transformers >= 5.3) or ``rope_theta`` + ``rope_scaling`` (4.57) of a text config."""
    if NEW:
        return {"rope_parameters": {"rope_type": "default", "mrope_section": section, "rope_theta": 1e4, **extra}}
    partial = {k: extra.pop(k) for k in ("partial_rotary_factor",) if k in extra}
    return {"rope_theta": 1e4, "rope_scaling": {"rope_type": "default", "mrope_section": section, **extra}, **partial}


def _make(config_cls: str, model_cls: str, **kwargs):
    config = getattr(transformers, config_cls)(**kwargs)
    return getattr(transformers, model_cls)(config)


def _qwen(kind: str, **text_extra):
    if kind == "qwen2_vl":
        text = dict(TEXT, **_rope([2, 3, 3]))
        return _make("Qwen2VLConfig", "Qwen2VLForConditionalGeneration", text_config=text,
                     vision_config=QWEN2_VISION, **QWEN_TOKENS)  # fmt: skip
    if kind == "qwen2_5_vl":
        vision = dict(QWEN3_VISION, window_size=8, fullatt_block_indexes=[0], tokens_per_second=2)
        vision.pop("num_position_embeddings")
        return _make("Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration", text_config=dict(TEXT, **_rope([2, 3, 3])),
                     vision_config=vision, **QWEN_TOKENS)  # fmt: skip
    text = dict(TEXT, head_dim=16, **_rope([4, 2, 2], mrope_interleaved=True), **text_extra)
    vision = dict(QWEN3_VISION, deepstack_visual_indexes=[0])
    if kind == "qwen3_vl":
        return _make("Qwen3VLConfig", "Qwen3VLForConditionalGeneration", text_config=text, vision_config=vision,
                     **QWEN_TOKENS)  # fmt: skip
    text.update(moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1)
    return _make("Qwen3VLMoeConfig", "Qwen3VLMoeForConditionalGeneration", text_config=text, vision_config=vision,
                 **QWEN_TOKENS)  # fmt: skip


def _glm(config_cls: str, model_cls: str, **text_extra):
    text = dict(TEXT, **_rope([2, 1, 1], partial_rotary_factor=0.5), **text_extra)
    vision = dict(VISION, depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=64, image_size=8)
    if config_cls == "Glm46VConfig":  # GLM-4.6V reads its sub-configs through AutoConfig
        text, vision = dict(text, model_type="glm4v_text"), dict(vision, model_type="glm4v_vision")
    return _make(config_cls, model_cls, text_config=text, vision_config=vision, **GLM_TOKENS)


def _linear_attention(**extra):
    """Qwen3.5 / Qwen4-Exp: a linear-attention layer, then the one that takes positions."""
    return dict(
        TEXT,
        num_hidden_layers=2,
        head_dim=16,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        rope_parameters={"rope_type": "default", "mrope_section": [2, 1, 1], "mrope_interleaved": True,
                         "partial_rotary_factor": 0.5, "rope_theta": 1e4},
        **extra,
    )  # fmt: skip


MOE = {"moe_intermediate_size": 32, "shared_expert_intermediate_size": 32, "num_experts_per_tok": 2, "num_experts": 4}


def _qwen3_5(moe: bool):
    text = _linear_attention(layer_types=["linear_attention", "full_attention"], **(MOE if moe else {}))
    name = "Qwen3_5Moe" if moe else "Qwen3_5"
    return _make(f"{name}Config", f"{name}ForConditionalGeneration", text_config=text, vision_config=QWEN3_VISION,
                 **QWEN_TOKENS)  # fmt: skip


def _qwen4_exp():
    text = _linear_attention(
        layer_types=["linear_attention", "indexed_attention"], hc_count=2, hc_lowrank=8, indexer_n_heads=2,
        indexer_kv_heads=1, indexer_head_dim=8, indexer_budget=4, indexer_compress_ratio=2, **MOE,
    )  # fmt: skip
    return _make("Qwen4ExpConfig", "Qwen4ExpForConditionalGeneration", text_config=text, vision_config=QWEN3_VISION,
                 **QWEN_TOKENS)  # fmt: skip


def _paddleocr_vl():
    text = dict(TEXT, head_dim=16, **_rope([2, 3, 3]))
    return _make("PaddleOCRVLConfig", "PaddleOCRVLForConditionalGeneration", text_config=text,
                 vision_config=dict(SIGLIP, image_size=8), **QWEN_TOKENS)  # fmt: skip


def _cosmos3_edge():
    return _make("Cosmos3EdgeConfig", "Cosmos3EdgeForConditionalGeneration",
                 text_config=dict(TEXT, head_dim=16, **_rope([4, 2, 2])), vision_config=dict(SIGLIP, num_patches=16),
                 projector_hidden_size=64, **QWEN_TOKENS)  # fmt: skip


def _cosmos3_omni():
    text = dict(TEXT, model_type="qwen3_vl_text", head_dim=16, **_rope([4, 2, 2], mrope_interleaved=True))
    return _make("Cosmos3OmniConfig", "Cosmos3OmniForConditionalGeneration", text_config=text,
                 vision_config=QWEN3_VISION, **QWEN_TOKENS)  # fmt: skip


def _ernie4_5_vl_moe():
    text = dict(TEXT, moe_intermediate_size=[32, 32], moe_k=2, moe_num_experts=4, moe_num_shared_experts=1,
                **_rope([3, 3, 2]))  # fmt: skip
    vision = {"depth": 1, "hidden_size": 32, "num_heads": 2, "patch_size": 2, "spatial_merge_size": 2,
              "intermediate_size": 64, "temporal_merge_size": 2}  # fmt: skip
    return _make("Ernie4_5_VLMoeConfig", "Ernie4_5_VLMoeForConditionalGeneration", text_config=text,
                 vision_config=vision, **GLM_TOKENS)  # fmt: skip


OMNI_TOKENS = dict(QWEN_TOKENS, audio_token_id=110, audio_start_token_id=111, audio_end_token_id=112)
OMNI_AUDIO = {"num_mel_bins": 16, "encoder_layers": 1, "encoder_attention_heads": 2, "encoder_ffn_dim": 64,
              "d_model": 32, "output_dim": 64, "max_source_positions": 64}  # fmt: skip


def _omni(config_cls: str, model_cls: str, text: dict, vision: dict, audio: dict):
    names = inspect.signature(getattr(transformers, config_cls)).parameters
    tokens = {}  # 4.57 names some of them *_token_index
    for key, value in OMNI_TOKENS.items():
        index = key.replace("_token_id", "_token_index")
        tokens[index if index in names and key not in names else key] = value
    return _make(config_cls, model_cls, text_config=text, vision_config=vision, audio_config=audio, **tokens)


def _qwen2_5_omni():
    vision = dict(QWEN3_VISION, fullatt_block_indexes=[0], window_size=8)
    vision.pop("num_position_embeddings")
    text = dict(TEXT, head_dim=16, **_rope([2, 3, 3]))
    return _omni("Qwen2_5OmniThinkerConfig", "Qwen2_5OmniThinkerForConditionalGeneration", text, vision,
                 dict(OMNI_AUDIO, n_window=4))  # fmt: skip


def _qwen3_omni_moe():
    text = dict(TEXT, head_dim=16, **_rope([4, 2, 2], mrope_interleaved=True), moe_intermediate_size=32,
                num_experts=4, num_experts_per_tok=2)  # fmt: skip
    return _omni("Qwen3OmniMoeThinkerConfig", "Qwen3OmniMoeThinkerForConditionalGeneration", text,
                 dict(QWEN3_VISION, deepstack_visual_indexes=[0]),
                 dict(OMNI_AUDIO, downsample_hidden_size=8, conv_chunksize=8))  # fmt: skip


def _cohere_compass():
    """Two layer types with their own theta and interleaved sections (``rope_parameters[layer_type]``)."""
    sliding = {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [3, 3, 2]}
    full = {"rope_type": "default", "rope_theta": 5e5, "mrope_section": [4, 2, 2]}
    text = dict(TEXT, num_hidden_layers=2, sliding_window=8, layer_types=["sliding_attention", "full_attention"],
                rope_parameters={"sliding_attention": sliding, "full_attention": full})  # fmt: skip
    return _make("CohereCompassConfig", "CohereCompassForConditionalGeneration", text_config=text,
                 vision_config=dict(QWEN3_VISION, deepstack_visual_indexes=[0]), **QWEN_TOKENS)  # fmt: skip


XD_VISION = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2, "num_hidden_layers": 1,
             "patch_size": 2, "spatial_merge_size": 2, "max_image_size": 16, "out_hidden_size": 64}  # fmt: skip


def _hy_v4_vl():
    """MLA attention (a 16-channel rotary slice), hyper-connections, a token indexer that keeps every key."""
    text = dict(TEXT, pad_token_id=PAD, moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2, q_lora_rank=32,
                kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=16, v_head_dim=16, index_topk=64,
                index_head_dim=16, index_n_heads=2, hc_mult=2,
                rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [4, 2, 2]})  # fmt: skip
    return _make("HYV4VLConfig", "HYV4VLForConditionalGeneration", text_config=text, vision_config=XD_VISION,
                 image_token_id=IMG, video_token_id=VID)  # fmt: skip


#: model_type -> (tiny model, transformers class, the family's own scheme, pixel row shape, video layout)
#: video layout: "block" (one run of video tokens), "merged" (ERNIE: 2 frames merged in time), "frames" (a
#: timestamped run per frame), None (images only: GLM-4V's processors write frames as image tokens)
MODELS = {
    "qwen2_vl": (lambda: _qwen("qwen2_vl"), "Qwen2VLForConditionalGeneration", "qwen2-vl", (24,), "block"),
    "qwen2_5_vl": (lambda: _qwen("qwen2_5_vl"), "Qwen2_5_VLForConditionalGeneration", "qwen2.5-vl", (24,), "block"),
    "qwen3_vl": (lambda: _qwen("qwen3_vl"), "Qwen3VLForConditionalGeneration", "qwen3-vl", (24,), "frames"),
    "qwen3_vl_moe": (lambda: _qwen("qwen3_vl_moe"), "Qwen3VLMoeForConditionalGeneration", "qwen3-vl", (24,), "frames"),
    "glm4v": (lambda: _glm("Glm4vConfig", "Glm4vForConditionalGeneration"), "Glm4vForConditionalGeneration",
              "qwen3-vl", (24,), None),
    "glm4v_moe": (
        lambda: _glm("Glm4vMoeConfig", "Glm4vMoeForConditionalGeneration", moe_intermediate_size=32,
                     n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
                     n_group=1, topk_group=1),
        "Glm4vMoeForConditionalGeneration", "qwen3-vl", (24,), None,
    ),
    "glm46v": (lambda: _glm("Glm46VConfig", "Glm46VForConditionalGeneration"), "Glm46VForConditionalGeneration",
               "qwen3-vl", (24,), None),
    "glm_ocr": (lambda: _glm("GlmOcrConfig", "GlmOcrForConditionalGeneration"), "GlmOcrForConditionalGeneration",
                "qwen3-vl", (24,), None),
    "paddleocr_vl": (_paddleocr_vl, "PaddleOCRVLForConditionalGeneration", "qwen2-vl", (3, 2, 2), None),
    "qwen3_5": (lambda: _qwen3_5(False), "Qwen3_5ForConditionalGeneration", "qwen3-vl", (24,), "frames"),
    "qwen3_5_moe": (lambda: _qwen3_5(True), "Qwen3_5MoeForConditionalGeneration", "qwen3-vl", (24,), "frames"),
    "qwen4_exp": (_qwen4_exp, "Qwen4ExpForConditionalGeneration", "qwen3-vl", (24,), "frames"),
    "cosmos3_edge": (_cosmos3_edge, "Cosmos3EdgeForConditionalGeneration", "qwen3-vl", (12,), "frames"),
    "cosmos3_omni": (_cosmos3_omni, "Cosmos3OmniForConditionalGeneration", "qwen3-vl", (24,), "frames"),
    "ernie4_5_vl_moe": (_ernie4_5_vl_moe, "Ernie4_5_VLMoeForConditionalGeneration", "qwen2-vl", (12,), "merged"),
    "qwen2_5_omni": (_qwen2_5_omni, "Qwen2_5OmniThinkerForConditionalGeneration", "qwen2.5-omni", (24,), "block"),
    "qwen3_omni_moe": (_qwen3_omni_moe, "Qwen3OmniMoeThinkerForConditionalGeneration", "qwen3-omni", (24,), "block"),
    "cohere_compass": (_cohere_compass, "CohereCompassForConditionalGeneration", "qwen3-vl", (24,), "frames"),
    "hy_v4_vl": (_hy_v4_vl, "HYV4VLForConditionalGeneration", "hy-v4-vl", (12,), "xd"),
}  # fmt: skip
#: not here: HunYuan-VL (its image-index axis counts the images of the whole batch, so in the model itself a
#: sample's positions in a batch are not those it has alone), GLM-Image (generates image tokens), MiniCPM-V 4.7
if not NEW:  # transformers 4.57.1's Qwen3-Omni thinker fails on a batch with images and videos (its deepstack joint
    # masks index (B, L, D) masks by a (B, L) one, modeling_qwen3_omni_moe.py): images only there
    MODELS["qwen3_omni_moe"] = (*MODELS["qwen3_omni_moe"][:4], None)
OMNI = {"qwen2_5_omni", "qwen3_omni_moe"}


def _prompts(video: str | None):
    """Three prompts ``(ids, image grids, video grids)`` of different lengths: an image, a smaller image,
    and a video (``block`` / ``merged`` / ``frames``) or two images; ``xd``: HY-V4-VL's, a newline token
    closing every merged row of an image or frame, no start / end tokens."""
    if video == "xd":
        return [
            ([5, 6] + [IMG] * 8 + [7, 30, 9, 10], [[1, 4, 6]], []),
            ([11] + [IMG] * 6 + [12, 13], [[1, 4, 4]], []),
            ([14, 15] + [VID] * 12 + [16], [], [[2, 4, 4]]),
        ]
    first = ([5, 6, START] + [IMG] * 6 + [END, 7, 30, 9, 10], [[1, 4, 6]], [])
    second = ([11, START] + [IMG] * 4 + [END, 12, 13], [[1, 4, 4]], [])
    if video == "block":  # 2 temporal patches of 4 x 4: 8 tokens
        third = ([14, 15, 16, START] + [VID] * 8 + [END, 17], [], [[2, 4, 4]])
    elif video == "merged":  # ERNIE-4.5-VL: the 2 frames merged in time (temporal_merge_size 2): 4 tokens
        third = ([14, 15, 16, START] + [VID] * 4 + [END, 17], [], [[2, 4, 4]])
    elif video == "frames":  # Qwen3-VL: each frame after its timestamp text
        third = ([14, 15, 40, START] + [VID] * 4 + [END, 41, START] + [VID] * 4 + [END, 17], [], [[2, 4, 4]])
    else:
        third = ([14, START] + [IMG] * 2 + [END, 15, START] + [IMG] * 4 + [END, 16], [[1, 2, 4], [1, 4, 4]], [])
    return [first, second, third]


def _inputs(name, prompts, gen):
    """The model inputs of ``prompts`` left-padded into one batch (random pixels from ``gen``, drawn once)."""
    shape = MODELS[name][3]
    length = max(len(p[0]) for p in prompts)
    ids = torch.full((len(prompts), length), PAD)
    mask = torch.zeros_like(ids)
    for i, (p, _, _) in enumerate(prompts):
        ids[i, length - len(p) :], mask[i, length - len(p) :] = torch.tensor(p), 1
    out = {"input_ids": ids, "attention_mask": mask}
    images = [g for _, gs, _ in prompts for g in gs]
    videos = [g for _, _, gs in prompts for g in gs]
    if images:
        out["image_grid_thw"] = torch.tensor(images)
        out["pixel_values"] = gen["images"][: int(out["image_grid_thw"].prod(-1).sum())].view(-1, *shape)
    if videos:
        out["video_grid_thw"] = torch.tensor(videos)
        out["pixel_values_videos"] = gen["videos"][: int(out["video_grid_thw"].prod(-1).sum())].view(-1, *shape)
        if name == "qwen2_5_vl":
            out["second_per_grid_ts"] = torch.tensor([0.5] * len(videos))
        elif name in OMNI:
            out["video_second_per_grid"] = torch.tensor([0.5] * len(videos))
    if NEW and name not in OMNI:
        out["mm_token_type_ids"] = (ids == IMG).long() + 2 * (ids == VID).long()
    return out


def _pixels(prompts, shape, seed=0):
    """Pixel rows per prompt (the same rows whether the prompt runs alone or in the batch)."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _, images, videos in prompts:
        n_img = sum(int(torch.tensor(x).prod()) for x in images)
        n_vid = sum(int(torch.tensor(x).prod()) for x in videos)
        rows.append({
            "images": torch.randn(n_img, *shape, generator=g),
            "videos": torch.randn(n_vid, *shape, generator=g),
        })  # fmt: skip
    return rows


def _run(model, inputs, steps=4):
    out = model.generate(
        **inputs,
        max_new_tokens=steps,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
        pad_token_id=PAD,
        suppress_tokens=SUPPRESS,
    )
    holder = model if getattr(model, "rope_deltas", None) is not None else model.model  # Omni thinkers keep them
    return out.sequences[:, inputs["input_ids"].shape[1] :], torch.stack(out.logits, 1), holder.rope_deltas.clone()


def _use(model, name, scheme):
    """``use_rope(model, scheme)``, or a skip naming why this tree's ``use_rope`` does not reach the family."""
    if scheme == "own" and current_rope(model) == "own":
        return  # unpatched
    try:
        use_rope(model, scheme)
    except ValueError as error:
        pytest.skip(f"use_rope does not reach {name} here: {error}")
    assert current_rope(model) == scheme


@pytest.fixture(scope="module", params=list(MODELS))
def family(request):
    name = request.param
    build, cls = MODELS[name][:2]
    if not hasattr(transformers, cls):
        pytest.skip(f"transformers {transformers.__version__} has no {name} (added in a later release)")
    torch.manual_seed(0)
    return name, build().eval()


@torch.no_grad()
@pytest.mark.parametrize("mode", ["unpatched", "own scheme"])
def test_left_padded_generate_equals_each_sample_alone(family, mode):
    name, model = family
    scheme, shape, video = MODELS[name][2:]
    _use(model, name, "own" if mode == "unpatched" else scheme)
    prompts = _prompts(video)
    pixels = _pixels(prompts, shape)
    cat = {k: torch.cat([p[k] for p in pixels]) for k in ("images", "videos")}
    batch = _inputs(name, prompts, cat)
    seq, logits, deltas = _run(model, batch)
    padding = (batch["attention_mask"] == 0).sum(1, keepdim=True)
    # the deltas the model keeps for decoding: 4.57 relative to the padded length (the Omni thinkers subtract
    # the padding from their get_rope_index's), >= 5.3 to the real length
    relative_to_padded = RULES[RULE].deltas == "next-padded"
    for i, prompt in enumerate(prompts):
        alone_seq, alone_logits, alone_deltas = _run(model, _inputs(name, [prompt], pixels[i]))
        assert torch.equal(seq[i], alone_seq[0]), (name, mode, i)
        torch.testing.assert_close(logits[i], alone_logits[0], rtol=1e-5, atol=1e-5)
        want = alone_deltas[0] - padding[i] if relative_to_padded else alone_deltas[0]
        assert torch.equal(deltas[i], want.to(deltas.dtype)), (name, mode, i)
    use_rope(model, "own")


# --------------------------------------------------------------------------- positions, every registry family
def _left_pad(rows):
    length = max(r.shape[1] for r in rows)
    out = torch.zeros(len(rows), length, dtype=rows[0].dtype)
    mask = torch.zeros(len(rows), length, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, length - r.shape[1] :], mask[i, length - r.shape[1] :] = r[0], 1
    return out, mask


def _check_against_alone(ids, deltas, mask, alone, relative_to_padded):
    padding = (mask == 0).sum(1)
    for i, (want_ids, want_deltas) in enumerate(alone):
        assert torch.equal(ids[:, i, padding[i] :], want_ids[:, 0]), i
        want = want_deltas.reshape(-1) - (padding[i] if relative_to_padded else 0)
        assert torch.equal(deltas[i], want.to(deltas.dtype)), i


@pytest.mark.parametrize("model_type", QWEN_RULE_FAMILIES)
def test_qwen_rule_left_padded_positions_equal_each_sample_alone(model_type):
    config, model_cls = qwen_family(model_type)
    scheme = scheme_for_config(config)
    rng = random.Random(f"left-{model_type}")
    for _ in range(3):
        parts = [qwen_sample(rng, config, scheme) for _ in range(rng.randint(2, 4))]
        input_ids, mask = _left_pad([p[0] for p in parts])
        types, _ = _left_pad([p[1] for p in parts])
        grids = [cat_grids(parts, i) for i in (2, 3, 4)]
        alone = [qwen_reference(config, model_cls, *[p[i] for i in (0, 1, 2, 3, 4)]) for p in parts]
        for extra in [{"mm_token_type_ids": types}, {}] if NEW else [{}]:
            ids, deltas = get_rope_index(config, input_ids, grids[0], grids[1], mask, grids[2], rule="installed",
                                         **extra)  # fmt: skip
            _check_against_alone(ids, deltas, mask, alone, RULES[RULE].deltas == "next-padded")


@pytest.mark.parametrize("model_type", sorted(OWN_CLASSES))
def test_family_left_padded_positions_equal_each_sample_alone(model_type):
    """hy_v4_vl, hunyuan_vl, glm_image, minicpmv4_7. HunYuan-VL's image-index axis counts the images of the
    whole batch (the model's own rule, so a sample's differs from its index alone): that axis is compared with
    the installed ``get_rope_index`` of the batch, its other axes with each sample alone."""
    config, model_cls, owner = own_family(model_type)
    rng = random.Random(f"left-{model_type}")
    for _ in range(3):
        parts = [own_sample(rng, model_type, config) for _ in range(3)]
        input_ids, mask = _left_pad([p[0] for p in parts])
        types, _ = _left_pad([p[1] for p in parts])
        inputs = {}
        for key in parts[0][2]:
            got = [p[2][key] for p in parts if p[2][key] is not None]
            inputs[key] = "16x" if key == "downsample_mode" else (torch.cat(got) if got else None)
        alone = [own_reference(model_type, model_cls, owner, *p) for p in parts]
        if model_type == "minicpmv4_7":
            ids, deltas = hf_families.minicpmv4_7_rope_index(config, input_ids, types, attention_mask=mask, **inputs)
        elif model_type == "glm_image":
            ids, deltas = get_rope_index(config, input_ids, attention_mask=mask, **inputs)
        else:
            ids, deltas = get_rope_index(config, input_ids, attention_mask=mask, mm_token_type_ids=types, **inputs)
        if model_type == "hunyuan_vl":
            batch_ref, _ = model_cls.get_rope_index(owner, input_ids, types, inputs["image_grid_thw"].clone(), mask)
            assert torch.equal(ids[-1], batch_ref[-1])
            ids, alone = ids[:-1], [(a[:-1], d) for a, d in alone]
        _check_against_alone(ids, deltas, mask, alone, False)


def _omni_reference(model_type, config, **kwargs):
    _, mm = family_modules(model_type)
    model_cls = getattr(mm, OMNI_CLASSES[model_type][1])
    owner = types.SimpleNamespace(config=config, spatial_merge_size=config.vision_config.spatial_merge_size)
    for name in ("get_llm_pos_ids_for_vision", "get_chunked_index"):
        setattr(owner, name, types.MethodType(getattr(model_cls, name), owner))
    return model_cls.get_rope_index(owner, **kwargs)


@pytest.mark.parametrize("model_type", sorted(OMNI_CLASSES))
def test_omni_left_padded_positions_equal_each_sample_alone(model_type):
    cm, _ = family_modules(model_type)
    config = getattr(cm, OMNI_CLASSES[model_type][0])()
    for key, value in (("vision_start_token_id", 151652), ("vision_end_token_id", 151653),
                       ("audio_end_token_id", 151648)):  # fmt: skip
        if getattr(config, key, None) is None:
            setattr(config, key, value)
    m = config.vision_config.spatial_merge_size
    vs, ve, img = config.vision_start_token_id, config.vision_end_token_id, config.image_token_id
    rows = [[5, vs] + [img] * 6 + [ve, 7], [8, 9, vs] + [img] * 2 + [ve], [vs] + [img] * 4 + [ve, 10, 11, 12, 13]]
    grids = [[1, 2 * m, 3 * m], [1, m, 2 * m], [1, 2 * m, 2 * m]]
    input_ids, mask = _left_pad([torch.tensor([r]) for r in rows])
    ids, deltas = hf_omni.get_rope_index(config, input_ids, torch.tensor(grids), attention_mask=mask)
    alone = [
        _omni_reference(model_type, config, input_ids=torch.tensor([r]), image_grid_thw=torch.tensor([g]),
                        attention_mask=torch.ones(1, len(r), dtype=torch.long))
        for r, g in zip(rows, grids)
    ]  # fmt: skip
    _check_against_alone(ids, deltas, mask, alone, False)


def _left_padded_call(model_type):
    """``(call, input_ids, mask, types)``: mmpos's front end of ``model_type`` on a left-padded batch,
    ``call(input_ids, mask, types=None)`` (``types``: the batch's ``mm_token_type_ids``; ``None``: the token ids say;
    the Omni models and GLM-Image read no types, MiniCPM-V reads them always)."""
    rng = random.Random(f"mask-{model_type}")
    if model_type in OMNI_CLASSES:
        cm, _ = family_modules(model_type)
        config = getattr(cm, OMNI_CLASSES[model_type][0])()
        for key, value in (("vision_start_token_id", 151652), ("vision_end_token_id", 151653)):
            if getattr(config, key, None) is None:
                setattr(config, key, value)
        m, img = config.vision_config.spatial_merge_size, config.image_token_id
        vs, ve = config.vision_start_token_id, config.vision_end_token_id
        rows = [[5, vs] + [img] * 6 + [ve, 7], [8, vs] + [img] * 2 + [ve]]
        input_ids, mask = _left_pad([torch.tensor([r]) for r in rows])
        grids = torch.tensor([[1, 2 * m, 3 * m], [1, m, 2 * m]])

        def call(input_ids, mask, types=None):
            return hf_omni.get_rope_index(config, input_ids, grids, attention_mask=mask)

        return call, input_ids, mask, None
    if model_type in OWN_CLASSES:
        config, _, _ = own_family(model_type)
        parts = [own_sample(rng, model_type, config) for _ in range(2)]
        inputs = {}
        for key in parts[0][2]:
            got = [p[2][key] for p in parts if p[2][key] is not None]
            inputs[key] = "16x" if key == "downsample_mode" else (torch.cat(got) if got else None)
    else:
        config, _ = qwen_family(model_type)
        parts = [qwen_sample(rng, config, scheme_for_config(config)) for _ in range(2)]
        grids = [cat_grids(parts, i) for i in (2, 3, 4)]
        inputs = {"image_grid_thw": grids[0], "video_grid_thw": grids[1], "second_per_grid_ts": grids[2]}
        inputs["rule"] = "installed"
    input_ids, mask = _left_pad([p[0] for p in parts])
    all_types, _ = _left_pad([p[1] for p in parts])
    if model_type == "minicpmv4_7":

        def call(input_ids, mask, types=all_types):
            return hf_families.minicpmv4_7_rope_index(config, input_ids, types, attention_mask=mask, **inputs)

    elif model_type == "glm_image":

        def call(input_ids, mask, types=None):
            return get_rope_index(config, input_ids, attention_mask=mask, **inputs)

    else:

        def call(input_ids, mask, types=None):
            return get_rope_index(config, input_ids, attention_mask=mask, mm_token_type_ids=types, **inputs)

    return call, input_ids, mask, all_types


@pytest.mark.parametrize("model_type", ["qwen2_vl", *sorted(OWN_CLASSES), *sorted(OMNI_CLASSES)])
def test_attention_mask_holds_zeros_and_ones_only(model_type):
    """transformers 4.57 reads ``attention_mask == 1``, 5.x ``attention_mask.bool()``: they agree on 0 and 1 alone,
    so every front end refuses another value (a 2, a -1, NaN), naming it; a bool, float64 or bfloat16 mask of 0 and 1
    is read as the integer one."""
    call, input_ids, mask, _ = _left_padded_call(model_type)
    want = call(input_ids, mask)
    for same in (mask.bool(), mask.double(), mask.bfloat16()):
        got = call(input_ids, same)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    for bad, shown in ((2, "2"), (-1, "-1"), (float("nan"), "nan")):
        other = mask.double() if isinstance(bad, float) else mask.clone()
        other[0, -1] = bad
        with pytest.raises(
            ValueError, match=rf"attention_mask must hold 0 \(padding\) and 1 \(a real token\) only, got {shown}"
        ):
            call(input_ids, other)


@pytest.mark.parametrize("model_type", ["qwen2_vl", "hy_v4_vl", "minicpmv4_7"])
def test_mm_token_type_ids_hold_text_image_video_only(model_type):
    """The references read 0 (text), 1 (image) and 2 (video): another value is no modality of theirs (HY-V4-VL's
    and MiniCPM-V's: a ``KeyError``), so the front ends that read ``mm_token_type_ids`` refuse it, naming it; the
    processor's types give the ids the token ids give."""
    call, input_ids, mask, types = _left_padded_call(model_type)
    want = call(input_ids, mask)
    got = call(input_ids, mask, types)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    for bad in (3, -1):
        other = types.clone()
        other[0, -1] = bad
        with pytest.raises(
            ValueError, match=rf"mm_token_type_ids must hold 0 \(text\), 1 \(image\) or 2 \(video\), got {bad}"
        ):
            call(input_ids, mask, other)
    with pytest.raises(ValueError, match="mm_token_type_ids must be an integer tensor .* got float32"):
        call(input_ids, mask, types.float())  # (a 1.5 would read as text)


def _strided(t: torch.Tensor) -> torch.Tensor:
    """``t`` ``(B, L)`` as the transpose of a transposed copy: the same values, not contiguous."""
    out = torch.empty(t.shape[::-1], dtype=t.dtype)
    out.copy_(t.t())
    return out.t()


@pytest.mark.parametrize("model_type", ["qwen2_vl", *sorted(OWN_CLASSES), *sorted(OMNI_CLASSES)])
def test_strided_inputs_give_the_ids_of_contiguous_ones(model_type):
    """``input_ids``, ``attention_mask`` and ``mm_token_type_ids`` that are not contiguous (a transpose, a slice)
    give the ids of their contiguous copies. (HunYuan-VL's front end unmarked an image's boundary tokens in a
    flattened copy of a strided mask, so they stayed image tokens.)"""
    call, input_ids, mask, types = _left_padded_call(model_type)
    for given in (None, types) if types is not None else (None,):
        want = call(input_ids, mask, given)
        got = call(_strided(input_ids), _strided(mask), None if given is None else _strided(given))
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


# --------------------------------------------------------------------------- a packed forward of every tiny model
#: the models whose text layers carry state across the row (linear attention: its recurrence and short convolution
#: read no sample boundaries), so a packed row is not each sample alone in the model itself (run here: the later
#: samples' logits move by up to 0.1 on Qwen3.5, 7e-3 on Qwen4-Exp, with transformers' own positions too)
RECURRENT = {"qwen3_5", "qwen3_5_moe", "qwen4_exp"}


@torch.no_grad()
@pytest.mark.parametrize("mode", ["unpatched", "own scheme"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_packed_forward_of_every_tiny_family(name, mode):
    """The packed forward of test_hf_packed.py's ``test_packed_forward_gives_each_sample_its_own_logits`` on the tiny model of
    every family ``use_rope`` reaches (three prompts: images, and a video where the family takes the Qwen
    layout), unpatched and under ``use_rope(model, <own scheme>)``: each sample's logits as alone, to 1e-5."""
    build, cls, scheme, shape, video = MODELS[name]
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
    _use(model, name, "own" if mode == "unpatched" else scheme)
    prompts = _prompts(video)
    pixels = _pixels(prompts, shape)
    alone = []
    for i, prompt in enumerate(prompts):
        inputs = _inputs(name, [prompt], pixels[i])  # (the Omni thinkers place positions only with a mask)
        alone.append(model(**inputs, use_cache=False).logits[0])
    cat = {k: torch.cat([p[k] for p in pixels]) for k in ("images", "videos")}
    batch = _inputs(name, prompts, cat)  # left-padded: its real tokens, sample after sample, are the row
    real = batch.pop("attention_mask").bool()
    row = batch["input_ids"][real].view(1, -1)
    cu = torch.cat([torch.zeros(1, dtype=torch.int32), real.sum(1).cumsum(0).to(torch.int32)])
    if name in OWN_CLASSES:  # HY-V4-VL
        types = batch["mm_token_type_ids"][real].view(1, -1)
        ids, _ = hf_families.packed_rope_index(model.config, row, cu, image_grid_thw=batch.get("image_grid_thw"),
                                               video_grid_thw=batch.get("video_grid_thw"),
                                               mm_token_type_ids=types)  # fmt: skip
    elif name in OMNI:
        ids, _ = hf_omni.packed_rope_index(model.config, row, cu, batch.get("image_grid_thw"),
                                           batch.get("video_grid_thw"),
                                           second_per_grids=batch.get("video_second_per_grid"))  # fmt: skip
    else:
        types = batch["mm_token_type_ids"][real].view(1, -1) if "mm_token_type_ids" in batch else None
        ids, _ = packed_rope_index(model.config, row, cu, batch.get("image_grid_thw"), batch.get("video_grid_thw"),
                                   batch.get("second_per_grid_ts"), types, rule="installed")  # fmt: skip
    packed = dict(batch, input_ids=row, position_ids=torch.cat([text_row(cu)[None].to(ids.dtype), ids]))
    if "mm_token_type_ids" in batch:
        packed["mm_token_type_ids"] = batch["mm_token_type_ids"][real].view(1, -1)
    logits = model(**packed, use_cache=False).logits[0]
    for k, want in enumerate(alone):
        torch.testing.assert_close(logits[cu[k] : cu[k + 1]], want, rtol=1e-5, atol=1e-5)
    use_rope(model, "own")
