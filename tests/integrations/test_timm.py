import copy

import pytest
import timm
import torch
from timm.models.vision_transformer import VisionTransformer

from mmpos.coords import Coords
from mmpos.encoders import registry
from mmpos.encoders.sincos import sincos_embed
from mmpos.integrations import timm as mt

pytestmark = pytest.mark.timm  # run on the oldest and the newest supported timm

TINY = {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 4, "num_classes": 5}


def _vit(seed=0, **kwargs):
    torch.manual_seed(seed)
    return VisionTransformer(**{**TINY, **kwargs}).eval()


def _images(h=32, w=32, b=2, seed=1):
    return torch.randn(b, 3, h, w, generator=torch.Generator().manual_seed(seed))


def _registered(name):
    return name in {e.name for e in registry.list_encoders()}


# ---------------------------------------------------------------- faithfulness
CONFIGS = [
    {},
    {"reg_tokens": 2, "dynamic_img_size": True},
    {"no_embed_class": True, "reg_tokens": 1, "dynamic_img_size": True, "qk_norm": True, "init_values": 0.1},
    {"class_token": False, "global_pool": "avg", "dynamic_img_size": True},
]


@pytest.mark.parametrize("kwargs", CONFIGS)
def test_no_change_equals_timm(kwargs):
    ref = _vit(**kwargs)
    model = mt.convert(copy.deepcopy(ref), pos="none", keep_abs_pos=True)
    assert isinstance(model, mt.PositionalVisionTransformer)
    assert all(isinstance(b, mt.PositionalBlock) for b in model.blocks)
    assert model.state_dict().keys() == ref.state_dict().keys()
    sizes = [(32, 32), (24, 40)] if kwargs.get("dynamic_img_size") else [(32, 32)]
    for h, w in sizes:
        x = _images(h, w)
        with torch.no_grad():
            assert torch.equal(model(x), ref(x))
    # gradients too, in training mode
    model.train(), ref.train()
    x = _images()
    model(x).square().sum().backward()
    ref(x).square().sum().backward()
    reference = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        assert torch.equal(p.grad, reference[name].grad), name


@pytest.mark.parametrize(
    "kwargs", [{"reg_tokens": 2, "dynamic_img_size": True}, {"class_token": False, "global_pool": "avg"}]
)
def test_prefix_tokens_lead_without_abs_pos(kwargs):
    # timm < 1.0.26 drops the class and register tokens in _pos_embed when pos_embed is None
    model = mt.convert(_vit(**kwargs), pos="rope")
    assert model.pos_embed is None
    x = _images(24, 32) if kwargs.get("dynamic_img_size") else _images()
    patches = model.patch_embed(x)
    tokens = model.embed_positions(patches, model.token_coords(x.shape[-2:]))
    prefix = [t.expand(2, -1, -1) for t in (model.cls_token, model.reg_token) if t is not None]
    assert torch.equal(tokens, torch.cat([*prefix, patches.reshape(2, -1, 32)], dim=1))


def test_attention_without_attn_dim_is_unchanged():
    # timm < 1.0.21's Attention has no attn_dim: the width comes from num_heads * head_dim
    block = _vit(depth=1).blocks[0]
    x = torch.randn(2, 17, 32, generator=torch.Generator().manual_seed(3))
    want = mt.PositionalAttention(block.attn)(x, None)
    if hasattr(block.attn, "attn_dim"):
        del block.attn.attn_dim
    attn = mt.PositionalAttention(block.attn)
    assert attn.attn_dim == 32
    assert torch.equal(attn(x, None), want)


