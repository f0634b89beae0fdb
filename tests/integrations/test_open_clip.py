import copy

import open_clip
import pytest
import torch

from mmpos.coords import Coords
from mmpos.encoders import registry
from mmpos.integrations import open_clip as mo
from mmpos.integrations import timm as mt

pytestmark = [pytest.mark.open_clip, pytest.mark.timm]  # oldest and newest releases

TEXT = {"context_length": 16, "vocab_size": 100, "width": 32, "heads": 2, "layers": 1}


def _vision(**kwargs):
    return {"image_size": 32, "patch_size": 8, "width": 64, "layers": 2, "head_width": 16, **kwargs}


def _clip(seed=0, **vision):
    torch.manual_seed(seed)
    return open_clip.create_model("ViT-B-32", embed_dim=32, vision_cfg=_vision(**vision), text_cfg=TEXT).eval()


def _images(h=32, w=32, b=2, seed=1):
    return torch.randn(b, 3, h, w, generator=torch.Generator().manual_seed(seed))


def _registered(name):
    return name in {e.name for e in registry.list_encoders()}


# ---------------------------------------------------------------- faithfulness
@pytest.mark.parametrize(
    "vision",
    [
        {},
        {"ls_init_value": 0.1, "pool_type": "avg", "output_tokens": True},
        {"qk_norm": True, "scale_heads": True, "scale_attn_inner": True, "scale_attn": True, "scale_fc": True},
    ],
)
def test_no_change_equals_open_clip(vision):
    ref = _clip(**vision)
    model = mo.convert(copy.deepcopy(ref), pos="none", keep_abs_pos=True)
    assert isinstance(model.visual, mo.PositionalCLIPVisionTransformer)
    assert model.state_dict().keys() == ref.state_dict().keys()
    x = _images()
    # with autograd on, nn.MultiheadAttention runs the same SDPA path: bit-identical
    torch.testing.assert_close(model.visual(x), ref.visual(x), rtol=0, atol=0)
    # torch's inference fast path of nn.MultiheadAttention rounds differently
    with torch.no_grad():
        torch.testing.assert_close(model.visual(x), ref.visual(x), rtol=1e-5, atol=1e-6)
    model.train(), ref.train()
    for m in (model, ref):
        out = m.visual(x)
        sum(t.square().sum() for t in (out if isinstance(out, tuple) else (out,))).backward()
    reference = dict(ref.visual.named_parameters())
    for name, p in model.visual.named_parameters():
        # nn.MultiheadAttention's backward projects a transposed layout: float rounding only
        torch.testing.assert_close(p.grad, reference[name].grad, rtol=1e-5, atol=1e-6, msg=name)


def test_forward_intermediates_equal_open_clip():
    ref = _clip()
    model = mo.convert(copy.deepcopy(ref), pos="none", keep_abs_pos=True)
    x = _images()
    calls = [
        {"indices": 2},
        {"indices": [0], "normalize_intermediates": True, "output_fmt": "NLC", "output_extra_tokens": True},
        {"indices": 1, "stop_early": True, "intermediates_only": True},
    ]
    for kw in calls:
        torch.testing.assert_close(
            model.visual.forward_intermediates(x, **kw), ref.visual.forward_intermediates(x, **kw), rtol=0, atol=0
        )


def test_learned_from_open_clip_checkpoint_equals_open_clip():
    ref = _clip()
    model = mo.convert(_clip(seed=3), pos="learned")
    assert model.visual.positional_embedding is None
    report = mo.load_state_dict_report(model, ref.state_dict())
    assert report.renamed == (("visual.positional_embedding", "visual.pos_encoders.learned.pos_embed"),)
    assert report.new == () and report.dropped == () and report.mismatched == ()
    x = _images()
    torch.testing.assert_close(model.visual(x), ref.visual(x), rtol=0, atol=0)
    back = _clip(seed=4)
    mo.load_state_dict_report(back, model.state_dict())
    assert torch.equal(back.visual.positional_embedding, ref.visual.positional_embedding)


# ---------------------------------------------------------------- wiring
def test_encoders_get_context_and_coords(spy):
    model = mo.convert(_clip(), pos=spy)
    visual = model.visual
    assert visual.positional_embedding is not None  # bias only: kept by default
    encoders = [b.attn.pos_encoders["spy"] for b in visual.transformer.resblocks]
    assert encoders[1].context == {
        "dim": 64,
        "num_heads": 4,
        "head_dim": 16,
        "depth": 2,
        "grid_size": (4, 4),
        "layer": 1,
        "axes": ("h", "w"),
    }
    visual(_images(24, 40))  # the kept table is resampled to the 3 x 5 grid
    coords = encoders[0].seen[-1]
    assert coords.grid_shape == (3, 5) and coords.num_prefix_tokens == 1
    assert torch.equal(coords.pos, Coords.grid(3, 5, num_prefix_tokens=1).pos)


