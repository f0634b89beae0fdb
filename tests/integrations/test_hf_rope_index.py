"""Parity of :func:`mmpos.integrations.hf_rope_index.get_rope_index` with the installed transformers
(``make test`` runs it on the oldest and the newest supported release), hand-worked examples of every
rule, and the validation of bad inputs."""

from __future__ import annotations

import inspect
import math
import random
import types
from types import SimpleNamespace

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import Qwen2_5_VLConfig, Qwen2VLConfig, Qwen3VLConfig
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel
from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel

from mmpos import layout
from mmpos.integrations.hf_rope_index import (
    RopeIndexOptions,
    get_rope_index,
    installed_rule,
    scheme_for_config,
    scheme_rope_index,
    token_layout,
)

pytestmark = pytest.mark.hf  # run on the oldest and the newest supported transformers
IMAGE, VIDEO, START, END = 151655, 151656, 151652, 151653


def _configs():
    q25 = Qwen2_5_VLConfig()
    q25.vision_config.tokens_per_second = 2  # the released checkpoints
    return {
        "qwen2-vl": (Qwen2VLConfig(), Qwen2VLModel),
        "qwen2.5-vl": (q25, Qwen2_5_VLModel),
        "qwen3-vl": (Qwen3VLConfig(), Qwen3VLModel),
    }


CONFIGS = _configs()


def _tiny_qwen2_vl():
    config = Qwen2VLConfig(
        text_config={
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "vocab_size": 151700,
            "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
        },
        vision_config={"depth": 1, "embed_dim": 32, "hidden_size": 32, "num_heads": 2},
    )
    torch.manual_seed(0)
    return transformers.Qwen2VLForConditionalGeneration(config).eval()


RULE = installed_rule()  # what the installed release implements: "hf-4.57" or "hf-5.3"


def _reference(scheme, input_ids, images, videos, mask, seconds=None, mm_types=None):
    """The installed release's own ``get_rope_index`` (called with the arguments its signature takes)."""
    config, model_cls = CONFIGS[scheme]
    owner = SimpleNamespace(config=config)  # get_rope_index reads self.config (and a helper method from 5.3 on)
    if hasattr(model_cls, "get_vision_position_ids"):
        owner.get_vision_position_ids = types.MethodType(model_cls.get_vision_position_ids, owner)
    kwargs = {"input_ids": input_ids, "image_grid_thw": images, "video_grid_thw": videos, "attention_mask": mask}
    if "mm_token_type_ids" in inspect.signature(model_cls.get_rope_index).parameters:
        kwargs["mm_token_type_ids"] = mm_types
    if scheme == "qwen2.5-vl":
        kwargs["second_per_grid_ts"] = seconds
    # a clone keeps HF's in-place edits of the grids away from ours
    kwargs = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
    return model_cls.get_rope_index(owner, **kwargs)


