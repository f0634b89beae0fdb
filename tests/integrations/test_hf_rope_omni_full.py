"""``use_rope`` on the full Omni models (``Qwen2_5OmniForConditionalGeneration``: thinker, talker, token2wav;
``Qwen3OmniMoeForConditionalGeneration``: thinker, talker with its code predictor, code2wav): the thinker and the
talker take the same scheme. The talker has its own ``get_rope_index`` (the Omni rule over the
thinker's token ids, read with the talker config's token ids) and rotary module; mmpos replaces both. Tiny random
configs from the config classes (1-2 layers, hidden 64); the talker is run by its own forward and greedy
``generate`` on the inputs the full model builds for it (the full ``generate`` also runs the vocoder, a DiT
sampler over mel frames that takes no multimodal positions)."""

from __future__ import annotations

import inspect

import pytest
import torch

transformers = pytest.importorskip("transformers")

import test_hf_rope_families as fam
from _tiny_hf import assert_cached_generate_is_a_full_forward

from mmpos.integrations import hf_omni
from mmpos.integrations.hf_rope import CONFIG_KEY, current_rope, use_rope

pytestmark = pytest.mark.hf
IMG, ISTART, IEND, PAD = fam.IMG, fam.ISTART, fam.IEND, fam.PAD
CODEC = {"bos": 90, "eos": 91, "pad": 92, "mask": 93}


def _qwen2_5_omni():
    thinker = fam._qwen2_5_omni().config
    talker = dict(
        fam._omni_text([2, 3, 3]),
        num_hidden_layers=1,
        embedding_size=64,
        vocab_size=96,
        spatial_merge_size=2,
        tts_text_start_token_id=100,
        tts_text_end_token_id=101,
        tts_text_pad_token_id=102,
        tts_codec_start_token_id=CODEC["bos"],
        tts_codec_end_token_id=CODEC["eos"],
        tts_codec_pad_token_id=CODEC["pad"],
        tts_codec_mask_token_id=CODEC["mask"],
        **fam._omni_tokens(transformers.Qwen2_5OmniTalkerConfig),
    )
    dit = {
        "hidden_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "head_dim": 16,
        "emb_dim": 16,
        "enc_emb_dim": 16,
        "enc_dim": 16,
        "enc_channels": [16, 16, 16, 16, 48],
        "enc_attention_channels": 8,
        "enc_se_channels": 8,
        "num_embeds": 96,
        "mel_dim": 8,
        "look_ahead_layers": [0],
        "look_backward_layers": [0],
    }
    bigvgan = {
        "mel_dim": 8,
        "upsample_initial_channel": 16,
        "resblock_kernel_sizes": [3],
        "resblock_dilation_sizes": [[1, 3, 5]],
        "upsample_rates": [2],
        "upsample_kernel_sizes": [4],
    }
    cfg = transformers.Qwen2_5OmniConfig(
        thinker_config=thinker.to_dict(),
        talker_config=talker,
        token2wav_config={"dit_config": dit, "bigvgan_config": bigvgan},
    )
    return transformers.Qwen2_5OmniForConditionalGeneration(cfg)


def _qwen3_omni_moe():
    from transformers.models.qwen3_omni_moe import configuration_qwen3_omni_moe as configs

    thinker = fam._qwen3_omni_moe().config
    params = inspect.signature(configs.Qwen3OmniMoeTalkerTextConfig).parameters
    text = dict(
        fam._omni_text([4, 2, 2], mrope_interleaved=True),
        num_hidden_layers=1,
        vocab_size=96,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        num_experts_per_tok=2,
        **{"num_experts" if "num_experts" in params else "num_local_experts": 4},
    )
    if "head_dim" not in params:  # 4.57: hidden_size / num_attention_heads = 16
        text.pop("head_dim")
    predictor = dict(fam.TEXT, num_hidden_layers=1, vocab_size=96, head_dim=16, num_code_groups=2)
    names = inspect.signature(configs.Qwen3OmniMoeTalkerConfig).parameters
    talker = dict(
        text_config=text,
        code_predictor_config=predictor,
        num_code_groups=2,
        thinker_hidden_size=64,
        accept_hidden_layer=1,
        codec_eos_token_id=CODEC["eos"],
        codec_nothink_id=85,
        codec_think_bos_id=86,
        codec_think_eos_id=87,
        codec_pad_id=CODEC["pad"],
        codec_bos_id=CODEC["bos"],
        spatial_merge_size=2,
        speaker_id={"ethan": 80},
        **{k: v for k, v in fam.OMNI_TOKENS.items() if k in names},  # the thinker's token ids, as the checkpoints
    )
    code2wav = {
        "codebook_size": 96,
        "hidden_size": 32,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_quantizers": 2,
        "upsample_rates": [2],
        "upsampling_ratios": [2],
        "decoder_dim": 16,
        "sliding_window": 8,
    }
    cfg = transformers.Qwen3OmniMoeConfig(
        thinker_config=thinker.to_dict(), talker_config=talker, code2wav_config=code2wav
    )
    model = transformers.Qwen3OmniMoeForConditionalGeneration(cfg)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # 5.24 leaves some talker weights (its experts) uninitialised: draw all but the norms'
        for p in model.talker.parameters():
            if not torch.equal(p, torch.ones_like(p)):
                p.normal_(0, 0.02, generator=g)
    return model