def test_forward_intermediates_equal_timm():
    ref = _vit(reg_tokens=2, dynamic_img_size=True)
    model = mt.convert(copy.deepcopy(ref), pos="none", keep_abs_pos=True)
    x = _images(24, 40)
    with torch.no_grad():
        for kw in [
            {"indices": 2},
            {"indices": [0], "norm": True, "output_fmt": "NLC", "return_prefix_tokens": True},
            {"indices": 1, "stop_early": True, "output_dict": True, "return_prefix_tokens": True},
        ]:
            got, want = model.forward_intermediates(x, **kw), ref.forward_intermediates(x, **kw)
            torch.testing.assert_close(got, want, rtol=0, atol=0)
        assert [t.shape for t in model.get_intermediate_layers(x, 2, reshape=True)] == [(2, 32, 3, 5)] * 2


def test_learned_from_timm_checkpoint_equals_timm():
    """timm's pos_embed moves into the ``learned`` encoder (and back) and gives the same outputs."""
    ref = _vit(reg_tokens=1, dynamic_img_size=True)
    model = mt.convert(_vit(seed=5, reg_tokens=1, dynamic_img_size=True), pos="learned")
    assert model.pos_embed is None
    report = mt.load_state_dict_report(model, ref.state_dict())
    assert report.renamed == (("pos_embed", "pos_encoders.learned.pos_embed"),)
    assert report.new == () and report.dropped == () and report.mismatched == ()
    for h, w in [(32, 32), (24, 40), (48, 56)]:  # the learned table is resampled like timm's
        x = _images(h, w)
        with torch.no_grad():
            torch.testing.assert_close(model(x), ref(x), rtol=0, atol=0)
    back = _vit(seed=7, reg_tokens=1, dynamic_img_size=True)
    assert mt.load_state_dict_report(back, model.state_dict()).renamed == (
        ("pos_encoders.learned.pos_embed", "pos_embed"),
    )
    assert torch.equal(back.pos_embed, ref.pos_embed)


# ---------------------------------------------------------------- wiring
def test_encoders_get_context_and_coords(spy):
    model = mt.convert(_vit(reg_tokens=2, dynamic_img_size=True, depth=3), pos=spy)
    assert model.pos_embed is not None  # bias-only: the absolute embedding is kept by default
    encoders = [b.attn.pos_encoders["spy"] for b in model.blocks]
    assert [e.context["layer"] for e in encoders] == [0, 1, 2]
    assert encoders[0].context == {
        "dim": 32,
        "num_heads": 4,
        "head_dim": 8,
        "depth": 3,
        "grid_size": (4, 4),
        "layer": 0,
        "axes": ("h", "w"),
    }
    with torch.no_grad():
        model(_images(24, 40))
    coords = encoders[2].seen[-1]
    assert coords.grid_shape == (3, 5) and coords.num_prefix_tokens == 3 and coords.axes == ("h", "w")
    expected = Coords.grid(3, 5, num_prefix_tokens=3)
    assert torch.equal(coords.pos, expected.pos)
    assert all(len(e.seen) == 1 for e in encoders)


def test_rope_changes_outputs_and_removes_abs_pos():
    ref = _vit(dynamic_img_size=True)
    model = mt.convert(copy.deepcopy(ref), pos="rope")
    assert model.pos_embed is None and "pos_embed" not in model.state_dict()
    x = _images(32, 32)
    with torch.no_grad():
        assert not torch.allclose(model(x), ref(x))
        out = model(_images(40, 24))  # non-square, other resolution
    assert out.shape == (2, 5) and torch.isfinite(out).all()
    kept = mt.convert(copy.deepcopy(ref), pos="rope", keep_abs_pos=True)
    assert torch.equal(kept.pos_embed, ref.pos_embed)


