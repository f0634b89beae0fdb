"""Multi-order attention and 2D-TPE: single order = causal RoPE, exact un-permutation, cache, router."""

import itertools
from dataclasses import replace

import pytest
import torch

from mmpos import Coords, create
from mmpos.layout import Text
from mmpos.nn import Attention, MultiOrderCache, TPEAttention
from mmpos.nn.multi_order import TPERouter, order_permutation, router_entropy, router_entropy_loss
from mmpos.table import Table, build, order_axes

ORDERS = ("row", "col", "diag")
AXES = order_axes(ORDERS)  # ("row_order", "col_order", "diag_order")


def _rope(x, pos, theta=10000.0):
    """Independent RoPE (rotate_half convention): x (B, H, N, D), pos (B, N)."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2).float() / d)
    ang = pos[:, None, :, None].float() * inv  # (B, 1, N, D/2)
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def _reference(m, x, pos, mask, causal=True):
    """Dense eager 2D-TPE: per order, token i sees real keys j with pos[j] <= pos[i]."""
    b, n, _ = x.shape
    h, hk, d = m.num_heads, m.num_kv_heads, m.head_dim
    q = m.q(x).view(b, n, h, d).transpose(1, 2)
    k, v = m.kv(x).view(b, n, 2, hk, d).permute(2, 0, 3, 1, 4)
    k, v = k.repeat_interleave(h // hk, 1), v.repeat_interleave(h // hk, 1)
    w = m.mix_weights(x)  # (B, N, H, K)
    out = 0
    for i in range(pos.shape[-1]):
        p = pos[..., i]
        logits = _rope(q, p) @ _rope(k, p).transpose(-1, -2) / d**0.5
        allowed = ((p[:, None, :] <= p[:, :, None]) | (not causal)) & mask[:, None, :]
        allowed = allowed | (torch.eye(n, dtype=torch.bool) & ~mask[:, :, None])
        o = logits.masked_fill(~allowed[:, None], float("-inf")).softmax(-1) @ v
        out = out + w[..., i].transpose(1, 2).unsqueeze(-1) * o
    return m.proj(out.transpose(1, 2).reshape(b, n, -1))


def _ragged_batch(padding_side="right"):
    samples = [
        [Text(3), Table(((1, 2), (2, 1, 3), (1,)), rule_rows=True), Text(4)],
        [Text(1), Table.grid(2, 3, cell_tokens=2), Text(2)],
        [Text(2), Table(((3,), (1, 1, 1, 1)), col_sep=0), Text(1), Table.grid(2, 2), Text(2)],
    ]
    return build(samples, orders=ORDERS, padding_side=padding_side)


@pytest.mark.parametrize("sequential", [("seq_order",), ()])
def test_single_order_equals_causal_rope_attention(sequential):
    torch.manual_seed(0)
    m = TPEAttention(32, 4, orders=("seq_order",), num_kv_heads=2, sequential_orders=sequential)
    ref = Attention(32, 4, 2, [create("rope", dim=32, num_heads=4)], causal=True, qkv_bias=False, proj_bias=False)
    ref.load_state_dict({k: v for k, v in m.state_dict().items() if not k.startswith("router")})
    x = torch.randn(2, 11, 32)
    mask = torch.ones(2, 11, dtype=torch.bool)
    mask[1, 8:] = False
    coords = replace(Coords.sequence(11, batch=2), mask=mask)
    out = m(x, Coords(coords.pos, ("seq_order",), mask=mask))
    assert torch.allclose(out, ref(x, coords), atol=1e-5)
    assert torch.equal(m.router_weights, torch.ones(2, 11, 4, 1))


@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_permuted_attention_matches_dense_reference_on_ragged_tables(padding_side):
    torch.manual_seed(1)
    layout = _ragged_batch(padding_side)
    c = layout.order_coords
    m = TPEAttention(32, 4, orders=AXES, num_kv_heads=2).eval()
    x = torch.randn(c.batch_size, c.num_tokens, 32)
    out = m(x, c)
    ref = _reference(m, x, c.pos, c.mask)
    real = c.mask
    assert torch.allclose(out[real], ref[real], atol=1e-5)


def test_inverse_permutation_is_exact_for_ragged_tables():
    layout = _ragged_batch("left")
    for i in range(len(ORDERS)):
        pos = layout.order_coords.pos[..., i]
        perm, inv = order_permutation(pos, layout.mask)
        x = torch.randn(pos.shape)
        assert torch.equal(x.gather(1, perm).gather(1, inv), x)
        sorted_pos = pos.gather(1, perm)
        n_real = layout.mask.sum(1)
        for b in range(pos.shape[0]):  # real tokens first, in increasing order
            assert torch.all(sorted_pos[b, : n_real[b]].diff() > 0)


def test_batched_tables_of_different_shapes_equal_single_runs():
    torch.manual_seed(2)
    samples = [[Text(2), Table.grid(3, 2), Text(2)], [Text(1), Table(((2, 1), (1,), (1, 1, 1))), Text(3)]]
    m = TPEAttention(16, 2, orders=AXES).eval()
    xs = [torch.randn(1, build([s]).order_coords.num_tokens, 16) for s in samples]
    batch = build(samples, orders=ORDERS, padding_side="left")
    n = batch.order_coords.num_tokens
    x = torch.cat([torch.nn.functional.pad(t, (0, 0, n - t.shape[1], 0)) for t in xs])
    out = m(x, batch.order_coords)
    for b, (s, t) in enumerate(zip(samples, xs)):
        alone = m(t, build([s], orders=ORDERS).order_coords)
        assert torch.allclose(out[b, n - t.shape[1] :], alone[0], atol=1e-5)


def _decode_batch():
    """A left-padded batch of two tables: the layer, its input, the order coordinates, the full forward's output
    (the reference) and the layout (for ``layout.decode``)."""
    torch.manual_seed(3)
    layout = build(
        [[Text(2), Table(((1, 2), (2,), (1, 1, 1))), Text(5)], [Text(1), Table.grid(2, 2), Text(4)]], ORDERS, "left"
    )
    c = layout.order_coords
    m = TPEAttention(32, 4, orders=AXES, num_kv_heads=1).eval()
    x = torch.randn(2, c.num_tokens, 32)
    with torch.no_grad():
        full = m(x, c)
    return m, x, c, full, layout


def _part(c, a, b):
    return Coords(c.pos[:, a:b], c.axes, mask=c.mask[:, a:b])


@pytest.mark.parametrize("capacity", [None, 4, 64])
def test_cached_decoding_equals_full_forward(capacity):
    m, x, c, full, layout = _decode_batch()
    cache, split = MultiOrderCache(capacity), c.num_tokens - 3
    outs = [m(x[:, :split], _part(c, 0, split), cache=cache)]
    buffers = [cache._values.data_ptr()]
    for i in range(split, c.num_tokens):
        outs.append(m(x[:, i : i + 1], _part(c, i, i + 1), cache=cache))
        buffers.append(cache._values.data_ptr())
    assert cache.keys.shape == (3, 2, 1, c.num_tokens, 8) and cache.values.shape == (2, 1, c.num_tokens, 8)
    assert torch.equal(cache.pos, c.pos.permute(2, 0, 1)) and torch.equal(cache.mask, c.mask)
    assert torch.allclose(torch.cat(outs, 1)[c.mask], full[c.mask], atol=1e-5)
    # the buffers are reallocated only when full (doubling), not at every step
    grown = sum(a != b for a, b in itertools.pairwise(buffers))
    assert (
        grown == {None: 1, 4: 1, 64: 0}[capacity]
        and cache._values.shape[2] == {None: 2 * split, 4: 2 * split, 64: 64}[capacity]
    )
    cache.crop(split)  # decoding again from the prefix gives the same outputs
    again = [m(x[:, i : i + 1], _part(c, i, i + 1), cache=cache) for i in range(split, c.num_tokens)]
    torch.testing.assert_close(torch.cat(again, 1), torch.cat(outs[1:], 1), rtol=0, atol=0)
    assert c.mask[:, split:].all()  # the decoded tokens are real: coords without a mask give the same outputs
    cache.crop(split)
    bare = [m(x[:, i : i + 1], Coords(c.pos[:, i : i + 1], c.axes), cache=cache) for i in range(split, c.num_tokens)]
    torch.testing.assert_close(torch.cat(bare, 1), torch.cat(outs[1:], 1))
    nxt = layout.decode(2)  # positions of generated tokens: same under every order
    assert torch.equal(nxt[:, 0, 0], c.pos[:, -1, 0] + 1) and torch.equal(nxt[..., 0], nxt[..., 2])


def test_gradients_reach_the_router_and_entropy_loss():
    torch.manual_seed(4)
    layout = _ragged_batch()
    c = layout.order_coords
    m = TPEAttention(32, 4, orders=AXES)
    x = torch.randn(c.batch_size, c.num_tokens, 32, requires_grad=True)
    out = m(x, c)
    (out.square().mean() + router_entropy_loss(m, layout.table_mask)).backward()
    for name, p in m.router.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    w = m.router_weights.detach()
    assert torch.allclose(w.sum(-1), torch.ones(()))
    uniform = torch.full_like(w, 1 / 3)
    assert torch.isclose(router_entropy(uniform, layout.table_mask), torch.log(torch.tensor(3.0)))
    onehot = torch.zeros_like(w)
    onehot[..., 0] = 1
    assert router_entropy(onehot, layout.table_mask) < 1e-6


def test_non_causal_attends_to_every_real_key_in_every_order():
    torch.manual_seed(5)
    layout = _ragged_batch()
    c = layout.order_coords
    m = TPEAttention(16, 2, orders=AXES, causal=False).eval()
    x = torch.randn(c.batch_size, c.num_tokens, 16)
    ref = _reference(m, x, c.pos, c.mask, causal=False)
    assert torch.allclose(m(x, c)[c.mask], ref[c.mask], atol=1e-5)
    with pytest.raises(ValueError, match="causal"):
        m(x, c, cache=MultiOrderCache())


def test_rope_spectrum_stays_float32_under_half_precision():
    m = TPEAttention(32, 4).to(torch.bfloat16)
    assert m.inv_freq.dtype == torch.float32 and m.q.weight.dtype == torch.bfloat16
    c = build([[Text(2), Table.grid(3, 3)]]).order_coords
    assert m(torch.randn(1, c.num_tokens, 32, dtype=torch.bfloat16), c).dtype == torch.bfloat16


def test_invalid_arguments():
    with pytest.raises(ValueError, match="divisible"):
        TPEAttention(30, 4)
    with pytest.raises(ValueError, match="orders"):
        TPEAttention(32, 4, orders=("row_order", "row_order"))
    with pytest.raises(ValueError, match="sequential_orders"):
        TPEAttention(32, 4, orders=("col_order",))
    m = TPEAttention(32, 4)
    c = build([[Text(2), Table.grid(2, 2)]]).order_coords
    with pytest.raises(ValueError, match="masks"):
        m(torch.randn(1, c.num_tokens, 32), c, attn_mask=torch.ones(1, 1, dtype=torch.bool))
    with pytest.raises(ValueError, match="capacity"):
        MultiOrderCache(0)
    with pytest.raises(ValueError, match="length"):
        MultiOrderCache().crop(1)
    with pytest.raises(ValueError, match=r"coords must hold the order axes \('row_order', 'col_order'\)"):
        m(torch.randn(1, 4, 32), Coords.sequence(4))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"num_heads": True}, ValueError, "num_heads must be a positive int, got True"),  # was read as one head
        ({"num_heads": 0}, ValueError, "num_heads must be a positive int, got 0"),
        ({"dim": 32.0}, ValueError, "dim must be a positive int, got 32.0"),
        ({"num_kv_heads": 2.0}, ValueError, "num_kv_heads must be a positive int, got 2.0"),
        ({"num_kv_heads": 0}, ValueError, "num_kv_heads must be a positive int, got 0"),
        ({"causal": 1}, TypeError, r"causal must be a bool \(True or False\), got 1"),
        ({"qkv_bias": "yes"}, TypeError, "qkv_bias must be a bool"),
        ({"proj_bias": None}, TypeError, "proj_bias must be a bool"),
        ({"theta": 0.0}, ValueError, "theta must be a finite number > 0, got 0.0"),
        ({"theta": float("nan")}, ValueError, "theta must be a finite number > 0"),
        ({"attn_drop": 1.5}, ValueError, r"attn_drop must be a finite number >= 0 and <= 1, got 1.5"),
        ({"router_hidden": 0}, ValueError, "hidden must be a positive int, got 0"),
    ],
)
def test_constructor_refuses(kwargs, error, match):
    args = {"dim": 32, "num_heads": 4, **kwargs}
    with pytest.raises(error, match=match):
        TPEAttention(**args)


def test_router_and_cache_arguments():
    with pytest.raises(ValueError, match="num_orders must be a positive int, got 2.0"):
        TPERouter(8, 2.0)
    with pytest.raises(ValueError, match="head_dim must be a positive int, got True"):
        TPERouter(True)
    with pytest.raises(ValueError, match="capacity must be None or a positive int, got True"):
        MultiOrderCache(True)
    cache = MultiOrderCache(capacity=4)
    cache.update(
        torch.zeros(2, 1, 1, 3, 4), torch.zeros(1, 1, 3, 4), torch.zeros(2, 1, 3), torch.ones(1, 3, dtype=torch.bool)
    )
    with pytest.raises(ValueError, match=r"length must be an int in \[0, 3\], got 2.0"):
        cache.crop(2.0)
    cache.crop(2)
    assert cache.length == 2 and cache.keys.shape == (2, 1, 1, 2, 4)


def test_grid_coordinates_are_refused_as_order_positions():
    lay = build([[Text(2), Table.grid(2, 3), Text(1)]])
    assert lay.order_coords.axes == ("row_order", "col_order") and lay.grid_coords.axes == ("row", "col")
    m = TPEAttention(32, 4)
    x = torch.randn(1, lay.grid_coords.num_tokens, 32)
    with pytest.raises(ValueError, match=r"order axes \('row_order', 'col_order'\).*grid coordinates"):
        m(x, lay.grid_coords)
    with pytest.raises(ValueError, match="orders must name order axes"):  # a layer that would read the grid axes
        TPEAttention(32, 4, orders=("row", "col"), sequential_orders=())
    assert m(x, lay.order_coords).shape == x.shape


def test_transformer_blocks_take_the_multi_order_attention():
    from mmpos.nn import Transformer

    torch.manual_seed(6)
    layout = _ragged_batch()
    c = layout.order_coords
    model = Transformer(32, 2, 4, causal=True, attn_layer=lambda i: TPEAttention(32, 4, orders=AXES))
    x = torch.randn(c.batch_size, c.num_tokens, 32)
    out = model(x, c)
    assert out.shape == x.shape and isinstance(model.blocks[1].attn, TPEAttention)
    router_entropy_loss(model, layout.table_mask).backward()
    assert model.blocks[0].attn.router.gate_1.weight.grad is not None
    with pytest.raises(ValueError, match="attn_layer"):
        Transformer(32, 1, 4, pos="rope", attn_layer=lambda i: TPEAttention(32, 4))


def test_all_real_mask_takes_the_is_causal_path(monkeypatch):
    import torch.nn.functional as F

    from mmpos.nn import multi_order

    calls = []
    real = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append((kwargs.get("attn_mask") is None, kwargs.get("is_causal", False)))
        return real(*args, **kwargs)

    torch.manual_seed(0)
    layer = TPEAttention(32, 4).eval()
    lay = build([[Text(3), Table.grid(3, 2), Text(2)]])  # the mask table.build attaches: all True here
    x = torch.randn(1, lay.order_coords.num_tokens, 32)
    with torch.no_grad():
        ref = layer(x, replace(lay.order_coords, mask=None))
        monkeypatch.setattr(multi_order.F, "scaled_dot_product_attention", spy)
        out = layer(x, lay.order_coords)
    assert calls == [(True, True), (True, True)]  # both orders: no (B, 1, N, N) mask
    torch.testing.assert_close(out, ref)


def test_base_class_needs_mix_weights():
    from mmpos.nn.multi_order import MultiOrderAttention

    with pytest.raises(TypeError, match="mix_weights"):
        MultiOrderAttention(32, 4)


def _steps(step, m, x, c, split, cache):
    """Eager prefill of ``split`` tokens into ``cache``, then one token a step through ``step``: ``(B, L, dim)``."""
    with torch.no_grad():
        outs = [m(x[:, :split], _part(c, 0, split), cache=cache)]
        outs += [step(x[:, i : i + 1], _part(c, i, i + 1), cache=cache) for i in range(split, c.num_tokens)]
    return torch.cat(outs, 1)


class _NoHostReads:
    """Makes ``int()`` / ``.item()`` / ``.tolist()`` / ``__index__`` of any tensor raise (a host sync on a GPU)."""

    def __init__(self, monkeypatch):
        self.monkeypatch = monkeypatch

    def __enter__(self):
        def refuse(*args, **kwargs):
            raise AssertionError("a tensor was read on the host")

        for name in ("__int__", "__index__", "item", "tolist"):
            self.monkeypatch.setattr(torch.Tensor, name, refuse)

    def __exit__(self, *exc):
        self.monkeypatch.undo()


def test_static_cache_decodes_as_the_dynamic_cache_without_host_reads(monkeypatch):
    m, x, c, full, _ = _decode_batch()
    split, slots = c.num_tokens - 4, c.num_tokens + 3
    dynamic = _steps(m, m, x, c, split, MultiOrderCache())
    cache, unknown = MultiOrderCache(slots, static=True), MultiOrderCache(slots, static=True)
    with torch.no_grad():
        m(x[:, :split], _part(c, 0, split), cache=cache)
        m(x[:, :split], _part(c, 0, split), cache=unknown)
        unknown._seen = None  # the host count as a compiled update leaves it: the step attends over every slot
        with _NoHostReads(monkeypatch):  # a decode step reads no counter (eager, as compiled)
            outs, alls, widths = [], [], []
            for i in range(split, c.num_tokens):
                outs.append(m(x[:, i : i + 1], _part(c, i, i + 1), cache=cache))
                alls.append(m(x[:, i : i + 1], _part(c, i, i + 1), cache=unknown))
                widths.append((cache._step_view()[1].shape[2], unknown._step_view()[1].shape[2]))
    static = torch.cat([dynamic[:, :split], *outs], 1)
    torch.testing.assert_close(static, dynamic, rtol=0, atol=1e-6)
    torch.testing.assert_close(static[c.mask], full[c.mask], rtol=0, atol=1e-5)
    # eager, the count kept on the host: the filled slots only; unknown: all slots, masked -- the same outputs
    assert widths == [(i + 1, slots) for i in range(split, c.num_tokens)]
    assert cache._seen == c.num_tokens and unknown._seen is None
    torch.testing.assert_close(torch.cat(alls, 1), static[:, split:], rtol=0, atol=1e-6)
    # every slot is visible, the unfilled ones masked; the count is a tensor
    assert cache.keys.shape == (3, 2, 1, slots, 8) and cache.values.shape == (2, 1, slots, 8)
    assert isinstance(cache.length, torch.Tensor) and int(cache.length) == c.num_tokens
    assert torch.equal(cache.mask[:, : c.num_tokens], c.mask) and not cache.mask[:, c.num_tokens :].any()
    assert torch.equal(cache.pos[..., : c.num_tokens], c.pos.permute(2, 0, 1))
    cache.crop(split)  # decoding again from the prefix: the same outputs, the later slots masked
    assert int(cache.length) == split and cache._seen == split and not cache.mask[:, split:].any()
    with torch.no_grad():
        again = [m(x[:, i : i + 1], _part(c, i, i + 1), cache=cache) for i in range(split, c.num_tokens)]
    torch.testing.assert_close(torch.cat(again, 1), static[:, split:], rtol=0, atol=0)


def test_static_cache_decode_step_is_one_graph():
    # fullgraph=True: a graph break raises; error_on_recompile: the later steps run the first step's graph (the
    # dynamic cache's tensors grow by a token a step, a new shape and graph each step; the static cache's do not)
    dynamo = torch._dynamo
    m, x, c, full, _ = _decode_batch()
    split = c.num_tokens - 5
    eager = _steps(m, m, x, c, split, MultiOrderCache(c.num_tokens, static=True))
    dynamo.reset()
    dynamo.utils.counters.clear()
    compiled = torch.compile(m, backend="eager", fullgraph=True, dynamic=False)
    cache = MultiOrderCache(c.num_tokens, static=True)
    with torch.no_grad():
        outs = [
            m(x[:, :split], _part(c, 0, split), cache=cache),
            compiled(x[:, split : split + 1], _part(c, split, split + 1), cache=cache),
        ]
        graphs = dynamo.utils.counters["stats"]["unique_graphs"]
        with dynamo.config.patch(error_on_recompile=True):
            outs += [compiled(x[:, i : i + 1], _part(c, i, i + 1), cache=cache) for i in range(split + 1, c.num_tokens)]
            assert cache._seen is None  # compiled updates do not keep the count on the host
            cache.crop(split)  # a crop changes no shape: the same graph decodes again
            again = [compiled(x[:, i : i + 1], _part(c, i, i + 1), cache=cache) for i in range(split, c.num_tokens)]
    assert graphs == 1 and dynamo.utils.counters["stats"]["unique_graphs"] == 1
    assert not dynamo.utils.counters["graph_break"]
    steps = torch.cat(outs, 1)
    torch.testing.assert_close(steps, eager, rtol=0, atol=1e-6)
    torch.testing.assert_close(torch.cat(again, 1), steps[:, split:], rtol=0, atol=0)
    torch.testing.assert_close(steps[c.mask], full[c.mask], rtol=0, atol=1e-5)
    # one step more than the capacity: refused by the compiled step, before it writes
    with torch.no_grad(), pytest.raises(RuntimeError, match=r"MultiOrderCache\(capacity=\d+, static=True\) is full"):
        compiled(x[:, -1:], _part(c, c.num_tokens - 1, c.num_tokens), cache=cache)
    assert int(cache.length) == c.num_tokens


def test_static_cache_arguments_and_overflow():
    with pytest.raises(ValueError, match=r"capacity must be a positive int with static=True.*got None"):
        MultiOrderCache(static=True)
    with pytest.raises(TypeError, match=r"static must be a bool \(True or False\), got 1"):
        MultiOrderCache(4, static=1)
    keys, values = torch.zeros(2, 1, 1, 3, 4), torch.zeros(1, 1, 3, 4)
    pos, real = torch.zeros(2, 1, 3), torch.ones(1, 3, dtype=torch.bool)
    small = MultiOrderCache(2, static=True)
    with pytest.raises(ValueError, match=r"capacity=2, static=True\) cannot hold the 3 tokens of its first update"):
        small.update(keys, values, pos, real)
    assert small._values is None  # refused before allocating
    cache = MultiOrderCache(4, static=True)
    cache.update(keys, values, pos, real)
    for seen in (3, None):  # refused from the host count / from the CPU counter when the host count is unknown
        cache._seen = seen
        with pytest.raises(ValueError, match=r"MultiOrderCache\(capacity=4, static=True\) is full: 3 more token"):
            cache.update(keys, values, pos, real)
        assert int(cache.length) == 3 and cache.mask[0].tolist() == [True, True, True, False]  # nothing written
    with pytest.raises(ValueError, match=r"length must be an int in \[0, 3\], got 4"):
        cache.crop(4)
    cache.crop(1)
    cache.update(keys, values, pos, real)
    assert int(cache.length) == 4 and cache.mask.all()
