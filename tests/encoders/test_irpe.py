"""iRPE: the piecewise map, bucket ids and every mode against a naive O(N^2 D) version.

The naive version below is written from the paper (Eq. 18 and Sec. 3) and the forward
of the reference ``RPEAttention`` (microsoft/Cream ``rpe_vision_transformer.py``):
``q *= s; attn = q k^T + rpe_k(q) + rpe_q(k s)^T; softmax; out = attn v + rpe_v(attn)``,
with every (i, j) encoding materialised as a ``(N, N, D)`` tensor.
"""

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import mmpos
from mmpos import Coords
from mmpos.encoders.irpe import IRPE, PRESETS, bucket_ids, num_buckets, piecewise_index
from mmpos.nn import Attention, Transformer, attention

RATIOS = {"euc": 2.0, "quant": 1.9, "cross": 1.4, "product": 1.9}


# ---------------------------------------------------------------- naive reference
def g(x: float, ratio: float) -> int:
    """Eq. (18) on one number: round inside alpha, log-spaced up to beta outside."""
    alpha, beta, gamma = ratio, 2 * ratio, 8 * ratio
    if abs(x) <= alpha:
        return round(x)
    y = round(alpha + math.log(abs(x) / alpha) / math.log(gamma / alpha) * (beta - alpha))
    return int(math.copysign(min(y, beta), x))


def naive_ids(grid, method, ratio, prefix):
    """List of id maps (one, or rows and columns for cross) as nested Python lists."""
    h, w = grid
    shift = int(2 * ratio)
    side = 2 * shift + 1
    extra = side**2 if method == "product" else side
    cells = [(r, c) for r in range(h) for c in range(w)]
    n = prefix + h * w
    maps = [[[extra] * n for _ in range(n)] for _ in range(2 if method == "cross" else 1)]
    for i, (ri, ci) in enumerate(cells):
        for j, (rj, cj) in enumerate(cells):
            dr, dc = ri - rj, ci - cj
            if method == "euc":
                ids = [g(round(math.sqrt(dr * dr + dc * dc)), ratio) + shift]
            elif method == "quant":
                ids = [g(dr * dr + dc * dc, ratio) + shift]
            elif method == "product":
                ids = [(g(dr, ratio) + shift) * side + g(dc, ratio) + shift]
            else:
                ids = [g(dr, ratio) + shift, g(dc, ratio) + shift]
            for m, value in zip(maps, ids):
                m[prefix + i][prefix + j] = value
    return maps, extra + (1 if prefix else 0)


def naive_attention(q, k, v, enc, grid, prefix):
    """Reference formulas with (N, N, D) per-pair encodings; tables read from ``enc``."""
    maps, _size = naive_ids(grid, enc.method, enc.ratio, prefix)
    s = q.shape[-1] ** -0.5
    q = q * s
    logits = q @ k.transpose(-2, -1)
    rows = None
    for m_index, m in enumerate(maps):
        ids = torch.tensor(m)  # (N, N)
        part = slice(m_index * enc.num_buckets, m_index * enc.num_buckets + enc.num_buckets)
        if enc.mode == "bias":
            if enc.k_table is not None:
                logits = logits + enc.k_table[:, part][:, ids].unsqueeze(0)
            if enc.q_table is not None:
                logits = logits + enc.q_table[:, part][:, ids.T].unsqueeze(0)
            continue
        if enc.k_table is not None:
            r_k = enc.k_table[..., part].transpose(1, 2)[:, ids]  # (H', N, N, D): r(i, j)
            logits = logits + torch.einsum("bhid,hijd->bhij", q, r_k)
        if enc.q_table is not None:
            r_q = enc.q_table[..., part].transpose(1, 2)[:, ids]  # r(j, i) read at [j, i]
            logits = logits + torch.einsum("bhjd,hjid->bhij", k * s, r_q)
        if enc.v_table is not None:
            r_v = enc.v_table[:, part][:, ids]  # (H', N, N, D)
            rows = r_v if rows is None else rows + r_v
    attn = logits.softmax(-1)
    out = attn @ v
    if rows is not None:
        out = out + torch.einsum("bhij,hijd->bhid", attn, rows)
    return out


def _randomize(enc, seed=0):
    g_ = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in enc.parameters():
            p.copy_(torch.randn(p.shape, generator=g_, dtype=p.dtype))
    return enc


def _qkv(b=2, h=2, n=13, d=8, seed=1):
    g_ = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, d, generator=g_, dtype=torch.float64, requires_grad=True) for _ in range(3)]


