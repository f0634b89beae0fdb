"""``model.generate`` on a 2D-TPE model equals a loop of full forwards (no cache), token for token."""

import inspect

import pytest
import torch

transformers = pytest.importorskip("transformers")

from _tiny_hf import tpe_causal_lm

from mmpos.integrations.hf_tpe import PreallocatedCache, uninstall_tpe
from mmpos.layout import Text
from mmpos.table import Table, build

pytestmark = pytest.mark.hf  # run on the oldest and the newest supported transformers

SHIFT = 5  # prompt positions start at 5: the next position is not the sequence length


def _prompt(batch):
    """A left-padded batch of tables: positions ``(2, B, L)`` (+ SHIFT), mask ``(B, L)``, ids (0 on padding)."""
    samples = [[Text(2), Table.grid(2, 3), Text(2)], [Text(1), Table(((1, 2), (2,), (1, 1))), Text(1)]][:batch]
    layout = build(samples, orders=("row", "col"), padding_side="left")
    pos, mask = layout.order_coords.pos.permute(2, 0, 1).long() + SHIFT, layout.mask
    torch.manual_seed(1)
    ids = torch.randint(1, 64, mask.shape).masked_fill(~mask, 0)
    return ids, pos, mask, layout.next_position + SHIFT


def _full_forwards(model, ids, pos, mask, nxt, new):
    """Greedy decoding by full forwards without a cache: token j at ``next_position + j`` in both orders."""
    seq = ids
    for j in range(new):
        gen = (nxt[:, None] + torch.arange(j)).expand(2, -1, -1)  # (2, B, j)
        full_pos = torch.cat([pos.expand(-1, ids.shape[0], -1), gen], -1)
        full_mask = torch.cat([mask, torch.ones(ids.shape[0], j, dtype=torch.bool)], 1)
        logits = model(seq, tpe_positions=full_pos, tpe_mask=full_mask).logits[:, -1]
        seq = torch.cat([seq, logits.argmax(-1, keepdim=True)], 1)
    return seq


def _cache_name(model):
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"  # 5.x / 4.x


def _static_layers_size_values_apart():
    """Feature detection: transformers 5's static layers allocate keys and values from their own shapes."""
    static = getattr(transformers.cache_utils, "StaticLayer", None)
    return static is not None and "value_states" in inspect.signature(static.lazy_initialization).parameters


@pytest.mark.parametrize("cache", ["dynamic", "preallocated", "preallocated-static", "static"])
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_greedy_generate_equals_full_forwards(kind, cache):
    model = tpe_causal_lm(kind)
    ids, pos, mask, nxt = _prompt(2)
    n = ids.shape[1]
    new = 6
    made = {
        "dynamic": None,
        "preallocated": PreallocatedCache(capacity=n + 2),  # doubles once while generating
        "preallocated-static": PreallocatedCache(capacity=n + new + 3, static=True),  # 4.57.1 and 5.x
        "static": transformers.StaticCache(config=model.config, max_cache_len=n + new),
    }[cache]
    kw = {"max_new_tokens": new, "do_sample": False, "tpe_positions": pos, "tpe_mask": mask}
    kw.update({} if made is None else {_cache_name(model): made})
    with torch.no_grad():
        ref = _full_forwards(model, ids, pos, mask, nxt, new)
        if cache == "static" and not _static_layers_size_values_apart():  # transformers 4.x StaticCache
            with pytest.raises(ValueError, match="StaticCache before 5.*PreallocatedCache"):
                model.generate(ids, **kw)
            return
        out = model.generate(ids, **kw)
    assert torch.equal(out, ref)
    assert len(set(out[:, n:].flatten().tolist())) > 2  # the generated tokens are not one repeated token
    if cache == "preallocated":
        layer = made.layers[0]
        assert made.get_seq_length() == n + new - 1 and layer._key_buffer.shape[2] == 2 * (n + 2)
        assert layer.keys.shape[-1] == 2 * layer.values.shape[-1]  # the keys of both orders side by side
    if cache == "preallocated-static":  # all the slots, a tensor count
        layer = made.layers[0]
        assert isinstance(made.get_seq_length(), torch.Tensor) and int(made.get_seq_length()) == n + new - 1
        assert layer.keys.shape[2] == layer.values.shape[2] == n + new + 3
        assert layer.keys.shape[-1] == 2 * layer.values.shape[-1]


