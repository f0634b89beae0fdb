"""Tests for :mod:`mmpos.layout`: every scheme's rules on hand-worked examples."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mmpos import Coords, Modality
from mmpos.layout import Image, Layout, Text, Video, VisionBlocks, build, decode_position_ids, pack
from mmpos.schemes import HOPE_SCALES, SCHEMES, V2PE_DELTAS, resolve_options

EVAL_OPTIONS = {"v2pe": {"delta": 0.25}, "hope": {"temporal_scale": 0.75}}


def _build(samples, scheme, **kw):
    return build(samples, scheme, **{**EVAL_OPTIONS.get(scheme, {}), **kw})


def _rows(lay: Layout, b: int = 0) -> list[list]:
    return lay.position_ids[:, b].tolist()


# ----------------------------------------------------------------------------- qwen2-vl
def test_worked_example_qwen2_vl():
    lay = build([[Text(3), Image((1, 4, 6)), Text(1)]], "qwen2-vl")
    assert _rows(lay) == [
        [0, 1, 2, 3, 3, 3, 3, 3, 3, 6],
        [0, 1, 2, 3, 3, 3, 4, 4, 4, 6],
        [0, 1, 2, 3, 4, 5, 3, 4, 5, 6],
    ]
    assert lay.rope_deltas.tolist() == [[7 - 10]]  # next position 7, L = 10
    assert lay.position_ids.dtype == torch.long and lay.rope_deltas.dtype == torch.long
    assert lay.modality[0].tolist() == [0, 0, 0] + [int(Modality.IMAGE)] * 6 + [0]
    assert lay.attention_mask.tolist() == [[1] * 10]
    assert isinstance(lay.coords, Coords) and lay.coords.axes == ("t", "h", "w")
    assert torch.equal(lay.coords.pos[0].T, lay.position_ids[:, 0].float())


def test_qwen2_vl_video_advances_by_max_over_axes():
    # video (3, 2, 4) -> 3 x 1 x 2 tokens; t reaches start + 2, so the text continues at start + 3
    lay = build([[Text(2), Video((3, 2, 4)), Text(1)]], "qwen2-vl")
    assert _rows(lay) == [
        [0, 1, 2, 2, 3, 3, 4, 4, 5],
        [0, 1, 2, 2, 2, 2, 2, 2, 5],
        [0, 1, 2, 3, 2, 3, 2, 3, 5],
    ]
    assert lay.modality[0, 2:8].eq(int(Modality.VIDEO)).all()


def test_mhrope_takes_spatial_reset_and_keeps_qwen2_vl_positions_as_an_option():
    """``mhrope``: the positions of the MHRoPE paper's code (spatial reset, as ``mrope-i``);
    ``mhrope-qwen2-vl``: Qwen2-VL's."""
    sample = [[Text(2), Image((1, 6, 4)), Text(3), Video((2, 2, 2)), Text(1)], [Video((1, 4, 4))]]
    a, b = build(sample, "qwen2-vl"), build(sample, "mhrope-qwen2-vl")
    assert torch.equal(a.position_ids, b.position_ids) and torch.equal(a.rope_deltas, b.rope_deltas)
    c, d = build(sample, "mrope-i", temporal_scale=2), build(sample, "mhrope", temporal_scale=2)
    assert torch.equal(c.position_ids, d.position_ids) and torch.equal(c.rope_deltas, d.rope_deltas)
    assert d.coords.axes == ("t", "h", "w") and SCHEMES["mhrope"].encoder == SCHEMES["mhrope-qwen2-vl"].encoder
    # the image block at start 2 (2 x 3 tokens after the merge): h, w from 0 (reset), t at the start
    assert d.position_ids[:, 0, 2:8].tolist() == [[2] * 6, [0, 0, 1, 1, 2, 2], [0, 1, 0, 1, 0, 1]]


# ----------------------------------------------------------------------------- qwen2.5-vl
def test_qwen25_vl_time_multiply_then_floor():
    # 0.75 s per temporal patch at 2 tokens/s: t offsets floor(0), floor(1.5), floor(3.0) = 0, 1, 3
    lay = build([[Text(1), Video((3, 2, 2), second_per_grid=0.75), Text(1)]], "qwen2.5-vl")
    assert _rows(lay) == [[0, 1, 2, 4, 5], [0, 1, 1, 1, 5], [0, 1, 1, 1, 5]]
    # default second_per_grid is 1 s: offsets 0, 2, 4; tokens_per_second changes the scale
    lay = build([[Video((3, 2, 2)), Text(1)]], "qwen2.5-vl", tokens_per_second=1)
    assert _rows(lay)[0] == [0, 1, 2, 3]


