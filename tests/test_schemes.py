"""Tests for :mod:`mmpos.schemes`: positions and angles written out independently of the packer.

Each ``_reference_*`` function below is a small explicit loop transcribed from the rule of the
scheme's reference repository (read for the rule, not copied), run token by token on random
interleavings and compared with :func:`mmpos.layout.build` and the scheme's rotary encoder:

* MRoPE-I (spatial reset, temporal stride) and MHRoPE positions: JJJYmmm/Multimodal-RoPEs
  ``multimodal_ropes/pos_design/mrope_i.py`` (``get_mrope_interleave_index``; MHRoPE uses it
  with ``spatial_reset=True`` as its README and ``test.py`` do, ``mhrope-qwen2-vl`` with ``False``); MHRoPE heads: ``freq_allocation/mhrope.py``; MRoPE-I pairs:
  Qwen3-VL's ``apply_interleaved_mrope`` (``freq_allocation/mrope_i.py``).
* HoPE: hrlics/HoPE ``modeling_hope.py`` (as restated in JJJYmmm ``pos_design/hope.py``).
* VRoPE: johncaged/VRoPE ``vrope.py`` (``generate_nd_positions``).
* ILRoPE / OmniRoPE: JJJYmmm ``pos_design/omnirope.py`` (``ilrope.py`` calls it); MM-RoPE:
  ``pos_design/mmrope.py`` (``position_scale`` 1) and ``freq_allocation/mmrope.py`` (``T,T,H,W,H,W,H,W``).
* V2PE: OpenGVLab/V2PE (``arange(last, last + stride * (n + 1), stride)[1:]``, text resumes at
  ``ceil(last visual) + 1``; ``modeling_internlm2.py`` 1-D RoPE at those positions).
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import replace

import pytest
import torch

from mmpos import create
from mmpos.layout import Image, Text, Video, build, pack
from mmpos.schemes import SCHEMES, BlockGeometry, Scheme, get_scheme, register_scheme, resolve_options


def _random_samples(rng: random.Random, batch: int, videos: bool = True):
    """Samples of Text / Image / Video segments; every vision block is followed by text (the
    ``<vision_end>`` token of the Qwen prompts)."""
    samples = []
    for _ in range(batch):
        segs = [Text(rng.randint(1, 3))] if rng.random() < 0.8 else []
        for _ in range(rng.randint(1, 3)):
            h, w = 2 * rng.randint(1, 4), 2 * rng.randint(1, 4)
            t = rng.randint(1, 3) if videos and rng.random() < 0.5 else 1
            segs.append(Video((t, h, w)) if t > 1 or rng.random() < 0.3 else Image((1, h, w)))
            segs.append(Text(rng.randint(1, 4)))
        samples.append(segs)
    return samples


def _units(sample):
    """``("text", n)`` and ``("block", t, h, w)`` (merged by 2) of one sample."""
    out = []
    for seg in sample:
        if isinstance(seg, Text):
            out.append(("text", seg.n))
        else:
            t, h, w = seg.grid_thw
            out.append(("block", t, h // 2, w // 2))
    return out


def _frames(t, h, w):
    return [(f, i, j) for f in range(t) for i in range(h) for j in range(w)]


# ----------------------------------------------------------------------------- reference loops
def _reference_mrope_i(units, stride: int, reset: bool):
    """JJJYmmm ``get_mrope_interleave_index``: a unit starts at the previous chunk's max + 1;
    a block is ``(st + stride f, i, j)`` with spatial reset (then its ``<vision_end>`` gets
    ``st + max(stride (T-1), H-1, W-1) + 1``), else ``(st + stride f, st + i, st + j)``."""
    pos, last_max, pending_end = [], -1, None
    for unit in units:
        if unit[0] == "text":
            for _ in range(unit[1]):
                p = pending_end if pending_end is not None else last_max + 1
                pending_end = None
                pos.append([p, p, p])
                last_max = max(last_max, p)
            continue
        _, t, h, w = unit
        st = last_max + 1
        raw = [(f * stride, i, j) for f, i, j in _frames(t, h, w)]
        for a, b, c in raw:
            pos.append([a + st, b, c] if reset else [a + st, b + st, c + st])
        top = max(max(r) for r in raw)
        if reset:
            pending_end = st + top + 1  # the token after the block is <vision_end>
        last_max = max(last_max, st + top)
    return pos


def _reference_hope(units, scale: float):
    """HoPE: ``t = st + s f``, ``h = i - (H-1)//2 + t``, ``w = j - (W-1)//2 + t``; the next
    unit starts at the max of the t row + 1."""
    pos, t_max = [], -1.0
    for unit in units:
        if unit[0] == "text":
            for _ in range(unit[1]):
                p = t_max + 1
                pos.append([p, p, p])
                t_max = p
            continue
        _, t, h, w = unit
        st = t_max + 1
        for f, i, j in _frames(t, h, w):
            tt = st + f * scale
            pos.append([tt, i - (h - 1) // 2 + tt, j - (w - 1) // 2 + tt])
            t_max = max(t_max, tt)
    return pos


def _reference_vrope(units):
    """VRoPE: four combinations of ``(i, j)``, frame ``f`` shifted by ``f (H + W - 1)``; the text
    after a video continues at ``st + T (H + W - 1)``; the video's smallest position is text + 1."""
    pos, nxt = [], 0
    for unit in units:
        if unit[0] == "text":
            for _ in range(unit[1]):
                pos.append([nxt] * 4)
                nxt += 1
            continue
        _, t, h, w = unit
        for f, i, j in _frames(t, h, w):
            base = nxt + f * (h + w - 1)
            pos.append([base + i + j, base + i + (w - 1 - j), base + (h - 1 - i) + j, base + (h - 1 - i) + (w - 1 - j)])
        nxt += t * (h + w - 1)
    return pos


