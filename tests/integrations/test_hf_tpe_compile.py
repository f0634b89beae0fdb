"""2D-TPE decoding under ``torch.compile``: a static cache's decode step is one graph (no break, no recompile).

CPU, backend ``"eager"`` (dynamo's graph capture without code generation): what is checked is the
capture -- ``fullgraph=True`` (a graph break raises), ``error_on_recompile`` after the first step --
and that the compiled steps give the eager steps' logits and tokens. Static caches: transformers 5's
``StaticCache`` and ``PreallocatedCache(static=True)`` (transformers 4.57.1 and 5.x).
"""

import inspect

import pytest
import torch

transformers = pytest.importorskip("transformers")

from _tiny_hf import tpe_causal_lm

from mmpos.integrations.hf_tpe import PreallocatedCache
from mmpos.layout import Text
from mmpos.table import Table, build

pytestmark = pytest.mark.hf  # run on the oldest and the newest supported transformers

dynamo = torch._dynamo


def _graphs():
    """Graphs dynamo captured since the last ``counters.clear()`` (a recompile is one more)."""
    return dynamo.utils.counters["stats"]["unique_graphs"]


def _static_layers_size_values_apart():
    """Feature detection: transformers 5's static layers allocate keys and values from their own shapes."""
    static = getattr(transformers.cache_utils, "StaticLayer", None)
    return static is not None and "value_states" in inspect.signature(static.lazy_initialization).parameters


needs_static = pytest.mark.skipif(
    not _static_layers_size_values_apart(),
    reason="a StaticCache that holds 2D-TPE keys (K * D wide) beside values (D wide) needs transformers 5",
)


def _prompt(new):
    """A left-padded batch of two tables, the ids of the prompt and ``new`` tokens after it, positions, masks."""
    samples = [[Text(2), Table.grid(2, 3), Text(2)], [Text(1), Table(((1, 2), (2,), (1, 1))), Text(1)]]
    layout = build(samples, orders=("row", "col"), padding_side="left")
    pos, mask = layout.order_coords.pos.permute(2, 0, 1).long(), layout.mask  # (2, B, L), (B, L)
    b, n = mask.shape
    torch.manual_seed(1)
    ids = torch.randint(1, 64, (b, n + new))
    ids[:, :n] = ids[:, :n].masked_fill(~mask, 0)
    gen = (layout.next_position[:, None] + torch.arange(new)).expand(2, b, new)
    full_pos = torch.cat([pos, gen], -1)
    full_mask = torch.cat([mask, torch.ones(b, new, dtype=torch.bool)], 1)
    return ids, full_pos, full_mask, n


def _cache_kw(model, cache, start=None, tokens=1):
    """The cache keyword (``cache`` in 5.x, ``past_key_values`` in 4.x) and, where the model takes it (4.x),
    ``cache_position`` of ``tokens`` tokens from ``start``: 4.57 computes it from ``get_seq_length()`` otherwise,
    a tensor for a static cache, which dynamo cannot turn into a shape (``generate`` passes it)."""
    params = inspect.signature(model.forward).parameters
    kw = {"cache" if "cache" in params else "past_key_values": cache, "use_cache": True}
    if start is not None and "cache_position" in params:
        kw["cache_position"] = torch.arange(start, start + tokens)
    return kw


def _static_cache(model, cache, slots):
    """transformers 5's ``StaticCache`` or ``PreallocatedCache(static=True)``, ``slots`` tokens per layer."""
    if cache == "transformers":
        return transformers.StaticCache(model.config, slots)
    return PreallocatedCache(slots, static=True)


def _decode(model, step, ids, full_pos, full_mask, n, cache):
    """Eager prefill of ``n`` tokens into ``cache``, then the other ids one a step through ``step``; logits.

    Each step's ``tpe_mask`` covers all the static cache's slots (``(B, S)``, one shape for every step).
    """
    model(ids[:, :n], tpe_positions=full_pos[..., :n], tpe_mask=full_mask[:, :n], **_cache_kw(model, cache, 0, n))
    out = []
    for i in range(n, ids.shape[1]):
        kw = {"tpe_positions": full_pos[..., i : i + 1], "tpe_mask": full_mask, **_cache_kw(model, cache, i)}
        out.append(step(ids[:, i : i + 1], **kw).logits)
    return torch.cat(out, 1)


