"""Clips to Qwen-VL patch rows: :func:`read_video`, :func:`video_patches` -> :class:`VideoPatches`, and
ERNIE-4.5-VL's timestamps drawn on frames.

Qwen2-VL (Wang et al. 2024, https://arxiv.org/abs/2409.12191: 2-frame temporal patches), Qwen2.5-VL (Bai et al.
2025, https://arxiv.org/abs/2502.13923: ``second_per_grid``) and Qwen3-VL (textual timestamps); read for facts in
transformers 5.24's ``models/qwen2_vl/video_processing_qwen2_vl.py``, ``models/qwen3_vl/video_processing_qwen3_vl.py``,
``processing_qwen3_vl.py`` and ``models/ernie4_5_vl_moe/video_processing_ernie4_5_vl_moe.py`` (``draw_on_frames``).
Shapes: ``pixel_values`` ``(t * h * w, 3 * T * P * P)`` with ``(t, h, w) = segment.grid_thw`` in patches.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .._extras import requires
from .._validate import check_int
from ..layout import Text, Video
from ._ops import decode, patchify, resize_normalize, resolve, sample_video, source_name, target_size
from .frames import sample_frame_indices
from .specs import VIDEO_SPECS, MediaSpec

with requires("media"):  # one line naming the package and the extra when it is missing
    from PIL import Image as PILImage
    from PIL import ImageDraw, ImageFont

__all__ = ["VideoPatches", "read_video", "video_patches"]


def read_video(
    path: str | os.PathLike, spec: str | MediaSpec = "qwen2-vl", **overrides
) -> tuple[np.ndarray, np.ndarray, float, int]:
    """Decode the sampled frames of a video file with OpenCV.

    Returns ``frames`` ``(F, H, W, 3)`` uint8 RGB, their ``indices`` ``(F,)``, the container's
    frame rate and frame count. An unreadable file, a clip of zero frames, a frame rate that
    is not positive or fewer decodable frames than the container reports raise ``ValueError``
    naming the file.
    """
    spec = resolve(spec, VIDEO_SPECS, overrides)
    return decode(path, lambda total, fps: sample_frame_indices(total, fps, spec))


@dataclass(frozen=True, eq=False)
class VideoPatches:
    """One clip as vision patches.

    Attributes:
        pixel_values: ``(t * h * w, 3 * T * P * P)`` float32 rows.
        segment: :class:`~mmpos.layout.Video` with ``grid_thw = (t, h, w)`` and
            ``second_per_grid = T / sampled_fps`` (Qwen2.5-VL).
        frame_indices: ``(F,)`` indices of the sampled frames in the clip (before padding).
        video_fps: the clip's frame rate.
        timestamps: ``t`` seconds, one per temporal patch (Qwen3-VL's, mean of the patch's
            first and last frame time).
        size: the resized frame ``(height, width)``.
    """

    pixel_values: Tensor
    segment: Video
    frame_indices: np.ndarray
    video_fps: float
    timestamps: tuple[float, ...]
    size: tuple[int, int]

    def qwen3_segments(
        self, text_tokens: Callable[[str], int], vision_start: int = 1, vision_end: int = 1
    ) -> list[Text | Video]:
        """Qwen3-VL's token layout of the clip, ``<s seconds> <start> frame <end>`` per temporal
        patch (``transformers`` ``Qwen3VLProcessor``), as segments for :func:`mmpos.layout.build`.

        Args:
            text_tokens: how many tokens the timestamp text ``"<{s:.1f} seconds>"`` takes in the
                tokenizer (e.g. ``lambda text: len(tokenizer(text).input_ids)``).
            vision_start, vision_end: tokens of the vision start / end markers around each frame.

        Returns ``[Text, Video((1, h, w))] * t`` and a final ``Text(vision_end)``: each text holds
        the previous frame's end marker, the timestamp and the start marker.
        """
        _, h, w = self.segment.grid_thw
        check_int(vision_start, "vision_start", 0)
        check_int(vision_end, "vision_end", 0)
        out: list[Text | Video] = []
        for i, s in enumerate(self.timestamps):
            n = check_int(text_tokens(f"<{s:.1f} seconds>"), "text_tokens(...)", 0)
            n += vision_start + (vision_end if i else 0)
            out += [Text(n), Video((1, h, w))] if n else [Video((1, h, w))]
        return out + ([Text(vision_end)] if vision_end else [])


def _clock(seconds: float | Tensor) -> str:
    """ERNIE-4.5-VL's frame label ``time: HH:MM:SS.ss`` (``seconds`` a float or a 0-d tensor, computed in its dtype)."""
    hours, rest = seconds // 3600, seconds % 3600
    return f"time: {int(hours):02d}:{int(rest // 60):02d}:{rest % 60:05.02f}"