# ---------------------------------------------------------------- piecewise index
def test_piecewise_map_at_ratio_19():
    x = torch.arange(-9, 10)
    magnitude = {0: 0, 1: 1, 2: 2, 3: 2}  # |x| >= 4 -> 3
    expected = [int(math.copysign(magnitude.get(abs(v), 3), v)) for v in x.tolist()]
    got = piecewise_index(x, 1.9, 3.8, 15.2)
    assert got.dtype == torch.long and got.tolist() == expected


def test_piecewise_rounds_half_to_even_and_truncates_after_clip():
    # inside alpha: round half to even
    assert piecewise_index(torch.tensor([0.5, 1.5, 2.5, -0.5, -2.5]), 3.0, 6.0, 24.0).tolist() == [0, 2, 2, 0, -2]
    # beta = 3.8 clips 4 to 3.8, then truncation gives +-3 (not 4)
    far = piecewise_index(torch.tensor([1000, -1000]), 1.9, 3.8, 15.2)
    assert far.tolist() == [3, -3]
    # matches the scalar formula everywhere for several ratios
    for ratio in (0.5, 1.9, 2.0, 3.3, 7.0):
        x = torch.arange(-60, 61)
        got = piecewise_index(x, ratio, 2 * ratio, 8 * ratio).tolist()
        assert got == [g(v, ratio) for v in x.tolist()]


# ---------------------------------------------------------------- bucket ids
def test_product_uses_50_buckets_on_14x14_with_class_token():
    ids, size = bucket_ids((14, 14), "product", 1.9, num_prefix_tokens=1)
    assert ids.shape == (197, 197) and size == 50 and ids.unique().numel() == 50
    assert (ids[0] == 49).all() and (ids[:, 0] == 49).all()


@pytest.mark.parametrize("method,ratio,used", [("euc", 20, 20), ("quant", 33, 51), ("cross", 20, 56)])
def test_reference_preset_names_count_used_buckets(method, ratio, used):
    ids, size = bucket_ids((14, 14), method, ratio, num_prefix_tokens=1)
    maps = ids if method == "cross" else ids[None]
    assert sum(m.unique().numel() for m in maps) == used
    assert size == num_buckets(method, ratio, num_prefix_tokens=1) and int(ids.max()) == size - 1


@pytest.mark.parametrize("method", ["euc", "quant", "cross", "product"])
@pytest.mark.parametrize("grid,prefix", [((3, 5), 0), ((4, 2), 2), ((9, 9), 1)])
def test_bucket_ids_equal_naive(method, grid, prefix):
    ids, size = bucket_ids(grid, method, RATIOS[method], prefix)
    maps, naive_size = naive_ids(grid, method, RATIOS[method], prefix)
    assert size == naive_size
    assert torch.equal(ids, torch.tensor(maps if method == "cross" else maps[0]))


def test_quant_buckets_the_squared_distance():
    # alpha = 10 covers every squared distance on a 3 x 3 grid: id - beta_int = dr^2 + dc^2
    ids, _ = bucket_ids((3, 3), "quant", 10.0)
    assert ids[0, 8] - 20 == 8 and ids[0, 4] - 20 == 2 and ids[4, 4] - 20 == 0


def test_offsets_saturate_on_large_grids():
    ids, size = bucket_ids((40, 3), "product", 1.9)
    assert int(ids.max()) < size
    assert ids[0, 39 * 3] == ids[0, 10 * 3]  # rows 39 and 10 away share the outermost bucket


# ---------------------------------------------------------------- modes vs naive
CASES = [(mode, on) for mode, ons in (("bias", ("q", "k", "qk")), ("ctx", ("q", "k", "v", "qkv"))) for on in ons]


@pytest.mark.parametrize("method", ["euc", "quant", "cross", "product"])
@pytest.mark.parametrize("mode,rpe_on", CASES)
@pytest.mark.parametrize("shared_head", [True, False])
def test_every_mode_equals_naive_values_and_gradients(method, mode, rpe_on, shared_head):
    grid, prefix = (3, 4), 1
    enc = IRPE(
        head_dim=8,
        num_heads=2,
        method=method,
        mode=mode,
        ratio=RATIOS[method],
        rpe_on=rpe_on,
        shared_head=shared_head,
        num_prefix_tokens=1,
    ).double()
    _randomize(enc)
    coords = Coords.grid(*grid, num_prefix_tokens=prefix, dtype=torch.float64)
    q, k, v = _qkv()
    out = attention(q, k, v, coords, [enc])
    params = list(enc.parameters())
    grads = torch.autograd.grad(out.square().sum(), [q, k, v, *params])
    ref = naive_attention(q, k, v, enc, grid, prefix)
    ref_grads = torch.autograd.grad(ref.square().sum(), [q, k, v, *params])
    torch.testing.assert_close(out, ref)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("grid", [(2, 7), (6, 3)])