def _reference_v2pe(units, delta: float):
    """V2PE: text at ``last + 1, ...``; visual token ``k`` at ``last + k delta`` (``k = 1..N``);
    then ``last = ceil(last visual)``."""
    pos, last = [], -1.0
    for unit in units:
        if unit[0] == "text":
            for _ in range(unit[1]):
                last += 1
                pos.append([last])
            continue
        _, t, h, w = unit
        n = t * h * w
        visual = [last + k * delta for k in range(1, n + 1)]
        pos.extend([v] for v in visual)
        last = float(math.ceil(visual[-1]))
    return pos


def _split_frames(units):
    """A video of ``t`` frames as ``t`` one-frame blocks (the references' ``repeat_interleave`` of the grids)."""
    return [u for unit in units for u in ([unit] if unit[0] == "text" else [("block", 1, *unit[2:])] * unit[1])]


def _reference_omnirope(units):
    """JJJYmmm ``get_omnirope_index`` (= ``get_ilrope_index``): frames split; text at ``shift, shift + 1, ...``
    (then ``shift`` = last + 1); a block ``(shift, i, j)`` (spatial reset); then ``shift += max(1, H, W)``."""
    pos, shift = [], 0
    for unit in _split_frames(units):
        if unit[0] == "text":
            pos.extend([shift + k] * 3 for k in range(unit[1]))
            shift += unit[1]
            continue
        _, _, h, w = unit
        pos.extend([shift, i, j] for _, i, j in _frames(1, h, w))
        shift += max(1, h, w)
    return pos


def _reference_mmrope(units):
    """JJJYmmm ``get_mmrope_index`` at ``position_scale = (1, 1, 1)``: frames split; every unit starts at the
    previous unit's max + 1; a block at ``(st, st + i, st + j)``."""
    pos, st = [], 0
    for unit in _split_frames(units):
        if unit[0] == "text":
            pos.extend([st + k] * 3 for k in range(unit[1]))
            st += unit[1]
            continue
        _, _, h, w = unit
        pos.extend([st, st + i, st + j] for _, i, j in _frames(1, h, w))
        st += max(h, w)  # the block's max is st + max(h - 1, w - 1)
    return pos


REFERENCES = {
    "mrope-i": (lambda u: _reference_mrope_i(u, 1, True), {}),
    "mrope-i@3": (lambda u: _reference_mrope_i(u, 3, True), {"temporal_scale": 3}),
    "mhrope": (lambda u: _reference_mrope_i(u, 1, True), {}),  # the paper's code runs MHRoPE with spatial_reset=True
    "mhrope@2": (lambda u: _reference_mrope_i(u, 2, True), {"temporal_scale": 2}),
    "mhrope-qwen2-vl": (lambda u: _reference_mrope_i(u, 1, False), {}),
    "hope": (lambda u: _reference_hope(u, 0.75), {"temporal_scale": 0.75}),
    "hope@1.5": (lambda u: _reference_hope(u, 1.5), {"temporal_scale": 1.5}),
    # VideoRoPE (JJJYmmm/Multimodal-RoPEs pos_design/videorope.py): t = start + s f, h = i - (H-1)//2 + t,
    # w = j - (W-1)//2 + t, text after at the last t + 1 -- the loop of the HoPE reference with one spacing s
    "videorope": (lambda u: _reference_hope(u, 2.0), {}),
    "videorope@0.5": (lambda u: _reference_hope(u, 0.5), {"temporal_scale": 0.5}),
    "vrope": (_reference_vrope, {}),
    "ilrope": (_reference_omnirope, {}),
    "omnirope": (_reference_omnirope, {}),
    "mmrope": (_reference_mmrope, {}),
    # GRAPE's positions are JJJYmmm get_mrope_index: the get_mmrope_index loop at position_scale (1, 1, 1)
    "grape": (_reference_mmrope, {}),
    "grape-i": (_reference_mmrope, {}),
    "v2pe": (lambda u: _reference_v2pe(u, 1 / 16), {"delta": 1 / 16}),
    "v2pe@0.5": (lambda u: _reference_v2pe(u, 0.5), {"delta": 0.5}),
}