def _random_batch(rng: random.Random, scheme: str, batch: int, padding_side: str):
    """Random interleavings of text, images and videos, tokenised the Qwen way."""
    rows, types, images, videos, seconds = [], [], [], [], []
    for _ in range(batch):
        ids: list[int] = []
        kinds: list[int] = []

        def text(n, ids=ids, kinds=kinds):
            ids.extend(rng.randrange(10, 1000) for _ in range(n))
            kinds.extend([0] * n)

        def vision(token, kind, n, ids=ids, kinds=kinds):
            ids.append(START)
            kinds.append(0)
            ids.extend([token] * n)
            kinds.extend([kind] * n)
            ids.append(END)
            kinds.append(0)

        text(rng.randint(0, 3))
        for _ in range(rng.randint(0, 4)):
            h, w = 2 * rng.randint(1, 4), 2 * rng.randint(1, 4)
            if rng.random() < 0.5:
                images.append((1, h, w))
                vision(IMAGE, 1, h * w // 4)
            else:
                t = rng.randint(1, 3)
                videos.append((t, h, w))
                seconds.append(float(rng.choice([0.25, 0.5, 0.75, 1, 1.5, 2, 3])))
                if scheme == "qwen3-vl":  # per-frame blocks separated by timestamp text
                    for _ in range(t):
                        text(rng.randint(1, 3))
                        vision(VIDEO, 2, h * w // 4)
                else:
                    vision(VIDEO, 2, t * h * w // 4)
            text(rng.randint(0, 4))
        if not ids:
            text(1)
        rows.append(ids)
        types.append(kinds)
    length = max(len(r) for r in rows)
    input_ids = torch.zeros(batch, length, dtype=torch.long)
    mm_types = torch.zeros(batch, length, dtype=torch.long)
    mask = torch.zeros(batch, length, dtype=torch.long)
    for i, (r, k) in enumerate(zip(rows, types)):
        cols = slice(0, len(r)) if padding_side == "right" else slice(length - len(r), length)
        input_ids[i, cols] = torch.tensor(r)
        mm_types[i, cols] = torch.tensor(k)
        mask[i, cols] = 1
    grid = lambda g: torch.tensor(g, dtype=torch.long).view(-1, 3) if g else None
    return input_ids, mm_types, mask, grid(images), grid(videos), torch.tensor(seconds) if seconds else None


def _segments(mm_types, mask, images, videos, seconds, scheme):
    """The same batch as :mod:`mmpos.layout` segments (runs of the token types)."""
    image_iter = iter([] if images is None else images.tolist())
    video_iter = iter([] if videos is None else zip(videos.tolist(), seconds.tolist()))
    frames_left, current = 0, None
    samples = []
    for kinds in (mm_types[b][mask[b] == 1].tolist() for b in range(mm_types.shape[0])):
        segs, run = [], 1
        for n, kind in enumerate(kinds):
            if n + 1 < len(kinds) and kinds[n + 1] == kind:
                run += 1
                continue
            if kind == 0:
                segs.append(layout.Text(run))
            elif kind == 1:
                segs.append(layout.Image(tuple(next(image_iter))))
            elif scheme == "qwen3-vl":  # one frame of the current video
                if frames_left == 0:
                    current = next(video_iter)
                    frames_left = current[0][0]
                frames_left -= 1
                segs.append(layout.Video((1, *current[0][1:])))
            else:
                grid, sec = next(video_iter)
                segs.append(layout.Video(tuple(grid), sec))
            run = 1
        samples.append(segs)
    return samples


@pytest.mark.parametrize("scheme", ["qwen2-vl", "qwen2.5-vl", "qwen3-vl"])
@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_random_interleavings_match_the_installed_release(scheme, padding_side):
    """``rule="installed"`` equals the installed ``get_rope_index`` on random interleavings of
    images and videos (fractional seconds included), from token ids and from
    ``mm_token_type_ids``; ``mmpos.layout.build`` of the same segments gives the same ids."""
    rng = random.Random(f"{scheme}-{padding_side}")
    config = CONFIGS[scheme][0]
    for trial in range(20):
        unpadded = trial % 5 == 0  # a single sample without attention_mask
        batch = 1 if unpadded else rng.randint(2, 4)
        input_ids, mm_types, mask, images, videos, seconds = _random_batch(rng, scheme, batch, padding_side)
        mask = None if unpadded else mask
        if RULE == "hf-5.3" and images is None and videos is None:
            continue  # transformers >= 5.3 has no text-only branch in get_rope_index (forward never calls it)
        ref_ids, ref_deltas = _reference(scheme, input_ids, images, videos, mask, seconds, mm_types)
        kwargs = {
            "image_grid_thw": images,
            "video_grid_thw": videos,
            "attention_mask": mask,
            "second_per_grid_ts": seconds,
        }
        ids, deltas = get_rope_index(config, input_ids, rule="installed", **kwargs)
        assert torch.equal(ids, ref_ids), (trial, ids, ref_ids)
        assert deltas.shape == ref_deltas.shape and torch.equal(deltas, ref_deltas.to(deltas.dtype))
        ids_mm, deltas_mm = get_rope_index(config, input_ids, mm_token_type_ids=mm_types, rule=RULE, **kwargs)
        assert torch.equal(ids_mm, ref_ids) and torch.equal(deltas_mm, deltas)
        if images is None and videos is None:
            continue  # transformers 4.57's text-only branch counts padding's 1 in rope_deltas; layouts do not
        full_mask = torch.ones_like(input_ids) if mask is None else mask
        lay = layout.build(
            _segments(mm_types, full_mask, images, videos, seconds, scheme),
            scheme,
            padding_side=padding_side,
            rule=RULE,
        )
        assert torch.equal(lay.position_ids, ref_ids) and torch.equal(lay.rope_deltas, ref_deltas)


def test_text_only_branch_matches_transformers_4_57_rule():
    config = CONFIGS["qwen2-vl"][0]
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1]])
    input_ids = torch.randint(10, 100, mask.shape)
    for m in (mask, None):
        ids, deltas = get_rope_index(config, input_ids, attention_mask=m, rule="hf-4.57")
        real = torch.ones_like(mask) if m is None else m
        expected = torch.where(real == 1, real.cumsum(-1) - 1, 1)
        assert torch.equal(ids, expected.expand(3, -1, -1))
        assert torch.equal(deltas, expected.amax(-1, keepdim=True) + 1 - 5)
        if RULE == "hf-4.57":
            ref = _reference("qwen2-vl", input_ids, None, None, m)
            assert torch.equal(ids, ref[0]) and torch.equal(deltas, ref[1])
    ids, deltas = get_rope_index(config, input_ids, attention_mask=mask, rule="hf-5.3")  # 0 on padding, deltas 0
    assert torch.equal(ids[0], torch.where(mask == 1, mask.cumsum(-1) - 1, 0)) and not deltas.any()


