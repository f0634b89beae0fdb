"""mmpos.media.frames (``sample_frame_indices``): the indices of the installed Qwen2-VL / Qwen3-VL video processors'
``sample_frames``, and GLM-4V's rule worked by hand."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from _media_samples import needs_tv, qwen_sampler, video_metadata

from mmpos import media
from mmpos.media._ops import resolve

pytestmark = pytest.mark.hf  # parity with the installed transformers' processors: run on the oldest too


@needs_tv
@pytest.mark.parametrize("total,video_fps", [(1, 25.0), (7, 30.0), (16, 24.0), (125, 29.97), (900, 30.0)])
@pytest.mark.parametrize("rule", ["qwen2-vl", "qwen3-vl"])
@pytest.mark.parametrize("want", [{"fps": 2.0}, {"fps": 0.5}, {"num_frames": 6}, {}])
def test_frame_indices_parity_with_hf(total, video_fps, rule, want):
    spec = resolve(rule, media.VIDEO_SPECS, {"fps": None, "num_frames": None, **want})
    proc = qwen_sampler(rule)
    if rule == "qwen2-vl" and not want:  # HF's Qwen2-VL default is do_sample_frames=False: every frame
        np.testing.assert_array_equal(media.sample_frame_indices(total, video_fps, spec), np.arange(total))
        return
    try:
        ref = np.asarray(proc.sample_frames(video_metadata(total, video_fps), **want)).astype(np.int64)
    except (ValueError, ZeroDivisionError):
        with pytest.raises(ValueError, match="cannot sample"):
            media.sample_frame_indices(total, video_fps, spec)
        return
    if rule == "qwen3-vl" and not want:  # HF then samples at its default 2 fps; mmpos's preset does the same
        spec = media.VIDEO_SPECS["qwen3-vl"]
    np.testing.assert_array_equal(media.sample_frame_indices(total, video_fps, spec), ref)


@needs_tv
def test_frame_indices_where_the_reference_float_step_overshoots():
    """Qwen2-VL sampling is the reference's float32 arange(0, total, total / n), except where its rounding adds
    an index past the clip -- 367 frames at 24 fps sampled at 2 fps (n = 30) give 31 indices ending at 367, 291
    frames at 1 fps (n = 290) 291 ending at 291, which fail there: mmpos keeps the n evenly spaced frames."""
    proc = qwen_sampler("qwen2-vl")
    spec = resolve("qwen2-vl", media.VIDEO_SPECS, {"fps": 2.0})
    for total, video_fps, n in ((367, 24.0, 30), (291, 1.0, 290)):
        ref = np.asarray(proc.sample_frames(video_metadata(total, video_fps), fps=2.0)).astype(np.int64)
        assert len(ref) == n + 1 and ref[-1] == total  # the reference: one index too many, past the last frame
        ours = media.sample_frame_indices(total, video_fps, spec)
        np.testing.assert_array_equal(ours, np.arange(n) * total // n)
        np.testing.assert_array_equal(ours, ref[:n])  # the reference's own indices, without the extra one
    frames = np.zeros((291, 8, 8, 3), np.uint8)
    out = media.video_patches(frames, video_fps=1.0, fps=2.0, min_pixels=28 * 28, max_pixels=28 * 28)
    assert out.frame_indices.tolist() == list(range(290))  # (an IndexError before)


@pytest.mark.parametrize(
    ("total", "fps", "overrides", "want"),
    [
        (16, 8.0, {}, [0, 4, 8, 12]),  # 2 s at 2 fps: n = 4, frame ceil(i * 8 / 2)
        (7, 6.0, {}, [0, 3]),  # 7/6 s: n = floor(2.33) = 2, frames ceil(0), ceil(3)
        (3, 24.0, {}, [0, 0]),  # 1/8 s: at least one frame, repeated to an even count
        (9, 4.0, {"fps": 1.0}, [0, 4]),  # 2.25 s at 1 fps: n = 2, frames 0, ceil(4)
        (40, 4.0, {"max_duration": 3.0}, [0, 8, 16, 24, 32, 39]),  # 10 s > 3 s: linspace(0, 10, 6) * 4, capped
    ],
)
def test_glm4v_sampling_worked_examples(total, fps, overrides, want):
    """GLM-4V's rule computed by hand (``Glm4vVideoProcessor.sample_frames``)."""
    spec = replace(media.VIDEO_SPECS["glm4v"], **overrides)
    assert media.sample_frame_indices(total, fps, spec).tolist() == want
