"""``save_pretrained`` -> :func:`mmpos.integrations.hf.from_pretrained` of the full Omni models
(``Qwen2_5OmniForConditionalGeneration``, ``Qwen3OmniMoeForConditionalGeneration``) after :func:`use_rope`: the
scheme written into the top-level config (``config.mmpos_rope``) comes back on the thinker and the talker, with the
pre-save logits; the own scheme stays exact after a bfloat16 reload. Tiny random full models as
test_hf_rope_omni_full.py builds them.

Besides ``config.json`` and the weights, Qwen2.5-Omni's ``from_pretrained`` reads ``spk_dict.pt``, the speaker table
its ``generate`` takes the speaker's text start token and the vocoder's conditioning from (``load_speakers``; a
missing file is an ``OSError`` even with ``enable_audio_output=False``), which ``save_pretrained`` does not write: a
fine-tuned checkpoint needs the base checkpoint's file copied next to its weights. Qwen3-Omni keeps its speakers in
the config (``talker_config.speaker_id``) and reads nothing else."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

import test_hf_rope_families as fam
import test_hf_rope_omni_full as omni_full

from mmpos.integrations.hf import CONFIG_KEY, apply_config_rope, current_rope, from_pretrained, use_rope

pytestmark = pytest.mark.hf
SWAPS = [("mrope-i", {}), ("v2pe", {"delta": 0.25}), ("mhrope", {"head_sections": [0, 1, 1]})]


def write_speakers(model, path) -> dict | None:
    """Qwen2.5-Omni: a random speaker table ``spk_dict.pt`` in ``path``, in the layout its ``load_speakers`` /
    ``generate`` read: ``{name: {"bos_token": int, "cond": (1, enc_emb_dim), "ref_mel": (1, T, mel_dim)}}`` (the
    speaker's text start token in the thinker's vocabulary; the DiT's speaker embedding and reference mel frames).
    Returns the table; ``None`` (nothing written) for Qwen3-Omni, whose speakers are ``talker_config.speaker_id``."""
    if model.config.model_type != "qwen2_5_omni":
        return None
    dit = model.config.token2wav_config.dit_config
    g = torch.Generator().manual_seed(5)
    table = {
        name: {
            "bos_token": bos,
            "cond": torch.randn(1, dit.enc_emb_dim, generator=g),
            "ref_mel": torch.randn(1, 12, dit.mel_dim, generator=g),
        }
        for name, bos in (("Chelsie", 100), ("Ethan", 103))
    }
    torch.save(table, f"{path}/spk_dict.pt")
    return table


def _build(model_type):
    build, cls, _ = omni_full.FULL[model_type]
    if not hasattr(transformers, cls):
        pytest.skip(f"transformers {transformers.__version__} has no {cls}")
    torch.manual_seed(0)
    return build().eval()


def _saved(model, path):
    model.save_pretrained(path)
    return write_speakers(model, path)


def _cast(inputs: dict, dtype: torch.dtype) -> dict:
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in inputs.items()}


def _outputs(model, dtype=torch.float32):
    """The thinker's logits ``(B, L, V)`` on prompts with an image and an audio clip each, the talker's positions and
    its prefill logits on the real tokens (:func:`test_hf_rope_omni_full._talker_logits`), inputs cast to ``dtype``."""
    thinker = model.thinker(**_cast(fam._omni_audio_batch(model.thinker), dtype)).logits
    talker = _cast(omni_full._talker_inputs(model, fam._omni_batch()), dtype)
    model.thinker.rope_deltas = None
    return thinker, omni_full._talker_index(model, talker), omni_full._talker_logits(model, talker)


def _assert_same(got, want, exact: bool) -> None:
    (thinker, (ids, deltas), talker), (ref, (ref_ids, ref_deltas), ref_talker) = got, want
    assert torch.equal(ids, ref_ids) and torch.equal(deltas, ref_deltas)
    if exact:
        assert torch.equal(thinker, ref) and torch.equal(talker, ref_talker)
    else:
        torch.testing.assert_close(thinker, ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(talker, ref_talker, rtol=1e-5, atol=1e-5)


@torch.no_grad()
@pytest.mark.parametrize("model_type", list(omni_full.FULL))
@pytest.mark.parametrize("scheme, options", SWAPS, ids=[s for s, _ in SWAPS])
def test_swap_survives_save_pretrained_and_from_pretrained(model_type, scheme, options, tmp_path):
    """The swap recorded in the saved top-level config comes back on both parts (thinker and talker) with the
    pre-save logits (1e-5); a plain ``from_pretrained`` loads the own RoPE, which ``apply_config_rope`` swaps."""
    model = _build(model_type)
    own = _outputs(model)
    use_rope(model, scheme, **options)
    swapped = _outputs(model)
    assert not torch.allclose(swapped[0], own[0]) and not torch.allclose(swapped[2], own[2])
    entry = {"scheme": scheme, **options}
    assert getattr(model.config, CONFIG_KEY) == entry
    speakers = _saved(model, tmp_path)
    loaded = from_pretrained(type(model), tmp_path).eval()
    assert current_rope(loaded) == scheme and current_rope(loaded.talker) == scheme
    assert getattr(loaded.config, CONFIG_KEY) == entry
    _assert_same(_outputs(loaded), swapped, exact=False)
    if speakers is not None:  # the table the reloaded model's generate reads
        assert loaded.speaker_map.keys() == speakers.keys()
        for name, params in speakers.items():
            got = loaded.speaker_map[name]
            assert got["bos_token"] == params["bos_token"]
            assert torch.equal(got["cond"], params["cond"]) and torch.equal(got["ref_mel"], params["ref_mel"])
    plain = type(model).from_pretrained(tmp_path).eval()
    assert current_rope(plain) == "own" and current_rope(plain.talker) == "own"
    _assert_same(_outputs(plain), own, exact=False)
    apply_config_rope(plain)
    assert current_rope(plain.talker) == scheme
    _assert_same(_outputs(plain), swapped, exact=False)
    use_rope(plain, "own")
    assert not hasattr(plain.config, CONFIG_KEY)


@torch.no_grad()
@pytest.mark.parametrize("model_type", list(omni_full.FULL))
@pytest.mark.parametrize("swaps", [("thinker",), ("talker",), ("full", "thinker")], ids="+".join)
def test_a_part_swapped_alone_survives_the_reload(model_type, swaps, tmp_path):
    """``use_rope`` on one part (``model.thinker`` / ``model.talker``, after the full model's or not) records the
    scheme in that part's config only: the reload gives each part the scheme it ran (not the top-level entry, or
    none where there is no top-level entry), with the pre-save logits."""
    model = _build(model_type)
    schemes = {"thinker": "own", "talker": "own"}
    for target, scheme in zip(swaps, ("vrope", "mrope-i")):
        use_rope(model if target == "full" else getattr(model, target), scheme)
        schemes.update(dict.fromkeys(("thinker", "talker") if target == "full" else (target,), scheme))
    before = _outputs(model)
    _saved(model, tmp_path)
    loaded = from_pretrained(type(model), tmp_path).eval()
    assert {"thinker": current_rope(loaded.thinker), "talker": current_rope(loaded.talker)} == schemes
    _assert_same(_outputs(loaded), before, exact=False)


def _speak(model, speaker: str):
    """Qwen2.5-Omni's full ``generate`` with audio output (thinker, talker greedy, token2wav) on the first prompt
    with its image (4.57.1 takes one sample): ``(text ids (1, L), waveform (S,))``. The pixels go to the thinker only
    (as ``pixel_values``, 5.24.0's full ``generate`` passes them to the talker's too, which refuses them, unpatched)."""
    batch = fam._omni_batch()
    prompt = {"input_ids": batch["input_ids"][:1], "attention_mask": batch["attention_mask"][:1]}
    torch.manual_seed(0)  # token2wav's sampler starts from noise
    text, wave = model.generate(
        **prompt,
        image_grid_thw=batch["image_grid_thw"][:1],
        thinker_pixel_values=batch["pixel_values"][:24],
        speaker=speaker,
        thinker_max_new_tokens=3,
        thinker_suppress_tokens=fam.SUPPRESS,
        talker_max_new_tokens=4,
        talker_do_sample=False,
        talker_eos_token_id=[omni_full.CODEC["eos"]],
        token2wav_num_steps=2,
    )
    return text, wave[0] if isinstance(wave, list) else wave.reshape(-1)


@torch.no_grad()
def test_reloaded_qwen2_5_omni_speaks_as_before(tmp_path):
    """The reloaded swapped model's ``generate`` with audio output runs on the speaker table the fixture wrote (the
    speaker's text start token, the vocoder's conditioning: another speaker moves the waveform) and gives the
    pre-save model's text and waveform. (The tiny random talker's greedy codes do not move with its positions here:
    that the swap reaches the talker is the logit checks' part.)"""
    model = _build("qwen2_5_omni")
    use_rope(model, "mrope-i")
    _saved(model, tmp_path)
    model.load_speakers(tmp_path / "spk_dict.pt")
    loaded = from_pretrained(type(model), tmp_path).eval()
    text, wave = _speak(model, "Ethan")
    again, wave_again = _speak(loaded, "Ethan")
    assert torch.equal(again, text) and again.shape[1] == fam._omni_batch()["input_ids"].shape[1] + 3
    assert wave.numel() > 0 and torch.isfinite(wave).all() and wave.abs().max() > 0
    torch.testing.assert_close(wave_again, wave, rtol=1e-5, atol=1e-7)
    _, other = _speak(loaded, "Chelsie")
    assert other.shape == wave.shape and not torch.allclose(other, wave, rtol=1e-3, atol=1e-6)


