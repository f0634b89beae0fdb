"""The packer's per-row path (``Scheme.rows``) against the per-token path of the same rule.

A scheme given ``rows`` gets its per-token ``block`` made from it; the packer writes integer ids
straight from the rows. Here every such scheme is packed both ways on random batches (images,
videos, left and right padding, every rule) and the layouts must be equal, and a row rule is
checked against positions written out by hand.
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
import torch

from mmpos.layout import Image, Text, Video, VisionBlocks, build, pack
from mmpos.schemes import RULES, SCHEMES, BlockGeometry, resolve_options

ROW_SCHEMES = sorted(name for name, s in SCHEMES.items() if s.rows is not None)


def _samples(seed: int) -> list[list]:
    rng = random.Random(seed)
    out = []
    for _ in range(rng.randint(1, 4)):
        sample = [Text(rng.randint(1, 6))]
        for _ in range(rng.randint(0, 3)):
            t, h, w = rng.randint(1, 4), 2 * rng.randint(1, 5), 2 * rng.randint(1, 5)
            sample.append(Image((1, h, w)) if rng.random() < 0.5 else Video((t, h, w), rng.choice((0.5, 1.0, 2.0))))
            sample.append(Text(rng.randint(1, 5)))
        out.append(sample)
    return out


def test_row_schemes_are_registered():
    assert {"qwen2-vl", "qwen2.5-vl", "qwen3-vl", "hy-v4-vl", "glm-image", "hunyuan-vl", "vrope", "flat"} <= set(
        ROW_SCHEMES
    )


@pytest.mark.parametrize("scheme", ROW_SCHEMES)
@pytest.mark.parametrize("rule", sorted(r for r in RULES if not r.startswith("qwen")))
def test_per_row_equals_per_token(scheme, rule):
    sch = SCHEMES[scheme]
    per_token = dataclasses.replace(sch, block=sch.block, rows=None)  # the same rule, placed token by token
    for seed in range(6):
        lay = build(_samples(seed), scheme, padding_side=("left", "right")[seed % 2], rule=rule)
        real = lay.attention_mask.bool()
        b, length = real.shape
        modality = lay.modality.reshape(-1)
        vision = (modality == 1) | (modality == 2)
        firsts = torch.nonzero(vision & ~torch.cat([torch.zeros(1, dtype=torch.bool), vision[:-1]])).view(-1)
        segs = [s for sample in _samples(seed) for s in sample if not isinstance(s, Text)]
        if sch.frames:  # a video as one block per frame
            grids = [(1, g.grid_thw[1] // 2, g.grid_thw[2] // 2) for g in segs for _ in range(g.grid_thw[0])]
            secs = [getattr(g, "second_per_grid", None) or 0.0 for g in segs for _ in range(g.grid_thw[0])]
            kinds = [isinstance(g, Image) for g in segs for _ in range(g.grid_thw[0])]
        else:
            grids = [(g.grid_thw[0], g.grid_thw[1] // 2, g.grid_thw[2] // 2) for g in segs]
            secs = [getattr(g, "second_per_grid", None) or 0.0 for g in segs]
            kinds = [isinstance(g, Image) for g in segs]
        counts = torch.tensor([t * h * w for t, h, w in grids], dtype=torch.long)
        starts = torch.cumsum(counts, 0) - counts
        # blocks may touch (a video's frames): every block's first token from the vision tokens in order
        first = torch.nonzero(vision).view(-1)[starts] if len(grids) else firsts[:0]
        blocks = VisionBlocks(
            torch.tensor(grids, dtype=torch.long).view(-1, 3),
            first,
            np.array(secs, dtype=np.float32),
            np.array(kinds, dtype=bool),
        )
        options = resolve_options(scheme, rule=rule, tokens_per_second=2)
        a = pack(real, blocks, sch, options)
        c = pack(real, blocks, per_token, options)
        assert torch.equal(a.position_ids, c.position_ids), (scheme, rule, seed)
        assert torch.equal(a.rope_deltas, c.rope_deltas), (scheme, rule, seed)
        assert torch.equal(a.position_ids, lay.position_ids), (scheme, rule, seed)
        assert a.position_ids.shape[1:] == (b, length)


def test_qwen_rows_by_hand():
    """One video (2 frames of 2 x 3 tokens) after 2 text tokens: rows and positions written out."""
    sch = SCHEMES["qwen2-vl"]
    g = BlockGeometry.of(
        np.array([[2, 2, 3]]), torch.zeros(1), torch.zeros(1, dtype=torch.bool), torch.ones(1), torch.ones(1)
    )
    base, step, extent, use_start = sch.rows(g, resolve_options(sch))
    assert base.tolist() == [[0, 0, 1, 1], [0, 1, 0, 1], [0, 0, 0, 0]]  # rows (f, i) = (0,0) (0,1) (1,0) (1,1)
    assert step.tolist() == [0, 0, 1] and extent.tolist() == [3] and use_start.tolist() == [1, 1, 1]
    lay = build([[Text(2), Video((2, 4, 6)), Text(1)]], "qwen2-vl")
    want_t = [0, 1] + [2] * 6 + [3] * 6 + [5]
    want_h = [0, 1] + [2, 2, 2, 3, 3, 3] * 2 + [5]
    want_w = [0, 1] + [2, 3, 4] * 4 + [5]
    assert lay.position_ids[:, 0].tolist() == [want_t, want_h, want_w]


def test_scheme_needs_one_block_rule():
    sch = SCHEMES["qwen2-vl"]
    with pytest.raises(ValueError, match="exactly one of block"):
        dataclasses.replace(sch, block=None, rows=None)
    with pytest.raises(ValueError, match="exactly one of block"):
        dataclasses.replace(sch, block=SCHEMES["hope"].block)  # rows kept: both given
    assert dataclasses.replace(sch, name="copy").block.args == (sch.rows,)  # its made block passes back


def _holes_batch(seed: int):
    """A padded batch whose real tokens have holes, with blocks (some adjacent) on real runs, listed shuffled."""
    rng = np.random.default_rng(seed)
    b, length = int(rng.integers(1, 5)), int(rng.integers(8, 60))
    real = rng.random((b, length)) < 0.85
    grids, firsts, seconds = [], [], []
    for i in range(b):
        n = 0
        while n < length:
            n += int(rng.integers(0, 3))  # 0: a block right after the last one
            t, h, w = (int(v) for v in rng.integers(1, 4, size=3))
            if n + t * h * w > length:
                break
            if real[i, n : n + t * h * w].all():
                grids.append((t, h, w))
                firsts.append(i * length + n)
                seconds.append(float(rng.choice([0.0, 0.5, 2.0])))
                n += t * h * w
            else:
                n += 1
    order = rng.permutation(len(grids))
    grid = torch.tensor(grids, dtype=torch.long).view(-1, 3)[order]
    blocks = VisionBlocks(
        grid,
        torch.tensor(firsts, dtype=torch.long)[order],
        torch.tensor(seconds, dtype=torch.float32)[order],
        torch.from_numpy(rng.random(len(grids)) < 0.5)[order],
    )
    return torch.from_numpy(real), blocks


@pytest.mark.parametrize("scheme", ROW_SCHEMES)
def test_per_row_equals_per_token_on_masks_with_holes(scheme):
    """Real tokens with holes (padding inside a sample), adjacent blocks listed in any order: the per-row
    writer (runs cut where ``real`` changes) equals the per-token path, under every rule."""
    sch = SCHEMES[scheme]
    per_token = dataclasses.replace(sch, block=sch.block, rows=None)
    for seed in range(8):
        real, blocks = _holes_batch(seed)
        if sch.frames:  # one frame per block
            keep = blocks.grid[:, 0] == 1
            blocks = VisionBlocks(*(x[keep] for x in (blocks.grid, blocks.first, blocks.seconds, blocks.is_image)))
        for rule in RULES:
            options = resolve_options(scheme, rule=rule)
            a, c = pack(real, blocks, sch, options), pack(real, blocks, per_token, options)
            assert torch.equal(a.position_ids, c.position_ids), (scheme, rule, seed)
            assert torch.equal(a.rope_deltas, c.rope_deltas), (scheme, rule, seed)
            assert a.position_ids.dtype == c.position_ids.dtype and a.rope_deltas.dtype == c.rope_deltas.dtype


def _tops_scheme(lift: int, extent_of, use_start: tuple[float, ...]):
    """A Qwen2-VL-shaped row rule ``lift`` above (or below) its rows on every axis (so a block's largest value may
    pass the position after it) whose extents are ``extent_of(tokens)`` (they may go back)."""

    def rows(g: BlockGeometry, o):
        row_block = g.row_block.numpy()  # (R,)
        first_row = np.flatnonzero(np.r_[True, row_block[1:] != row_block[:-1]])  # (K,)
        i = np.arange(row_block.shape[0]) - first_row[row_block]  # (R,) row within its block
        base = np.stack([np.zeros_like(i), i, np.zeros_like(i)]) + lift  # (3, R) int64
        tokens = (g.t * g.h * g.w).numpy().astype(np.float64)
        return base, np.array([0.0, 0.0, 1.0]), extent_of(tokens), np.array(use_start)

    qwen = SCHEMES["qwen2-vl"]
    return dataclasses.replace(qwen, name="tops-test", block=None, rows=rows, model_types=(), rotary_model_types=())


@pytest.mark.parametrize(
    "lift, extent_of, use_start",
    [
        (0, lambda n: n, (1.0, 1.0, 1.0)),  # every block's largest value below the position after it
        (40, lambda n: n, (1.0, 1.0, 1.0)),  # blocks' values pass it: the "max-real" deltas read them
        (40, lambda n: n - 30, (1.0, 1.0, 1.0)),  # extents that go back (negative ones too)
        (-40, lambda n: n - 30, (1.0, 1.0, 1.0)),  # ... below the text before them: a text position is the largest
        (40, lambda n: n, (0.0, 0.0, 0.0)),  # absolute rows (HunYuan-VL-like)
        (3, lambda n: n, (1.0, 0.0, 1.0)),  # a use_start per axis
    ],
)
def test_per_row_deltas_when_blocks_pass_the_next_position(lift, extent_of, use_start):
    """The per-row writer's largest positions (``"max-real"`` deltas, ``rule="hf-5.3"``) whether the blocks' values
    stay below the position after them or not, and with extents that go back: equal to the per-token path's."""
    sch = _tops_scheme(lift, extent_of, use_start)
    per_token = dataclasses.replace(sch, block=sch.block, rows=None)
    for seed in range(8):
        real, blocks = _holes_batch(seed)
        for rule in RULES:
            options = resolve_options(sch, rule=rule)
            a, c = pack(real, blocks, sch, options), pack(real, blocks, per_token, options)
            assert torch.equal(a.position_ids, c.position_ids), (rule, seed)
            assert torch.equal(a.rope_deltas, c.rope_deltas), (rule, seed)
            assert a.position_ids.dtype == c.position_ids.dtype and a.rope_deltas.dtype == c.rope_deltas.dtype
