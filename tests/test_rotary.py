import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from mmpos import Coords, FrequencyPlan, create
from mmpos.rotary import Rotation, apply_rotary, plan_angles, rope_frequencies, rotate_qk


def _llama(head_dim, heads=4, theta=10000.0, partial=1.0):
    if hasattr(LlamaConfig(), "rope_parameters"):  # transformers >= 5: rope settings live in rope_parameters
        # "linear" at factor 1 is the default spectrum and, unlike "default" there, honours partial_rotary_factor
        rope = {"rope_type": "linear", "factor": 1.0, "rope_theta": theta, "partial_rotary_factor": partial}
        cfg = LlamaConfig(hidden_size=head_dim * heads, num_attention_heads=heads, rope_parameters=rope)
    else:
        cfg = LlamaConfig(
            hidden_size=head_dim * heads, num_attention_heads=heads, rope_theta=theta, partial_rotary_factor=partial
        )
    return LlamaRotaryEmbedding(cfg)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("start", [0, 1000])
def test_rope_equals_transformers_llama(dtype, start):
    torch.manual_seed(0)
    b, h, n, d = 2, 4, 33, 32
    q, k = torch.randn(b, h, n, d, dtype=dtype), torch.randn(b, h, n, d, dtype=dtype)
    ids = torch.arange(start, start + n).expand(b, n)
    cos, sin = _llama(d, h)(q, ids)
    q_ref, k_ref = apply_rotary_pos_emb(q, k, cos, sin)
    enc = create("rope", dim=d * h, num_heads=h)
    q_out, k_out = enc.rotate(q, k, Coords.sequence(n, batch=b, start=start))
    assert torch.equal(q_out, q_ref) and torch.equal(k_out, k_ref)


def test_partial_rotary_equals_transformers():
    torch.manual_seed(0)
    q, k = torch.randn(1, 2, 9, 64), torch.randn(1, 2, 9, 64)
    cos, sin = _llama(64, 2, partial=0.5)(q, torch.arange(9)[None])
    rot = 32
    q_ref = torch.cat(apply_rotary_pos_emb(q[..., :rot], k[..., :rot], cos, sin)[0:1] + (q[..., rot:],), -1)
    enc = create("rope", head_dim=64, rotary_dim=rot)
    q_out, _ = enc.rotate(q, k, Coords.sequence(9))
    torch.testing.assert_close(q_out, q_ref, rtol=0, atol=0)


def test_frequencies_match_inv_freq():
    rot = _llama(64)
    assert torch.equal(rope_frequencies(32, 10000.0), rot.inv_freq)


def test_interleaved_convention_is_a_channel_permutation_of_half():
    torch.manual_seed(0)
    x = torch.randn(1, 2, 5, 8)
    angles = torch.randn(1, 5, 4)
    half = apply_rotary(x, angles.cos(), angles.sin(), "half")
    perm = torch.tensor([0, 4, 1, 5, 2, 6, 3, 7])  # half layout -> interleaved layout
    inter = apply_rotary(x[..., perm], angles.cos(), angles.sin(), "interleaved")
    assert torch.allclose(inter, half[..., perm])


def _scores(plan, q, k, pos_q, pos_k):
    aq = plan_angles(plan.weight, pos_q, pos_q.dtype)
    ak = plan_angles(plan.weight, pos_k, pos_k.dtype)
    qr = apply_rotary(q, aq.cos(), aq.sin(), plan.convention)
    kr = apply_rotary(k, ak.cos(), ak.sin(), plan.convention)
    return (qr * kr).sum(-1)