def test_model_instance_get_rope_index():
    """The bound method of a tiny random Qwen2-VL model gives the same result."""
    model = _tiny_qwen2_vl()
    input_ids, mm_types, mask, images, videos, _ = _random_batch(random.Random(1), "qwen2-vl", 3, "left")
    kwargs = {"mm_token_type_ids": mm_types} if RULE == "hf-5.3" else {}
    ref = model.model.get_rope_index(
        input_ids, image_grid_thw=images, video_grid_thw=videos, attention_mask=mask, **kwargs
    )
    out = get_rope_index(model.config, input_ids, images, videos, mask, rule="installed")
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])


def test_matches_layout_build():
    """The token-id path and the segment path return the same Layout."""
    config = CONFIGS["qwen2.5-vl"][0]
    ids = [5, 6, START] + [IMAGE] * 6 + [END, 7, START] + [VIDEO] * 12 + [END, 8]
    for rule in ("original", "hf-4.57", "hf-5.3"):
        lay = layout.build(
            [[layout.Text(3), layout.Image((1, 4, 6)), layout.Text(3), layout.Video((2, 4, 6), 1.5), layout.Text(2)]],
            "qwen2.5-vl",
            rule=rule,
        )
        options = RopeIndexOptions.from_config(config, rule=rule)
        tok = token_layout(
            options,
            torch.tensor([ids]),
            torch.tensor([[1, 4, 6]]),
            torch.tensor([[2, 4, 6]]),
            second_per_grid_ts=torch.tensor([1.5]),
        )
        for name in ("position_ids", "rope_deltas", "attention_mask", "modality"):
            assert torch.equal(getattr(tok, name), getattr(lay, name)), (rule, name)
        assert torch.equal(tok.coords.pos, lay.coords.pos) and tok.coords.axes == lay.coords.axes
        assert (tok.scheme, tok.rule) == (lay.scheme, lay.rule)


def test_position_ids_in_the_three_hf_shapes():
    """``(3, B, L)``, ``(4, B, L)`` with the text row first, and ``(B, L)`` text positions."""
    lay = layout.build(
        [[layout.Text(2), layout.Image((1, 4, 4)), layout.Text(1)], [layout.Text(2)]],
        "qwen2-vl",
        padding_side="left",
        rule="hf-5.3",
    )
    three, four, text = lay.hf_position_ids("3d"), lay.hf_position_ids("4d"), lay.hf_position_ids("text")
    assert three.shape == (3, 2, 7) and four.shape == (4, 2, 7) and text.shape == (2, 7)
    assert torch.equal(four[1:], three) and torch.equal(four[0], text)
    assert text.tolist() == [[0, 1, 2, 3, 4, 5, 6], [0, 0, 0, 0, 0, 0, 1]]
    assert three[:, 0].tolist() == [[0, 1, 2, 2, 2, 2, 4], [0, 1, 2, 2, 3, 3, 4], [0, 1, 2, 3, 2, 3, 4]]
    with pytest.raises(ValueError, match="shape"):
        lay.hf_position_ids("5d")
    vrope = layout.build([[layout.Text(1), layout.Image((1, 4, 6))]], "vrope")
    assert vrope.position_ids.shape == (4, 1, 7) and vrope.hf_position_ids().shape == (3, 1, 7)
    assert torch.equal(vrope.hf_position_ids(), vrope.position_ids[:3])


