"""``use_rope`` on Qwen2-VL / Qwen2.5-VL models whose config scales RoPE (``rope_scaling`` of type ``yarn``,
``dynamic``, ``linear``): the model's own scheme through mmpos gives the unpatched logits, the rule carries to
a swapped scheme and ``scaling=`` replaces it (transformers 4.57.1 and 5.24; ``make test`` runs both)."""

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
from _tiny_hf import QWEN2_5_VISION, QWEN2_VISION, TEXT, greedy
from transformers import (
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
)

from mmpos.integrations.hf_rope import CONFIG_KEY, HFRotaryEmbedding, apply_config_rope, use_rope
from mmpos.integrations.hf_rope_index import installed_rule
from mmpos.scaling import RopeScaling

pytestmark = pytest.mark.hf
IMG, VID, VSTART, VEND, PAD = 120, 121, 122, 123, 0
TOKENS = {"image_token_id": IMG, "video_token_id": VID, "vision_start_token_id": VSTART, "vision_end_token_id": VEND}
SECTION = [2, 3, 3]
#: L0 = 8 (dynamic: max_position_embeddings; yarn: original_max_position_embeddings): the prompts reach 22
SCALINGS = {
    "yarn": ({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}, 32),
    "dynamic": ({"type": "dynamic", "factor": 4.0}, 8),
    "linear": ({"type": "linear", "factor": 4.0}, 8),
}
VISION = {"qwen2-vl": QWEN2_VISION, "qwen2.5-vl": QWEN2_5_VISION}
CLASSES = {
    "qwen2-vl": (Qwen2VLConfig, Qwen2VLForConditionalGeneration),
    "qwen2.5-vl": (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration),
}


def _model(family, rope_scaling, max_positions, seed=0):
    """A tiny random model (the same weights for a given seed, whatever its RoPE config)."""
    text = dict(
        TEXT,
        rope_theta=10000.0,
        max_position_embeddings=max_positions,
        rope_scaling={**rope_scaling, "mrope_section": SECTION},
    )
    config_class, model_class = CLASSES[family]
    torch.manual_seed(seed)
    return model_class(config_class(text_config=text, vision_config=VISION[family], **TOKENS)).eval()


def _batch(family):
    """Two left-padded prompts with a 4x6- and a 4x4-patch image; the first reaches position 21."""
    g = torch.Generator().manual_seed(1)
    first = [5, 6, VSTART] + [IMG] * 6 + [VEND] + list(range(20, 32)) + [9, 10]
    second = [11, VSTART] + [IMG] * 4 + [VEND, 12, 13]
    length = len(first)
    ids = torch.tensor([first, [PAD] * (length - len(second)) + second])
    batch = {
        "input_ids": ids,
        "attention_mask": (torch.arange(length) >= torch.tensor([[0], [length - len(second)]])).long(),
        "pixel_values": torch.randn(24 + 16, 24, generator=g),
        "image_grid_thw": torch.tensor([[1, 4, 6], [1, 4, 4]]),
    }
    if installed_rule() == "hf-5.3":  # transformers >= 5.3 locates vision tokens with mm_token_type_ids
        batch["mm_token_type_ids"] = (ids == IMG).long()
    return batch


def _text_batch():
    ids = torch.tensor([list(range(5, 27)), [PAD] * 4 + list(range(30, 48))])
    return {"input_ids": ids, "attention_mask": (ids != PAD).long()}


def _generate(model, inputs, steps=3):
    return greedy(model, inputs, [IMG, VID, VSTART, VEND], steps, PAD)


def _rotary(model):
    return model.model.language_model.rotary_emb


@torch.no_grad()
@pytest.mark.parametrize("family", list(CLASSES))
@pytest.mark.parametrize("rule", list(SCALINGS))
def test_own_scheme_keeps_the_model_rope_scaling(family, rule):
    """``use_rope(model, <its own scheme>)`` on a model with ``rope_scaling`` reproduces the unpatched logits and
    ``generate`` bit for bit (a fresh model: Hugging Face's dynamic state grows with the length, as the rule
    does)."""
    model = _model(family, *SCALINGS[rule])
    inputs = _batch(family)
    index = {k: v for k, v in inputs.items() if k in ("attention_mask", "image_grid_thw", "mm_token_type_ids")}
    assert model.model.get_rope_index(inputs["input_ids"], **index)[0].max() + 1 > 8  # beyond L0
    ref = model(**inputs).logits
    ref_seq, ref_steps = _generate(model, inputs)
    use_rope(model, family)
    rotary = _rotary(model)
    assert isinstance(rotary, HFRotaryEmbedding) and rotary.encoder.scaling.rule == rule
    assert (rotary.encoder.rescale is not None) == (rule == "dynamic")
    assert torch.equal(model(**inputs).logits, ref)
    seq, steps = _generate(model, inputs)
    assert torch.equal(seq, ref_seq) and torch.equal(steps, ref_steps)


