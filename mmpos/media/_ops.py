"""Shared pixel operations of :mod:`mmpos.media` (private): spec resolution, the families' target sizes, resize
+ normalise, patchify and OpenCV decoding.

Read for facts in transformers 5.24's ``models/qwen2_vl/image_processing_pil_qwen2_vl.py`` (rescale, normalise,
patch rows), ``models/hy_v4_vl/video_processing_hy_v4_vl.py``, ``models/glm_image/image_processing_pil_glm_image.py``,
``models/paddleocr_vl/image_processing_pil_paddleocr_vl.py`` (sizes) and
``models/cosmos3_edge/image_processing_pil_cosmos3_edge.py`` (``(P, P, C, T)`` rows). Shapes: frames
``(F, H, W, 3)`` uint8 -> ``(F, 3, h, w)`` float32 -> rows ``(t * h * w, C * T * P * P)``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from .._extras import requires
from .._validate import check_float
from .resize import smart_resize, smart_resize_video
from .specs import MediaSpec

with requires("media"):  # one line naming the package and the extra when it is missing
    from PIL import Image as PILImage


def resolve_preset(spec: object, table: dict, overrides: dict, cls: type) -> object:
    """``spec`` (a ``cls`` dataclass, or a key of ``table``) with the ``overrides`` fields replaced."""
    if isinstance(spec, str):
        if spec not in table:
            raise ValueError(f"spec must be a {cls.__name__} or one of {tuple(table)}, got {spec!r}")
        spec = table[spec]
    elif not isinstance(spec, cls):
        raise TypeError(f"spec must be a {cls.__name__} or a model name, got {type(spec).__name__}")
    known = {f.name for f in fields(cls)}
    if unknown := sorted(set(overrides) - known):
        raise TypeError(f"unknown {cls.__name__} field(s) {unknown}; valid: {sorted(known)}")
    return replace(spec, **overrides)


def resolve(spec: str | MediaSpec, table: dict[str, MediaSpec], overrides: dict) -> MediaSpec:
    """:func:`resolve_preset` of a :class:`MediaSpec`; an explicit ``fps`` clears the preset's ``num_frames``."""
    if "fps" in overrides and overrides["fps"] is not None and "num_frames" not in overrides:
        overrides = {**overrides, "num_frames": None}  # an explicit fps replaces the preset's num_frames ...
    if "num_frames" in overrides and overrides["num_frames"] is not None and "fps" not in overrides:
        overrides = {**overrides, "fps": None}  # ... and the other way round
    return resolve_preset(spec, table, overrides, MediaSpec)


def source_name(source: object) -> str:
    return repr(os.fspath(source)) if isinstance(source, (str, os.PathLike)) else f"<{type(source).__name__}>"


