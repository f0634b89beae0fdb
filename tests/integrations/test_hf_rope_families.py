"""``use_rope`` on the families beyond Qwen-VL whose attention mmpos reaches (GLM-4V, GLM-4V-MoE,
GLM-4.6V: partial rotary, adjacent channels paired; PaddleOCR-VL; Qwen3.5 and Qwen3.5-MoE: partial rotary,
linear-attention layers without positions; GLM-OCR; Cosmos3-Edge; Cosmos3-Omni; Qwen4-Exp: Qwen3.5's rotation, its QSA indexer scoring keys
by the same cos / sin; ERNIE-4.5-VL: VideoRoPE's allocation, sections ordered h, w, t): the model's own scheme through mmpos reproduces the unpatched logits
bit for bit, and every swapped scheme runs a cached ``generate`` that agrees with a full forward.
Tiny random configs built from each family's config class; a family the installed release lacks
is skipped with the reason."""

from __future__ import annotations

import inspect

import pytest
import torch

transformers = pytest.importorskip("transformers")

from _tiny_hf import (
    QWEN3_VISION,
    SIGLIP_VISION,
    TEXT,
    assert_cached_generate_is_a_full_forward,
    assert_own_scheme_is_exact,
    assert_swap_is_consistent,
    greedy,
    left_padded,
)

from mmpos.integrations.hf_rope import current_rope, use_rope
from mmpos.integrations.hf_rope_index import installed_rule

pytestmark = pytest.mark.hf
NEW = installed_rule() == "hf-5.3"  # transformers >= 5.3: rope_parameters, mm_token_type_ids
IMG, VID, ISTART, IEND, VSTART, VEND, PAD = 120, 121, 122, 123, 124, 125, 0
TOKENS = {
    "image_token_id": IMG,
    "video_token_id": VID,
    "image_start_token_id": ISTART,
    "image_end_token_id": IEND,
    "video_start_token_id": VSTART,
    "video_end_token_id": VEND,
}
#: head_dim 16, half of it rotated (GLM-4V's partial_rotary_factor 0.5): 4 rotary pairs, sections t, h, w = 2, 1, 1
ROPE = {"rope_type": "default", "mrope_section": [2, 1, 1], "partial_rotary_factor": 0.5, "rope_theta": 10000.0}
VISION = {
    "depth": 1,
    "hidden_size": 32,
    "num_heads": 2,
    "intermediate_size": 64,
    "patch_size": 2,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "out_hidden_size": 64,
    "image_size": 8,
    "in_channels": 3,
}


def _text_config(**extra):
    if NEW:
        return dict(TEXT, rope_parameters=dict(ROPE), **extra)
    scaling = {"rope_type": "default", "mrope_section": ROPE["mrope_section"]}
    return dict(TEXT, rope_theta=ROPE["rope_theta"], rope_scaling=scaling, partial_rotary_factor=0.5, **extra)


def _glm4v():
    cfg = transformers.Glm4vConfig(text_config=_text_config(), vision_config=VISION, **TOKENS)
    return transformers.Glm4vForConditionalGeneration(cfg)


def _glm4v_moe():
    moe = {
        "moe_intermediate_size": 32,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
        "n_group": 1,
        "topk_group": 1,
    }
    cfg = transformers.Glm4vMoeConfig(text_config=_text_config(**moe), vision_config=VISION, **TOKENS)
    return transformers.Glm4vMoeForConditionalGeneration(cfg)


def _glm46v():
    text = dict(_text_config(), model_type="glm4v_text")  # GLM-4.6V reads its sub-configs through AutoConfig
    cfg = transformers.Glm46VConfig(text_config=text, vision_config=dict(VISION, model_type="glm4v_vision"), **TOKENS)
    return transformers.Glm46VForConditionalGeneration(cfg)


def _glm_ocr():
    cfg = transformers.GlmOcrConfig(text_config=_text_config(), vision_config=VISION, **TOKENS)
    return transformers.GlmOcrForConditionalGeneration(cfg)


QWEN_TOKENS = {
    "image_token_id": IMG,
    "video_token_id": VID,
    "vision_start_token_id": ISTART,
    "vision_end_token_id": IEND,
}


def _paddleocr_vl():
    text = dict(
        TEXT, head_dim=16, rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 1e4}
    )
    vision = dict(SIGLIP_VISION, image_size=8)
    cfg = transformers.PaddleOCRVLConfig(text_config=text, vision_config=vision, **QWEN_TOKENS)
    return transformers.PaddleOCRVLForConditionalGeneration(cfg)


