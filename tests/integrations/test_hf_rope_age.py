"""``use_rope(model, "circlerope", age=...)``: CircleRoPE's AGE on tiny random Qwen2.5-VL / Qwen2-VL models of the
installed transformers, against the reference's loop (lose4578/CircleRoPE ``Qwen2_5_VLModel_AGE_mode``: the model's
own rotary module called per decoder layer with that layer's position ids), written here with pre-hooks on the
unpatched model; and the refusal of rotary encoders with learned parameters in every layer (``grape-learned``)."""

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
from _tiny_hf import (
    QWEN2_5_VISION,
    QWEN2_VISION,
    QWEN3_VISION,
    assert_cached_generate_is_a_full_forward,
    greedy,
    vision_batch,
)
from _tiny_hf import TEXT as TINY_TEXT
from transformers import (
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
)

from mmpos.age import age_layers
from mmpos.integrations.hf_rope import CONFIG_KEY, apply_config_rope, current_rope, use_rope
from mmpos.integrations.hf_rope_index import installed_rule

IMG, VID, VSTART, VEND, PAD = 120, 121, 122, 123, 0
TOKENS = {"image_token_id": IMG, "video_token_id": VID, "vision_start_token_id": VSTART, "vision_end_token_id": VEND}
TEXT = dict(TINY_TEXT, rope_theta=10000.0, num_hidden_layers=4)
SUPPRESS = [IMG, VID, VSTART, VEND]
pytestmark = pytest.mark.hf
NEEDS_TYPES = installed_rule() == "hf-5.3"  # transformers >= 5.3 locates vision tokens with mm_token_type_ids


def _model(family: str):
    torch.manual_seed(0)
    text = dict(TEXT, rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]})
    if family == "qwen2.5-vl":
        cfg = Qwen2_5_VLConfig(text_config=text, vision_config=QWEN2_5_VISION, **TOKENS)
        return Qwen2_5_VLForConditionalGeneration(cfg).eval()
    cfg = Qwen2VLConfig(text_config=text, vision_config=QWEN2_VISION, **TOKENS)
    return Qwen2VLForConditionalGeneration(cfg).eval()


def _inputs(family: str) -> dict:
    """Two left-padded prompts: text, a 4x6-patch image, text, a 2-frame video, text; text, a 4x4 image, text."""
    video = [VSTART] + [VID] * 6 + [VEND]
    first = [5, 6, VSTART] + [IMG] * 6 + [VEND, 7, 30] + video + [9, 10]
    second = [11, VSTART] + [IMG] * 4 + [VEND, 12, 13]
    batch = vision_batch(
        first, second, [[1, 4, 6], [1, 4, 4]], [[2, 2, 6]], row=24, image_id=IMG, video_id=VID, pad=PAD
    )
    if family == "qwen2.5-vl":
        batch["second_per_grid_ts"] = torch.tensor([0.75])
    if not NEEDS_TYPES:
        batch.pop("mm_token_type_ids")
    return batch


def _index_args(inputs: dict) -> dict:
    names = ("second_per_grid_ts", "attention_mask", "mm_token_type_ids", "image_grid_thw", "video_grid_thw")
    return {k: v for k, v in inputs.items() if k in names}


def _reference_age(model, inputs: dict, flags: tuple[bool, ...], circle_ids: torch.Tensor) -> torch.Tensor:
    """The reference's AGE forward on the unpatched ``model``: its own ``get_rope_index`` gives the ``m_index`` ids,
    its own rotary module the ``(cos, sin)`` of each layer from that layer's ids (``circle_ids`` where ``flags``)."""
    text = model.model.language_model
    own_ids, _ = model.model.get_rope_index(inputs["input_ids"], **_index_args(inputs))

    def hook(module, args, kwargs):
        x = args[0] if args else kwargs["hidden_states"]
        return args, {**kwargs, "position_embeddings": text.rotary_emb(x, own_ids)}

    handles = [layer.register_forward_pre_hook(hook, with_kwargs=True) for layer, f in zip(text.layers, flags) if not f]
    try:
        return model(**inputs, position_ids=circle_ids).logits
    finally:
        for h in handles:
            h.remove()


