"""Tiny random Hugging Face VLMs and batches shared by the ``use_rope`` tests (test_hf_rope*.py): vision-tower
configs of 1-2 blocks, left-padded two-prompt batches and a greedy ``generate`` that returns its per-step logits."""

from __future__ import annotations

import torch

#: a text model of 2 layers, hidden 64, 4 heads (2 KV heads) of 16 channels
TEXT = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
}
#: a Qwen2-VL vision tower (patch 2, merge 2: a 4 x 6-patch image is 6 tokens)
QWEN2_VISION = {
    "depth": 1,
    "embed_dim": 32,
    "hidden_size": 64,
    "num_heads": 2,
    "mlp_ratio": 2,
    "patch_size": 2,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "in_channels": 3,
}
#: a Qwen2.5-VL vision tower (one full-attention block, 2 tokens per second)
QWEN2_5_VISION = {
    "depth": 1,
    "hidden_size": 32,
    "out_hidden_size": 64,
    "intermediate_size": 64,
    "num_heads": 2,
    "patch_size": 2,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "in_channels": 3,
    "window_size": 8,
    "fullatt_block_indexes": [0],
    "tokens_per_second": 2,
}
#: a Qwen3-VL vision tower (also Qwen3.5's, Cosmos3-Omni's, Qwen4-Exp's, Cohere-Compass's)
QWEN3_VISION = {
    "depth": 1,
    "hidden_size": 32,
    "out_hidden_size": 64,
    "num_heads": 2,
    "intermediate_size": 64,
    "patch_size": 2,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "in_channels": 3,
    "num_position_embeddings": 16,
}
#: a SigLIP-style vision tower (PaddleOCR-VL's, Cosmos3-Edge's: add the family's own keys)
SIGLIP_VISION = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "patch_size": 2,
    "spatial_merge_size": 2,
}


#: the schemes the swap tests of the families with their own token layouts (GLM-Image, MiniCPM-V) run: their
#: blocks placed by each rule (mhrope with sections for 2 KV heads)
BLOCK_SWAPS = [
    ("mrope-i", {}),
    ("vrope", {}),
    ("videorope", {}),
    ("circlerope", {}),
    ("flat", {}),
    ("v2pe", {"delta": 0.5}),
    ("hope", {"temporal_scale": 0.5}),
    ("mhrope", {"head_sections": [0, 1, 1]}),
    ("grape", {}),
    ("grape-i", {}),
]


def tiny_causal_lm(kind: str, **config):
    """A tiny random ``LlamaForCausalLM`` (``kind="llama"``) or ``Qwen2ForCausalLM`` (``"qwen2"``): 2 layers, hidden 32,
    4 heads (2 KV heads), vocabulary 64, ``sdpa``, seed 0, in eval mode; ``config`` overrides the config's fields."""
    import transformers

    common = {
        "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 128, **config,
    }  # fmt: skip
    if kind not in ("llama", "qwen2"):
        raise ValueError(f"kind must be 'llama' or 'qwen2', got {kind!r}")
    cfg = (transformers.LlamaConfig if kind == "llama" else transformers.Qwen2Config)(**common)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    cls = transformers.LlamaForCausalLM if kind == "llama" else transformers.Qwen2ForCausalLM
    return cls(cfg).eval()


def tpe_causal_lm(kind: str):
    """:func:`tiny_causal_lm` with 2D-TPE installed (2 orders), padding id 0 and no end-of-sequence token (every
    ``generate`` runs ``max_new_tokens`` steps)."""
    from mmpos.integrations.hf_tpe import install_tpe

    return install_tpe(tiny_causal_lm(kind, pad_token_id=0, bos_token_id=None, eos_token_id=None), orders=2)