@pytest.mark.parametrize("case", list(REFERENCES))
@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_positions_equal_the_reference_rule(case, padding_side):
    scheme = case.split("@")[0]
    reference, options = REFERENCES[case]
    rng = random.Random(case + padding_side)
    for _ in range(6):
        samples = _random_samples(rng, rng.randint(1, 3))
        lay = build(samples, scheme, padding_side=padding_side, **options)
        real = lay.coords.mask
        for b, sample in enumerate(samples):
            expected = torch.tensor(reference(_units(sample)), dtype=torch.float64)  # (n, A)
            got = lay.coords.pos[b][real[b]].double()
            assert got.shape == expected.shape and torch.equal(got, expected), (case, sample)


# ----------------------------------------------------------------------------- angles
def _inv_freq(pairs: int, theta: float = 10000.0):
    return torch.tensor([theta ** (-p / pairs) for p in range(pairs)], dtype=torch.float64)


def _mrope_i_axis(p: int, section) -> int:
    """Qwen3-VL interleave: pairs ``1, 4, 7, ... < 3 s_h`` read h, ``2, 5, ... < 3 s_w`` read w, the rest t."""
    if p % 3 == 1 and p < 3 * section[1]:
        return 1
    if p % 3 == 2 and p < 3 * section[2]:
        return 2
    return 0


@pytest.mark.parametrize("scheme", ["mrope-i", "mhrope", "vrope", "hope", "v2pe", "ilrope", "omnirope", "mmrope"])
def test_angles_equal_the_reference_allocation(scheme):
    """Angles per pair (and per KV head for MHRoPE) from the reference positions and the
    reference frequency allocation, against the scheme's encoder on the layout."""
    rng = random.Random(scheme)
    samples = _random_samples(rng, 2)
    reference, options = REFERENCES[scheme]
    lay = build(samples, scheme, **options)
    head_dim, pairs = 32, 16
    inv = _inv_freq(pairs)
    kw = {"num_heads": 8, "num_kv_heads": 4, "head_sections": [1, 1, 1]} if scheme == "mhrope" else {}
    enc = create(get_scheme(scheme).encoder, head_dim=head_dim, **kw)
    got = enc.angles(lay.coords).double()
    real = lay.coords.mask
    for b, sample in enumerate(samples):
        pos = torch.tensor(reference(_units(sample)), dtype=torch.float64)  # (n, A)
        n = pos.shape[0]
        if scheme in ("mrope-i", "ilrope"):  # default interleaved section for 16 pairs
            section = (6, 5, 5)
            expected = torch.stack([pos[:, _mrope_i_axis(p, section)] * inv[p] for p in range(pairs)], -1)
        elif scheme == "mhrope":  # KV head j reads axis j (t, h, w), the fourth head is not rotated
            expected = torch.stack([pos[:, j, None] * inv if j < 3 else torch.zeros(n, pairs) for j in range(4)])
        elif scheme == "vrope":
            expected = torch.stack([pos[:, p % 4] * inv[p] for p in range(pairs)], -1)
        elif scheme == "omnirope":  # chunked default (4, 6, 6): TTTT HHHHHH WWWWWW
            expected = torch.stack([pos[:, 0 if p < 4 else 1 if p < 10 else 2] * inv[p] for p in range(pairs)], -1)
        elif scheme == "mmrope":  # meta components of 8 pairs: T T H W H W H W
            expected = torch.stack([pos[:, (0, 0, 1, 2, 1, 2, 1, 2)[p % 8]] * inv[p] for p in range(pairs)], -1)
        elif scheme == "hope":  # section (4, 6, 6): 12 spatial pairs h, w, h, w, ..., then 4 NoPE pairs
            expected = torch.stack([pos[:, 1 + p % 2] * inv[p] if p < 12 else torch.zeros(n) for p in range(pairs)], -1)
        else:
            expected = pos[:, :1] * inv
        sel = got[b][..., real[b], :] if scheme == "mhrope" else got[b][real[b]]
        torch.testing.assert_close(sel, expected, rtol=1e-6, atol=1e-4)


# ----------------------------------------------------------------------------- registry
def test_every_scheme_declares_what_the_paths_need():
    for name, sch in SCHEMES.items():
        assert sch.name == name and sch.axes and sch.encoder and sch.paper
        # the reference implementation: "owner/repo path/to/file.py (function)"
        assert re.fullmatch(r"[\w.-]+/[\w.-]+ [\w./-]+\.py \(.+\)", sch.reference), (name, sch.reference)
        rows, back = torch.tensor(sch.hf_rows, dtype=torch.float64), torch.tensor(sch.rows_to_axes, dtype=torch.float64)
        assert rows.shape == (3, len(sch.axes)) and back.shape == (len(sch.axes), 3)


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_hf_rows_unpack_to_the_axes(scheme):
    """``rows_to_axes`` inverts ``hf_rows`` on every position the scheme produces."""
    options = {"hope": {"temporal_scale": 0.75}, "v2pe": {"delta": 0.25}}.get(scheme, {})
    lay = build(_random_samples(random.Random(0), 3), scheme, **options)
    sch = get_scheme(scheme)
    rows = lay.hf_position_ids().double()[:, lay.coords.mask]  # (3, n)
    axes = torch.tensor(sch.rows_to_axes, dtype=torch.float64) @ rows  # (A, n)
    assert torch.equal(axes, lay.coords.pos[lay.coords.mask].double().T)