#: Qwen3.5's rotation (Qwen4-Exp's too): interleaved sections on half of each head's 16 channels
QWEN3_5_ROPE = {
    "rope_type": "default",
    "mrope_section": [2, 1, 1],
    "mrope_interleaved": True,
    "partial_rotary_factor": 0.5,
    "rope_theta": 1e4,
}
#: Qwen3.5's / Qwen4-Exp's linear-attention layers (they take no positions)
LINEAR_ATTENTION = {
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 8,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
}


def _qwen3_5(moe: bool = False):
    text = dict(
        TEXT,
        head_dim=16,
        layer_types=["linear_attention", "full_attention"],  # positions reach the full-attention layer only
        **LINEAR_ATTENTION,
        rope_parameters=dict(QWEN3_5_ROPE),
    )
    if moe:
        text.update(moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts_per_tok=2, num_experts=4)
        cfg = transformers.Qwen3_5MoeConfig(text_config=text, vision_config=QWEN3_VISION, **QWEN_TOKENS)
        return transformers.Qwen3_5MoeForConditionalGeneration(cfg)
    cfg = transformers.Qwen3_5Config(text_config=text, vision_config=QWEN3_VISION, **QWEN_TOKENS)
    return transformers.Qwen3_5ForConditionalGeneration(cfg)


def _ernie4_5_vl_moe():
    text = dict(
        TEXT,
        moe_intermediate_size=[32, 32],
        moe_k=2,
        moe_num_experts=4,
        moe_num_shared_experts=1,
        # ordered h, w, t: 8 pairs, h and w alternating on the first 6, t on the last 2
        rope_parameters={"rope_type": "default", "mrope_section": [3, 3, 2], "rope_theta": 1e4},
    )
    vision = {
        "depth": 1,
        "hidden_size": 32,
        "num_heads": 2,
        "patch_size": 2,
        "spatial_merge_size": 2,
        "intermediate_size": 64,
        "temporal_merge_size": 2,
    }
    cfg = transformers.Ernie4_5_VLMoeConfig(text_config=text, vision_config=vision, **TOKENS)
    return transformers.Ernie4_5_VLMoeForConditionalGeneration(cfg)


def _cosmos3_edge():
    text = dict(
        TEXT, head_dim=16, rope_parameters={"rope_type": "default", "mrope_section": [4, 2, 2], "rope_theta": 1e4}
    )
    vision = dict(SIGLIP_VISION, num_patches=16)
    cfg = transformers.Cosmos3EdgeConfig(
        text_config=text, vision_config=vision, projector_hidden_size=64, **QWEN_TOKENS
    )
    return transformers.Cosmos3EdgeForConditionalGeneration(cfg)


def _cosmos3_omni():
    # its text and vision models are Qwen3-VL's (sub-configs read through AutoConfig)
    text = dict(
        TEXT,
        model_type="qwen3_vl_text",
        head_dim=16,
        rope_parameters={
            "rope_type": "default",
            "mrope_section": [4, 2, 2],
            "mrope_interleaved": True,
            "rope_theta": 1e4,
        },
    )
    cfg = transformers.Cosmos3OmniConfig(text_config=text, vision_config=QWEN3_VISION, **QWEN_TOKENS)
    return transformers.Cosmos3OmniForConditionalGeneration(cfg)


def _qwen4_exp():
    text = dict(
        TEXT,
        head_dim=16,
        layer_types=["linear_attention", "indexed_attention"],  # positions reach the indexed-attention layer only
        **LINEAR_ATTENTION,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        num_experts_per_tok=2,
        num_experts=4,
        hc_count=2,
        hc_lowrank=8,
        # the QSA indexer keeps 4 of the keys (blocks of 2): its selection depends on the rotation too
        indexer_n_heads=2,
        indexer_kv_heads=1,
        indexer_head_dim=8,
        indexer_budget=4,
        indexer_compress_ratio=2,
        rope_parameters=dict(QWEN3_5_ROPE),
    )
    cfg = transformers.Qwen4ExpConfig(text_config=text, vision_config=QWEN3_VISION, **QWEN_TOKENS)
    return transformers.Qwen4ExpForConditionalGeneration(cfg)


