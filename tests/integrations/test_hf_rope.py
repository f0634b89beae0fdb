"""``use_rope`` on tiny random Qwen2-VL, Qwen2.5-VL, Qwen3-VL and Qwen3-VL-MoE models of the
installed transformers (``make test`` runs this file on the oldest and the newest supported release)."""

import inspect

import pytest
import torch

transformers = pytest.importorskip("transformers")
from _tiny_hf import (
    QWEN2_5_VISION,
    QWEN2_VISION,
    QWEN3_VISION,
    assert_own_scheme_is_exact,
    greedy,
    reloaded_in_bfloat16,
)
from _tiny_hf import TEXT as TINY_TEXT
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
)

from mmpos.integrations.hf_rope import HFRotaryEmbedding, current_rope, use_rope
from mmpos.integrations.hf_rope_index import RopeIndexOptions, installed_rule, scheme_rope_index
from mmpos.layout import Image, Text, Video, build
from mmpos.schemes import RULES

IMG, VID, VSTART, VEND, PAD = 120, 121, 122, 123, 0
TEXT = dict(TINY_TEXT, rope_theta=10000.0)
TOKENS = {"image_token_id": IMG, "video_token_id": VID, "vision_start_token_id": VSTART, "vision_end_token_id": VEND}
QWEN3_VISION = dict(QWEN3_VISION, depth=2, deepstack_visual_indexes=[0])
pytestmark = pytest.mark.hf  # run on the oldest and the newest supported transformers
RULE = installed_rule()  # "hf-4.57" or "hf-5.3"
#: transformers >= 5.3 locates vision tokens with mm_token_type_ids (forward refuses grids without them)
NEEDS_TYPES = RULE == "hf-5.3"


def _qwen2_vl():
    cfg = Qwen2VLConfig(
        text_config=dict(TEXT, rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}),
        vision_config=QWEN2_VISION,
        **TOKENS,
    )
    return Qwen2VLForConditionalGeneration(cfg)


def _qwen2_5_vl():
    cfg = Qwen2_5_VLConfig(
        text_config=dict(TEXT, rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}),
        vision_config=QWEN2_5_VISION,
        **TOKENS,
    )
    return Qwen2_5_VLForConditionalGeneration(cfg)


def _qwen3_rope():
    return {"rope_type": "default", "mrope_section": [4, 2, 2], "mrope_interleaved": True}


def _qwen3_vl():
    text = dict(TEXT, head_dim=16, rope_scaling=_qwen3_rope())
    return Qwen3VLForConditionalGeneration(Qwen3VLConfig(text_config=text, vision_config=QWEN3_VISION, **TOKENS))


def _qwen3_vl_moe():
    text = dict(
        TEXT,
        head_dim=16,
        rope_scaling=_qwen3_rope(),
        num_hidden_layers=1,
        moe_intermediate_size=32,
        num_experts=4,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
    )
    cfg = transformers.Qwen3VLMoeConfig(text_config=text, vision_config=QWEN3_VISION, **TOKENS)
    return transformers.Qwen3VLMoeForConditionalGeneration(cfg)


FAMILIES = {"qwen2-vl": _qwen2_vl, "qwen2.5-vl": _qwen2_5_vl, "qwen3-vl": _qwen3_vl}
if hasattr(transformers, "Qwen3VLMoeForConditionalGeneration"):
    FAMILIES["qwen3-vl-moe"] = _qwen3_vl_moe
OWN = {"qwen3-vl-moe": "qwen3-vl"}
SWAPS = [
    ("mrope-i", {}),
    ("mhrope", {"head_sections": [0, 1, 1]}),  # 2 KV heads: the default sections are refused
    ("vrope", {}),
    ("v2pe", {"delta": 0.25}),
    ("v2pe", {"visual_stride": 4.0}),  # the block-span form
    ("hope", {"temporal_scale": 0.75}),
    ("videorope", {}),
    ("ilrope", {}),
    ("omnirope", {}),
    ("mmrope", {}),
    ("grape", {}),
    ("grape-i", {}),
    ("circlerope", {}),
    ("circlerope", {"radius": "auto-2", "alpha": 0.25, "move_to_positive": "auto"}),
    ("flat", {}),
]


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request):
    torch.manual_seed(0)
    return request.param, FAMILIES[request.param]().eval()