def test_rope_is_applied_in_attention():
    """One converted attention layer equals SDPA on q, k rotated by the encoder at the token grid."""
    model = mt.convert(_vit(dynamic_img_size=True), pos="rope")
    attn = model.blocks[0].attn
    x = torch.randn(2, 1 + 12, 32)
    coords = Coords.grid(3, 4, num_prefix_tokens=1)
    q, k, v = attn.qkv(x).reshape(2, 13, 3, 4, 8).permute(2, 0, 3, 1, 4)
    rope = model.pos_rotary["rope"]  # a fixed plan: one instance shared by every block
    assert len(attn.pos_encoders) == 0
    q, k = rope.rotate(q, k, coords)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(2, 13, 32)
    torch.testing.assert_close(attn(x, coords, rotations=[rope.rotation(coords)]), attn.proj(expected))
    # the class token carries no position: position 0 leaves q / k unchanged
    q0, k0, _ = attn.qkv(x).reshape(2, 13, 3, 4, 8).permute(2, 0, 3, 1, 4)
    assert torch.equal(q[:, :, 0], q0[:, :, 0]) and torch.equal(k[:, :, 0], k0[:, :, 0])


def test_sincos_added_at_embedding_stage():
    model = mt.convert(_vit(reg_tokens=1, dynamic_img_size=True), pos="sincos")
    x = _images(16, 24)
    tokens, _coords, _ = model._tokens(x)
    patches = model.patch_embed(x).reshape(2, 6, 32)
    rows, cols = torch.meshgrid(torch.arange(2.0), torch.arange(3.0), indexing="ij")
    grid = torch.stack([rows, cols], -1).reshape(1, 6, 2)  # row-major (h, w)
    torch.testing.assert_close(tokens[:, 2:], patches + sincos_embed(grid, 32))
    assert torch.equal(tokens[:, 0], model.cls_token[:, 0].expand(2, -1))  # prefix tokens: no position
    assert torch.equal(tokens[:, 1], model.reg_token[:, 0].expand(2, -1))


def test_create_vit_and_direct_class():
    model = mt.create_vit(
        "vit_tiny_patch16_224", pos=["rope", "sincos"], img_size=32, depth=1, num_classes=3, dynamic_img_size=True
    )
    assert set(model.pos_rotary) == {"rope"} and set(model.pos_encoders) == {"sincos"}
    assert model(_images(48, 32)).shape == (2, 3)
    direct = mt.PositionalVisionTransformer(pos="rope", **TINY)
    assert set(direct.pos_rotary) == {"rope"} and direct.pos_embed is None


def test_reconvert_replaces_encoders(spy):
    model = mt.convert(_vit(dynamic_img_size=True), pos="rope")
    mt.convert(model, pos=spy)
    assert set(model.blocks[0].attn.pos_encoders) == {"spy"} and len(model.pos_rotary) == 0
    with torch.no_grad():
        model(_images())


# ---------------------------------------------------------------- checkpoints
def test_checkpoint_transfer_between_encoders():
    source = mt.convert(_vit(seed=1), pos="learned")
    target = mt.convert(_vit(seed=2, num_classes=7), pos="rope")
    before = {k: v.clone() for k, v in target.state_dict().items()}
    report = mt.load_state_dict_report(target, source.state_dict())
    assert report.dropped == ("pos_encoders.learned.pos_embed",)
    assert set(report.mismatched) == {"head.weight", "head.bias"}
    assert report.new == ()
    state = target.state_dict()
    for key in report.kept:
        assert torch.equal(state[key], source.state_dict()[key]), key
    for key in report.mismatched:
        assert torch.equal(state[key], before[key]), key
    # and back: the learned table is new, so it keeps its initialisation
    back = mt.convert(_vit(seed=3), pos="learned")
    table = back.pos_encoders["learned"].pos_embed.detach().clone()
    report = mt.load_state_dict_report(back, target.state_dict())
    assert report.new == ("pos_encoders.learned.pos_embed",)
    assert torch.equal(back.pos_encoders["learned"].pos_embed, table)
    assert "1 new" in str(report) and "new: pos_encoders.learned.pos_embed" in str(report)


# ---------------------------------------------------------------- training paths
def test_compile_and_checkpointing():
    model = mt.convert(_vit(dynamic_img_size=True, reg_tokens=1, depth=1), pos=["rope", "sincos"])
    x = _images(24, 32)
    with torch.no_grad():
        eager = model(x)
        compiled = torch.compile(model, backend="eager", fullgraph=True)(x)
    torch.testing.assert_close(compiled, eager)
    model.train()
    model(x).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model.set_grad_checkpointing(True)
    model(x).sum().backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[name], msg=name)