def _cohere_compass(nope: bool = False):
    """Two layer types with their own theta and interleaved sections (``rope_parameters[layer_type]``); ``nope``:
    the full-attention layers take no positions (``None``)."""
    sliding = {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [3, 3, 2]}
    full = None if nope else {"rope_type": "default", "rope_theta": 5e5, "mrope_section": [4, 2, 2]}
    text = dict(
        TEXT,
        sliding_window=8,  # the prompts are longer: the sliding layers see part of them
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"sliding_attention": sliding, "full_attention": full},
    )
    vision = dict(QWEN3_VISION, deepstack_visual_indexes=[0])
    cfg = transformers.CohereCompassConfig(text_config=text, vision_config=vision, **QWEN_TOKENS)
    return transformers.CohereCompassForConditionalGeneration(cfg)


#: model_type -> (tiny model, transformers class, the family's own scheme, pixel row shape)
FAMILIES = {
    "glm4v": (_glm4v, "Glm4vForConditionalGeneration", "qwen3-vl", (24,)),
    "glm4v_moe": (_glm4v_moe, "Glm4vMoeForConditionalGeneration", "qwen3-vl", (24,)),
    "glm46v": (_glm46v, "Glm46VForConditionalGeneration", "qwen3-vl", (24,)),
    "glm_ocr": (_glm_ocr, "GlmOcrForConditionalGeneration", "qwen3-vl", (24,)),
    "paddleocr_vl": (_paddleocr_vl, "PaddleOCRVLForConditionalGeneration", "qwen2-vl", (3, 2, 2)),
    "qwen3_5": (_qwen3_5, "Qwen3_5ForConditionalGeneration", "qwen3-vl", (24,)),
    "qwen3_5_moe": (lambda: _qwen3_5(moe=True), "Qwen3_5MoeForConditionalGeneration", "qwen3-vl", (24,)),
    "cosmos3_edge": (_cosmos3_edge, "Cosmos3EdgeForConditionalGeneration", "qwen3-vl", (12,)),
    "ernie4_5_vl_moe": (_ernie4_5_vl_moe, "Ernie4_5_VLMoeForConditionalGeneration", "qwen2-vl", (12,)),
    "cosmos3_omni": (_cosmos3_omni, "Cosmos3OmniForConditionalGeneration", "qwen3-vl", (24,)),
    "qwen4_exp": (_qwen4_exp, "Qwen4ExpForConditionalGeneration", "qwen3-vl", (24,)),
    "cohere_compass": (_cohere_compass, "CohereCompassForConditionalGeneration", "qwen3-vl", (24,)),
    "cohere_compass_nope": (
        lambda: _cohere_compass(nope=True),
        "CohereCompassForConditionalGeneration",
        "qwen3-vl",
        (24,),
    ),
}
#: families whose attention has no per-head rotation to hook (Qwen4-Exp's QSA indexer rotates keys by cos / sin)
NO_MHROPE = {"qwen4_exp"}


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request):
    name = request.param
    build, cls, _, _ = FAMILIES[name]
    if not hasattr(transformers, cls):
        pytest.skip(f"transformers {transformers.__version__} has no {name} (added in a later release)")
    torch.manual_seed(0)
    return name, build().eval()


def _batch(name):
    """Two left-padded prompts with an image each (4 x 6 and 4 x 4 patches: 6 and 4 tokens) between
    the family's image start / end tokens."""
    g = torch.Generator().manual_seed(1)
    first = [5, 6, ISTART] + [IMG] * 6 + [IEND, 7, 30, 9, 10]
    second = [11, ISTART] + [IMG] * 4 + [IEND, 12, 13]
    ids, mask = left_padded(first, second, PAD)
    batch = {
        "input_ids": ids,
        "attention_mask": mask,
        "pixel_values": torch.randn(24 + 16, *FAMILIES[name][3], generator=g),
        "image_grid_thw": torch.tensor([[1, 4, 6], [1, 4, 4]]),
    }
    if NEW:
        batch["mm_token_type_ids"] = (ids == IMG).long()
    return batch


SUPPRESS = [IMG, VID, ISTART, IEND, VSTART, VEND, 110, 111, 112]  # 110-112: the Omni audio tokens


def _generate(model, inputs, steps=3):
    return greedy(model, inputs, SUPPRESS, steps)


