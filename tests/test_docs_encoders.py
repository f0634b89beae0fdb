"""docs/encoders/learned.md and sincos.md: every ``python`` block of a page, in order, in one namespace; every
``name = ...  # (shape)`` comment holds; and the pages' claims about other implementations, checked here against
formulas written from the papers (Vaswani's interleaved 1-D table, MAE's 2-D concatenation) and timm."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from mmpos import Coords
from mmpos.encoders.learned import LearnedPositionEmbedding

PAGES = Path(__file__).resolve().parents[1] / "docs" / "encoders"
SHAPE_COMMENT = re.compile(r"^(\w+) = .*#\s*\((\d+(?:, \d+)*)\)", re.MULTILINE)


def _run(page: str) -> dict:
    path = PAGES / page
    blocks = re.findall(r"```python\n(.*?)```", path.read_text(), re.DOTALL)
    assert blocks, page
    torch.manual_seed(0)
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, path.name, "exec"), namespace)  # noqa: S102 (the docs are ours)
        for name, shape in SHAPE_COMMENT.findall(block):
            expected = tuple(int(s) for s in shape.split(", "))
            assert tuple(namespace[name].shape) == expected, f"{page}: {name}"
    return namespace


@pytest.fixture(scope="module")
def sincos():
    return _run("sincos.md")


@pytest.fixture(scope="module")
def learned():
    return _run("learned.md")


def test_sincos_page_runs_and_its_shape_comments_hold(sincos):
    assert (
        sum(1 for _ in SHAPE_COMMENT.finditer((PAGES / "sincos.md").read_text())) == 6
    )  # every shape comment on the page is checked
    assert not sincos["image"][0, 0].any() and sincos["image"][0, 1:].abs().sum(-1).gt(0).all()


def _vaswani(n: int, dim: int) -> torch.Tensor:
    """Section 3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)); (n, dim)."""
    pe = torch.zeros(n, dim, dtype=torch.float64)
    for pos in range(n):
        for i in range(dim // 2):
            angle = pos / 10000 ** (2 * i / dim)
            pe[pos, 2 * i], pe[pos, 2 * i + 1] = math.sin(angle), math.cos(angle)
    return pe


def test_sincos_1d_is_vaswani_deinterleaved(sincos):
    """The page: channel j is Vaswani's 2j, channel D/2 + j his 2j + 1."""
    ref = _vaswani(10, 96)
    order = [2 * j for j in range(48)] + [2 * j + 1 for j in range(48)]
    torch.testing.assert_close(sincos["text"][0].double(), ref[:, order], rtol=0, atol=1e-5)


def _mae_2d(h: int, w: int, dim: int) -> torch.Tensor:
    """MAE's get_2d_sincos_pos_embed on an h x w grid: [1-D(w), 1-D(h)] with 1-D(x) = [sin(x o), cos(x o)]."""
    omega = 1.0 / 10000 ** (torch.arange(dim // 4, dtype=torch.float64) / (dim / 4))
    rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")

    def one(x: torch.Tensor) -> torch.Tensor:
        out = x.flatten().double()[:, None] * omega
        return torch.cat([out.sin(), out.cos()], dim=1)

    return torch.cat([one(cols), one(rows)], dim=1)  # MAE's meshgrid puts w first


def test_sincos_2d_is_mae_with_its_channels_reordered(sincos):
    """The page: MAE holds [sin w, cos w, sin h, cos h], mmpos (and timm) [sin h, sin w, cos h, cos w]."""
    dim, k = 96, 24
    got = sincos["pe"].embed(Coords.grid(5, 7))[0].double()
    mae = _mae_2d(5, 7, dim)  # blocks of k: sin w, cos w, sin h, cos h
    block = {"sin w": 0, "cos w": 1, "sin h": 2, "cos h": 3}
    order = [block[b] * k + j for b in ("sin h", "sin w", "cos h", "cos w") for j in range(k)]
    torch.testing.assert_close(got, mae[:, order], rtol=0, atol=1e-5)
    assert not torch.allclose(got, mae, atol=1e-2)  # the orders differ: loading across them needs the permutation


def test_sincos_scaled_grid_stays_in_the_training_range(sincos):
    train, larger = sincos["train"][0], sincos["larger"][0].reshape(28, 28, -1)
    torch.testing.assert_close(larger[::2, ::2].reshape(196, -1), train)  # even cells are the 14 x 14 positions


def test_learned_page_runs_and_its_shape_comments_hold(learned):
    assert (
        sum(1 for _ in SHAPE_COMMENT.finditer((PAGES / "learned.md").read_text())) == 6
    )  # every shape comment on the page is checked
    pe = learned["pe"]
    assert learned["table"] is pe.pos_embed
    assert not learned["no_class_row"][0, 0].any()
    torch.testing.assert_close(learned["no_class_row"][:, 1:], learned["video"].pos_embed)
    assert tuple(learned["vit"].transformer.pos_encoders["learned"].pos_embed.shape) == (1, 1 + 8 * 8, 64)


def test_learned_page_resampling_is_timms_and_keeps_the_class_row(learned):
    from timm.layers import resample_abs_pos_embed

    pe, larger = learned["pe"], learned["larger"]
    torch.testing.assert_close(larger, resample_abs_pos_embed(pe.pos_embed, [24, 20], [14, 14], num_prefix_tokens=1))
    assert torch.equal(larger[:, 0], pe.pos_embed[:, 0])
    larger.sum().backward()  # resampled in the call: the gradient reaches the table
    assert pe.pos_embed.grad is not None and pe.pos_embed.grad[:, 1:].abs().sum() > 0


def test_learned_page_3d_along_t_only_and_1d_linear(learned):
    """The page: (8, 14, 14) -> (16, 14, 14) interpolates along t only; 1-D is linear interpolation."""
    cells = learned["video"].pos_embed.detach().reshape(8, 14, 14, 64)
    clip = learned["clip"].detach().reshape(16, 14, 14, 64)
    # align_corners=False, factor 2: output t = 2i + 1 sits at source i + 1/4 -> 3/4 cell i + 1/4 cell i + 1
    torch.testing.assert_close(clip[1:-1:2], 0.75 * cells[:-1] + 0.25 * cells[1:])
    torch.testing.assert_close(clip[0], cells[0])  # clamped at the edge
    table = learned["text"].pos_embed.detach()[0]  # (32, 64)
    longer = learned["longer"].detach()[0]  # (48, 64)
    src = ((torch.arange(48) + 0.5) * 32 / 48 - 0.5).clamp(min=0)
    lo = src.floor().long().clamp(max=31)
    hi, frac = (lo + 1).clamp(max=31), (src - lo)[:, None]
    torch.testing.assert_close(longer, (1 - frac) * table[lo] + frac * table[hi])


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact", "area"])
def test_learned_other_2d_modes_resample(mode):
    """The page: modes other than bilinear / bicubic resample without antialiasing (F.interpolate refuses it)."""
    pe = LearnedPositionEmbedding(8, (4, 4), interpolation=mode)
    cells = pe.pos_embed.detach().reshape(1, 4, 4, 8).permute(0, 3, 1, 2)  # (1, D, 4, 4)
    for size in ((6, 6), (2, 3)):
        expected = F.interpolate(cells, size=size, mode=mode).permute(0, 2, 3, 1).reshape(1, -1, 8)
        torch.testing.assert_close(pe.embed(Coords.grid(*size)), expected)