def _with_types(batch):
    if NEEDS_TYPES:
        ids = batch["input_ids"]
        batch["mm_token_type_ids"] = (ids == IMG).long() + 2 * (ids == VID).long()
    return batch


def _batch(family_name, seconds=2.0):
    """Two left-padded prompts: text, a 4x6-patch image, text, a 2-frame video, text; and
    text, a 4x4-patch image, text. Qwen3-VL writes each video frame as its own block
    (``<start> frame <end>``) after timestamp text."""
    g = torch.Generator().manual_seed(1)
    if family_name.startswith("qwen3"):
        video = [VSTART] + [VID] * 3 + [VEND, 31, VSTART] + [VID] * 3 + [VEND]
    else:
        video = [VSTART] + [VID] * 6 + [VEND]
    first = [5, 6, VSTART] + [IMG] * 6 + [VEND, 7, 30] + video + [9, 10]
    second = [11, VSTART] + [IMG] * 4 + [VEND, 12, 13]
    length = len(first)
    ids = torch.tensor([first, [PAD] * (length - len(second)) + second])
    mask = (torch.arange(length) >= torch.tensor([[0], [length - len(second)]])).long()
    batch = {
        "input_ids": ids,
        "attention_mask": mask,
        "pixel_values": torch.randn(24 + 16, 24, generator=g),
        "image_grid_thw": torch.tensor([[1, 4, 6], [1, 4, 4]]),
        "pixel_values_videos": torch.randn(2 * 2 * 6, 24, generator=g),
        "video_grid_thw": torch.tensor([[2, 2, 6]]),
    }
    if family_name == "qwen2.5-vl":
        batch["second_per_grid_ts"] = torch.tensor([seconds])
    return _with_types(batch)


def _text_batch():
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11], [PAD, PAD, 3, 4, 5, 6, 7]])
    return {"input_ids": ids, "attention_mask": (ids != PAD).long()}


def _generate(model, inputs, steps=3):
    return greedy(model, inputs, [IMG, VID, VSTART, VEND], steps, PAD)  # (B, L + steps), (B, steps, V)


def _index_args(inputs):
    """Keyword arguments of the model's own ``get_rope_index`` taken from a batch."""
    return {
        k: v
        for k, v in inputs.items()
        if k in ("second_per_grid_ts", "attention_mask", "mm_token_type_ids", "image_grid_thw", "video_grid_thw")
    }


@torch.no_grad()
@pytest.mark.parametrize("seconds", [2.0, 0.75])
def test_own_scheme_through_mmpos_leaves_logits_and_generate_unchanged(family, seconds):
    """With the model's own scheme installed, position ids, logits and generate are
    bit-identical to the unpatched model of the installed release (fractional seconds too)."""
    name, model = family
    if seconds != 2.0 and name != "qwen2.5-vl":
        pytest.skip("seconds only matter to Qwen2.5-VL")
    inputs = _batch(name, seconds)
    use_rope(model, "own")
    ref = model(**inputs).logits
    ref_ids, ref_rope = model.model.get_rope_index(inputs["input_ids"], **_index_args(inputs))
    ref_seq, ref_steps = _generate(model, inputs)
    scheme = OWN.get(name, name)
    use_rope(model, scheme)
    assert current_rope(model) == scheme and isinstance(model.model.language_model.rotary_emb, HFRotaryEmbedding)
    ids, rope = model.model.get_rope_index(inputs["input_ids"], **_index_args(inputs))
    assert torch.equal(ids, ref_ids) and torch.equal(rope, ref_rope)
    assert torch.equal(model(**inputs).logits, ref)
    seq, steps = _generate(model, inputs)
    assert torch.equal(seq, ref_seq) and torch.equal(steps, ref_steps)
    use_rope(model, "own")
    assert current_rope(model) == "own" and torch.equal(model(**inputs).logits, ref)