@settings(max_examples=25, deadline=None)
@given(
    shift=st.lists(st.floats(-50, 50, allow_nan=False), min_size=3, max_size=3),
    convention=st.sampled_from(["half", "interleaved"]),
    kind=st.sampled_from(["rope", "axial", "chunked", "cyclic_axes", "per_head"]),
)
def test_relative_property(shift, convention, kind):
    """Rotated q . k depends only on the difference of the positions."""
    g = torch.Generator().manual_seed(1)
    d = 24
    plans = {
        "rope": lambda: FrequencyPlan.rope(d, axis="t", convention=convention),
        "axial": lambda: FrequencyPlan.axial(d, ("t", "h", "w"), theta=100.0, convention=convention),
        "chunked": lambda: FrequencyPlan.chunked_axes(d, [4, 4, 4], convention=convention),
        "cyclic_axes": lambda: FrequencyPlan.cyclic_axes(d, [4, 4, 4], convention=convention),
        "per_head": lambda: FrequencyPlan.per_head(d, 3, [1, 1, 1], convention=convention),
    }
    plan = plans[kind]()
    a = len(plan.axes)
    q, k = (
        torch.randn(1, 3, 6, d, generator=g, dtype=torch.float64),
        torch.randn(1, 3, 6, d, generator=g, dtype=torch.float64),
    )
    pq, pk = (
        torch.randn(1, 6, a, generator=g, dtype=torch.float64) * 10,
        torch.randn(1, 6, a, generator=g, dtype=torch.float64) * 10,
    )
    delta = torch.tensor(shift[:a], dtype=torch.float64)
    plan = FrequencyPlan(plan.weight.double(), plan.axes, plan.head_dim, plan.convention)
    s0 = _scores(plan, q, k, pq, pk)
    s1 = _scores(plan, q, k, pq + delta, pk + delta)
    torch.testing.assert_close(s0, s1, rtol=1e-9, atol=1e-9)


def test_plans_assign_pairs_as_documented():
    chunked = FrequencyPlan.chunked_axes(128, [16, 24, 24])
    owner = chunked.weight.ne(0).float().argmax(0)
    assert owner[:16].eq(0).all() and owner[16:40].eq(1).all() and owner[40:].eq(2).all()
    inter = FrequencyPlan.cyclic_axes(128, [24, 20, 20])
    owner = inter.weight.ne(0).float().argmax(0)
    assert owner[:60].tolist() == [0, 1, 2] * 20 and owner[60:].eq(0).all()
    head = FrequencyPlan.per_head(16, 8, [2, 3, 2])
    owner = head.weight.ne(0).any(-1)  # (H, A)
    assert owner.float().argmax(-1)[:7].tolist() == [0, 0, 1, 1, 1, 2, 2] and not owner[7].any()
    axial = FrequencyPlan.axial(16, ("h", "w"))
    assert torch.equal(axial.weight[0, :4], rope_frequencies(4, 100.0))


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: FrequencyPlan.chunked_axes(128, [16, 24, 20]), "sum to the 64"),
        (lambda: FrequencyPlan.cyclic_axes(128, [24, 20, 20, 0]), "one count per axis"),
        (lambda: FrequencyPlan.rope(15), "head_dim"),
        (lambda: FrequencyPlan.rope(16, rotary_dim=20), "rotary_dim"),
        (lambda: FrequencyPlan.axial(12, ("h", "w", "t", "x", "y")), "split evenly"),
        (lambda: FrequencyPlan.per_head(16, 4, [2, 2, 2]), "head_sections"),
        (lambda: FrequencyPlan.rope(16, theta=-1.0), "theta"),
        (lambda: FrequencyPlan.rope(16, convention="complex"), "convention"),
    ],
)
def test_bad_plans(build, match):
    with pytest.raises(ValueError, match=match):
        build()