def test_qwen2_5_omni_reload_needs_the_speaker_table(tmp_path):
    """What ``save_pretrained`` leaves out: Qwen2.5-Omni's ``from_pretrained`` refuses a directory without
    ``spk_dict.pt`` (naming it), also without the talker (``enable_audio_output=False``)."""
    model = _build("qwen2_5_omni")
    model.save_pretrained(tmp_path / "full")
    with pytest.raises(OSError, match="spk_dict.pt"):
        from_pretrained(type(model), tmp_path / "full")
    model.disable_talker()
    model.config.enable_audio_output = False
    use_rope(model, "vrope")
    model.save_pretrained(tmp_path / "thinker")
    with pytest.raises(OSError, match="spk_dict.pt"):
        type(model).from_pretrained(tmp_path / "thinker")
    write_speakers(model, tmp_path / "thinker")
    loaded = from_pretrained(type(model), tmp_path / "thinker").eval()
    assert not hasattr(loaded, "talker") and current_rope(loaded) == "vrope"
    inputs = fam._omni_audio_batch(model.thinker)
    torch.testing.assert_close(loaded.thinker(**inputs).logits, model.thinker(**inputs).logits, rtol=1e-5, atol=1e-5)


@torch.no_grad()
@pytest.mark.parametrize("model_type", list(omni_full.FULL))
def test_own_scheme_is_exact_after_a_bfloat16_reload(model_type, tmp_path):
    """Loaded with ``from_pretrained(..., dtype=torch.bfloat16)`` (the rotaries' ``inv_freq`` stay float32, as mmpos
    keeps its plan): the own scheme, installed after the load or saved in the config and reinstalled by mmpos's
    ``from_pretrained``, gives the unpatched bfloat16 model's thinker and talker logits bit for bit."""
    model = _build(model_type)
    own = omni_full.FULL[model_type][2]
    _saved(model, tmp_path / "plain")
    ref_model = type(model).from_pretrained(tmp_path / "plain", dtype=torch.bfloat16).eval()
    assert next(ref_model.thinker.parameters()).dtype == torch.bfloat16
    assert next(ref_model.talker.parameters()).dtype == torch.bfloat16
    ref = _outputs(ref_model, torch.bfloat16)
    assert ref[0].dtype == torch.bfloat16 and torch.isfinite(ref[2]).all()
    use_rope(ref_model, own)
    assert current_rope(ref_model.talker) == own
    _assert_same(_outputs(ref_model, torch.bfloat16), ref, exact=True)
    use_rope(model, own)
    _saved(model, tmp_path / "own")
    loaded = from_pretrained(type(model), tmp_path / "own", dtype=torch.bfloat16).eval()
    assert current_rope(loaded) == own and current_rope(loaded.talker) == own
    _assert_same(_outputs(loaded, torch.bfloat16), ref, exact=True)
