"""One placement path: shared fixed-plan rotary encoders, angles once per forward, old checkpoints, weight decay."""

import open_clip
import pytest
import timm
import torch
from timm.optim import create_optimizer_v2

from mmpos import Coords
from mmpos.encoders.base import RotaryEncoder
from mmpos.integrations import open_clip as mo
from mmpos.integrations import timm as mt
from mmpos.nn import Transformer
from mmpos.nn.attention import attention
from mmpos.nn.placement import Placement, no_weight_decay

pytestmark = [pytest.mark.timm, pytest.mark.open_clip]  # oldest and newest releases

TEXT = {"context_length": 8, "vocab_size": 50, "width": 16, "heads": 2, "layers": 1}
VISION = {"image_size": 32, "patch_size": 8, "width": 32, "layers": 3, "head_width": 8}


def _count_angles(monkeypatch):
    calls = []
    original = RotaryEncoder.angles

    def counting(self, coords):
        calls.append(type(self).__name__)
        return original(self, coords)

    monkeypatch.setattr(RotaryEncoder, "angles", counting)
    return calls


def test_fixed_plans_are_shared_learnable_plans_per_layer():
    model = Transformer(32, 3, 4, pos=["rope-axial", "irpe", "rope-mixed"], grid_size=(3, 4), axes=("h", "w"))
    assert set(model.pos_rotary) == {"rope-axial"}
    owned = [{k: type(e).__name__ for k, e in b.attn.encoders.items()} for b in model.blocks]
    assert owned == [{"irpe": "IRPE", "rope-mixed": "MixedRoPE"}] * 3
    mixed = [b.attn.encoders["rope-mixed"].weight for b in model.blocks]
    assert mixed[0] is not mixed[1] and not torch.equal(mixed[0], mixed[1])  # each layer its own random frame
    assert not any(k.startswith("pos_rotary.") for k in model.state_dict())  # a fixed plan: non-persistent


@pytest.mark.parametrize("pos", [["rope-axial", "irpe"], ["rope", "rope-mixed"], ["mrope"]])
def test_angles_once_per_forward_equal_per_layer_rotation(monkeypatch, pos):
    torch.manual_seed(0)
    depth = 3
    model = Transformer(32, depth, 4, pos=pos, grid_size=(3, 4), axes=("h", "w") if pos != ["mrope"] else None).eval()
    coords = Coords.grid(3, 4, num_prefix_tokens=1, batch=2)
    if pos == ["mrope"]:
        coords = Coords.grid(1, 3, 4, num_prefix_tokens=1, batch=2)
    x = torch.randn(2, 13, 32)
    calls = _count_angles(monkeypatch)
    with torch.no_grad():
        out = model(x, coords)
    shared = len(model.pos_rotary)
    owned = sum(isinstance(e, RotaryEncoder) for e in model.blocks[0].attn.encoders.values())
    assert len(calls) == shared + depth * owned  # shared plans: once per forward, not once per layer
    # reference: every layer rotates with the encoder modules themselves (the per-layer path)
    with torch.no_grad():
        h = x
        for block in model.blocks:
            a, y = block.attn, block.norm1(h)
            q = a.q(y).view(2, 13, 4, 8).transpose(1, 2)
            k, v = a.kv(y).view(2, 13, 2, 4, 8).permute(2, 0, 3, 1, 4)
            o = attention(q, k, v, coords, [*model.pos_rotary.values(), *a.encoders.values()])
            h = h + a.proj(o.transpose(1, 2).reshape(2, 13, 32))
            h = h + block.mlp(block.norm2(h))
        torch.testing.assert_close(out, model.norm(h))


def test_transformer_keys_encoders_by_name():
    """``pos_*`` dicts and each block's encoders are keyed by name: a checkpoint's iRPE tables load into a
    model with another rotary encoder beside them (no renumbering)."""
    torch.manual_seed(0)
    model = Transformer(32, 2, 4, pos=["rope-axial", "irpe", "learned"], grid_size=(3, 4), axes=("h", "w"))
    state = model.state_dict()
    assert {k for k in state if ".attn.encoders." in k} == {f"blocks.{i}.attn.encoders.irpe.k_table" for i in range(2)}
    assert "pos_encoders.learned.pos_embed" in state
    other = Transformer(32, 2, 4, pos=["irpe", "rope-mixed", "learned"], grid_size=(3, 4), axes=("h", "w"))
    missing, unexpected = other.load_state_dict(state, strict=False)
    assert unexpected == [] and all("rope-mixed" in k for k in missing)
    assert torch.equal(other.blocks[1].attn.encoders["irpe"].k_table, model.blocks[1].attn.encoders["irpe"].k_table)


def test_converted_models_share_fixed_plans_and_keep_their_keys(monkeypatch):
    torch.manual_seed(0)
    plain = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=3, num_classes=3)
    keys = set(plain.state_dict()) - {"pos_embed"}
    model = mt.convert(plain, pos=["rope-axial", "rope-mixed"])
    assert set(model.pos_rotary) == {"rope-axial"}
    assert all(set(b.attn.pos_encoders) == {"rope-mixed"} for b in model.blocks)
    assert set(model.state_dict()) == keys | {f"blocks.{i}.attn.pos_encoders.rope-mixed.weight" for i in range(3)}
    calls = _count_angles(monkeypatch)
    with torch.no_grad():
        model(torch.randn(1, 3, 32, 32))
    assert calls.count("AxialRoPE") == 1 and calls.count("MixedRoPE") == 3
    clip = mo.create_model("ViT-B-32", pos="rope-axial", embed_dim=16, vision_cfg=VISION, text_cfg=TEXT)
    calls.clear()
    with torch.no_grad():
        clip.encode_image(torch.randn(1, 3, 32, 32))
    assert calls == ["AxialRoPE"]


