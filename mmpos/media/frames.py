"""Which frames of a clip the processors keep: :func:`sample_frame_indices` by ``MediaSpec.frames``.

Rules of Qwen2-VL / Qwen2.5-VL (Bai et al. 2025, https://arxiv.org/abs/2502.13923), Qwen3-VL, GLM-4V, GLM-4.6V and
ERNIE-4.5-VL; read for facts in transformers 5.24's ``models/qwen2_vl/video_processing_qwen2_vl.py``,
``models/qwen3_vl/video_processing_qwen3_vl.py``, ``models/glm4v/video_processing_glm4v.py``,
``models/glm46v/video_processing_glm46v.py`` and ``models/ernie4_5_vl_moe/video_processing_ernie4_5_vl_moe.py``
(``sample_frames``). Shapes: ``(F,)`` int64 indices.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .._validate import check_bytes, check_float, check_int
from .specs import MediaSpec

__all__ = ["sample_frame_indices"]


def sample_frame_indices(total_frames: int, video_fps: float, spec: MediaSpec) -> np.ndarray:
    """Indices of the frames kept from a clip of ``total_frames`` at ``video_fps`` (int64,
    sorted, may repeat under ``"qwen3-vl"`` and ``"glm4v"``), by ``spec.frames`` (see the module docstring).

    ``total_frames`` a positive int, ``video_fps`` a finite positive number, ``spec`` a :class:`MediaSpec`;
    a count of 0 frames (or more than the clip holds, under ``"qwen2-vl"``) is a ``ValueError``.

    ``"qwen2-vl"`` sampling is the reference's ``arange(0, total, total / n)`` in float32; where its rounding
    adds an index past the clip (367 frames, ``n = 30``: 31 indices, the last 367; an error in the reference)
    mmpos takes the ``n`` evenly spaced frames it means, ``floor(i * total / n)``."""
    if not isinstance(spec, MediaSpec):
        raise TypeError(f"spec must be a MediaSpec (e.g. VIDEO_SPECS['qwen2-vl']), got {type(spec).__name__}")
    check_int(total_frames, "total_frames", 1)
    check_float(video_fps, "video_fps")  # 0 divided by zero, a negative or inf rate gave a wrong count
    check_bytes(8 * total_frames, f"frame indices of a clip of total_frames={total_frames:,}")
    tp = spec.temporal_patch_size
    if spec.frames == "glm4v":
        return _glm4v_indices(total_frames, video_fps, spec)
    if spec.frames == "glm4.6v":
        return _glm46v_indices(total_frames, video_fps, spec)
    if spec.frames == "ernie4.5-vl":
        return _ernie_indices(total_frames, video_fps, spec)
    if spec.frames == "qwen3-vl":
        n = spec.num_frames
        if n is None and spec.fps is not None:
            n = min(max(int(total_frames / video_fps * spec.fps), spec.min_frames), spec.max_frames, total_frames)
        if n is None:
            n = min(max(total_frames, spec.min_frames), spec.max_frames)
        if n < 1:
            raise ValueError(f"cannot sample 0 frames from a clip of {total_frames} frames; raise fps or min_frames")
        return np.linspace(0, total_frames - 1, n).round().astype(np.int64)
    if spec.num_frames is not None:
        n = round(spec.num_frames / tp) * tp
    elif spec.fps is not None:
        most = math.floor(min(spec.max_frames, total_frames) / tp) * tp
        n = math.floor(min(max(total_frames / video_fps * spec.fps, spec.min_frames), most, total_frames) / tp) * tp
    else:
        return np.arange(total_frames, dtype=np.int64)
    if not 0 < n <= total_frames:
        raise ValueError(
            f"cannot sample {n} frames (a multiple of temporal_patch_size={tp}) from a clip of {total_frames} frames; "
            f"lower fps / num_frames or sample all frames (fps=None, num_frames=None)"
        )
    indices = torch.arange(0, total_frames, total_frames / n).int().numpy().astype(np.int64)  # as the reference
    if indices[-1] >= total_frames:
        # the reference's float32 step can overshoot the clip (367 frames, n = 30: 31 indices, the last 367),
        # where it fails; mmpos takes the n evenly spaced frames it means, floor(i * total / n)
        indices = np.arange(n, dtype=np.int64) * total_frames // n
    return indices


def _glm4v_indices(total: int, video_fps: float, spec: MediaSpec) -> np.ndarray:
    """GLM-4V: ``fps`` frames per second of the clip's duration, frame ``ceil(i * video_fps / fps)``
    (at least one); beyond ``max_duration`` seconds ``fps * max_duration`` times spread over the clip;
    repeats dropped, the last index repeated to an even count (``Glm4vVideoProcessor.sample_frames``)."""
    last, duration, fps = total - 1, total / video_fps, spec.fps
    if duration <= spec.max_duration:
        n = max(math.floor(duration * fps), 1)
        indices = [min(last, math.ceil(i * video_fps / fps)) for i in range(n)]
    elif (n := int(spec.max_duration * fps)) >= total:
        indices = list(range(total))
    else:
        indices = [min(last, math.ceil(t * video_fps)) for t in np.linspace(0, duration, n).tolist()]
    kept = list(dict.fromkeys(indices))  # first occurrences, in order
    kept += kept[-1:] * (len(kept) % 2)
    return np.array(kept, dtype=np.int64)


#: GLM-4.6V's sampling constants: frames per second by clip duration (up to 30 s, 300 s, beyond), the
#: longest duration read and the most frames (``Glm46VVideoProcessor.sample_frames``)
GLM46V_FPS = ((30.0, 3.0), (300.0, 1.0), (math.inf, 0.5))
GLM46V_MAX_DURATION, GLM46V_MAX_FRAMES = 2400.0, 640


def _glm46v_indices(total: int, video_fps: float, spec: MediaSpec) -> np.ndarray:
    """GLM-4.6V: ``k = min(int(d * r * T), 640)`` frames for the clip's first ``d = min(duration, 2400)``
    seconds at rate ``r`` (3 fps up to 30 s, 1 up to 300 s, else 0.5): the first frame at or after each
    ``1 / (T r)`` seconds up to ``int(duration)``, respread with ``linspace`` to ``k`` when that count
    differs; repeats dropped, the last repeated to an even count. ``spec.fps`` is not read."""
    tp, last, duration = spec.temporal_patch_size, total - 1, total / video_fps
    effective = min(duration, GLM46V_MAX_DURATION)
    rate = next(r for bound, r in GLM46V_FPS if effective <= bound)
    k = min(int(effective * rate * tp), GLM46V_MAX_FRAMES)
    if k < 1:
        raise ValueError(f"a clip of {duration:.3g} s is too short for GLM-4.6V sampling (no frame at {rate} fps)")
    if total < k:
        indices = np.linspace(0, last, k, dtype=int).tolist()
    else:
        indices, second, step, end, per_frame = [], 0.0, 1 / (tp * rate), int(duration), 1 / video_fps
        for i in range(total):
            if i * per_frame >= second:  # the first frame at or after each step
                second += step
                indices.append(i)
                if second >= end:
                    break
        if len(indices) < k:
            indices = np.linspace(indices[0], indices[-1], k, dtype=int).tolist()
        elif len(indices) > k:
            indices = np.linspace(0, last, k, dtype=int).tolist()
    kept = list(dict.fromkeys(indices))  # first occurrences, in order
    kept += kept[-1:] * (len(kept) % 2)
    return np.array(kept, dtype=np.int64)


def _ernie_indices(total: int, video_fps: float, spec: MediaSpec) -> np.ndarray:
    """ERNIE-4.5-VL: ``num_frames`` (within ``[min_frames, max_frames]``) or ``total / video_fps * fps``
    (every frame without ``fps``) clamped to ``[min_frames, max_frames]`` and the clip, spread with
    ``arange(0, total, total / n)`` in float32, not rounded to a multiple of ``temporal_patch_size``
    (``Ernie4_5_VLMoeVideoProcessor.sample_frames``)."""
    if spec.num_frames is not None:
        n: float = spec.num_frames
        if not spec.min_frames <= n <= spec.max_frames:
            raise ValueError(
                f"num_frames={n} must lie in [min_frames, max_frames] = [{spec.min_frames}, {spec.max_frames}]"
            )
    else:
        n = total / video_fps * spec.fps if spec.fps is not None else total
        n = min(max(n, spec.min_frames), spec.max_frames, total)
    if not 0 < n <= total:
        raise ValueError(f"cannot sample {n} frames from a clip of {total} frames; lower num_frames or fps")
    indices = torch.arange(0, total, total / n).int().numpy().astype(np.int64)  # as the reference
    # where the float32 step overshoots the clip the reference fails indexing it; the index past the end is dropped
    return indices[indices < total]
