"""``use_rope`` on MiniCPM-V 4.7 (its own scheme only): its canvas positions from
:func:`mmpos.integrations.hf_families.minicpmv4_7_rope_index` (the model's ``target_sizes``), the rotation mmpos's
interleaved M-RoPE on its Qwen3.5 backbone's partial rotary: the unpatched logits and greedy ``generate`` bit for
bit. The prompts carry ``target_sizes`` and ``mm_token_type_ids`` without pixels (the positions need no vision
features; the image tokens enter as their embeddings). Another scheme: ``test_hf_rope_swap_minicpm.py``. Tiny
random config; transformers 4.57.1 lacks MiniCPM-V 4.7 (skipped)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from _tiny_hf import TEXT, assert_own_scheme_is_exact, assert_own_scheme_is_exact_in_bfloat16, left_padded

from mmpos.integrations.hf_rope import current_rope, use_rope

pytestmark = pytest.mark.hf
IDS = {
    "image_token_id": 120,
    "video_token_id": 121,
    "image_start_id": 122,
    "image_end_id": 123,
    "slice_start_id": 124,
    "slice_end_id": 125,
    "newline_id": 126,
}
SUPPRESS = list(IDS.values())


def _build():
    """The tiny random model (float32), seeded."""
    if not hasattr(transformers, "MiniCPMV4_7ForConditionalGeneration"):
        pytest.skip(f"transformers {transformers.__version__} has no minicpmv4_7 (added in a later release)")
    text = dict(
        TEXT,
        model_type="qwen3_5_text",
        head_dim=16,
        layer_types=["linear_attention", "full_attention"],
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        rope_parameters={
            "rope_type": "default",
            "mrope_section": [2, 1, 1],
            "mrope_interleaved": True,
            "partial_rotary_factor": 0.5,
            "rope_theta": 1e4,
        },
    )
    vision = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "image_size": 16,
        "patch_size": 2,
        "insert_layer_id": 0,
    }
    cfg = transformers.MiniCPMV4_7Config(text_config=text, vision_config=vision, insert_layer_id=0, **IDS)
    torch.manual_seed(0)
    return transformers.MiniCPMV4_7ForConditionalGeneration(cfg).eval()


@pytest.fixture(scope="module")
def minicpm():
    return _build()


def _canvas_batch():
    """Two left-padded prompts: a picture of a 2 x 2-token thumbnail and a row of two 1 x 1-token slices ("16x": a
    token merges 4 x 4 patches), and a thumbnail alone."""
    c = IDS
    thumbnail = [c["image_start_id"]] + [c["image_token_id"]] * 4 + [c["image_end_id"]]
    slices = [c["slice_start_id"], c["image_token_id"], c["slice_end_id"]] * 2
    ids, mask = left_padded([5, 6, *thumbnail, *slices, 7, 8], [9, *thumbnail, 10])
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "mm_token_type_ids": (ids == c["image_token_id"]).long(),
        "target_sizes": torch.tensor([[8, 8], [4, 4], [4, 4], [8, 8]]),  # (h, w) in patches per crop
    }


@torch.no_grad()
def test_own_scheme_gives_the_model_logits(minicpm):
    inputs = _canvas_batch()
    flat = minicpm(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits
    assert not torch.allclose(minicpm(**inputs).logits, flat)  # the canvas positions reach the logits
    assert_own_scheme_is_exact(minicpm, inputs, "minicpm-v", SUPPRESS)


def test_advance_is_refused_on_the_own_scheme(minicpm):
    """The own scheme has one rule; ``advance`` chooses another scheme's (``test_hf_rope_swap_minicpm.py``)."""
    with pytest.raises(ValueError, match="advance applies to another scheme's blocks, not to model_type 'minicpmv4_7'"):
        use_rope(minicpm, "minicpm-v", advance="max")
    assert current_rope(minicpm) == "own"


@torch.no_grad()
def test_own_scheme_in_bfloat16(tmp_path):
    """In bfloat16 (saved and loaded with ``from_pretrained(..., dtype=torch.bfloat16)``): still bit for bit."""
    assert_own_scheme_is_exact_in_bfloat16(_build, _canvas_batch(), "minicpm-v", SUPPRESS, tmp_path)