def test_prefill_compiles_without_graph_breaks():
    # the forward without a cache (training, prefill): the permuted multi-order path, with and without padding
    model = tpe_causal_lm("llama")
    ids, full_pos, full_mask, _ = _prompt(new=0)
    with torch.no_grad():
        dynamo.reset()
        dynamo.utils.counters.clear()
        compiled = torch.compile(model, backend="eager", fullgraph=True, dynamic=False)
        for mask in (full_mask, None):
            kw = {"tpe_positions": full_pos, "tpe_mask": mask, "use_cache": False}
            torch.testing.assert_close(compiled(ids, **kw).logits, model(ids, **kw).logits, rtol=0, atol=1e-6)
    assert _graphs() == 2 and not dynamo.utils.counters["graph_break"]  # one graph with the mask, one without


STATIC = [
    pytest.param("transformers", marks=needs_static),  # transformers 5's StaticCache
    "preallocated",  # PreallocatedCache(static=True): 4.57.1 and 5.x
]


@pytest.mark.parametrize("cache", STATIC)
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_static_cache_decode_step_is_one_graph_and_equals_eager(kind, cache):
    model = tpe_causal_lm(kind)
    ids, full_pos, full_mask, n = _prompt(new=5)
    slots = ids.shape[1]
    with torch.no_grad():
        full = model(ids, tpe_positions=full_pos, tpe_mask=full_mask).logits[:, n:]
        eager = _decode(model, model, ids, full_pos, full_mask, n, _static_cache(model, cache, slots))
        dynamo.reset()
        dynamo.utils.counters.clear()
        compiled = torch.compile(model, backend="eager", fullgraph=True, dynamic=False)  # a graph break raises
        made = _static_cache(model, cache, slots)
        first = _decode(model, compiled, ids[:, : n + 1], full_pos, full_mask, n, made)  # compiles
        frames = _graphs()
        with dynamo.config.patch(error_on_recompile=True):  # the 4 later steps run the same graph
            rest = []
            for i in range(n + 1, slots):
                kw = {"tpe_positions": full_pos[..., i : i + 1], "tpe_mask": full_mask, **_cache_kw(model, made, i)}
                rest.append(compiled(ids[:, i : i + 1], **kw).logits)
    assert frames == 1 and _graphs() == 1
    assert not dynamo.utils.counters["graph_break"]
    steps = torch.cat([first, *rest], 1)
    torch.testing.assert_close(steps, eager, rtol=0, atol=1e-6)
    real = full_mask[:, n:]
    torch.testing.assert_close(eager[real], full[real], rtol=0, atol=1e-5)  # the static decode path is 2D-TPE's rule


@pytest.mark.parametrize("cache", [pytest.param("implementation", marks=needs_static), "preallocated"])
def test_compiled_generate_with_a_static_cache_equals_eager_and_compiles_once(cache):
    config = getattr(transformers, "CompileConfig", None) or transformers.generation.CompileConfig
    model = tpe_causal_lm("llama")
    ids, full_pos, full_mask, n = _prompt(new=0)
    kw = {"tpe_positions": full_pos, "tpe_mask": full_mask, "max_new_tokens": 6, "do_sample": False}
    compile_config = config(backend="eager", fullgraph=True, dynamic=False)
    compile_config._compile_all_devices = True  # transformers' switch to auto-compile on CPU (for tests)

    def static():  # cache_implementation="static" (5.x) or a PreallocatedCache(static=True) of prompt + 6 slots
        if cache == "implementation":
            return {"cache_implementation": "static"}
        return {k: v for k, v in _cache_kw(model, PreallocatedCache(n + 6, static=True)).items() if k != "use_cache"}

    with torch.no_grad():
        eager = model.generate(ids, **static(), **kw)
        dynamo.reset()
        dynamo.utils.counters.clear()
        out = model.generate(ids, compile_config=compile_config, **static(), **kw)
        frames = _graphs()
        dynamic = model.generate(ids, **kw)
    assert torch.equal(out, eager) and torch.equal(out, dynamic)
    assert len(set(out[:, n:].flatten().tolist())) > 2
    assert frames == 1 and not dynamo.utils.counters["graph_break"]  # 5 decode steps, one capture


