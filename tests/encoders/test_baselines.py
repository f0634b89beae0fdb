import pytest
import torch
from timm.layers import resample_abs_pos_embed
from timm.layers.pos_embed_sincos import build_sincos2d_pos_embed

import mmpos
from mmpos import Coords, create
from mmpos.nn import VisionTransformer


def test_registry_lists_baselines_with_kind_and_paper():
    infos = {i.name: i for i in mmpos.list_encoders()}
    for name, kind in [("none", "none"), ("rope", "rotary"), ("learned", "additive"), ("sincos", "additive")]:
        assert infos[name].kind == kind and infos[name].paper
    assert create("none") is None
    with pytest.raises(ValueError, match="known encoders"):
        create("does-not-exist")


def test_sincos_2d_equals_timm():
    ref = build_sincos2d_pos_embed((5, 7), dim=32, temperature=10000.0)
    ours = create("sincos", dim=32).embed(Coords.grid(5, 7))
    torch.testing.assert_close(ours[0], ref)


def test_sincos_prefix_and_3d_and_errors():
    enc = create("sincos", dim=24)
    emb = enc.embed(Coords.grid(2, 3, 4, num_prefix_tokens=1))
    assert emb.shape == (1, 25, 24) and torch.equal(emb[0, 0], torch.zeros(24))
    with pytest.raises(ValueError, match="divisible"):
        create("sincos", dim=20).embed(Coords.grid(2, 3, 4))


def test_learned_resamples_like_timm():
    torch.manual_seed(0)
    enc = create("learned", dim=16, grid_size=(4, 4), num_prefix_tokens=1)
    assert torch.equal(enc.embed(Coords.grid(4, 4, num_prefix_tokens=1)), enc.pos_embed)
    ref = resample_abs_pos_embed(enc.pos_embed, [6, 8], [4, 4], num_prefix_tokens=1)
    torch.testing.assert_close(enc.embed(Coords.grid(6, 8, num_prefix_tokens=1)), ref)
    with pytest.raises(ValueError, match="grid"):
        enc.embed(Coords.sequence(5))
    with pytest.raises(ValueError, match="prefix"):
        enc.embed(Coords.grid(4, 4, num_prefix_tokens=2))


def test_learned_3d_and_prefix_without_table():
    enc = create("learned", dim=8, grid_size=(2, 4, 4))
    assert enc.embed(Coords.grid(3, 4, 4)).shape == (1, 48, 8)
    emb = enc.embed(Coords.grid(2, 4, 4, num_prefix_tokens=1))
    assert torch.equal(emb[0, 0], torch.zeros(8))


@pytest.mark.parametrize("pos", ["none", "learned", "sincos", "rope"])
def test_vit_runs_at_other_resolutions(pos):
    model = VisionTransformer(img_size=16, patch_size=4, dim=32, depth=1, num_heads=2, pos=pos)
    for size in [(16, 16), (24, 32)]:
        assert model(torch.randn(2, 3, *size)).shape == (2, 10)
    with pytest.raises(ValueError, match="multiple of patch_size"):
        model(torch.randn(1, 3, 18, 16))


def test_vit_leaves_the_callers_pos_kwargs_unchanged():
    kwargs = {"learned": {"std": 0.2}}
    model = VisionTransformer(img_size=16, patch_size=4, dim=32, depth=1, num_heads=2, pos="learned", pos_kwargs=kwargs)
    assert kwargs == {"learned": {"std": 0.2}}
    assert model.transformer.pos_encoders["learned"].num_prefix_tokens == 1
