"""``use_rope(model, "circlerope", age=...)`` without host syncs: the prefill and the decoding steps of a tiny
Qwen2.5-VL under AGE trace with ``torch.compile(fullgraph=True)`` (a ``.item()``, ``int()`` of a tensor or
``torch.equal`` in the forward is a graph break, which ``fullgraph`` raises, or a ``.item()`` that dynamo keeps in the
graph: :func:`_no_sync_backend` refuses those), with a ``DynamicCache`` (a Python length) and a ``StaticCache`` (a
tensor length), and give the logits of the eager full forward. The backend runs dynamo's graph as traced (no code
generation)."""

import inspect

import pytest
import torch

transformers = pytest.importorskip("transformers")
from _tiny_hf import full_forward_inputs
from test_hf_rope_age import _index_args, _inputs, _model
from transformers import DynamicCache, StaticCache

from mmpos.integrations.hf_rope import use_rope
from mmpos.integrations.hf_rope_index import installed_rule
from mmpos.schemes import RULES

pytestmark = pytest.mark.hf
CACHES = ["dynamic", "static"]


#: FX targets that read a tensor's value on the host (a device sync): dynamo keeps ``int(t)`` / ``t.item()`` in the
#: graph as ``item`` (a graph break only where the value steers Python code)
HOST_READS = ("item", "tolist", "_local_scalar_dense", "equal")


def _no_sync_backend(graph: torch.fx.GraphModule, example_inputs):
    """A ``torch.compile`` backend that runs ``graph`` as traced, after checking it reads no tensor on the host."""
    reads = [str(n.target) for n in graph.graph.nodes if str(n.target).rsplit(".", 1)[-1] in HOST_READS]
    assert not reads, f"host reads of tensors in the compiled forward: {reads}"
    return graph


def _compiled(fn):
    """``fn`` compiled whole (``fullgraph``) through :func:`_no_sync_backend`; dynamo's caches cleared first (each test
    builds its own model: the guards of the last test's would count as recompiles of the same code)."""
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, backend=_no_sync_backend)


def _cache(model, kind: str):
    if kind == "dynamic":
        return DynamicCache()
    if "max_batch_size" in inspect.signature(StaticCache).parameters:  # transformers 4.x
        return StaticCache(config=model.config, max_batch_size=2, max_cache_len=40)
    return StaticCache(config=model.config, max_cache_len=40)


def _call(module, cache, positions: torch.Tensor, **kwargs):
    """``module(**kwargs)`` with ``cache`` under the release's name; transformers 4.x also gets ``cache_position``
    (its text model otherwise counts a static cache's filled slots, a data-dependent size)."""
    params = inspect.signature(module.forward).parameters
    key = "cache" if "cache" in params else "past_key_values"
    if "cache_position" in params:
        kwargs["cache_position"] = positions
    return module(**kwargs, use_cache=True, **{key: cache})


def _age_model():
    model, inputs = _model("qwen2.5-vl"), _inputs("qwen2.5-vl")
    use_rope(model, "circlerope", age="strategy_4")
    return model, inputs


def _prompt_embeddings(model, inputs: dict) -> torch.Tensor:
    """The text model's ``inputs_embeds`` ``(B, L, D)`` of ``inputs`` (vision features in place), read in a forward."""
    seen = {}
    text = model.model.language_model
    handle = text.register_forward_pre_hook(lambda m, a, k: seen.update(k), with_kwargs=True)
    try:
        model(**inputs)
    finally:
        handle.remove()
    return seen["inputs_embeds"]


@torch.no_grad()
@pytest.mark.parametrize("kind", CACHES)
def test_prefill_compiles_without_graph_breaks_and_chunks_give_the_same_states(kind):
    """The prompt through the compiled text model (the index ran first, as ``generate`` runs it) gives the AGE
    logits of the eager forward; the same prompt in two chunks gives the same hidden states (the own layers read the
    rest of the prompt's own ids at the cache's length)."""
    model, inputs = _age_model()
    want = model(**inputs).logits
    embeds = _prompt_embeddings(model, inputs)
    text, length = model.model.language_model, inputs["input_ids"].shape[1]
    ids, _ = model.model.get_rope_index(inputs["input_ids"], **_index_args(inputs))
    mask = inputs["attention_mask"]

    def prefill(embeds, ids, mask, cache):
        out = _call(text, cache, torch.arange(length), inputs_embeds=embeds, position_ids=ids, attention_mask=mask)
        return out.last_hidden_state

    states = _compiled(prefill)(embeds, ids, mask, _cache(model, kind))
    torch.testing.assert_close(model.lm_head(states), want, rtol=1e-5, atol=1e-5)
    model.model.get_rope_index(inputs["input_ids"], **_index_args(inputs))
    cache, cut = _cache(model, kind), 10
    first = _call(text, cache, torch.arange(cut), inputs_embeds=embeds[:, :cut], position_ids=ids[..., :cut],
                  attention_mask=mask[:, :cut]).last_hidden_state  # fmt: skip
    rest = _call(text, cache, torch.arange(cut, length), inputs_embeds=embeds[:, cut:], position_ids=ids[..., cut:],
                 attention_mask=mask).last_hidden_state  # fmt: skip
    torch.testing.assert_close(torch.cat([first, rest], 1), states, rtol=1e-5, atol=1e-5)