# Every plan builder refuses what int() / as_tensor(dtype=long) used to truncate: 2.5 pairs of a section
# became 2, axis 0.7 became axis 0, 1.5 heads became 1 -- a plan of another shape, silently.
@pytest.mark.parametrize(
    "build, error, match",
    [
        (lambda: FrequencyPlan.axial(16, ("h", "w"), sections=[2.5, 1.5]), ValueError, r"sections must hold ints"),
        (lambda: FrequencyPlan.axial(16, ("h", "w"), sections=[2.0, 2.0]), ValueError, r"sections must hold ints"),
        (lambda: FrequencyPlan.chunked_axes(16, [2.7, 3.2, 2.1]), ValueError, r"sections must hold ints"),
        (lambda: FrequencyPlan.cyclic_axes(16, [2, 3, 3.0]), ValueError, r"sections must hold ints"),
        (lambda: FrequencyPlan.chunked_axes(16, "233"), ValueError, r"sections must be a sequence of ints"),
        (lambda: FrequencyPlan.per_head(16, 4, [1.5, 1, 1]), ValueError, r"head_sections must hold ints"),
        (lambda: FrequencyPlan.per_head(16, 4.0, [1, 1, 1]), ValueError, r"num_heads must be a positive int"),
        (lambda: FrequencyPlan.per_head(16, True, [1, 0, 0]), ValueError, r"num_heads must be a positive int"),
        (lambda: FrequencyPlan.per_head(16, 4, [1, 1]), ValueError, r"head_sections must hold one"),
        (lambda: FrequencyPlan.rope(16.0), ValueError, r"head_dim must be a positive even int"),
        (
            lambda: FrequencyPlan.rope(16, rotary_dim=True),
            ValueError,
            r"rotary_dim \(head_dim=16\) must be an even int in \[2, 16\], got True",
        ),
        (lambda: FrequencyPlan.rope(16, axis=""), ValueError, r"axis must name one coordinate axis"),
        (lambda: FrequencyPlan.axial(16, "hw"), ValueError, r"axes must name at least one axis"),
        (lambda: FrequencyPlan.axial(16, ("h", "h")), ValueError, r"axes must name at least one axis"),
        (lambda: FrequencyPlan.cyclic_axes(16, [4, 4], axes=("t", 1)), ValueError, r"axes must name"),
        (
            lambda: FrequencyPlan.from_assignment(torch.tensor([0.7, 1.2]), torch.ones(2), ("h", "w"), 4),
            TypeError,
            r"axis_index must be an integer tensor",
        ),
        (
            lambda: FrequencyPlan.from_assignment(torch.tensor([[[0, 1]]]), torch.ones(2), ("h", "w"), 4),
            ValueError,
            r"axis_index must be \(P,\) or \(H, P\)",
        ),
        (
            lambda: FrequencyPlan.from_assignment(torch.tensor([0, 1]), torch.ones(3), ("h", "w"), 4),
            ValueError,
            r"freq of shape \(3,\) must broadcast against axis_index \(2,\)",
        ),
        (
            lambda: FrequencyPlan.from_assignment(torch.tensor([0, 1]), [1.0, float("inf")], ("h", "w"), 4),
            ValueError,
            r"freq must hold finite real frequencies",
        ),
        (lambda: FrequencyPlan(torch.ones(1, 2, dtype=torch.long), ("seq",), 4), TypeError, r"weight must be a float"),
        (lambda: FrequencyPlan([[1.0, 1.0]], ("seq",), 4), TypeError, r"weight must be a floating-point tensor"),
        (lambda: rope_frequencies(2.5), ValueError, r"pairs must be a positive int, got 2.5"),
        (lambda: rope_frequencies(True), ValueError, r"pairs must be a positive int, got True"),
    ],
)
def test_plan_builders_refuse_what_they_would_truncate(build, error, match):
    with pytest.raises(error, match=match):
        build()


def test_plan_builders_accept_integral_sections_of_any_int_type():
    import numpy as np

    ref = FrequencyPlan.chunked_axes(16, [2, 3, 3]).weight
    assert torch.equal(FrequencyPlan.chunked_axes(16, np.array([2, 3, 3])).weight, ref)
    assert torch.equal(FrequencyPlan.chunked_axes(16, (np.int64(2), 3, 3)).weight, ref)
    # an int freq is exact in float32: accepted
    plan = FrequencyPlan.from_assignment(torch.tensor([0, 1, -1]), 2, ("h", "w"), 6)
    assert plan.weight.tolist() == [[2.0, 0.0, 0.0], [0.0, 2.0, 0.0]]