@torch.no_grad()
def test_own_scheme_through_mmpos_gives_the_model_logits(family):
    name, model = family
    # GLM-4V's positions are Qwen3-VL's; its own rotation is chunked M-RoPE
    assert_own_scheme_is_exact(model, _batch(name), FAMILIES[name][2], SUPPRESS)


SWAPS = [
    ("mrope-i", {}),
    ("mhrope", {"head_sections": [0, 1, 1]}),
    ("vrope", {}),
    ("v2pe", {"delta": 0.25}),
    ("hope", {"temporal_scale": 0.75}),
    ("videorope", {}),
    ("circlerope", {"radius": "auto"}),
    ("grape-i", {}),
    ("flat", {}),
]


#: the tiny configs' 4 rotary pairs: GRAPE's cycle over all pairs is Qwen3.5's own cyclic [2, 1, 1] (same positions)
#: (Cohere-Compass without RoPE in its full-attention layers: the sliding layers' [3, 3, 2] is that cycle)
SAME_AS_OWN = {
    ("qwen3_5", "grape-i"),
    ("qwen3_5_moe", "grape-i"),
    ("qwen4_exp", "grape-i"),
    ("cohere_compass_nope", "grape-i"),
}


@torch.no_grad()
@pytest.mark.parametrize("scheme, options", SWAPS, ids=[s for s, _ in SWAPS])
def test_swapped_scheme_forward_and_cached_generate(family, scheme, options):
    name, model = family
    inputs = _batch(name)
    use_rope(model, "own")
    ref = model(**inputs).logits
    if scheme == "mhrope" and name in NO_MHROPE:
        with pytest.raises(ValueError, match="mhrope"):
            use_rope(model, scheme, **options)
        assert current_rope(model) == "own" and torch.equal(model(**inputs).logits, ref)
        return
    use_rope(model, scheme, **options)
    logits = model(**inputs).logits
    assert torch.isfinite(logits).all()
    if (name, scheme) in SAME_AS_OWN:  # at 4 rotary pairs this plan is the model's own: t, h, w, t
        assert torch.equal(logits, ref)
    else:
        assert not torch.allclose(logits, ref)
    assert_cached_generate_is_a_full_forward(model, inputs, SUPPRESS)
    use_rope(model, "own")


@torch.no_grad()
def test_text_only_prompts_keep_the_model_logits(family):
    """On text every multi-axis scheme is 1-D RoPE on the rotated channels (partial, adjacent pairs)."""
    _, model = family
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11], [PAD, PAD, 3, 4, 5, 6, 7]])
    inputs = {"input_ids": ids, "attention_mask": (ids != PAD).long()}
    use_rope(model, "own")
    ref = model(**inputs).logits
    for scheme in ("mrope-i", "vrope", "grape", "flat"):
        use_rope(model, scheme)
        assert torch.equal(model(**inputs).logits, ref), scheme
    use_rope(model, "own")


#: the families tested with videos, and how their processors write one: "frames" (Qwen3-VL's: every frame a
#: block between the vision start / end tokens, a timestamp before it), "merged" (ERNIE-4.5-VL: one block between the
#: video start / end tokens, t merged by temporal_merge_size 2), "glm" (GLM-4V's: the frames image tokens between the
#: image start / end tokens, a timestamp after each, all between the video start / end tokens; its forward places
#: image and video features by the same image-token mask, so its batch holds videos only)
VIDEO_FAMILIES = {
    "glm4v": "glm",
    "glm4v_moe": "glm",
    "glm46v": "glm",
    "glm_ocr": "glm",
    "cosmos3_edge": "frames",
    "qwen3_5": "frames",
    "qwen3_5_moe": "frames",
    "cosmos3_omni": "frames",
    "qwen4_exp": "frames",
    "cohere_compass": "frames",
    "ernie4_5_vl_moe": "merged",
}