def test_no_weight_decay_names_encoder_tables():
    model = mt.convert(_vit(), pos="learned")
    assert "pos_encoders.learned.pos_embed" in model.no_weight_decay()


# ---------------------------------------------------------------- errors
def test_bad_input():
    with pytest.raises(ValueError, match="unknown encoder"):
        mt.convert(_vit(), pos="no-such-encoder")
    with pytest.raises(ValueError, match="pos_kwargs"):
        mt.convert(_vit(), pos="rope", pos_kwargs={"sincos": {}})
    with pytest.raises(ValueError, match="conv_after"):
        mt.convert(_vit(), pos="rope", conv_after=(2,))
    with pytest.raises(TypeError, match="keep_abs_pos must be True, False or None"):
        mt.convert(_vit(), pos="rope", keep_abs_pos="yes")
    with pytest.raises(ValueError, match="model must be a timm VisionTransformer"):
        mt.convert(torch.nn.Linear(2, 2), pos="rope")
    dropping = _vit(patch_drop_rate=0.5)
    with pytest.raises(ValueError, match="patch_drop_rate"):
        mt.convert(dropping, pos="rope")
    assert type(dropping) is VisionTransformer and type(dropping.blocks[0]).__name__ == "Block"  # left alone
    assert dropping.pos_embed is not None and not hasattr(dropping, "pos_rotary")
    with pytest.raises(ValueError, match="not a timm VisionTransformer"):
        mt.create_vit("vit_relpos_small_patch16_224", pos="rope", img_size=32, depth=1)
    model = _vit()
    with pytest.raises(ValueError, match="repeat"):
        mt.convert(model, pos=["rope", "rope"])
    assert type(model) is VisionTransformer  # a failed conversion leaves the model alone


# ---------------------------------------------------------------- encoders written by others
@pytest.mark.parametrize(
    "name", ["irpe-product-ctx-k", "irpe-product-ctx-qkv", "peg", "fuzzy", "rope-axial", "rope-mixed", "fourier"]
)
def test_vision_encoders_in_timm(name):
    assert _registered(name), f"encoder {name!r} is not registered"  # a lost registration fails here
    ref = _vit(reg_tokens=1, dynamic_img_size=True)
    model = mt.convert(copy.deepcopy(ref), pos=name)
    kind = registry.encoder_info(name).kind
    assert (model.pos_embed is not None) == (kind == "bias")
    x = _images(24, 40)
    model.train()
    out = model(x)
    assert out.shape == (2, 5) and torch.isfinite(out).all()
    out.square().sum().backward()
    params = [p for n, p in model.named_parameters() if "pos_encoders" in n or "pos_convs" in n]
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in params)
    model.eval()
    with torch.no_grad():
        assert not torch.allclose(model(x), mt.convert(copy.deepcopy(ref), pos="none")(x))


def test_peg_after_listed_blocks():
    model = mt.convert(_vit(depth=3, dynamic_img_size=True), pos="peg", conv_after=(0, 2))
    assert set(model.pos_convs) == {"0", "2"}
    assert "pos_convs.2.peg.proj.weight" in model.no_weight_decay()
    calls = []
    for i in ("0", "2"):
        model.pos_convs[i]["peg"].register_forward_hook(lambda m, a, o, i=i: calls.append((i, a[1].grid_shape)))
    with torch.no_grad():
        model(_images(16, 40))
    assert calls == [("0", (2, 5)), ("2", (2, 5))]