def left_padded(first: list[int], second: list[int], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` ``(2, L)`` of two prompts, the shorter one left-padded with ``pad``."""
    length = max(len(first), len(second))
    rows = [[pad] * (length - len(p)) + p for p in (first, second)]
    mask = [[0] * (length - len(p)) + [1] * len(p) for p in (first, second)]
    return torch.tensor(rows), torch.tensor(mask)


def vision_batch(
    first: list[int],
    second: list[int],
    images: list[list[int]],
    videos: list[list[int]] | None = None,
    *,
    row: int,
    image_id: int,
    video_id: int | None = None,
    pad: int = 0,
) -> dict:
    """Two prompts (:func:`left_padded`) with random pixel rows ``(sum t * h * w, row)`` for the ``images`` grids
    (then for the ``videos`` grids; one generator seeded 1), the grids, and ``mm_token_type_ids`` (1 on
    ``image_id``, 2 on ``video_id``)."""
    ids, mask = left_padded(first, second, pad)
    g = torch.Generator().manual_seed(1)
    patches = lambda grids: sum(t * h * w for t, h, w in grids)
    batch = {"input_ids": ids, "attention_mask": mask}
    batch.update(pixel_values=torch.randn(patches(images), row, generator=g), image_grid_thw=torch.tensor(images))
    types = (ids == image_id).long()
    if videos:
        batch["pixel_values_videos"] = torch.randn(patches(videos), row, generator=g)
        batch["video_grid_thw"] = torch.tensor(videos)
        types = types + 2 * (ids == video_id).long()
    return {**batch, "mm_token_type_ids": types}


def greedy(model, inputs: dict, suppress: list[int], steps: int = 3, pad: int = 0):
    """Greedy ``generate`` of ``steps`` tokens: ``(sequences, per-step logits (B, steps, V))``; ``suppress`` keeps a
    random model from emitting vision tokens (they would need pixels)."""
    out = model.generate(
        **inputs,
        max_new_tokens=steps,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
        pad_token_id=pad,
        suppress_tokens=suppress,
    )
    return out.sequences, torch.stack(out.logits, 1)


def full_forward_inputs(inputs: dict, sequences: torch.Tensor, steps: int) -> dict:
    """The inputs of one forward over a generated ``sequences`` (prompt + ``steps`` tokens): the attention mask
    grown by the new tokens; ``mm_token_type_ids`` grown by text (0)."""
    b = sequences.shape[0]
    full = dict(inputs, input_ids=sequences)
    full["attention_mask"] = torch.cat([inputs["attention_mask"], torch.ones(b, steps, dtype=torch.long)], 1)
    if "mm_token_type_ids" in inputs:
        types = inputs["mm_token_type_ids"]
        full["mm_token_type_ids"] = torch.cat([types, torch.zeros(b, steps, dtype=types.dtype)], 1)
    return full


def assert_cached_generate_is_a_full_forward(model, inputs: dict, suppress: list[int], steps: int = 3) -> None:
    """A greedy cached ``generate`` (:func:`greedy`) gives the logits of one forward over the generated sequence
    (to 1e-4: the cache changes the order of float sums)."""
    seq, logits = greedy(model, inputs, suppress, steps)
    full = model(**full_forward_inputs(inputs, seq, steps)).logits[:, -steps - 1 : -1]
    torch.testing.assert_close(full, logits, rtol=1e-4, atol=1e-4)


def assert_own_scheme_is_exact(model, inputs: dict, own: str, suppress: list[int]) -> None:
    """``use_rope(model, own)`` (the model's own scheme name, implemented by mmpos) gives the unpatched logits, and
    the greedy ``generate``'s sequences and per-step logits, bit for bit; ``"own"`` restores them."""
    from mmpos.integrations.hf_rope import current_rope, use_rope

    use_rope(model, "own")
    ref = model(**inputs).logits
    ref_seq, ref_steps = greedy(model, inputs, suppress)
    use_rope(model, own)
    assert current_rope(model) == own
    assert torch.equal(model(**inputs).logits, ref)
    seq, steps = greedy(model, inputs, suppress)
    assert torch.equal(seq, ref_seq) and torch.equal(steps, ref_steps)
    use_rope(model, "own")
    assert torch.equal(model(**inputs).logits, ref)


def assert_swap_is_consistent(model, inputs: dict, scheme: str, options: dict, suppress: list[int]) -> None:
    """``use_rope(model, scheme, **options)`` moves the logits (finite, not close to the model's own) and its cached
    greedy ``generate`` equals a full forward (:func:`assert_cached_generate_is_a_full_forward`); ``"own"`` then
    restores the logits."""
    from mmpos.integrations.hf_rope import use_rope

    use_rope(model, "own")
    ref = model(**inputs).logits
    use_rope(model, scheme, **options)
    logits = model(**inputs).logits
    assert torch.isfinite(logits).all() and not torch.allclose(logits, ref), scheme
    assert_cached_generate_is_a_full_forward(model, inputs, suppress)
    use_rope(model, "own")
    assert torch.equal(model(**inputs).logits, ref)  # restored


def reloaded_in_bfloat16(model, path):
    """``model`` saved to ``path`` and loaded back with ``from_pretrained(..., dtype=torch.bfloat16)`` (which keeps the
    rotary's ``inv_freq`` float32, as mmpos keeps its plan), in eval mode."""
    model.save_pretrained(path)
    loaded = type(model).from_pretrained(path, dtype=torch.bfloat16).eval()
    assert next(loaded.parameters()).dtype == torch.bfloat16
    return loaded


def assert_own_scheme_is_exact_in_bfloat16(build, inputs: dict, own: str, suppress: list[int], path) -> None:
    """:func:`assert_own_scheme_is_exact` on ``build()``'s tiny model saved and loaded in bfloat16
    (:func:`reloaded_in_bfloat16`, which keeps the rotary's ``inv_freq`` float32): ``cos`` / ``sin`` in the dtype the
    model's own rotary returns. ``inputs`` hold no floating tensors (ids, masks and grid sizes only), so nothing is
    cast."""
    model = reloaded_in_bfloat16(build(), path)
    assert not any(v.is_floating_point() for v in inputs.values())
    assert_own_scheme_is_exact(model, inputs, own, suppress)