@pytest.mark.parametrize("cache", STATIC)
def test_static_cache_takes_the_mask_of_its_slots_or_of_the_tokens_so_far(cache):
    model = tpe_causal_lm("llama")
    ids, full_pos, full_mask, n = _prompt(new=2)
    slots = n + 6  # room left after the last step
    padded = torch.cat([full_mask, torch.ones(2, slots - n - 2, dtype=torch.bool)], 1)  # (B, S)
    with torch.no_grad():
        full = model(ids, tpe_positions=full_pos, tpe_mask=full_mask).logits[:, n:]
        for width in ("slots", "tokens"):  # (B, S), as generate passes it / (B, T), eager only
            made = _static_cache(model, cache, slots)
            model(
                ids[:, :n], tpe_positions=full_pos[..., :n], tpe_mask=full_mask[:, :n], **_cache_kw(model, made, 0, n)
            )
            steps = []
            for i in (n, n + 1):
                mask = padded if width == "slots" else full_mask[:, : i + 1]
                kw = {"tpe_positions": full_pos[..., i : i + 1], "tpe_mask": mask, **_cache_kw(model, made, i)}
                steps.append(model(ids[:, i : i + 1], **kw).logits)
            torch.testing.assert_close(torch.cat(steps, 1), full, rtol=0, atol=1e-5)
        kw = {"tpe_positions": full_pos[..., -1:], "tpe_mask": full_mask, **_cache_kw(model, made, n + 2)}
        with pytest.raises(ValueError, match=rf"tpe_mask must be \(B, T\) = \(2, {n + 3}\) or \(2, {slots}\) bool"):
            model(ids[:, -1:], **kw)
        # compiled, the count is a tensor: only the (B, S) mask can be checked; the growing one stops the capture
        # (dynamo reports the ValueError it observed as Unsupported under fullgraph=True)
        dynamo.reset()
        compiled = torch.compile(model, backend="eager", fullgraph=True, dynamic=False)
        with pytest.raises(Exception, match=rf"tpe_mask must be \(B, S\) = \(2, {slots}\) bool .*torch.compile"):
            compiled(ids[:, -1:], **kw)


@pytest.mark.parametrize("cache", [*STATIC, "preallocated-unknown"])
def test_eager_static_decode_step_reads_no_tensor_on_the_host(cache, monkeypatch):
    # the layer takes a static layer's count as a tensor in eager mode too (was: int() per layer and step, a host
    # sync on a GPU): with int() / .item() / .tolist() / __index__ of every tensor refused, a decode step runs.
    # PreallocatedCache(static=True) also counts on the host in eager mode, so the step attends over the T filled
    # slots (as a dynamic cache); with that count unknown (as a compiled update leaves it) or with transformers'
    # StaticCache, over all S slots, masked: the same logits
    model = tpe_causal_lm("qwen2")
    ids, full_pos, full_mask, n = _prompt(new=2)
    slots = ids.shape[1] + 3
    made = _static_cache(model, cache.split("-")[0], slots)
    with torch.no_grad():
        full = model(ids, tpe_positions=full_pos, tpe_mask=full_mask).logits[:, n:]
        model(ids[:, :n], tpe_positions=full_pos[..., :n], tpe_mask=full_mask[:, :n], **_cache_kw(model, made, 0, n))
        if cache == "preallocated-unknown":
            for layer in made.layers:
                layer._seen = None
        kws = [
            {"tpe_positions": full_pos[..., i : i + 1], "tpe_mask": full_mask[:, : i + 1], **_cache_kw(model, made, i)}
            for i in (n, n + 1)
        ]
        if cache != "preallocated":  # the count is a tensor: the growing (B, T) mask would need a read; (B, S)
            kws = [{**kw, "tpe_mask": torch.cat([full_mask, full_mask.new_ones(2, 3)], 1)} for kw in kws]

        def refuse(*args, **kwargs):
            raise AssertionError("a tensor was read on the host")

        widths = []
        sdpa = torch.nn.functional.scaled_dot_product_attention

        def spy(q, k, *args, **kwargs):  # the key slots each attention call reads
            widths.append(k.shape[-2])
            return sdpa(q, k, *args, **kwargs)

        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
        for name in ("__int__", "__index__", "item", "tolist"):
            monkeypatch.setattr(torch.Tensor, name, refuse)
        steps = [model(ids[:, i : i + 1], **kw).logits for i, kw in zip((n, n + 1), kws)]
        monkeypatch.undo()
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=0, atol=1e-5)
    layers = len(made.layers)
    want = [n + 1] * 2 * layers + [n + 2] * 2 * layers if cache == "preallocated" else [slots] * 4 * layers
    assert widths == want  # two orders, every layer, two steps