def test_qwen25_vl_images_get_no_time_scaling():
    lay = build([[Text(1), Image((2, 2, 2)), Text(1)]], "qwen2.5-vl")
    assert _rows(lay) == [[0, 1, 1, 2], [0, 1, 1, 2], [0, 1, 1, 2]]
    assert _rows(build([[Text(1), Image((2, 2, 2)), Text(1)]], "qwen2-vl"))[0] == [0, 1, 2, 3]


# ----------------------------------------------------------------------------- qwen3-vl
def test_qwen3_vl_videos_become_frames():
    # video (2, 4, 4) -> two frames of 2 x 2 tokens, t = 1 each; each frame advances by max(h, w) = 2
    lay = build([[Text(1), Video((2, 4, 4)), Text(1)]], "qwen3-vl")
    assert _rows(lay) == [
        [0, 1, 1, 1, 1, 3, 3, 3, 3, 5],
        [0, 1, 1, 2, 2, 3, 3, 4, 4, 5],
        [0, 1, 2, 1, 2, 3, 4, 3, 4, 5],
    ]
    # timestamps written as text between one-frame videos
    framed = build([[Text(1), Text(2), Video((1, 4, 4)), Text(2), Video((1, 4, 4))]], "qwen3-vl")
    assert _rows(framed)[0] == [0, 1, 2, 3, 3, 3, 3, 5, 6, 7, 7, 7, 7]


# ----------------------------------------------------------------------------- mrope-i
def test_mrope_i_spatial_reset():
    # video (2, 4, 6) -> 2 x 2 x 3: t = start + f, h and w from 0, next at start + max(1, 1, 2) + 1
    lay = build([[Text(2), Video((2, 4, 6)), Text(1)]], "mrope-i")
    assert _rows(lay) == [
        [0, 1] + [2] * 6 + [3] * 6 + [5],
        [0, 1] + [0, 0, 0, 1, 1, 1] * 2 + [5],
        [0, 1] + [0, 1, 2] * 4 + [5],
    ]
    strided = build([[Text(2), Video((2, 4, 6)), Text(1)]], "mrope-i", temporal_scale=3)
    assert _rows(strided)[0] == [0, 1] + [2] * 6 + [5] * 6 + [6]  # next at 2 + max(3, 1, 2) + 1


# ----------------------------------------------------------------------------- hope
def test_hope_centred_and_shifted_by_scaled_time():
    # video (2, 4, 6) -> 2 x 2 x 3, s = 0.5: t = 1 + 0.5 f; h = i - 0 + t; w = j - 1 + t
    lay = build([[Text(1), Video((2, 4, 6)), Text(1)]], "hope", temporal_scale=0.5)
    t = [1.0] * 6 + [1.5] * 6
    h = [1.0, 1, 1, 2, 2, 2, 1.5, 1.5, 1.5, 2.5, 2.5, 2.5]
    w = [0.0, 1, 2, 0, 1, 2, 0.5, 1.5, 2.5, 0.5, 1.5, 2.5]
    assert _rows(lay) == [[0.0] + t + [2.5], [0.0] + h + [2.5], [0.0] + w + [2.5]]  # next: last t + 1
    assert lay.position_ids.dtype == torch.float32 and lay.rope_deltas.tolist() == [[3.5 - 14]]


def test_hope_training_draws_scale_per_block():
    g = torch.Generator().manual_seed(0)
    sample = [[Text(1), Video((3, 2, 2)), Text(1), Video((3, 2, 2))] for _ in range(8)]
    lay = build(sample, "hope", training=True, generator=g)
    t = lay.position_ids[0]
    steps = torch.cat([t[:, 2:4] - t[:, 1:3], t[:, 6:8] - t[:, 5:7]], dim=1)  # per block, both steps equal s
    assert set(steps.flatten().tolist()) <= set(HOPE_SCALES) and len(set(steps.flatten().tolist())) > 1
    assert torch.equal(steps[:, 0], steps[:, 1]) and torch.equal(steps[:, 2], steps[:, 3])
    again = build(sample, "hope", training=True, generator=torch.Generator().manual_seed(0))
    assert torch.equal(again.position_ids, lay.position_ids)