def test_non_square_and_other_resolution_use_same_tables(grid):
    enc = _randomize(IRPE(head_dim=8, rpe_on="qkv", grid_size=(3, 4)).double())
    assert enc.train_ids.shape == (1, 13, 13)
    n_params = sum(p.numel() for p in enc.parameters())
    q, k, v = _qkv(n=1 + grid[0] * grid[1])
    out = attention(q, k, v, Coords.grid(*grid, num_prefix_tokens=1, dtype=torch.float64), [enc])
    torch.testing.assert_close(out, naive_attention(q, k, v, enc, grid, 1))
    assert sum(p.numel() for p in enc.parameters()) == n_params


def test_training_grid_fast_path_equals_computed_ids():
    fast = _randomize(IRPE(head_dim=8, rpe_on="qk", grid_size=(3, 4)))
    slow = IRPE(head_dim=8, rpe_on="qk")
    slow.load_state_dict(fast.state_dict())
    q, k, _ = [x.float().detach() for x in _qkv()]
    coords = Coords.grid(3, 4, num_prefix_tokens=1)
    torch.testing.assert_close(fast.bias(q, k, coords), slow.bias(q, k, coords))
    # prefix tokens other than ``num_prefix_tokens`` still share the one extra bucket
    q2, k2, _ = [x.float().detach() for x in _qkv(n=14)]
    assert fast.bias(q2, k2, Coords.grid(3, 4, num_prefix_tokens=2)).shape == (2, 2, 14, 14)


def test_no_pair_tensor_of_size_n_n_d():
    """Largest tensor made by bias + output, forward and backward: (B, H, N, N) or (B, H, buckets, D)."""

    class Largest(TorchDispatchMode):
        numel = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor):
                    self.numel = max(self.numel, t.numel())
            return out

    b, h, n, d = 1, 2, 37, 64
    enc = _randomize(IRPE(head_dim=d, rpe_on="qkv", grid_size=(6, 6)))
    coords = Coords.grid(6, 6, num_prefix_tokens=1)
    q, k, attn = (torch.randn(b, h, n, d, requires_grad=True) for _ in range(3))
    attn = torch.rand(b, h, n, n, requires_grad=True)
    with Largest() as mode:
        (enc.bias(q, k, coords).sum() + enc.output(attn, coords).sum()).backward()
    assert mode.numel <= max(b * h * n * n, b * h * 50 * d) < n * n * d / 8


# ---------------------------------------------------------------- integration
def test_attention_module_zero_tables_equal_plain_attention():
    torch.manual_seed(0)
    plain = Attention(32, 4)
    with_rpe = Attention(32, 4, encoders=[mmpos.create("irpe", dim=32, num_heads=4)])
    with_rpe.load_state_dict(plain.state_dict(), strict=False)
    x, coords = torch.randn(2, 17, 32), Coords.grid(4, 4, num_prefix_tokens=1)
    torch.testing.assert_close(with_rpe(x, coords), plain(x, coords))
    with_rpe(x, coords).sum().backward()
    assert with_rpe.encoders[0].k_table.grad.abs().sum() > 0


@pytest.mark.parametrize("pos", ["irpe", "irpe-product-ctx-qkv", "irpe-cross-ctx-k"])
def test_transformer_trains_with_irpe(pos):
    torch.manual_seed(0)
    model = Transformer(32, depth=2, num_heads=4, pos=pos, grid_size=(4, 4))
    enc = model.blocks[1].attn.encoders[pos]
    first = model.blocks[0].attn.encoders[pos]
    assert isinstance(enc, IRPE) and enc is not first and enc.train_ids is not None
    assert enc.train_ids.data_ptr() == first.train_ids.data_ptr()  # layers share one ids tensor
    for grid in [(4, 4), (3, 6)]:
        x = torch.randn(2, 1 + grid[0] * grid[1], 32)
        model(x, Coords.grid(*grid, num_prefix_tokens=1)).square().mean().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in enc.parameters())


