"""``use_rope`` on GLM-Image with another scheme: the prompt's source images are vision blocks placed by the scheme's
rule, and so is the image it generates: its grid, then its end token, packed right after the prompt
(``hf_families.glm_image_blocks``), written where the model's decoding reads them (``_cached_decode_position_ids``).
The generated image's positions are those the same scheme gives that image once it stands complete in a prompt
(the model's own prompt path: between its start and end tokens); the cached greedy ``generate`` equals one forward
over the generated sequence at the prompt's and the generated tokens' positions; ``"own"`` restores the model.
Tiny random config (:mod:`test_hf_rope_families_glm_image`); transformers 4.57.1 lacks GLM-Image (skipped)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

import test_hf_rope_families_glm_image as fam
from _tiny_hf import BLOCK_SWAPS, greedy, left_padded

from mmpos.integrations import hf_rope
from mmpos.integrations.hf_families import glm_image_decode_position_ids
from mmpos.integrations.hf_rope import current_rope, use_rope

pytestmark = pytest.mark.hf
IMG, START, END = fam.IMG, fam.START, fam.END
SUPPRESS = [IMG, START, END]
#: each sample generates one image of this grid (t, h, w) in tokens
TARGET = [(1, 2, 3), (1, 2, 2)]
#: GRAPE's canonical planes, chunked by the model's own sections, on Qwen2-VL's positions (``get_mrope_index``): on
#: GLM-Image (images of one frame, the text after a block at its start + max(h, w)) that is the model's own scheme --
#: the same positions of the prompt and of the generated image, the same rotation: the same logits, bit for bit
SAME_AS_OWN = {"grape"}


@pytest.fixture(scope="module")
def glm_image():
    return fam._build()


def _prompts(complete: bool = False):
    """Two left-padded image-to-image prompts: a source image (1 x 2 and 2 x 2 tokens) between its start and end
    tokens, text, then the start of the image to generate (``images_per_sample`` 2 each: the source, the target).
    ``complete``: the target image written out too (placeholder tokens and its end token), as if in the prompt."""
    rows = []
    for (_, sh, sw), (_, th, tw) in zip([(1, 1, 2), (1, 2, 2)], TARGET):
        row = [5, 6, START, *[IMG] * (sh * sw), END, 7, START]
        rows.append(row + ([IMG] * (th * tw) + [END] if complete else []))
    ids, mask = left_padded(rows[0], [9, *rows[1]])
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "image_grid_thw": torch.tensor([[1, 1, 2], [1, *TARGET[0][1:]], [1, 2, 2], [1, *TARGET[1][1:]]]),
        "images_per_sample": torch.tensor([2, 2]),
    }


def _positions(model, inputs):
    """The patched index's prompt positions ``(3, B, L)`` and the generated image's ``(B, 3, D)``."""
    ids, _ = model.model.get_rope_index(
        inputs["input_ids"], inputs["image_grid_thw"], inputs["images_per_sample"], inputs["attention_mask"]
    )
    return ids, model.model._cached_decode_position_ids


@torch.no_grad()
@pytest.mark.parametrize("scheme, options", BLOCK_SWAPS, ids=[s for s, _ in BLOCK_SWAPS])
def test_the_generated_image_is_placed_as_a_prompt_image_would_be(glm_image, scheme, options):
    """The decode positions of the image being generated equal the scheme's positions of the same image written out
    complete in the prompt (found there by the model's own start / end tokens, as a source image)."""
    use_rope(glm_image, scheme, **options)
    try:
        prompt, decode = _positions(glm_image, _prompts())
        written, _ = _positions(glm_image, _prompts(complete=True))
        inputs = _prompts()
        for b, (_, h, w) in enumerate(TARGET):
            mask = inputs["attention_mask"][b].bool()
            got = torch.cat([prompt[:, b, mask], decode[b, :, : h * w + 1]], 1)
            full = _prompts(complete=True)["attention_mask"][b].bool()
            torch.testing.assert_close(got.to(written.dtype), written[:, b, full], rtol=0, atol=0)
            assert (decode[b, :, h * w + 1 :] == decode[b, :, h * w, None]).all()  # past its D: its end token's
    finally:
        use_rope(glm_image, "own")


@torch.no_grad()
@pytest.mark.parametrize("scheme, options", BLOCK_SWAPS, ids=[s for s, _ in BLOCK_SWAPS])
def test_cached_generate_equals_a_full_forward(glm_image, scheme, options):
    """The swapped prompt logits move (its source images are placed by the scheme); a cached greedy ``generate``
    (3 tokens of the image) gives the logits of one forward over the generated sequence at the prompt's positions
    followed by the generated image's (to 1e-4: the cache changes the order of float sums); ``"own"`` restores."""
    inputs = _prompts()
    use_rope(glm_image, "own")
    ref = glm_image(**inputs).logits
    use_rope(glm_image, scheme, **options)
    assert current_rope(glm_image) == scheme
    logits = glm_image(**inputs).logits
    if scheme in SAME_AS_OWN:
        assert torch.equal(logits, ref)
    else:
        assert torch.isfinite(logits).all() and not torch.allclose(logits, ref)
    seq, steps = greedy(glm_image, inputs, SUPPRESS)
    prompt, decode = _positions(glm_image, inputs)
    position_ids = torch.cat([prompt, decode[:, :, :3].permute(1, 0, 2).to(prompt.dtype)], 2)  # (3, B, L + 3)
    b = seq.shape[0]
    mask = torch.cat([inputs["attention_mask"], torch.ones(b, 3, dtype=torch.long)], 1)
    glm_image.model.rope_deltas = None
    full = glm_image(**dict(inputs, input_ids=seq, attention_mask=mask), position_ids=position_ids).logits
    torch.testing.assert_close(full[:, -4:-1], steps, rtol=1e-4, atol=1e-4)
    use_rope(glm_image, "own")
    assert torch.equal(glm_image(**inputs).logits, ref)


@torch.no_grad()
def test_decoding_reads_the_swapped_positions(glm_image):
    """Mutation check: with the own scheme's decode positions in place of the swapped scheme's (as if the swap left
    the generated image alone), the generated logits change; VRoPE's decode positions are not the own's."""
    inputs = _prompts()
    use_rope(glm_image, "vrope")
    try:
        _, steps = greedy(glm_image, inputs, SUPPRESS)
        _, decode = _positions(glm_image, inputs)
        own = glm_image_decode_position_ids(glm_image.config, *(inputs[k] for k in ("input_ids", "image_grid_thw",
                                            "images_per_sample", "attention_mask")))  # fmt: skip
        assert not torch.equal(decode.to(own.dtype), own)
        old = hf_rope._GlmImageIndex._scheme_positions
        hf_rope._GlmImageIndex._scheme_positions = lambda self, ids, *a: (old(self, ids, *a)[0], own)
        try:
            _, unswapped = greedy(glm_image, inputs, SUPPRESS)
        finally:
            hf_rope._GlmImageIndex._scheme_positions = old
        assert not torch.allclose(unswapped, steps)
    finally:
        use_rope(glm_image, "own")


@torch.no_grad()
def test_grape_decodes_the_generated_image_by_its_planes(glm_image):
    """Cyclic GRAPE (``grape-i``) places the images as the model does (the positions of the prompt and of the
    generated image are the own's) and rotates them by other planes: the decoding steps' logits differ from the
    model's own; chunked ``grape`` (the own plan, :data:`SAME_AS_OWN`) gives the own's bit for bit."""
    inputs = _prompts()
    use_rope(glm_image, "own")
    own_prompt, own_decode = _positions(glm_image, inputs)
    _, own = greedy(glm_image, inputs, SUPPRESS)
    try:
        use_rope(glm_image, "grape-i")
        prompt, decode = _positions(glm_image, inputs)
        assert torch.equal(prompt.to(own_prompt.dtype), own_prompt) and torch.equal(
            decode.to(own_decode.dtype), own_decode
        )
        _, cyclic = greedy(glm_image, inputs, SUPPRESS)
        assert torch.isfinite(cyclic).all() and not torch.allclose(cyclic, own)
        use_rope(glm_image, "grape")
        _, chunked = greedy(glm_image, inputs, SUPPRESS)
        assert torch.equal(chunked, own)
    finally:
        use_rope(glm_image, "own")


def test_text_to_image_under_another_scheme(glm_image):
    """No source image: the prompt is text (1-D under every scheme), the generated images alone are blocks."""
    inputs = fam._text_to_image()
    use_rope(glm_image, "circlerope")
    try:
        prompt, decode = _positions(glm_image, inputs)
        own = glm_image_decode_position_ids(glm_image.config, *(inputs[k] for k in ("input_ids", "image_grid_thw",
                                            "images_per_sample", "attention_mask")))  # fmt: skip
        assert decode.shape == own.shape and not torch.equal(decode.to(own.dtype), own)
        real = inputs["attention_mask"].bool()
        text = (inputs["attention_mask"].cumsum(1) - 1)[real]  # each real token's index: 1-D
        assert (prompt[:, real] == text).all()
        _, steps = greedy(glm_image, inputs, SUPPRESS)
        assert torch.isfinite(steps).all()
    finally:
        use_rope(glm_image, "own")


@torch.no_grad()
def test_two_generated_images_follow_each_other(glm_image):
    """A prompt that generates two images (``images_per_sample`` counts both, none complete in the prompt): as the
    model's own rule, the last grid first, then the other, then the end token, here as blocks of the scheme packed
    one after the other after the prompt (compared with :func:`mmpos.layout.pack` of that sequence)."""
    from mmpos.layout import VisionBlocks, pack
    from mmpos.schemes import RULES, Rule, get_scheme, resolve_options

    model = glm_image
    ids = torch.tensor([[5, 6, 7, START]])
    grids = torch.tensor([[1, 2, 2], [1, 3, 2]])  # generated: the 3 x 2 grid first, then the 2 x 2 one
    use_rope(model, "vrope")
    ids_3d, _ = model.model.get_rope_index(ids, grids, torch.tensor([2]), torch.ones_like(ids))
    decode = model.model._cached_decode_position_ids  # (1, 3, 6 + 4 + 1)
    base = RULES["hf-4.57"]  # GLM-Image's get_rope_index takes no mm_token_type_ids: the 4.57 conventions
    rule = Rule(f"{base.name}+max", "max", base.seconds, base.padding_value, base.deltas)
    sch = get_scheme("vrope")
    blocks = VisionBlocks(torch.tensor([[1, 3, 2], [1, 2, 2]]), torch.tensor([4, 10]))
    want = pack(torch.ones(1, 15, dtype=torch.bool), blocks, sch, resolve_options(sch, rule=rule)).hf_position_ids("3d")
    assert decode.shape == (1, 3, 11)
    assert torch.equal(torch.cat([ids_3d, decode.permute(1, 0, 2)], 2).to(want.dtype), want)
    use_rope(model, "own")
