import math

import pytest
import torch
from transformers.models.qwen2_vl import modeling_qwen2_vl
from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLTextConfig
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding
from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLTextConfig
from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding, apply_rotary_pos_emb

import mmpos
from mmpos import Coords, create
from mmpos.encoders.mrope import MRoPE, default_mrope_section, hope_plan, mrope_plan
from mmpos.layout import Image, Text, Video, build
from mmpos.rotary import apply_rotary, rope_frequencies
from mmpos.schemes import SCHEMES

pytestmark = pytest.mark.hf  # run on the oldest and the newest supported transformers
D = 128  # head_dim of the Qwen-VL checkpoints
THETA = 1e6


def _qk(b=2, hq=4, hkv=2, n=37, d=D, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, n, d, generator=g).to(dtype)
    k = torch.randn(b, hkv, n, d, generator=g).to(dtype)
    return q, k


def _positions(b=2, n=37, high=3000, seed=1):
    """Independent random integer positions per axis: ``(3, B, N)`` (HF layout)."""
    return torch.randint(0, high, (3, b, n), generator=torch.Generator().manual_seed(seed))


def _thw(position_ids):
    return Coords(position_ids.permute(1, 2, 0).float(), ("t", "h", "w"))


def apply_multimodal_rotary_pos_emb(q, k, cos, sin, section):
    """How the installed Qwen2-VL attention applies the rotary module's output: transformers
    < 5.17 picks a row of ``(3, B, L, D)`` per section (``apply_multimodal_rotary_pos_emb``);
    from 5.17 the rotary module recomposes the sections itself and returns ``(B, L, D)``."""
    if hasattr(modeling_qwen2_vl, "apply_multimodal_rotary_pos_emb"):
        return modeling_qwen2_vl.apply_multimodal_rotary_pos_emb(q, k, cos, sin, section)
    return modeling_qwen2_vl.apply_rotary_pos_emb(q, k, cos, sin)


def _hf_effective_cos_sin(apply, cos, sin, n_pairs, *args):
    """The per-pair cos/sin a HF apply function really uses: rotating q = [1...1, 0...0]
    yields ``[cos, sin]`` of the first half (``q * cos + rotate_half(q) * sin``)."""
    probe = torch.cat([torch.ones(n_pairs), torch.zeros(n_pairs)]).to(cos.dtype).expand(1, 1, 1, 2 * n_pairs)
    out, _ = apply(probe, probe, cos, sin, *args)
    return out[:, 0, :, :n_pairs], out[:, 0, :, n_pairs:]


# --------------------------------------------------------------------- registry
def test_registered_as_rotary_with_paper():
    infos = {i.name: i for i in mmpos.list_encoders()}
    for name in ["mrope", "mrope-i", "mhrope", "vrope", "hope", "v2pe"]:
        assert infos[name].kind == "rotary" and "arXiv" in infos[name].paper
    assert "mrope-interleaved" not in infos  # one name per encoder


def test_default_sections_are_the_qwen_ones():
    assert default_mrope_section(128) == (16, 24, 24)
    assert default_mrope_section(128, axis_order="cyclic") == (24, 20, 20)
    assert sum(default_mrope_section(64)) == 32 and sum(default_mrope_section(64, "cyclic")) == 32
    with pytest.raises(ValueError, match="axis_order must be one of"):
        default_mrope_section(128, axis_order="interleaved")  # the pair convention's word, not an axis order


# --------------------------------------------------------------------- text-only reduces to RoPE
@pytest.mark.parametrize("name", ["mrope", "mrope-i", "vrope", "mhrope", "v2pe"])
@pytest.mark.parametrize("start", [0, 517])
def test_text_only_equals_vanilla_rope(name, start):
    q, k = _qk(hq=8, hkv=4)
    n = q.shape[2]
    text = Coords.sequence(n, batch=2, start=start)
    ref = create("rope", head_dim=D).rotate(q, k, text)
    kw = {"head_sections": [1, 2, 1], "num_heads": 8, "num_kv_heads": 4} if name == "mhrope" else {}
    enc = create(name, head_dim=D, **kw)
    out = enc.rotate(q, k, text)
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
    if name != "v2pe":  # the same positions written out on every axis the plan reads
        pos = text.pos.expand(2, n, len(enc.axes))
        out = enc.rotate(q, k, Coords(pos, enc.axes))
        assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])