# ----------------------------------------------------------------------------- vrope
def test_vrope_four_symmetric_combinations():
    # image (1, 4, 6) -> H = 2, W = 3 at start 1; text after at 1 + (H + W - 1) = 5
    lay = build([[Text(1), Image((1, 4, 6)), Text(1)]], "vrope")
    assert lay.coords.axes == ("c0", "c1", "c2", "c3") and lay.position_ids.shape == (4, 1, 8)
    shift = lambda v: [0] + [1 + x for x in v] + [5]
    assert _rows(lay) == [
        shift([0, 1, 2, 1, 2, 3]),  # i + j
        shift([2, 1, 0, 3, 2, 1]),  # i + (W-1-j)
        shift([1, 2, 3, 0, 1, 2]),  # (H-1-i) + j
        shift([3, 2, 1, 2, 1, 0]),  # (H-1-i) + (W-1-j)
    ]


def test_vrope_frames_offset_by_h_plus_w_minus_1():
    lay = build([[Text(1), Video((3, 2, 4)), Text(1)]], "vrope")  # 3 frames of 1 x 2 -> stride 2
    assert _rows(lay)[0] == [0, 1, 2, 3, 4, 5, 6, 7]
    assert _rows(lay)[1] == [0, 2, 1, 4, 3, 6, 5, 7]


# ----------------------------------------------------------------------------- v2pe
def test_v2pe_fractional_steps_and_ceil():
    lay = build([[Text(2), Image((1, 4, 6)), Text(1)], [Image((1, 2, 4)), Text(1)]], "v2pe", delta=0.25)
    assert _rows(lay)[0] == [0, 1, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 4]  # ceil(2.5) + 1
    assert _rows(lay, 1) == [[-0.75, -0.5, 1, 1, 1, 1, 1, 1, 1]] * 3  # starts after position -1
    assert lay.coords.axes == ("seq",) and lay.coords.pos.dtype == torch.float64
    assert lay.rope_deltas.tolist() == [[5 - 9], [2 - 9]]
    one = build([[Text(2), Image((1, 4, 6)), Text(1)]], "v2pe", delta=1.0)
    assert torch.equal(one.position_ids, build([[Text(2), Image((1, 4, 6)), Text(1)]], "flat").position_ids.double())


def test_v2pe_exact_at_a_million_tokens():
    lay = build([[Text(999_999), Image((1, 32, 64)), Text(1)]], "v2pe", delta=1 / 256)  # 512 visual tokens
    pos = lay.coords.pos[0, 999_999:-1, 0]
    expected = 999_998 + torch.arange(1, 513, dtype=torch.float64) / 256
    assert torch.equal(pos, expected)
    assert torch.equal(pos.diff(), torch.full((511,), 1 / 256, dtype=torch.float64))
    assert lay.coords.pos[0, -1, 0].item() == 999_998 + 2 + 1
    assert not torch.equal(expected.float().double(), expected)  # float32 could not hold them


def test_v2pe_training_draws_delta_per_image():
    g = torch.Generator().manual_seed(3)
    lay = build([[Text(1), Image((1, 4, 4)), Text(1), Image((1, 4, 4))]] * 16, "v2pe", training=True, generator=g)
    p = lay.position_ids[0].double()
    steps = torch.cat([p[:, 1:5] - p[:, 0:4], p[:, 6:10] - p[:, 5:9]], dim=1)
    assert set(steps.flatten().tolist()) <= set(V2PE_DELTAS) and len(set(steps.flatten().tolist())) > 2
    assert (steps[:, :4] == steps[:, :1]).all() and (steps[:, 4:] == steps[:, 4:5]).all()


# ----------------------------------------------------------------------------- flat / all schemes
def test_flat_is_plain_positions():
    lay = build([[Text(2), Video((2, 4, 4)), Text(1)]], "flat")
    assert _rows(lay) == [list(range(11))] * 3 and lay.coords.axes == ("seq",)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_text_only_reduces_to_1d(scheme):
    lay = _build([[Text(4), Text(3)], [Text(5)]], scheme)
    expected = torch.tensor([list(range(7)), list(range(5)) + [1, 1]])
    assert torch.equal(lay.position_ids, expected.expand_as(lay.position_ids).to(lay.position_ids.dtype))
    assert lay.rope_deltas.tolist() == [[0], [5 - 7]]
    assert lay.coords.axes == SCHEMES[scheme].axes
    axes = len(SCHEMES[scheme].axes)
    assert torch.equal(lay.coords.pos[0], torch.arange(7.0).view(7, 1).expand(7, axes).to(lay.coords.pos.dtype))


