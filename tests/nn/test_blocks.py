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