def test_learned_checkpoint_into_irpe_starts_from_the_same_function():
    """iRPE keeps the absolute embedding and its tables start at zero (as the reference)."""
    source = mt.convert(_vit(seed=1, dynamic_img_size=True), pos="learned")
    target = mt.convert(_vit(seed=2, dynamic_img_size=True), pos="irpe-product-ctx-k")
    report = mt.load_state_dict_report(target, source.state_dict())
    assert report.renamed == (("pos_encoders.learned.pos_embed", "pos_embed"),)
    assert report.dropped == () and len(report.new) == 2  # one table per layer
    x = _images(24, 40)
    with torch.no_grad():
        torch.testing.assert_close(target(x), source(x))


# ---------------------------------------------------------------- timm's own RoPE ViTs (Eva)
EVA_TINY = {"img_size": 32, "patch_size": 8, "embed_dim": 64, "num_heads": 4, "depth": 2, "num_classes": 3}
EVA_MODELS = [
    ("vit_small_patch16_rope_224", {}),  # rope-vit axial: xy order, theta 100, class token
    ("vit_small_patch16_rope_mixed_224", {}),  # rope-vit mixed: learned per-layer frequencies
    ("vit_medium_patch16_rope_reg1_gap_256", {}),  # axial with ref_feat_shape rescaling, a register token
    ("vit_small_patch16_rope_224", {"dynamic_img_size": True}),
]


def _eva(name, seed=0, **kwargs):
    if name not in timm.list_models(name):
        pytest.skip(f"this timm has no {name}")
    torch.manual_seed(seed)
    return timm.create_model(name, pretrained=False, **{**EVA_TINY, **kwargs}).eval()


@pytest.mark.parametrize(("name", "kwargs"), EVA_MODELS, ids=[f"{n}{'-dyn' if k else ''}" for n, k in EVA_MODELS])
def test_eva_own_rope_through_mmpos_gives_the_models_outputs(name, kwargs):
    ref = _eva(name, **kwargs)
    encoder, enc_kwargs = mt.eva_rope(ref)
    model = mt.convert(copy.deepcopy(ref), encoder, {encoder: enc_kwargs})
    assert isinstance(model.rope, mt.EvaRotary) and model.rope_mixed == (encoder == "rope-mixed")
    sizes = [(32, 32), (24, 40)] if kwargs else [(32, 32)]
    for h, w in sizes:
        x = _images(h, w)
        with torch.no_grad():
            assert torch.equal(model(x), ref(x)), (h, w)  # bit-identical: same frequencies, positions, layout
        feats = model.forward_intermediates(x, indices=1, intermediates_only=True)
        assert torch.equal(feats[0], ref.forward_intermediates(x, indices=1, intermediates_only=True)[0])


def test_eva_swaps_its_rope_for_another_mmpos_encoder():
    ref = _eva("vit_small_patch16_rope_224")
    model = mt.convert(copy.deepcopy(ref), "rope-mixed")  # axial -> learned per layer
    assert model.rope_mixed and len(model.rope.pos_layers) == 2
    assert model.rope.pos_layers[0]["rope-mixed"].convention == "interleaved"  # the model's rotation layout
    assert {"rope.pos_layers.0.rope-mixed.weight", "rope.pos_layers.1.rope-mixed.weight"} <= model.no_weight_decay()
    x = _images()
    out = model(x)
    out.sum().backward()
    assert model.rope.pos_layers[1]["rope-mixed"].weight.grad.abs().sum() > 0
    nope = mt.convert(copy.deepcopy(ref), "none")
    assert nope.rope is None
    with torch.no_grad():  # init_values=1e-5 layer scale: the blocks barely move the tokens, yet they differ
        assert not torch.equal(nope(x), ref(x))
    with pytest.raises(ValueError, match="rotary encoders only"):
        mt.convert(copy.deepcopy(ref), "learned")
    with pytest.raises(ValueError, match="convention='half' but the model rotates 'interleaved'"):
        mt.convert(copy.deepcopy(ref), "rope", {"rope": {"convention": "half"}})
    with pytest.raises(ValueError, match="one rotary encoder"):
        mt.convert(copy.deepcopy(ref), ["rope", "rope-mixed"])
    with pytest.raises(TypeError, match="timm Eva model"):
        mt.eva_rope(_vit())