SAMPLES = [
    [Text(3), Image((1, 4, 6)), Text(2), Video((2, 4, 4), 2.0), Text(1)],
    [Image((1, 2, 2)), Text(1)],
    [Text(2), Video((3, 2, 6)), Image((1, 6, 2))],
]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_padding_left_and_right(scheme):
    if scheme == "hunyuan-vl":
        pytest.skip("HunYuan-VL's image axis counts the images of the whole batch (as transformers' get_rope_index)")
    right, left = _build(SAMPLES, scheme), _build(SAMPLES, scheme, padding_side="left")
    lengths = right.attention_mask.sum(1)
    length = right.attention_mask.shape[1]
    for b, n in enumerate(lengths.tolist()):
        alone = _build([SAMPLES[b]], scheme)
        assert torch.equal(right.position_ids[:, b, :n], alone.position_ids[:, 0])
        assert torch.equal(left.position_ids[:, b, length - n :], alone.position_ids[:, 0])
        assert (right.position_ids[:, b, n:] == 1).all() and (left.position_ids[:, b, : length - n] == 1).all()
        next_pos = alone.rope_deltas[0] + n
        assert torch.equal(right.rope_deltas[b] + length, next_pos)
        assert torch.equal(left.rope_deltas[b] + length, next_pos)
    assert torch.equal(right.coords.mask, right.attention_mask.bool())
    assert (right.coords.pos[~right.coords.mask] == 0).all() and (left.coords.pos[~left.coords.mask] == 0).all()
    real = right.coords.mask
    rows = right.position_ids.shape[0] if len(SCHEMES[scheme].axes) > 1 else 1
    ids = right.position_ids[:rows, real].to(right.coords.pos.dtype)
    assert torch.equal(right.coords.pos.permute(2, 0, 1)[:, real], ids)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_decode_continues_like_appended_text(scheme, padding_side):
    """Decoding 3 tokens gives the positions that 3 appended text tokens get at build time."""
    lay = _build(SAMPLES, scheme, padding_side=padding_side)
    new = lay.decode(3)
    assert new.shape == (lay.position_ids.shape[0], len(SAMPLES), 3)
    for b, sample in enumerate(SAMPLES):
        longer = _build([sample + [Text(3)]], scheme)
        expected = longer.position_ids[:, 0, -3:].to(new.dtype)
        if scheme == "circlerope":  # irrational float32 positions: the decode sum and the packer's differ by an ulp
            torch.testing.assert_close(new[:, b], expected, rtol=1e-6, atol=0)
        else:
            assert torch.equal(new[:, b], expected)
    # HF passes cache_position as a tensor; later steps continue one by one
    length = lay.attention_mask.shape[1]
    step = decode_position_ids(lay.rope_deltas, torch.tensor([length + 1]), 1, rows=lay.position_ids.shape[0])
    assert torch.equal(step[..., 0], new[..., 1])


def test_decode_errors():
    with pytest.raises(ValueError, match="rope_deltas"):
        decode_position_ids(torch.zeros(3), 5)
    with pytest.raises(ValueError, match="num_new"):
        decode_position_ids(torch.zeros(3, 1), 5, 0)
    with pytest.raises(ValueError, match="cache_position"):
        decode_position_ids(torch.zeros(3, 1), -1)
    # a tensor: its dtype and size (a float would be truncated, an empty one give no position)
    for bad in (torch.tensor([5.5]), torch.zeros(0, dtype=torch.long), torch.tensor([True])):
        with pytest.raises(ValueError, match="cache_position must be an int >= 0 or a non-empty integer tensor"):
            decode_position_ids(torch.zeros(3, 1), bad)


