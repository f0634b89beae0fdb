"""ERNIE-4.5-VL's timestamps drawn on the frames (``draw_on_frames``, on by default in
``Ernie4_5_VLMoeVideoProcessor``): mmpos's ``timestamp_font`` against the installed processor given the same font.

The checkpoint ships ``Roboto-Regular.ttf`` (the class's ``font``, loaded from the checkpoint folder); both draw with
Pillow, so any TrueType file passed to both gives the same pixels. The test uses matplotlib's DejaVuSans.ttf
(a registry package, installed in both environments)."""

from __future__ import annotations

import importlib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from mmpos import media

pytestmark = pytest.mark.hf  # parity with the installed transformers' processors: run on the oldest too

transformers = pytest.importorskip("transformers", reason="parity with the HF processors needs transformers")
pytest.importorskip("torchvision", reason="the HF video processors need torchvision")
matplotlib = pytest.importorskip("matplotlib", reason="the test font is matplotlib's DejaVuSans.ttf")
FONT = str(Path(matplotlib.get_data_path(), "fonts", "ttf", "DejaVuSans.ttf"))
VideoMetadata = importlib.import_module("transformers.video_utils").VideoMetadata


def _processor(**kwargs):
    try:
        module = importlib.import_module("transformers.models.ernie4_5_vl_moe.video_processing_ernie4_5_vl_moe")
    except ImportError:
        pytest.skip(f"transformers {transformers.__version__} has no ernie4_5_vl_moe (the family is newer)")
    return module.Ernie4_5_VLMoeVideoProcessor(**kwargs)


def _frames(total: int, h: int, w: int) -> np.ndarray:
    rng = np.random.default_rng(total * h + w)
    base = (np.arange(h)[:, None, None] * 255 // max(h - 1, 1) + np.zeros((1, w, 3), int)).astype(np.uint8)
    return np.stack([base + rng.integers(0, 40, (h, w, 3), dtype=np.uint8) for _ in range(total)])


def test_the_checkpoint_font_is_roboto():
    """The class default names the checkpoint's font file (not shipped with transformers: the test passes its own)."""
    module = pytest.importorskip("transformers.models.ernie4_5_vl_moe.video_processing_ernie4_5_vl_moe")
    cls = module.Ernie4_5_VLMoeVideoProcessor
    assert cls.draw_on_frames is True and cls.font == "Roboto-Regular.ttf"


# (frames, fps, height, width, overrides): every frame (16..180), padded odd counts, a long clip (hours in the
# label), sampled by fps, frames scaled up and down after drawing
CASES = [
    (17, 4.0, 64, 96, {}),
    (16, 0.004, 50, 70, {}),  # 16 frames 250 s apart: labels past one hour (time: 01:02:30.00)
    (21, 30.0, 300, 400, {"min_pixels": 28 * 28 * 8, "max_pixels": 28 * 28 * 40}),
    (40, 10.0, 120, 90, {"fps": 5.0}),  # 20 frames sampled, arange(0, 40, 2)
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}f{c[1]:g}fps{c[2]}x{c[3]}")
def test_drawn_frames_parity_with_hf(case):
    total, fps, h, w, overrides = case
    spec = replace(media.VIDEO_SPECS["ernie4.5-vl"], **overrides, timestamp_font=FONT)
    frames = _frames(total, h, w)
    ours = media.video_patches(frames, spec, video_fps=fps)
    kwargs = {"size": {"shortest_edge": spec.min_pixels, "longest_edge": spec.max_pixels}, "font": FONT}
    kwargs.update({"fps": spec.fps} if spec.fps else {})
    proc = _processor(**kwargs)
    assert proc.draw_on_frames is True  # the processor's default
    meta = VideoMetadata(total_num_frames=total, fps=fps, duration=total / fps, width=w)
    meta.height = h
    video = torch.from_numpy(frames).permute(0, 3, 1, 2)
    out = proc(videos=[video], video_metadata=[meta], do_sample_frames=True, return_tensors="pt")
    assert ours.segment.grid_thw == tuple(out["video_grid_thw"][0].tolist())
    torch.testing.assert_close(ours.pixel_values, out["pixel_values_videos"], rtol=0, atol=0)
    plain = media.video_patches(frames, replace(spec, timestamp_font=None), video_fps=fps)
    assert not torch.equal(plain.pixel_values, ours.pixel_values)  # the labels changed pixels


def test_drawn_label_by_hand():
    """ERNIE's label ``time: HH:MM:SS.ss`` drawn by hand with Pillow (black, white outline, font size
    int(0.1 * 112) = 11, outline 1) equals mmpos's drawing: frame 1 of a clip at 1 / 3725.5 fps is at
    1 h 2 min 5.5 s."""
    from PIL import Image as PILImage
    from PIL import ImageDraw, ImageFont

    frames = np.full((16, 112, 224, 3), 255, np.uint8)
    spec = replace(media.VIDEO_SPECS["ernie4.5-vl"], min_pixels=1, max_pixels=112 * 224)  # no resize
    drawn = media.video_patches(frames, spec, video_fps=1 / 3725.5, timestamp_font=FONT)
    by_hand = frames.copy()
    font = ImageFont.truetype(FONT, 11)
    for i, label in enumerate(["time: 00:00:00.00", "time: 01:02:05.50"]):
        image = PILImage.fromarray(by_hand[i])
        ImageDraw.Draw(image).text((0, 0), label, font=font, fill=(0, 0, 0), stroke_width=1, stroke_fill=(255,) * 3)
        by_hand[i] = np.asarray(image)
    first_two = media.video_patches(by_hand[:2], spec, video_fps=1 / 3725.5, num_frames=None, min_frames=1)
    rows = first_two.pixel_values.shape[0]
    torch.testing.assert_close(drawn.pixel_values[:rows], first_two.pixel_values, rtol=0, atol=0)
    assert by_hand[1].min() == 0 and by_hand[1, 60:].min() == 255  # the label is in the top-left corner only


def test_font_errors():
    with pytest.raises(ValueError, match="timestamp_font 'missing.ttf' is not a file"):
        replace(media.VIDEO_SPECS["ernie4.5-vl"], timestamp_font="missing.ttf")
    with pytest.raises(ValueError, match="is not a font Pillow can load"):
        replace(media.VIDEO_SPECS["ernie4.5-vl"], timestamp_font=__file__)
    with pytest.raises(TypeError, match="timestamp_font must be None or a font file path"):
        replace(media.VIDEO_SPECS["ernie4.5-vl"], timestamp_font=3)
    with pytest.raises(ValueError, match="timestamp_font draws the times of video frames"):
        media.image_patches(np.zeros((28, 28, 3), np.uint8), "ernie4.5-vl", timestamp_font=FONT)
    with pytest.raises(ValueError, match="need frames of at least 10 pixels"):
        media.video_patches(np.zeros((16, 9, 40, 3), np.uint8), "ernie4.5-vl", video_fps=2.0, timestamp_font=FONT)
