import pytest
import torch

from mmpos import table
from mmpos.nn import TPEAttention, Transformer


def _layout():
    tab = table.Table([[1, 2, 1], [2, 1, 3]], rule_rows=True)
    return table.build([[table.Text(4), tab, table.Text(3)], [tab]])


@pytest.mark.parametrize("causal", [True, False])
def test_2d_tpe_by_name_equals_the_tpe_layer_used_directly(causal):
    lay = _layout()
    kw = {"orders": ("row_order", "col_order"), "theta": 500.0}
    torch.manual_seed(0)
    direct = Transformer(
        32,
        2,
        4,
        causal=causal,
        num_kv_heads=2,
        attn_layer=lambda i: TPEAttention(32, 4, num_kv_heads=2, causal=causal, **kw),
    )
    torch.manual_seed(0)
    named = Transformer(32, 2, 4, causal=causal, num_kv_heads=2, pos="2d-tpe", pos_kwargs={"2d-tpe": kw})
    assert all(isinstance(b.attn, TPEAttention) and b.attn.causal == causal for b in named.blocks)
    assert named.state_dict().keys() == direct.state_dict().keys()
    x = torch.randn(lay.order_coords.batch_size, lay.order_coords.num_tokens, 32)
    out = named(x, lay.order_coords)
    torch.testing.assert_close(out, direct(x, lay.order_coords), rtol=0, atol=0)
    assert not torch.allclose(out, Transformer(32, 2, 4, causal=causal)(x))  # not a plain stack


def test_2d_tpe_combines_with_additive_encoders_only():
    model = Transformer(32, 1, 4, pos=["2d-tpe", "sincos"])
    assert isinstance(model.blocks[0].attn, TPEAttention) and "sincos" in model.pos_encoders
    with pytest.raises(ValueError, match="attn_layer"):
        Transformer(32, 1, 4, pos="2d-tpe", attn_layer=lambda i: TPEAttention(32, 4))
    with pytest.raises(ValueError, match="attn_layer replaces"):
        Transformer(32, 1, 4, pos=["2d-tpe", "rope"])


@pytest.mark.parametrize(
    "kwargs, error, name",
    [
        ({"dim": 0}, ValueError, "dim"),
        ({"dim": 32.0}, ValueError, "dim"),
        ({"depth": 0}, ValueError, "depth"),
        ({"depth": True}, ValueError, "depth"),
        ({"num_heads": -2}, ValueError, "num_heads"),
        ({"num_heads": 5}, ValueError, "divisible by num_heads"),
        ({"num_kv_heads": 3}, ValueError, "num_kv_heads"),
        ({"num_kv_heads": 0}, ValueError, "num_kv_heads"),
        ({"mlp_ratio": 0.0}, ValueError, "mlp_ratio"),
        ({"mlp_ratio": float("nan")}, ValueError, "mlp_ratio"),
        ({"drop_path": 1.5}, ValueError, "drop_path"),
        ({"drop_path": -0.1}, ValueError, "drop_path"),
        ({"causal": 1}, TypeError, "causal"),
        ({"qkv_bias": "yes"}, TypeError, "qkv_bias"),
        ({"pos": 3}, TypeError, "pos"),
        ({"pos": ["rope", 1]}, TypeError, "pos"),
        ({"pos_kwargs": [("rope", {})]}, TypeError, "pos_kwargs"),
        ({"attn_layer": TPEAttention(32, 4)}, TypeError, "attn_layer"),
        ({"conv_after": (5,)}, ValueError, "conv_after"),
    ],
)
def test_constructor_arguments_are_checked(kwargs, error, name):
    args = {"dim": 32, "depth": 2, "num_heads": 4} | kwargs
    with pytest.raises(error, match=name):
        Transformer(**args)


def _two_layouts():
    from mmpos.layout import Image, Text, build

    segments = [[Text(2), Image((1, 4, 4)), Text(3)]] * 2
    return build(segments, "circlerope").coords, build(segments, "qwen2.5-vl").coords


def test_per_layer_coords_uniform_list_equals_the_single_coords_bit_for_bit():
    torch.manual_seed(0)
    circle, _ = _two_layouts()
    model = Transformer(32, 3, 2, pos="mrope", pos_kwargs={"mrope": {"mrope_section": [2, 3, 3]}}, causal=True)
    x = torch.randn(2, circle.num_tokens, 32)
    torch.testing.assert_close(model(x, [circle] * 3), model(x, circle), rtol=0, atol=0)


def test_per_layer_coords_give_each_block_its_rotation():
    """AGE ``strategy_4`` on 3 blocks: blocks 0 and 2 rotate by the Circle-RoPE angles, block 1 by Qwen2.5-VL's
    (each block's attention sees the cos of its own layout), and the output differs from either layout alone."""
    from mmpos.age import age_coords

    torch.manual_seed(0)
    circle, qwen = _two_layouts()
    model = Transformer(32, 3, 2, pos="mrope", pos_kwargs={"mrope": {"mrope_section": [2, 3, 3]}}, causal=True)
    x = torch.randn(2, circle.num_tokens, 32)
    seen = []
    hooks = [
        b.attn.register_forward_pre_hook(lambda m, args: seen.append(args[3][0].cos.clone())) for b in model.blocks
    ]
    mixed = model(x, age_coords("strategy_4", circle, qwen, depth=3))
    for h in hooks:
        h.remove()
    encoder = model.pos_rotary["mrope"]
    want_circle, want_qwen = encoder.rotation(circle).cos, encoder.rotation(qwen).cos
    for got, want in zip(seen, (want_circle, want_qwen, want_circle)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert not torch.allclose(want_circle, want_qwen)
    assert not torch.allclose(mixed, model(x, circle), atol=1e-5)
    assert not torch.allclose(mixed, model(x, qwen), atol=1e-5)


def test_per_layer_coords_are_checked():
    circle, _ = _two_layouts()
    model = Transformer(32, 2, 2, pos="mrope", pos_kwargs={"mrope": {"mrope_section": [2, 3, 3]}})
    x = torch.randn(2, circle.num_tokens, 32)
    with pytest.raises(ValueError, match="one Coords per block \\(2\\), got 3"):
        model(x, [circle] * 3)
    with pytest.raises(TypeError, match="coords\\[1\\] must be a Coords"):
        model(x, [circle, circle.pos])
    from mmpos.layout import Image, Text, build

    short = build([[Text(2), Image((1, 4, 4))]] * 2, "qwen2.5-vl").coords  # 2 tokens fewer
    with pytest.raises(ValueError, match="same tokens on the same axes"):
        model(x, [circle, short])
