"""Qwen2.5-Omni and Qwen3-Omni position ids (TMRoPE with audio): :func:`mmpos.integrations.hf_omni.get_rope_index`
equals the installed transformers' own ``get_rope_index`` on random batches (text, images, videos with seconds
per grid, audios, videos with their audio under ``use_audio_in_video``, several blocks per sample, left and right
padding); a family the installed release lacks is skipped with the reason."""

from __future__ import annotations

import random
import sys
import types
from types import SimpleNamespace

import pytest
import torch

transformers = pytest.importorskip("transformers")

from _hf_samples import family_modules

from mmpos import layout
from mmpos.coords import Modality
from mmpos.integrations import hf_omni
from mmpos.schemes import SCHEMES

pytestmark = pytest.mark.hf

FAMILIES = {
    "qwen2_5_omni": ("Qwen2_5OmniThinkerConfig", "Qwen2_5OmniPreTrainedModelForConditionalGeneration"),
    "qwen3_omni_moe": ("Qwen3OmniMoeThinkerConfig", "Qwen3OmniMoePreTrainedModelForConditionalGeneration"),
}
# dyadic seconds per grid (their products with position_id_per_seconds are exact in float32) and the
# processors' usual ones: temporal_patch_size 2 over fps 2, 1, 0.5, 4 / 3 ...
SECONDS = [1.0, 0.5, 2.0, 0.25, 1.5, 4.0, 0.75, 6.0]


def _family(model_type: str):
    """``(thinker config, model class with get_rope_index, modeling module)`` of the installed release."""
    cfg_mod, model_mod = family_modules(model_type)
    config_name, model_name = FAMILIES[model_type]
    config = getattr(cfg_mod, config_name)()
    # the checkpoints' config.json set these; the config classes' defaults lack some (ids of Qwen2.5-Omni-7B)
    for name, value in (
        ("vision_start_token_id", 151652),
        ("vision_end_token_id", 151653),
        ("audio_end_token_id", 151648),
    ):
        if getattr(config, name, None) is None:
            setattr(config, name, value)
    return config, getattr(model_mod, model_name), model_mod


def _reference(model_type, config, **kwargs):
    _, model_cls, _ = _family(model_type)
    owner = SimpleNamespace(config=config, spatial_merge_size=config.vision_config.spatial_merge_size)
    for name in ("get_llm_pos_ids_for_vision", "get_chunked_index"):
        setattr(owner, name, types.MethodType(getattr(model_cls, name), owner))
    kwargs = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
    return model_cls.get_rope_index(owner, **kwargs)


def _audio_tokens(model_type, config, n: int) -> int:
    """The reference audio encoder's own output length for ``n`` feature frames."""
    _, _, mod = _family(model_type)
    lengths = torch.tensor([n])
    if model_type == "qwen2_5_omni":
        return int(mod.Qwen2_5OmniAudioEncoder._get_feat_extract_output_lengths(None, lengths)[1])
    fn = mod._get_feat_extract_output_lengths
    if "n_window" in fn.__code__.co_varnames[: fn.__code__.co_argcount]:
        return int(fn(lengths, config.audio_config.n_window))
    return int(fn(lengths))  # transformers 4.57.1: the window fixed at 100 features


def _interleave(model_type, config, t_index, hw, audio):
    """Token kinds (0 video, 1 audio) of a video with its audio, as the Omni processors order them:
    by time (Qwen3-Omni) or in chunks of seconds_per_chunk (Qwen2.5-Omni); a plain loop."""
    video = [t for t in t_index for _ in range(hw)]
    if model_type == "qwen3_omni_moe":
        out, i, j = [], 0, 0
        while i < len(video) or j < audio:
            if j >= audio or (i < len(video) and video[i] <= j):
                out.append(0)
                i += 1
            else:
                out.append(1)
                j += 1
        return out
    per = int(config.position_id_per_seconds * config.seconds_per_chunk)
    out, c = [], 0
    while len(out) < len(video) + audio:
        out += [0] * sum(1 for t in video if c * per <= t < (c + 1) * per)
        out += [1] * sum(1 for a in range(audio) if c * per <= a < (c + 1) * per)
        c += 1
    return out


