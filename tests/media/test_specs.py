"""mmpos.media.specs (``MediaSpec`` and its presets): the fields' validation, and each family's preset against the
defaults of the installed Hugging Face processor classes."""

from __future__ import annotations

import numpy as np
import pytest
from _media_samples import FAMILIES, PRESET, VIDEO_PRESET, family_image_class, family_module, needs_tv, noise

from mmpos import media

pytestmark = pytest.mark.hf  # parity with the installed transformers' processors: run on the oldest too


def test_spec_validation():
    with pytest.raises(ValueError, match="spec must be"):
        media.image_patches(noise(8, 8), "qwen9")
    with pytest.raises(TypeError, match="unknown MediaSpec field"):
        media.image_patches(noise(8, 8), patchsize=16)
    with pytest.raises(ValueError, match="resample"):
        media.image_patches(noise(8, 8), resample="bilinear")
    with pytest.raises(ValueError, match="min_pixels"):
        media.MediaSpec(14, 100, 10, media.CLIP_MEAN, media.CLIP_STD, "pil")
    with pytest.raises(ValueError, match="exclusive"):
        media.MediaSpec(14, 1, 10, media.CLIP_MEAN, media.CLIP_STD, "pil", fps=1, num_frames=4)
    with pytest.raises(ValueError, match="std"):
        media.MediaSpec(14, 1, 10, media.CLIP_MEAN, (1, 0, 1), "pil")


def test_family_spec_errors():
    with pytest.raises(ValueError, match="MediaSpec.resize must be one of"):
        media.MediaSpec(14, 1, 10, media.CLIP_MEAN, media.CLIP_STD, "pil", resize="bilinear")
    with pytest.raises(ValueError, match="MediaSpec.rows must be one of"):
        media.MediaSpec(14, 1, 10, media.CLIP_MEAN, media.CLIP_STD, "pil", rows="column")
    with pytest.raises(ValueError, match='max_frame_pixels is read by resize="hy-v4-vl" only'):
        media.MediaSpec(14, 1, 10, media.CLIP_MEAN, media.CLIP_STD, "pil", max_frame_pixels=100)
    with pytest.raises(ValueError, match="MediaSpec.patch_layout must be one of"):
        media.MediaSpec(14, 1, 10, media.CLIP_MEAN, media.CLIP_STD, "pil", patch_layout="hwc")
    with pytest.raises(ValueError, match="frame_multiple"):
        media.MediaSpec(14, 1, 10, media.CLIP_MEAN, media.CLIP_STD, "pil", frame_multiple=0)
    with pytest.raises(ValueError, match='frames="glm4v" samples by fps only'):
        media.video_patches(np.zeros((4, 28, 28, 3), np.uint8), "glm4v", video_fps=2.0, num_frames=4)
    with pytest.raises(ValueError, match=r"num_frames=8 must lie in \[min_frames, max_frames\] = \[16, 180\]"):
        media.video_patches(np.zeros((20, 28, 28, 3), np.uint8), "ernie4.5-vl", video_fps=2.0, num_frames=8)


# --------------------------------------------------------------------------- presets = class defaults
@needs_tv
@pytest.mark.parametrize("family", list(FAMILIES))
def test_presets_are_the_processor_defaults(family):
    """Each preset holds the defaults of the family's processor classes (the parity tests of test_images.py and
    test_video.py build them bare)."""
    image = family_image_class(family, "pil")()
    spec = media.IMAGE_SPECS[PRESET[family]]
    size = image.size if isinstance(image.size, dict) else dict(image.size)
    assert (size["shortest_edge"], size["longest_edge"]) == (spec.min_pixels, spec.max_pixels)
    assert (image.patch_size, image.merge_size) == (spec.patch_size, spec.merge_size)
    assert image.temporal_patch_size == spec.temporal_patch_size
    assert tuple(image.image_mean) == spec.mean and tuple(image.image_std) == spec.std
    if FAMILIES[family][2] is None:
        return
    kwargs = {"draw_on_frames": False} if family == "ernie4.5-vl" else {}
    video = getattr(family_module(family, "video_processing"), FAMILIES[family][2])(**kwargs)
    spec = media.VIDEO_SPECS[VIDEO_PRESET[family]]
    assert (video.size["shortest_edge"], video.size["longest_edge"]) == (spec.min_pixels, spec.max_pixels)
    assert (video.patch_size, video.merge_size) == (spec.patch_size, spec.merge_size)
    assert tuple(video.image_mean) == spec.mean and tuple(video.image_std) == spec.std
    if family == "ernie4.5-vl":  # frames padded to 2, one frame per row
        assert video.temporal_patch_size == 2 == spec.frame_multiple and spec.temporal_patch_size == 1
        assert (video.min_frames, video.max_frames, video.fps) == (spec.min_frames, spec.max_frames, spec.fps)
    elif family == "glm46v":  # its sampling reads no fps (a rate by duration)
        assert video.temporal_patch_size == spec.temporal_patch_size == 2 and spec.fps is None
    elif family in ("cohere-compass", "hy-v4-vl", "cosmos3-edge"):  # Qwen3-VL's sampling rule
        assert (video.temporal_patch_size, video.fps) == (spec.temporal_patch_size, spec.fps)
        assert (video.min_frames, video.max_frames) == (spec.min_frames, spec.max_frames)
        assert spec.frames == "qwen3-vl"
        if family == "hy-v4-vl":  # the per-frame cap
            assert video.max_image_size["longest_edge"] == spec.max_frame_pixels
    else:
        assert (video.temporal_patch_size, video.fps, video.max_duration) == (2, spec.fps, spec.max_duration)