def _draw_timestamps(frames: np.ndarray, indices: np.ndarray, video_fps: float, font_path: str) -> np.ndarray:
    """ERNIE-4.5-VL's ``draw_on_frames``: frame ``i``'s time ``indices[i] / video_fps`` as :func:`_clock`, black
    with a white outline, at ``(0, 0)``; font size ``int(0.1 * min(h, w))``, outline ``int(0.1 * size)``.
    The time is computed in float32 (an int32 index tensor divided by the rate), as the processor does on the
    indices its ``sample_frames`` returns (frame 6 at 0.004 fps is 1499.9999 s and reads ``00:24:60.00``, where the
    exact 1500 s would read ``00:25:00.00``).
    ``frames`` ``(F, H, W, 3)`` uint8, drawn with Pillow (returns a new array)."""
    size = int(min(frames.shape[1:3]) * 0.1)
    if size < 1:
        raise ValueError(
            f"timestamps drawn on frames need frames of at least 10 pixels a side (font size int(0.1 * min side) "
            f"> 0), got {frames.shape[1]}x{frames.shape[2]}; set timestamp_font=None"
        )
    font = ImageFont.truetype(font_path, size)
    out = np.empty_like(frames)
    seconds = torch.from_numpy(indices.astype(np.int32)) / video_fps  # (F,) float32, as the reference
    for i, frame in enumerate(frames):
        image = PILImage.fromarray(frame)
        ImageDraw.Draw(image).text(
            (0, 0),
            _clock(seconds[i]),
            font=font,
            fill=(0, 0, 0),
            stroke_width=int(size * 0.1),
            stroke_fill=(255, 255, 255),
        )
        out[i] = np.asarray(image)
    return out


def _timestamps(indices: np.ndarray, video_fps: float, tp: int) -> tuple[float, ...]:
    idx = indices.tolist()
    idx += [idx[-1]] * (-len(idx) % tp)  # padded like the frames
    seconds = [i / video_fps for i in idx]
    return tuple((seconds[i] + seconds[i + tp - 1]) / 2 for i in range(0, len(seconds), tp))


def video_patches(
    source: str | os.PathLike | np.ndarray,
    spec: str | MediaSpec = "qwen2-vl",
    *,
    video_fps: float | None = None,
    **overrides,
) -> VideoPatches:
    """Read (or take), sample, resize, normalise and patchify one clip.

    Args:
        source: a video file, or decoded frames ``(F, H, W, 3)`` uint8 RGB (then ``video_fps``
            is required and frames are sampled from them as from a file).
        spec: a key of :data:`VIDEO_SPECS` or a :class:`MediaSpec`.
        video_fps: frame rate of an array ``source`` (a file's comes from its container).
        **overrides: :class:`MediaSpec` fields to change (``fps=1``, ``num_frames=8``, ...).
    """
    spec = resolve(spec, VIDEO_SPECS, overrides)
    frames, indices, fps, total = sample_video(source, video_fps, lambda n, rate: sample_frame_indices(n, rate, spec))
    name = "<ndarray>" if isinstance(source, np.ndarray) else source_name(source)
    if spec.timestamp_font is not None:  # ERNIE-4.5-VL: each frame's time drawn on it, before resizing
        frames = _draw_timestamps(frames, indices, fps, spec.timestamp_font)
    height, width = frames.shape[1:3]
    try:
        size = target_size(len(frames), height, width, spec)
    except ValueError as err:
        raise ValueError(f"video {name}: {err}") from err
    rows, grid = patchify(resize_normalize(frames, size, spec), spec)
    sampled_fps = len(indices) / total * fps
    segment = Video(grid, spec.temporal_patch_size / sampled_fps)
    ts = _timestamps(indices, fps, spec.temporal_patch_size)
    return VideoPatches(rows, segment, indices, fps, ts, size)