def _random_batch(rng, model_type, config, batch, padding_side, av, kinds=("text", "image", "video", "audio")):
    m = config.vision_config.spatial_merge_size
    special = {
        config.image_token_id,
        config.video_token_id,
        config.audio_token_id,
        config.vision_start_token_id,
        config.audio_start_token_id,
        getattr(config, "vision_end_token_id", -1),
        getattr(config, "audio_end_token_id", -1),
    }
    text_ids = [i for i in range(10, 2000) if i not in special]
    vs, ve = config.vision_start_token_id, getattr(config, "vision_end_token_id", 151653)
    a_s, a_e = config.audio_start_token_id, getattr(config, "audio_end_token_id", 151648)
    pps = config.position_id_per_seconds
    rows, images, videos, seconds, seqlens = [], [], [], [], []
    for _ in range(batch):
        ids = [rng.choice(text_ids) for _ in range(rng.randint(1, 4))]
        for _ in range(rng.randint(1, 4)):
            kind = rng.choice(kinds)
            if kind == "text":
                ids += [rng.choice(text_ids) for _ in range(rng.randint(1, 5))]
            elif kind == "image":
                g = (1, m * rng.randint(1, 3), m * rng.randint(1, 4))
                images.append(g)
                ids += [vs] + [config.image_token_id] * (g[1] * g[2] // m**2) + [ve]
            elif kind == "audio":
                n = rng.randint(3, 900)
                seqlens.append(n)
                ids += [a_s] + [config.audio_token_id] * _audio_tokens(model_type, config, n) + [a_e]
            else:  # a video, with its audio when av
                g = (rng.randint(1, 4), m * rng.randint(1, 3), m * rng.randint(1, 3))
                s = rng.choice(SECONDS)
                videos.append(g)
                seconds.append(s)
                hw = g[1] * g[2] // m**2
                if not av:
                    ids += [vs] + [config.video_token_id] * (g[0] * hw) + [ve]
                    continue
                n = rng.randint(3, 700)
                seqlens.append(n)
                t_index = [int(f * s * pps) if model_type == "qwen2_5_omni" else f * s * pps for f in range(g[0])]
                order = _interleave(model_type, config, t_index, hw, _audio_tokens(model_type, config, n))
                content = [config.audio_token_id if k else config.video_token_id for k in order]
                ids += [vs, a_s] + content + [a_e, ve]
            if rng.random() < 0.5:
                ids += [rng.choice(text_ids) for _ in range(rng.randint(1, 3))]
        rows.append(ids)
    length = max(map(len, rows))
    input_ids = torch.zeros(batch, length, dtype=torch.long)
    mask = torch.zeros(batch, length, dtype=torch.long)
    for b, ids in enumerate(rows):
        span = slice(length - len(ids), length) if padding_side == "left" else slice(0, len(ids))
        input_ids[b, span], mask[b, span] = torch.tensor(ids), 1
    return {
        "input_ids": input_ids,
        "image_grid_thw": torch.tensor(images).view(-1, 3) if images else None,
        "video_grid_thw": torch.tensor(videos).view(-1, 3) if videos else None,
        "attention_mask": mask,
        "use_audio_in_video": av,
        "audio_seqlens": torch.tensor(seqlens, dtype=torch.long) if seqlens else None,
        "second_per_grids": torch.tensor(seconds) if seconds else None,
    }


def _assert_equal(got, want):
    assert got[0].dtype == want[0].dtype and got[0].shape == want[0].shape
    assert torch.equal(got[0], want[0])
    assert torch.equal(got[1].to(want[1].dtype).view(-1), want[1].view(-1))


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
@pytest.mark.parametrize("padding_side", ["right", "left"])
@pytest.mark.parametrize("av", [False, True])
def test_random_batches_match_the_installed_release(model_type, padding_side, av):
    config, _, _ = _family(model_type)
    rng = random.Random(hash((model_type, padding_side, av)) % 1000)
    for trial in range(12):
        batch = _random_batch(rng, model_type, config, rng.randint(1, 4), padding_side, av)
        if batch["image_grid_thw"] is None and batch["video_grid_thw"] is None:
            continue  # the text-only branch: its own test
        _assert_equal(hf_omni.get_rope_index(config, **batch), _reference(model_type, config, **batch))


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_text_and_audio_without_grids_take_the_text_branch(model_type):
    config, _, _ = _family(model_type)
    rng = random.Random(3)
    batch = _random_batch(rng, model_type, config, 3, "left", False, kinds=("text", "audio"))
    _assert_equal(hf_omni.get_rope_index(config, **batch), _reference(model_type, config, **batch))


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_audio_token_counts_match_the_audio_encoder(model_type):
    config, _, _ = _family(model_type)
    lengths = list(range(1, 420)) + [999, 1000, 1001, 3000, 30001]
    got = hf_omni.audio_token_counts(config, torch.tensor(lengths)).tolist()
    assert got == [_audio_tokens(model_type, config, n) for n in lengths]


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_top_level_config_and_modality(model_type):
    config, _, _ = _family(model_type)
    top = SimpleNamespace(model_type=model_type, thinker_config=config)
    batch = _random_batch(random.Random(5), model_type, config, 2, "right", True, kinds=("video", "audio", "image"))
    _assert_equal(hf_omni.get_rope_index(top, **batch), _reference(model_type, config, **batch))
    lay = hf_omni.omni_layout(top, **batch)
    ids = batch["input_ids"]
    assert torch.equal(lay.modality == Modality.AUDIO, (ids == config.audio_token_id) & (lay.attention_mask == 1))
    assert torch.equal(lay.modality == Modality.VIDEO, (ids == config.video_token_id) & (lay.attention_mask == 1))


def test_hand_worked_qwen2_5_omni_video_with_audio():
    """One 2-frame 2x2 video (0.5 s per grid: frames at t = 0 and 12) with 60 audio tokens in 50-position
    chunks (Qwen2.5-Omni: video chunk 0 = both frames, audio chunk 0 = audio 0..49, audio chunk 1 = 50..59):
    ``T vs as [V x 8] [A x 50] [A x 10] ae ve T``."""
    config, _, _ = _family("qwen2_5_omni")
    m = config.vision_config.spatial_merge_size
    n = next(n for n in range(3, 400) if _audio_tokens("qwen2_5_omni", config, n) == 60)
    ids = [5, config.vision_start_token_id, config.audio_start_token_id]
    ids += [config.video_token_id] * 8 + [config.audio_token_id] * 60
    ids += [config.audio_end_token_id, config.vision_end_token_id, 7]
    got, deltas = hf_omni.get_rope_index(
        config,
        torch.tensor([ids]),
        video_grid_thw=torch.tensor([[2, 2 * m, 2 * m]]),
        use_audio_in_video=True,
        audio_seqlens=torch.tensor([n]),
        second_per_grids=torch.tensor([0.5]),
    )
    s = 2  # content start: text 0, both start tokens at 1
    t = [0] * 4 + [12] * 4
    hh, ww = [0, 0, 1, 1] * 2, [0, 1, 0, 1] * 2
    audio = list(range(60))
    end = s + 59 + 1  # the last chunk is audio: its largest position + 1
    want = [
        [0, 1, 1] + [s + v for v in t] + [s + a for a in audio] + [end, end, end + 1],
        [0, 1, 1] + [s + v for v in hh] + [s + a for a in audio] + [end, end, end + 1],
        [0, 1, 1] + [s + v for v in ww] + [s + a for a in audio] + [end, end, end + 1],
    ]
    assert got[:, 0].tolist() == want
    assert deltas.tolist() == [[end + 2 - len(ids)]]


def test_hand_worked_qwen3_omni_merge_and_fractional_time():
    """Qwen3-Omni: a 3-frame 2x2 video at 0.1 s per grid (t = 0, 2.5, 5 at 25 positions a second) with 4 audio
    tokens, merged by time (video first on ties): V V V V A A A V V V V A V V V V, ids float32."""
    config, _, _ = _family("qwen3_omni_moe")
    m = config.vision_config.spatial_merge_size
    n = next(n for n in range(1, 400) if _audio_tokens("qwen3_omni_moe", config, n) == 4)
    V, A = config.video_token_id, config.audio_token_id
    ids = [config.vision_start_token_id, config.audio_start_token_id] + [V] * 4 + [A] * 3 + [V] * 4 + [A] + [V] * 4
    ids += [config.audio_start_token_id + 1, 9, 9]  # audio end, vision end (any ids), text
    batch = {
        "input_ids": torch.tensor([ids]),
        "video_grid_thw": torch.tensor([[3, 2 * m, 2 * m]]),
        "attention_mask": torch.ones(1, len(ids), dtype=torch.long),
        "use_audio_in_video": True,
        "audio_seqlens": torch.tensor([n]),
        "second_per_grids": torch.tensor([0.1]),
    }
    got, deltas = hf_omni.get_rope_index(config, **batch)
    s = 2.0
    t_row = [0, 1] + [s] * 4 + [s + 0, s + 1, s + 2] + [s + 2.5] * 4 + [s + 3] + [s + 5] * 4
    end = s + 5 + 1  # the video runs last: its largest position (t = 5 > h, w) + 1
    assert got.dtype == torch.float32
    assert torch.equal(got[0, 0], torch.tensor(t_row + [end, end + 1, end + 2], dtype=torch.float32))
    _assert_equal((got, deltas), _reference("qwen3_omni_moe", config, **batch))


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_bad_prompts_give_clear_errors(model_type):
    config, _, _ = _family(model_type)
    batch = _random_batch(random.Random(1), model_type, config, 2, "right", True, kinds=("video",))
    with pytest.raises(ValueError, match="use_audio_in_video=True"):
        hf_omni.get_rope_index(config, **dict(batch, use_audio_in_video=False))
    with pytest.raises(ValueError, match="audio_seqlens holds"):
        hf_omni.get_rope_index(config, **dict(batch, audio_seqlens=batch["audio_seqlens"][:-1]))
    with pytest.raises(ValueError, match="use_audio_in_video=True: a video"):
        hf_omni.get_rope_index(config, **dict(batch, audio_seqlens=batch["audio_seqlens"] + 400))
    plain = _random_batch(random.Random(1), model_type, config, 2, "right", False, kinds=("video",))
    with pytest.raises(ValueError, match="every video must follow"):
        hf_omni.get_rope_index(config, **dict(plain, use_audio_in_video=True))
    with pytest.raises(ValueError, match="not an Omni model"):
        hf_omni.get_rope_index(SimpleNamespace(model_type="qwen2_vl"), plain["input_ids"])


def test_audio_blocks_need_an_audio_scheme():
    blocks = layout.VisionBlocks(torch.tensor([[1, 1, 2]]), torch.tensor([1]), audio=torch.tensor([3]))
    from mmpos.schemes import resolve_options

    with pytest.raises(ValueError, match="applies only to schemes"):
        layout.pack(torch.ones(1, 8, dtype=torch.bool), blocks, "qwen2-vl", resolve_options("qwen2-vl"))
    assert SCHEMES["qwen2.5-omni"].audio and SCHEMES["qwen3-omni"].audio


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_packed_rows_equal_each_sample_alone(model_type):
    config, _, _ = _family(model_type)
    rng = random.Random(11)
    alone = [_random_batch(rng, model_type, config, 1, "right", rng.random() < 0.5) for _ in range(5)]
    av = alone[0]["use_audio_in_video"]
    alone = [a for a in alone if a["use_audio_in_video"] == av]  # one flag for the packed row
    cat = lambda key: (
        torch.cat([a[key] for a in alone if a[key] is not None]) if any(a[key] is not None for a in alone) else None
    )
    row = torch.cat([a["input_ids"] for a in alone], 1)
    cu = torch.tensor([0] + [a["input_ids"].shape[1] for a in alone]).cumsum(0)
    keys = ("image_grid_thw", "video_grid_thw", "audio_seqlens", "second_per_grids")
    ids, deltas = hf_omni.packed_rope_index(config, row, cu, use_audio_in_video=av, **{k: cat(k) for k in keys})
    for i, a in enumerate(alone):
        if a["image_grid_thw"] is None and a["video_grid_thw"] is None:
            want = hf_omni.get_rope_index(config, **a)  # the text branch (checked against the reference above)
        else:
            want = _reference(model_type, config, **a)
        assert torch.equal(ids[:, 0, cu[i] : cu[i + 1]], want[0][:, 0])
        assert torch.equal(deltas[i].to(want[1].dtype), want[1].view(-1)[:1])


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_non_dyadic_seconds_per_grid(model_type, monkeypatch):
    """Seconds per grid such as 2/3 s (3 fps) or 0.4 s: Qwen2.5-Omni (floored) stays exact; Qwen3-Omni's
    float32 ids are summed with the block start in float32 as the model does (the order of a video frame and
    an audio token whose times tie only after that rounding follows the model), left: at most one float32
    ulp where the model rounds a running start twice and mmpos once."""
    config, _, _ = _family(model_type)
    monkeypatch.setattr(sys.modules[__name__], "SECONDS", [2 / 3, 0.4, 1 / 3, 0.6, 2 / 2.9, 0.8, 1.2, 7 / 15])
    rng = random.Random(17)
    for trial in range(40):
        batch = _random_batch(rng, model_type, config, rng.randint(1, 4), rng.choice(["left", "right"]), trial % 2 == 0)
        if batch["video_grid_thw"] is None:
            continue
        got, want = hf_omni.get_rope_index(config, **batch), _reference(model_type, config, **batch)
        if model_type == "qwen2_5_omni":
            _assert_equal(got, want)
        else:
            torch.testing.assert_close(got[0], want[0], rtol=2.4e-7, atol=0)
            torch.testing.assert_close(got[1].view(-1), want[1].view(-1), rtol=2.4e-7, atol=0)


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
@pytest.mark.parametrize("merge", [True, False])
def test_audio_visual_order_by_merge_and_by_sort(model_type, merge, monkeypatch):
    """The TMRoPE rule places an audio-visual block's tokens by merging its video and audio keys (no sort),
    or, where keys cannot be merged exactly, by sorting them: both equal the installed release."""
    from mmpos import schemes

    used = []
    merged = schemes._merge_by_time

    def spy(*args):
        out = merged(*args) if merge else None
        used.append(out is not None)
        return out

    monkeypatch.setattr(schemes, "_merge_by_time", spy)
    config, _, _ = _family(model_type)
    rng = random.Random(7)
    for _ in range(6):
        batch = _random_batch(rng, model_type, config, 3, "left", True, kinds=("image", "video", "audio", "text"))
        if batch["video_grid_thw"] is None:
            continue
        _assert_equal(hf_omni.get_rope_index(config, **batch), _reference(model_type, config, **batch))
    assert used and all(u == merge for u in used)


def test_starts_settle_on_the_extent_rule_as_on_the_block_rule(monkeypatch):
    """Qwen3-Omni's block rule reads its block starts: the packer settles them on ``Scheme.extent`` (per block, no
    token) and places the tokens with one call of the block rule; without ``extent`` every round calls the block rule.
    Both give the same ids, and the block rule runs once per batch with ``extent``."""
    import dataclasses

    config, _, _ = _family("qwen3_omni_moe")
    own = SCHEMES["qwen3-omni"]
    assert own.reads_start and own.extent is not None
    calls = []

    def counted(g, o):
        calls.append(g.start is None)
        return own.block(g, o)

    rng = random.Random(11)
    for _ in range(8):
        batch = _random_batch(rng, "qwen3_omni_moe", config, rng.randint(2, 4), rng.choice(["left", "right"]), True)
        if batch["image_grid_thw"] is None and batch["video_grid_thw"] is None:
            continue
        calls.clear()
        monkeypatch.setitem(SCHEMES, "qwen3-omni", dataclasses.replace(own, block=counted))
        with_extent = hf_omni.get_rope_index(config, **batch)
        assert calls == [False]  # one call, at the settled starts
        monkeypatch.setitem(SCHEMES, "qwen3-omni", dataclasses.replace(own, block=counted, extent=None))
        without = hf_omni.get_rope_index(config, **batch)
        assert len(calls) > 2 and calls[1]  # the first round's call has no starts yet
        _assert_equal(with_extent, without)
        _assert_equal(with_extent, _reference("qwen3_omni_moe", config, **batch))