def _video_batch(name):
    """:func:`_batch` with a 4-frame 8 x 8-pixel video (grid (2, 4, 4): 2 x 4 tokens, 4 after ERNIE's temporal
    merge) after the first prompt's image and as the second prompt's only vision input."""
    g = torch.Generator().manual_seed(3)
    kind, row = VIDEO_FAMILIES[name], FAMILIES[name][3]
    image = [] if kind == "glm" else [(ISTART, 0)] + [(IMG, 1)] * 6 + [(IEND, 0)]  # (token, mm_token_type)
    if kind == "frames":
        frame = [(ISTART, 0)] + [(VID, 2)] * 4 + [(IEND, 0)]
        video = [(40, 0), *frame, (41, 0), *frame]
    elif kind == "glm":
        frame = [(ISTART, 0)] + [(IMG, 2)] * 4 + [(IEND, 0)]
        video = [(VSTART, 0), *frame, (40, 0), *frame, (41, 0), (VEND, 0)]
    else:
        video = [(VSTART, 0)] + [(VID, 2)] * 4 + [(VEND, 0)]
    first = [(5, 0), (6, 0), *image, (7, 0), *video, (30, 0), (9, 0), (10, 0)]
    second = [(11, 0), *video, (12, 0), (13, 0)]
    ids, mask = left_padded([t for t, _ in first], [t for t, _ in second], PAD)
    types, _ = left_padded([k for _, k in first], [k for _, k in second], 0)
    batch = {
        "input_ids": ids,
        "attention_mask": mask,
        "pixel_values_videos": torch.randn(2 * 32, *row, generator=g),  # 2 videos of 2 x 4 x 4 patches
        "video_grid_thw": torch.tensor([[2, 4, 4], [2, 4, 4]]),
    }
    if NEW:
        batch["mm_token_type_ids"] = types
    if image:
        batch.update(pixel_values=torch.randn(24, *row, generator=g), image_grid_thw=torch.tensor([[1, 4, 6]]))
    return batch


@torch.no_grad()
@pytest.mark.parametrize("name", list(VIDEO_FAMILIES))
def test_video_batches(name):
    """Videos (and an image) in a left-padded batch: the own scheme exact, swapped schemes' cached ``generate`` equal
    to a full forward."""
    build, cls, own, _ = FAMILIES[name]
    if not hasattr(transformers, cls):
        pytest.skip(f"transformers {transformers.__version__} has no {name} (added in a later release)")
    torch.manual_seed(0)
    model = build().eval()
    inputs = _video_batch(name)
    assert_own_scheme_is_exact(model, inputs, own, SUPPRESS)
    ref = model(**inputs).logits
    for scheme, options in (("videorope", {}), ("vrope", {}), ("hope", {"temporal_scale": 0.75})):
        use_rope(model, scheme, **options)
        assert not torch.allclose(model(**inputs).logits, ref), scheme
        assert_cached_generate_is_a_full_forward(model, inputs, SUPPRESS)
    use_rope(model, "own")


def _bfloat16(inputs):
    return {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in inputs.items()}


@torch.no_grad()
@pytest.mark.parametrize("name", list(FAMILIES))
def test_own_scheme_in_bfloat16(name, tmp_path):
    """In bfloat16 (the tiny model saved and loaded with ``from_pretrained(..., dtype=torch.bfloat16)``, which keeps
    the rotary's ``inv_freq`` float32, as mmpos keeps its plan): ``cos`` / ``sin`` in the dtype the model's own rotary
    returns (``x.dtype``; ERNIE-4.5-VL's float32, read by its float32 rotation)."""
    build, cls, own, _ = FAMILIES[name]
    if not hasattr(transformers, cls):
        pytest.skip(f"transformers {transformers.__version__} has no {name} (added in a later release)")
    torch.manual_seed(0)
    build().save_pretrained(tmp_path)
    model = getattr(transformers, cls).from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
    assert next(model.parameters()).dtype == torch.bfloat16
    assert_own_scheme_is_exact(model, _bfloat16(_batch(name)), own, SUPPRESS)


# ------------------------------------------------------------------------- the Omni thinkers (TMRoPE positions)
OMNI_TOKENS = {
    "audio_token_id": 110,
    "image_token_id": IMG,
    "video_token_id": VID,
    "vision_start_token_id": ISTART,
    "vision_end_token_id": IEND,
    "audio_start_token_id": 111,
    "audio_end_token_id": 112,
}


def _omni_text(section, **extra):
    """An Omni thinker's text config: ``rope_parameters`` (transformers >= 5.3) or ``rope_theta`` + ``rope_scaling``."""
    if NEW:
        rope = {"rope_type": "default", "mrope_section": section, "rope_theta": 1e4, **extra}
        return dict(TEXT, head_dim=16, rope_parameters=rope)
    rope = {"rope_type": "default", "type": "default", "mrope_section": section, **extra}
    return dict(TEXT, head_dim=16, rope_theta=1e4, rope_scaling=rope)