def test_qwen3_vl_timestamped_frames_match_layout_and_transformers():
    """Qwen3-VL: each frame is <timestamp text> <vision_start> frame <vision_end>."""
    ts = [901, 902]
    ids = torch.tensor([[5] + ts + [START] + [VIDEO] * 4 + [END] + ts + [START] + [VIDEO] * 4 + [END, 6]])
    types_ = (ids == VIDEO).long() * 2
    grid = torch.tensor([[2, 4, 4]])
    frame = layout.Video((1, 4, 4))
    lay = layout.build([[layout.Text(4), frame, layout.Text(4), frame, layout.Text(2)]], "qwen3-vl", rule=RULE)
    ref = _reference("qwen3-vl", ids, None, grid, None, mm_types=types_)
    out = get_rope_index(CONFIGS["qwen3-vl"][0], ids, video_grid_thw=grid, rule=RULE)
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
    assert torch.equal(lay.position_ids, ref[0]) and torch.equal(lay.rope_deltas, ref[1])


def test_fractional_seconds_per_rule():
    """0.75 s per grid at 2 tokens/s, video (3, 2, 2) -> 3 tokens of 1 x 1 after one START token.

    original / hf-5.3: t = floor(t * 1.5) = 0, 1, 3; hf-4.57 casts 0.75 to 0 first: t = 0, 0, 0."""
    config = CONFIGS["qwen2.5-vl"][0]
    ids = torch.tensor([[START] + [VIDEO] * 3 + [END]])
    grid, seconds = torch.tensor([[3, 2, 2]]), torch.tensor([0.75])
    out, deltas = get_rope_index(config, ids, video_grid_thw=grid, second_per_grid_ts=seconds, rule="original")
    assert out[0, 0].tolist() == [0, 1, 2, 4, 5] and out[1, 0].tolist() == [0, 1, 1, 1, 5]  # next: max 4 + 1
    assert deltas.tolist() == [[6 - 5]]
    out, deltas = get_rope_index(config, ids, video_grid_thw=grid, second_per_grid_ts=seconds, rule="hf-4.57")
    assert out[0, 0].tolist() == [0, 1, 1, 1, 2] and deltas.tolist() == [[3 - 5]]
    out, deltas = get_rope_index(config, ids, video_grid_thw=grid, second_per_grid_ts=seconds, rule="hf-5.3")
    assert out[0, 0].tolist() == [0, 1, 2, 4, 2]  # text after the block at start + max(h, w) = 2
    assert deltas.tolist() == [[4 + 1 - 5]]  # largest position 4, plus one, minus the real length
    if RULE in ("hf-4.57", "hf-5.3"):
        ref = _reference("qwen2.5-vl", ids, None, grid, None, seconds, (ids == VIDEO).long() * 2)
        got = get_rope_index(config, ids, video_grid_thw=grid, second_per_grid_ts=seconds, rule=RULE)
        assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])