def test_rope_tower_any_resolution():
    ref = _clip()
    model = mo.convert(copy.deepcopy(ref), pos="rope")
    assert model.visual.positional_embedding is None
    x = _images()
    with torch.no_grad():
        assert not torch.allclose(model.encode_image(x), ref.encode_image(x))
        out = model.encode_image(_images(24, 48))  # non-square, another resolution
    assert out.shape == (2, 32) and torch.isfinite(out).all()


def test_kept_table_is_resampled_like_timm():
    from timm.layers import resample_abs_pos_embed

    model = mo.convert(_clip(), pos="none", keep_abs_pos=True).visual
    table = model.positional_embedding
    got = model._abs_pos_embed((3, 5))
    want = resample_abs_pos_embed(table[None], [3, 5], [4, 4], num_prefix_tokens=1)[0]
    assert got.shape == (16, 64) and torch.equal(got, want) and torch.equal(got[0], table[0])
    assert model._abs_pos_embed((4, 4)) is table


def test_checkpoint_transfer_between_encoders():
    source = mo.convert(_clip(seed=1), pos="learned")
    target = mo.convert(_clip(seed=2), pos="sincos")
    report = mo.load_state_dict_report(target, source.state_dict())
    assert report.dropped == ("visual.pos_encoders.learned.pos_embed",)
    assert report.new == () and report.mismatched == ()
    assert torch.equal(target.visual.conv1.weight, source.visual.conv1.weight)
    assert torch.equal(target.positional_embedding, source.positional_embedding)  # the text tower's


def test_contrastive_training_reduces_loss():
    torch.manual_seed(0)
    model = mo.create_model("ViT-B-32", pos="rope", embed_dim=32, vision_cfg=_vision(), text_cfg=TEXT, output_dict=True)
    model.train()
    images = _images(b=8)
    text = torch.randint(0, 100, (8, 16), generator=torch.Generator().manual_seed(2))
    loss_fn = open_clip.ClipLoss()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(6):
        out = model(images, text)
        loss = loss_fn(out["image_features"], out["text_features"], out["logit_scale"])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.1, losses


def test_grad_checkpointing_gives_the_same_gradients():
    model = mo.convert(_clip(), pos=["rope", "sincos"]).train()
    x = _images()
    model.encode_image(x).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.visual.named_parameters()}
    model.zero_grad()
    model.set_grad_checkpointing(True)
    model.encode_image(x).sum().backward()
    for name, p in model.visual.named_parameters():
        torch.testing.assert_close(p.grad, grads[name], msg=name)


def test_timm_tower_is_converted_by_the_timm_integration():
    torch.manual_seed(0)
    vision = {
        "timm_model_name": "vit_tiny_patch16_224",
        "timm_model_pretrained": False,
        "timm_pool": "token",
        "timm_proj": "linear",
        "image_size": 224,
    }
    plain = open_clip.create_model("ViT-B-32", embed_dim=32, vision_cfg=vision, text_cfg=TEXT).eval()
    model = mo.convert(copy.deepcopy(plain), pos="rope")
    assert isinstance(model.visual.trunk, mt.PositionalVisionTransformer)
    assert set(model.visual.trunk.pos_rotary) == {"rope"}
    x = _images(224, 224, b=1)
    with torch.no_grad():
        assert model.encode_image(x).shape == (1, 32)
    learned = mo.convert(copy.deepcopy(plain), pos="learned")
    report = mo.load_state_dict_report(learned, plain.state_dict())
    assert report.renamed == (("visual.trunk.pos_embed", "visual.trunk.pos_encoders.learned.pos_embed"),)
    with torch.no_grad():
        torch.testing.assert_close(learned.encode_image(x), plain.encode_image(x), rtol=0, atol=0)


def test_bad_input():
    with pytest.raises(ValueError, match="scaled cosine"):
        mo.convert(_clip(scaled_cosine_attn=True), pos="rope")
    with pytest.raises(ValueError, match="patch_dropout"):
        mo.convert(_clip(patch_dropout=0.5), pos="rope")
    with pytest.raises(ValueError, match="visual tower"):
        mo.convert(torch.nn.Linear(2, 2), pos="rope")
    with pytest.raises(ValueError, match="conv_after"):
        mo.convert(_clip(), pos="rope", conv_after=(5,))


# ---------------------------------------------------------------- encoders written by others
@pytest.mark.parametrize("name", ["irpe-product-ctx-k", "peg", "fuzzy", "rope-axial", "rope-mixed", "fourier"])
def test_vision_encoders_in_open_clip(name):
    assert _registered(name), f"encoder {name!r} is not registered"  # a lost registration fails here
    ref = _clip()
    model = mo.convert(copy.deepcopy(ref), pos=name).train()
    out = model.encode_image(_images(24, 40))
    assert out.shape == (2, 32) and torch.isfinite(out).all()
    out.square().sum().backward()
    params = [p for n, p in model.named_parameters() if "pos_encoders" in n or "pos_convs" in n]
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in params)
    model.eval()
    with torch.no_grad():
        x = _images()
        assert not torch.allclose(model.encode_image(x), mo.convert(copy.deepcopy(ref), pos="none").encode_image(x))