@torch.no_grad()
@pytest.mark.parametrize(
    "scheme, options", [("own", {}), *SWAPS], ids=["own"] + [s + "-" + "-".join(o) for s, o in SWAPS]
)
def test_layout_position_ids_give_the_model_logits(family, scheme, options):
    """A ``Layout`` from ``mmpos.layout.build`` handed to the patched model as ``position_ids``
    gives the logits the model computes itself (its own scheme and every swapped one), with
    ``(3, B, L)`` and ``(4, B, L)`` position ids."""
    name, model = family
    inputs = _batch(name)
    scheme = OWN.get(name, name) if scheme == "own" else scheme
    use_rope(model, scheme, **options)
    ref = model(**inputs).logits
    if name.startswith("qwen3"):  # <start> frame <end> <timestamp> <start> frame <end>
        video = [Text(1), Video((1, 2, 6)), Text(3), Video((1, 2, 6)), Text(3)]
    else:
        video = [Text(1), Video((2, 2, 6), 2.0 if name == "qwen2.5-vl" else None), Text(3)]
    samples = [[Text(3), Image((1, 4, 6)), Text(3)] + video, [Text(2), Image((1, 4, 4)), Text(3)]]
    positions = {k: v for k, v in options.items() if k != "head_sections"}  # an encoder option, not a layout one
    lay = build(samples, scheme, padding_side="left", rule=RULE, **positions)
    assert torch.equal(lay.attention_mask, inputs["attention_mask"])
    for shape in ("3d", "4d"):
        got = model(**dict(inputs, position_ids=lay.hf_position_ids(shape))).logits
        assert torch.equal(got, ref), shape
    use_rope(model, "own")


@torch.no_grad()
@pytest.mark.parametrize("scheme, options", SWAPS, ids=[s + "-" + "-".join(o) for s, o in SWAPS])
def test_swapped_scheme_forward_and_generate(family, scheme, options):
    """Forward and generate run; the cached decode agrees with a fresh forward over the
    generated sequence (so prompt positions, rope_deltas and decode positions fit together)."""
    name, model = family
    inputs = _batch(name)
    use_rope(model, "own")
    ref = model(**inputs).logits
    use_rope(model, scheme, **options)
    logits = model(**inputs).logits
    assert torch.isfinite(logits).all() and not torch.allclose(logits, ref)
    seq, steps = _generate(model, inputs)
    full = _with_types(
        dict(
            inputs,
            input_ids=seq,
            attention_mask=torch.cat([inputs["attention_mask"], torch.ones(2, 3, dtype=torch.long)], 1),
        )
    )
    torch.testing.assert_close(model(**full).logits[:, -4:-1], steps, rtol=1e-4, atol=1e-4)
    use_rope(model, "own")


TEXT_SWAPS = [
    ("mrope-i", {}),
    ("mhrope", {"head_sections": [0, 1, 1]}),
    ("vrope", {}),
    ("v2pe", {"delta": 0.5}),
    ("flat", {}),
]


@torch.no_grad()
@pytest.mark.parametrize("scheme, options", TEXT_SWAPS, ids=[s for s, _ in TEXT_SWAPS])
def test_text_only_prompts_keep_the_model_logits(family, scheme, options):
    """On text every scheme is 1-D RoPE (MHRoPE when its sections use every KV head), so the
    model's logits and greedy generation are unchanged bit for bit; this also checks MHRoPE's
    per-head projection hooks."""
    _, model = family
    inputs = _text_batch()
    use_rope(model, "own")
    ref = model(**inputs).logits
    ref_seq, ref_steps = _generate(model, inputs)
    use_rope(model, scheme, **options)
    assert torch.equal(model(**inputs).logits, ref)
    seq, steps = _generate(model, inputs)
    assert torch.equal(seq, ref_seq) and torch.equal(steps, ref_steps)
    use_rope(model, "own")