def test_spatial_advance_hand_worked():
    """transformers >= 5.3 rule: after a video the text moves by max(h, w) only.

    2 text tokens, video grid (4, 4, 6) merged to 4 x 2 x 3: block start 2; t = 2..5,
    h = 2..3, w = 2..4. "original" continues at 2 + max(3, 1, 2) + 1 = 6, "hf-5.3" at
    2 + max(2, 3) = 5; its rope_deltas come from the largest position (5) + 1.
    """
    config = CONFIGS["qwen2-vl"][0]
    ids = torch.tensor([[11, 12] + [VIDEO] * 24 + [13]])
    grid = torch.tensor([[4, 4, 6]])
    ids_max, delta_max = get_rope_index(config, ids, video_grid_thw=grid)
    ids_sp, delta_sp = get_rope_index(config, ids, video_grid_thw=grid, rule="hf-5.3")
    assert torch.equal(ids_max[:, 0, :26], ids_sp[:, 0, :26])
    assert ids_max[:, 0, 2:26].amax(-1).tolist() == [5, 3, 4]
    assert ids_max[:, 0, -1].tolist() == [6, 6, 6] and ids_sp[:, 0, -1].tolist() == [5, 5, 5]
    assert delta_max.item() == 7 - 27 and delta_sp.item() == 6 - 27
    # for an image (t = 1) both rules agree
    img = torch.tensor([[11, 12] + [IMAGE] * 6 + [13]])
    a = get_rope_index(config, img, image_grid_thw=torch.tensor([[1, 4, 6]]))
    b = get_rope_index(config, img, image_grid_thw=torch.tensor([[1, 4, 6]]), rule="hf-5.3")
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_hf_5_3_padding_and_deltas_hand_worked():
    """Left padding: 0 on padding and rope_deltas from the real length under hf-5.3; 1 and the
    padded length under the 4.57 rules. Decoding gives the same next position either way."""
    config = CONFIGS["qwen2-vl"][0]
    ids = torch.tensor([[0, 0, 11, START] + [IMAGE] * 6 + [END]])
    mask = (torch.arange(11) >= 2).long().unsqueeze(0)
    images = torch.tensor([[1, 4, 6]])
    old, old_d = get_rope_index(config, ids, images, attention_mask=mask, rule="hf-4.57")
    new, new_d = get_rope_index(config, ids, images, attention_mask=mask, rule="hf-5.3")
    assert old[:, 0, :2].eq(1).all() and new[:, 0, :2].eq(0).all()
    assert torch.equal(old[:, :, 2:], new[:, :, 2:])
    assert old_d.item() == 6 - 11 and new_d.item() == 6 - 9  # next position 6 (text at 5 after the image)
    for rule in ("hf-4.57", "hf-5.3"):
        lay = token_layout(RopeIndexOptions.from_config(config, rule=rule), ids, images, attention_mask=mask)
        assert lay.decode(2).tolist() == [[[6, 7]]] * 3


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"second_per_grid_ts": torch.tensor([math.nan])}, "second_per_grid_ts must hold finite"),
        ({"second_per_grid_ts": torch.tensor([math.inf])}, "second_per_grid_ts must hold finite"),
        ({"second_per_grid_ts": torch.tensor([-1.0])}, "second_per_grid_ts must hold finite"),
        ({"second_per_grid_ts": torch.tensor([1e30])}, "2\\*\\*53"),
        ({"second_per_grid_ts": torch.tensor([True])}, "second_per_grid_ts must hold real"),
        ({"second_per_grid_ts": torch.tensor([1.0, 2.0])}, "one value per video"),
    ],
)
def test_bad_seconds_give_clear_errors(kwargs, match):
    """Issue 10 (2): no silent -2**63 position ids."""
    config = CONFIGS["qwen2.5-vl"][0]
    ids = torch.tensor([[START] + [VIDEO] * 12 + [END]])
    with pytest.raises(ValueError, match=match):
        get_rope_index(config, ids, video_grid_thw=torch.tensor([[2, 4, 6]]), **kwargs)


@pytest.mark.parametrize("tps", [math.nan, -2.0, 0, math.inf, True])
def test_bad_tokens_per_second_in_config(tps):
    vision = SimpleNamespace(spatial_merge_size=2, tokens_per_second=tps)  # transformers 5 configs refuse these
    config = SimpleNamespace(model_type="qwen2_5_vl", image_token_id=IMAGE, video_token_id=VIDEO, vision_config=vision)
    with pytest.raises(ValueError, match=r"tokens_per_second \(config.vision_config\) must be a finite number > 0"):
        get_rope_index(config, torch.tensor([[START] + [VIDEO] * 6 + [END]]), video_grid_thw=torch.tensor([[4, 4, 6]]))


def test_grids_straddling_two_samples_are_refused():
    """Issue 10 (1): one image's tokens split across two samples (the batch-wide count matches)."""
    config = CONFIGS["qwen2-vl"][0]
    ids = torch.tensor([[5, 6, IMAGE, IMAGE, IMAGE], [IMAGE, IMAGE, IMAGE, 7, 8]])
    with pytest.raises(ValueError, match="image_grid_thw: block 0 .*sample 0 to sample 1"):
        get_rope_index(config, ids, image_grid_thw=torch.tensor([[1, 4, 6]]))
    gap = torch.tensor([[IMAGE, IMAGE, 5, IMAGE, IMAGE, IMAGE, IMAGE]])  # one grid over two runs
    with pytest.raises(ValueError, match="consecutive tokens of one sample"):
        get_rope_index(config, gap, image_grid_thw=torch.tensor([[1, 4, 6]]))


