"""2D-TPE on a tiny transformers Llama / Qwen2: one order reproduces the model's logits; cache; router."""

import inspect

import pytest
import torch

transformers = pytest.importorskip("transformers")

from _tiny_hf import tiny_causal_lm

from mmpos.integrations.hf_tpe import PreallocatedCache, install_tpe, uninstall_tpe
from mmpos.layout import Text
from mmpos.table import Table, build

pytestmark = pytest.mark.hf  # run on the oldest and the newest supported transformers


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_one_order_reproduces_the_unpatched_logits(kind):
    model = tiny_causal_lm(kind)
    ids = torch.randint(64, (2, 13))
    with torch.no_grad():
        ref = model(ids).logits
        install_tpe(model, orders=1, sequential_orders=())  # the permuted path, with the identity order
        pos = torch.arange(13).expand(1, 2, 13)
        out = model(ids, tpe_positions=pos).logits
        assert torch.allclose(out, ref, atol=1e-5)
        # two equal orders: the router mixes two equal outputs, whatever its weights
        uninstall_tpe(model)
        install_tpe(model, orders=2)
        assert torch.allclose(model(ids, tpe_positions=pos.expand(2, 2, 13)).logits, ref, atol=1e-5)
        uninstall_tpe(model)
        assert torch.equal(model(ids).logits, ref) and "tpe_router" not in dict(model.named_modules())


def test_table_orders_cached_decoding_and_router_gradients():
    model = tiny_causal_lm("llama")
    install_tpe(model, orders=2)
    layout = build([[Text(3), Table(((1, 2), (1,), (2, 1))), Text(2)]], orders=("row", "col"))
    n = layout.order_coords.num_tokens
    pos = layout.order_coords.pos.permute(2, 0, 1).long()  # (2, 1, n)
    ids = torch.randint(64, (1, n + 3))
    full_pos = torch.cat([pos, (layout.next_position + torch.arange(3)).expand(2, 1, 3)], dim=-1)
    with torch.no_grad():
        full = model(ids, tpe_positions=full_pos).logits
        out = model(ids[:, :n], tpe_positions=pos, use_cache=True)
        cache, steps = out.past_key_values, [out.logits]
        name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"  # 5.x / 4.x
        for i in range(3):
            new = ids[:, n + i : n + i + 1]
            out = model(new, tpe_positions=full_pos[..., n + i : n + i + 1], use_cache=True, **{name: cache})
            steps.append(out.logits)
    assert torch.allclose(torch.cat(steps, 1), full, atol=1e-5)
    with torch.no_grad():  # the order coordinates themselves; grid coordinates are refused
        direct = model(ids[:, :n], tpe_positions=layout.order_coords).logits
        torch.testing.assert_close(direct, steps[0], rtol=0, atol=0)
        with pytest.raises(ValueError, match="tpe_positions.*grid coordinates"):
            model(ids[:, :n], tpe_positions=layout.grid_coords)
        with pytest.raises(ValueError, match="tpe_positions"):
            model(ids[:, :n], tpe_positions=pos[:1])
    model.train()
    model(ids, tpe_positions=full_pos).logits.square().mean().backward()
    router = model.model.layers[0].self_attn.tpe_router
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in router.parameters())
    assert any(k.endswith("self_attn.tpe_router.gate_3.weight") for k in model.state_dict())


def _cached_steps(model, ids, pos, full_pos, n, cache, name):
    """Logits of a prefill of ``n`` tokens into ``cache`` (``None``: the model's own), then one token a step."""
    out = model(ids[:, :n], tpe_positions=pos, use_cache=True, **({} if cache is None else {name: cache}))
    cache, steps = out.past_key_values, [out.logits]
    for i in range(ids.shape[1] - n):
        out = model(
            ids[:, n + i : n + i + 1], tpe_positions=full_pos[..., n + i : n + i + 1], use_cache=True, **{name: cache}
        )
        steps.append(out.logits)
    return torch.cat(steps, 1), cache


def _static_layers_size_values_apart():
    """Feature detection: transformers 5's static layers allocate keys and values from their own shapes."""
    static = getattr(transformers.cache_utils, "StaticLayer", None)
    return static is not None and "value_states" in inspect.signature(static.lazy_initialization).parameters