def test_static_preallocated_cache_beams_and_reuse():
    # beams reorder the static layers in place; a reset cache decodes again (its prefill then runs the cached path
    # over all slots, the count being a tensor) -- as transformers 5 reuses its own StaticCache between calls
    model = tpe_causal_lm("llama")
    ids, pos, mask, nxt = _prompt(2)
    n, name = ids.shape[1], _cache_name(model)
    kw = {"tpe_positions": pos, "tpe_mask": mask, "max_new_tokens": 4, "do_sample": False}
    with torch.no_grad():
        ref = _full_forwards(model, ids, pos, mask, nxt, 4)
        beams_ref = model.generate(ids, num_beams=2, use_cache=False, **kw)
        beams = model.generate(ids, num_beams=2, **kw, **{name: PreallocatedCache(n + 4, static=True)})
        cache = PreallocatedCache(n + 4, static=True)
        first = model.generate(ids, **kw, **{name: cache})
        cache.reset()
        again = model.generate(ids, **kw, **{name: cache})
        twice = []
        if _static_layers_size_values_apart():  # transformers 5 keeps and resets its StaticCache between calls
            twice = [model.generate(ids, cache_implementation="static", **kw) for _ in range(2)]
    assert torch.equal(beams, beams_ref)
    assert torch.equal(first, ref) and torch.equal(again, ref)
    assert all(torch.equal(t, ref) for t in twice)


def test_generated_positions_follow_the_next_position_not_the_sequence_length():
    # one sample, no padding, positions shifted: generating at sequence index L + j (a plain model's rule)
    # gives other tokens than next_position + j, so this comparison can tell the two apart
    model = tpe_causal_lm("llama")
    ids, pos, mask, nxt = _prompt(1)
    with torch.no_grad():
        out = model.generate(ids, tpe_positions=pos, max_new_tokens=6, do_sample=False)
        ref = _full_forwards(model, ids, pos, mask, nxt, 6)
        wrong = _full_forwards(model, ids, pos, mask, torch.tensor([ids.shape[1]]), 6)
    assert torch.equal(out, ref) and not torch.equal(out, wrong)


def test_generate_reads_order_coords_padding_from_attention_mask_and_no_cache():
    model = tpe_causal_lm("qwen2")
    layout = build([[Text(1), Table.grid(2, 2)], [Text(3), Table.grid(3, 2), Text(1)]], ("row", "col"), "left")
    pos, mask = layout.order_coords.pos.permute(2, 0, 1).long(), layout.mask
    ids = torch.randint(1, 64, mask.shape).masked_fill(~mask, 0)
    with torch.no_grad():
        ref = _full_forwards(model, ids, pos, mask, layout.next_position, 5)
        coords = model.generate(
            ids, tpe_positions=layout.order_coords, tpe_mask=mask, max_new_tokens=5, do_sample=False
        )
        # no tpe_mask: the padding is read from the attention_mask that generate keeps and grows
        att = model.generate(ids, attention_mask=mask.long(), tpe_positions=pos, max_new_tokens=5, do_sample=False)
        nocache = model.generate(
            ids, tpe_positions=pos, tpe_mask=mask, max_new_tokens=5, do_sample=False, use_cache=False
        )
    assert torch.equal(coords, ref) and torch.equal(att, ref) and torch.equal(nocache, ref)


def test_sampled_sequences_per_prompt_equal_the_repeated_prompt():
    # num_return_sequences repeats the batch (dim 0 of every kwarg in transformers); tpe_positions has it in dim 1
    model = tpe_causal_lm("llama")
    ids, pos, mask, _ = _prompt(2)
    kw = {"max_new_tokens": 4, "do_sample": True, "top_k": 0}
    with torch.no_grad():
        torch.manual_seed(3)
        out = model.generate(ids, tpe_positions=pos, tpe_mask=mask, num_return_sequences=3, **kw)
        torch.manual_seed(3)
        rep = {"tpe_positions": pos.repeat_interleave(3, 1), "tpe_mask": mask.repeat_interleave(3, 0)}
        ref = model.generate(ids.repeat_interleave(3, 0), **rep, **kw)
        beams = model.generate(ids, tpe_positions=pos, tpe_mask=mask, num_beams=2, max_new_tokens=4, do_sample=False)
        beams_nocache = model.generate(
            ids, tpe_positions=pos, tpe_mask=mask, num_beams=2, max_new_tokens=4, do_sample=False, use_cache=False
        )
    assert out.shape[0] == 6 and torch.equal(out, ref)
    assert torch.equal(beams, beams_nocache)