def test_training_draws_take_the_generator_on_both_paths():
    """V2PE's delta and HoPE's scale are drawn from the caller's generator, by layout.build and
    by the token-id path alike (same draws for the same seed)."""
    pytest.importorskip("transformers")
    from mmpos.integrations.hf_rope_index import RopeIndexOptions, token_layout

    samples = [[Text(2), Image((1, 4, 4)), Text(1), Video((2, 4, 4)), Text(1)]] * 3
    ids = []
    for sample in samples:
        for seg in sample:
            ids += (
                [5] * seg.n
                if isinstance(seg, Text)
                else [9 if isinstance(seg, Image) else 10] * (seg.grid_thw[0] * seg.grid_thw[1] * seg.grid_thw[2] // 4)
            )
    input_ids = torch.tensor(ids).view(3, -1)
    for scheme in ("v2pe", "hope"):
        lay = build(samples, scheme, training=True, generator=torch.Generator().manual_seed(7))
        options = RopeIndexOptions(scheme, "qwen2-vl", 2, 9, 10, 2.0, training=True)
        tok = token_layout(
            options,
            input_ids,
            torch.tensor([[1, 4, 4]] * 3),
            torch.tensor([[2, 4, 4]] * 3),
            generator=torch.Generator().manual_seed(7),
        )
        assert torch.equal(tok.position_ids, lay.position_ids) and torch.equal(tok.rope_deltas, lay.rope_deltas)
        other = build(samples, scheme, training=True, generator=torch.Generator().manual_seed(8))
        assert not torch.equal(other.position_ids, lay.position_ids)


def test_a_new_scheme_is_one_registry_entry():
    """Registering a scheme makes it available to layout.build (and so to every path)."""

    def reverse_block(g: BlockGeometry, options):  # a block's tokens in reverse order
        return (g.tokens[g.block].double() - 1 - g.local).unsqueeze(0), g.tokens.double(), torch.ones(1).double()

    cited = {"paper": "test", "reference": "owner/repo tests/test_schemes.py (reverse_block)"}
    sch = Scheme("reverse-test", ("seq",), "rope", reverse_block, ((1,), (1,), (1,)), ((1, 0, 0),), **cited)
    register_scheme(sch)
    try:
        lay = build([[Text(2), Image((1, 4, 4)), Text(1)]], "reverse-test")
        assert lay.position_ids[0, 0].tolist() == [0, 1, 5, 4, 3, 2, 6]
        with pytest.raises(ValueError, match="already registered"):
            register_scheme(replace(sch))
    finally:
        SCHEMES.pop("reverse-test")


@pytest.mark.parametrize(
    ("cited", "match"),
    [
        ({"reference": "owner/repo pkg/rule.py (index)"}, r"scheme 'uncited': paper must name the paper .*got ''"),
        ({"paper": "  ", "reference": "owner/repo pkg/rule.py (index)"}, "paper must name the paper"),
        ({"paper": "Someone 2025"}, r"reference must name .* as 'owner/repo path/to/file.py \(function\)', got ''"),
        ({"paper": "Someone 2025", "reference": "owner/repo pkg/rule.py"}, "reference must name"),
        ({"paper": "Someone 2025", "reference": "pkg/rule.py (index)"}, "reference must name"),
    ],
)
def test_register_scheme_needs_paper_and_reference(cited, match):
    """register_scheme refuses a scheme that does not cite its paper and reference implementation (nothing added)."""
    sch = Scheme("uncited", ("seq",), "rope", lambda g, o: None, ((1,), (1,), (1,)), ((1, 0, 0),), **cited)
    with pytest.raises(ValueError, match=match):
        register_scheme(sch)
    assert "uncited" not in SCHEMES


def test_one_validator_for_every_path():
    with pytest.raises(ValueError, match="scheme must be one of"):
        resolve_options("qwen4-vl")
    with pytest.raises(ValueError, match="temporal stride"):
        resolve_options("mrope-i", temporal_scale=2.5)
    with pytest.raises(ValueError, match="rule must be one of"):
        resolve_options("qwen2-vl", rule="newest")
    with pytest.raises(TypeError, match="training must be a bool"):
        resolve_options("v2pe", training=1)
    with pytest.raises(ValueError, match="tokens_per_second"):
        resolve_options("qwen2.5-vl", tokens_per_second=math.inf)
    with pytest.raises(ValueError, match="hf_rows must be 3 rows"):
        Scheme("bad", ("seq",), "rope", None, ((1,), (1,)), ((1, 0, 0),))


def test_huge_seconds_give_a_clear_error_not_wrapped_ids():
    """Issue 10 (2) on the segment path: ids that int64 / float64 cannot hold are refused."""
    with pytest.raises(ValueError, match=r"2\*\*53"):
        build([[Text(1), Video((3, 4, 4), second_per_grid=1e300), Text(1)]], "qwen2.5-vl")


def test_pack_is_the_one_core():
    """``build`` is a front end of ``pack``: the same blocks give the same Layout."""
    from mmpos.layout import VisionBlocks

    lay = build([[Text(2), Image((1, 4, 6)), Text(1)]], "qwen2-vl")
    real = torch.ones(1, 9, dtype=torch.bool)
    blocks = VisionBlocks(torch.tensor([[1, 2, 3]]), torch.tensor([2]), torch.zeros(1), torch.tensor([True]))
    again = pack(real, blocks, "qwen2-vl", resolve_options("qwen2-vl"))
    assert torch.equal(again.position_ids, lay.position_ids) and torch.equal(again.rope_deltas, lay.rope_deltas)


def test_v2pe_block_span_form():
    """V2PE block-span form: a block of ``n`` tokens steps ``visual_stride / n`` (the reference's
    ``rope_pos_id_stride / num_image_token``), so every block spans ``visual_stride`` whatever its
    size; with 256-token blocks it is the per-token ``delta = stride / 256``."""
    # hand-worked: text 2 (0, 1); a 2 x 2 image (4 tokens) with stride 2: 1.5, 2, 2.5, 3; text at ceil(3) + 1 = 4;
    # a 1 x 2 image (2 tokens): 5, 6; text 7
    lay = build([[Text(2), Image((1, 4, 4)), Text(1), Image((1, 2, 4)), Text(1)]], "v2pe", visual_stride=2)
    assert lay.coords.pos[0, :, 0].tolist() == [0, 1, 1.5, 2, 2.5, 3, 4, 5, 6, 7]
    rng = random.Random("v2pe-span")
    for _ in range(6):
        samples = _random_samples(rng, rng.randint(1, 3))
        stride = rng.choice([1.0, 4.0, 16.0])
        lay = build(samples, "v2pe", visual_stride=stride, padding_side="left")
        for b, sample in enumerate(samples):
            expected, last = [], -1.0  # the reference's loop: visual token k of n at last + k * stride / n
            for unit in _units(sample):
                if unit[0] == "text":
                    expected += [last + 1 + k for k in range(unit[1])]
                    last += unit[1]
                    continue
                n = unit[1] * unit[2] * unit[3]
                expected += [last + k * stride / n for k in range(1, n + 1)]
                last = float(math.ceil(expected[-1]))
            got = lay.coords.pos[b][lay.coords.mask[b]][:, 0].double()
            assert torch.allclose(got, torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-12), sample
    same = build([[Text(1), Image((1, 32, 32)), Text(1)]], "v2pe", visual_stride=16)  # 256 tokens
    assert torch.equal(
        same.coords.pos, build([[Text(1), Image((1, 32, 32)), Text(1)]], "v2pe", delta=1 / 16).coords.pos
    )
    with pytest.raises(ValueError, match="visual_stride .* excludes delta"):
        resolve_options("v2pe", delta=0.5, visual_stride=2)
    with pytest.raises(ValueError, match="visual_stride must be a finite number > 0"):
        resolve_options("v2pe", visual_stride=0)
    with pytest.raises(ValueError, match="visual_stride applies only to schemes"):
        resolve_options("qwen2-vl", visual_stride=2)


def test_videorope_hand_worked_and_options():
    """VideoRoPE's diagonal layout on a 2-frame 2 x 3 video after 2 text tokens (spacing 2, the
    reference default): t = 2, 4; h = i + t; w = j - 1 + t; the text after at 4 + 1."""
    lay = build([[Text(2), Video((2, 4, 6)), Text(1)]], "videorope")
    assert lay.position_ids[:, 0].tolist() == [
        [0, 1, 2, 2, 2, 2, 2, 2, 4, 4, 4, 4, 4, 4, 5],
        [0, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4, 5, 5, 5, 5],
        [0, 1, 1, 2, 3, 1, 2, 3, 3, 4, 5, 3, 4, 5, 5],
    ]
    assert lay.rope_deltas.tolist() == [[5 + 1 - 15]] and lay.position_ids.dtype == torch.float32
    with pytest.raises(ValueError, match="temporal spacing"):
        resolve_options("videorope", temporal_scale=0)


def test_ilrope_omnirope_mmrope_hand_worked():
    """Text 2, an image of 2 x 3 merged tokens, text 2, a 2-frame video of 2 x 2, text 1 (worked by hand from
    the reference loops of JJJYmmm ``pos_design/omnirope.py`` and ``mmrope.py``)."""
    sample = [[Text(2), Image((1, 4, 6)), Text(2), Video((2, 4, 4)), Text(1)]]
    reset = [
        [0, 1, 2, 2, 2, 2, 2, 2, 5, 6, 7, 7, 7, 7, 9, 9, 9, 9, 11],
        [0, 1, 0, 0, 0, 1, 1, 1, 5, 6, 0, 0, 1, 1, 0, 0, 1, 1, 11],
        [0, 1, 0, 1, 2, 0, 1, 2, 5, 6, 0, 1, 0, 1, 0, 1, 0, 1, 11],
    ]
    mm = [
        [0, 1, 2, 2, 2, 2, 2, 2, 5, 6, 7, 7, 7, 7, 9, 9, 9, 9, 11],
        [0, 1, 2, 2, 2, 3, 3, 3, 5, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11],
        [0, 1, 2, 3, 4, 2, 3, 4, 5, 6, 7, 8, 7, 8, 9, 10, 9, 10, 11],
    ]
    for scheme, expected in (("ilrope", reset), ("omnirope", reset), ("mmrope", mm)):
        lay = build(sample, scheme)
        assert lay.hf_position_ids("3d")[:, 0].tolist() == expected, scheme
        assert lay.rope_deltas.tolist() == [[12 - 19]], scheme  # max + 1 - length, as the references
    # ILRoPE rotates with the interleaved allocation, OmniRoPE with the chunked one
    assert (get_scheme("ilrope").encoder, get_scheme("omnirope").encoder) == ("mrope-i", "mrope")


def test_mmrope_allocation_gives_every_axis_the_whole_spectrum():
    """2:3:3 per meta component of 8 pairs; each axis reads pairs from the highest to the lowest frequencies."""
    enc = create("mmrope", head_dim=128)
    reads = (enc.weight != 0).double()  # (axes, pairs) for t, h, w
    assert reads.sum(-1).tolist() == [16.0, 24.0, 24.0]  # 64 pairs: 8 meta components of T T H W H W H W
    for a in range(3):
        idx = reads[a].nonzero().flatten()
        assert int(idx.min()) < 8 and int(idx.max()) >= 56  # high and low frequencies on every axis
    with pytest.raises(ValueError, match="mrope_section"):
        create("mmrope", head_dim=128, mrope_section=[16, 24, 24])  # the pattern fixes the sections


# ----------------------------------------------------------------------------- CircleRoPE
def _reference_circlerope(
    units,
    radius=10.0,
    alpha=0.5,
    move_to_origin=True,
    move_to_positive=False,
    dff_rate=0.0,
    method="circle",
    stride=1.0,
):
    """A token-by-token transcription of lose4578/CircleRoPE ``get_circle_rope_index`` (with
    JJJYmmm/Multimodal-RoPEs' rings per frame): the block's ``(w, h, t * stride)`` grid, centred per
    axis by ``(max + min) / 2``; ``radius="auto-K"`` is ``K * |max coordinate|``; frame 0 on the
    circle (``atan2`` angle rescaled to ``[0, 2 pi]`` by its min and max, mixed with the raster-index
    angle by ``alpha``), rotated into the plane orthogonal to ``(1, 1, 1)`` with the basis
    ``u = (-n1, n0, 0) / |.|``, ``v = n x u / |.|`` of ``n = (1, 1, 1) / sqrt 3``; frame ``f`` adds
    ``f * stride``; every unit starts at the previous unit's max + 1."""
    n = [1 / math.sqrt(3)] * 3
    u = [-n[1], n[0], 0.0]
    u = [c / math.hypot(*u) for c in u]
    v = [n[1] * u[2] - n[2] * u[1], n[2] * u[0] - n[0] * u[2], n[0] * u[1] - n[1] * u[0]]
    v = [c / math.sqrt(sum(x * x for x in v)) for c in v]
    pos, st = [], 0.0
    for unit in units:
        if unit[0] == "text":
            pos.extend([st + k] * 3 for k in range(unit[1]))
            st += unit[1]
            continue
        _, t, h, w = unit
        grid = [[float(j), float(i), f * stride] for f, i, j in _frames(t, h, w)]  # (x, y, z) = (w, h, t)
        if move_to_origin:
            for a in range(3):
                centre = (max(p[a] for p in grid) + min(p[a] for p in grid)) / 2
                for p in grid:
                    p[a] -= centre
        frame0 = grid[: h * w]
        if method == "circle":
            r = radius
            if isinstance(radius, str):
                r = abs(max(c for p in grid for c in p)) * (1.0 if radius == "auto" else float(radius[5:]))
            theta = [math.atan2(y, x) for x, y, _ in frame0]
            lo, hi = min(theta), max(theta)
            norm = [(a - lo) / (hi - lo) * 2 * math.pi if hi - lo > 0 else a for a in theta]
            angles = [alpha * a + (1 - alpha) * (k / (h * w) * 2 * math.pi) for k, a in enumerate(norm)]
            plane = [(r * math.cos(a), r * math.sin(a)) for a in angles]
        else:
            plane = [(x, y) for x, y, _ in frame0]
        if dff_rate:
            plane = [
                ((1 - dff_rate) * cx + dff_rate * x, (1 - dff_rate) * cy + dff_rate * y)
                for (cx, cy), (x, y, _) in zip(plane, frame0)
            ]
        ring = [[cx * u[a] + cy * v[a] for a in range(3)] for cx, cy in plane]  # (w, h, t) components
        if move_to_positive is not False:
            shift = abs(min(c for p in ring for c in p)) + (0.0 if move_to_positive == "auto" else move_to_positive)
            ring = [[c + shift for c in p] for p in ring]
        block = [[st + c + f * stride for c in reversed(ring[k])] for f in range(t) for k in range(h * w)]  # t, h, w
        pos.extend(block)
        st = max(c for p in block for c in p) + 1
    return pos


CIRCLE_CASES = {
    "defaults": {},
    "auto": {"radius": "auto"},
    "auto-2-alpha0": {"radius": "auto-2", "alpha": 0.0, "temporal_scale": 2.0},
    "alpha1-positive": {"alpha": 1.0, "move_to_positive": "auto", "radius": 3.5},
    "offset-dff": {"move_to_positive": 1.5, "dff_rate": 0.25, "move_to_origin": False},
    "no-circle": {"method": "no_circle", "temporal_scale": 0.5},
}


@pytest.mark.parametrize("case", list(CIRCLE_CASES))
@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_circlerope_equals_the_transcribed_reference_loop(case, padding_side):
    options = CIRCLE_CASES[case]
    ref = {"stride" if k == "temporal_scale" else k: v for k, v in options.items()}
    rng = random.Random(case + padding_side)
    for _ in range(4):
        samples = _random_samples(rng, rng.randint(1, 3))
        lay = build(samples, "circlerope", padding_side=padding_side, **options)
        real = lay.coords.mask
        for b, sample in enumerate(samples):
            expected = torch.tensor(_reference_circlerope(_units(sample), **ref), dtype=torch.float64)
            got = lay.coords.pos[b][real[b]].double()
            assert got.shape == expected.shape
            torch.testing.assert_close(got, expected, rtol=0, atol=2e-5)  # float32 positions
            ids = lay.position_ids[:, b][:, lay.attention_mask[b].bool()].double()
            torch.testing.assert_close(ids, expected.T, rtol=0, atol=2e-5)
            last = float(expected.max()) + 1 - lay.position_ids.shape[-1]  # max + 1 - padded length
            assert lay.rope_deltas[b, 0].item() == pytest.approx(last, abs=2e-5)


def test_circlerope_hand_worked_and_the_cone():
    """A 1 x 2 token image after 2 text tokens (start s = 2), radius 10, alpha 0.5: x = -1/2, 1/2, y = 0;
    atan2 angles pi, 0 rescale to 2 pi, 0; index angles 0, pi; mixed: pi, pi/2. So (cx, cy) = (-10, 0),
    (0, 10), and (t, h, w) = s + (2 cy / sqrt 6, cx / sqrt 2 - cy / sqrt 6, -cx / sqrt 2 - cy / sqrt 6)."""
    lay = build([[Text(2), Image((1, 2, 4)), Text(1)]], "circlerope")
    r2, r6 = 10 / math.sqrt(2), 10 / math.sqrt(6)
    expected = [
        [0, 1, 2, 2 + 2 * r6, 3 + 2 * r6],
        [0, 1, 2 - r2, 2 - r6, 3 + 2 * r6],
        [0, 1, 2 + r2, 2 - r6, 3 + 2 * r6],
    ]
    torch.testing.assert_close(lay.position_ids[:, 0].double(), torch.tensor(expected, dtype=torch.float64))
    assert lay.position_ids.dtype == torch.float32 and lay.rope_deltas.dtype == torch.float32
    # the cone: every vision token of a block lies in the plane t + h + w = 3 s at distance r from (s, s, s)
    rng = random.Random(3)
    samples = _random_samples(rng, 3)
    for radius in (10.0, 2.5):
        lay = build(samples, "circlerope", radius=radius)
        pos, vision = lay.coords.pos.double(), lay.modality != 0
        for b, sample in enumerate(samples):
            start = 0.0
            k = 0
            for unit in _units(sample):
                if unit[0] == "text":
                    start = float(pos[b, k + unit[1] - 1, 0]) + 1
                    k += unit[1]
                    continue
                _, t, h, w = unit
                ring = pos[b, k : k + h * w] - start  # frame 0
                assert bool(vision[b, k : k + h * w].all())
                torch.testing.assert_close(ring.sum(-1), torch.zeros(h * w, dtype=torch.float64), atol=1e-4, rtol=0)
                torch.testing.assert_close(
                    ring.norm(dim=-1), torch.full((h * w,), radius, dtype=torch.float64), atol=1e-4, rtol=0
                )
                start = float(pos[b, k : k + t * h * w].max()) + 1
                k += t * h * w


def test_circlerope_options_are_checked_on_every_path():
    sample = [[Text(1), Image((1, 4, 4)), Text(1)]]
    for bad, match in (
        ({"radius": 0}, "radius must be"),
        ({"radius": "auto-x"}, "auto-K"),
        ({"radius": "big"}, "radius must be"),
        ({"alpha": 1.5}, "alpha must be"),
        ({"dff_rate": True}, "dff_rate must be"),
        ({"move_to_positive": "up"}, "move_to_positive must be"),
        ({"method": "sphere"}, "method must be one of"),
        ({"temporal_scale": 0}, "temporal_scale"),
    ):
        with pytest.raises(ValueError, match=match):
            build(sample, "circlerope", **bad)
        with pytest.raises(ValueError, match=match):
            resolve_options("circlerope", **bad)
    with pytest.raises(TypeError, match=r"move_to_origin \(scheme=.circlerope.\) must be a bool"):
        build(sample, "circlerope", move_to_origin=1)
    with pytest.raises(ValueError, match=r"radius applies only to schemes \['circlerope'\]"):
        build(sample, "qwen2-vl", radius=4.0)
    with pytest.raises(TypeError, match="unknown scheme option 'radious'"):
        build(sample, "circlerope", radious=4.0)
    o = resolve_options("circlerope")
    assert dict(o.extra) == {
        "radius": 10.0,
        "radius_scale": None,
        "alpha": 0.5,
        "move_to_origin": True,
        "move_to_positive": False,
        "dff_rate": 0.0,
        "method": "circle",
    }  # lose4578/CircleRoPE code/config.json
    assert (
        o.temporal_scale == 1.0 and resolve_options("circlerope", move_to_positive=0).extra["move_to_positive"] is False
    )


def test_from_host_geometry_builds_the_same_tensors():
    """The packer's geometry without draws (per-block tensors built on first read) equals ``BlockGeometry.of``."""
    import numpy as np

    grid = np.array([[1, 2, 3], [2, 4, 1], [3, 1, 2]])
    seconds = np.array([0.0, 0.5, 2.0], dtype=np.float32)
    is_image = np.array([True, False, False])
    lazy = BlockGeometry.from_host(grid, seconds, is_image, 0.25, 3.0)
    assert lazy.row_block.tolist() == [0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2]  # rows need no tensor field
    assert "_defer" in lazy.__dict__
    full = torch.full((3,), 0.25, dtype=torch.float64), torch.full((3,), 3.0, dtype=torch.float64)
    eager = BlockGeometry.of(grid, torch.from_numpy(seconds), torch.from_numpy(is_image), *full)
    for name in ("scale", "t", "h", "w", "tokens", "seconds", "is_image", "delta", "ti", "hi", "wi", "local"):
        a, b = getattr(lazy, name), getattr(eager, name)
        assert a.dtype == b.dtype and torch.equal(a, b), name
    assert "_defer" not in lazy.__dict__ and lazy.audio is None and lazy.start is None
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = lazy.nope


def _merged_order(n_v, n_a, marks, v_key, a_key):
    """Each token's output index by an explicit sort per block: the start marker, then video and audio tokens by key
    (video first on ties, then in index order), then the end marker."""
    v_at, a_at, starts, ends = [], [], [], []
    at = v0 = a0 = 0
    for k in range(len(n_v)):
        tokens = [(float(v_key[v0 + i]), 0, i) for i in range(n_v[k])] + [
            (float(a_key[a0 + i]), 1, i) for i in range(n_a[k])
        ]
        if marks[k]:
            starts.append(at)
            at += 1
        place = {}
        for key, kind, i in sorted(tokens):
            place[kind, i] = at
            at += 1
        v_at += [place[0, i] for i in range(n_v[k])]
        a_at += [place[1, i] for i in range(n_a[k])]
        if marks[k]:
            ends.append(at)
            at += 1
        v0, a0 = v0 + n_v[k], a0 + n_a[k]
    return v_at, a_at, starts, ends


def test_merge_by_time_equals_a_sort_per_block():
    """TMRoPE's merge of a block's video and audio tokens by key (video keys repeating along a frame, ties between
    the kinds, blocks without one kind, markers) equals an explicit sort of every block's tokens."""
    import numpy as np

    from mmpos import schemes

    rng = np.random.default_rng(3)
    for _ in range(300):
        k = int(rng.integers(1, 5))
        n_v, n_a = rng.integers(0, 12, k), rng.integers(0, 9, k)
        marks = rng.integers(0, 2, k) * (n_a > 0)
        frame = rng.integers(1, 4)  # video tokens per key
        v_key = np.concatenate([np.sort(rng.integers(0, 6, n))[np.arange(n) // frame * frame] for n in n_v])
        a_key = np.concatenate([np.sort(rng.integers(0, 6, n) / 2.0) for n in n_a])
        got = schemes._merge_by_time(n_v, n_a, marks, v_key.astype(np.float64), a_key.astype(np.float64))
        want = _merged_order(n_v, n_a, marks, v_key, a_key)
        assert got is not None
        for g, w in zip(got, want):
            assert g.tolist() == w


def test_extent_rule_needs_reads_start():
    """``Scheme.extent`` serves a rule that reads its block starts: given without ``reads_start``, or not a function,
    the scheme is refused when made."""
    own = SCHEMES["qwen3-omni"]
    with pytest.raises(ValueError, match="extent must be a function, given with reads_start=True"):
        replace(own, reads_start=False)
    with pytest.raises(ValueError, match="extent must be a function"):
        replace(own, extent=3.0)
    assert replace(own, extent=None).extent is None  # the block rule alone settles the starts