def test_text_only_position_ids_are_the_model_own(family):
    """Without grids every scheme gives the model's own text positions, quirks included
    (transformers 4.57: padding at 1, a fully padded row gets rope_deltas 2 - L)."""
    _, model = family
    ids = torch.tensor([[5, 6, 7, 8], [PAD, PAD, 3, 4], [PAD, PAD, PAD, PAD]])
    if NEEDS_TYPES:  # transformers >= 5.3 fails on a fully padded row (torch.cat of nothing)
        ids = ids[:2]
    use_rope(model, "own")
    for mask in ((ids != PAD).long(), None):
        kwargs = {"attention_mask": mask}
        if NEEDS_TYPES:
            kwargs["mm_token_type_ids"] = torch.zeros_like(ids)
        ref = model.model.get_rope_index(ids, **kwargs)
        for scheme, options in TEXT_SWAPS + [("hope", {"temporal_scale": 1.0}), ("qwen2-vl", {})]:
            use_rope(model, scheme, **options)
            got = model.model.get_rope_index(ids, **kwargs)
            assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1]), scheme
    use_rope(model, "own")


@torch.no_grad()
def test_mhrope_hooks_with_eager_attention_and_rotation():
    """MHRoPE through the projection hooks with eager attention: on text with every KV head
    rotated the logits are the model's; on a vision prompt KV head j turns by its axis."""
    torch.manual_seed(0)
    model = _qwen3_vl().eval()
    model.set_attn_implementation("eager")
    inputs = _text_batch()
    ref = model(**inputs).logits
    use_rope(model, "mhrope", head_sections=[1, 0, 1])
    assert torch.equal(model(**inputs).logits, ref)
    logits = model(**_batch("qwen3-vl")).logits
    assert torch.isfinite(logits).all()
    # the hooked k_norm output of layer 0 equals the reference per-head rotation
    attn = model.model.language_model.layers[0].self_attn
    seen = {}
    handle = attn.k_norm.register_forward_hook(lambda m, a, out: seen.update(k=out.clone(), x=a[0].clone()))
    model(**inputs)
    handle.remove()
    k_unrotated = attn.k_norm.weight * torch.nn.functional.rms_norm(seen["x"], (16,), eps=attn.k_norm.variance_epsilon)
    pos = torch.arange(7, dtype=torch.float64)  # the unpadded first sample: text positions 0..6 on every axis
    freq = 10000.0 ** (-torch.arange(8, dtype=torch.float64) / 8)
    ang = (pos[:, None] * freq).float()  # (L, 8)
    x1, x2 = k_unrotated[0, ..., :8], k_unrotated[0, ..., 8:]
    for head in range(2):  # both KV heads rotate (t for head 0, w for head 1): on text the same angles
        c, s = ang.cos(), ang.sin()
        expected = torch.cat([x1[:, head] * c - x2[:, head] * s, x2[:, head] * c + x1[:, head] * s], -1)
        torch.testing.assert_close(seen["k"][0, :, head], expected, rtol=1e-5, atol=1e-5)
    use_rope(model, "own")


@torch.no_grad()
def test_hope_on_text_differs_only_by_its_unrotated_pairs():
    torch.manual_seed(0)
    model = _qwen2_vl().eval()
    inputs = _text_batch()
    ref = model(**inputs).logits
    use_rope(model, "hope", temporal_scale=1.0)
    assert not torch.allclose(model(**inputs).logits, ref)  # its lowest pairs are NoPE even on text
    use_rope(model, "hope", temporal_scale=1.0, mrope_section=[0, 4, 4])  # no temporal pairs: plain RoPE
    assert torch.equal(model(**inputs).logits, ref)


