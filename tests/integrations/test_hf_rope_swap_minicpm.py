"""``use_rope`` on MiniCPM-V 4.7 with another scheme: every crop of the prompt (a picture's thumbnail and its slices,
a video frame) is a vision block of its own grid (``hf_families.minicpmv4_7_blocks``, from ``target_sizes`` /
``target_sizes_videos``), placed by the scheme's rule; the markers and newlines are text. The patched
``get_rope_index`` gives the scheme's packing of those blocks, the logits move, a cached greedy ``generate`` equals
one forward over the generated sequence, and ``"own"`` restores the model. Tiny random config
(:mod:`test_hf_rope_families_minicpm`); transformers 4.57.1 lacks MiniCPM-V 4.7 (skipped)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

import test_hf_rope_families_minicpm as fam
from _tiny_hf import BLOCK_SWAPS, assert_swap_is_consistent, left_padded

from mmpos.integrations import hf_families
from mmpos.integrations.hf_rope import current_rope, use_rope
from mmpos.layout import VisionBlocks, pack
from mmpos.schemes import RULES, Rule, get_scheme, resolve_options

pytestmark = pytest.mark.hf
IDS = fam.IDS


@pytest.fixture(scope="module")
def minicpm():
    return fam._build()


def _video_batch():
    """Two left-padded prompts: two video frames (1 x 2 and 2 x 1 tokens, the markers between them) after text, and
    a picture (a 1 x 1-token thumbnail and one 1 x 2-token slice) with text on both sides."""
    c = IDS
    frame = lambda n: [c["image_start_id"]] + [c["video_token_id"]] * n + [c["image_end_id"]]
    picture = [c["image_start_id"], c["image_token_id"], c["image_end_id"]]
    picture += [c["slice_start_id"], c["image_token_id"], c["image_token_id"], c["slice_end_id"]]
    ids, mask = left_padded([5, 6, *frame(2), *frame(2), 7], [8, *picture, 9, 10])
    types = (ids == c["image_token_id"]).long() + 2 * (ids == c["video_token_id"]).long()
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "mm_token_type_ids": types,
        "target_sizes": torch.tensor([[4, 4], [4, 8]]),  # (h, w) in patches ("16x": 4 x 4 patches a token)
        "target_sizes_videos": torch.tensor([[4, 8], [8, 4]]),
    }


BATCHES = {"slices": fam._canvas_batch, "videos": _video_batch}


def _expected(scheme: str, options: dict, inputs: dict) -> torch.Tensor:
    """The scheme's packing of the crops, each a block of its grid (found here from the token types, independently
    of ``minicpmv4_7_blocks``): ``(3, B, L)``."""
    types, mask = inputs["mm_token_type_ids"].numpy(), inputs["attention_mask"].numpy() == 1
    tables = {1: inputs.get("target_sizes"), 2: inputs.get("target_sizes_videos")}
    grids, firsts, image = [], [], []
    used = {1: 0, 2: 0}
    flat = types.reshape(-1)
    for at in range(flat.shape[0]):  # the crops in reading order: a run of one non-zero type
        kind = int(flat[at])
        if kind and (at % types.shape[1] == 0 or flat[at - 1] != kind):
            h, w = (tables[kind][used[kind]] // 4).tolist()
            used[kind] += 1
            grids.append((1, h, w))
            firsts.append(at)
            image.append(kind == 1)
    blocks = VisionBlocks(np.array(grids), np.array(firsts), np.zeros(len(grids), np.float32), np.array(image))
    base = RULES["hf-5.3"]  # the installed rule's conventions, another scheme's own advance ("max")
    rule = Rule(f"{base.name}+max", "max", base.seconds, base.padding_value, base.deltas)
    sch = get_scheme(scheme)
    layout_options = {k: v for k, v in options.items() if k != "head_sections"}  # MHRoPE's: the rotation's
    return pack(mask, blocks, sch, resolve_options(sch, rule=rule, **layout_options)).hf_position_ids("3d")


@torch.no_grad()
@pytest.mark.parametrize("batch", list(BATCHES))
@pytest.mark.parametrize("scheme, options", BLOCK_SWAPS, ids=[s for s, _ in BLOCK_SWAPS])
def test_swapped_scheme_places_the_crops_and_generates_consistently(minicpm, batch, scheme, options):
    inputs = BATCHES[batch]()
    use_rope(minicpm, scheme, **options)
    assert current_rope(minicpm) == scheme
    ids = minicpm.model.get_rope_index(**inputs)[0]
    want = _expected(scheme, options, inputs)
    real = inputs["attention_mask"].bool()
    assert torch.equal(ids.to(want.dtype)[:, real], want[:, real])
    own = hf_families.minicpmv4_7_rope_index(minicpm.config, inputs["input_ids"], inputs["mm_token_type_ids"],
                                             inputs.get("target_sizes"), inputs.get("target_sizes_videos"),
                                             None, inputs["attention_mask"])[0]  # fmt: skip
    assert not torch.equal(ids.to(own.dtype)[:, real], own[:, real])  # not the canvas: the swap placed the blocks
    assert_swap_is_consistent(minicpm, inputs, scheme, options, fam.SUPPRESS)
    assert current_rope(minicpm) == "own"


@torch.no_grad()
@pytest.mark.parametrize("scheme", ["vrope", "grape", "grape-i"])
def test_the_swap_reaches_the_positions(minicpm, scheme):
    """Mutation check: with the patched index's blocks dropped (every crop read as text), the swapped logits
    change -- the consistency above holds on the crops' positions, not on a scheme that ignores them."""
    from mmpos.integrations import hf_rope

    inputs = fam._canvas_batch()
    use_rope(minicpm, scheme)
    ref = minicpm(**inputs).logits
    old = hf_rope.minicpmv4_7_blocks
    as_text = lambda *a: (old(*a)[0], VisionBlocks(np.zeros((0, 3), np.int64), np.zeros(0, np.int64)))
    hf_rope.minicpmv4_7_blocks = as_text
    try:
        minicpm.model.rope_deltas = None
        assert not torch.allclose(minicpm(**inputs).logits, ref)
    finally:
        hf_rope.minicpmv4_7_blocks = old
        use_rope(minicpm, "own")


def test_a_crop_without_its_size_is_refused(minicpm):
    inputs = _video_batch()
    inputs["target_sizes_videos"] = inputs["target_sizes_videos"][:1]
    use_rope(minicpm, "vrope")
    try:
        with pytest.raises(ValueError, match="target_sizes_videos holds too few crops"):
            minicpm(**inputs)
    finally:
        use_rope(minicpm, "own")