def test_rotate_qk_with_per_head_angles_groups_query_heads():
    torch.manual_seed(0)
    plan = FrequencyPlan.per_head(8, 2, [1, 1], axes=("h", "w"))
    angles = plan_angles(plan.weight, torch.randn(1, 5, 2))  # (1, 2, 5, 4)
    q, k = torch.randn(1, 4, 5, 8), torch.randn(1, 2, 5, 8)
    qr, _ = rotate_qk(q, k, angles)
    # query heads 0, 1 share KV head 0; 2, 3 share KV head 1
    q_ref = apply_rotary(q, angles.repeat_interleave(2, 1).cos(), angles.repeat_interleave(2, 1).sin())
    assert torch.equal(qr, q_ref)
    with pytest.raises(ValueError, match="heads"):
        rotate_qk(torch.randn(1, 3, 5, 8), k, angles)


def test_prefix_tokens_are_not_rotated():
    enc = create("rope", head_dim=8)
    c = Coords.grid(2, 2, num_prefix_tokens=1)
    q = torch.randn(1, 1, 5, 8)
    qr, _ = enc.rotate(q, q, c)
    assert torch.equal(qr[:, :, 0], q[:, :, 0])


def test_fixed_plan_keeps_float32_under_module_casts():
    enc = create("rope", head_dim=64, theta=1e6)
    exact = enc.weight.clone()
    enc.to(torch.bfloat16)
    assert enc.weight.dtype == torch.float32 and torch.equal(enc.weight, exact)
    enc.half().float()
    assert torch.equal(enc.weight, exact)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rotary_dim", [16, 12])
def test_fast_rotation_is_as_accurate_and_rotation_equals_apply_rotary(dtype, rotary_dim):
    """``exact=False`` (fused multiply-add) is on average as close to the float64 rotation as the exact path."""
    torch.manual_seed(0)
    q, k = torch.randn(2, 4, 9, 16).to(dtype), torch.randn(2, 2, 9, 16).to(dtype)
    angles = torch.randn(2, 9, rotary_dim // 2) * 50
    cos, sin = angles.cos(), angles.sin()
    truth = apply_rotary(q.double(), cos.double(), sin.double())
    exact, fast = apply_rotary(q, cos, sin), apply_rotary(q, cos, sin, exact=False)
    err_exact, err_fast = ((x.double() - truth).abs().mean() for x in (exact, fast))
    assert err_fast <= err_exact * 1.01 + 1e-9  # one rounding fewer: as close or closer on average
    x1, x2 = q[..., : rotary_dim // 2], q[..., rotary_dim // 2 : rotary_dim]  # the textbook formula, rounded alike
    c, s = cos.to(dtype)[:, None], sin.to(dtype)[:, None]
    reference = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s, q[..., rotary_dim:]), -1)
    assert torch.equal(exact, reference)
    for flag in (True, False):
        rq, rk = Rotation(cos, sin, "half", 16, flag).rotate(q, k)
        assert torch.equal(rq, apply_rotary(q, cos, sin, exact=flag))
        assert torch.equal(rk, apply_rotary(k, cos, sin, exact=flag))