def hy_v4_vl_size(
    num_frames: int, height: int, width: int, factor: int, max_pixels: int, max_frame_pixels: int | None
) -> tuple[int, int]:
    """HY-V4-VL video frame size (``HYV4VLVideoProcessor.smart_resize``): never scaled up; the most merged-token
    rows ``r <= height // factor`` (at least 1) for which a column count ``c`` stays near the frame's aspect ratio
    (``floor(width r / height) <= c < ceil(width (r + 1) / height)``, any ``c <= ...`` on the last row), within
    ``width // factor``, within the clip budget ``num_frames * r * (c + 1) <= max_pixels // factor**2`` (one newline
    token per row) and the frame cap ``r c factor**2 <= max_frame_pixels``; the widest such ``c``. ``(factor,
    factor)`` when none fits."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"aspect ratio must be at most 200, got {height}x{width}")
    budget = max_pixels // (factor * factor)  # merged tokens of the whole clip
    most_rows, most_cols = max(1, height // factor), max(1, width // factor)
    for r in range(most_rows, 0, -1):
        low = 1 if r == 1 else max(1, width * r // height)
        high = min(most_cols, max(1, -(-width * (r + 1) // height) - 1))  # ceil(width (r + 1) / height) - 1
        cols = min(high, budget // (num_frames * r) - 1 if budget > 0 else 0)
        if max_frame_pixels is not None:
            cols = min(cols, max_frame_pixels // (factor * factor * r))
        if cols >= low:
            return r * factor, cols * factor
    return factor, factor


def glm_image_size(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """GLM-Image size (``GlmImageImageProcessor``'s ``smart_resize``): one scale brings the short side up to
    ``round(sqrt(min_pixels))`` and keeps the long side within ``L = round(sqrt(max_pixels))``; the *halved* sides
    are scaled and rounded to multiples of ``factor`` (at least one), then scaled down again if one exceeds ``L``.
    Sides under ``factor`` and aspect ratios above 4 are refused, as the reference refuses them."""
    if min(height, width) < factor:
        raise ValueError(
            f"GLM-Image needs both sides >= {factor} pixels (patch_size * merge_size), got {height}x{width}"
        )
    if max(height, width) / min(height, width) > 4:
        raise ValueError(f"GLM-Image needs an aspect ratio of at most 4, got {height}x{width}")
    short, long = round(math.sqrt(min_pixels)), round(math.sqrt(max_pixels))
    scale = short / min(height, width) if min(height, width) < short else 1.0
    if max(height, width) * scale > long:
        scale = long / max(height, width)
    h = max(factor, round(height // 2 * scale / factor) * factor)
    w = max(factor, round(width // 2 * scale / factor) * factor)
    if max(h, w) > long:
        beta = max(h, w) / long
        h, w = max(factor, math.floor(h / beta / factor) * factor), max(factor, math.floor(w / beta / factor) * factor)
    return h, w


def target_size(num_frames: int, height: int, width: int, spec: MediaSpec) -> tuple[int, int]:
    """The resized ``(h, w)`` of ``num_frames`` frames by ``spec.resize`` (an image: ``num_frames = T``)."""
    factor = spec.patch_size * spec.merge_size
    if spec.resize == "volume":
        return smart_resize_video(
            num_frames, height, width, spec.temporal_patch_size, factor, spec.min_pixels, spec.max_pixels
        )
    if spec.resize == "hy-v4-vl":
        return hy_v4_vl_size(num_frames, height, width, factor, spec.max_pixels, spec.max_frame_pixels)
    if spec.resize == "glm-image":
        return glm_image_size(height, width, factor, spec.min_pixels, spec.max_pixels)
    if spec.resize == "paddleocr":  # PaddleOCR-VL: a short side scaled up to one factor first, aspect kept
        if height < factor:
            height, width = factor, round(width * factor / height)
        if width < factor:
            height, width = round(height * factor / width), factor
    return smart_resize(height, width, factor, spec.min_pixels, spec.max_pixels)


def resize_normalize(frames: np.ndarray, size: tuple[int, int], spec: MediaSpec) -> Tensor:
    """uint8 frames ``(F, H, W, 3)`` -> normalised float32 ``(F, 3, h, w)``."""
    h, w = size
    if spec.resample == "pil":
        resized = [
            np.asarray(PILImage.fromarray(f).resize((w, h), PILImage.Resampling.BICUBIC)) if f.shape[:2] != size else f
            for f in frames
        ]
        x = np.stack(resized).astype(np.float64)
        x *= 1 / 255  # rescale in float64, then cast (NumPy transformers)
        y = x.astype(np.float32)
        y -= np.array(spec.mean, np.float32)
        y /= np.array(spec.std, np.float32)
        return torch.from_numpy(y).permute(0, 3, 1, 2)  # a view; patchify copies once
    x = torch.from_numpy(np.require(frames, requirements="W")).permute(0, 3, 1, 2)  # (F, 3, H, W) uint8
    if x.shape[-2:] != size:  # uint8 bicubic with antialias, as torchvision resizes on CPU
        x = torch.nn.functional.interpolate(x, size=[h, w], mode="bicubic", align_corners=False, antialias=True)
    mean = torch.tensor(spec.mean) * (1.0 / (1 / 255))  # torchvision's fused rescale + normalise
    std = torch.tensor(spec.std) * (1.0 / (1 / 255))
    return x.float().sub_(mean.view(3, 1, 1)).div_(std.view(3, 1, 1))


def patchify(x: Tensor, spec: MediaSpec) -> tuple[Tensor, tuple[int, int, int]]:
    """Frames ``(F, C, H, W)`` -> rows ``(t * h * w, C * T * P * P)`` and ``grid_thw``."""
    p, m, tp = spec.patch_size, spec.merge_size, spec.temporal_patch_size
    multiple = tp if spec.frame_multiple is None else spec.frame_multiple
    if x.shape[0] == 1:  # a still image: the same frame T times, as a view
        x = x.expand(tp, -1, -1, -1)
    elif pad := -x.shape[0] % math.lcm(tp, multiple):  # repeat the last frame up to a whole temporal patch
        x = torch.cat([x, x[-1:].expand(pad, -1, -1, -1)])
    f, c, height, width = x.shape
    gt, gh, gw = f // tp, height // p, width // p
    last = spec.patch_layout == "ppct"  # a row's values (P, P, C, T) instead of (C, T, P, P)
    if spec.rows == "raster":
        x = x.reshape(gt, tp, c, gh, p, gw, p)  # -> (t, h, w, C, T, P, P) or (t, h, w, P, P, C, T)
        x = x.permute(0, 3, 5, 4, 6, 2, 1) if last else x.permute(0, 3, 5, 2, 1, 4, 6)
    else:
        x = x.reshape(
            gt, tp, c, gh // m, m, p, gw // m, m, p
        )  # -> (t, h/m, w/m, m, m, C, T, P, P) or (..., P, P, C, T)
        x = x.permute(0, 3, 6, 4, 7, 5, 8, 2, 1) if last else x.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return x.reshape(gt * gh * gw, c * tp * p * p).contiguous(), (gt, gh, gw)


def decode(
    path: str | os.PathLike, sample: Callable[[int, float], np.ndarray]
) -> tuple[np.ndarray, np.ndarray, float, int]:
    """:func:`read_video`'s decoding: ``sample(total, fps)`` gives the indices to keep (a ``ValueError`` it
    raises is re-raised naming the file)."""
    import cv2

    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"video path must be a str or os.PathLike, got {type(path).__name__}")
    name = source_name(path)
    if not Path(path).exists():
        raise ValueError(f"video file {name} does not exist")
    if not Path(path).is_file():
        raise ValueError(f"video file {name} is not a file (a directory?)")
    cap = cv2.VideoCapture(os.fspath(path))
    try:
        if not cap.isOpened():
            raise ValueError(f"cannot open video file {name} (not a video OpenCV can decode)")
        total = int(cap.get(cv2.CAP_PROP_FRAME_COUNT))
        fps = float(cap.get(cv2.CAP_PROP_FPS))
        if total <= 0:
            raise ValueError(f"video file {name} has no frames (container reports {total})")
        if not (math.isfinite(fps) and fps > 0):
            raise ValueError(f"video file {name} has frame rate {fps}; a positive frame rate is needed for timestamps")
        try:
            indices = sample(total, fps)
        except ValueError as err:
            raise ValueError(f"video file {name}: {err}") from err
        wanted, frames = set(indices.tolist()), {}  # decoded in order up to the last index: exact, no seeking
        last = int(indices.max())
        for i in range(last + 1):
            if not cap.grab():
                raise ValueError(
                    f"video file {name}: the container reports {total} frames but frame {i} cannot be decoded"
                )
            if i in wanted:
                ok, frame = cap.retrieve()
                if not ok:
                    raise ValueError(f"video file {name}: frame {i} cannot be decoded")
                frames[i] = cv2.cvtColor(frame, cv2.COLOR_BGR2RGB)
    finally:
        cap.release()
    return np.stack([frames[i] for i in indices.tolist()]), indices, fps, total


def sample_video(
    source: object, video_fps: float | None, sample: Callable[[int, float], np.ndarray]
) -> tuple[np.ndarray, np.ndarray, float, int]:
    """The sampled frames of a video file (:func:`decode`) or of decoded frames ``(F, H, W, 3)`` uint8 RGB
    with their ``video_fps``: ``frames`` ``(F', H, W, 3)``, ``indices`` ``(F',)``, the frame rate and the
    clip's frame count. ``sample(total, fps)`` gives the indices to keep."""
    if isinstance(source, np.ndarray):
        if source.dtype != np.uint8 or source.ndim != 4 or source.shape[3] != 3 or 0 in source.shape:
            raise ValueError(f"video array must be non-empty uint8 (F, H, W, 3), got {source.dtype} {source.shape}")
        if video_fps is None:
            raise ValueError("video_fps must be given for an array video (a positive number: its frame rate)")
        check_float(video_fps, "video_fps (the frame rate of an array video)")
        fps, total = float(video_fps), source.shape[0]
        indices = sample(total, fps)
        return source[indices], indices, fps, total
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(
            f"video must be a file path (str / os.PathLike) or uint8 frames (F, H, W, 3), got {type(source).__name__}"
        )
    if video_fps is not None:
        raise ValueError("video_fps applies to array videos only; a file's frame rate comes from its container")
    return decode(source, sample)