def test_no_weight_decay_lists_rope_mixed_frequencies():
    model = mt.create_vit(
        "vit_tiny_patch16_224", pos=["rope-mixed", "learned", "peg"], img_size=32, patch_size=8, depth=2, num_classes=3
    )
    names = model.no_weight_decay()
    assert {"blocks.0.attn.pos_encoders.rope-mixed.weight", "blocks.1.attn.pos_encoders.rope-mixed.weight"} <= names
    assert "pos_encoders.learned.pos_embed" in names and "pos_convs.0.peg.proj.weight" in names
    # timm's optimizer factory reads no_weight_decay(): the frequencies land in the weight_decay=0 group
    opt = create_optimizer_v2(model, "adamw", lr=1e-3, weight_decay=0.05)
    frequencies = {id(b.attn.pos_encoders["rope-mixed"].weight) for b in model.blocks}
    decayed = {id(p) for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    assert frequencies and not frequencies & decayed
    stack = Transformer(32, 2, 4, pos=["rope-mixed", "irpe", "sincos"], grid_size=(3, 4), axes=("h", "w"))
    assert no_weight_decay(stack) == {
        "blocks.0.attn.encoders.rope-mixed.weight",
        "blocks.1.attn.encoders.rope-mixed.weight",
    }
    clip = mo.create_model("ViT-B-32", pos="rope-mixed", embed_dim=16, vision_cfg=VISION, text_cfg=TEXT)
    assert "transformer.resblocks.2.attn.pos_encoders.rope-mixed.weight" in clip.visual.no_weight_decay()


def test_placement_errors():
    context = {"dim": 32, "num_heads": 4, "head_dim": 8, "depth": 2}
    with pytest.raises(ValueError, match="repeat"):
        Placement(["rope", "rope"], None, context)
    with pytest.raises(ValueError, match="pos_kwargs"):
        Placement("rope", {"irpe": {}}, context)
    with pytest.raises(ValueError, match=r"conv_after must hold block indices in \[0, 1\], got \(2,\)"):
        Placement("peg", None, context, conv_after=(2,))
    with pytest.raises(ValueError, match="conv_after must hold block indices"):
        Placement("peg", None, context, conv_after=(0.0,))
    with pytest.raises(TypeError, match="keep_abs_pos must be True, False or None, got 'yes'"):
        Placement("rope", None, context, keep_abs_pos="yes")
    with pytest.raises(ValueError, match="unknown encoder"):
        Transformer(32, 2, 4, pos="nope")
    assert open_clip is not None


def test_grid_scaled_kwargs_sets_one_rule_for_every_rotary_encoder():
    from mmpos.nn.placement import grid_scaled_kwargs
    from mmpos.scaling import RopeScaling

    kwargs = grid_scaled_kwargs(
        ["learned", "rope-axial", "rope-mixed"],
        {"rope-axial": {"theta": 10.0}},
        "linear",
        (28, 14),
        train_grid=(14, 14),
    )
    rule = {"rule": "linear", "factor": {"h": 2.0, "w": 1.0}, "original_size": {"h": 14.0, "w": 14.0}}
    assert kwargs == {"rope-axial": {"theta": 10.0, "scaling": rule}, "rope-mixed": {"scaling": rule}}
    assert RopeScaling.from_dict(rule) == RopeScaling("linear", {"h": 2, "w": 1}, {"h": 14, "w": 14})
    assert grid_scaled_kwargs("rope-axial", None, None, (4, 4)) == {}
    given = RopeScaling("yarn", 2.0, 4)
    assert grid_scaled_kwargs("rope-axial", None, given, (4, 4)) == {"rope-axial": {"scaling": given.to_dict()}}


def test_vision_transformer_target_grid():
    """mmpos's ViT trained at 4x4 patches, built to run at 8x8: its shared rotary plan is the rule's, its
    parameters those of the model without the rule (same init, same state-dict keys)."""
    from mmpos.nn import VisionTransformer
    from mmpos.rotary import FrequencyPlan
    from mmpos.scaling import yarn

    kw = {"img_size": 16, "patch_size": 4, "dim": 32, "depth": 1, "num_heads": 2, "pos": "rope-axial"}
    torch.manual_seed(0)
    trained = VisionTransformer(**kw)
    torch.manual_seed(0)
    model = VisionTransformer(**kw, scaling="yarn", target_grid=(8, 8))
    plain, enc = trained.transformer.pos_rotary["rope-axial"], model.transformer.pos_rotary["rope-axial"]
    plan, factor = yarn(FrequencyPlan(plain.weight, plain.axes, plain.head_dim), 2.0, 4)
    assert torch.equal(enc.weight, plan.weight) and enc.attention_factor == factor
    state = trained.state_dict()
    assert state.keys() == model.state_dict().keys()
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    with torch.no_grad():
        assert model(torch.randn(1, 3, 32, 32)).shape == (1, 10)
    with pytest.raises(ValueError, match="needs train_grid or target_grid"):
        VisionTransformer(**kw, scaling="yarn")