@pytest.mark.parametrize("cache", ["dynamic", "preallocated", "preallocated-4", "static"])
def test_preallocated_caches_decode_as_the_full_forward(cache):
    model = install_tpe(tiny_causal_lm("qwen2"), orders=2)
    layout = build([[Text(3), Table.grid(2, 3), Text(1)]], orders=("row", "col"))
    n = layout.order_coords.num_tokens
    pos = layout.order_coords.pos.permute(2, 0, 1).long()
    ids = torch.randint(64, (1, n + 6))
    full_pos = torch.cat([pos, (layout.next_position + torch.arange(6)).expand(2, 1, 6)], dim=-1)
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"  # 5.x / 4.x
    made = {
        "dynamic": None,
        "preallocated": PreallocatedCache(capacity=n + 6),
        "preallocated-4": PreallocatedCache(capacity=4),  # smaller than the prefill: sized by it, then doubled
        "static": transformers.StaticCache(config=model.config, max_cache_len=n + 6),
    }[cache]
    with torch.no_grad():
        full = model(ids, tpe_positions=full_pos).logits
        if cache == "static" and not _static_layers_size_values_apart():
            with pytest.raises(ValueError, match="StaticCache before 5.*PreallocatedCache"):
                _cached_steps(model, ids, pos, full_pos, n, made, name)
            return
        steps, used = _cached_steps(model, ids, pos, full_pos, n, made, name)
    torch.testing.assert_close(steps, full, rtol=0, atol=1e-5)
    if cache.startswith("preallocated"):
        layer = used.layers[0]
        assert used is made and layer.keys.shape == (1, 2, n + 6, 16) and layer.values.shape == (1, 2, n + 6, 8)
        assert layer._key_buffer.shape[2] == (n + 6 if cache == "preallocated" else 2 * n)
        assert layer.keys.data_ptr() == layer._key_buffer.data_ptr()  # a view of the buffer, not a copy


@pytest.mark.parametrize("cache", ["dynamic", "preallocated"])
def test_padded_batch_decodes_chunks_as_the_full_forward(cache):
    # left padding (tpe_mask) and a chunk of two new tokens: the masked decode path
    model = install_tpe(tiny_causal_lm("llama"), orders=2)
    layout = build([[Text(2), Table.grid(2, 2)], [Text(1), Table.grid(3, 2), Text(1)]], ("row", "col"), "left")
    pos, mask = layout.order_coords.pos.permute(2, 0, 1).long(), layout.mask  # (2, 2, L), (2, L)
    b, n = mask.shape
    ids = torch.randint(64, (b, n + 3))
    new = (layout.next_position[:, None] + torch.arange(3)).expand(2, b, 3)
    full_pos, full_mask = torch.cat([pos, new], -1), torch.cat([mask, torch.ones(b, 3, dtype=torch.bool)], 1)
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    made = {} if cache == "dynamic" else {name: PreallocatedCache(capacity=n + 1)}
    with torch.no_grad():
        full = model(ids, tpe_positions=full_pos, tpe_mask=full_mask).logits
        out = model(ids[:, :n], tpe_positions=pos, tpe_mask=mask, use_cache=True, **made)
        c, steps = out.past_key_values, [out.logits]
        for lo, hi in ((n, n + 2), (n + 2, n + 3)):
            kw = {"tpe_positions": full_pos[..., lo:hi], "tpe_mask": full_mask[:, :hi], name: c}
            steps.append(model(ids[:, lo:hi], use_cache=True, **kw).logits)
    torch.testing.assert_close(torch.cat(steps, 1)[full_mask], full[full_mask], rtol=0, atol=1e-5)


def test_preallocated_cache_writes_in_place_and_survives_reassigned_layers():
    model = install_tpe(tiny_causal_lm("llama"), orders=2)
    pos = torch.arange(12).expand(2, 1, 12)
    ids = torch.randint(64, (1, 12))
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    with torch.no_grad():
        full = model(ids, tpe_positions=pos).logits
        cache = PreallocatedCache(capacity=32)
        out = [model(ids[:, :8], tpe_positions=pos[..., :8], use_cache=True, **{name: cache}).logits]
        buffer = cache.layers[1]._key_buffer.data_ptr()
        out.append(model(ids[:, 8:9], tpe_positions=pos[..., 8:9], use_cache=True, **{name: cache}).logits)
        assert cache.layers[1]._key_buffer.data_ptr() == buffer and cache.get_seq_length() == 9
        cache.batch_select_indices(torch.tensor([0]))  # a beam step: keys / values become copies
        assert cache.layers[1].keys.data_ptr() != buffer
        for i in range(9, 12):
            out.append(
                model(ids[:, i : i + 1], tpe_positions=pos[..., i : i + 1], use_cache=True, **{name: cache}).logits
            )
    torch.testing.assert_close(torch.cat(out, 1), full, rtol=0, atol=1e-5)
    assert cache.get_seq_length() == 12
    with pytest.raises(ValueError, match="capacity must be None or a positive int, got 0"):
        PreallocatedCache(0)