def test_generate_errors_name_the_argument():
    model = tpe_causal_lm("llama")
    ids, pos, mask, _ = _prompt(2)
    kw, n = {"max_new_tokens": 2, "do_sample": False}, ids.shape[1]
    with torch.no_grad():
        with pytest.raises(ValueError, match=r"needs tpe_positions=\(K, B, L\)"):
            model.generate(ids, **kw)
        with pytest.raises(
            ValueError, match=rf"tpe_positions \(2, 2, {n - 1}\) must be \(K=2, B, L\).*L = its {n} tokens"
        ):
            model.generate(ids, tpe_positions=pos[..., 1:], tpe_mask=mask, **kw)
        with pytest.raises(ValueError, match=rf"tpe_positions \(2, 3, {n}\) must be .*B = 1 or 2"):
            model.generate(ids, tpe_positions=torch.cat([pos, pos[:, :1]], 1), tpe_mask=mask, **kw)
        with pytest.raises(ValueError, match=rf"tpe_positions must be a \(K=2, B, L\) tensor.*got \(1, 2, {n}\)"):
            model.generate(ids, tpe_positions=pos[:1], tpe_mask=mask, **kw)
        with pytest.raises(
            ValueError, match=rf"tpe_mask must be \(2, {n}\) bool for the prompt of generate, got \(2, {n - 1}\)"
        ):
            model.generate(ids, tpe_positions=pos, tpe_mask=mask[:, 1:], **kw)
        with pytest.raises(ValueError, match="tpe_positions.*grid coordinates"):
            layout = build([[Text(2), Table.grid(2, 2)]], ("row", "col"))
            model.generate(ids[:1, -layout.mask.shape[1] :], tpe_positions=layout.grid_coords, **kw)
        with pytest.raises(ValueError, match=rf"tpe_mask must be \(B, T\) = \(2, {n}\) bool .*got \(2, {n - 1}\)"):
            model(ids, tpe_positions=pos, tpe_mask=mask[:, 1:])  # the layer checks a forward's mask as well


def test_uninstall_restores_generate():
    model = tpe_causal_lm("llama")
    ids = torch.randint(1, 64, (1, 6))
    uninstall_tpe(model)
    assert (
        "prepare_inputs_for_generation" not in model.__dict__ and "_expand_inputs_for_generation" not in model.__dict__
    )
    with torch.no_grad():
        model.generate(ids, max_new_tokens=2, do_sample=False)  # a plain model again
        with pytest.raises(ValueError, match="tpe_positions"):  # generate no longer knows the argument
            model.generate(ids, tpe_positions=torch.arange(6).expand(2, 1, 6), max_new_tokens=2)


def test_generate_continues_a_cache_that_holds_the_prompt_up_to_its_last_text():
    model = tpe_causal_lm("llama")
    ids, pos, mask, nxt = _prompt(2)
    n, name = ids.shape[1], _cache_name(model)
    with torch.no_grad():
        ref = _full_forwards(model, ids, pos, mask, nxt, 4)
        for cached, ok in ((n - 1, True), (n - 4, False)):  # the last text token / inside the second table
            cache = PreallocatedCache()
            model(
                ids[:, :cached],
                tpe_positions=pos[..., :cached],
                tpe_mask=mask[:, :cached],
                use_cache=True,
                **{name: cache},
            )
            kw = {"tpe_positions": pos, "tpe_mask": mask, name: cache, "max_new_tokens": 4, "do_sample": False}
            if ok:
                assert torch.equal(model.generate(ids, **kw), ref)
            else:
                with pytest.raises(ValueError, match=r"tpe_positions: the cache holds \d+ of the prompt's"):
                    model.generate(ids, **kw)


def test_generate_from_inputs_embeds_and_static_cache_by_name():
    model = tpe_causal_lm("qwen2")
    ids, pos, mask, nxt = _prompt(2)
    n = ids.shape[1]
    kw = {"tpe_positions": pos, "tpe_mask": mask, "max_new_tokens": 4, "do_sample": False}
    with torch.no_grad():
        ref = _full_forwards(model, ids, pos, mask, nxt, 4)
        embeds = model.get_input_embeddings()(ids)
        assert torch.equal(model.generate(inputs_embeds=embeds, **kw), ref[:, n:])  # only the new tokens, as HF
        if _static_layers_size_values_apart():
            assert torch.equal(model.generate(ids, cache_implementation="static", **kw), ref)


def test_copies_generate_with_their_own_hooks():
    import copy
    import pickle

    model = tpe_causal_lm("llama")
    ids, pos, mask, _ = _prompt(2)
    kw = {"tpe_positions": pos, "tpe_mask": mask, "max_new_tokens": 3, "do_sample": False}
    with torch.no_grad():
        ref = model.generate(ids, **kw)
        for clone in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
            assert clone.prepare_inputs_for_generation.model is clone
            assert torch.equal(clone.generate(ids, **kw), ref)