# ----------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: build([[Text(2), Image((1, 5, 4))]], "qwen2-vl"), "divisible by spatial_merge_size=2"),
        (lambda: build([[Text(2), Video((2, 4, 6))]], "qwen2-vl", spatial_merge_size=4), "divisible"),
        (lambda: build([[Text(2)], []], "qwen2-vl"), r"samples\[1\] must be a non-empty"),
        (lambda: build([], "qwen2-vl"), "samples must be a non-empty"),
        (lambda: build([[Text(2)]], "qwen4-vl"), "scheme must be one of"),
        (lambda: build([[Text(2), "hello"]], "flat"), r"samples\[0\]\[1\] must be a Text"),
        (lambda: build([[Text(2)]], "flat", padding_side="middle"), "padding_side"),
        (lambda: build([[Text(2)]], "v2pe", delta=0.0), r"delta must be a number in \(0, 1\]"),
        (lambda: build([[Text(2)]], "v2pe", delta=1.5), r"delta must be a number in \(0, 1\]"),
        (lambda: build([[Text(2)]], "v2pe"), "delta must be a number"),
        (lambda: build([[Text(2)]], "v2pe", delta=0.5, training=True), "delta must be None when training"),
        (lambda: build([[Text(2)]], "qwen2-vl", delta=0.5), r"delta applies only to schemes \['v2pe'\]"),
        (lambda: build([[Text(2)]], "hope"), "temporal_scale must be a finite positive number"),
        (lambda: build([[Text(2)]], "hope", temporal_scale=-1.0), "temporal_scale must be a finite positive"),
        (lambda: build([[Text(2)]], "vrope", temporal_scale=2.0), "temporal_scale applies only"),
        (lambda: build([[Text(2)]], "mrope-i", temporal_scale=1.5), "temporal stride"),
        (lambda: build([[Text(2)]], "qwen2.5-vl", tokens_per_second=0), "tokens_per_second"),
        (lambda: build([[Text(2)]], "flat", spatial_merge_size=0), "spatial_merge_size"),
        (lambda: Text(-1), "Text.n must be a positive int"),
        (lambda: Text(0), "Text.n"),
        (lambda: Image((1, -2, 4)), r"Image.grid_thw\[h\] must be a positive int"),
        (lambda: Image((4, 4)), "must hold 3 sizes"),
        (lambda: Video((0, 2, 2)), r"Video.grid_thw\[t\]"),
        (lambda: Video((1, 2, 2), second_per_grid=-0.5), "second_per_grid"),
    ],
)
def test_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ----------------------------------------------------------------------------- coords and HF rows
@pytest.mark.parametrize("scheme", SCHEMES)
def test_coords_read_later_equal_position_ids_and_hf_rows(scheme):
    lay = _build(SAMPLES, scheme, padding_side="left")
    coords = lay.coords
    assert coords is lay.coords  # built on first read, then cached
    bare = dataclasses.replace(lay, _parts=None)  # a Layout without the packer's float64 positions
    assert torch.equal(bare.coords.pos, coords.pos) and torch.equal(bare.coords.mask, coords.mask)
    # the HF rows read from position_ids equal the scheme's hf_rows applied to the coordinates
    real = lay.attention_mask.bool()
    weights = torch.tensor(SCHEMES[scheme].hf_rows, dtype=torch.float64)
    rows = torch.einsum("ra,bla->rbl", weights, coords.pos.double()).masked_fill(~real, 1)
    assert torch.equal(lay.hf_position_ids("3d"), rows.to(lay.position_ids.dtype))


@pytest.mark.parametrize("scheme", ["qwen2-vl", "hope", "vrope"])
def test_pack_takes_blocks_in_any_order(scheme):
    """The one packer gives the same Layout whatever order the blocks are listed in (it puts
    them in reading order; the masked write then needs no index)."""
    opts = {"temporal_scale": 0.75} if scheme == "hope" else {}
    lay = build([[Text(2), Image((1, 4, 6)), Text(1), Video((2, 2, 4)), Text(3)]], scheme, **opts)
    real = torch.ones(1, 16, dtype=torch.bool)
    blocks = VisionBlocks(  # the video first, then the image
        torch.tensor([[2, 1, 2], [1, 2, 3]]),
        torch.tensor([9, 2]),
        torch.tensor([1.0, 0.0]),
        torch.tensor([False, True]),
    )
    options = resolve_options(scheme, **opts)
    again = pack(real, blocks, scheme, options)
    assert torch.equal(again.position_ids, lay.position_ids) and torch.equal(again.rope_deltas, lay.rope_deltas)
    assert torch.equal(again.coords.pos, lay.coords.pos) and torch.equal(again.modality, lay.modality)
    assert again.num_vision_tokens == lay.num_vision_tokens == 10
    overlapping = dataclasses.replace(blocks, first=torch.tensor([6, 2]))
    with pytest.raises(ValueError, match="must not overlap"):
        pack(real, overlapping, scheme, options)
    across = dataclasses.replace(blocks, first=torch.tensor([13, 2]))  # the video's 4 tokens run past L=16
    with pytest.raises(ValueError, match="must lie in the"):
        pack(real, across, scheme, options)
    with pytest.raises(ValueError, match="must be a real token"):
        pack(torch.arange(16).view(1, 16) < 12, blocks, scheme, options)
    with pytest.raises(ValueError, match=r"blocks.first must be an integer \(2,\)"):
        pack(real, dataclasses.replace(blocks, first=torch.tensor([9])), scheme, options)
    with pytest.raises(TypeError, match="options must be a SchemeOptions"):
        pack(real, blocks, scheme, {"rule": "original"})


