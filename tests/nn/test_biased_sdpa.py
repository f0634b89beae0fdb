"""``mmpos.nn._biased_sdpa``: attention with a bucket-gathered bias, against the plain math path.

The reference is written out here: ``softmax(q k^T / sqrt(D) + bias) v`` with
``bias[..., i, j] = sum_m z[..., i, ids[m, i, j]]`` formed in full and differentiated by autograd.
"""

import importlib

import pytest
import torch
import torch.nn.functional as F

import mmpos
from mmpos import Coords
from mmpos.nn import Attention, attention
from mmpos.nn import _biased_sdpa as biased

attention_module = importlib.import_module("mmpos.nn.attention")  # the module (mmpos.nn.attention is the function)


def _inputs(b=2, h=3, n=23, d=8, buckets=7, maps=1, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, n, d, generator=gen, dtype=dtype, requires_grad=True) for _ in range(3))
    z = torch.randn(b, h, n, maps * buckets, generator=gen, dtype=dtype, requires_grad=True)
    ids = torch.randint(0, buckets, (maps, n, n), generator=gen) + buckets * torch.arange(maps).view(maps, 1, 1)
    return q, k, v, z, ids


def _math(q, k, v, z, ids):
    b, h, n, d = q.shape
    bias = sum(z.expand(b, h, n, z.shape[-1]).gather(-1, m.expand(b, h, n, n)) for m in ids)
    return torch.softmax(q @ k.transpose(-2, -1) * d**-0.5 + bias, dim=-1) @ v


@pytest.mark.parametrize("select", [False, True])  # the bias rows by one broadcast gather / one index_select per slice
@pytest.mark.parametrize("maps", [1, 2])
@pytest.mark.parametrize("block", [None, 5 * 23, 4 * 23 * 23])  # all; 16 + 7 rows x 1 slice; 23 rows x 4 + 2 slices
def test_values_and_gradients_equal_the_math_path(maps, block, select, monkeypatch):
    if block is not None:
        monkeypatch.setattr(biased, "_BLOCK_ELEMENTS", block)
    monkeypatch.setattr(biased, "_SELECT_ELEMENTS", 0 if select else 2**62)
    q, k, v, z, ids = _inputs(maps=maps)
    out = biased.gathered_bias_attention(q, k, v, z, ids)
    ref = _math(q, k, v, z, ids)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v, z), grad)
    want = torch.autograd.grad(ref, (q, k, v, z), grad)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_gradcheck_with_strided_inputs_and_a_broadcast_bias(monkeypatch):
    monkeypatch.setattr(biased, "_BLOCK_ELEMENTS", 9 * 9)  # one (batch x head) slice per block: 2 blocks
    _, k, v, _, ids = _inputs(b=1, h=2, n=9, d=3, buckets=4)
    q_t = torch.randn(1, 9, 2, 3, dtype=torch.float64, requires_grad=True)  # (B, N, H, D) viewed as (B, H, N, D)
    table = torch.randn(1, 2, 1, 4, dtype=torch.float64, requires_grad=True)  # bias-mode z: (1, H, 1, buckets)

    def fn(q_t, k, v, table):
        return biased.gathered_bias_attention(q_t.transpose(1, 2), k, v, table, ids)

    assert torch.autograd.gradcheck(fn, (q_t, k, v, table))
    torch.testing.assert_close(fn(q_t, k, v, table), _math(q_t.transpose(1, 2), k, v, table, ids))


def test_no_n_by_n_tensor_is_kept_for_backward():
    q, k, v, z, ids = _inputs(n=40, dtype=torch.float32)
    sizes = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: sizes.append(t.numel()) or t, lambda t: t):
        biased.gathered_bias_attention(q, k, v, z, ids)
    assert max(sizes) < 2 * 3 * 40 * 40  # ids (N, N) are shared by all batches and heads
    sizes.clear()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: sizes.append(t.numel()) or t, lambda t: t):
        _math(q, k, v, z, ids)  # the test can fail: the math path keeps (B, H, N, N) tensors
    assert max(sizes) >= 2 * 3 * 40 * 40


def _irpe_layer(rpe_on="k", mode="ctx", method="product"):
    torch.manual_seed(0)
    enc = mmpos.create("irpe", dim=32, num_heads=2, method=method, mode=mode, rpe_on=rpe_on, grid_size=(3, 4))
    for p in enc.parameters():
        torch.nn.init.normal_(p, std=0.5)
    return Attention(32, 2, encoders=[enc]), enc


@pytest.mark.parametrize("mode,method", [("ctx", "product"), ("ctx", "cross"), ("bias", "euc")])
def test_attention_routes_irpe_on_keys_here_and_matches_the_sdpa_path(mode, method, monkeypatch):
    calls = []
    monkeypatch.setattr(
        attention_module, "gathered_bias_attention", lambda *a: calls.append(1) or biased.gathered_bias_attention(*a)
    )
    layer, enc = _irpe_layer(mode=mode, method=method)
    coords = Coords.grid(3, 4, num_prefix_tokens=1)
    x = torch.randn(2, 13, 32, requires_grad=True)
    q = layer.q(x).view(2, 13, 2, 16).transpose(1, 2)
    k, v = layer.kv(x).view(2, 13, 2, 2, 16).permute(2, 0, 3, 1, 4)
    out = attention(q, k, v, coords, [enc])
    assert calls == [1]
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=enc.bias(q, k, coords))  # the general bias path
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    params = [x, *enc.parameters()]
    for a, b in zip(torch.autograd.grad(out.sum(), params, retain_graph=True), torch.autograd.grad(ref.sum(), params)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_other_cases_keep_the_general_path(monkeypatch):
    calls = []
    monkeypatch.setattr(
        attention_module, "gathered_bias_attention", lambda *a: calls.append(1) or biased.gathered_bias_attention(*a)
    )
    coords = Coords.grid(3, 4, num_prefix_tokens=1)
    x = torch.randn(2, 13, 32)
    for rpe_on in ("q", "qk", "kv"):  # a term on queries or values
        _irpe_layer(rpe_on=rpe_on)[0](x, coords)
    layer, _ = _irpe_layer()
    layer(x, coords, attn_mask=torch.ones(13, 13, dtype=torch.bool))  # a mask
    layer.to(torch.bfloat16)(x.bfloat16(), coords)  # no fused CPU path for half precision here
    assert calls == []
    assert not biased.supports_gathered_bias(torch.zeros(1, dtype=torch.bfloat16))


def test_torch_compile_fullgraph_forward_and_backward():
    if not torch._dynamo.is_dynamo_supported():  # pragma: no cover - e.g. unsupported Python
        pytest.skip("torch.compile (dynamo) is not supported on this platform")
    layer, enc = _irpe_layer()
    coords = Coords.grid(3, 4, num_prefix_tokens=1)
    x = torch.randn(2, 13, 32, requires_grad=True)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    out, ref = compiled(x, coords), layer(x, coords)
    torch.testing.assert_close(out, ref)
    for a, b in zip(torch.autograd.grad(out.sum(), [x, enc.k_table]), torch.autograd.grad(ref.sum(), [x, enc.k_table])):
        torch.testing.assert_close(a, b)