@pytest.mark.parametrize(
    ("name", "pos", "extra"),
    [
        ("vit_small_patch16_rope_mixed_224", "rope-mixed", {}),
        ("vit_tiny_patch16_224", "irpe", {"depth": 2, "embed_dim": 32, "num_heads": 4}),
    ],
)
def test_checkpoint_records_the_encoder_and_create_vit_rebuilds_it(tmp_path, name, pos, extra):
    kwargs = {**EVA_TINY, **extra} if "rope" in name else {"img_size": 32, "patch_size": 8, "num_classes": 3, **extra}
    if name not in timm.list_models(name):
        pytest.skip(f"this timm has no {name}")
    torch.manual_seed(0)
    model = mt.create_vit(name, pos=pos, **kwargs).eval()
    record = model.pretrained_cfg["mmpos"]
    assert record["model_name"] == name and record["pos"] == pos and record["model_kwargs"] == kwargs
    path = tmp_path / "model.pt"
    mt.save_checkpoint(model, path)
    torch.manual_seed(1)  # another init: the weights must come from the file
    rebuilt = mt.create_vit(checkpoint=path).eval()
    x = _images()
    with torch.no_grad():
        assert torch.equal(rebuilt(x), model(x))
    with pytest.raises(ValueError, match="pos is required"):
        mt.create_vit(name, **kwargs)
    torch.save(model.state_dict(), tmp_path / "plain.pt")
    with pytest.raises(ValueError, match="not written by save_checkpoint"):
        mt.create_vit(checkpoint=tmp_path / "plain.pt")


# ---------------------------------------------------------------- a target grid ("train at 14x14, run at 28x28")
def _rope_axial(model):
    return model.pos_rotary["rope-axial"]


def test_train_grid_sets_the_rule_factor_from_the_model_grid():
    """A model built for 28x28 patches with ``train_grid=(14, 14)``: factor 2 and L0 14 on both axes, the plan
    equals mmpos.scaling.yarn of the unscaled plan, and the model equals the one given the rule in pos_kwargs."""
    from mmpos.rotary import FrequencyPlan
    from mmpos.scaling import RopeScaling, yarn

    big = {"img_size": 112, "patch_size": 4}  # 28 x 28 patches
    model = mt.convert(_vit(**big), "rope-axial", scaling="yarn", train_grid=(14, 14))
    enc = _rope_axial(model)
    assert enc.scaling == RopeScaling("yarn", {"h": 2.0, "w": 2.0}, {"h": 14.0, "w": 14.0})
    plain = _rope_axial(mt.convert(_vit(**big), "rope-axial"))
    plan, factor = yarn(FrequencyPlan(plain.weight, plain.axes, plain.head_dim), 2.0, 14)
    assert torch.equal(enc.weight, plan.weight) and enc.attention_factor == factor == pytest.approx(
        0.1 * 0.6931 + 1, abs=1e-4
    )
    given = mt.convert(_vit(**big), "rope-axial", {"rope-axial": {"scaling": RopeScaling("yarn", 2.0, 14)}})
    x = _images(112, 112)
    with torch.no_grad():
        out = model(x)
        assert torch.equal(out, given(x))
        assert not torch.allclose(out, mt.convert(_vit(**big), "rope-axial")(x))


def test_target_grid_interpolates_positions_and_loads_the_trained_weights():
    """A model trained at 14x14 (``img_size=56``) run at 28x28 with ``scaling="linear"``: the rotation at the
    28x28 grid is the unscaled one at half the coordinates (PI), and the trained state dict loads strictly."""
    small = {"img_size": 56, "patch_size": 4, "dynamic_img_size": True}
    trained = mt.convert(_vit(**small), "rope-axial")
    model = mt.convert(_vit(**small), "rope-axial", scaling="linear", target_grid=(28, 28))
    model.load_state_dict(trained.state_dict())  # plans are non-persistent buffers: nothing to convert
    coords = Coords.grid(28, 28)
    torch.testing.assert_close(
        _rope_axial(model).angles(coords), _rope_axial(trained).angles(coords.scaled(0.5)), rtol=1e-6, atol=1e-6
    )
    with torch.no_grad():
        assert model(_images(112, 112)).shape == (2, 5)


