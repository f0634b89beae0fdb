"""Every multi-axis RoPE family of the installed transformers that the scheme registry serves:
:func:`mmpos.integrations.hf_rope_index.get_rope_index` (from ``mm_token_type_ids`` and from the
placeholder token ids) and :func:`mmpos.layout.build` equal the family's own ``get_rope_index`` on
random batches (images, videos split into timestamped frames where the family does, several
images per sample, padding left and right). A family the installed release lacks is skipped,
with the reason; the reference is always the installed release's own code."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

transformers = pytest.importorskip("transformers")

from _hf_samples import qwen_family, qwen_reference

from mmpos import layout
from mmpos.integrations.hf_families import FAMILY_ROPE_INDEX, video_markers
from mmpos.integrations.hf_rope_index import get_rope_index, installed_rule, scheme_for_config
from mmpos.schemes import SCHEMES, model_types

pytestmark = pytest.mark.hf
RULE = installed_rule()
# the families served through the Qwen-VL rules (Scheme.model_types); the Qwen families have their own test file
# (and the families with their own token layouts, tests/integrations/test_hf_families_more.py; the Omni
# families with audio, tests/integrations/test_hf_omni.py)
FAMILIES = sorted(
    m
    for m, s in model_types().items()
    if not m.startswith(("qwen2_vl", "qwen2_5_vl", "qwen3_vl")) and m not in FAMILY_ROPE_INDEX and not SCHEMES[s].audio
)


def _random_batch(rng: random.Random, config, frames: bool, temporal_merge: int, batch: int, padding_side: str):
    """Random interleavings of text, images and videos, tokenised as the family's processor does
    (videos as timestamped one-frame blocks where ``frames``; GLM-4V: a frame's tokens are image
    tokens, the video between its start and end tokens); returns the batch and its segments."""
    image_id, video_id = config.image_token_id, config.video_token_id
    markers = video_markers(config)
    if markers is not None:
        video_id = image_id  # GLM-4V's create_mm_token_type_ids: image tokens inside the markers are video (2)
    text_ids = [i for i in range(10, 1000) if i not in (image_id, video_id)]
    rows, kinds_rows, samples, images, videos = [], [], [], [], []
    for _ in range(batch):
        ids, kinds, segs = [], [], []

        def text(n, ids=ids, kinds=kinds, segs=segs):
            ids.extend(rng.choice(text_ids) for _ in range(n))
            kinds.extend([0] * n)
            segs.append(layout.Text(n))

        def vision(token, kind, n, seg, ids=ids, kinds=kinds, segs=segs):
            ids.extend([token] * n)
            kinds.extend([kind] * n)
            segs.append(seg)

        text(rng.randint(1, 3))
        for _ in range(rng.randint(0, 4)):
            h, w = 2 * rng.randint(1, 4), 2 * rng.randint(1, 4)
            if rng.random() < 0.5:
                images.append((1, h, w))
                vision(image_id, 1, h * w // 4, layout.Image((1, h, w)))
            else:
                t = temporal_merge * rng.randint(1, 3)
                videos.append((t, h, w))
                if frames:  # per-frame blocks separated by timestamp text
                    if markers is not None:
                        ids.append(markers[0])
                        kinds.append(0)
                        segs.append(layout.Text(1))
                    for _ in range(t):
                        text(rng.randint(1, 3))
                        vision(video_id, 2, h * w // 4, layout.Video((1, h, w)))
                    if markers is not None:
                        ids.append(markers[1])
                        kinds.append(0)
                        segs.append(layout.Text(1))
                else:
                    tokens = t // temporal_merge
                    vision(video_id, 2, tokens * h * w // 4, layout.Video((tokens, h, w)))
            text(rng.randint(1, 4))
        rows.append(ids)
        kinds_rows.append(kinds)
        samples.append(segs)
    length = max(map(len, rows))
    input_ids = torch.zeros(batch, length, dtype=torch.long)
    mm_types = torch.zeros(batch, length, dtype=torch.long)
    mask = torch.zeros(batch, length, dtype=torch.long)
    for i, (r, k) in enumerate(zip(rows, kinds_rows)):
        cols = slice(0, len(r)) if padding_side == "right" else slice(length - len(r), length)
        input_ids[i, cols], mm_types[i, cols], mask[i, cols] = torch.tensor(r), torch.tensor(k), 1
    grid = lambda g: torch.tensor(g, dtype=torch.long).view(-1, 3) if g else None
    return input_ids, mm_types, mask, grid(images), grid(videos), samples


@pytest.mark.parametrize("model_type", FAMILIES)
@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_family_position_ids_equal_the_installed_get_rope_index(model_type, padding_side):
    config, model_cls = qwen_family(model_type)
    scheme = scheme_for_config(config)
    frames = SCHEMES[scheme].frames
    temporal_merge = getattr(config.vision_config, "temporal_merge_size", None) or 1
    rng = random.Random(f"{model_type}-{padding_side}")
    checked = 0
    for trial in range(12):
        batch = rng.randint(1, 4)
        input_ids, mm_types, mask, images, videos, samples = _random_batch(
            rng, config, frames, temporal_merge, batch, padding_side
        )
        if images is None and videos is None:
            continue  # transformers >= 5.3 calls get_rope_index only for prompts with vision blocks
        ref_ids, ref_deltas = qwen_reference(
            config, model_cls, input_ids, mm_types, images, videos, attention_mask=mask
        )
        kwargs = {"image_grid_thw": images, "video_grid_thw": videos, "attention_mask": mask}
        extras = [{"mm_token_type_ids": mm_types}, {}]  # from the token types, then from the token ids
        if video_markers(config) is not None:  # GLM-4V, and transformers 4.57's types (1 on every image token)
            extras.append({"mm_token_type_ids": (mm_types > 0).long()})
        for extra in extras:
            ids, deltas = get_rope_index(config, input_ids, rule="installed", **kwargs, **extra)
            assert torch.equal(ids, ref_ids), (model_type, trial, extra.keys())
            assert torch.equal(deltas, ref_deltas.to(deltas.dtype).view(deltas.shape)), (model_type, trial)
        lay = layout.build(samples, scheme, padding_side=padding_side, rule=RULE)
        assert torch.equal(lay.position_ids, ref_ids) and torch.equal(lay.rope_deltas, ref_deltas.view(-1, 1))
        checked += 1
    assert checked >= 6


def test_registry_reads_each_family_by_model_type():
    """One scheme entry per rule: the families sharing Qwen3-VL's get_rope_index share its entry."""
    known = model_types()
    assert known["glm4v"] == known["qwen3_5"] == known["qwen3_vl"] == "qwen3-vl"
    assert known["paddleocr_vl"] == known["ernie4_5_vl_moe"] == known["qwen2_vl"] == "qwen2-vl"
    with pytest.raises(ValueError, match="config.model_type must be one of"):
        scheme_for_config(SimpleNamespace(model_type="llama"))


def test_ernie_video_frames_merged_in_time():
    """ERNIE-4.5-VL: a video grid (4, 4, 4) with temporal_merge_size 2 holds 2 x 2 x 2 tokens,
    at t = start + 0, 1 (hand-worked); an odd t is refused."""
    config, _ = qwen_family("ernie4_5_vl_moe")
    vid = config.video_token_id
    ids = torch.tensor([[11, 12] + [vid] * 8 + [13]])
    pos, deltas = get_rope_index(config, ids, video_grid_thw=torch.tensor([[4, 4, 4]]), rule="hf-5.3")
    assert pos[0, 0].tolist() == [0, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4]
    assert pos[1, 0].tolist() == [0, 1, 2, 2, 3, 3, 2, 2, 3, 3, 4] and deltas.tolist() == [[5 - 11]]
    with pytest.raises(ValueError, match="divisible by the temporal merge size 2"):
        get_rope_index(config, ids, video_grid_thw=torch.tensor([[3, 4, 4]]), rule="hf-5.3")