@pytest.mark.parametrize(
    "options, match",
    [
        ({"scheme": "mrope-i", "temporal_scale": 0.5}, "temporal stride.* must be a positive int"),
        ({"scheme": "mrope-i", "temporal_scale": 2.7}, "temporal stride.* must be a positive int"),
        ({"scheme": "mrope-i", "temporal_scale": 0}, "temporal stride.* must be a positive int"),
        ({"scheme": "hope", "temporal_scale": math.inf}, "temporal_scale must be a finite positive"),
        ({"scheme": "hope", "temporal_scale": math.nan}, "temporal_scale must be a finite positive"),
        ({"scheme": "v2pe", "delta": True}, r"delta must be a number in \(0, 1\]"),
        ({"scheme": "v2pe", "delta": math.nan}, r"delta must be a number in \(0, 1\]"),
        ({"scheme": "vrope", "delta": 0.5}, "delta applies only"),
        ({"scheme": "qwen2-vl", "model_scheme": "qwen4"}, "model_scheme must be one of"),
        ({"scheme": "qwen2-vl", "rule": "5.3"}, "rule must be"),
        ({"scheme": "qwen2-vl", "merge": 0}, "merge must be a positive int"),
        ({"scheme": "rope-2d"}, "scheme must be one of"),
    ],
)
def test_rope_index_options_validate_like_layout_build(options, match):
    """Issue 10 (3): one validator serves both paths."""
    kwargs = {
        "model_scheme": "qwen2-vl",
        "merge": 2,
        "image_token_id": IMAGE,
        "video_token_id": VIDEO,
        "tokens_per_second": 2.0,
    }
    kwargs.update(options)
    with pytest.raises(ValueError, match=match):
        RopeIndexOptions(**kwargs)


def test_errors():
    config = CONFIGS["qwen2-vl"][0]
    ids = torch.tensor([[1, 2] + [IMAGE] * 6])
    with pytest.raises(ValueError, match="image_grid_thw describes 12 tokens"):
        get_rope_index(config, ids, image_grid_thw=torch.tensor([[1, 4, 12]]))
    with pytest.raises(ValueError, match="rule"):
        get_rope_index(config, ids, image_grid_thw=torch.tensor([[1, 4, 6]]), rule="min")
    with pytest.raises(ValueError, match="model_type"):
        get_rope_index(SimpleNamespace(model_type="llama"), ids)
    with pytest.raises(ValueError, match="attention_mask"):
        get_rope_index(config, ids, image_grid_thw=torch.tensor([[1, 4, 6]]), attention_mask=torch.ones(1, 3))
    with pytest.raises(ValueError, match="scheme must be one of"):
        RopeIndexOptions.from_config(config, "rope-2d")
    with pytest.raises(ValueError, match="positive sizes"):
        get_rope_index(config, ids, image_grid_thw=torch.tensor([[1, 0, 6]]))
    with pytest.raises(ValueError, match="must hold integers"):
        get_rope_index(config, ids, image_grid_thw=torch.tensor([[1.0, 4.0, 6.0]]))
    with pytest.raises(ValueError, match="divisible"):
        get_rope_index(config, ids, image_grid_thw=torch.tensor([[1, 3, 8]]))
    with pytest.raises(ValueError, match="mm_token_type_ids must hold"):
        get_rope_index(config, ids, image_grid_thw=torch.tensor([[1, 4, 6]]), mm_token_type_ids=torch.full((1, 8), 3))
    assert scheme_for_config(CONFIGS["qwen3-vl"][0]) == "qwen3-vl"


def test_generate_uses_layout_positions_and_decode_positions():
    """During ``generate`` a tiny Qwen2-VL rotates with exactly the layout's prefill positions
    and with the layout's decode positions for every new token (left padded batch), under the
    installed release's rule."""
    model = _tiny_qwen2_vl()
    samples = [
        [layout.Text(2), layout.Image((1, 4, 6)), layout.Text(3)],
        [layout.Text(1), layout.Image((1, 2, 2)), layout.Text(1), layout.Image((1, 4, 4)), layout.Text(2)],
    ]
    lay = layout.build(samples, "qwen2-vl", padding_side="left", rule=RULE)
    ids = torch.randint(10, 1000, lay.attention_mask.shape)
    ids[lay.modality == 1] = IMAGE
    starts = (lay.modality[:, 1:] == 1) & (lay.modality[:, :-1] == 0)  # the text token before each image
    ids[:, :-1][starts] = START
    ids[lay.attention_mask == 0] = 0
    grids = torch.tensor([[1, 4, 6], [1, 2, 2], [1, 4, 4]])
    pixels = torch.randn(int(grids.prod(-1).sum()), 3 * 2 * 14 * 14)
    extra = {"mm_token_type_ids": lay.modality} if RULE == "hf-5.3" else {}
    seen = []
    rotary = model.model.language_model.rotary_emb
    hook = rotary.register_forward_hook(lambda module, args, out: seen.append(args[1].clone()))
    try:
        with torch.no_grad():
            model.generate(
                input_ids=ids,
                attention_mask=lay.attention_mask,
                pixel_values=pixels,
                image_grid_thw=grids,
                max_new_tokens=3,
                do_sample=False,
                pad_token_id=0,
                **extra,
            )
    finally:
        hook.remove()
    assert torch.equal(seen[0], lay.hf_position_ids())
    assert torch.equal(model.model.rope_deltas, lay.rope_deltas)
    length = ids.shape[1]
    for step, pos in enumerate(seen[1:]):
        assert torch.equal(pos, lay.decode(1, length + step))
    assert len(seen) == 3


