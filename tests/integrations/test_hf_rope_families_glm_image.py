"""``use_rope`` on GLM-Image (its own scheme only): the prompt's positions from
:func:`mmpos.integrations.hf_rope_index.get_rope_index`, the generated images' positions written where the model's
decoding reads them (``_cached_decode_position_ids``, from ``hf_families.glm_image_decode_position_ids``), the
rotation mmpos's chunked M-RoPE on its partial rotary: the unpatched logits and a text-to-image greedy ``generate``
bit for bit. Another scheme: ``test_hf_rope_swap_glm_image.py``. Tiny random config; transformers 4.57.1 lacks GLM-Image (skipped)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from _tiny_hf import TEXT, assert_own_scheme_is_exact, assert_own_scheme_is_exact_in_bfloat16, left_padded

from mmpos.integrations.hf_rope import current_rope, use_rope

pytestmark = pytest.mark.hf
IMG, START, END = 120, 121, 122


def _build():
    """The tiny random model (float32), seeded."""
    if not hasattr(transformers, "GlmImageForConditionalGeneration"):
        pytest.skip(f"transformers {transformers.__version__} has no glm_image (added in a later release)")
    text = dict(
        TEXT,
        pad_token_id=0,
        eos_token_id=2,
        vision_vocab_size=64,
        # 16-channel heads, half rotated: 4 pairs in chunked sections t, h, w = 2, 1, 1
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 1e4,
            "mrope_section": [2, 1, 1],
            "partial_rotary_factor": 0.5,
        },
    )
    vision = {"depth": 1, "hidden_size": 32, "num_heads": 2, "image_size": 16, "patch_size": 2, "intermediate_size": 64}
    vq = {"embed_dim": 16, "num_embeddings": 64, "latent_channels": 32, "in_channels": 3}
    cfg = transformers.GlmImageConfig(
        text_config=text,
        vision_config=vision,
        vq_config=vq,
        image_token_id=IMG,
        image_start_token_id=START,
        image_end_token_id=END,
    )
    torch.manual_seed(0)
    return transformers.GlmImageForConditionalGeneration(cfg).eval()


@pytest.fixture(scope="module")
def glm_image():
    return _build()


def _text_to_image():
    """Two left-padded prompts, each ending with an image start token; each generates one image (a 2 x 3 and a 2 x 2
    grid of tokens: ``images_per_sample`` counts the grids, none of them complete in the prompt)."""
    ids, mask = left_padded([5, 6, 7, 8, START], [9, 10, START])
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "image_grid_thw": torch.tensor([[1, 2, 3], [1, 2, 2]]),
        "images_per_sample": torch.tensor([1, 1]),
    }


@torch.no_grad()
def test_own_scheme_gives_the_model_logits_and_generated_image_tokens(glm_image):
    """5 generated tokens: the first image's 6 positions ``(p, p + i, p + j)``, the second's 4 and its end marker."""
    assert_own_scheme_is_exact(glm_image, _text_to_image(), "glm-image", [IMG, START, END])


@torch.no_grad()
def test_decoding_reads_the_positions_mmpos_writes(glm_image):
    """With the decode positions dropped (as if the patched index did not write them), ``generate`` changes: the
    test above holds because mmpos writes them, not because the model's own run left them behind."""
    from mmpos.integrations import hf_families, hf_rope

    inputs = _text_to_image()
    use_rope(glm_image, "glm-image")
    out = glm_image.generate(
        **inputs, max_new_tokens=5, do_sample=False, output_logits=True, return_dict_in_generate=True
    )
    old = hf_rope.glm_image_decode_position_ids
    hf_rope.glm_image_decode_position_ids = lambda config, ids, grids, *a: torch.zeros_like(old(config, ids, grids, *a))
    try:
        use_rope(glm_image, "glm-image")
        bad = glm_image.generate(
            **inputs, max_new_tokens=5, do_sample=False, output_logits=True, return_dict_in_generate=True
        )
        assert not torch.equal(torch.stack(bad.logits, 1), torch.stack(out.logits, 1))
    finally:
        hf_rope.glm_image_decode_position_ids = old
        use_rope(glm_image, "own")
    assert hf_families.glm_image_decode_position_ids is old


def test_advance_is_refused_on_the_own_scheme(glm_image):
    """The own scheme has one rule; ``advance`` chooses another scheme's (``test_hf_rope_swap_glm_image.py``)."""
    with pytest.raises(ValueError, match="advance applies to another scheme's blocks, not to model_type 'glm_image'"):
        use_rope(glm_image, "glm-image", advance="max")
    assert current_rope(glm_image) == "own"


@torch.no_grad()
def test_own_scheme_in_bfloat16(tmp_path):
    """In bfloat16 (saved and loaded with ``from_pretrained(..., dtype=torch.bfloat16)``): still bit for bit."""
    assert_own_scheme_is_exact_in_bfloat16(_build, _text_to_image(), "glm-image", [IMG, START, END], tmp_path)