@pytest.mark.parametrize(
    "scheme, options",
    [
        ("qwen2-vl", {}),
        ("mrope-i", {}),
        ("mhrope", {}),
        ("vrope", {}),
        ("v2pe", {"delta": 1 / 8}),
        ("hope", {"temporal_scale": 1.25}),
        ("circlerope", {"temporal_scale": 2.0, "radius": "auto", "dff_rate": 0.5}),
        ("flat", {}),
    ],
)
@pytest.mark.parametrize("rule", list(RULES))
def test_prompt_positions_equal_the_layout(scheme, options, rule):
    """From token ids, the patched ``get_rope_index`` gives the positions ``mmpos.layout.build``
    gives the same segments, under every rule (left padding; VRoPE's fourth row is implied)."""
    samples = [[Text(2), Image((1, 4, 6)), Text(3), Video((3, 4, 4)), Text(1)], [Text(4), Image((1, 2, 4)), Text(2)]]
    ids = []
    for sample in samples:
        row = []
        for seg in sample:
            if isinstance(seg, Text):
                row += [5] * seg.n
            else:
                t, h, w = seg.grid_thw
                row += [IMG if isinstance(seg, Image) else VID] * (t * h * w // 4)
        ids.append(row)
    length = max(map(len, ids))
    input_ids = torch.tensor([[PAD] * (length - len(r)) + r for r in ids])
    mask = torch.tensor([[0] * (length - len(r)) + [1] * len(r) for r in ids])
    own = {k: v for k, v in options.items() if k not in ("delta", "temporal_scale")}  # the scheme's own options
    opts = RopeIndexOptions(
        scheme,
        "qwen2-vl",
        2,
        IMG,
        VID,
        2.0,
        options.get("delta"),
        options.get("temporal_scale"),
        False,
        rule,
        scheme_options=own,
    )
    got_ids, got_deltas = scheme_rope_index(
        opts, input_ids, torch.tensor([[1, 4, 6], [1, 2, 4]]), torch.tensor([[3, 4, 4]]), mask
    )
    lay = build(samples, scheme, padding_side="left", rule=rule, **options)
    assert torch.equal(got_ids, lay.hf_position_ids().to(got_ids.dtype))
    assert torch.equal(got_deltas, lay.rope_deltas.to(got_deltas.dtype))


def test_state_dict_and_restore():
    torch.manual_seed(0)
    model = _qwen2_vl()
    keys = set(model.state_dict())
    own_rotary = model.model.language_model.rotary_emb
    q_proj = model.model.language_model.layers[0].self_attn.q_proj
    use_rope(model, "mhrope", head_sections=[0, 1, 1])  # 2 KV heads: name the sections
    assert set(model.state_dict()) == keys  # checkpoints load either way
    assert len(q_proj._forward_hooks) == 1
    use_rope(model, "vrope")  # switching restores first: the hooks are gone
    assert len(q_proj._forward_hooks) == 0
    use_rope(model, "own")
    assert model.model.language_model.rotary_emb is own_rotary
    assert "get_rope_index" not in model.model.__dict__ and model.model.rope_deltas is None
    other = _qwen2_vl()
    assert type(other.model.language_model.rotary_emb) is type(own_rotary)  # nothing patched globally


@torch.no_grad()
def test_plan_stays_float32_when_the_model_is_cast():
    torch.manual_seed(0)
    model = _qwen2_vl().eval()
    inputs = _batch("qwen2-vl")
    use_rope(model, "vrope")
    rotary = model.model.language_model.rotary_emb
    ids, _ = model.model.get_rope_index(inputs["input_ids"], **_index_args(inputs))
    x = torch.zeros(1, dtype=torch.bfloat16)
    ref = rotary(x, ids)
    model.to(torch.bfloat16)
    assert rotary.encoder.weight.dtype == torch.float32 and rotary.rows_to_axes.dtype == torch.float32
    got = rotary(x, ids)
    assert got[0].dtype == torch.bfloat16 and torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
    low = model(
        **dict(
            inputs,
            pixel_values=inputs["pixel_values"].bfloat16(),
            pixel_values_videos=inputs["pixel_values_videos"].bfloat16(),
        )
    ).logits
    assert low.dtype == torch.bfloat16 and torch.isfinite(low).all()


@torch.no_grad()
@pytest.mark.parametrize("name", list(FAMILIES))
def test_own_scheme_in_bfloat16(name, tmp_path):
    """Loaded in bfloat16 (``from_pretrained(..., dtype=torch.bfloat16)``: the rotary's ``inv_freq`` stays float32,
    as mmpos's plan), the family's own scheme gives the unpatched logits and greedy ``generate`` bit for bit."""
    if RULE == "hf-4.57" and name in ("qwen2-vl", "qwen2.5-vl"):
        pytest.skip(
            "transformers 4.57.1 reloads this saved config as its text config (model_type '..._text', no "
            "vision_config) without mmpos too; checked on 5.x"
        )
    torch.manual_seed(0)
    model = reloaded_in_bfloat16(FAMILIES[name](), tmp_path)
    inputs = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in _batch(name).items()}
    assert_own_scheme_is_exact(model, inputs, OWN.get(name, name), [IMG, VID, VSTART, VEND])


def test_installed_rule_is_detected_from_the_signature():
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel

    takes_types = "mm_token_type_ids" in inspect.signature(Qwen2VLModel.get_rope_index).parameters
    assert RULE == ("hf-5.3" if takes_types else "hf-4.57")


def test_errors():
    model = _qwen2_vl()
    with pytest.raises(ValueError, match="scheme must be"):
        use_rope(model, "rope-2d")
    with pytest.raises(ValueError, match="delta"):
        use_rope(model, "v2pe")
    with pytest.raises(ValueError, match="temporal_scale"):
        use_rope(model, "hope")
    with pytest.raises(ValueError, match="head_sections"):
        use_rope(model, "mhrope", head_sections=[1, 1, 1])  # 2 KV heads
    with pytest.raises(ValueError, match="mrope_section"):
        use_rope(model, "mrope-i", mrope_section=[2, 2, 2])
    with pytest.raises(ValueError, match="advance"):
        use_rope(model, "vrope", advance="time")
    llama = LlamaForCausalLM(
        LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
    )
    with pytest.raises(ValueError, match="Qwen2-VL"):
        use_rope(llama, "vrope")
    assert current_rope(model) == "own"


def test_unknown_layout_names_what_is_missing():
    """A future model whose text model moved its rotary module gets a clear error."""
    model = _qwen2_vl()
    del model.model.language_model.rotary_emb
    with pytest.raises(ValueError, match=r"not found \['language_model.rotary_emb'\]"):
        use_rope(model, "vrope")


@torch.no_grad()
@pytest.mark.parametrize(
    "scheme, options",
    [
        ("mrope-i", {}),
        ("v2pe", {"delta": 0.25}),
        ("hope", {"temporal_scale": 0.75}),
        ("circlerope", {"radius": "auto-2", "alpha": 1.0}),
    ],
)
def test_swap_survives_save_pretrained_and_from_pretrained(tmp_path, scheme, options):
    """Issue 23 (3): use_rope writes the scheme into the config (``config.mmpos_rope``);
    ``save_pretrained`` -> ``mmpos.integrations.hf.from_pretrained`` gives the same logits, while a
    plain ``from_pretrained`` loads the model's own RoPE (and apply_config_rope installs the swap)."""
    from mmpos.integrations.hf import CONFIG_KEY, apply_config_rope, from_pretrained

    if RULE == "hf-4.57":
        pytest.skip(
            "transformers 4.57.1 reloads this saved Qwen2-VL config as its text config (model_type "
            "'qwen2_vl_text', no vision_config) without mmpos too; the round trip is checked on 5.x"
        )
    torch.manual_seed(0)
    model = _qwen2_vl().eval()
    inputs = _batch("qwen2-vl")
    own = model(**inputs).logits
    use_rope(model, scheme, **options)
    swapped = model(**inputs).logits
    assert not torch.allclose(own, swapped)
    assert getattr(model.config, CONFIG_KEY) == {"scheme": scheme, **options}
    model.save_pretrained(tmp_path)
    loaded = from_pretrained(type(model), tmp_path).eval()
    assert current_rope(loaded) == scheme and torch.equal(loaded(**inputs).logits, swapped)
    plain = type(model).from_pretrained(tmp_path).eval()
    assert current_rope(plain) == "own" and torch.equal(plain(**inputs).logits, own)
    assert torch.equal(apply_config_rope(plain)(**inputs).logits, swapped)
    use_rope(plain, "own")
    assert not hasattr(plain.config, CONFIG_KEY) and torch.equal(plain(**inputs).logits, own)
    plain.config.mmpos_rope = "mrope-i"
    with pytest.raises(TypeError, match="must be a dict with a 'scheme' name"):
        apply_config_rope(plain)