#: model_type -> (tiny full model, transformers class, the family's own scheme)
FULL = {
    "qwen2_5_omni": (_qwen2_5_omni, "Qwen2_5OmniForConditionalGeneration", "qwen2.5-omni"),
    "qwen3_omni_moe": (_qwen3_omni_moe, "Qwen3OmniMoeForConditionalGeneration", "qwen3-omni"),
}


@pytest.fixture(scope="module", params=list(FULL))
def full(request):
    build, cls, _ = FULL[request.param]
    if not hasattr(transformers, cls):
        pytest.skip(f"transformers {transformers.__version__} has no {cls}")
    torch.manual_seed(0)
    return build().eval()


def _thinker_batch():
    return fam._omni_batch()


def _talker_inputs(model, batch, reply: int = 2):
    """The talker's prefill as the full model's ``generate`` builds it, with random thinker states in place of the
    thinker's hidden states (the talker reads them as embeddings). Qwen2.5-Omni: ``input_text_ids`` the prompt, the
    speaker's start token and the first reply token; the codec ids masked, then pad and bos. Qwen3-Omni:
    ``talker_input_ids`` the thinker's ids (here the whole prompt as the user turn), ``trailing_text_hidden`` the
    text still to speak."""
    ids, mask = batch["input_ids"], batch["attention_mask"]
    if model.config.model_type == "qwen3_omni_moe":
        b, length = ids.shape
        g = torch.Generator().manual_seed(3)
        return {
            "inputs_embeds": torch.randn(b, length, 64, generator=g),
            "talker_input_ids": ids,
            "attention_mask": mask,
            "image_grid_thw": batch["image_grid_thw"],
            "trailing_text_hidden": torch.randn(b, reply + 1, 64, generator=g),
            "tts_pad_embed": torch.randn(b, 1, 64, generator=g),
        }
    b, length = ids.shape
    g = torch.Generator().manual_seed(3)
    text = torch.cat([ids, torch.full((b, 1), 100), torch.full((b, 1), 7)], 1)
    codec = torch.cat(
        [torch.full_like(ids, CODEC["mask"]), torch.full((b, 1), CODEC["pad"]), torch.full((b, 1), CODEC["bos"])], 1
    )
    return {
        "input_ids": codec,
        "input_text_ids": text,
        "inputs_embeds": torch.randn(b, length + 2, 64, generator=g),
        "thinker_reply_part": torch.randn(b, reply + 2, 64, generator=g),
        "attention_mask": torch.cat([mask, torch.ones(b, 2, dtype=mask.dtype)], 1),
        "image_grid_thw": batch["image_grid_thw"],
    }


def _talker_logits(model, inputs):
    """The talker's prefill logits on the real tokens ``(N, V)`` (Qwen3-Omni's talker gives NaN on left padding,
    which no query reads)."""
    model.talker.rope_deltas = None
    out = model.talker(**{k: v.clone() for k, v in inputs.items()}, use_cache=False)
    return out.logits[inputs["attention_mask"].bool()]


def _talker_generate(model, inputs, steps=3):
    model.talker.rope_deltas = None
    extra = {"output_hidden_states": True} if model.config.model_type == "qwen3_omni_moe" else {}  # the predictor's
    torch.manual_seed(0)  # 4.57's Qwen3-Omni code predictor samples its residual codes whatever do_sample says
    out = model.talker.generate(
        **{k: v.clone() for k, v in inputs.items()},
        **extra,
        max_new_tokens=steps,
        do_sample=False,
        suppress_tokens=[CODEC["bos"]],
        pad_token_id=CODEC["pad"],
        output_logits=True,
        return_dict_in_generate=True,
    )
    return out.sequences, torch.stack(out.logits, 1)


def _text_ids(inputs):
    return inputs["input_text_ids"] if "input_text_ids" in inputs else inputs["talker_input_ids"]


def _talker_index(model, inputs):
    return model.talker.get_rope_index(
        _text_ids(inputs), inputs["image_grid_thw"], None, inputs["attention_mask"], False, None, None
    )


