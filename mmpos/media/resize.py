"""Qwen-VL's target sizes: :func:`smart_resize` (one image's area bounded) and :func:`smart_resize_video`
(Qwen3-VL: the clip's volume bounded).

Qwen2-VL (Wang et al. 2024, https://arxiv.org/abs/2409.12191) and Qwen3-VL; read for facts in transformers 5.24's
``models/qwen2_vl/image_processing_qwen2_vl.py`` (``smart_resize``) and
``models/qwen3_vl/video_processing_qwen3_vl.py`` (``smart_resize``). Shapes: ``(height, width)`` in pixels in,
``(h, w)`` multiples of ``factor`` out.
"""

from __future__ import annotations

import math

from .._validate import check_int

__all__ = ["smart_resize", "smart_resize_video"]


def _check_pixels(min_pixels: object, max_pixels: object) -> None:
    """Area bounds: ints with ``1 <= min_pixels <= max_pixels`` (0 or less would divide by zero or leave a 0 side)."""
    check_int(min_pixels, "min_pixels", 1)
    check_int(max_pixels, "max_pixels", 1)
    if min_pixels > max_pixels:  # type: ignore[operator]
        raise ValueError(f"min_pixels={min_pixels} must be <= max_pixels={max_pixels}")


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen-VL target size ``(h, w)``: multiples of ``factor`` nearest to ``(height, width)``,
    scaled (aspect ratio kept) into ``[min_pixels, max_pixels]`` when the rounded area falls out.

    Raises ``ValueError`` when the aspect ratio exceeds 200, as the reference does.
    """
    for value, name in ((height, "height"), (width, "width"), (factor, "factor")):
        check_int(value, name, 1)
    _check_pixels(min_pixels, max_pixels)
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"aspect ratio must be at most 200, got {height}x{width}")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def smart_resize_video(
    num_frames: int, height: int, width: int, temporal_factor: int, factor: int, min_pixels: int, max_pixels: int
) -> tuple[int, int]:
    """Qwen3-VL frame size ``(h, w)``: as :func:`smart_resize` with the clip's volume
    ``frames x h x w`` bounded instead of the area; frames smaller than ``factor`` are first
    scaled up. Needs ``num_frames >= temporal_factor`` (the reference raises otherwise)."""
    for value, name in ((num_frames, "num_frames"), (height, "height"), (width, "width"), (factor, "factor")):
        check_int(value, name, 1)
    check_int(temporal_factor, "temporal_factor", 1)
    _check_pixels(min_pixels, max_pixels)
    if num_frames < temporal_factor:
        raise ValueError(
            f"Qwen3-VL resizing needs at least temporal_patch_size={temporal_factor} frames, got {num_frames}"
        )
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"aspect ratio must be at most 200, got {height}x{width}")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    t_bar = round(num_frames / temporal_factor) * temporal_factor
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt(num_frames * height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (num_frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar
