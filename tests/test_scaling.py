"""mmpos.scaling: every rule against transformers' ROPE_INIT_FUNCTIONS on 1-D text, against each rule's
per-axis formula on 2-D / 3-D and M-RoPE plans, in every rotary encoder, and under compile / export."""

import inspect
import math

import pytest
import torch

import mmpos
from mmpos import Coords
from mmpos.rotary import FrequencyPlan, rope_frequencies
from mmpos.scaling import (
    RopeScaling,
    cinescale_ntk,
    dynamic_ntk,
    grid_scaling,
    llama3,
    longrope,
    ntk_aware,
    ntk_by_parts,
    position_interpolation,
    resolution_interpolation,
    scale_plan,
    theta_scaling,
    timm_ref_feat_shape,
    yarn,
)

TIGHT = {"rtol": 1e-6, "atol": 0.0}  # float32 rounding: HF recomputes from the base, mmpos from the plan


# ------------------------------------------------------------------ transformers, 4.57 and 5.x
def _hf(rope_type, head_dim, theta, max_pos, params, partial=1.0, seq_len=None):
    """``ROPE_INIT_FUNCTIONS[rope_type]`` of the installed transformers: (inv_freq, attention_factor)."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    heads = 2
    kw = {
        "hidden_size": head_dim * heads,
        "num_attention_heads": heads,
        "head_dim": head_dim,
        "max_position_embeddings": max_pos,
    }
    if hasattr(LlamaConfig(), "rope_parameters"):  # transformers 5: theta and scaling in one dict
        rope = {"rope_type": rope_type, "rope_theta": theta, "partial_rotary_factor": partial, **params}
        cfg = LlamaConfig(**kw, rope_parameters=rope)
    else:  # 4.x: rope_theta / partial_rotary_factor on the config, the rule in rope_scaling
        cfg = LlamaConfig(
            **kw, rope_theta=theta, partial_rotary_factor=partial, rope_scaling={"rope_type": rope_type, **params}
        )
        if "original_max_position_embeddings" in params:  # 4.x longrope reads it off the config
            cfg.original_max_position_embeddings = params["original_max_position_embeddings"]
    inv_freq, factor = ROPE_INIT_FUNCTIONS[rope_type](cfg, "cpu", seq_len)
    return inv_freq.float(), float(factor)


#: every rope type of transformers 4.57 and 5.x; a new one fails test_every_hf_rope_type_is_covered
HF_TYPES = {"default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional"}


@pytest.mark.hf
def test_every_hf_rope_type_is_covered():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    assert set(ROPE_INIT_FUNCTIONS) <= HF_TYPES, sorted(set(ROPE_INIT_FUNCTIONS) - HF_TYPES)


@pytest.mark.hf
def test_default_equals_hf():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    if "default" not in ROPE_INIT_FUNCTIONS:
        pytest.skip("transformers 5 has no 'default' entry (each model computes it)")
    inv, factor = _hf("default", 64, 10000.0, 128, {})
    assert torch.equal(FrequencyPlan.rope(64).weight[0], inv) and factor == 1.0


@pytest.mark.hf
@pytest.mark.parametrize("partial", [1.0, 0.5])
def test_linear_equals_hf(partial):
    inv, factor = _hf("linear", 64, 10000.0, 128, {"factor": 4.0}, partial)
    plan, att = scale_plan(FrequencyPlan.rope(64, rotary_dim=int(64 * partial)), RopeScaling("linear", 4.0))
    assert torch.equal(plan.weight[0], inv) and att == factor == 1.0


@pytest.mark.hf
@pytest.mark.parametrize("seq_len", [None, 100, 128, 300, 5000])
@pytest.mark.parametrize("partial", [1.0, 0.5])
def test_dynamic_equals_hf(seq_len, partial):
    inv, factor = _hf("dynamic", 64, 10000.0, 128, {"factor": 2.0}, partial, seq_len)
    base = FrequencyPlan.rope(64, rotary_dim=int(64 * partial))
    rule = RopeScaling.from_hf({"rope_type": "dynamic", "factor": 2.0}, max_position_embeddings=128)
    plan, att = scale_plan(base, rule, length=seq_len)
    torch.testing.assert_close(plan.weight[0], inv, **TIGHT)
    assert att == factor == 1.0
    if seq_len is None or seq_len <= 128:
        assert torch.equal(plan.weight, base.weight)  # below the threshold: the plan itself
    else:  # a tensor length, as Hugging Face's forward passes it (torch.max(position_ids) + 1): bit for bit
        assert torch.equal(
            plan.weight[0], _hf("dynamic", 64, 10000.0, 128, {"factor": 2.0}, partial, torch.tensor(seq_len))[0]
        )


YARN_CASES = [
    {"factor": 4.0},
    {"factor": 8.0, "beta_fast": 16.0, "beta_slow": 2.0},
    {"factor": 4.0, "mscale": 1.0, "mscale_all_dim": 0.707},
    {"factor": 4.0, "attention_factor": 0.5},
    {"factor": 4.0, "truncate": False},
    {"factor": 1.0},
]


@pytest.mark.hf
@pytest.mark.parametrize("params", YARN_CASES)
@pytest.mark.parametrize(("head_dim", "theta", "original"), [(64, 10000.0, 128), (128, 1e6, 4096)])
def test_yarn_equals_hf(params, head_dim, theta, original):
    max_pos = int(original * params["factor"])
    hf_params = {**params, "original_max_position_embeddings": original}
    inv, factor = _hf("yarn", head_dim, theta, max_pos, hf_params)
    rule = RopeScaling.from_hf({"rope_type": "yarn", **hf_params}, max_position_embeddings=max_pos)
    plan, att = scale_plan(FrequencyPlan.rope(head_dim, theta), rule)
    torch.testing.assert_close(plan.weight[0], inv, **TIGHT)
    assert att == factor
    fn_plan, fn_att = yarn(FrequencyPlan.rope(head_dim, theta), original_size=original, **params)
    assert torch.equal(fn_plan.weight, plan.weight) and fn_att == att


@pytest.mark.hf
@pytest.mark.parametrize(("head_dim", "original", "factor"), [(128, 8192, 8.0), (32, 64, 4.0), (32, 256, 2.0)])
def test_llama3_equals_hf(head_dim, original, factor):
    params = {
        "factor": factor,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": original,
    }
    inv, att_hf = _hf("llama3", head_dim, 500000.0 if head_dim == 128 else 10000.0, original * 4, params)
    base = FrequencyPlan.rope(head_dim, 500000.0 if head_dim == 128 else 10000.0)
    plan, att = scale_plan(base, RopeScaling.from_hf({"rope_type": "llama3", **params}))
    assert torch.equal(plan.weight[0], inv) and att == att_hf == 1.0
    smooth = (inv != base.weight[0]) & (inv != base.weight[0] / factor)
    if head_dim == 32:
        assert smooth.any()  # the case reaches the blended band


@pytest.mark.hf
@pytest.mark.parametrize("seq_len", [None, 100, 1000])
def test_longrope_equals_hf(seq_len):
    pairs, original, max_pos = 16, 128, 512
    short = [1.0 + 0.05 * i for i in range(pairs)]
    long = [1.0 + 0.7 * i for i in range(pairs)]
    params = {"short_factor": short, "long_factor": long, "original_max_position_embeddings": original}
    inv, att_hf = _hf(
        "longrope", 2 * pairs, 10000.0, max_pos, {**params, "factor": max_pos / original}, seq_len=seq_len
    )
    rule = RopeScaling.from_hf({"rope_type": "longrope", **params}, max_position_embeddings=max_pos)
    plan, att = scale_plan(FrequencyPlan.rope(2 * pairs), rule, length=seq_len)
    torch.testing.assert_close(plan.weight[0], inv, **TIGHT)
    assert att == att_hf == math.sqrt(1 + math.log(4.0) / math.log(original))


@pytest.mark.hf
def test_proportional_equals_hf_as_a_plan_under_linear():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    if "proportional" not in ROPE_INIT_FUNCTIONS:
        pytest.skip("transformers 4.57 has no 'proportional'")
    head_dim, proportion, factor = 64, 0.25, 2.0
    inv, att_hf = _hf("proportional", head_dim, 10000.0, 128, {"factor": factor}, proportion)
    # HF's 'proportional' is a plan: the first pairs keep the full-head spectrum, the rest are NoPE
    pairs, rotated = head_dim // 2, int(proportion * head_dim // 2)
    index = torch.cat([torch.zeros(rotated, dtype=torch.long), torch.full((pairs - rotated,), -1)])
    plan = FrequencyPlan.from_assignment(index, rope_frequencies(pairs), ("seq",), head_dim)
    scaled, att = scale_plan(plan, RopeScaling("linear", factor))
    assert torch.equal(scaled.weight[0], inv) and att == att_hf == 1.0


# ------------------------------------------------------------------ per-axis formulas (2-D, 3-D, M-RoPE)
def _sections(weight):
    """The non-zero frequencies of every axis row, in pair order."""
    return [row[row != 0] for row in weight]


def test_ntk_per_axis_is_a_base_change_per_section():
    # NTK-aware: theta' = theta * s ** (n / (n - 1)) on each axis's own spectrum of n pairs
    plan = FrequencyPlan.axial(48, ("t", "h", "w"), sections=(4, 10, 10), theta=100.0)
    factors = (1.0, 2.0, 3.0)
    for f, n, s in zip(_sections(ntk_aware(plan, factors).weight), (4, 10, 10), factors):
        torch.testing.assert_close(f, rope_frequencies(n, 100.0 * s ** (n / (n - 1))), **TIGHT)


def test_theta_is_cinescale_base_times_alpha():
    # CineScale's precompute_freqs_cis_ntk: theta * ntk_factor per axis, the Wan split (t: d - 4(d//6), h, w: 2(d//6))
    plan = FrequencyPlan.axial(64, ("t", "h", "w"), sections=(12, 10, 10), theta=10000.0)
    rule = cinescale_ntk((1.0, 20.0, 20.0))
    scaled, att = scale_plan(plan, rule)
    for f, n, a in zip(_sections(scaled.weight), (12, 10, 10), (1.0, 20.0, 20.0)):
        torch.testing.assert_close(f, rope_frequencies(n, 10000.0 * a), **TIGHT)
    assert att == 1.0 and torch.equal(theta_scaling(plan, (1.0, 20.0, 20.0)).weight, scaled.weight)


@pytest.mark.parametrize("rule", ["yarn", "ntk-by-parts", "llama3", "dynamic"])
def test_axial_axis_equals_the_1d_rule_on_its_section(rule):
    # "axis" spectrum: each section of an axial plan is scaled as a 1-D RoPE of its own pairs and numbers
    sections, factors, original = (8, 12), (2.0, 4.0), (14, 10)
    plan = FrequencyPlan.axial(40, ("h", "w"), sections=sections, theta=100.0)
    scaling = RopeScaling(rule, factors, original)
    length = (40, 25) if rule == "dynamic" else None
    scaled, att = scale_plan(plan, scaling, length=length)
    for a, f in enumerate(_sections(scaled.weight)):
        one = RopeScaling(rule, factors[a], original[a])
        expected, _ = scale_plan(
            FrequencyPlan.rope(2 * sections[a], 100.0), one, length=None if length is None else length[a]
        )
        torch.testing.assert_close(f, expected.weight[0], **TIGHT)
    assert att == (0.1 * math.log(4.0) + 1 if rule == "yarn" else 1.0)  # the largest axis factor


@pytest.mark.parametrize("rule", ["yarn", "ntk", "dynamic", "llama3"])
@pytest.mark.parametrize("plan_name", ["mrope", "mrope-i", "mhrope", "hope", "vrope"])
def test_mrope_family_with_one_factor_equals_the_1d_rule_then_sectioned(rule, plan_name):
    # "shared" spectrum: YaRN (etc.) on the full 1-D inv_freq, then the scheme's allocation (vLLM / HF M-RoPE)
    head_dim = 64
    enc = mmpos.create(plan_name, head_dim=head_dim, num_kv_heads=4) if plan_name == "mhrope" else None
    enc = enc or mmpos.create(plan_name, head_dim=head_dim)
    scaling = RopeScaling(rule, 4.0, 512)
    scaled, att = scale_plan(
        FrequencyPlan(enc.weight, enc.axes, head_dim), scaling, "shared", length=2048 if rule == "dynamic" else None
    )
    one, att1 = scale_plan(FrequencyPlan.rope(head_dim), scaling, length=2048 if rule == "dynamic" else None)
    expected = torch.where(enc.weight != 0, one.weight[0], torch.zeros(()))
    torch.testing.assert_close(scaled.weight, expected, **TIGHT)
    assert att == att1


def test_mrope_per_axis_factors_read_each_pairs_axis():
    plan = FrequencyPlan.chunked_axes(64, (16, 8, 8))
    scaled, _ = scale_plan(plan, RopeScaling("yarn", (1.0, 2.0, 8.0), (4096, 32, 32)), "shared")
    for a, (s, l0) in enumerate([(1.0, 4096), (2.0, 32), (8.0, 32)]):
        one, _ = scale_plan(FrequencyPlan.rope(64), RopeScaling("yarn", s, l0))
        mask = plan.weight[a] != 0
        torch.testing.assert_close(scaled.weight[a][mask], one.weight[0][mask], **TIGHT)


def test_linear_is_position_interpolation_on_any_plan():
    torch.manual_seed(0)
    dense = FrequencyPlan(torch.randn(4, 2, 8), ("h", "w"), 16)  # a RoPE-Mixed weight
    scaled = position_interpolation(dense, (2.0, 4.0))
    pos = torch.rand(1, 5, 2) * 20
    from mmpos.rotary import plan_angles

    torch.testing.assert_close(
        plan_angles(scaled.weight, pos), plan_angles(dense.weight, pos / torch.tensor([2.0, 4.0]))
    )


def test_resolution_interpolation_preset_maps_the_test_grid_onto_the_training_extent():
    rule = resolution_interpolation((14, 14), (28, 21))
    assert rule == RopeScaling("linear", (2.0, 1.5), (14.0, 14.0))
    enc = mmpos.create("rope-axial", head_dim=32, scaling=rule)
    base = mmpos.create("rope-axial", head_dim=32)
    coords = Coords.grid(28, 21)
    torch.testing.assert_close(enc.angles(coords), base.angles(coords.scaled((1 / 2, 1 / 1.5))), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("size", [(8, 9), (3, 3)])
def test_ref_shape_equals_timm_ref_feat_shape(size):
    # timm rescales positions by ref / feat at every grid size (larger and smaller), as EVA-02 does
    from timm.layers.pos_embed_sincos import RotaryEmbeddingCat, apply_rot_embed_cat

    dim = 16
    # timm >= 1.0.21 offers the rotate-half layout; timm 1.0.20 only the interleaved one (feature-detected)
    half = "rotate_half" in inspect.signature(RotaryEmbeddingCat).parameters
    layout = {"rotate_half": True} if half else {}
    timm_rope = RotaryEmbeddingCat(dim, temperature=100, in_pixels=False, ref_feat_shape=(4, 6), **layout)
    convention = "half" if half else "interleaved"
    enc = mmpos.create("rope-axial", head_dim=dim, convention=convention, scaling=timm_ref_feat_shape((4, 6)))
    q, k = torch.randn(1, 2, size[0] * size[1], dim), torch.randn(1, 2, size[0] * size[1], dim)
    rq, _ = enc.rotate(q, k, Coords.grid(*size))
    torch.testing.assert_close(rq, apply_rot_embed_cat(q, timm_rope.get_embed(size), half=half), rtol=0, atol=1e-5)


def test_longrope_switches_per_axis():
    plan = FrequencyPlan.axial(16, ("h", "w"), theta=100.0)  # 4 + 4 pairs
    short, long = [1.0] * 8, [2.0] * 8
    scaled, att = longrope(plan, short, long, original_size=10, factor=(2.0, 3.0), length=(8, 12))
    h, w = _sections(scaled.weight)
    base_h, base_w = _sections(plan.weight)
    assert torch.equal(h, base_h) and torch.equal(w, base_w / 2.0)
    assert att == math.sqrt(1 + math.log(3.0) / math.log(10))


def test_ntk_by_parts_keeps_fast_pairs_and_interpolates_slow_ones():
    plan = FrequencyPlan.rope(64)
    scaled = ntk_by_parts(plan, 4.0, 2048).weight[0]
    wavelength = 2 * math.pi / plan.weight[0]
    fast, slow = wavelength < 2048 / 32, wavelength > 2048 / 1  # more than beta_fast / fewer than beta_slow turns
    assert torch.equal(scaled[fast], plan.weight[0][fast])
    torch.testing.assert_close(scaled[slow], plan.weight[0][slow] / 4, **TIGHT)


def test_dynamic_function_matches_ntk_at_the_grown_factor():
    plan = FrequencyPlan.rope(32)
    grown = 2.0 * 300 / 100 - 1.0
    torch.testing.assert_close(dynamic_ntk(plan, 2.0, 100, 300).weight, ntk_aware(plan, grown).weight, **TIGHT)
    assert torch.equal(dynamic_ntk(plan, 2.0, 100, 50).weight, plan.weight)


def test_llama3_per_axis():
    plan = FrequencyPlan.axial(32, ("h", "w"), theta=10000.0)
    scaled = llama3(plan, (2.0, 8.0), (16, 64))
    for a, (s, l0) in enumerate([(2.0, 16), (8.0, 64)]):
        one = llama3(FrequencyPlan.rope(16), s, l0).weight[0]
        assert torch.equal(_sections(scaled.weight)[a], one)


# ------------------------------------------------------------------ validation
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rule": "ntk-aware", "factor": 2.0}, "rule must be one of"),
        ({"rule": "yarn", "original_size": 32}, "factor is required"),
        ({"rule": "yarn", "factor": 2.0}, "original_size is required"),
        ({"rule": "linear", "factor": 0.0}, "factor must be a finite number > 0"),
        ({"rule": "linear", "factor": (2.0, -1.0)}, r"factor\[1\]"),
        ({"rule": "linear", "factor": float("nan")}, "factor"),
        ({"rule": "ref-shape", "factor": 2.0, "original_size": 14}, "factor must be None"),
        (
            {"rule": "yarn", "factor": 2.0, "original_size": 32, "beta_fast": 1.0, "beta_slow": 2.0},
            "beta_fast must exceed",
        ),
        ({"rule": "linear", "factor": 2.0, "mscale": 1.0}, "mscale applies to rule yarn only"),
        ({"rule": "yarn", "factor": 2.0, "original_size": 32, "short_factor": [1.0]}, "short_factor applies"),
        ({"rule": "longrope", "factor": 2.0, "original_size": 32}, "short_factor must be"),
        (
            {"rule": "longrope", "factor": 2.0, "original_size": 32, "short_factor": [1.0], "long_factor": [1.0, 2.0]},
            "one entry",
        ),
        (
            {"rule": "llama3", "factor": 2.0, "original_size": 32, "low_freq_factor": 4.0, "high_freq_factor": 1.0},
            "high_freq",
        ),
    ],
)
def test_rope_scaling_validates_in_the_constructor(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RopeScaling(**kwargs)


def test_wrong_axis_count_and_learned_plans_are_refused():
    plan = FrequencyPlan.axial(32, ("h", "w"))
    with pytest.raises(ValueError, match=r"factor must hold one value per plan axis \('h', 'w'\)"):
        scale_plan(plan, RopeScaling("linear", (2.0, 2.0, 2.0)))
    with pytest.raises(ValueError, match="mixes axes"):
        scale_plan(FrequencyPlan(torch.randn(2, 2, 8), ("h", "w"), 16), RopeScaling("yarn", 2.0, 14))
    scaled, _ = scale_plan(plan, RopeScaling("linear", 3.0))
    with pytest.raises(ValueError, match="RoPE spectrum"):  # a rescaled plan is no RoPE spectrum any more
        scale_plan(scaled, RopeScaling("ntk", 2.0))
    with pytest.raises(ValueError, match="only the position rules"):
        mmpos.create("rope-mixed", head_dim=16, num_heads=2, scaling=RopeScaling("yarn", 2.0, 14))
    with pytest.raises(ValueError, match="unknown keys"):
        mmpos.create("rope", head_dim=16, scaling={"rule": "linear", "scale": 2.0})
    with pytest.raises(ValueError, match="'proportional' is a plan"):
        RopeScaling.from_hf({"rope_type": "proportional", "factor": 2.0})
    assert RopeScaling.from_hf({"rope_type": "default", "rope_theta": 1e6}) is None
    with pytest.raises(ValueError, match="length applies to the dynamic rules"):
        scale_plan(plan, RopeScaling("linear", 2.0), length=10)


# ------------------------------------------------------------------ in the encoders
#: the extra arguments some rotary encoders need; every registered rotary encoder is tested
EXTRA = {"mhrope": {"num_kv_heads": 4}, "rope-mixed": {"num_heads": 4}}
ROTARY = sorted(i.name for i in mmpos.list_encoders() if i.kind == "rotary")


def test_the_rotary_encoders_are_found():
    assert {"rope", "rope-axial", "rope-mixed", "mrope", "mhrope", "hope", "v2pe"} <= set(ROTARY)


@pytest.mark.parametrize("name", ROTARY)
def test_every_rotary_encoder_accepts_scaling(name):
    kw = dict(head_dim=32, **EXTRA.get(name, {}))
    rule = {"rule": "linear", "factor": 2.0}
    base, enc = mmpos.create(name, **kw), mmpos.create(name, scaling=rule, **kw)
    if name == "rope-mixed":
        enc.weight.data.copy_(base.weight.data)
        assert torch.equal(enc.weight, base.weight)  # the parameter is not rescaled; forward divides it
    torch.manual_seed(0)
    coords = Coords(torch.rand(1, 6, len(base.axes)) * 9, axes=base.axes)  # the axes the encoder reads
    torch.testing.assert_close(enc.angles(coords), base.angles(coords.scaled(0.5)), rtol=1e-6, atol=1e-6)


def test_attention_factor_scales_cos_and_sin():
    rule = RopeScaling("yarn", 4.0, 16)
    enc = mmpos.create("rope", head_dim=32, scaling=rule)
    rot = enc.rotation(Coords.sequence(10))
    angles = enc.angles(Coords.sequence(10))
    assert enc.attention_factor == 0.1 * math.log(4.0) + 1
    assert torch.equal(rot.cos, angles.cos() * enc.attention_factor)
    assert torch.equal(rot.sin, angles.sin() * enc.attention_factor)


@pytest.mark.hf
def test_yarn_rope_rotates_as_hf_llama():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    params = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}
    kw = {"hidden_size": 64, "num_attention_heads": 2, "max_position_embeddings": 128}
    if hasattr(LlamaConfig(), "rope_parameters"):
        cfg = LlamaConfig(**kw, rope_parameters={**params, "rope_theta": 10000.0})
    else:
        cfg = LlamaConfig(**kw, rope_scaling=params)
    torch.manual_seed(0)
    q, k = torch.randn(1, 2, 100, 32), torch.randn(1, 2, 100, 32)
    cos, sin = LlamaRotaryEmbedding(cfg)(q, torch.arange(100)[None])
    q_ref, k_ref = apply_rotary_pos_emb(q, k, cos, sin)
    enc = mmpos.create("rope", head_dim=32, scaling=RopeScaling.from_hf(params, 128))
    q_out, k_out = enc.rotate(q, k, Coords.sequence(100))
    torch.testing.assert_close(q_out, q_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k_out, k_ref, rtol=1e-5, atol=1e-5)


def test_dynamic_encoder_follows_the_length_and_keeps_float32():
    rule = RopeScaling("dynamic", 2.0, 16)
    enc = mmpos.create("rope", head_dim=32, scaling=rule).to(torch.bfloat16)
    base = FrequencyPlan.rope(32)
    assert enc.rescale.table.dtype == torch.float32 and enc.weight.dtype == torch.float32
    short, long = Coords.sequence(12), Coords.sequence(40)
    assert torch.equal(enc.angles(short), mmpos.create("rope", head_dim=32).angles(short))  # below L0: unscaled
    expected = dynamic_ntk(base, 2.0, 16, 40).weight
    from mmpos.rotary import plan_angles

    torch.testing.assert_close(enc.angles(long), plan_angles(expected, long.pos), **TIGHT)


def test_mixed_linear_keeps_gradients_on_the_learned_weight():
    enc = mmpos.create("rope-mixed", head_dim=16, num_heads=2, scaling=RopeScaling("linear", (2.0, 4.0)))
    enc.angles(Coords.grid(3, 3)).sum().backward()
    assert enc.weight.grad is not None and enc.weight.grad.abs().sum() > 0


def test_state_dict_has_no_scaling_buffers():
    enc = mmpos.create("rope-axial", head_dim=32, scaling=RopeScaling("dynamic", 2.0, 14))
    assert set(enc.state_dict()) == set()


@pytest.mark.parametrize(
    "rule", [RopeScaling("yarn", 2.0, 8), RopeScaling("dynamic", 2.0, 8), timm_ref_feat_shape((4, 4))]
)
def test_scaled_encoder_compiles_fullgraph_and_exports(rule):
    enc = mmpos.create("rope-axial", head_dim=16, scaling=rule)
    q, k = torch.randn(1, 2, 36, 16), torch.randn(1, 2, 36, 16)
    coords = Coords.grid(6, 6)

    class Wrap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = enc

        def forward(self, q, k, pos):
            c = Coords(pos, axes=("h", "w"), _trusted=True)
            return self.enc.rotate(q, k, c)

    wrap = Wrap()
    eager = wrap(q, k, coords.pos)
    compiled = torch.compile(wrap, fullgraph=True, backend="eager")(q, k, coords.pos)
    torch.testing.assert_close(compiled, eager)
    exported = torch.export.export(wrap, (q, k, coords.pos))
    torch.testing.assert_close(exported.module()(q, k, coords.pos), eager)
    big = Coords.grid(6, 6).scaled(2.0).pos  # a longer extent: the dynamic rule moves, in the same graph
    torch.testing.assert_close(exported.module()(q, k, big), wrap(q, k, big))


@pytest.mark.slow
def test_dynamic_rule_exports_to_onnx_with_a_dynamic_image_size(tmp_path):
    # the dynamic rule is part of the ONNX graph: a grid beyond the original one is rescaled there as in eager
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from torch.export import Dim

    from mmpos.export import to_onnx
    from mmpos.nn import VisionTransformer

    def vit(scaling):
        torch.manual_seed(0)
        kw = {"rope-axial": {"scaling": scaling}}
        return VisionTransformer(
            (16, 20), 4, dim=32, depth=2, num_heads=2, pos="rope-axial", pos_kwargs=kw, num_classes=5
        )

    model = vit({"rule": "dynamic", "factor": 2.0, "original_size": [4, 5]}).eval()
    dims = ({0: Dim("b", min=1, max=8), 2: 4 * Dim("h", min=2, max=32), 3: 4 * Dim("w", min=2, max=32)},)
    path = tmp_path / "model.onnx"
    to_onnx(model, (torch.randn(2, 3, 16, 20),), dynamic_shapes=dims).save(str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    big = torch.randn(3, 3, 24, 32)  # a 6 x 8 grid, beyond the original 4 x 5
    out = torch.from_numpy(session.run(None, {session.get_inputs()[0].name: big.numpy()})[0])
    torch.testing.assert_close(out, model(big), atol=1e-4, rtol=1e-4)
    assert not torch.allclose(model(big), vit(None).eval()(big), atol=1e-4)  # the rule acted


def test_ratio_ramp_is_the_papers_gamma_of_r():
    # YaRN eq. 18: gamma(r) = clamp((r - beta_slow) / (beta_fast - beta_slow), 0, 1), r = L0 / wavelength
    plan = FrequencyPlan.rope(64)
    scaled = ntk_by_parts(plan, 4.0, 2048, ramp="ratio").weight[0]
    f = plan.weight[0].double()
    gamma = ((2048 * f / (2 * math.pi) - 1) / 31).clamp(0, 1)
    torch.testing.assert_close(scaled.double(), (1 - gamma) * f / 4 + gamma * f, rtol=1e-6, atol=0)
    # a grid shorter than one turn (L0 = 4 < 2 pi): every pair is interpolated, the index ramp keeps pair 0
    axial = FrequencyPlan.axial(16, ("h", "w"), theta=100.0)
    ratio, _ = yarn(axial, 2.0, 4, ramp="ratio")
    index, _ = yarn(axial, 2.0, 4)
    assert torch.equal(ratio.weight, position_interpolation(axial, 2.0).weight)
    assert torch.equal(index.weight[:, [0, 4]], axial.weight[:, [0, 4]])  # the fastest pair of each axis kept
    with pytest.raises(ValueError, match="ramp applies to rules ntk-by-parts / yarn only"):
        RopeScaling("linear", 2.0, ramp="ratio")


# ------------------------------------------------------------------ axis names and grids
def test_axis_named_factors_follow_the_plan_axis_order():
    named = RopeScaling("ntk", {"h": 2.0, "w": 3.0})
    assert named.per_axis("factor", ("w", "h")) == (3.0, 2.0)
    hw = mmpos.create("rope-axial", head_dim=16, scaling=named)
    wh = mmpos.create("rope-axial", head_dim=16, axes=("w", "h"), scaling=named)
    assert torch.equal(
        hw.weight, mmpos.create("rope-axial", head_dim=16, scaling=RopeScaling("ntk", (2.0, 3.0))).weight
    )
    assert torch.equal(
        wh.weight,
        mmpos.create("rope-axial", head_dim=16, axes=("w", "h"), scaling=RopeScaling("ntk", (3.0, 2.0))).weight,
    )
    with pytest.raises(ValueError, match=r"must name every plan axis \('t', 'h', 'w'\).*missing \['t'\]"):
        named.per_axis("factor", ("t", "h", "w"))
    with pytest.raises(ValueError, match="not in the plan"):
        named.per_axis("factor", ("h",))
    with pytest.raises(ValueError, match="must map axis names"):
        RopeScaling("ntk", {})
    with pytest.raises(ValueError, match=r"factor\['h'\]"):
        RopeScaling("ntk", {"h": -1.0})


def test_grid_scaling_and_to_dict():
    rule = grid_scaling("yarn", (14, 7), (28, 28), beta_fast=16.0)
    assert rule == RopeScaling("yarn", {"h": 2.0, "w": 4.0}, {"h": 14.0, "w": 7.0}, beta_fast=16.0)
    assert rule.to_dict() == {
        "rule": "yarn",
        "factor": {"h": 2.0, "w": 4.0},
        "original_size": {"h": 14.0, "w": 7.0},
        "beta_fast": 16.0,
    }
    assert RopeScaling.from_dict(rule.to_dict()) == rule
    assert grid_scaling("ref-shape", (4, 6)) == RopeScaling("ref-shape", original_size={"h": 4, "w": 6})
    assert (
        grid_scaling("linear", (14, 14), (28, 21)).per_axis("factor", ("h", "w"))
        == resolution_interpolation((14, 14), (28, 21)).factor
    )
    assert RopeScaling("longrope", 2.0, 4, short_factor=[1.0, 1.0], long_factor=[2.0, 2.0]).to_dict()[
        "long_factor"
    ] == [2.0, 2.0]
    with pytest.raises(ValueError, match="target_grid is required"):
        grid_scaling("yarn", (14, 14))
    with pytest.raises(ValueError, match="target_grid must be None"):
        grid_scaling("ref-shape", (14, 14), (28, 28))
    with pytest.raises(ValueError, match="same axes"):
        grid_scaling("yarn", (14, 14), (28,))
    with pytest.raises(ValueError, match="axes must be a sequence of distinct"):
        grid_scaling("yarn", (14, 14), (28, 28), axes=("h", "h"))


@pytest.mark.slow  # torch.export of a whole model: 15-120 s on this shared machine
@pytest.mark.parametrize("rule", ["yarn", "dynamic"])
def test_a_vit_with_a_grid_rule_exports_with_a_dynamic_image_size(rule):
    """torch.export of a whole model built with ``scaling=`` + ``target_grid=``: the exported program equals
    eager at the training grid and beyond it (YaRN's attention factor is a constant of the graph; the dynamic
    rule's length is computed in it)."""
    from torch.export import Dim

    from mmpos.nn import VisionTransformer

    torch.manual_seed(0)
    model = VisionTransformer(
        16, 4, dim=32, depth=1, num_heads=2, pos="rope-axial", num_classes=3, scaling=rule, target_grid=(8, 8)
    ).eval()
    dims = ({0: Dim("b", min=1, max=4), 2: 4 * Dim("h", min=2, max=16), 3: 4 * Dim("w", min=2, max=16)},)
    program = torch.export.export(model, (torch.randn(2, 3, 16, 16),), dynamic_shapes=dims)
    for shape in ((2, 3, 16, 16), (1, 3, 32, 28)):
        x = torch.randn(*shape)
        torch.testing.assert_close(program.module()(x), model(x), rtol=1e-5, atol=1e-5)