@torch.no_grad()
@pytest.mark.parametrize("rule", list(SCALINGS))
def test_scaling_argument_equals_the_model_configured_with_it(rule):
    """``scaling=`` on a model without scaling gives the logits of the same weights configured with that rule,
    and ``scaling=None`` on the scaled model those of the unscaled one: the rule is the only difference."""
    family, (rope_scaling, max_positions) = "qwen2-vl", SCALINGS[rule]
    plain, scaled = _model(family, {"type": "mrope"}, max_positions), _model(family, rope_scaling, max_positions)
    inputs = _batch(family)
    ref_plain, ref_scaled = plain(**inputs).logits, scaled(**inputs).logits
    assert not torch.allclose(ref_plain, ref_scaled, rtol=1e-5, atol=1e-5)  # the rule moves these logits
    use_rope(plain, family, scaling=RopeScaling.from_hf(rope_scaling, max_positions))
    assert torch.equal(plain(**inputs).logits, ref_scaled)
    use_rope(scaled, family, scaling=None)
    assert torch.equal(scaled(**inputs).logits, ref_plain)


@torch.no_grad()
@pytest.mark.parametrize("rule", ["yarn", "dynamic"])
def test_rule_carries_to_a_swapped_scheme(rule):
    """MRoPE-I on text is 1-D RoPE whatever its sections, so with the model's own rule (the default) it gives the
    scaled model's text logits; ``scaling=None`` drops the rule and gives the unscaled model's."""
    model, plain = _model("qwen2-vl", *SCALINGS[rule]), _model("qwen2-vl", {"type": "mrope"}, SCALINGS[rule][1])
    inputs = _text_batch()
    ref, ref_plain = model(**inputs).logits, plain(**inputs).logits
    use_rope(model, "mrope-i")
    assert _rotary(model).encoder.scaling.rule == rule
    assert torch.equal(model(**inputs).logits, ref)
    use_rope(model, "mrope-i", scaling=None)
    assert torch.equal(model(**inputs).logits, ref_plain)


@torch.no_grad()
def test_dynamic_rule_follows_the_length_without_host_syncs():
    """The dynamic rule is the unscaled plan up to ``L0`` and rescales beyond it, in one graph (dynamo traces the
    rotary module whole: no ``.item()``, no data-dependent branch)."""
    model = _model("qwen2-vl", *SCALINGS["dynamic"])
    use_rope(model, "qwen2-vl")
    rotary = _rotary(model)
    plain = _model("qwen2-vl", {"type": "mrope"}, 8)
    use_rope(plain, "qwen2-vl")
    x = torch.zeros(1)
    short, long = torch.arange(8).expand(3, 1, -1), torch.arange(20).expand(3, 1, -1)
    assert torch.equal(rotary(x, short)[0], _rotary(plain)(x, short)[0])
    assert not torch.allclose(rotary(x, long)[0], _rotary(plain)(x, long)[0])
    torch._dynamo.reset()
    compiled = torch.compile(rotary, backend="eager", fullgraph=True, dynamic=True)
    for ids in (short, long):
        torch.testing.assert_close(compiled(x, ids), rotary(x, ids), rtol=0, atol=0)


@torch.no_grad()
def test_yarn_attention_factor_reaches_cos_and_sin():
    """YaRN's ``0.1 ln s + 1`` multiplies ``cos`` and ``sin``, as Hugging Face's ``attention_scaling``."""
    model = _model("qwen2.5-vl", *SCALINGS["yarn"])
    hf = _rotary(model)
    use_rope(model, "qwen2.5-vl")
    ids = torch.arange(12).expand(3, 2, -1)
    x = torch.zeros(1)
    assert _rotary(model).encoder.attention_factor == pytest.approx(hf.attention_scaling)
    for ours, theirs in zip(_rotary(model)(x, ids), hf(x, ids)):
        assert torch.equal(ours, theirs)


@torch.no_grad()
def test_scaling_survives_the_config_round_trip():
    """The rule is written into ``config.mmpos_rope`` as JSON (what ``save_pretrained`` stores) and
    ``apply_config_rope`` on a freshly loaded model installs it again: same logits."""
    model = _model("qwen2-vl", *SCALINGS["yarn"])
    inputs = _batch("qwen2-vl")
    use_rope(model, "mrope-i", scaling=RopeScaling("dynamic", 2.0, 8))
    entry = json.loads(json.dumps(getattr(model.config, CONFIG_KEY)))
    assert entry["scaling"] == {"rule": "dynamic", "factor": 2.0, "original_size": 8.0}
    ref = model(**inputs).logits
    fresh = _model("qwen2-vl", *SCALINGS["yarn"])
    setattr(fresh.config, CONFIG_KEY, entry)
    apply_config_rope(fresh)
    assert _rotary(fresh).encoder.scaling == RopeScaling("dynamic", 2.0, 8)
    assert torch.equal(fresh(**inputs).logits, ref)
    use_rope(model, "mrope-i", scaling=None)
    assert getattr(model.config, CONFIG_KEY)["scaling"] is None
    setattr(fresh.config, CONFIG_KEY, json.loads(json.dumps(getattr(model.config, CONFIG_KEY))))
    assert torch.equal(apply_config_rope(fresh)(**inputs).logits, model(**inputs).logits)
    use_rope(model, "mrope-i")
    assert "scaling" not in getattr(model.config, CONFIG_KEY)


def test_bad_scaling_is_refused():
    model = _model("qwen2-vl", {"type": "mrope"}, 8)
    with pytest.raises(ValueError, match="scaling must be 'own'"):
        use_rope(model, "qwen2-vl", scaling="yarn")
    with pytest.raises(TypeError, match="scaling must be a RopeScaling"):
        use_rope(model, "qwen2-vl", scaling=2.0)
    with pytest.raises(ValueError, match="factor is required"):
        use_rope(model, "qwen2-vl", scaling={"rule": "yarn"})
