"""GRAPE (mmpos/encoders/grape.py): canonical planes against a transcription of JJJYmmm/Multimodal-RoPEs
``GRAPEEmbedding.forward``; learned planes against a token-by-token transcription of the formula
``x + sum_p [(R(theta_p) - I) on span(a_p, b_p)] x`` of ``AxisGrapeRotation`` / ``MixedAxisGrapeRotation`` /
``BlockMixedGrapeRotation``; the relative law where the planes commute; the canonical limits."""

import math

import pytest
import torch

import mmpos
from mmpos import Coords, create
from mmpos.encoders.base import RotaryEncoder
from mmpos.encoders.grape import GRAPE, GRAPEInterleaved, GRAPELearned, grape_plan
from mmpos.layout import Image, Text, Video, build
from mmpos.rotary import FrequencyPlan

THETA = 1e6
THW = ("t", "h", "w")


def _positions(b=2, n=37, high=3000, seed=1):
    """Independent random integer positions per axis: ``(3, B, N)`` (HF layout)."""
    return torch.randint(0, high, (3, b, n), generator=torch.Generator().manual_seed(seed))


def _thw(position_ids, dtype=torch.float32):
    return Coords(position_ids.permute(1, 2, 0).to(dtype), THW)


def _qk(b=2, hq=4, hkv=2, n=7, d=32, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, hq, n, d, generator=g).to(dtype), torch.randn(b, hkv, n, d, generator=g).to(dtype)