@pytest.mark.parametrize("scheme", ["qwen2-vl", "qwen2.5-vl", "qwen3-vl"])
def test_packed_rows_equal_each_sample_alone(scheme):
    """Packed / variable-length batches: one row of several samples with ``cu_seqlens``; each
    sample's ids and rope_deltas equal the installed ``get_rope_index`` of that sample alone."""
    from mmpos.integrations.hf_rope_index import packed_rope_index

    rng = random.Random(f"packed-{scheme}")
    config = CONFIGS[scheme][0]
    for _ in range(5):
        parts = []
        while len(parts) < 3:  # samples with at least one vision block (5.3 has no text-only branch)
            part = _random_batch(rng, scheme, 1, "right")
            if part[3] is not None or part[4] is not None:
                parts.append(part)
        input_ids = torch.cat([p[0] for p in parts], 1)
        mm_types = torch.cat([p[1] for p in parts], 1)
        given = [[p[i] for p in parts if p[i] is not None] for i in (3, 4, 5)]
        images, videos, seconds = (torch.cat(g) if g else None for g in given)
        lengths = [p[0].shape[1] for p in parts]
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
        ids, deltas = packed_rope_index(
            config, input_ids, cu, images, videos, seconds, mm_types if RULE == "hf-5.3" else None, rule=RULE
        )
        assert ids.shape == (3, 1, sum(lengths)) and deltas.shape == (3, 1)
        for k, p in enumerate(parts):
            ref_ids, ref_deltas = _reference(scheme, p[0], p[3], p[4], None, p[5], p[1])
            assert torch.equal(ids[:, :, cu[k] : cu[k + 1]], ref_ids), (scheme, k)
            assert torch.equal(deltas[k], ref_deltas.reshape(-1).to(deltas.dtype))
    with pytest.raises(ValueError, match="cu_seqlens must rise strictly from 0"):
        packed_rope_index(config, input_ids, torch.tensor([0, 3, 3, sum(lengths)]), images, videos, seconds)
    with pytest.raises(ValueError, match=r"input_ids must be a packed \(1, N\)"):
        packed_rope_index(config, input_ids.expand(2, -1), cu, images, videos, seconds)


@pytest.mark.parametrize("scheme", ["ilrope", "omnirope", "mmrope"])
def test_frame_block_schemes_on_a_qwen2_vl_prompt_match_layout_build(scheme):
    """ILRoPE / OmniRoPE / MM-RoPE place a video as one block per frame: from a Qwen2-VL prompt (one run of
    video tokens) the token-id path splits it as ``layout.build`` does (both checked against the references'
    loops in tests/test_schemes.py)."""
    segs = [layout.Text(3), layout.Image((1, 4, 6)), layout.Text(3), layout.Video((2, 4, 4)), layout.Text(2)]
    ids = torch.tensor([[5, 6, START] + [IMAGE] * 6 + [END, 7, START] + [VIDEO] * 8 + [END, 8]])
    options = RopeIndexOptions.from_config(CONFIGS["qwen2-vl"][0], scheme=scheme)
    position_ids, deltas = scheme_rope_index(options, ids, torch.tensor([[1, 4, 6]]), torch.tensor([[2, 4, 4]]))
    lay = layout.build([segs], scheme)
    assert torch.equal(position_ids, lay.hf_position_ids("3d")) and torch.equal(deltas, lay.rope_deltas)
    t = position_ids[0, 0]  # frames at tokens 12-15 and 16-19: each one time position, the second later
    assert len(set(t[12:16].tolist())) == 1 and len(set(t[16:20].tolist())) == 1 and t[16] > t[12]