def test_hope_on_text_is_rope_with_its_temporal_pairs_unrotated():
    q, k = _qk(hq=2, hkv=2)
    text = Coords.sequence(q.shape[2], batch=2, start=40)
    s_t = 16
    rope, _ = create("rope", head_dim=D).rotate(q, k, text)
    hope, _ = create("hope", head_dim=D, mrope_section=[s_t, 24, 24]).rotate(q, k, text)
    p = D // 2
    for half in (slice(0, p - s_t), slice(p, 2 * p - s_t)):  # both channels of the spatial pairs
        assert torch.equal(hope[..., half], rope[..., half])
    for half in (slice(p - s_t, p), slice(2 * p - s_t, 2 * p)):
        assert torch.equal(hope[..., half], q[..., half])


# --------------------------------------------------------------------- HF parity
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("section", [[16, 24, 24], [8, 28, 28]])
def test_chunked_equals_qwen2vl(dtype, section):
    cfg = Qwen2VLTextConfig(
        hidden_size=D * 4,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_theta=THETA,
        rope_scaling={"type": "mrope", "mrope_section": section},
    )
    q, k = _qk(dtype=dtype)
    ids = _positions()
    cos, sin = Qwen2VLRotaryEmbedding(cfg)(q, ids)
    q_ref, k_ref = apply_multimodal_rotary_pos_emb(q, k, cos, sin, section)
    enc = create("mrope", head_dim=D, mrope_section=section, theta=THETA)
    q_out, k_out = enc.rotate(q, k, _thw(ids))
    assert torch.equal(q_out, q_ref) and torch.equal(k_out, k_ref)
    # cos/sin: mmpos angles against what HF's apply function uses per pair
    angles = enc.angles(_thw(ids))
    hf_cos, hf_sin = _hf_effective_cos_sin(apply_multimodal_rotary_pos_emb, cos, sin, D // 2, section)
    assert torch.equal(angles.cos().to(dtype), hf_cos) and torch.equal(angles.sin().to(dtype), hf_sin)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_interleaved_equals_qwen3vl(dtype):
    section = [24, 20, 20]
    cfg = Qwen3VLTextConfig(
        hidden_size=D * 4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=D,
        rope_theta=5e6,
        rope_scaling={"rope_type": "default", "mrope_section": section, "mrope_interleaved": True},
    )
    q, k = _qk(dtype=dtype)
    ids = _positions(seed=3)
    cos, sin = Qwen3VLTextRotaryEmbedding(cfg)(q, ids)
    q_ref, k_ref = apply_rotary_pos_emb(q, k, cos, sin)
    enc = create("mrope-i", head_dim=D, mrope_section=section, theta=5e6)
    q_out, k_out = enc.rotate(q, k, _thw(ids))
    assert torch.equal(q_out, q_ref) and torch.equal(k_out, k_ref)
    angles = enc.angles(_thw(ids))
    assert torch.equal(angles.cos().to(dtype), cos[..., : D // 2])
    assert torch.equal(angles.sin().to(dtype), sin[..., D // 2 :])


def test_interleaved_assignment_is_thw_then_t():
    plan = mrope_plan(D, [24, 20, 20], axis_order="cyclic")
    axis = (plan.weight != 0).long().argmax(0)  # (P,) which axis each pair reads
    assert axis[:60].tolist() == [0, 1, 2] * 20 and axis[60:].tolist() == [0] * 4
    chunked = (mrope_plan(D, [16, 24, 24]).weight != 0).long().argmax(0)
    assert chunked.tolist() == [0] * 16 + [1] * 24 + [2] * 24


# --------------------------------------------------------------------- MHRoPE
def _rope_on(x, pos_1d):
    """1-D RoPE of ``x`` ``(B, H, N, D)`` at positions ``(B, N)`` (the vanilla encoder)."""
    enc = create("rope", head_dim=x.shape[-1])
    out, _ = enc.rotate(x, x, Coords(pos_1d.unsqueeze(-1).float(), ("seq",)))
    return out


def test_mhrope_head_assignment_and_gqa():
    hq, hkv, sections = 16, 8, [2, 3, 2]  # the 8th KV head is left unrotated
    q, k = _qk(hq=hq, hkv=hkv, d=64)
    ids = _positions(seed=5)
    enc = create("mhrope", head_dim=64, num_heads=hq, num_kv_heads=hkv, head_sections=sections)
    q_out, k_out = enc.rotate(q, k, _thw(ids))
    head_axis = [0, 0, 1, 1, 1, 2, 2, None]
    for j, a in enumerate(head_axis):
        kj = k[:, j : j + 1]
        qj = q[:, 2 * j : 2 * j + 2]  # query heads 2j, 2j+1 share KV head j (repeat_interleave)
        if a is None:
            assert torch.equal(k_out[:, j : j + 1], kj) and torch.equal(q_out[:, 2 * j : 2 * j + 2], qj)
        else:
            assert torch.equal(k_out[:, j : j + 1], _rope_on(kj, ids[a]))
            assert torch.equal(q_out[:, 2 * j : 2 * j + 2], _rope_on(qj, ids[a]))


def test_mhrope_default_sections_and_errors():
    enc = create("mhrope", head_dim=64, num_heads=16, num_kv_heads=8)
    heads_per_axis = (enc.weight != 0).any(-1).sum(0)  # (A,)
    assert heads_per_axis.tolist() == [2, 3, 3]
    with pytest.raises(ValueError, match="head_sections"):
        create("mhrope", head_dim=64, num_kv_heads=4, head_sections=[2, 2, 2])
    with pytest.raises(ValueError, match="num_kv_heads"):
        create("mhrope", head_dim=64, num_heads=6, num_kv_heads=4)
    q, k = _qk(hq=8, hkv=2, d=64)
    with pytest.raises(ValueError, match="KV heads"):
        create("mhrope", head_dim=64, num_heads=8, num_kv_heads=4).rotate(q, k, Coords.sequence(q.shape[2]))


# --------------------------------------------------------------------- VRoPE
def test_vrope_pair_reads_combination_p_mod_4():
    q, k = _qk(hq=2, hkv=2, d=32, n=6)
    h, w = 2, 3
    i, j = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    i, j = i.flatten(), j.flatten()
    start = 5  # the frame starts right after 5 text tokens
    combos = torch.stack([i + j, i + (w - 1 - j), (h - 1 - i) + j, (h - 1 - i) + (w - 1 - j)], -1) + start
    enc = create("vrope", head_dim=32)
    q_out, _ = enc.rotate(q, k, Coords(combos.float().expand(2, 6, 4), ("c0", "c1", "c2", "c3")))
    per_pair = combos[:, torch.arange(16) % 4].float()  # (N, P): pair p at combination p mod 4
    angles = per_pair * rope_frequencies(16)
    ref = apply_rotary(q, angles.cos()[None], angles.sin()[None])
    assert torch.equal(q_out, ref)
    # corner (0, 0) sees four distinct positions; (1, 1) mirrors them; c0 + c3 == c1 + c2
    assert combos[0].tolist() == [5, 7, 6, 8] and combos[4].tolist() == [7, 7, 6, 6]
    assert torch.equal(combos[:, 0] + combos[:, 3], combos[:, 1] + combos[:, 2])


def test_vrope_needs_its_axes():
    q, k = _qk(d=32)
    with pytest.raises(ValueError, match="c0"):
        create("vrope", head_dim=32).rotate(q, k, _thw(_positions()))


# --------------------------------------------------------------------- HoPE
def test_hope_assignment_and_zero_frequency_pairs():
    plan = hope_plan(D, [16, 24, 24])
    assert plan.axes == ("h", "w")
    freq = rope_frequencies(64)
    assert torch.equal(plan.weight[0, :48:2], freq[:48:2]) and torch.equal(plan.weight[1, 1:48:2], freq[1:48:2])
    assert not plan.weight[0, 1:48:2].any() and not plan.weight[1, :48:2].any()
    assert not plan.weight[:, 48:].any()  # the 16 lowest frequencies: NoPE
    q, k = _qk()
    ids = _positions(seed=7)
    q_out, _ = create("hope", head_dim=D).rotate(q, k, _thw(ids))
    for ch in (slice(48, 64), slice(112, 128)):
        assert torch.equal(q_out[..., ch], q[..., ch])
    q_t, _ = create("hope", head_dim=D).rotate(q, k, _thw(ids + torch.tensor([50, 0, 0]).view(3, 1, 1)))
    assert torch.equal(q_t, q_out)  # t is not read at all


# --------------------------------------------------------------------- V2PE
def test_v2pe_float64_keeps_1_over_256_at_a_million():
    delta = 1 / 256
    base = 1_000_000
    n = 9
    pos = torch.tensor([base + k * delta for k in range(n)], dtype=torch.float64).view(1, n, 1)
    q, k = _qk(b=1, hq=1, hkv=1, n=n, d=64)
    enc = create("v2pe", head_dim=64)
    angles = enc.angles(Coords(pos, ("seq",)))
    assert angles.dtype == torch.float64
    steps = angles[0, 1:, 0] - angles[0, :-1, 0]  # pair 0 has frequency 1
    torch.testing.assert_close(steps, torch.full((n - 1,), delta, dtype=torch.float64), rtol=0, atol=1e-9)
    # the rotation equals a float64 reference: angle = position * frequency
    q_out, _ = enc.rotate(q, k, Coords(pos, ("seq",)))
    ref_angles = pos[0] * rope_frequencies(32).double()
    x1, x2 = q[..., :32].double(), q[..., 32:].double()
    ref = torch.cat([x1 * ref_angles.cos() - x2 * ref_angles.sin(), x2 * ref_angles.cos() + x1 * ref_angles.sin()], -1)
    torch.testing.assert_close(q_out.double(), ref, rtol=0, atol=1e-5)
    # float32 positions cannot hold these steps (spacing 1/16 at 1e6): the tokens collapse
    a32 = enc.angles(Coords(pos.float(), ("seq",)))
    assert a32.dtype == torch.float32 and torch.equal(a32[0, 0], a32[0, 1])
    assert not torch.equal(angles[0, 0], angles[0, 1])


def test_v2pe_reads_seq_only():
    q, k = _qk(d=32)
    with pytest.raises(ValueError, match="seq"):
        create("v2pe", head_dim=32).rotate(q, k, _thw(_positions()))


# --------------------------------------------------------------------- with mmpos.layout
SAMPLES = [
    [Text(3), Image((1, 4, 6)), Text(4), Video((2, 4, 4)), Text(2)],
    [Text(5), Image((1, 6, 4)), Text(1)],
]


LAYOUT_ENCODERS = [
    ("qwen2-vl", "mrope"),
    ("qwen2.5-vl", "mrope"),
    ("qwen3-vl", "mrope-i"),
    ("mrope-i", "mrope-i"),
    ("mhrope", "mhrope"),
    ("hope", "hope"),
    ("vrope", "vrope"),
    ("v2pe", "v2pe"),
    ("grape", "grape"),
    ("grape-i", "grape-i"),
    ("circlerope", "mrope"),
    ("flat", "rope"),
]


def test_every_scheme_names_one_registered_rotary_encoder():
    """The scheme -> encoder map lives in the scheme record (``Scheme.encoder``) only."""
    assert {name: s.encoder for name, s in SCHEMES.items() if name in dict(LAYOUT_ENCODERS)} == dict(LAYOUT_ENCODERS)
    infos = {i.name: i for i in mmpos.list_encoders()}
    assert all(infos[s.encoder].kind == "rotary" for s in SCHEMES.values())


@pytest.mark.parametrize("scheme, name", LAYOUT_ENCODERS)
def test_reads_the_layout_of_its_scheme(scheme, name):
    """Every encoder reads the coordinates of its layout; the tokens of a vision block are
    rotated by the plan at the layout's positions (checked pair by pair)."""
    options = {"hope": {"temporal_scale": 0.75}, "v2pe": {"delta": 1 / 64}}.get(scheme, {})
    lay = build(SAMPLES, scheme, padding_side="left", **options)
    kw = {"num_heads": 4, "num_kv_heads": 2, "head_sections": [1, 1, 0]} if name == "mhrope" else {}
    enc = create(name, head_dim=32, **kw)
    q, k = _qk(hq=4, hkv=2, n=lay.coords.num_tokens, d=32)
    q_out, k_out = enc.rotate(q, k, lay.coords)
    pos = enc.positions(lay.coords).select(*enc.axes).pos.double()  # (B, N, A) the axes the plan reads
    weight = enc.weight.double()
    if weight.dim() == 2:
        angles = (pos.unsqueeze(-1) * weight).sum(-2).unsqueeze(1)  # (B, 1, N, P)
    else:
        angles = (pos[:, None, :, :, None] * weight[None, :, None]).sum(-2).repeat_interleave(2, 1)  # (B, Hq, N, P)
    x1, x2 = q.double().chunk(2, -1)
    ref = torch.cat([x1 * angles.cos() - x2 * angles.sin(), x2 * angles.cos() + x1 * angles.sin()], -1)
    torch.testing.assert_close(q_out.double(), ref, rtol=0, atol=2e-5)
    if scheme in ("qwen2-vl", "qwen3-vl"):  # and exactly as transformers, from the layout's position_ids
        cls = Qwen2VLRotaryEmbedding if scheme == "qwen2-vl" else Qwen3VLTextRotaryEmbedding
        section = list(default_mrope_section(32, "cyclic" if scheme == "qwen3-vl" else "chunked"))
        cfg = (Qwen2VLTextConfig if scheme == "qwen2-vl" else Qwen3VLTextConfig)(
            hidden_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            rope_theta=10000.0,
            rope_scaling={"rope_type": "default", "mrope_section": section},
        )
        cos, sin = cls(cfg)(q, lay.position_ids)
        if scheme == "qwen2-vl":
            q_ref, k_ref = apply_multimodal_rotary_pos_emb(q, k, cos, sin, section)
        else:
            q_ref, k_ref = apply_rotary_pos_emb(q, k, cos, sin)
        real = lay.coords.mask[:, None, :, None]  # padding: HF ids are 1 there, mmpos positions 0
        assert torch.equal(torch.where(real, q_out, 0), torch.where(real, q_ref, 0))
        assert torch.equal(torch.where(real, k_out, 0), torch.where(real, k_ref, 0))


@pytest.mark.parametrize("name", ["mrope", "mrope-i", "mhrope", "vrope", "v2pe"])
def test_in_an_mmpos_transformer(name):
    """Inside ``mmpos.nn.Transformer`` (GQA, causal) each encoder gives the 1-D RoPE model's
    output on text, and a different one on its layout's vision positions."""
    from mmpos.nn import Transformer

    def model(pos):
        torch.manual_seed(0)
        return Transformer(
            64,
            2,
            4,
            pos=pos,
            num_kv_heads=2,
            causal=True,
            pos_kwargs={"mhrope": {"head_sections": [1, 1, 0]}} if pos == "mhrope" else None,
        )

    scheme = {"mrope": "qwen2-vl", "mrope-i": "mrope-i"}.get(name, name)
    lay = build(SAMPLES[1:], scheme, **({"delta": 0.25} if name == "v2pe" else {}))
    x = torch.randn(1, lay.coords.num_tokens, 64)
    text = Coords.sequence(lay.coords.num_tokens)
    ours, rope = model(name), model("rope")
    assert torch.equal(ours(x, text), rope(x, text))
    assert not torch.allclose(ours(x, lay.coords), rope(x, text))


# --------------------------------------------------------------------- errors and compile
def test_bad_sections_give_clear_errors():
    with pytest.raises(ValueError, match=r"mrope_section .*summing to 64"):
        create("mrope", head_dim=128, mrope_section=[16, 24, 16])
    with pytest.raises(ValueError, match="mrope_section"):
        create("mrope", head_dim=128, mrope_section=[32, 32])
    with pytest.raises(ValueError, match="mrope_section"):
        create("mrope", head_dim=128, mrope_section=[-8, 36, 36])
    with pytest.raises(ValueError, match=r"cyclic mrope_section \[4, 30, 30\]"):
        create("mrope-i", head_dim=128, mrope_section=[4, 30, 30])
    with pytest.raises(ValueError, match="mrope_section"):
        create("hope", head_dim=128, mrope_section=[16, 24])
    with pytest.raises(ValueError, match="head_dim"):
        create("vrope", head_dim=30 + 1)
    q, k = _qk(d=D)
    with pytest.raises(ValueError, match=r"reads axes \('t', 'h', 'w'\)"):
        create("mrope", head_dim=D).rotate(q, k, Coords.grid(1, 37))


def test_rotate_compiles_without_graph_breaks():
    enc = create("mrope-i", head_dim=64)
    q, k = _qk(d=64)
    coords = _thw(_positions())
    compiled = torch.compile(enc.rotate, backend="eager", fullgraph=True)
    out = compiled(q, k, coords)
    ref = enc.rotate(q, k, coords)
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
    assert math.isclose(float(out[0].norm()), float(q.norm()), rel_tol=1e-4)  # rotations keep the norm


def test_videorope_plan_is_the_reference_lta_allocation():
    """Wiselnn570/VideoRoPE ``apply_m_modify_multimodal_rotary_pos_emb`` with [16, 24, 24]: over the
    64 rotate-half channels of each half, 48 alternate h, w (h first), the last 16 read t; every
    pair keeps the 1-D frequency theta ** (-p / 64) (transcribed: channel index -> row)."""
    from mmpos.encoders.mrope import videorope_plan

    section = [16, 24, 24]
    rows = []  # the reference's loop over the first half of the channels: sections (48, 16)
    for i, n in enumerate([section[1] + section[2], section[0]]):
        rows += [1 if j % 2 == 0 else 2 for j in range(n)] if i % 2 == 0 else [0] * n
    plan = videorope_plan(128, section, theta=1e6)
    weight = plan.weight  # (A, P): axis a's frequency at pair p
    assert (weight != 0).sum(0).eq(1).all()  # one axis per pair
    assert weight.abs().argmax(0).tolist() == rows
    assert torch.allclose(weight.sum(0), rope_frequencies(64, 1e6).to(weight.dtype))
    enc = create("videorope", head_dim=128, mrope_section=section, theta=1e6)
    assert enc.axes == ("t", "h", "w") and torch.equal(enc.weight, plan.weight)


def test_mrope_axes_names_the_three_sectioned_axes():
    """``axes=`` renames the axes; the angles are those of the default plan on the same columns."""
    torch.manual_seed(0)
    pos = torch.randint(0, 20, (2, 5, 3)).double()
    default = MRoPE(head_dim=16)
    named = MRoPE(head_dim=16, axes=("w", "h", "image"))
    a = default.angles(Coords(pos=pos, axes=("t", "h", "w")))
    b = named.angles(Coords(pos=pos, axes=("w", "h", "image")))
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    with pytest.raises(ValueError, match="axes"):
        named.angles(Coords(pos=pos, axes=("t", "h", "w")))
    for bad in (("t", "t", "w"), ("t", "h"), ("t", "h", "")):
        with pytest.raises(ValueError, match="axes must be 3 distinct"):
            MRoPE(head_dim=16, axes=bad)
    with pytest.raises(TypeError, match="axes must be a sequence"):
        MRoPE(head_dim=16, axes="thw")
