"""Tests for the per-row rules of :mod:`mmpos.schemes` (``Scheme.rows``) against the rules written out row by row.

Each block ``k`` of ``t x h x w`` tokens has ``t * h`` rows (frame ``f``, row ``i``). The expected offsets below are
explicit Python loops over blocks, frames and rows (independent of ``BlockGeometry``'s vectorised per-row fields):

* Qwen2-VL M-RoPE: ``(f, i, 0)``; Qwen2.5-VL: ``(floor(f * interval), i, 0)`` with the float32 product of
  transformers' ``get_rope_index`` (``interval = second_per_grid * tokens_per_second`` in float32; ``trunc`` of the
  seconds first under ``hf-4.57``; 1 for images under ``hf-5.3``). Extents: ``max(t_max, h - 1, w - 1) + 1``
  (``"max"`` rules) or ``max(h, w)`` (``hf-5.3``).
* HY-V4-VL (XD-RoPE): ``(f S, i + f S, f S)``, ``S = max(h, w)``, extent ``t S``.
* HunYuan-VL: ``(0, i, k)``, extent ``t h w``.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from mmpos.schemes import SCHEMES, BlockGeometry, resolve_options


def _geometry(grid: np.ndarray, seconds: np.ndarray, is_image: np.ndarray) -> BlockGeometry:
    k = grid.shape[0]
    return BlockGeometry.of(
        grid,
        torch.from_numpy(seconds),
        torch.from_numpy(is_image),
        torch.ones(k, dtype=torch.float64),
        torch.ones(k, dtype=torch.float64),
    )


def _random_blocks(rng: random.Random, huge: bool = False):
    k = rng.randint(1, 7)
    grid = np.array([[rng.randint(1, 6), rng.randint(1, 5), rng.randint(1, 5)] for _ in range(k)], dtype=np.int64)
    is_image = np.array([rng.random() < 0.4 for _ in range(k)])
    grid[is_image, 0] = 1
    choices = [0.0, 0.5, 1.0, 2.0, 1 / 3, 0.1, 7.9] + ([1e30, 3e38] if huge else [])
    seconds = np.array([0.0 if img else rng.choice(choices) for img in is_image], dtype=np.float32)
    return grid, seconds, is_image


def _expected_qwen25(grid, seconds, is_image, tps: float, rule: str):
    """Row by row: ``(3, R)`` float64 offsets and ``(K,)`` extents, the float32 products written out per row."""
    rows, extents = [], []
    for (t, h, w), sec, img in zip(grid.tolist(), seconds.tolist(), is_image.tolist()):
        sec32 = np.float32(math.trunc(sec) if rule == "hf-4.57" else sec)
        with np.errstate(all="ignore"):  # huge seconds: inf and NaN
            interval = np.float32(1) if (rule == "hf-5.3" and img) else np.float32(sec32 * np.float32(tps))
            for f in range(t):
                for i in range(h):
                    rows.append((float(np.floor(np.float32(f) * interval)), i, 0))
            t_max = float(np.floor(np.float32(t - 1) * interval))
        extents.append(max(h, w) if rule == "hf-5.3" else max(t_max, h - 1, w - 1) + 1)
    return np.array(rows, dtype=np.float64).T, np.array(extents, dtype=np.float64)


@pytest.mark.parametrize("rule", ["original", "hf-4.57", "hf-5.3"])
def test_qwen25_rows_equal_the_rule_row_by_row(rule):
    rng = random.Random(rule)
    for trial in range(60):
        huge = trial % 4 == 3
        grid, seconds, is_image = _random_blocks(rng, huge)
        tps = rng.choice([1, 2, 25, 0.5] + ([1e30] if huge else []))
        options = resolve_options("qwen2.5-vl", tokens_per_second=tps, rule=rule)
        with np.errstate(all="ignore"):
            base, step, extent, use_start = SCHEMES["qwen2.5-vl"].rows(_geometry(grid, seconds, is_image), options)
        want, want_extent = _expected_qwen25(grid, seconds, is_image, tps, rule)
        base = np.asarray(base)
        np.testing.assert_array_equal(base.astype(np.float64), want)
        np.testing.assert_array_equal(np.asarray(extent), want_extent)
        assert np.asarray(extent).dtype == np.float64
        finite = bool(np.isfinite(want).all() and (np.abs(want) < 2**53).all())
        # integer rows exactly where every offset is a finite integer below 2**53 (the packer then skips its check)
        assert base.dtype == (np.int64 if finite else np.float64)
        np.testing.assert_array_equal(np.asarray(step), [0.0, 0.0, 1.0])
        np.testing.assert_array_equal(np.asarray(use_start), [1.0, 1.0, 1.0])


@pytest.mark.parametrize("rule", ["original", "hf-5.3"])
def test_qwen2_hy_v4_hunyuan_rows_equal_the_rules_row_by_row(rule):
    rng = random.Random(rule)
    for _ in range(40):
        grid, seconds, is_image = _random_blocks(rng)
        want = {"qwen2-vl": [], "hy-v4-vl": [], "hunyuan-vl": []}
        for k, (t, h, w) in enumerate(grid.tolist()):
            side = max(h, w)
            for f in range(t):
                for i in range(h):
                    want["qwen2-vl"].append((f, i, 0))
                    want["hy-v4-vl"].append((f * side, i + f * side, f * side))
                    want["hunyuan-vl"].append((0, i, k))
        t, h, w = grid.T.tolist()
        extents = {
            "qwen2-vl": [max(a, b, c) if rule != "hf-5.3" else max(b, c) for a, b, c in zip(t, h, w)],
            "hy-v4-vl": [a * max(b, c) for a, b, c in zip(t, h, w)],
            "hunyuan-vl": [a * b * c for a, b, c in zip(t, h, w)],
        }
        for name, rows in want.items():
            options = resolve_options(name, rule=rule)
            base, _, extent, _ = SCHEMES[name].rows(_geometry(grid, seconds, is_image), options)
            base = np.asarray(base)
            assert base.dtype == np.int64, name
            np.testing.assert_array_equal(base, np.array(rows, dtype=np.int64).T, err_msg=name)
            np.testing.assert_array_equal(np.asarray(extent, dtype=np.float64), extents[name], err_msg=name)


def test_frame_rows_equal_the_loop():
    """``BlockGeometry``'s per-row frame and row (``row_t``, ``row_h``, ``row_block``) against the loop."""
    rng = random.Random(0)
    for _ in range(30):
        grid, seconds, is_image = _random_blocks(rng)
        g = _geometry(grid, seconds, is_image)
        loop = [(k, f, i) for k, (t, h, _) in enumerate(grid.tolist()) for f in range(t) for i in range(h)]
        block, frame, row = (list(c) for c in zip(*loop))
        assert g.row_block.tolist() == block
        assert g.row_t.tolist() == frame and g.row_t.dtype == torch.float64
        assert g.row_h.tolist() == row and g.row_h.dtype == torch.float64
