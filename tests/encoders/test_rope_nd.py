"""2-D / 3-D RoPE: rope-vit re-derivations, timm parity, relative property, prefix, compile."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from timm.layers.pos_embed_sincos import (
    RotaryEmbeddingCat,
    RotaryEmbeddingMixed,
    apply_rot_embed_cat,
    init_random_2d_freqs,
)

from mmpos.coords import Coords
from mmpos.encoders.base import RotaryEncoder
from mmpos.encoders.registry import create
from mmpos.encoders.rope_nd import AxialRoPE, MixedRoPE, mixed_frequencies
from mmpos.nn import Transformer
from mmpos.rotary import FrequencyPlan


# ------------------------------------------------------------ rope-vit, re-derived from its formulas
def ropevit_axial_angles(dim, end_x, end_y, theta=100.0):
    """models/vit_rope.py compute_axial_cis, as angles (N, dim/2): token n = y * end_x + x."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 4)[: dim // 4].float() / dim))
    t = torch.arange(end_x * end_y, dtype=torch.float32)
    t_x, t_y = t % end_x, torch.div(t, end_x, rounding_mode="floor")
    return torch.cat([torch.outer(t_x, freqs), torch.outer(t_y, freqs)], dim=-1)


def ropevit_init_mixed(dim, num_heads, theta=10.0):
    """models/vit_rope.py init_random_2d_freqs: (2, H, dim/2), one torch.rand(1) per head."""
    mag = 1 / (theta ** (torch.arange(0, dim, 4)[: (dim // 4)].float() / dim))
    fx, fy = [], []
    for _ in range(num_heads):
        a = torch.rand(1) * 2 * torch.pi
        fx.append(torch.cat([mag * torch.cos(a), mag * torch.cos(torch.pi / 2 + a)]))
        fy.append(torch.cat([mag * torch.sin(a), mag * torch.sin(torch.pi / 2 + a)]))
    return torch.stack([torch.stack(fx), torch.stack(fy)])


def ropevit_rotate(x, angles):
    """apply_rotary_emb: complex multiply of consecutive channel pairs; angles (..., N, dim/2)."""
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * torch.polar(torch.ones_like(angles), angles)).flatten(-2)


def qk(b, h, n, d, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, h, n, d, generator=g, dtype=dtype), torch.randn(b, h, n, d, generator=g, dtype=dtype)


# ------------------------------------------------------------ axial
@pytest.mark.parametrize("height,width", [(4, 6), (7, 3)])
def test_axial_equals_ropevit_compute_axial_cis(height, width):
    dim = 32
    enc = AxialRoPE(head_dim=dim, axes=("w", "h"), convention="interleaved")
    coords = Coords.grid(height, width, num_prefix_tokens=1)
    ref = ropevit_axial_angles(dim, end_x=width, end_y=height)
    assert torch.equal(enc.angles(coords)[0, 1:], ref)
    q, k = qk(2, 3, 1 + height * width, dim)
    rq, rk = enc.rotate(q, k, coords)
    torch.testing.assert_close(rq[:, :, 1:], ropevit_rotate(q[:, :, 1:], ref), rtol=0, atol=1e-6)
    torch.testing.assert_close(rk[:, :, 1:], ropevit_rotate(k[:, :, 1:], ref), rtol=0, atol=1e-6)
    assert torch.equal(rq[:, :, 0], q[:, :, 0]) and torch.equal(rk[:, :, 0], k[:, :, 0])  # class token as in rope-vit


@pytest.mark.parametrize("rotate_half", [False, True])
@pytest.mark.parametrize("indexing", ["ij", "xy"])
def test_axial_equals_timm_rotary_embedding_cat(rotate_half, indexing):
    # in_pixels=False: inverse-frequency bands 100 ** (-k / (D/4)) on integer indices, as rope-vit.
    dim, height, width = 32, 5, 7
    timm_rope = RotaryEmbeddingCat(
        dim, temperature=100, in_pixels=False, grid_indexing=indexing, rotate_half=rotate_half
    )
    axes = ("h", "w") if indexing == "ij" else ("w", "h")
    enc = AxialRoPE(head_dim=dim, axes=axes, convention="half" if rotate_half else "interleaved")
    q, k = qk(2, 4, height * width, dim)
    emb = timm_rope.get_embed((height, width))
    rq, rk = enc.rotate(q, k, Coords.grid(height, width))
    torch.testing.assert_close(rq, apply_rot_embed_cat(q, emb, half=rotate_half), rtol=0, atol=1e-6)
    torch.testing.assert_close(rk, apply_rot_embed_cat(k, emb, half=rotate_half), rtol=0, atol=1e-6)


def test_timm_ref_feat_shape_is_scaled_coordinates():
    # timm (EVA) rescales positions by ref / feat for another resolution; in mmpos: Coords.scaled.
    dim = 16
    timm_rope = RotaryEmbeddingCat(dim, temperature=100, in_pixels=False, ref_feat_shape=(4, 6), rotate_half=True)
    enc = AxialRoPE(head_dim=dim)
    q, k = qk(1, 2, 8 * 9, dim)
    rq, _ = enc.rotate(q, k, Coords.grid(8, 9).scaled((4 / 8, 6 / 9)))
    torch.testing.assert_close(rq, apply_rot_embed_cat(q, timm_rope.get_embed((8, 9)), half=True), rtol=0, atol=1e-6)


def test_timm_pixel_bands_are_a_frequency_plan():
    # timm's default (in_pixels=True): log-spaced bands 2 ** linspace(0, log2(max_res) - 1) * pi on
    # coordinates linspace(-1, 1). Not rope-vit's spectrum, but an axial plan with other frequencies and coordinates.
    dim, height, width = 16, 5, 6
    timm_rope = RotaryEmbeddingCat(dim, max_res=64, rotate_half=True)
    bands = 2 ** torch.linspace(0, math.log2(64) - 1, dim // 4) * torch.pi  # 1 .. 32 cycles per unit
    axis_of_pair = torch.arange(dim // 2) // (dim // 4)  # first half h, second half w
    plan = FrequencyPlan.from_assignment(axis_of_pair, torch.cat([bands, bands]), ("h", "w"), dim)
    grid = torch.stack(torch.meshgrid(torch.linspace(-1, 1, height), torch.linspace(-1, 1, width), indexing="ij"), -1)
    coords = Coords.points(grid.reshape(1, -1, 2), axes=("h", "w"))
    q, k = qk(1, 2, height * width, dim)
    rq, _ = RotaryEncoder(plan).rotate(q, k, coords)
    torch.testing.assert_close(rq, apply_rot_embed_cat(q, timm_rope.get_embed((height, width)), half=True))


def test_axial_3d_sections_equal_and_given():
    coords = Coords.grid(2, 3, 4)
    pos = coords.pos[0]
    enc = AxialRoPE(head_dim=24, axes=("t", "h", "w"))  # 12 pairs -> 4 per axis
    freq = 100.0 ** (-torch.arange(4) / 4)
    expected = torch.cat([pos[:, a, None] * freq for a in range(3)], dim=-1)
    torch.testing.assert_close(enc.angles(coords)[0], expected, rtol=1e-6, atol=0)
    enc = AxialRoPE(head_dim=24, axes=("t", "h", "w"), sections=(2, 5, 5), theta=1000.0)
    ang = enc.angles(coords)[0]
    torch.testing.assert_close(ang[:, :2], pos[:, :1] * 1000.0 ** (-torch.arange(2) / 2), rtol=1e-6, atol=0)
    torch.testing.assert_close(ang[:, 7:], pos[:, 2:] * 1000.0 ** (-torch.arange(5) / 5), rtol=1e-6, atol=0)
    with pytest.raises(ValueError, match="sections"):
        AxialRoPE(head_dim=16, axes=("t", "h", "w"))  # 8 pairs over 3 axes


def test_axial_any_resolution_uses_the_same_angles():
    enc = AxialRoPE(head_dim=32)
    small, large = enc.angles(Coords.grid(14, 14))[0], enc.angles(Coords.grid(20, 24))[0]
    rows, cols = torch.meshgrid(torch.arange(14), torch.arange(14), indexing="ij")
    assert torch.equal(large[(rows * 24 + cols).flatten()], small)


def test_prefix_tokens_are_not_rotated():
    coords = Coords.grid(3, 4, num_prefix_tokens=2)
    for enc in (AxialRoPE(head_dim=16), MixedRoPE(head_dim=16, num_heads=2)):
        q, k = qk(2, 2, 14, 16)
        rq, rk = enc.rotate(q, k, coords)
        assert torch.equal(rq[:, :, :2], q[:, :, :2]) and torch.equal(rk[:, :, :2], k[:, :, :2])
        assert not torch.allclose(rq[:, :, 3:], q[:, :, 3:])


# ------------------------------------------------------------ mixed
def test_mixed_init_equals_ropevit_init_random_2d_freqs():
    torch.manual_seed(3)
    ref = ropevit_init_mixed(32, num_heads=6)
    torch.manual_seed(3)
    enc = MixedRoPE(head_dim=32, num_heads=6, axes=("w", "h"), convention="interleaved")
    assert isinstance(enc.weight, torch.nn.Parameter) and enc.weight.shape == (6, 2, 16)
    assert torch.equal(enc.weight.detach(), ref.permute(1, 0, 2))  # weight[h] = (fx, fy)


def test_mixed_init_equals_timm_init_for_consecutive_layers():
    torch.manual_seed(5)
    ref = init_random_2d_freqs(16, depth=3, num_heads=4)  # (2, depth, H, 8)
    torch.manual_seed(5)
    layers = [MixedRoPE(head_dim=16, num_heads=4, axes=("w", "h")) for _ in range(3)]
    assert torch.equal(torch.stack([m.weight.detach() for m in layers]), ref.permute(1, 2, 0, 3))


def test_mixed_equals_timm_rotary_embedding_mixed():
    dim, heads, depth, height, width = 64, 4, 2, 5, 3
    timm_rope = RotaryEmbeddingMixed(dim, depth, heads)  # grid_indexing="xy": t_x = column
    emb = timm_rope.get_embed((height, width))  # (depth, H, N, 2 * head_dim)
    q, k = qk(2, heads, height * width, dim // heads)
    for layer in range(depth):
        enc = MixedRoPE(dim, heads, axes=("w", "h"), convention="interleaved")
        with torch.no_grad():
            enc.weight.copy_(timm_rope.freqs[:, layer].permute(1, 0, 2))
        rq, rk = enc.rotate(q, k, Coords.grid(height, width))
        torch.testing.assert_close(rq, apply_rot_embed_cat(q, emb[layer]), rtol=0, atol=1e-6)
        torch.testing.assert_close(rk, apply_rot_embed_cat(k, emb[layer]), rtol=0, atol=1e-6)


def test_mixed_equals_ropevit_compute_mixed_cis():
    dim, heads, height, width = 16, 3, 4, 5
    torch.manual_seed(0)
    enc = MixedRoPE(head_dim=dim, num_heads=heads, axes=("w", "h"), convention="interleaved")
    fx, fy = enc.weight.detach().unbind(1)  # (H, P) each
    t = torch.arange(height * width, dtype=torch.float32)
    t_x, t_y = t % width, torch.div(t, width, rounding_mode="floor")
    ref = t_x[None, :, None] * fx[:, None] + t_y[None, :, None] * fy[:, None]  # (H, N, P): x fx + y fy
    q, k = qk(2, heads, 1 + height * width, dim)
    rq, _ = enc.rotate(q, k, Coords.grid(height, width, num_prefix_tokens=1))
    torch.testing.assert_close(rq[:, :, 1:], ropevit_rotate(q[:, :, 1:], ref), rtol=0, atol=1e-5)


def test_mixed_without_rotation_starts_axial():
    mixed = MixedRoPE(head_dim=32, num_heads=2, rotate=False, theta=10.0)
    axial = AxialRoPE(head_dim=32, theta=10.0)
    torch.testing.assert_close(mixed.weight.detach(), axial.weight.expand(2, -1, -1), rtol=0, atol=1e-7)
    mixed3 = MixedRoPE(head_dim=24, num_heads=2, axes=("t", "h", "w"), rotate=False)
    axial3 = AxialRoPE(head_dim=24, axes=("t", "h", "w"), theta=10.0)
    assert torch.equal(mixed3.weight.detach(), axial3.weight.expand(2, -1, -1))


@pytest.mark.parametrize(
    "axes,sections", [(("h", "w"), None), (("t", "h", "w"), (4, 4, 4)), (("x", "y", "z"), (2, 6, 4))]
)
def test_mixed_init_is_an_orthonormal_frame_with_axial_magnitudes(axes, sections):
    w = mixed_frequencies(24, 5, axes, sections, theta=10.0, generator=torch.Generator().manual_seed(1))
    axial = FrequencyPlan.axial(24, axes, sections, theta=10.0).weight  # (A, P)
    mag, section = axial.sum(0), axial.argmax(0)
    torch.testing.assert_close(w.norm(dim=1), mag.expand(5, -1))  # |f_p| = theta ** (-k / s)
    unit = w / mag  # (H, A, P) unit directions
    frame = torch.stack([unit[:, :, section == a][..., 0] for a in range(len(axes))], dim=1)  # (H, sec, A)
    torch.testing.assert_close(frame @ frame.transpose(1, 2), torch.eye(len(axes)).expand(5, -1, -1), atol=1e-6, rtol=0)
    for a in range(len(axes)):  # every pair of a section points the same way
        torch.testing.assert_close(unit[:, :, section == a], frame[:, a, :, None].expand_as(unit[:, :, section == a]))


def test_mixed_is_learned_per_layer_and_per_kv_head():
    model = Transformer(64, depth=3, num_heads=4, num_kv_heads=2, pos="rope-mixed")
    weights = [blk.attn.encoders["rope-mixed"].weight for blk in model.blocks]
    assert all(w.shape == (2, 2, 8) for w in weights)
    assert not torch.equal(weights[0], weights[1])
    x = torch.randn(2, 13, 64)
    model(x, Coords.grid(3, 4, num_prefix_tokens=1)).square().mean().backward()
    assert all(w.grad is not None and w.grad.abs().sum() > 0 for w in weights)


# ------------------------------------------------------------ relative property (2-D and 3-D)
def _encoder(kind, axes, seed):
    torch.manual_seed(seed)
    head_dim = 12 * len(axes)
    if kind == "axial":
        return AxialRoPE(head_dim=head_dim, axes=axes).double()
    return MixedRoPE(head_dim=head_dim, num_heads=2, axes=axes).double()


@settings(max_examples=30, deadline=None)
@given(
    kind=st.sampled_from(["axial", "mixed"]),
    axes=st.sampled_from([("h", "w"), ("t", "h", "w"), ("x", "y", "z")]),
    shift=st.lists(st.floats(-50, 50), min_size=3, max_size=3),
    seed=st.integers(0, 2**16),
)
def test_scores_depend_only_on_coordinate_differences(kind, axes, shift, seed):
    enc = _encoder(kind, axes, seed)
    g = torch.Generator().manual_seed(seed)
    pos = torch.rand(2, 9, len(axes), generator=g, dtype=torch.float64) * 20  # continuous points
    coords = Coords.points(pos, axes=axes)
    moved = Coords.points(pos + torch.tensor(shift[: len(axes)], dtype=torch.float64), axes=axes)
    q, k = qk(2, 2, 9, enc.head_dim, seed, torch.float64)
    rq, rk = enc.rotate(q, k, coords)
    mq, mk = enc.rotate(q, k, moved)
    torch.testing.assert_close(mq @ mk.transpose(-1, -2), rq @ rk.transpose(-1, -2), rtol=1e-9, atol=1e-9)
    assert not torch.allclose(rq, q)


@settings(max_examples=15, deadline=None)
@given(kind=st.sampled_from(["axial", "mixed"]), seed=st.integers(0, 2**16))
def test_score_of_a_pair_is_a_function_of_its_offset(kind, seed):
    # the same q and k vectors placed at two pairs of 3-D points with equal offsets score alike
    enc = _encoder(kind, ("t", "h", "w"), seed)
    g = torch.Generator().manual_seed(seed)
    a, b, offset = (torch.randn(3, generator=g, dtype=torch.float64) * 10 for _ in range(3))
    pos = torch.stack([a, a + offset, b, b + offset]).unsqueeze(0)
    q, k = qk(1, 2, 1, enc.head_dim, seed, torch.float64)
    q, k = q.expand(1, 2, 4, -1), k.expand(1, 2, 4, -1)
    rq, rk = enc.rotate(q, k, Coords.points(pos, axes=("t", "h", "w")))
    s = rq @ rk.transpose(-1, -2)
    torch.testing.assert_close(s[..., 1, 0], s[..., 3, 2], rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(s[..., 0, 1], s[..., 2, 3], rtol=1e-9, atol=1e-9)


# ------------------------------------------------------------ registry, errors, compile
def test_registered_factories():
    axial = create("rope-axial", dim=64, num_heads=4)
    assert isinstance(axial, AxialRoPE) and axial.weight.shape == (2, 8) and axial.axes == ("h", "w")
    video = create("rope-axial", dim=96, num_heads=4, axes=("t", "h", "w"))
    assert video.weight.shape == (3, 12)
    mixed = create("rope-mixed", dim=64, num_heads=4, axes=("t", "h", "w"), sections=(2, 3, 3))
    assert isinstance(mixed, MixedRoPE) and mixed.weight.shape == (4, 3, 8)


@pytest.mark.parametrize("name", ["rope-axial", "rope-mixed"])
def test_video_transformer_with_3d_rope(name):
    torch.manual_seed(0)
    model = Transformer(48, depth=2, num_heads=2, pos=name, pos_kwargs={name: {"axes": ("t", "h", "w")}})
    coords = Coords.grid(2, 3, 4, num_prefix_tokens=1)
    x = torch.randn(2, 25, 48)
    out = model(x, coords)
    assert out.shape == (2, 25, 48)
    frames_swapped = torch.cat([x[:, :1], x[:, 13:], x[:, 1:13]], dim=1)  # same tokens, frames exchanged
    assert not torch.allclose(model(frames_swapped, coords)[:, 0], out[:, 0], atol=1e-5)  # time is encoded


def test_errors():
    with pytest.raises(ValueError, match="at least 2 axes"):
        MixedRoPE(head_dim=16, num_heads=2, axes=("seq",))
    with pytest.raises(ValueError, match="num_heads"):
        MixedRoPE(head_dim=16)
    with pytest.raises(ValueError, match="head_dim"):
        AxialRoPE(head_dim=15)
    with pytest.raises(ValueError, match="sections"):
        AxialRoPE(head_dim=16, sections=(3, 3))
    enc = AxialRoPE(head_dim=16, axes=("t", "h", "w"), sections=(2, 3, 3))
    q, k = qk(1, 2, 6, 16)
    with pytest.raises(ValueError, match="axis 't'"):
        enc.rotate(q, k, Coords.grid(2, 3))
    with pytest.raises(ValueError, match="head_dim=16"):
        enc.rotate(q[..., :8], k[..., :8], Coords.grid(1, 2, 3))


@pytest.mark.parametrize("kind", ["axial", "mixed"])
def test_rotate_compiles_without_graph_breaks(kind):
    torch._dynamo.reset()
    enc = AxialRoPE(head_dim=16, axes=("w", "h")) if kind == "axial" else MixedRoPE(head_dim=16, num_heads=2)
    coords = Coords.grid(3, 5, num_prefix_tokens=1)
    q, k = qk(2, 2, 16, 16)
    compiled = torch.compile(enc.rotate, fullgraph=True, backend="aot_eager")
    for got, want in zip(compiled(q, k, coords), enc.rotate(q, k, coords)):
        torch.testing.assert_close(got, want)