def _textbook(x, cos, sin, convention):
    """``(x1 c - x2 s, x2 c + x1 s)`` per pair, each product and sum rounded in ``x.dtype``; rest passed through."""
    p = cos.shape[-1]
    c, s = cos.to(x.dtype), sin.to(x.dtype)
    if c.dim() == 3:
        c, s = c[:, None], s[:, None]
    else:  # per-head angles: query heads grouped per angle head
        c, s = (t.repeat_interleave(x.shape[1] // t.shape[1], 1) for t in (c, s))
    rot = x[..., : 2 * p]
    x1, x2 = (rot[..., :p], rot[..., p:]) if convention == "half" else (rot[..., 0::2], rot[..., 1::2])
    o1, o2 = x1 * c - x2 * s, x2 * c + x1 * s
    out = torch.cat((o1, o2), -1) if convention == "half" else torch.stack((o1, o2), -1).flatten(-2)
    return torch.cat((out, x[..., 2 * p :]), -1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("convention", ["half", "interleaved"])
@pytest.mark.parametrize("angle_heads", [None, 2])
@pytest.mark.parametrize("rotary_dim", [16, 12])
def test_token_blocked_rotation_is_bit_exact(monkeypatch, dtype, convention, angle_heads, rotary_dim):
    """Eager CPU rotation in token blocks (a reused buffer; the last block shorter) rounds as the textbook formula,
    for q laid out as a model's (B, L, H, D) projection, per-head angles serving grouped query heads, and partial
    rotary; the autograd path (out of place) gives the same bits."""
    monkeypatch.setattr("mmpos.rotary._BLOCK_BYTES", 3 * 4 * 16 * 2)  # 3 tokens of 4 bf16 heads per block
    torch.manual_seed(0)
    q = torch.randn(2, 11, 4, 16, dtype=dtype).transpose(1, 2)  # (B, H, N, D) view of (B, N, H, D)
    shape = (2, 11, rotary_dim // 2) if angle_heads is None else (2, angle_heads, 11, rotary_dim // 2)
    angles = torch.randn(shape) * 30
    cos, sin = angles.cos(), angles.sin()
    reference = _textbook(q, cos, sin, convention)
    out = apply_rotary(q, cos, sin, convention)
    assert torch.equal(out, reference)
    assert out.stride() == q.stride() or rotary_dim < 16  # the projection's layout is kept
    with torch.enable_grad():
        leaf = q.detach().requires_grad_()
        graded = apply_rotary(leaf, cos, sin, convention)
        graded.sum().backward()
    assert torch.equal(graded.detach(), reference) and leaf.grad is not None
    fast = apply_rotary(q, cos, sin, convention, exact=False)
    truth = _textbook(q.double(), cos.double(), sin.double(), convention)
    assert (fast.double() - truth).abs().max() <= (reference.double() - truth).abs().max() + 1e-6


def test_rotation_equals_transformers_for_a_transposed_projection_in_blocks(monkeypatch):
    """Rotation.rotate on q and k viewed from (B, L, H, D), split into several token blocks, equals
    transformers' apply_rotary_pos_emb bit for bit in fp32 and bf16, with the same output strides."""
    monkeypatch.setattr("mmpos.rotary._BLOCK_BYTES", 5 * 6 * 32 * 2)
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        q = torch.randn(1, 37, 6, 32, dtype=dtype).transpose(1, 2)
        k = torch.randn(1, 37, 2, 32, dtype=dtype).transpose(1, 2)
        angles = torch.randn(1, 37, 16) * 100
        cos, sin = angles.cos(), angles.sin()
        ref = apply_rotary_pos_emb(q, k, torch.cat((cos, cos), -1).to(dtype), torch.cat((sin, sin), -1).to(dtype))
        got = Rotation(cos, sin, "half", 32).rotate(q, k)
        for a, b in zip(got, ref, strict=True):
            assert torch.equal(a, b)
            assert [st for st, n in zip(a.stride(), a.shape, strict=True) if n > 1] == [
                st for st, n in zip(b.stride(), b.shape, strict=True) if n > 1
            ]  # same memory order (a size-1 dimension's stride is arbitrary)


def test_compiled_rotation_has_no_graph_break_and_matches_eager():
    torch.manual_seed(0)
    q = torch.randn(1, 9, 4, 16).transpose(1, 2)
    angles = torch.randn(1, 9, 8)
    compiled = torch.compile(apply_rotary, backend="eager", fullgraph=True)
    assert torch.equal(compiled(q, angles.cos(), angles.sin()), apply_rotary(q, angles.cos(), angles.sin()))


def _cache_slot(x: torch.Tensor, before: int = 3, after: int = 5) -> torch.Tensor:
    """A slot of ``x``'s shape inside a larger ``(B, H, before + N + after, D)`` cache, filled with NaN."""
    b, h, n, d = x.shape
    return torch.full((b, h, before + n + after, d), float("nan"), dtype=x.dtype)[:, :, before : before + n]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("convention", ["half", "interleaved"])
@pytest.mark.parametrize("exact", [True, False])
@pytest.mark.parametrize(("angle_heads", "rotary_dim"), [(None, 16), (None, 12), (2, 16)])
def test_rotation_into_given_storage_and_in_place_is_bit_exact(
    monkeypatch, dtype, convention, exact, angle_heads, rotary_dim
):
    """``out=`` (a KV-cache slot) and in place give the out-of-place bits, in token blocks, for a transposed
    projection, partial rotary and per-head angles serving grouped query heads; the slot's neighbours stay put."""
    monkeypatch.setattr("mmpos.rotary._BLOCK_BYTES", 3 * 4 * 16 * 2)
    torch.manual_seed(0)
    q = torch.randn(2, 11, 4, 16, dtype=dtype).transpose(1, 2)  # (B, H, N, D) view of (B, N, H, D)
    k = torch.randn(2, 11, 2, 16, dtype=dtype).transpose(1, 2)
    shape = (2, 11, rotary_dim // 2) if angle_heads is None else (2, angle_heads, 11, rotary_dim // 2)
    angles = torch.randn(shape) * 30
    rotation = Rotation(angles.cos(), angles.sin(), convention, 16, exact)
    ref_q, ref_k = rotation.rotate(q, k)
    q_slot, k_slot = _cache_slot(q), _cache_slot(k)
    got_q, got_k = rotation.rotate(q, k, out=(q_slot, k_slot))
    assert got_q is q_slot and got_k is k_slot
    assert torch.equal(q_slot, ref_q) and torch.equal(k_slot, ref_k)
    assert q_slot._base[:, :, :3].isnan().all() and q_slot._base[:, :, 14:].isnan().all()  # neighbours untouched
    x_slot = _cache_slot(q)
    assert apply_rotary(q, angles.cos(), angles.sin(), convention, exact, out=x_slot) is x_slot
    assert torch.equal(x_slot, apply_rotary(q, angles.cos(), angles.sin(), convention, exact))
    q_in, k_in = q.clone(), k.clone()
    assert rotation.rotate_(q_in, k_in)[0] is q_in
    assert torch.equal(q_in, ref_q) and torch.equal(k_in, ref_k)


def test_rotation_in_place_in_a_fused_qkv_buffer_equals_transformers():
    """q and k rotated in place as views of one ``(B, N, 3, H, D)`` projection: transformers' bits, v untouched."""
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        qkv = torch.randn(1, 37, 3, 6, 32, dtype=dtype)
        v_before = qkv[:, :, 2].clone()
        q, k = qkv[:, :, 0].transpose(1, 2), qkv[:, :, 1].transpose(1, 2)  # (B, H, N, D) views
        angles = torch.randn(1, 37, 16) * 100
        cos, sin = angles.cos(), angles.sin()
        ref = apply_rotary_pos_emb(q, k, torch.cat((cos, cos), -1).to(dtype), torch.cat((sin, sin), -1).to(dtype))
        Rotation(cos, sin, "half", 32).rotate_(q, k)
        assert torch.equal(q, ref[0]) and torch.equal(k, ref[1])
        assert torch.equal(qkv[:, :, 2], v_before)


def test_rotation_into_given_storage_under_autograd():
    torch.manual_seed(0)
    q = torch.randn(1, 2, 5, 8, requires_grad=True)
    angles = torch.randn(1, 5, 4)
    slot = torch.empty(1, 2, 5, 8)
    out = apply_rotary(q, angles.cos(), angles.sin(), out=slot)
    assert out is slot and torch.equal(out.detach(), apply_rotary(q.detach(), angles.cos(), angles.sin()))
    out.square().sum().backward()
    expected = torch.autograd.grad(apply_rotary(q, angles.cos(), angles.sin()).square().sum(), q)[0]
    torch.testing.assert_close(q.grad, expected)


def test_rotation_out_is_checked():
    angles = torch.randn(1, 5, 4)
    rotation = Rotation(angles.cos(), angles.sin(), "half", 8)
    q, k = torch.randn(1, 2, 5, 8), torch.randn(1, 1, 5, 8)
    with pytest.raises(ValueError, match=r"out\[0\] \(for q\) must match its input: shape \(1, 2, 5, 8\)"):
        rotation.rotate(q, k, out=(torch.empty(1, 2, 6, 8), torch.empty_like(k)))
    with pytest.raises(ValueError, match=r"out\[1\] \(for k\) must match its input.*torch.float32.*got.*bfloat16"):
        rotation.rotate(q, k, out=(torch.empty_like(q), torch.empty_like(k, dtype=torch.bfloat16)))
    with pytest.raises(TypeError, match="out must be a pair"):
        rotation.rotate(q, k, out=torch.empty_like(q))
    with pytest.raises(TypeError, match="out must be a tensor"):
        apply_rotary(q, angles.cos(), angles.sin(), out=[1.0])


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("pairs", [8, 6])  # full and partial rotary
def test_compiled_rotation_into_given_storage_and_in_place_has_no_graph_break(backend, pairs):
    torch.manual_seed(0)
    q, k = torch.randn(1, 9, 4, 16).transpose(1, 2), torch.randn(1, 9, 2, 16).transpose(1, 2)
    angles = torch.randn(1, 9, pairs)
    rotation = Rotation(angles.cos(), angles.sin(), "half", 16)
    ref_q, ref_k = rotation.rotate(q, k)

    def into(q, k, q_out, k_out, cos, sin):
        return Rotation(cos, sin, "half", 16).rotate(q, k, out=(q_out, k_out))

    def in_place(q, k, cos, sin):
        return Rotation(cos, sin, "half", 16).rotate_(q, k)

    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    torch.compile(into, backend=backend, fullgraph=True)(q, k, q_out, k_out, angles.cos(), angles.sin())
    assert torch.equal(q_out, ref_q) and torch.equal(k_out, ref_k)
    q_in, k_in = q.clone(), k.clone()
    torch.compile(in_place, backend=backend, fullgraph=True)(q_in, k_in, angles.cos(), angles.sin())
    assert torch.equal(q_in, ref_q) and torch.equal(k_in, ref_k)


def test_rotation_into_overlapping_storage_is_refused():
    """An ``out`` that overlaps the input without being it would overwrite tokens still to be read."""
    angles = torch.randn(1, 9, 4)
    buf = torch.randn(1, 2, 10, 8)
    with pytest.raises(ValueError, match=r"out must be the input itself \(in place\) or memory outside it"):
        apply_rotary(buf[:, :, :9], angles.cos(), angles.sin(), out=buf[:, :, 1:])
    qkv = torch.randn(1, 9, 3, 2, 8)
    q, k = qkv[:, :, 0].transpose(1, 2), qkv[:, :, 1].transpose(1, 2)
    rotation = Rotation(angles.cos(), angles.sin(), "half", 8)
    with pytest.raises(ValueError, match=r"out\[0\] \(for q\) must be the input itself"):
        rotation.rotate(q, k, out=(k, torch.empty_like(k)))  # k's columns of the fused buffer, interleaved with q's
    q_alone = q.clone()
    with pytest.raises(ValueError, match=r"out\[0\] \(for q\) must be memory outside k"):
        rotation.rotate(q_alone, k, out=(k, torch.empty_like(k)))  # would overwrite k before it is rotated
    slots = torch.empty(2, 1, 2, 9, 8)  # q's and k's slots side by side in one cache tensor: no overlap
    rotation.rotate(q, k, out=(slots[0], slots[1]))
    assert torch.equal(slots[0], rotation.rotate(q, k)[0])