def _next_position(model, mask: torch.Tensor) -> torch.Tensor:
    """The ``(3, B, 1)`` position ids of the token after ``mask``'s last, from the model's ``rope_deltas`` as the
    release's ``generate`` places it (its rule: the padded length, or the real length with ``max-real`` deltas)."""
    real = RULES[installed_rule()].deltas == "max-real"
    text = mask.sum(-1, keepdim=True) - 1 if real else torch.full_like(mask[:, :1], mask.shape[1] - 1)
    return (text + model.model.rope_deltas).view(1, -1, 1).expand(3, -1, 1)


def assert_compiled_decoding_is_a_full_forward(model, inputs: dict, kind: str, steps: int = 3) -> None:
    """An eager prefill with a ``kind`` cache, then ``steps`` greedy steps of the whole model compiled with
    ``fullgraph=True`` (:func:`_no_sync_backend`): their logits are those of one eager forward over the generated
    sequence (to 1e-4, the cache's order of float sums)."""
    length = inputs["input_ids"].shape[1]
    cache = _cache(model, kind)
    logits = [_call(model, cache, torch.arange(length), **inputs).logits[:, -1]]

    def step(token, ids, mask, cache, at):
        return _call(model, cache, at, input_ids=token, position_ids=ids, attention_mask=mask).logits[:, -1]

    compiled = _compiled(step)
    mask, tokens = inputs["attention_mask"], []
    for i in range(steps):
        tokens.append(logits[-1].argmax(-1, keepdim=True))
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
        torch._dynamo.maybe_mark_dynamic(mask, 1)  # one trace for the steps where the model allows it
        logits.append(compiled(tokens[-1], _next_position(model, mask), mask, cache, torch.tensor([length + i])))
    sequences = torch.cat([inputs["input_ids"], *tokens], 1)
    full = model(**full_forward_inputs(inputs, sequences, steps)).logits[:, length - 1 :]
    torch.testing.assert_close(torch.stack(logits, 1), full, rtol=1e-4, atol=1e-4)


@torch.no_grad()
@pytest.mark.parametrize("kind", CACHES)
def test_decoding_steps_compile_without_graph_breaks_and_equal_a_full_forward(kind):
    assert_compiled_decoding_is_a_full_forward(*_age_model(), kind)


@torch.no_grad()
def test_a_reset_static_cache_takes_a_text_prompt_in_one_layout():
    """After a vision prompt and a decoding step, the static cache is reset (its length a tensor, 0) and a text
    prompt runs: every layer reads its text positions (the model's own logits), not the vision prompt's own ids."""
    model, inputs = _age_model()
    length = inputs["input_ids"].shape[1]
    cache = _cache(model, "static")
    token = _call(model, cache, torch.arange(length), **inputs).logits[:, -1:].argmax(-1)
    mask = torch.cat([inputs["attention_mask"], torch.ones_like(token)], 1)
    _call(model, cache, torch.tensor([length]), input_ids=token, position_ids=_next_position(model, mask),
          attention_mask=mask)  # fmt: skip
    cache.reset()
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11], [0, 0, 3, 4, 5, 6, 7]])
    prompt = {"input_ids": ids, "attention_mask": (ids != 0).long()}
    swapped = _call(model, cache, torch.arange(7), **prompt).logits
    use_rope(model, "own")
    torch.testing.assert_close(swapped, model(**prompt).logits, rtol=1e-5, atol=1e-5)


@torch.no_grad()
@pytest.mark.skipif(
    installed_rule() != "hf-5.3",
    reason="transformers < 5.3 runs get_rope_index (host reads of the ids, its own code) in every prefill forward",
)
def test_a_text_forward_after_a_vision_prompt_compiles_without_host_reads():
    """A text forward without position ids (the model's own text positions; the index does not run) after a vision
    prompt: no value check of the ids (the old code compared their rows, a graph break), every layer on the text
    positions (the model's own logits)."""
    model, inputs = _age_model()
    model(**inputs)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11], [0, 0, 3, 4, 5, 6, 7]])
    mask = (ids != 0).long()
    swapped = _compiled(lambda ids, mask: model(input_ids=ids, attention_mask=mask).logits)(ids, mask)
    use_rope(model, "own")
    torch.testing.assert_close(swapped, model(input_ids=ids, attention_mask=mask).logits, rtol=1e-5, atol=1e-5)