def test_create_model_and_transforms_converts_the_tower_and_keeps_open_clips_transforms():
    from PIL import Image

    kwargs = {"embed_dim": 32, "vision_cfg": _vision(), "text_cfg": TEXT}
    torch.manual_seed(0)
    model, train, val = mo.create_model_and_transforms("ViT-B-32", pos="rope-axial", **kwargs)
    torch.manual_seed(0)
    _, ref_train, ref_val = open_clip.create_model_and_transforms("ViT-B-32", **kwargs)
    assert isinstance(model.visual, mo.PositionalCLIPVisionTransformer) and model.visual.positional_embedding is None
    assert set(model.visual.pos_rotary) == {"rope-axial"}
    assert repr(train) == repr(ref_train) and repr(val) == repr(ref_val)
    image = Image.fromarray((torch.rand(40, 56, 3) * 255).to(torch.uint8).numpy())
    x = val(image).unsqueeze(0)  # (1, 3, 32, 32): resized and cropped to the model's image size
    assert torch.equal(x, ref_val(image).unsqueeze(0))
    model.eval()
    with torch.no_grad():
        feats = model.encode_image(x)
    assert feats.shape == (1, 32) and torch.isfinite(feats).all()
    kept, *_ = mo.create_model_and_transforms("ViT-B-32", pos="none", keep_abs_pos=True, **kwargs)
    assert kept.visual.positional_embedding is not None
    with pytest.raises(ValueError, match="jit=True"):
        mo.create_model_and_transforms("ViT-B-32", pos="rope", jit=True, **kwargs)
    with pytest.raises(TypeError, match="pos"):
        mo.create_model_and_transforms("ViT-B-32", **kwargs)


# ---------------------------------------------------------------- a target grid ("train at 4x4, run at 8x8")
def test_train_grid_sets_the_rule_factor_of_the_tower():
    """A tower built for 8x8 patches with ``train_grid=(4, 4)``: factor 2 and L0 4 per axis; the same outputs as
    the rule given in pos_kwargs, other outputs than no rule; ``create_model`` takes the same arguments."""
    from mmpos.scaling import RopeScaling

    model = mo.convert(_clip(image_size=64), "rope-axial", scaling="yarn", train_grid=(4, 4))
    enc = model.visual.pos_rotary["rope-axial"]
    assert enc.scaling == RopeScaling("yarn", {"h": 2.0, "w": 2.0}, {"h": 4.0, "w": 4.0})
    given = mo.convert(_clip(image_size=64), "rope-axial", {"rope-axial": {"scaling": RopeScaling("yarn", 2.0, 4)}})
    x = _images(64, 64)
    with torch.no_grad():
        out = model.encode_image(x)
        assert torch.equal(out, given.encode_image(x))
        assert not torch.allclose(out, mo.convert(_clip(image_size=64), "rope-axial").encode_image(x))
        torch.manual_seed(0)
        created = mo.create_model(
            "ViT-B-32",
            "rope-axial",
            scaling="yarn",
            train_grid=(4, 4),
            embed_dim=32,
            vision_cfg=_vision(image_size=64),
            text_cfg=TEXT,
        ).eval()
        assert torch.equal(created.encode_image(x), out)


def test_target_grid_interpolates_the_tower_positions():
    """Trained at 4x4 (``image_size=32``), run at 8x8: PI's rotation is the unscaled one at half the coordinates,
    and the trained weights load strictly (the plans are non-persistent buffers)."""
    trained = mo.convert(_clip(), "rope-axial")
    model = mo.convert(_clip(), "rope-axial", scaling="linear", target_grid=(8, 8))
    model.load_state_dict(trained.state_dict())
    coords = Coords.grid(8, 8)
    scaled, plain = model.visual.pos_rotary["rope-axial"], trained.visual.pos_rotary["rope-axial"]
    torch.testing.assert_close(scaled.angles(coords), plain.angles(coords.scaled(0.5)), rtol=1e-6, atol=1e-6)
    with torch.no_grad():
        assert model.encode_image(_images(64, 64)).shape == (2, 32)


def test_timm_trunk_gets_the_grid_rule():
    torch.manual_seed(0)
    vision = {
        "timm_model_name": "vit_tiny_patch16_224",
        "timm_model_pretrained": False,
        "timm_pool": "token",
        "timm_proj": "linear",
        "image_size": 224,
    }
    model = open_clip.create_model("ViT-B-32", embed_dim=32, vision_cfg=vision, text_cfg=TEXT).eval()
    mo.convert(model, "rope-axial", scaling="ntk", train_grid=(7, 7))  # the trunk's 14 x 14 patches
    assert model.visual.trunk.pos_rotary["rope-axial"].scaling.per_axis("factor", ("h", "w")) == (2.0, 2.0)
    with pytest.raises(ValueError, match="needs train_grid or target_grid"):
        mo.convert(_clip(), "rope-axial", scaling="ntk")
