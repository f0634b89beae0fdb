"""2D-TPE decoding under ``torch.compile``: a static cache's decode step is one graph (no break, no recompile).

CPU, backend ``"eager"`` (dynamo's graph capture without code generation): what is checked is the
capture -- ``fullgraph=True`` (a graph break raises), ``error_on_recompile`` after the first step --
and that the compiled steps give the eager steps' logits and tokens.
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


def _cache_kw(model, cache):
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"  # 5.x / 4.x
    return {name: cache, "use_cache": True}


def _decode(model, step, ids, full_pos, full_mask, n, cache):
    """Eager prefill of ``n`` tokens into ``cache``, then the other ids one a step through ``step``; logits.

    Each step's ``tpe_mask`` covers all the static cache's slots (``(B, S)``, one shape for every step).
    """
    kw = _cache_kw(model, cache)
    model(ids[:, :n], tpe_positions=full_pos[..., :n], tpe_mask=full_mask[:, :n], **kw)
    out = []
    for i in range(n, ids.shape[1]):
        logits = step(ids[:, i : i + 1], tpe_positions=full_pos[..., i : i + 1], tpe_mask=full_mask, **kw).logits
        out.append(logits)
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


@needs_static
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_static_cache_decode_step_is_one_graph_and_equals_eager(kind):
    model = tpe_causal_lm(kind)
    ids, full_pos, full_mask, n = _prompt(new=5)
    slots = ids.shape[1]
    with torch.no_grad():
        full = model(ids, tpe_positions=full_pos, tpe_mask=full_mask).logits[:, n:]
        eager = _decode(model, model, ids, full_pos, full_mask, n, transformers.StaticCache(model.config, slots))
        dynamo.reset()
        dynamo.utils.counters.clear()
        compiled = torch.compile(model, backend="eager", fullgraph=True, dynamic=False)  # a graph break raises
        cache = transformers.StaticCache(model.config, slots)
        first = _decode(model, compiled, ids[:, : n + 1], full_pos, full_mask, n, cache)  # compiles
        frames = _graphs()
        with dynamo.config.patch(error_on_recompile=True):  # the 4 later steps run the same graph
            rest = []
            for i in range(n + 1, slots):
                kw = {"tpe_positions": full_pos[..., i : i + 1], "tpe_mask": full_mask, **_cache_kw(model, cache)}
                rest.append(compiled(ids[:, i : i + 1], **kw).logits)
    assert frames == 1 and _graphs() == 1
    assert not dynamo.utils.counters["graph_break"]
    steps = torch.cat([first, *rest], 1)
    torch.testing.assert_close(steps, eager, rtol=0, atol=1e-6)
    real = full_mask[:, n:]
    torch.testing.assert_close(eager[real], full[real], rtol=0, atol=1e-5)  # the static decode path is 2D-TPE's rule


@needs_static
def test_compiled_generate_with_a_static_cache_equals_eager_and_compiles_once():
    config = getattr(transformers, "CompileConfig", None) or transformers.generation.CompileConfig
    model = tpe_causal_lm("llama")
    ids, full_pos, full_mask, n = _prompt(new=0)
    kw = {"tpe_positions": full_pos, "tpe_mask": full_mask, "max_new_tokens": 6, "do_sample": False}
    compile_config = config(backend="eager", fullgraph=True, dynamic=False)
    compile_config._compile_all_devices = True  # transformers' switch to auto-compile on CPU (for tests)
    with torch.no_grad():
        eager = model.generate(ids, cache_implementation="static", **kw)
        dynamo.reset()
        dynamo.utils.counters.clear()
        out = model.generate(ids, cache_implementation="static", compile_config=compile_config, **kw)
        frames = _graphs()
        dynamic = model.generate(ids, **kw)
    assert torch.equal(out, eager) and torch.equal(out, dynamic)
    assert len(set(out[:, n:].flatten().tolist())) > 2
    assert frames == 1 and not dynamo.utils.counters["graph_break"]  # 5 decode steps, one capture


@needs_static
def test_static_cache_takes_the_mask_of_its_slots_or_of_the_tokens_so_far():
    model = tpe_causal_lm("llama")
    ids, full_pos, full_mask, n = _prompt(new=2)
    slots = n + 6  # room left after the last step
    padded = torch.cat([full_mask, torch.ones(2, slots - n - 2, dtype=torch.bool)], 1)  # (B, S)
    with torch.no_grad():
        full = model(ids, tpe_positions=full_pos, tpe_mask=full_mask).logits[:, n:]
        for width in ("slots", "tokens"):  # (B, S), as generate passes it / (B, T), eager only
            cache = transformers.StaticCache(model.config, slots)
            kw = _cache_kw(model, cache)
            model(ids[:, :n], tpe_positions=full_pos[..., :n], tpe_mask=full_mask[:, :n], **kw)
            steps = []
            for i in (n, n + 1):
                mask = padded if width == "slots" else full_mask[:, : i + 1]
                steps.append(
                    model(ids[:, i : i + 1], tpe_positions=full_pos[..., i : i + 1], tpe_mask=mask, **kw).logits
                )
            torch.testing.assert_close(torch.cat(steps, 1), full, rtol=0, atol=1e-5)
        with pytest.raises(ValueError, match=rf"tpe_mask must be \(B, T\) = \(2, {n + 3}\) or \(2, {slots}\) bool"):
            model(ids[:, -1:], tpe_positions=full_pos[..., -1:], tpe_mask=full_mask, **kw)
        # compiled, the count is a tensor: only the (B, S) mask can be checked; the growing one stops the capture
        # (dynamo reports the ValueError it observed as Unsupported under fullgraph=True)
        dynamo.reset()
        compiled = torch.compile(model, backend="eager", fullgraph=True, dynamic=False)
        with pytest.raises(Exception, match=rf"tpe_mask must be \(B, S\) = \(2, {slots}\) bool .*torch.compile"):
            compiled(ids[:, -1:], tpe_positions=full_pos[..., -1:], tpe_mask=full_mask, **kw)


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