OMNI_AUDIO = {
    "num_mel_bins": 16,
    "encoder_layers": 1,
    "encoder_attention_heads": 2,
    "encoder_ffn_dim": 64,
    "d_model": 32,
    "output_dim": 64,
    "max_source_positions": 64,
}


def _omni_tokens(cfg_cls):
    """The token ids under the names the installed release's thinker config takes (``*_token_index`` in 4.57)."""
    names = inspect.signature(cfg_cls).parameters
    out = {}
    for name, value in OMNI_TOKENS.items():
        index = name.replace("_token_id", "_token_index")
        out[index if index in names and name not in names else name] = value
    return out


def _qwen2_5_omni():
    vision = dict(VISION, fullatt_block_indexes=[0], window_size=8)
    audio = dict(OMNI_AUDIO, n_window=4)
    cls = transformers.Qwen2_5OmniThinkerConfig
    cfg = cls(text_config=_omni_text([2, 3, 3]), vision_config=vision, audio_config=audio, **_omni_tokens(cls))
    return transformers.Qwen2_5OmniThinkerForConditionalGeneration(cfg)


def _qwen3_omni_moe():
    text = dict(
        _omni_text([4, 2, 2], mrope_interleaved=True),
        moe_intermediate_size=32,
        num_experts=4,
        num_experts_per_tok=2,
    )
    vision = dict(QWEN3_VISION, deepstack_visual_indexes=[0])
    audio = dict(OMNI_AUDIO, downsample_hidden_size=8, conv_chunksize=8)  # its default window, 100 features
    cls = transformers.Qwen3OmniMoeThinkerConfig
    cfg = cls(text_config=text, vision_config=vision, audio_config=audio, **_omni_tokens(cls))
    return transformers.Qwen3OmniMoeThinkerForConditionalGeneration(cfg)


#: model_type -> (tiny thinker, transformers class, the family's own scheme)
OMNI = {
    "qwen2_5_omni": (_qwen2_5_omni, "Qwen2_5OmniThinkerForConditionalGeneration", "qwen2.5-omni"),
    "qwen3_omni_moe": (_qwen3_omni_moe, "Qwen3OmniMoeThinkerForConditionalGeneration", "qwen3-omni"),
}


@pytest.fixture(scope="module", params=list(OMNI))
def omni(request):
    name = request.param
    build, cls, _ = OMNI[name]
    if not hasattr(transformers, cls):
        pytest.skip(f"transformers {transformers.__version__} has no {name} (added in a later release)")
    torch.manual_seed(0)
    return name, build().eval()


def _omni_batch():
    """Two left-padded prompts with an image each (as :func:`_batch`), Omni's processor layout (no token types)."""
    batch = _batch("glm4v")  # pixel rows of 2 x 2 x 2 x 3 values, as both thinkers take
    batch.pop("mm_token_type_ids", None)
    return batch


@torch.no_grad()
def test_omni_own_scheme_through_mmpos_gives_the_model_logits(omni):
    name, model = omni
    assert_own_scheme_is_exact(model, _omni_batch(), OMNI[name][2], SUPPRESS)


@torch.no_grad()
@pytest.mark.parametrize("name", list(OMNI))
def test_omni_own_scheme_in_bfloat16(name, tmp_path):
    """As :func:`test_own_scheme_in_bfloat16`, with an audio clip in each prompt."""
    build, cls, own = OMNI[name]
    if not hasattr(transformers, cls):
        pytest.skip(f"transformers {transformers.__version__} has no {name} (added in a later release)")
    torch.manual_seed(0)
    build().save_pretrained(tmp_path)
    model = getattr(transformers, cls).from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
    assert_own_scheme_is_exact(model, _bfloat16(_omni_audio_batch(model)), own, SUPPRESS)


OMNI_SWAPS = [
    ("mrope-i", {}),
    ("vrope", {}),
    ("mhrope", {"head_sections": [0, 1, 1]}),
    ("v2pe", {"delta": 0.25}),
    ("hope", {"temporal_scale": 0.75}),
]


@torch.no_grad()
@pytest.mark.parametrize("scheme, options", OMNI_SWAPS, ids=[s for s, _ in OMNI_SWAPS])
def test_omni_swapped_scheme_cached_generate(omni, scheme, options):
    _, model = omni
    assert_swap_is_consistent(model, _omni_batch(), scheme, options, SUPPRESS)