def test_grid_factors_follow_the_axis_names_of_any_plan():
    """Non-square grids: the factor of ``h`` and ``w`` reaches each axis by name, whatever the plan's axis order."""
    model = mt.convert(
        _vit(img_size=(112, 56), patch_size=4),
        "rope-axial",
        {"rope-axial": {"axes": ("w", "h")}},
        scaling="ntk",
        train_grid=(14, 7),
    )  # 28 x 14 patches
    enc = _rope_axial(model)
    assert enc.axes == ("w", "h") and enc.scaling.per_axis("factor", enc.axes) == (2.0, 2.0)
    model = mt.convert(_vit(img_size=(112, 56), patch_size=4), "rope-axial", scaling="ntk", train_grid=(14, 14))
    assert _rope_axial(model).scaling.per_axis("factor", ("h", "w")) == (2.0, 1.0)


def test_grid_rule_is_recorded_in_the_checkpoint(tmp_path):
    model = mt.create_vit(
        "vit_tiny_patch16_224",
        pos=["learned", "rope-axial"],
        scaling="dynamic",
        train_grid=(2, 2),
        img_size=64,
        depth=1,
        embed_dim=32,
        num_heads=2,
        num_classes=3,
    )  # 4 x 4 patches
    rule = {"rule": "dynamic", "factor": {"h": 2.0, "w": 2.0}, "original_size": {"h": 2.0, "w": 2.0}}
    assert model.pretrained_cfg["mmpos"]["pos_kwargs"] == {"rope-axial": {"scaling": rule}}
    path = tmp_path / "vit.pt"
    mt.save_checkpoint(model, path)
    again = mt.create_vit(checkpoint=path).eval()
    assert _rope_axial(again).scaling == _rope_axial(model).scaling and _rope_axial(again).rescale is not None
    x = _images(64, 64)
    with torch.no_grad():
        assert torch.equal(again(x), model.eval()(x))


def test_grid_scaling_errors():
    with pytest.raises(ValueError, match="needs train_grid or target_grid"):
        mt.convert(_vit(), "rope-axial", scaling="yarn")
    with pytest.raises(ValueError, match="pass scaling='<rule>'"):
        mt.convert(_vit(), "rope-axial", train_grid=(2, 2))
    with pytest.raises(ValueError, match="has none"):
        mt.convert(_vit(), "learned", scaling="linear", train_grid=(2, 2))
    with pytest.raises(ValueError, match="given twice"):
        mt.convert(
            _vit(),
            "rope-axial",
            {"rope-axial": {"scaling": {"rule": "linear", "factor": 2}}},
            scaling="linear",
            train_grid=(2, 2),
        )
    with pytest.raises(ValueError, match="a RopeScaling carries its own factor"):
        mt.convert(_vit(), "rope-axial", scaling={"rule": "linear", "factor": 2}, train_grid=(2, 2))
    with pytest.raises(ValueError, match="rule must be one of"):
        mt.convert(_vit(), "rope-axial", scaling="ntk-aware", train_grid=(2, 2))
    with pytest.raises(ValueError, match="train_grid must hold one side per axis"):
        mt.convert(_vit(), "rope-axial", scaling="linear", train_grid=(2, 2, 2))
    model = _vit()
    with pytest.raises(ValueError, match="needs train_grid"):
        mt.convert(model, "rope-axial", scaling="yarn")
    assert type(model) is VisionTransformer  # a refused conversion leaves the model as it was