@torch.no_grad()
@pytest.mark.parametrize("family", ["qwen2.5-vl", "qwen2-vl"])
def test_uniform_strategies_are_plain_circlerope_and_the_own_scheme_bit_for_bit(family):
    model, inputs = _model(family), _inputs(family)
    own = model(**inputs).logits
    use_rope(model, "circlerope")
    circle = model(**inputs).logits
    circle_seq, circle_steps = greedy(model, inputs, SUPPRESS, 3, PAD)
    use_rope(model, "circlerope", age=[True] * 4)
    assert current_rope(model) == "circlerope"
    assert torch.equal(model(**inputs).logits, circle)
    seq, steps = greedy(model, inputs, SUPPRESS, 3, PAD)
    assert torch.equal(seq, circle_seq) and torch.equal(steps, circle_steps)
    use_rope(model, "circlerope", age=[False] * 4)  # every layer on the model's own positions
    assert torch.equal(model(**inputs).logits, own)
    assert not torch.allclose(circle, own)
    use_rope(model, "own")
    assert torch.equal(model(**inputs).logits, own)


@torch.no_grad()
@pytest.mark.parametrize("strategy", ["strategy_2", "strategy_3", "strategy_4"])
def test_strategies_give_the_reference_age_logits(strategy):
    """Each layer reads the positions the strategy gives it: the logits of the reference's per-layer loop, which
    differ from plain circlerope and from the model's own."""
    model, inputs = _model("qwen2.5-vl"), _inputs("qwen2.5-vl")
    own = model(**inputs).logits
    use_rope(model, "circlerope")
    circle = model(**inputs).logits
    circle_ids, _ = model.model.get_rope_index(inputs["input_ids"], **_index_args(inputs))
    use_rope(model, "circlerope", age=strategy)
    age = model(**inputs).logits
    use_rope(model, "own")
    want = _reference_age(model, inputs, age_layers(strategy, 4), circle_ids)
    torch.testing.assert_close(age, want, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(age, circle, atol=1e-4) and not torch.allclose(age, own, atol=1e-4)


@torch.no_grad()
@pytest.mark.parametrize("family", ["qwen2.5-vl", "qwen2-vl"])
def test_cached_generate_equals_a_full_forward(family):
    """Decoded tokens keep each layer's layout (the own layers continue at the own rope_deltas); a text-only
    prompt afterwards gets one layout for every layer (the model's own logits)."""
    model, inputs = _model(family), _inputs(family)
    use_rope(model, "circlerope", age="strategy_4")
    assert_cached_generate_is_a_full_forward(model, inputs, SUPPRESS)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11], [PAD, PAD, 3, 4, 5, 6, 7]])
    text = {"input_ids": ids, "attention_mask": (ids != PAD).long()}
    swapped = model(**text).logits
    use_rope(model, "own")
    torch.testing.assert_close(swapped, model(**text).logits, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_reference_decoding_reads_circle_positions_after_the_prompt():
    """``age_decoding="reference"``: the prefill as AGE, then every layer on the Circle-RoPE positions of the new
    tokens (the reference passes no position_ids_list after the prefill) -- here the plain circlerope model with
    hooks that give the own layers the model's own rotary of its own ids during the prefill only."""
    model, inputs = _model("qwen2.5-vl"), _inputs("qwen2.5-vl")
    text = model.model.language_model
    own_rotary = text.rotary_emb
    own_ids, _ = model.model.get_rope_index(inputs["input_ids"], **_index_args(inputs))
    prompt = inputs["input_ids"].shape[1]

    def hook(module, args, kwargs):
        x = args[0] if args else kwargs["hidden_states"]
        if x.shape[1] != prompt:  # a decoding step: the Circle-RoPE rotation the model computed
            return None
        return args, {**kwargs, "position_embeddings": own_rotary(x, own_ids)}

    flags = age_layers("strategy_2", 4)
    use_rope(model, "circlerope")
    handles = [layer.register_forward_pre_hook(hook, with_kwargs=True) for layer, f in zip(text.layers, flags) if not f]
    _, want = greedy(model, inputs, SUPPRESS, 3, PAD)
    for h in handles:
        h.remove()
    use_rope(model, "circlerope", age="strategy_2", age_decoding="reference")
    assert getattr(model.config, CONFIG_KEY)["age_decoding"] == "reference"
    _, got = greedy(model, inputs, SUPPRESS, 3, PAD)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    use_rope(model, "circlerope", age="strategy_2")
    _, per_layer = greedy(model, inputs, SUPPRESS, 3, PAD)
    torch.testing.assert_close(per_layer[:, 0], got[:, 0], rtol=0, atol=0)  # the same prefill
    assert not torch.allclose(per_layer[:, 1:], got[:, 1:], atol=1e-4)  # decoding differs


@torch.no_grad()
def test_age_is_recorded_in_the_config_and_restored():
    model, inputs = _model("qwen2.5-vl"), _inputs("qwen2.5-vl")
    use_rope(model, "circlerope", age=[True, False, False, True], radius="auto-2")
    swapped = model(**inputs).logits
    entry = json.loads(json.dumps(getattr(model.config, CONFIG_KEY)))  # as config.json keeps it
    assert entry == {"scheme": "circlerope", "age": [True, False, False, True], "radius": "auto-2"}
    use_rope(model, "own")
    setattr(model.config, CONFIG_KEY, entry)
    assert torch.equal(apply_config_rope(model)(**inputs).logits, swapped)


@torch.no_grad()
def test_vision_position_ids_the_index_did_not_compute_are_refused():
    """Given position ids of a prompt with vision blocks, the own layout of those tokens is unknown."""
    model, inputs = _model("qwen2.5-vl"), _inputs("qwen2.5-vl")
    use_rope(model, "circlerope", age="strategy_2")
    ids, _ = model.model.get_rope_index(inputs["input_ids"], **_index_args(inputs))
    model(**inputs)  # the index ran in this forward: both layouts known
    with pytest.raises(ValueError, match="position_ids hold vision positions that get_rope_index did not compute"):
        model(**inputs, position_ids=ids)


def test_bad_age_arguments_are_refused():
    model = _model("qwen2.5-vl")
    with pytest.raises(ValueError, match="applies to scheme='circlerope', got scheme='mrope-i'"):
        use_rope(model, "mrope-i", age="strategy_2")
    with pytest.raises(ValueError, match="strategy must be one of"):
        use_rope(model, "circlerope", age="strategy_1")
    with pytest.raises(ValueError, match="one bool per layer \\(depth = 4\\), got 2"):
        use_rope(model, "circlerope", age=[True, False])
    with pytest.raises(ValueError, match="age_decoding must be one of"):
        use_rope(model, "circlerope", age="strategy_2", age_decoding="circle")
    with pytest.raises(ValueError, match="age_decoding applies with age"):
        use_rope(model, "circlerope", age_decoding="reference")
    assert current_rope(model) == "own"  # nothing installed


@pytest.mark.parametrize("encoder", ["grape-learned", "rope-mixed"])
def test_rotary_encoders_with_learned_planes_per_layer_are_refused(encoder):
    """#26 item 4: learned GRAPE (and RoPE-Mixed) have parameters in every layer and no shared cos / sin."""
    model = _model("qwen2-vl")
    with pytest.raises(ValueError, match=f"scheme '{encoder}' is a rotary encoder with learned parameters"):
        use_rope(model, encoder)
    with pytest.raises(ValueError, match="scheme must be 'own' or one of"):
        use_rope(model, "no-such-scheme")
    assert current_rope(model) == "own"


@torch.no_grad()
def test_qwen3_vl_age_moves_the_logits_and_generate_equals_a_full_forward():
    """Qwen3-VL (deepstack, interleaved own rotation): the installed circlerope plan rotates both layouts; the AGE
    logits differ from plain circlerope and from the model's own, and cached generate equals a full forward."""
    torch.manual_seed(0)
    rope = {"rope_type": "default", "mrope_section": [4, 2, 2], "mrope_interleaved": True}
    vision = dict(QWEN3_VISION, depth=2, deepstack_visual_indexes=[0])
    cfg = Qwen3VLConfig(text_config=dict(TEXT, head_dim=16, rope_scaling=rope), vision_config=vision, **TOKENS)
    model = Qwen3VLForConditionalGeneration(cfg).eval()
    first = [5, 6, VSTART] + [IMG] * 6 + [VEND, 7, 30, 9]
    second = [11, VSTART] + [IMG] * 4 + [VEND, 12, 13]
    inputs = vision_batch(first, second, [[1, 4, 6], [1, 4, 4]], row=24, image_id=IMG, pad=PAD)
    if not NEEDS_TYPES:
        inputs.pop("mm_token_type_ids")
    own = model(**inputs).logits
    use_rope(model, "circlerope")
    circle = model(**inputs).logits
    use_rope(model, "circlerope", age="strategy_4")
    age = model(**inputs).logits
    assert not torch.allclose(age, circle, atol=1e-4) and not torch.allclose(age, own, atol=1e-4)
    assert_cached_generate_is_a_full_forward(model, inputs, SUPPRESS)