def test_preallocated_cache_serves_a_plain_model_and_generate():
    model = tiny_causal_lm("llama")  # no 2D-TPE: the cache is a DynamicCache whose layers write in place
    ids = torch.randint(64, (1, 8))
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    with torch.no_grad():
        ref = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
        out = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0, **{name: PreallocatedCache(2)})
    assert torch.equal(out, ref)


def test_padding_and_errors():
    model = tiny_causal_lm("qwen2")
    install_tpe(model, orders=2)
    layout = build([[Text(2), Table.grid(2, 2)], [Text(1), Table.grid(3, 2), Text(1)]], ("row", "col"), "left")
    pos = layout.order_coords.pos.permute(2, 0, 1).long()
    ids = torch.randint(64, pos.shape[1:])
    with torch.no_grad():
        batch = model(ids, tpe_positions=pos, tpe_mask=layout.mask).logits
        alone = build([[Text(2), Table.grid(2, 2)]], ("row", "col")).order_coords.pos.permute(2, 0, 1).long()
        k = alone.shape[-1]
        single = model(ids[:1, -k:], tpe_positions=alone).logits
    assert torch.allclose(batch[0, -k:], single[0], atol=1e-5)
    with pytest.raises(ValueError, match="tpe_positions"):
        model(ids)
    with pytest.raises(ValueError, match="orders"):
        install_tpe(tiny_causal_lm("llama"), orders=0)
    with pytest.raises(TypeError, match="Llama"):
        install_tpe(torch.nn.Linear(2, 2))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"orders": True}, "orders must be a positive int, got True"),
        ({"orders": 2.0}, "orders must be a positive int, got 2.0"),
        ({"sequential_orders": (True,)}, r"sequential_orders must hold order indices in \[0, 1\], got \(True,\)"),
        ({"sequential_orders": (2,)}, r"sequential_orders must hold order indices in \[0, 1\], got \(2,\)"),
        ({"sequential_orders": 0}, "sequential_orders must be a sequence of order indices, got 0"),
    ],
)
def test_install_arguments(kwargs, match):
    model = tiny_causal_lm("llama")
    with pytest.raises(ValueError, match=match):
        install_tpe(model, **{"orders": 2, **kwargs})
    assert "tpe_router" not in dict(model.named_modules())  # refused before any layer was touched


def test_router_starts_as_the_references_from_pretrained_and_uses_hidden_act():
    model = tiny_causal_lm("llama")
    model.config.hidden_act = "gelu"
    install_tpe(model, orders=2)
    router = model.model.layers[0].self_attn.tpe_router
    for lin in (router.gate_1, router.gate_2, router.gate_3):  # _init_weights: normal(0, initializer_range), bias 0
        assert lin.bias.abs().max() == 0 and abs(lin.weight.std().item() - 0.02) < 0.004
    assert isinstance(router.act, type(transformers.activations.ACT2FN["gelu"]))
    w = router(torch.randn(3, 5, 32))
    assert (w - 0.5).abs().max() < 0.01  # the mix starts at about 1 / K
    model.config.hidden_act = "no-such-act"
    with pytest.raises(ValueError, match="hidden_act"):
        install_tpe(model, orders=2)


def test_patched_model_pickles():
    import pickle

    model = install_tpe(tiny_causal_lm("qwen2"), orders=2)
    pos = torch.arange(9).expand(2, 1, 9)
    ids = torch.randint(64, (1, 9))
    clone = pickle.loads(pickle.dumps(model))
    with torch.no_grad():
        torch.testing.assert_close(clone(ids, tpe_positions=pos).logits, model(ids, tpe_positions=pos).logits)
    assert clone.model.layers[0].self_attn.forward.attn is clone.model.layers[0].self_attn
