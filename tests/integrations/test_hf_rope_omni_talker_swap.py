"""The swapped talker of a full Omni model (``Qwen2_5OmniForConditionalGeneration``,
``Qwen3OmniMoeForConditionalGeneration``: :data:`mmpos.integrations.hf_omni.TALKERS`) generates consistently: its
cached greedy ``generate`` gives the logits of one forward of its text model over everything the cached steps fed
it (the prefill's and each new code's input embeddings, recorded by a forward pre-hook), at the positions the steps
used; and those decode positions are the scheme's text positions after the prompt (the patched ``get_rope_index``
over the talker's token ids grown by text tokens). The own scheme passes the same checks (the model's own rule, the
reference for the consistency). Tiny random full models of :mod:`test_hf_rope_omni_full`."""

from __future__ import annotations

import functools

import pytest
import torch

transformers = pytest.importorskip("transformers")

import test_hf_rope_omni_full as omni

from mmpos.integrations.hf_rope import current_rope, use_rope

pytestmark = pytest.mark.hf
SWAPS = [("mrope-i", {}), ("vrope", {}), ("v2pe", {"delta": 0.25}), ("mhrope", {"head_sections": [0, 1, 1]})]
STEPS = 3


@pytest.fixture(scope="module", params=list(omni.FULL))
def full(request):
    build, cls, _ = omni.FULL[request.param]
    if not hasattr(transformers, cls):
        pytest.skip(f"transformers {transformers.__version__} has no {cls}")
    torch.manual_seed(0)
    return build().eval()


def _recorded_generate(model, inputs):
    """``(step logits (B, STEPS, V), [(inputs_embeds, position_ids (3, B, n)), ...] per call of the talker's text
    model)`` of a cached greedy ``generate`` (:func:`test_hf_rope_omni_full._talker_generate`)."""
    calls = []

    def record(module, args, kwargs):
        ids = kwargs["position_ids"]
        calls.append((kwargs["inputs_embeds"].clone(), ids[-3:].clone()))  # a (4, B, n) leads with the text row

    handle = model.talker.model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        _, steps = omni._talker_generate(model, inputs, STEPS)
    finally:
        handle.remove()
    return steps, calls


def _text_positions(model, inputs, grow: int) -> torch.Tensor:
    """The patched talker index over its token ids grown by ``grow`` text tokens: ``(3, B, n + grow)``."""
    ids = omni._text_ids(inputs)
    b = ids.shape[0]
    grown = torch.cat([ids, torch.full((b, grow), 7, dtype=ids.dtype)], 1)
    mask = torch.cat([inputs["attention_mask"], torch.ones(b, grow, dtype=inputs["attention_mask"].dtype)], 1)
    model.talker.rope_deltas = None
    return model.talker.get_rope_index(grown, inputs["image_grid_thw"], None, mask, False, None, None)[0]


def _check_talker(model, inputs):
    """Run the cached ``generate`` and check it against one forward; returns ``(step logits, offset)``, ``offset``
    ``(3, B, STEPS - 1)`` the decode positions minus the text positions after the prompt: 0 where the model's
    decoding discounts left padding (transformers 5.24), the sample's pad count where it does not (4.57.1's
    Qwen2.5-Omni talker adds ``cache_position`` to ``rope_deltas``)."""
    steps, calls = _recorded_generate(model, inputs)
    assert len(calls) == STEPS and torch.isfinite(steps).all()
    embeds = torch.cat([e for e, _ in calls], 1)  # (B, n + STEPS - 1, H)
    dtype = functools.reduce(torch.promote_types, [p.dtype for _, p in calls])  # V2PE: float prefill ids
    positions = torch.cat([p.to(dtype) for _, p in calls], 2)  # (3, B, n + STEPS - 1)
    b, n = calls[0][0].shape[:2]
    want = _text_positions(model, inputs, STEPS - 1)  # the prompt's positions, then text after it
    torch.testing.assert_close(positions[:, :, :n].to(want.dtype), want[:, :, :n], rtol=0, atol=0)
    offset = positions[:, :, n:].to(want.dtype) - want[:, :, n:]
    pads = (1 - inputs["attention_mask"]).sum(1).to(offset.dtype)  # (B,)
    assert ((offset == 0) | (offset == pads[None, :, None])).all()
    assert (offset == offset[:, :, :1]).all()  # one offset per sample: the decode positions advance as text
    # one forward of the text model over what the cached steps fed it, at the positions they used
    mask = torch.cat([inputs["attention_mask"], torch.ones(b, STEPS - 1, dtype=inputs["attention_mask"].dtype)], 1)
    model.talker.rope_deltas = None
    hidden = model.talker.model(inputs_embeds=embeds, position_ids=positions, attention_mask=mask, use_cache=False)[0]
    logits = model.talker.codec_head(hidden).float()[:, -STEPS:]
    torch.testing.assert_close(logits, steps, rtol=1e-4, atol=1e-4)
    return steps, offset


@torch.no_grad()
def test_own_talker_generates_as_one_forward(full):
    """The reference for the check: the unpatched model, then its own scheme through mmpos (the same offsets)."""
    inputs = omni._talker_inputs(full, omni._thinker_batch())
    use_rope(full, "own")
    _, own_offset = _check_talker(full, inputs)
    use_rope(full, omni.FULL[full.config.model_type][2])
    try:
        assert torch.equal(_check_talker(full, inputs)[1], own_offset)
    finally:
        use_rope(full, "own")


@torch.no_grad()
@pytest.mark.parametrize("scheme, options", SWAPS, ids=[s for s, _ in SWAPS])
def test_swapped_talker_cached_generate_equals_a_full_forward(full, scheme, options):
    """The swapped talker's cached ``generate`` equals one forward over its sequence, its decode positions are the
    scheme's text positions after the prompt (offset as the model's own decoding offsets them), and it is not the
    own talker (its step logits move); ``"own"`` then restores them."""
    inputs = omni._talker_inputs(full, omni._thinker_batch())
    use_rope(full, "own")
    ref, own_offset = _check_talker(full, inputs)
    use_rope(full, scheme, **options)
    assert current_rope(full.talker) == scheme
    try:
        steps, offset = _check_talker(full, inputs)
        assert torch.equal(offset, own_offset.to(offset.dtype)) and not torch.allclose(steps, ref)
    finally:
        use_rope(full, "own")
    _, back = omni._talker_generate(full, inputs, STEPS)
    assert torch.equal(back, ref)
