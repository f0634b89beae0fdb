import math

import pytest
import torch

from mmpos.coords import Coords
from mmpos.layers import AdaptiveTokenMerger, merge_schedule


def _merger(dim=16, target=(3, 4), heads=2, seed=0):
    torch.manual_seed(seed)
    return AdaptiveTokenMerger(dim, target, num_heads=heads).eval()


def _cells(n, m):
    """Cells of an axis of n tokens merged to m, as lists of token indices (naive rules)."""
    if n == m:
        return [[i] for i in range(n)]
    bounds = [i * n // m for i in range(m + 1)]
    return [list(range(bounds[i], bounds[i + 1])) for i in range(m)]


def _naive_step(atm, x, size):
    """One grid-attention step with explicit loops over cells and heads: (h, w, D) -> (*size, D)."""
    h, w, d = x.shape
    heads, dh = atm.num_heads, d // atm.num_heads
    out = torch.empty(*size, d)
    for i, rows in enumerate(_cells(h, size[0])):
        for j, cols in enumerate(_cells(w, size[1])):
            tokens = torch.stack([x[r, c] for r in rows for c in cols])  # (K, D) real tokens only
            mean = tokens.mean(0)
            q = atm.q(atm.norm1(mean))
            k, v = atm.kv(atm.norm1(tokens)).split(d, -1)
            heads_out = []
            for hd in range(heads):
                sl = slice(hd * dh, (hd + 1) * dh)
                weights = torch.softmax(k[:, sl] @ q[sl] / math.sqrt(dh), 0)
                heads_out.append(weights @ v[:, sl])
            y = mean + atm.proj(torch.cat(heads_out))
            out[i, j] = y + atm.mlp(atm.norm2(y))
    return out


def test_schedule_follows_the_paper_rules():
    assert merge_schedule((64, 64), (14, 14)) == [(32, 32), (16, 16), (14, 14)]
    assert merge_schedule((14, 14), (14, 14)) == []
    assert merge_schedule((14, 20), (14, 14)) == [(14, 14)]  # 14 < 20 < 28: pad to 28, one step
    assert merge_schedule((29, 40), (14, 14)) == [(15, 20), (14, 14)]  # odd 29 -> 15 cells
    assert merge_schedule((252, 84), (14, 14)) == [(126, 42), (63, 21), (32, 14), (16, 14), (14, 14)]


@pytest.mark.parametrize("grid, target", [((8, 8), (4, 4)), ((5, 7), (3, 4)), ((4, 9), (4, 5)), ((11, 6), (3, 4))])
def test_matches_naive_cell_loop(grid, target):
    atm = _merger(target=target)
    x = torch.randn(2, 1 + math.prod(grid), 16)
    out, coords = atm(x, Coords.grid(*grid, num_prefix_tokens=1))
    expected = x[:, 1:].reshape(2, *grid, 16)
    with torch.no_grad():
        for size in merge_schedule(grid, target):  # the same weights at every step
            expected = torch.stack([_naive_step(atm, e, size) for e in expected])
    torch.testing.assert_close(out[:, 1:], expected.flatten(1, 2), rtol=1e-4, atol=1e-5)
    assert torch.equal(out[:, :1], x[:, :1])
    assert coords.grid_shape == target and coords.num_prefix_tokens == 1
    torch.testing.assert_close(coords.pos, Coords.grid(*target, num_prefix_tokens=1).pos)


def test_shapes_coords_and_repeated_merging_reach_target():
    atm = _merger(dim=8, target=(4, 4))
    sizes = []
    step = atm.merge_step
    atm.merge_step = lambda x, size: sizes.append(size) or step(x, size)
    x = torch.randn(3, 2 + 32 * 24, 8)
    out, coords = atm(x, Coords.grid(32, 24, num_prefix_tokens=2, batch=3))
    assert sizes == [(16, 12), (8, 6), (4, 4)]
    assert out.shape == (3, 2 + 16, 8)
    assert coords.grid_shape == (4, 4) and coords.axes == ("h", "w") and coords.batch_size == 3
    _same, same_coords = atm(torch.randn(3, 16, 8), Coords.grid(4, 4))
    assert len(sizes) == 3 and same_coords.grid_shape == (4, 4)  # already at the target: nothing merged


def test_permutation_inside_a_cell_does_not_change_the_output():
    atm = _merger(target=(4, 4))
    x = torch.randn(2, 8, 8, 16)
    cells = x.reshape(2, 4, 2, 4, 2, 16).permute(0, 1, 3, 2, 4, 5).reshape(2, 4, 4, 4, 16)  # (B, 4, 4, K, D)
    perm = torch.stack([torch.randperm(4) for _ in range(16)]).reshape(4, 4, 4)
    shuffled = torch.gather(cells, 3, perm[None, ..., None].expand(2, 4, 4, 4, 16))
    assert not torch.equal(shuffled, cells)
    back = shuffled.reshape(2, 4, 4, 2, 2, 16).permute(0, 1, 3, 2, 4, 5).reshape(2, 64, 16)
    coords = Coords.grid(8, 8)
    out, _ = atm(x.reshape(2, 64, 16), coords)
    out_shuffled, _ = atm(back, coords)
    torch.testing.assert_close(out_shuffled, out)
    # moving tokens across cells does change it
    across, _ = atm(x.roll(1, dims=2).reshape(2, 64, 16), coords)
    assert not torch.allclose(across, out)


def test_padding_slots_do_not_leak():
    atm = _merger(target=(3, 3))
    x = torch.randn(1, 20, 16)  # 4 x 5 grid -> 3 x 3: some cells hold 1 or 2 real tokens
    out, _ = atm(x, Coords.grid(4, 5))
    with torch.no_grad():  # a token alone in its cell ends as mean = itself, attention = v(itself)
        tok = x[0, 0]
        v = atm.kv(atm.norm1(tok))[16:]
        y = tok + atm.proj(v)
        expected = y + atm.mlp(atm.norm2(y))
    torch.testing.assert_close(out[0, 0], expected, rtol=1e-5, atol=1e-5)


def test_gradients_and_compile():
    atm = _merger(dim=8, target=(2, 3)).train()
    x = torch.randn(2, 1 + 7 * 9, 8, requires_grad=True)
    coords = Coords.grid(7, 9, num_prefix_tokens=1)
    out, _ = atm(x, coords)
    out.sum().backward()
    assert x.grad.abs().sum() > 0 and all(p.grad is not None for p in atm.parameters())
    compiled = torch.compile(atm.eval(), fullgraph=True, backend="eager")
    x, coords = torch.randn(2, 25, 8), Coords.grid(4, 6, num_prefix_tokens=1)  # one merge step keeps compiling short
    with torch.no_grad():
        torch.testing.assert_close(compiled(x, coords)[0], atm(x, coords)[0])


def test_errors():
    atm = _merger(target=(4, 4))
    with pytest.raises(ValueError, match="at least target_size"):
        atm(torch.randn(1, 12, 16), Coords.grid(3, 4))
    with pytest.raises(ValueError, match="2-D grid"):
        atm(torch.randn(1, 9, 16), Coords.sequence(9))
    with pytest.raises(ValueError, match="2-D grid"):
        atm(torch.randn(1, 32, 16), Coords.grid(2, 4, 4))
    with pytest.raises(ValueError, match="coords describe"):
        atm(torch.randn(1, 30, 16), Coords.grid(5, 5))
    with pytest.raises(ValueError, match="D=16"):
        atm(torch.randn(1, 25, 8), Coords.grid(5, 5))
    for bad in [(0, 4), (4,), (4, 4, 4), (2.5, 4)]:
        with pytest.raises(ValueError, match="target_size"):
            AdaptiveTokenMerger(16, bad)
    with pytest.raises(ValueError, match="num_heads"):
        AdaptiveTokenMerger(16, (2, 2), num_heads=3)