def test_generate_continues_a_cache_that_holds_the_text_before_the_table():
    # the rest of the prompt, fed after the cached text, holds the table: its tokens attend to each other in each
    # order's traversal (the column order is not the sequence order), as in a forward without a cache
    model = tpe_causal_lm("qwen2")
    ids, pos, mask, nxt = _prompt(1)
    name = _cache_name(model)
    with torch.no_grad():
        ref = _full_forwards(model, ids, pos, mask, nxt, 4)
        cache = PreallocatedCache()
        prefix = model(ids[:, :2], tpe_positions=pos[..., :2], use_cache=True, **{name: cache}).logits
        rest = model(ids[:, 2:], tpe_positions=pos[..., 2:], use_cache=True, **{name: cache}).logits
        full = model(ids, tpe_positions=pos).logits
        torch.testing.assert_close(torch.cat([prefix, rest], 1), full, rtol=0, atol=1e-5)
        outs = []
        for cache in (PreallocatedCache(), PreallocatedCache(ids.shape[1] + 4, static=True)):
            model(ids[:, :2], tpe_positions=pos[..., :2], use_cache=True, **{name: cache})
            outs.append(model.generate(ids, tpe_positions=pos, max_new_tokens=4, do_sample=False, **{name: cache}))
    assert all(torch.equal(out, ref) for out in outs)


@pytest.mark.parametrize("padding", ["tpe_mask", "attention_mask"])
@pytest.mark.parametrize("cache", ["preallocated-static", "static"])
def test_static_generate_decode_steps_read_no_tensor_on_the_host(cache, padding, monkeypatch):
    # the generate hook on a static cache: after the prefill (one read of the count), every step's positions and
    # mask come from the count tensor -- with int() / .item() / .tolist() / __index__ refused during the hook
    if cache == "static" and not _static_layers_size_values_apart():
        pytest.skip("a StaticCache that holds 2D-TPE keys beside values needs transformers 5")
    model = tpe_causal_lm("llama")
    ids, pos, mask, nxt = _prompt(2)
    n, new = ids.shape[1], 5
    made = PreallocatedCache(n + new + 2, static=True) if cache != "static" else None
    hook, guarded = model.prepare_inputs_for_generation, []

    def refuse(*args, **kwargs):
        raise AssertionError("a tensor was read on the host")

    def no_reads(input_ids, *args, tpe_positions=None, tpe_mask=None, **kwargs):  # named: generate checks them
        kwargs.update(tpe_positions=tpe_positions, tpe_mask=tpe_mask)
        if input_ids.shape[1] <= n:  # the prefill
            return hook(input_ids, *args, **kwargs)
        with monkeypatch.context() as patch:
            for name in ("__int__", "__index__", "item", "tolist"):
                patch.setattr(torch.Tensor, name, refuse)
            inputs = hook(input_ids, *args, **kwargs)
        guarded.append(inputs["tpe_mask"].shape)
        return inputs

    kw = {"max_new_tokens": new, "do_sample": False, "tpe_positions": pos}
    kw.update({"tpe_mask": mask} if padding == "tpe_mask" else {"attention_mask": mask.long()})
    kw.update({"cache_implementation": "static"} if made is None else {_cache_name(model): made})
    with torch.no_grad():
        ref = _full_forwards(model, ids, pos, mask, nxt, new)
        model.prepare_inputs_for_generation = no_reads
        out = model.generate(ids, **kw)
    assert torch.equal(out, ref) and len(guarded) == new - 1 and len(set(guarded)) == 1  # every decode step
    slots = guarded[0][1]  # the (B, S) mask of the cache's slots, one shape for every step
    assert slots == n + new + 2 if made is not None else slots >= n + new - 1


def test_generate_from_inputs_embeds_into_a_static_cache_past_the_prompt_length():
    # generate's input_ids then hold the generated tokens only: once they outnumber the prompt, the static decode
    # steps take their positions from the count tensor (the earlier ones read the count): the same tokens throughout
    model = tpe_causal_lm("qwen2")
    ids, pos, mask, nxt = _prompt(2)
    n = ids.shape[1]
    new = n + 3
    kw = {"tpe_positions": pos, "tpe_mask": mask, "max_new_tokens": new, "do_sample": False}
    with torch.no_grad():
        ref = _full_forwards(model, ids, pos, mask, nxt, new)
        embeds = model.get_input_embeddings()(ids)
        cache = PreallocatedCache(n + new, static=True)
        out = model.generate(inputs_embeds=embeds, **kw, **{_cache_name(model): cache})
    assert torch.equal(out, ref[:, n:]) and int(cache.get_seq_length()) == n + new - 1