@torch.no_grad()
def test_own_scheme_is_exact_on_thinker_and_talker(full):
    batch = _thinker_batch()
    talker = _talker_inputs(full, batch)
    use_rope(full, "own")
    ref = full.thinker(**batch).logits
    ref_index = _talker_index(full, talker)
    ref_talker = _talker_logits(full, talker)
    ref_codes, ref_steps = _talker_generate(full, talker)
    assert torch.isfinite(ref_talker).all() and torch.isfinite(ref_steps).all()
    own = FULL[full.config.model_type][2]
    use_rope(full, own)
    assert current_rope(full) == own and current_rope(full.talker) == own
    assert getattr(full.config, CONFIG_KEY) == {"scheme": own}
    assert type(full.talker.model.rotary_emb).__name__ == "HFRotaryEmbedding"  # the talker is patched too
    assert torch.equal(full.thinker(**batch).logits, ref)
    index = _talker_index(full, talker)
    assert torch.equal(index[0], ref_index[0]) and torch.equal(index[1], ref_index[1])
    assert torch.equal(_talker_logits(full, talker), ref_talker)
    codes, steps = _talker_generate(full, talker)
    assert torch.equal(codes, ref_codes) and torch.equal(steps, ref_steps)
    use_rope(full, "own")
    assert current_rope(full.talker) == "own" and not hasattr(full.config, CONFIG_KEY)
    assert torch.equal(_talker_logits(full, talker), ref_talker)


@torch.no_grad()
def test_talker_positions_reach_its_logits(full):
    """The multimodal talker positions matter: with 1-D positions its logits differ (the exactness above is not
    that of a rotation that ignores them)."""
    batch = _thinker_batch()
    talker = _talker_inputs(full, batch)
    use_rope(full, "own")
    ref = _talker_logits(full, talker)
    flat = dict(talker)
    flat.pop("image_grid_thw")  # the model's text-only branch: 1-D positions
    assert not torch.allclose(_talker_logits(full, flat), ref)


SWAPS = [("mrope-i", {}), ("vrope", {}), ("v2pe", {"delta": 0.25}), ("mhrope", {"head_sections": [0, 1, 1]})]


@torch.no_grad()
@pytest.mark.parametrize("scheme, options", SWAPS, ids=[s for s, _ in SWAPS])
def test_swapped_scheme_reaches_thinker_and_talker(full, scheme, options):
    """A swapped scheme: the talker's positions are the scheme's over its token ids (those the thinker's patched
    index gives for the same ids), its logits move and its greedy ``generate`` runs; the thinker's cached
    ``generate`` equals a full forward; ``"own"`` restores both exactly."""
    batch = _thinker_batch()
    talker = _talker_inputs(full, batch)
    use_rope(full, "own")
    ref = full.thinker(**batch).logits
    ref_talker = _talker_logits(full, talker)
    use_rope(full, scheme, **options)
    assert current_rope(full) == scheme and current_rope(full.talker) == scheme
    ids, deltas = _talker_index(full, talker)
    lay = hf_omni.omni_layout(
        full.config.thinker_config, _text_ids(talker), talker["image_grid_thw"], None,
        talker["attention_mask"], scheme=scheme, **{k: v for k, v in options.items() if k != "head_sections"},
    )  # fmt: skip
    want = lay.hf_position_ids("3d")
    assert torch.equal(ids.to(want.dtype), want) and torch.equal(deltas.to(lay.rope_deltas.dtype), lay.rope_deltas)
    thinker_ids, _ = full.thinker.get_rope_index(_text_ids(talker), talker["image_grid_thw"], None,
                                                 talker["attention_mask"], False, None, None)  # fmt: skip
    assert torch.equal(ids, thinker_ids)
    logits = _talker_logits(full, talker)
    assert torch.isfinite(logits).all() and not torch.allclose(logits, ref_talker)
    seq, steps = _talker_generate(full, talker)  # runs on the scheme's decode positions (rope_deltas)
    assert steps.shape[1] == 3 and torch.isfinite(steps).all() and seq.shape[0] == 2
    assert_cached_generate_is_a_full_forward(full.thinker, batch, fam.SUPPRESS)
    use_rope(full, "own")
    assert torch.equal(full.thinker(**batch).logits, ref)
    assert torch.equal(_talker_logits(full, talker), ref_talker)


def test_a_refused_scheme_leaves_both_parts_own(full):
    with pytest.raises(ValueError, match="advance applies"):
        use_rope(full, "mrope-i", advance="max")
    assert current_rope(full) == "own" and current_rope(full.talker) == "own"


@torch.no_grad()
def test_talker_with_audio_in_the_prompt(full):
    """An audio clip in each prompt (``audio_feature_lengths``, as the full model passes them): the own scheme gives
    the talker's logits bit for bit, a swapped scheme moves them."""
    batch = fam._omni_audio_batch(full.thinker)
    talker = dict(_talker_inputs(full, batch), audio_feature_lengths=batch["feature_attention_mask"].sum(1))
    use_rope(full, "own")
    try:
        ref = _talker_logits(full, talker)
    except AttributeError as error:  # 5.24's Qwen3-Omni talker reads audio_config.n_window, which its config lacks
        pytest.skip(f"the unpatched talker cannot take audio in transformers {transformers.__version__}: {error}")
    use_rope(full, FULL[full.config.model_type][2])
    assert torch.equal(_talker_logits(full, talker), ref)
    use_rope(full, "vrope")
    logits = _talker_logits(full, talker)
    assert torch.isfinite(logits).all() and not torch.allclose(logits, ref)
    use_rope(full, "own")
    assert torch.equal(_talker_logits(full, talker), ref)