def test_omni_refuses_advance(omni):
    _, model = omni
    with pytest.raises(ValueError, match="advance applies to the Qwen-VL families"):
        use_rope(model, "mrope-i", advance="max")


def _omni_audio_batch(model):
    """:func:`_omni_batch` with an audio clip (100 mel frames) after the first prompt's image and before the second's:
    audio tokens sit on consecutive positions after the vision block (TMRoPE, 25 positions per second)."""
    from mmpos.integrations.hf_omni import audio_token_counts

    seqlens = torch.tensor([100, 100])
    n = int(audio_token_counts(model.config, seqlens)[0])
    audio = [111] + [110] * n + [112]
    first = [5, 6, ISTART] + [IMG] * 6 + [IEND, 7, *audio, 30, 9, 10]
    second = [11, *audio, ISTART] + [IMG] * 4 + [IEND, 12, 13]
    ids, mask = left_padded(first, second, PAD)
    g = torch.Generator().manual_seed(2)
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "pixel_values": torch.randn(40, 24, generator=g),
        "image_grid_thw": torch.tensor([[1, 4, 6], [1, 4, 4]]),
        "input_features": torch.randn(2, 16, 100, generator=g),
        "feature_attention_mask": torch.ones(2, 100, dtype=torch.long),
    }


@torch.no_grad()
def test_omni_audio_prompts(omni):
    """With audio in the prompts: the own scheme is exact (forward and generate), a swapped scheme's cached
    ``generate`` equals a full forward."""
    name, model = omni
    inputs = _omni_audio_batch(model)
    use_rope(model, "own")
    ref = model(**inputs).logits
    ref_seq, ref_steps = _generate(model, inputs)
    use_rope(model, OMNI[name][2])
    assert torch.equal(model(**inputs).logits, ref)
    seq, steps = _generate(model, inputs)
    assert torch.equal(seq, ref_seq) and torch.equal(steps, ref_steps)
    use_rope(model, "vrope")
    assert not torch.allclose(model(**inputs).logits, ref)
    assert_cached_generate_is_a_full_forward(model, inputs, SUPPRESS)
    use_rope(model, "own")


def _omni_av_batch(name, model):
    """Two left-padded prompts, each a 4-frame 8 x 8-pixel video (grid (2, 4, 4), 0.5 s per grid: 2 frames of 4
    tokens) with its audio (100 mel frames), ``use_audio_in_video=True``: the video and audio tokens in the
    processor's order (Qwen2.5-Omni: both frames then the audio, all in the first 2-s chunk; Qwen3-Omni: by time,
    the audio between the two frames)."""
    from mmpos.integrations.hf_omni import audio_token_counts

    n = int(audio_token_counts(model.config, torch.tensor([100]))[0])
    body = [VID] * 8 + [110] * n if name == "qwen2_5_omni" else [VID] * 4 + [110] * n + [VID] * 4
    video = [ISTART, 111, *body, 112, IEND]
    ids, mask = left_padded([5, 6, *video, 7, 8], [9, *video, 10], PAD)
    g = torch.Generator().manual_seed(4)
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "pixel_values_videos": torch.randn(2 * 32, 24, generator=g),
        "video_grid_thw": torch.tensor([[2, 4, 4], [2, 4, 4]]),
        "video_second_per_grid": torch.tensor([0.5, 0.5]),
        "input_features": torch.randn(2, 16, 100, generator=g),
        "feature_attention_mask": torch.ones(2, 100, dtype=torch.long),
        "use_audio_in_video": True,
    }


@torch.no_grad()
def test_omni_videos_with_their_audio(omni):
    """``use_audio_in_video=True``: the own scheme exact (forward and ``generate``). A non-Omni scheme has no rule for
    a block that interleaves a video's tokens with its audio's (no reference defines one; ``mmpos.layout.pack`` places
    audio-visual blocks by the Omni schemes only): a ``ValueError`` at the forward saying why and what to pass."""
    name, model = omni
    inputs = _omni_av_batch(name, model)
    assert_own_scheme_is_exact(model, inputs, OMNI[name][2], SUPPRESS)
    for scheme in ("mrope-i", "vrope"):
        use_rope(model, scheme)
        with pytest.raises(ValueError, match=rf"use_audio_in_video=True under scheme '{scheme}': .* only the Omni "
                           r"schemes .* Pass use_audio_in_video=False .* or keep the model's own scheme"):  # fmt: skip
            model(**inputs)
    use_rope(model, "own")