# ----------------------------------------------------------------------------- packed batches
@pytest.mark.parametrize("scheme", ["qwen2-vl", "qwen3-vl", "hope", "v2pe", "vrope"])
@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_packed_equals_each_sample_alone(scheme, padding_side):
    """``Layout.packed``: one row, positions reset per sample, equal to building each sample alone;
    ``cu_seqlens`` as FlashAttention varlen reads it."""
    samples = [
        [Text(2), Image((1, 4, 6)), Text(1)],
        [Text(5)],
        [Text(1), Video((2, 4, 4), 0.5), Text(2), Image((1, 2, 2)), Text(1)],
    ]
    lay = _build(samples, scheme, padding_side=padding_side)
    ids, cu_seqlens, max_seqlen = lay.packed()
    alone = [_build([s], scheme) for s in samples]
    lengths = [a.position_ids.shape[-1] for a in alone]
    assert cu_seqlens.tolist() == [0, lengths[0], lengths[0] + lengths[1], sum(lengths)]
    assert cu_seqlens.dtype == torch.int32 and max_seqlen == max(lengths)
    assert ids.shape == (4, 1, sum(lengths))
    for a, start, end in zip(alone, cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist()):
        assert torch.equal(ids[1:, 0, start:end], a.hf_position_ids("3d")[:, 0])
        assert ids[0, 0, start:end].tolist() == list(range(end - start))  # the text row restarts at 0
    three, _, _ = lay.packed("3d")
    assert torch.equal(three, ids[1:])
    with pytest.raises(ValueError, match="shape must be '3d' or '4d'"):
        lay.packed("text")


@pytest.mark.parametrize("scheme", ["qwen2-vl", "hunyuan-vl", "vrope", "flat", "hope", "v2pe", "circlerope"])
@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_pack_writes_into_out(scheme, padding_side):
    """``pack(..., out=)``: the same ids as without it, written into ``out`` (``position_ids`` is ``out``),
    whatever ``out`` held before; a wrong ``out`` is refused before anything is written."""
    samples = [[Text(2), Image((1, 4, 6)), Text(1), Video((2, 2, 4), 0.5), Text(2)], [Text(3), Image((1, 2, 2))]]
    lay = _build(samples, scheme, padding_side=padding_side)
    real = lay.attention_mask.bool()
    is_vision = lay.modality != 0
    starts = [(b, n) for b in range(2) for n in range(real.shape[1]) if is_vision[b, n] and not is_vision[b, n - 1]]
    grids = [[1, 2, 3], [2, 1, 2], [1, 1, 1]]
    blocks = VisionBlocks(
        torch.tensor(grids),
        torch.tensor([b * real.shape[1] + n for b, n in starts]),
        torch.tensor([0.0, 0.5, 0.0]),
        torch.tensor([True, False, True]),
    )
    options = resolve_options(scheme, **EVAL_OPTIONS.get(scheme, {}))
    plain = pack(real, blocks, scheme, options)
    assert torch.equal(plain.position_ids, lay.position_ids)
    out = torch.full_like(plain.position_ids, 7)
    into = pack(real, blocks, scheme, options, out=out)
    assert into.position_ids is out and torch.equal(out, plain.position_ids)
    assert torch.equal(into.rope_deltas, plain.rope_deltas) and torch.equal(into.coords.pos, plain.coords.pos)
    rows, dtype = plain.position_ids.shape[0], plain.position_ids.dtype
    other = torch.int32 if dtype != torch.int32 else torch.int64
    bad = {
        "shape": torch.zeros((rows + 1, *real.shape), dtype=dtype),
        "dtype": torch.zeros((rows, *real.shape), dtype=other),
        "contiguity": torch.zeros((rows, real.shape[1], real.shape[0]), dtype=dtype).transpose(1, 2),
    }
    for what, tensor in bad.items():
        before = tensor.clone()
        with pytest.raises(ValueError, match=r"out must be a contiguous .* CPU tensor of shape"):
            pack(real, blocks, scheme, options, out=tensor)
        assert torch.equal(tensor, before), what
    with pytest.raises(TypeError, match="out must be a torch.Tensor or None"):
        pack(real, blocks, scheme, options, out=out.numpy())
    with pytest.raises(ValueError, match="device must be the CPU when out is given"):
        pack(real, blocks, scheme, options, out=out, device="meta")
