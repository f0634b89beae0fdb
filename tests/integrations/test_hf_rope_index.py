"""Parity of :func:`mmpos.integrations.hf_rope_index.get_rope_index` with transformers 4.57.1."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import Qwen2_5_VLConfig, Qwen2VLConfig, Qwen3VLConfig  # noqa: E402
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel  # noqa: E402
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel  # noqa: E402
from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel  # noqa: E402

from mmpos import layout  # noqa: E402
from mmpos.integrations.hf_rope_index import RopeIndexOptions, get_rope_index, scheme_for_config  # noqa: E402

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
        text_config=dict(
            hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
            vocab_size=151700, rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]},
        ),
        vision_config=dict(depth=1, embed_dim=32, hidden_size=32, num_heads=2),
    )
    torch.manual_seed(0)
    return transformers.Qwen2VLForConditionalGeneration(config).eval()


def _reference(scheme, input_ids, images, videos, mask, seconds=None):
    config, model_cls = CONFIGS[scheme]
    kwargs = dict(input_ids=input_ids, image_grid_thw=images, video_grid_thw=videos, attention_mask=mask)
    if scheme == "qwen2.5-vl":
        kwargs["second_per_grid_ts"] = seconds
    # get_rope_index only reads self.config; a clone keeps HF's in-place edits of the grids away from ours
    kwargs = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
    return model_cls.get_rope_index(SimpleNamespace(config=config), **kwargs)


def _random_batch(rng: random.Random, scheme: str, batch: int, padding_side: str):
    """Random interleavings of text, images and videos, tokenised the Qwen way."""
    rows, types, images, videos, seconds = [], [], [], [], []
    for _ in range(batch):
        ids: list[int] = []
        kinds: list[int] = []

        def text(n):
            ids.extend(rng.randrange(10, 1000) for _ in range(n))
            kinds.extend([0] * n)

        def vision(token, kind, n):
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
                seconds.append(float(rng.choice([1, 2, 3])))
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
    grid = lambda g: torch.tensor(g, dtype=torch.long).view(-1, 3) if g else None  # noqa: E731
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
def test_random_interleavings_match_transformers(scheme, padding_side):
    rng = random.Random(f"{scheme}-{padding_side}")
    config = CONFIGS[scheme][0]
    for trial in range(25):
        unpadded = trial % 5 == 0  # a single sample without attention_mask
        batch = 1 if unpadded else rng.randint(2, 4)
        input_ids, mm_types, mask, images, videos, seconds = _random_batch(rng, scheme, batch, padding_side)
        mask = None if unpadded else mask
        ref_ids, ref_deltas = _reference(scheme, input_ids, images, videos, mask, seconds)
        kwargs = dict(image_grid_thw=images, video_grid_thw=videos, attention_mask=mask, second_per_grid_ts=seconds)
        ids, deltas = get_rope_index(config, input_ids, **kwargs)
        assert torch.equal(ids, ref_ids), (trial, ids, ref_ids)
        assert deltas.shape == ref_deltas.shape and torch.equal(deltas, ref_deltas.to(deltas.dtype))
        ids_mm, deltas_mm = get_rope_index(config, input_ids, mm_token_type_ids=mm_types, **kwargs)
        assert torch.equal(ids_mm, ref_ids) and torch.equal(deltas_mm, deltas)
        full_mask = torch.ones_like(input_ids) if mask is None else mask
        lay = layout.build(_segments(mm_types, full_mask, images, videos, seconds, scheme), scheme,
                           padding_side=padding_side)
        assert torch.equal(lay.position_ids, ref_ids) and torch.equal(lay.rope_deltas, ref_deltas)


def test_text_only_branch_matches_transformers():
    config = CONFIGS["qwen2-vl"][0]
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1]])
    input_ids = torch.randint(10, 100, mask.shape)
    for m in (mask, None):
        ref = _reference("qwen2-vl", input_ids, None, None, m)
        out = get_rope_index(config, input_ids, attention_mask=m)
        assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])


def test_model_instance_get_rope_index():
    """The bound method of a tiny random Qwen2-VL model gives the same result."""
    model = _tiny_qwen2_vl()
    input_ids, _, mask, images, videos, _ = _random_batch(random.Random(1), "qwen2-vl", 3, "left")
    ref = model.model.get_rope_index(input_ids, images, videos, mask)
    out = get_rope_index(model.config, input_ids, images, videos, mask)
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])


def test_matches_layout_build():
    """The token-id path and the segment path agree on the same sequence."""
    config = CONFIGS["qwen2.5-vl"][0]
    ids = [5, 6, START] + [IMAGE] * 6 + [END, 7, START] + [VIDEO] * 12 + [END, 8]
    lay = layout.build(
        [[layout.Text(3), layout.Image((1, 4, 6)), layout.Text(3), layout.Video((2, 4, 6), 1.5), layout.Text(2)]],
        "qwen2.5-vl",
    )
    out = get_rope_index(config, torch.tensor([ids]), torch.tensor([[1, 4, 6]]), torch.tensor([[2, 4, 6]]),
                         second_per_grid_ts=torch.tensor([1.5]))
    assert torch.equal(out[0], lay.position_ids) and torch.equal(out[1], lay.rope_deltas)


def test_qwen3_vl_timestamped_frames_match_layout_and_transformers():
    """Qwen3-VL: each frame is <timestamp text> <vision_start> frame <vision_end>."""
    ts = [901, 902]
    ids = torch.tensor([[5] + ts + [START] + [VIDEO] * 4 + [END] + ts + [START] + [VIDEO] * 4 + [END, 6]])
    grid = torch.tensor([[2, 4, 4]])
    frame = layout.Video((1, 4, 4))
    lay = layout.build([[layout.Text(4), frame, layout.Text(4), frame, layout.Text(2)]], "qwen3-vl")
    ref = _reference("qwen3-vl", ids, None, grid, None)
    out = get_rope_index(CONFIGS["qwen3-vl"][0], ids, video_grid_thw=grid)
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
    assert torch.equal(lay.position_ids, ref[0]) and torch.equal(lay.rope_deltas, ref[1])


def test_fractional_seconds_multiply_then_floor():
    """0.75 s per grid at 2 tokens/s: t = floor(t * 1.5) = 0, 1, 3 (transformers 4.57.1 truncates 0.75 to 0)."""
    config = CONFIGS["qwen2.5-vl"][0]
    ids = torch.tensor([[START] + [VIDEO] * 3 + [END]])  # video (3, 2, 2) -> 3 tokens of 1 x 1
    grid, seconds = torch.tensor([[3, 2, 2]]), torch.tensor([0.75])
    out, deltas = get_rope_index(config, ids, video_grid_thw=grid, second_per_grid_ts=seconds)
    assert out[0, 0].tolist() == [0, 1, 2, 4, 5]  # start 1 + (0, 1, 3), then max 4 + 1
    assert out[1, 0].tolist() == [0, 1, 1, 1, 5]
    assert deltas.tolist() == [[6 - 5]]


def test_spatial_advance_hand_worked():
    """transformers >= 5.3 rule: after a video the text moves by max(h, w) only.

    2 text tokens, video grid (4, 4, 6) merged to 4 x 2 x 3: block start 2; t = 2..5,
    h = 2..3, w = 2..4. "max" continues at 2 + max(3, 1, 2) + 1 = 6, "spatial" at
    2 + max(2, 3) = 5.
    """
    config = CONFIGS["qwen2-vl"][0]
    ids = torch.tensor([[11, 12] + [VIDEO] * 24 + [13]])
    grid = torch.tensor([[4, 4, 6]])
    ids_max, delta_max = get_rope_index(config, ids, video_grid_thw=grid)
    ids_sp, delta_sp = get_rope_index(config, ids, video_grid_thw=grid, advance="spatial")
    assert torch.equal(ids_max[:, 0, :26], ids_sp[:, 0, :26])
    assert ids_max[:, 0, 2:26].amax(-1).tolist() == [5, 3, 4]
    assert ids_max[:, 0, -1].tolist() == [6, 6, 6] and ids_sp[:, 0, -1].tolist() == [5, 5, 5]
    assert delta_max.item() == 7 - 27 and delta_sp.item() == 6 - 27
    # for an image (t = 1) both rules agree
    img = torch.tensor([[11, 12] + [IMAGE] * 6 + [13]])
    a = get_rope_index(config, img, image_grid_thw=torch.tensor([[1, 4, 6]]))
    b = get_rope_index(config, img, image_grid_thw=torch.tensor([[1, 4, 6]]), advance="spatial")
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_errors():
    config = CONFIGS["qwen2-vl"][0]
    ids = torch.tensor([[1, 2] + [IMAGE] * 6])
    with pytest.raises(ValueError, match="image_grid_thw describes 12 tokens"):
        get_rope_index(config, ids, image_grid_thw=torch.tensor([[1, 4, 12]]))
    with pytest.raises(ValueError, match="advance"):
        get_rope_index(config, ids, image_grid_thw=torch.tensor([[1, 4, 6]]), advance="min")
    with pytest.raises(ValueError, match="model_type"):
        get_rope_index(SimpleNamespace(model_type="llama"), ids)
    with pytest.raises(ValueError, match="attention_mask"):
        get_rope_index(config, ids, image_grid_thw=torch.tensor([[1, 4, 6]]), attention_mask=torch.ones(1, 3))
    with pytest.raises(ValueError, match="second_per_grid_ts"):
        get_rope_index(CONFIGS["qwen2.5-vl"][0], ids, video_grid_thw=torch.tensor([[1, 4, 6]]),
                       second_per_grid_ts=torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="scheme must be one of"):
        RopeIndexOptions.from_config(config, "rope-2d")
    with pytest.raises(ValueError, match="positive sizes"):
        get_rope_index(config, ids, image_grid_thw=torch.tensor([[1, 0, 6]]))
    assert scheme_for_config(CONFIGS["qwen3-vl"][0]) == "qwen3-vl"


def test_generate_uses_layout_positions_and_decode_positions():
    """During ``generate`` a tiny Qwen2-VL rotates with exactly the layout's prefill positions
    and with :func:`decode_position_ids` for every new token (left padded batch)."""
    model = _tiny_qwen2_vl()
    samples = [
        [layout.Text(2), layout.Image((1, 4, 6)), layout.Text(3)],
        [layout.Text(1), layout.Image((1, 2, 2)), layout.Text(1), layout.Image((1, 4, 4)), layout.Text(2)],
    ]
    lay = layout.build(samples, "qwen2-vl", padding_side="left")
    ids = torch.randint(10, 1000, lay.attention_mask.shape)
    ids[lay.modality == 1] = IMAGE
    starts = (lay.modality[:, 1:] == 1) & (lay.modality[:, :-1] == 0)  # the text token before each image
    ids[:, :-1][starts] = START
    ids[lay.attention_mask == 0] = 0
    grids = torch.tensor([[1, 4, 6], [1, 2, 2], [1, 4, 4]])
    pixels = torch.randn(int(grids.prod(-1).sum()), 3 * 2 * 14 * 14)
    seen = []
    rotary = model.model.language_model.rotary_emb
    hook = rotary.register_forward_hook(lambda module, args, out: seen.append(args[1].clone()))
    try:
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=lay.attention_mask, pixel_values=pixels, image_grid_thw=grids,
                           max_new_tokens=3, do_sample=False, pad_token_id=0)
    finally:
        hook.remove()
    assert torch.equal(seen[0], lay.position_ids)
    assert torch.equal(model.model.rope_deltas, lay.rope_deltas)
    length = ids.shape[1]
    for step, pos in enumerate(seen[1:]):
        assert torch.equal(pos, layout.decode_position_ids(lay.rope_deltas, length + step, 1))
    assert len(seen) == 3
