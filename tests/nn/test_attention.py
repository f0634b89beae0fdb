import pytest
import torch
import torch.nn.functional as F

from mmpos import Coords, create
from mmpos.encoders.base import BiasEncoder
from mmpos.nn import Attention, Transformer, attention


class DistanceBias(BiasEncoder):
    """-slope * |i - j| (ALiBi-like), with an optional output term, for testing the backends."""

    def __init__(self, heads, with_output=False):
        super().__init__()
        self.slope = torch.nn.Parameter(torch.linspace(0.1, 1.0, heads))
        self.has_output = with_output

    def bias(self, q, k, coords):
        p = coords.pos[..., 0]
        return -self.slope.view(1, -1, 1, 1) * (p[:, None, :, None] - p[:, None, None, :]).abs()

    def output(self, attn, coords):
        return attn.sum(-1, keepdim=True).expand(*attn.shape[:3], 8) * self.slope.view(1, -1, 1, 1)


def _qkv(b=2, h=4, hk=4, n=7, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(b, h, n, d, generator=g),
        torch.randn(b, hk, n, d, generator=g),
        torch.randn(b, hk, n, d, generator=g),
    )


@pytest.mark.parametrize("causal", [False, True])
def test_no_encoder_equals_sdpa(causal):
    q, k, v = _qkv()
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    assert torch.equal(attention(q, k, v, causal=causal), ref)


def test_gqa_equals_repeated_kv():
    q, k, v = _qkv(h=4, hk=2)
    ref = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1))
    torch.testing.assert_close(attention(q, k, v), ref)
    with pytest.raises(ValueError, match="multiple"):
        attention(q[:, :3], k, v)


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("causal", [False, True])
def test_padding_does_not_change_real_tokens(side, causal):
    """Each sequence gives the same outputs alone and inside a padded batch."""
    enc = create("rope", head_dim=8)
    q, k, v = _qkv(b=2, n=6)
    lengths = [4, 6]
    coords = Coords.stack([Coords.sequence(n) for n in lengths], padding_side=side)
    out = attention(q, k, v, coords, [enc], causal=causal)
    assert torch.isfinite(out).all()
    for i, n in enumerate(lengths):
        sl = slice(0, n) if side == "right" else slice(6 - n, 6)
        alone = attention(
            q[i : i + 1, :, sl], k[i : i + 1, :, sl], v[i : i + 1, :, sl], Coords.sequence(n), [enc], causal=causal
        )
        torch.testing.assert_close(out[i : i + 1, :, sl], alone)


@pytest.mark.parametrize("with_output", [False, True])
def test_bias_backends_equal_eager_formula(with_output):
    q, k, v = _qkv(hk=2)
    enc = DistanceBias(4, with_output)
    coords = Coords.sequence(7, batch=2)
    out = attention(q, k, v, coords, [enc], causal=True)
    kk, vv = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    logits = q @ kk.transpose(-2, -1) / 8**0.5 + enc.bias(q, kk, coords)
    logits = logits.masked_fill(~torch.ones(7, 7, dtype=torch.bool).tril(), float("-inf"))
    attn = logits.softmax(-1)
    ref = attn @ vv + (enc.output(attn, coords) if with_output else 0)
    torch.testing.assert_close(out, ref)


def test_bias_gradients_reach_encoder():
    q, k, v = _qkv()
    enc = DistanceBias(4)
    attention(q, k, v, Coords.sequence(7, batch=2), [enc]).square().sum().backward()
    assert enc.slope.grad is not None and enc.slope.grad.abs().sum() > 0


def test_rotary_only_attention_compiles_without_graph_break():
    torch._dynamo.reset()
    attn = Attention(32, 4, num_kv_heads=2, encoders=[create("rope", dim=32, num_heads=4)], causal=True).eval()
    x = torch.randn(2, 9, 32)
    coords = Coords.sequence(9, batch=2)
    explain = torch._dynamo.explain(attn)(x, coords)
    assert explain.graph_break_count == 0
    compiled = torch.compile(attn, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(x, coords), attn(x, coords))


def test_errors():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="coords must be given"):
        attention(q, k, v, None, [create("rope", head_dim=8)])
    with pytest.raises(ValueError, match="tokens"):
        attention(q, k, v, Coords.sequence(5), [create("rope", head_dim=8)])
    with pytest.raises(TypeError, match="Transformer"):
        attention(q, k, v, Coords.grid(1, 7), [create("sincos", dim=8)])
    with pytest.raises(ValueError, match="divisible"):
        Attention(30, 4)
    with pytest.raises(ValueError, match="num_kv_heads"):
        Attention(32, 4, num_kv_heads=3)


def test_transformer_applies_encoders_at_their_hooks():
    model = Transformer(32, 2, 4, pos=["sincos", "rope", "rope-mixed"], pos_kwargs={"rope": {"theta": 100.0}})
    assert set(model.pos_encoders) == {"sincos"}
    assert set(model.pos_rotary) == {"rope"}  # a fixed plan: one instance for all blocks
    assert all(set(b.attn.encoders) == {"rope-mixed"} for b in model.blocks)  # rope-mixed learns per layer
    assert model.blocks[0].attn.encoders["rope-mixed"] is not model.blocks[1].attn.encoders["rope-mixed"]
    coords = Coords.grid(3, 4, num_prefix_tokens=1, batch=2)
    assert model(torch.randn(2, 13, 32), coords).shape == (2, 13, 32)
    with pytest.raises(ValueError, match="pos_kwargs"):
        Transformer(32, 2, 4, pos="rope", pos_kwargs={"learned": {}})
    with pytest.raises(ValueError, match="unknown encoder"):
        Transformer(32, 2, 4, pos="nope")