def test_static_preallocated_cache_refuses_what_does_not_fit():
    model = tpe_causal_lm("llama")
    ids, full_pos, full_mask, n = _prompt(new=1)
    with pytest.raises(ValueError, match=r"capacity must be a positive int with static=True.*got None"):
        PreallocatedCache(static=True)
    with pytest.raises(TypeError, match=r"static must be a bool \(True or False\), got 'yes'"):
        PreallocatedCache(8, static="yes")
    gen = {"tpe_positions": full_pos[..., :n], "tpe_mask": full_mask[:, :n], "max_new_tokens": 4, "do_sample": False}
    with torch.no_grad():
        small = PreallocatedCache(n - 1, static=True)
        with pytest.raises(ValueError, match=rf"capacity={n - 1}, static=True\) cannot hold the {n} tokens"):
            model(
                ids[:, :n], tpe_positions=full_pos[..., :n], tpe_mask=full_mask[:, :n], **_cache_kw(model, small, 0, n)
            )
        made = PreallocatedCache(n, static=True)  # the prompt fits, the next token does not
        model(ids[:, :n], tpe_positions=full_pos[..., :n], tpe_mask=full_mask[:, :n], **_cache_kw(model, made, 0, n))
        kw = {"tpe_positions": full_pos[..., n:], "tpe_mask": full_mask[:, :n], **_cache_kw(model, made, n)}
        with pytest.raises(ValueError, match=rf"PreallocatedCache\(capacity={n}, static=True\) is full: 1 more token"):
            model(ids[:, n:], **kw)
        assert int(made.get_seq_length()) == n  # nothing written
        # generate checks each step on the host before the forward: room for 2 of the 4 new tokens
        name = next(k for k in _cache_kw(model, None) if k != "use_cache")
        with pytest.raises(ValueError, match=rf"the static cache holds {n + 2} tokens: {n + 2} cached and 1 new"):
            model.generate(ids[:, :n], **gen, **{name: PreallocatedCache(n + 2, static=True)})


@pytest.mark.slow  # 10-30 s on a loaded 2-core machine: dynamo traces the whole model
def test_preallocated_cache_decodes_under_compile():
    # no graph break (fullgraph=True), but its keys grow by a token a step (views of the first T slots, as
    # transformers' DynamicCache concatenates), so each step is a new shape (a new graph); results as eager
    model = tpe_causal_lm("qwen2")
    ids, full_pos, full_mask, n = _prompt(new=1)
    with torch.no_grad():
        dynamo.reset()
        compiled = torch.compile(model, backend="eager", fullgraph=True, dynamic=False)
        out = []
        for step in (model, compiled):
            kw = _cache_kw(model, PreallocatedCache(capacity=ids.shape[1]))
            model(ids[:, :n], tpe_positions=full_pos[..., :n], tpe_mask=full_mask[:, :n], **kw)
            out.append(step(ids[:, n:], tpe_positions=full_pos[..., n:], tpe_mask=full_mask, **kw).logits)
    torch.testing.assert_close(out[1], out[0], rtol=0, atol=1e-6)