def test_vit_class_token_path():
    """In a ViT with token pooling the bias reaches the logits (block 0's table gets a
    gradient, and a scene with two patch cells swapped gives another class-token output),
    while the last block's k table gets none: there only the class-token row counts, and
    all its pairs share the prefix bucket, a constant over the keys that softmax removes
    (see docs/encoders/irpe.md, "Without absolute position")."""
    from mmpos.nn import VisionTransformer

    torch.manual_seed(0)
    vit = VisionTransformer(img_size=16, patch_size=4, num_classes=4, dim=32, depth=2, num_heads=4, pos="irpe")
    images = torch.randn(3, 3, 16, 16)
    vit(images).logsumexp(-1).sum().backward()
    first, last = (block.attn.encoders["irpe"].k_table for block in vit.transformer.blocks)
    assert first.grad.abs().amax() > 1e-4
    assert last.grad.abs().amax() < 1e-4 * first.grad.abs().amax()  # float rounding only
    with torch.no_grad():
        for block in vit.transformer.blocks:
            block.attn.encoders["irpe"].k_table.normal_()
        swapped = images.clone()
        swapped[..., :4, :4], swapped[..., 8:12, 12:] = images[..., 8:12, 12:], images[..., :4, :4]
        cls, cls_swapped = vit.forward_features(images)[:, 0], vit.forward_features(swapped)[:, 0]
    assert (cls - cls_swapped).abs().amax() > 1e-3


def test_presets_are_registered_with_reference_settings():
    infos = {i.name: i for i in mmpos.list_encoders()}
    assert infos["irpe"].kind == "bias"
    for name, config in PRESETS.items():
        enc = mmpos.create(f"irpe-{name}", dim=48, num_heads=3)
        assert infos[f"irpe-{name}"].kind == "bias"
        assert (enc.method, enc.ratio, enc.rpe_on, enc.shared_head, enc.num_prefix_tokens) == (
            config["method"],
            config["ratio"],
            config["rpe_on"],
            True,
            1,
        )
    enc = mmpos.create("irpe", dim=48, num_heads=3)
    assert (enc.method, enc.mode, enc.ratio, enc.rpe_on, enc.head_dim) == ("product", "contextual", 1.9, "k", 16)
    assert enc.k_table.shape == (1, 16, 50) and enc.q_table is None and not enc.has_output
    per_head = mmpos.create("irpe-product-ctx-qkv", dim=48, num_heads=3, shared_head=False)
    assert per_head.v_table.shape == (3, 50, 16) and per_head.has_output


@pytest.mark.parametrize("grid", [(3, 4), (5, 2)])
def test_torch_compile_fullgraph(grid):
    enc = _randomize(IRPE(head_dim=8, rpe_on="qkv", method="cross", ratio=1.4, grid_size=(3, 4)))
    coords = Coords.grid(*grid, num_prefix_tokens=1)
    q, k, _ = [x.float().detach() for x in _qkv(n=coords.num_tokens)]
    attn = torch.rand(2, 2, coords.num_tokens, coords.num_tokens)

    def terms(q, k, attn):
        return enc.bias(q, k, coords), enc.output(attn, coords)

    if not torch._dynamo.is_dynamo_supported():  # pragma: no cover - e.g. unsupported Python
        pytest.skip("torch.compile (dynamo) is not supported on this platform")
    got = torch.compile(terms, fullgraph=True, backend="eager")(q, k, attn)
    for a, b in zip(got, terms(q, k, attn)):
        torch.testing.assert_close(a, b)


# ---------------------------------------------------------------- errors
def test_clear_errors():
    with pytest.raises(ValueError, match="method must be one of"):
        IRPE(head_dim=8, method="polar")
    with pytest.raises(ValueError, match="mode must be one of"):
        IRPE(head_dim=8, mode="rel")
    with pytest.raises(ValueError, match="needs mode='ctx'"):
        IRPE(head_dim=8, mode="bias", rpe_on="kv")
    with pytest.raises(ValueError, match="rpe_on"):
        IRPE(head_dim=8, rpe_on="kx")
    with pytest.raises(ValueError, match="num_heads"):
        IRPE(head_dim=8, shared_head=False)
    with pytest.raises(ValueError, match="grid_size"):
        IRPE(head_dim=8, grid_size=(14,))
    with pytest.raises(ValueError, match="ratio"):
        bucket_ids((3, 3), "product", 0)
    with pytest.raises(ValueError, match="grid_shape"):
        bucket_ids((3, 3, 3), "product", 1.9)
    enc = IRPE(head_dim=8)
    q = torch.randn(1, 2, 5, 8)
    with pytest.raises(ValueError, match="2-D grid"):
        enc.bias(q, q, Coords.sequence(5))
    with pytest.raises(ValueError, match="head_dim=8"):
        enc.bias(q[..., :4], q[..., :4], Coords.grid(2, 2, num_prefix_tokens=1))
    with pytest.raises(ValueError, match="num_prefix_tokens"):
        IRPE(head_dim=8, num_prefix_tokens=0).bias(q, q, Coords.grid(2, 2, num_prefix_tokens=1))
    with pytest.raises(ValueError, match="no value term"):
        enc.output(torch.rand(1, 2, 5, 5), Coords.grid(2, 2, num_prefix_tokens=1))