# --------------------------------------------------------------------- canonical planes (grape, grape-i)
def _reference_grape_angles(position_ids, head_dim, theta, section, allocation, log_freq_scale):
    """A transcription of JJJYmmm/Multimodal-RoPEs ``GRAPEEmbedding.forward`` (canonical mode):
    ``inv_freq`` as Hugging Face computes it, warped ``exp(log(inv_freq) / s)``; per-axis angles
    ``(3, B, L, P)``; ``"chunked"`` takes chunk ``i`` of ``section`` from axis ``i mod 3``,
    ``"interleaved"`` takes pair ``p`` from axis ``(0, 1, 2)[p mod 3]``."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if log_freq_scale != 1.0:
        inv = torch.exp(inv.log() / log_freq_scale)
    freqs = position_ids.float()[..., None] * inv  # (3, B, L, P)
    if allocation == "chunked":
        return torch.cat([m[i % 3] for i, m in enumerate(freqs.split(section, dim=-1))], dim=-1)
    axis = torch.tensor((0, 1, 2))[torch.arange(freqs.shape[-1]) % 3]
    return freqs.permute(1, 2, 3, 0).gather(-1, axis.view(1, 1, -1, 1).expand(*freqs.shape[1:3], -1, 1))[..., 0]


@pytest.mark.parametrize("log_freq_scale", [1.0, 0.5, 2.5])
@pytest.mark.parametrize("name, allocation", [("grape", "chunked"), ("grape-i", "interleaved")])
def test_grape_angles_equal_the_reference(name, allocation, log_freq_scale):
    ids = _positions(high=500)
    section = [8, 12, 12] if name == "grape" else None
    kwargs = {"mrope_section": section} if section else {}
    enc = create(name, head_dim=64, theta=THETA, log_freq_scale=log_freq_scale, **kwargs)
    got = enc.angles(_thw(ids))
    expected = _reference_grape_angles(ids, 64, THETA, section, allocation, log_freq_scale)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-3)  # float32 angles up to ~500 rad
    if log_freq_scale == 1.0 and name == "grape":  # RoPE's spectrum and canonical chunks: M-RoPE's plan
        assert torch.equal(enc.weight, create("mrope", head_dim=64, theta=THETA, mrope_section=section).weight)


def test_grape_relative_law_and_errors():
    """``G(m)^T G(n) = G(n - m)`` for the commuting canonical generators: the score of a rotated pair
    depends on the offset only (per axis)."""
    enc = create("grape-i", head_dim=32, log_freq_scale=1.7)
    q, k = _qk(b=1, hq=1, hkv=1, n=1, d=32)
    at = lambda pos: Coords(torch.tensor([[pos]], dtype=torch.float32), THW)
    qa, ka = enc.rotate(q, k, at([3.0, 5.0, 1.0]))[0], enc.rotate(q, k, at([7.0, 2.0, 4.0]))[1]
    qb, kb = enc.rotate(q, k, at([13.0, 25.0, 11.0]))[0], enc.rotate(q, k, at([17.0, 22.0, 14.0]))[1]
    torch.testing.assert_close((qa * ka).sum(), (qb * kb).sum(), rtol=1e-4, atol=1e-4)
    counts = (create("grape-i", head_dim=128).weight != 0).sum(-1).tolist()
    assert counts == [22, 21, 21]  # p mod 3 over 64 pairs
    with pytest.raises(ValueError, match="log_freq_scale must be a finite number > 0"):
        create("grape", head_dim=64, log_freq_scale=0)
    with pytest.raises(ValueError, match="mrope_section applies to axis_order='chunked' only"):
        grape_plan(64, [8, 12, 12], "cyclic")
    with pytest.raises(ValueError, match="mrope_section applies to axis_order='chunked' only"):
        GRAPEInterleaved(head_dim=64, mrope_section=[8, 12, 12])
    with pytest.raises(ValueError, match="axis_order must be one of"):
        grape_plan(64, None, "diagonal")


def test_one_constructor_and_the_records():
    """``grape-i`` is ``grape`` with the cyclic axis order: one constructor, two records; the cyclic record
    takes no model ``mrope_section`` (``use_rope`` hands it none)."""
    assert issubclass(GRAPEInterleaved, GRAPE) and GRAPEInterleaved.__init__ is GRAPE.__init__
    info = {i.name: i for i in mmpos.list_encoders("grape*")}
    assert info["grape"].mrope_section and not info["grape-i"].mrope_section
    assert info["grape"].shared and info["grape-i"].shared and not info["grape-learned"].shared
    assert info["grape-learned"].cls is GRAPELearned and info["grape-learned"].kind == "rotary"
    cyclic = grape_plan(64, None, "cyclic", THETA, "half", 2.0)
    torch.testing.assert_close(create("grape-i", head_dim=64, theta=THETA, log_freq_scale=2.0).weight, cyclic.weight)


# --------------------------------------------------------------------- learned planes (grape-learned)
def _freqs(d, n, theta, s=1.0):
    """The reference's ``_make_inv_freq`` from the source spectrum of ``D / 2`` values (``n`` planes), float32
    as the reference computes it (Hugging Face's ``inv_freq``), returned as float64."""
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    if n != d // 2:
        inv = inv[torch.linspace(0, d // 2 - 1, n).round().long()]
    return (torch.exp(inv.log() / s) if s != 1.0 else inv).double()


def _gram_schmidt(a, b):
    a = a / a.norm()
    b = b - (b @ a) * a
    return a, b / b.norm()


def _transcribed(enc, x, pos, theta, s=1.0):
    """The formula, one token, one head, one plane at a time (float64).

    ``x`` ``(B, H, N, D)``, ``pos`` ``(B, N, 3)``. For a bank of planes ``(a_p, b_p)`` with angles ``θ_p``:
    ``y = x + sum_p (x_a cos θ_p - x_b sin θ_p - x_a) a_p + (x_a sin θ_p + x_b cos θ_p - x_b) b_p``.
    """
    a_all, b_all = enc.a.detach().double(), enc.b.detach().double()
    u_all = None if enc.axis_weight is None else enc.axis_weight.detach().double()
    out = torch.empty_like(x)
    bsz, heads, n, d = x.shape

    def bank(v, a, b, angles):
        y = v.clone()
        for p in range(a.shape[0]):
            ap, bp = _gram_schmidt(a[p], b[p])
            xa, xb = ap @ v, bp @ v
            c, sn = math.cos(angles[p]), math.sin(angles[p])
            y = y + (xa * c - xb * sn - xa) * ap + (xa * sn + xb * c - xb) * bp
        return y

    for i in range(bsz):
        for h in range(heads):
            for t in range(n):
                v = x[i, h, t].double()
                where = pos[i, t].double()
                if enc.mode == "axis":
                    f = _freqs(d, a_all.shape[1], theta, s)
                    for axis in range(3):  # t's bank, then h's, then w's
                        v = bank(v, a_all[axis], b_all[axis], (where[axis] * f).tolist())
                elif enc.mode == "mixed":
                    f = _freqs(d, a_all.shape[0], theta, s)
                    u = u_all / u_all.norm(dim=-1, keepdim=True)
                    v = bank(v, a_all, b_all, ((u @ where) * f).tolist())
                else:
                    blocks, per_block, size = a_all.shape
                    f = _freqs(d, per_block, theta, s)  # subsampled from the D / 2 source spectrum
                    u = u_all / u_all.norm(dim=-1, keepdim=True)
                    v = torch.cat(
                        [
                            bank(v[kb * size : (kb + 1) * size], a_all[kb], b_all[kb], ((u[kb] @ where) * f).tolist())
                            for kb in range(blocks)
                        ]
                    )
                out[i, h, t] = v.to(x.dtype)
    return out


LEARNED = [
    ("axis", {}),
    ("axis", {"num_planes": 5}),
    ("mixed", {}),
    ("mixed", {"num_planes": 6, "log_freq_scale": 1.8}),
    ("block_mixed", {}),
    ("block_mixed", {"block_size": 8, "planes_per_block": 3}),
]


@pytest.mark.parametrize("mode, kwargs", LEARNED)
def test_learned_planes_equal_the_transcribed_formula(mode, kwargs):
    """Random (not orthogonal) raw planes and directions: every token's q and k equal the formula."""
    torch.manual_seed(3)
    enc = create("grape-learned", head_dim=16, mode=mode, theta=100.0, rope_init=False, **kwargs).double()
    q, k = _qk(b=2, hq=2, hkv=1, n=5, d=16, dtype=torch.float64)
    pos = torch.randint(0, 40, (2, 5, 3)).double()
    qr, kr = enc.rotate(q, k, Coords(pos, THW))
    s = kwargs.get("log_freq_scale", 1.0)
    torch.testing.assert_close(qr, _transcribed(enc, q, pos, 100.0, s), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(kr, _transcribed(enc, k, pos, 100.0, s), rtol=1e-10, atol=1e-10)


def _orthonormal_planes(enc, seed=0, same_banks=False):
    """Give ``enc`` mutually orthogonal planes (columns of random orthogonal matrices), as raw values that
    are neither unit nor orthogonal (scaled ``a``, ``b + c a``): the orthonormalisation recovers them."""
    g = torch.Generator().manual_seed(seed)
    *lead, planes, width = enc.a.shape
    count = 1 if same_banks else math.prod(lead)
    qs = torch.linalg.qr(torch.randn(count, width, width, generator=g, dtype=torch.float64))[0]
    if same_banks:
        qs = qs.expand(math.prod(lead), -1, -1)
    a = qs[:, :, 0 : 2 * planes : 2].transpose(1, 2).reshape(enc.a.shape)
    b = qs[:, :, 1 : 2 * planes : 2].transpose(1, 2).reshape(enc.b.shape)
    with torch.no_grad():
        enc.a.copy_(3.0 * a)
        enc.b.copy_(b + 0.5 * a)
        if enc.axis_weight is not None:
            enc.axis_weight.copy_(torch.randn(enc.axis_weight.shape, generator=g, dtype=torch.float64))


def _scores(enc, q, k, pos):
    qr, kr = enc.rotate(q, k, Coords(pos, THW))
    return qr @ kr.transpose(-1, -2)


@pytest.mark.parametrize("mode", ["axis", "mixed", "block_mixed"])
def test_relative_law_where_the_planes_commute(mode):
    """Mutually orthogonal planes: a rotation, and scores unchanged when every position moves by the same
    (t, h, w) offset. ``axis``'s three banks commute when they share their planes (as at ``rope_init``);
    ``mixed`` / ``block_mixed`` have one bank (per block), with any learned directions."""
    torch.manual_seed(0)
    enc = create("grape-learned", head_dim=16, mode=mode, block_size=8).double()
    _orthonormal_planes(enc, same_banks=mode == "axis")
    q, k = _qk(b=1, hq=2, hkv=2, n=6, d=16, dtype=torch.float64)
    pos = torch.randint(0, 50, (1, 6, 3)).double()
    offset = torch.tensor([17.0, -5.0, 230.0], dtype=torch.float64)
    qr, _ = enc.rotate(q, k, Coords(pos, THW))
    torch.testing.assert_close(qr.norm(dim=-1), q.norm(dim=-1), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(_scores(enc, q, k, pos + offset), _scores(enc, q, k, pos), rtol=1e-10, atol=1e-10)


def test_relative_law_fails_where_the_planes_do_not_commute():
    """What the paper's law needs: ``axis`` with different orthonormal planes per bank (non-commuting
    generators), and any mode with planes that overlap (the reference sums per-plane turns, which is a
    rotation only for mutually orthogonal planes) are not relative -- the test of the law above can fail."""
    q, k = _qk(b=1, hq=1, hkv=1, n=6, d=16, dtype=torch.float64)
    pos = torch.randint(0, 50, (1, 6, 3), generator=torch.Generator().manual_seed(2)).double()
    offset = torch.tensor([17.0, -5.0, 230.0], dtype=torch.float64)
    axis = create("grape-learned", head_dim=16, mode="axis").double()
    _orthonormal_planes(axis, seed=1, same_banks=False)
    assert (_scores(axis, q, k, pos + offset) - _scores(axis, q, k, pos)).abs().max() > 1e-2
    torch.manual_seed(0)
    mixed = create("grape-learned", head_dim=16, mode="mixed", rope_init=False).double()  # N(0, 0.02^2) planes
    qr, _ = mixed.rotate(q, k, Coords(pos, THW))
    assert (qr.norm(dim=-1) - q.norm(dim=-1)).abs().max() > 1e-2
    assert (_scores(mixed, q, k, pos + offset) - _scores(mixed, q, k, pos)).abs().max() > 1e-2


def _plan_encoder(weight, d, convention):
    return RotaryEncoder(FrequencyPlan(weight.float(), THW, d, convention))


def test_canonical_limits():
    """Where the learned planes are the canonical ones, ``grape-learned`` is a frequency plan:
    ``mixed`` at ``rope_init`` is ``grape-i`` (interleaved pairs); ``mixed`` with one-hot directions by
    ``mrope_section`` chunks and ``convention="half"`` is ``grape``; ``axis`` at ``rope_init`` turns pair ``p``
    by ``f_p (t + h + w)``; ``block_mixed`` at ``rope_init`` repeats a ``planes_per_block`` spectrum per block."""
    d, ids = 32, _positions(b=2, n=9, high=300, seed=4)
    coords = _thw(ids, torch.float64)  # float64 angles on both sides: the same float32 spectrum
    q, k = _qk(b=2, hq=4, hkv=2, n=9, d=d, dtype=torch.float64)
    close = {"rtol": 1e-9, "atol": 1e-9}

    mixed = create("grape-learned", head_dim=d, theta=THETA, log_freq_scale=1.7).double()
    canonical = create("grape-i", head_dim=d, theta=THETA, log_freq_scale=1.7, convention="interleaved")
    for got, want in zip(mixed.rotate(q, k, coords), canonical.rotate(q, k, coords)):
        torch.testing.assert_close(got, want, **close)

    half = create("grape-learned", head_dim=d, theta=THETA, convention="half").double()
    section = [4, 6, 6]
    with torch.no_grad():
        half.axis_weight.zero_()[torch.arange(16), torch.repeat_interleave(torch.arange(3), torch.tensor(section))] = 1
    chunked = create("grape", head_dim=d, theta=THETA, mrope_section=section)
    for got, want in zip(half.rotate(q, k, coords), chunked.rotate(q, k, coords)):
        torch.testing.assert_close(got, want, **close)

    f = _freqs(d, d // 2, THETA).float()
    axis = create("grape-learned", head_dim=d, mode="axis", theta=THETA).double()
    summed = _plan_encoder(f.expand(3, -1), d, "interleaved")
    for got, want in zip(axis.rotate(q, k, coords), summed.rotate(q, k, coords)):
        torch.testing.assert_close(got, want, **close)

    block = create(
        "grape-learned", head_dim=d, mode="block_mixed", theta=THETA
    ).double()  # 2 blocks of 16, 8 planes each
    sub = _freqs(d, 8, THETA).float().repeat(2)  # pair n * 8 + p: f_sub[p]
    weight = torch.zeros(3, 16)
    weight[torch.arange(16) % 3, torch.arange(16)] = sub  # plane i (over blocks): axis i mod 3
    for got, want in zip(block.rotate(q, k, coords), _plan_encoder(weight, d, "interleaved").rotate(q, k, coords)):
        torch.testing.assert_close(got, want, **close)


@pytest.mark.parametrize("mode", ["axis", "mixed", "block_mixed"])
def test_gradients_reach_the_planes(mode):
    enc = create("grape-learned", head_dim=16, mode=mode, block_size=8)
    q, k = _qk(b=1, hq=2, hkv=2, n=5, d=16)
    q.requires_grad_(True)
    qr, kr = enc.rotate(q, k, _thw(_positions(b=1, n=5, high=20)))
    (qr @ kr.transpose(-1, -2)).square().sum().backward()
    params = dict(enc.named_parameters())
    assert set(params) == ({"a", "b"} if mode == "axis" else {"a", "b", "axis_weight"})
    for name, p in params.items():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name
    assert q.grad.abs().sum() > 0
    frozen = create("grape-learned", head_dim=16, mode=mode, block_size=8, learnable=False)
    assert not any(p.requires_grad for p in frozen.parameters())


def test_learned_forward_captures_in_one_graph():
    """``torch.compile(fullgraph=True)`` traces ``rotate`` without a graph break (the eager backend: the
    capture is what is checked, not code generation)."""
    enc = create("grape-learned", head_dim=16, mode="block_mixed", block_size=8)
    q, k = _qk(b=2, hq=2, hkv=1, n=5, d=16)
    coords = _thw(_positions(b=2, n=5, high=20))
    compiled = torch.compile(lambda q, k, c: enc.rotate(q, k, c), fullgraph=True, backend="eager")
    for got, want in zip(compiled(q, k, coords), enc.rotate(q, k, coords)):
        torch.testing.assert_close(got, want)


def test_learned_in_a_transformer_and_on_text():
    """One instance per layer in ``mmpos.nn.Transformer``, on ``grape`` layouts; a 1-D sequence reads as text."""
    torch.manual_seed(0)
    model = mmpos.nn.Transformer(
        32, 2, 2, pos="grape-learned", pos_kwargs={"grape-learned": {"mode": "axis"}}, causal=True, conv_after=()
    )
    encs = [blk.attn.encoders["grape-learned"] for blk in model.blocks]
    assert encs[0] is not encs[1] and encs[0].a.data_ptr() != encs[1].a.data_ptr()
    lay = build([[Text(3), Image((1, 2, 4)), Text(2), Video((2, 2, 2))]], "grape")
    x = torch.randn(1, lay.coords.num_tokens, 32, requires_grad=True)
    model(x, lay.coords).sum().backward()
    assert all(e.a.grad is not None and e.a.grad.abs().sum() > 0 for e in encs)
    enc = encs[0]
    q, k = _qk(b=1, hq=2, hkv=2, n=6, d=16)
    text = enc.rotate(q, k, Coords.sequence(6))
    same = enc.rotate(q, k, Coords(torch.arange(6.0)[None, :, None].expand(1, 6, 3), THW))
    for got, want in zip(text, same):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_learned_errors():
    with pytest.raises(ValueError, match="mode must be one of"):
        create("grape-learned", head_dim=16, mode="canonical")
    with pytest.raises(ValueError, match="num_planes must be at most head_dim / 2 = 8"):
        create("grape-learned", head_dim=16, num_planes=9)
    with pytest.raises(ValueError, match="block_size must be even and divide head_dim=16"):
        create("grape-learned", head_dim=16, mode="block_mixed", block_size=6)
    with pytest.raises(ValueError, match="planes_per_block must be at most block_size / 2 = 4"):
        create("grape-learned", head_dim=16, mode="block_mixed", block_size=8, planes_per_block=5)
    with pytest.raises(ValueError, match="planes_per_block applies to mode='block_mixed' only"):
        create("grape-learned", head_dim=16, mode="mixed", planes_per_block=2)
    with pytest.raises(ValueError, match="num_planes applies to modes 'axis' and 'mixed'"):
        create("grape-learned", head_dim=16, mode="block_mixed", num_planes=2)
    with pytest.raises(ValueError, match="log_freq_scale"):
        create("grape-learned", head_dim=16, log_freq_scale=-1)
    with pytest.raises(ValueError, match="head_dim"):
        create("grape-learned", head_dim=15)
    enc = create("grape-learned", head_dim=16)
    with pytest.raises(TypeError, match="no cos / sin of channel pairs"):
        enc.rotation(Coords.sequence(4))
    with pytest.raises(ValueError, match="head_dim=16"):
        enc.rotate(*_qk(d=8), Coords.sequence(7))
    with pytest.raises(ValueError, match="reads axes"):
        enc.rotate(*_qk(d=16, n=12), Coords.grid(3, 4))


@pytest.mark.parametrize("mode", ["axis", "mixed", "block_mixed"])
def test_learned_angles_and_static_scaling(mode):
    """``angles`` are the planes' angles; a linear rule turns at ``pos / factor`` (it scales the source spectrum,
    as the reference's ``inv_freq`` carries the model's rope_scaling); rules with an attention factor are refused."""
    kw = {"head_dim": 16, "mode": mode, "block_size": 8}
    base, scaled = (
        create("grape-learned", **kw),
        create("grape-learned", scaling={"rule": "linear", "factor": 2.0}, **kw),
    )
    coords = _thw(_positions(b=1, n=5, high=30))
    planes = {"axis": 3 * 8, "mixed": 8, "block_mixed": 2 * 4}[mode]
    assert base.angles(coords).shape == (1, 5, planes)
    torch.testing.assert_close(scaled.angles(coords), base.angles(coords.scaled(0.5)), rtol=1e-6, atol=1e-6)
    q, k = _qk(b=1, hq=2, hkv=2, n=5, d=16)
    for got, want in zip(scaled.rotate(q, k, coords), base.rotate(q, k, coords.scaled(0.5))):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="static scaling rules without an attention factor"):
        create("grape-learned", scaling={"rule": "yarn", "factor": 4.0, "original_size": 16}, **kw)


def test_learned_keeps_frequencies_and_directions_float32_under_a_cast():
    """``model.to(torch.bfloat16)``: the planes follow, the frequencies and phase directions stay float32 (they
    multiply positions in the thousands); the bf16 turn stays close to the float32 one at position ~3000."""
    enc = create("grape-learned", head_dim=32, mode="mixed")
    coords = _thw(_positions(b=1, n=6, high=3000))
    q, k = _qk(b=1, hq=2, hkv=2, n=6, d=32)
    want = enc.rotate(q, k, coords)
    enc.to(torch.bfloat16)
    assert enc.a.dtype == torch.bfloat16 and enc.freq.dtype == torch.float32 and enc.axis_weight.dtype == torch.float32
    for got, ref in zip(enc.rotate(q.bfloat16(), k.bfloat16(), coords), want):
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got.float(), ref, rtol=0.05, atol=0.05)
    assert enc.double().freq.dtype == torch.float64  # a cast to more bits is kept
