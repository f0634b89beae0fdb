""":class:`MediaSpec` and the processors' presets: :data:`IMAGE_SPECS`, :data:`VIDEO_SPECS`.

Each preset is the defaults of one Hugging Face image / video processor class (transformers 5.24, read for facts
in ``models/qwen2_vl/image_processing_qwen2_vl.py``, ``video_processing_qwen2_vl.py``,
``models/qwen3_vl/video_processing_qwen3_vl.py`` and the families' processors named in :mod:`mmpos.media`);
``tests/media/test_specs.py`` and the parity tests beside it check them against those classes.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from .._extras import requires
from .._validate import check_float, check_int, is_real

with requires("media"):  # one line naming the package and the extra when it is missing
    from PIL import ImageFont

__all__ = ["IMAGE_SPECS", "VIDEO_SPECS", "MediaSpec"]

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)  # OPENAI_CLIP_MEAN in transformers.image_utils
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
HALF = (0.5, 0.5, 0.5)  # IMAGENET_STANDARD_MEAN / _STD
RESAMPLES = ("pil", "torch")
FRAME_RULES = ("qwen2-vl", "qwen3-vl", "glm4v", "glm4.6v", "ernie4.5-vl")
RESIZES = ("area", "volume", "paddleocr", "hy-v4-vl", "glm-image")
ROW_ORDERS = ("merged", "raster")
PATCH_LAYOUTS = ("ctpp", "ppct")


@dataclass(frozen=True)
class MediaSpec:
    """How one processor turns pixels into patch rows (defaults of the HF processor classes).

    Attributes:
        patch_size: vision patch side ``P`` (14 in Qwen2/2.5-VL, 16 in Qwen3-VL).
        merge_size: patches merged per token along h and w (``m``).
        temporal_patch_size: frames per temporal patch (``T``).
        min_pixels, max_pixels: area bounds of the resized image / frame (for ``"qwen3-vl"``
            frames: of the whole clip, frames x height x width).
        mean, std: per-channel normalisation (RGB).
        resample: ``"pil"`` or ``"torch"`` bicubic (see the module docstring).
        frames: video frame sampling rule, one of :data:`FRAME_RULES` (see :func:`sample_frame_indices`).
        fps: frames sampled per second of video (``None``: every frame under ``"qwen2-vl"`` and
            ``"ernie4.5-vl"``; required by ``"glm4v"``).
        num_frames: frames to sample instead of ``fps`` (exclusive with it; not read by ``"glm4v"``).
        min_frames, max_frames: bounds of the sampled frame count when sampling by ``fps``.
        resize: target size rule: ``"area"`` (:func:`smart_resize`, one frame's area within the
            bounds), ``"volume"`` (:func:`smart_resize_video`: the volume ``frames x h x w``
            bounded, ``temporal_patch_size`` frames for an image, small sides scaled up first;
            Qwen3-VL videos, GLM-4V images and videos, Cosmos3-Edge), ``"paddleocr"`` (a side under
            ``patch_size * merge_size`` scaled up to it, aspect kept, then ``"area"``; PaddleOCR-VL),
            ``"hy-v4-vl"`` (``HYV4VLVideoProcessor.smart_resize``; HY-V4-VL videos) or ``"glm-image"``
            (``GlmImageImageProcessor.smart_resize``; GLM-Image).
        rows: patch row order, ``"merged"`` (the ``m x m`` patches of a merged token consecutive)
            or ``"raster"`` (patches in raster order ``t, h, w``; PaddleOCR-VL, Hunyuan-VL).
        patch_layout: the values of one row, ``"ctpp"`` (``(C, T, P, P)``, Qwen's) or ``"ppct"``
            (``(P, P, C, T)``: pixels, then channels; Cosmos3-Edge).
        max_frame_pixels: ``resize="hy-v4-vl"``: the most pixels of one frame (``None``: no cap).
        timestamp_font: a TrueType font file: each sampled frame gets its time drawn in its top-left
            corner before resizing, as ERNIE-4.5-VL's video processor does by default
            (``draw_on_frames=True``, the checkpoint's ``Roboto-Regular.ttf``); ``None``: nothing drawn.
            The pixels equal the processor's when both are given the same font file.
        frame_multiple: frames padded (last one repeated) to a multiple of this before
            patchifying (``None``: ``temporal_patch_size``; ERNIE-4.5-VL videos: 2 with
            ``temporal_patch_size=1``).
        max_duration: ``"glm4v"`` sampling: seconds beyond which a clip is sampled by
            ``fps * max_duration`` evenly spread frames.

    Checkpoints ship their own ``preprocessor_config.json`` (e.g. other ``min_pixels`` /
    ``max_pixels``): pass those values as overrides.
    """

    patch_size: int
    min_pixels: int
    max_pixels: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    resample: str
    merge_size: int = 2
    temporal_patch_size: int = 2
    frames: str = "qwen2-vl"
    fps: float | None = None
    num_frames: int | None = None
    min_frames: int = 4
    max_frames: int = 768
    resize: str = "area"
    rows: str = "merged"
    frame_multiple: int | None = None
    max_duration: float = 300.0
    patch_layout: str = "ctpp"
    max_frame_pixels: int | None = None
    timestamp_font: str | None = None

    def __post_init__(self) -> None:
        for name in ("patch_size", "merge_size", "temporal_patch_size", "min_pixels", "max_pixels", "max_frames"):
            check_int(getattr(self, name), f"MediaSpec.{name}", 1)
        check_int(self.min_frames, "MediaSpec.min_frames", 0)
        if self.min_pixels > self.max_pixels:
            raise ValueError(f"MediaSpec.min_pixels={self.min_pixels} must be <= max_pixels={self.max_pixels}")
        for name in ("mean", "std"):
            value = getattr(self, name)
            items = () if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__") else tuple(value)
            if len(items) != 3 or not all(is_real(v) and math.isfinite(v) for v in items):
                raise ValueError(f"MediaSpec.{name} must hold 3 finite numbers (R, G, B), got {value!r}")
            object.__setattr__(self, name, items)
        if not all(s > 0 for s in self.std):
            raise ValueError(f"MediaSpec.std must be positive, got {self.std!r}")
        choices = {
            "resample": RESAMPLES,
            "frames": FRAME_RULES,
            "resize": RESIZES,
            "rows": ROW_ORDERS,
            "patch_layout": PATCH_LAYOUTS,
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"MediaSpec.{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.max_frame_pixels is not None:
            check_int(self.max_frame_pixels, "MediaSpec.max_frame_pixels (or None)", 1)
            if self.resize != "hy-v4-vl":
                raise ValueError(
                    f'MediaSpec.max_frame_pixels is read by resize="hy-v4-vl" only (got resize={self.resize!r}): '
                    "set max_frame_pixels=None"
                )
        if self.timestamp_font is not None:
            object.__setattr__(self, "timestamp_font", _check_font(self.timestamp_font))
        if self.frame_multiple is not None:
            check_int(self.frame_multiple, "MediaSpec.frame_multiple (or None)", 1)
        check_float(self.max_duration, "MediaSpec.max_duration")
        if self.fps is not None and self.num_frames is not None:
            raise ValueError("MediaSpec.fps and num_frames are exclusive: set one of them to None")
        if self.frames == "glm4v" and (self.fps is None or self.num_frames is not None):
            raise ValueError('MediaSpec.frames="glm4v" samples by fps only: set fps (e.g. 2) and num_frames=None')
        if self.fps is not None:
            check_float(self.fps, "MediaSpec.fps (or None)")
        if self.num_frames is not None:
            check_int(self.num_frames, "MediaSpec.num_frames", 1)


def _check_font(font: object) -> str:
    """``MediaSpec.timestamp_font``: the path (str) of a file Pillow loads as a TrueType / OpenType font."""
    if not isinstance(font, (str, os.PathLike)):
        raise TypeError(f"MediaSpec.timestamp_font must be None or a font file path, got {type(font).__name__}")
    path = os.fspath(font)
    if not Path(path).is_file():
        raise ValueError(f"MediaSpec.timestamp_font {path!r} is not a file (a TrueType font, e.g. Roboto-Regular.ttf)")
    try:
        ImageFont.truetype(path, 10)
    except OSError as err:
        raise ValueError(f"MediaSpec.timestamp_font {path!r} is not a font Pillow can load: {err}") from err
    return path


#: image processors: ``Qwen2VLImageProcessor`` defaults (Qwen2.5-VL and Qwen3-VL reuse that class;
#: Qwen3-VL checkpoints set ``patch_size=16`` and mean = std = 0.5)
IMAGE_SPECS: dict[str, MediaSpec] = {
    "qwen2-vl": MediaSpec(14, 56 * 56, 28 * 28 * 1280, CLIP_MEAN, CLIP_STD, "pil"),
    "qwen2.5-vl": MediaSpec(14, 56 * 56, 28 * 28 * 1280, CLIP_MEAN, CLIP_STD, "pil"),
    "qwen3-vl": MediaSpec(16, 56 * 56, 28 * 28 * 1280, HALF, HALF, "pil"),
    # Glm4vImageProcessor (GLM-4.1V / 4.5V; Glm46V's has the same defaults): the volume of T copies bounded
    "glm4v": MediaSpec(14, 112 * 112, 28 * 28 * 15000, CLIP_MEAN, CLIP_STD, "pil", resize="volume"),
    # Ernie4_5_VLMoeImageProcessor: one frame per row (T = 1)
    "ernie4.5-vl": MediaSpec(14, 56 * 56, 28 * 28 * 6177, CLIP_MEAN, CLIP_STD, "pil", temporal_patch_size=1),
    # PaddleOCRVLImageProcessor: small sides scaled up, T = 1, rows in raster order (the model merges later)
    "glm4.6v": MediaSpec(14, 112 * 112, 28 * 28 * 15000, CLIP_MEAN, CLIP_STD, "pil", resize="volume"),
    # HunYuanVLImageProcessor (and HY-V4-VL's image processor): Qwen's resize, 16-pixel patches, T = 1, raster rows
    "hunyuan-vl": MediaSpec(
        16, 512 * 512, 2048 * 2048, CLIP_MEAN, CLIP_STD, "pil", temporal_patch_size=1, rows="raster"
    ),
    "paddleocr-vl": MediaSpec(
        14, 384 * 384, 1536 * 1536, CLIP_MEAN, CLIP_STD, "pil", temporal_patch_size=1, resize="paddleocr", rows="raster"
    ),
    "hy-v4-vl": MediaSpec(16, 512 * 512, 2048 * 2048, CLIP_MEAN, CLIP_STD, "pil", temporal_patch_size=1, rows="raster"),
    # Cosmos3EdgeImageProcessor: the volume rule with T = 1, a row's values (P, P, C, T)
    "cosmos3-edge": MediaSpec(
        16, 256 * 256, 4096 * 4096, HALF, HALF, "pil", temporal_patch_size=1, resize="volume", patch_layout="ppct"
    ),
    # GlmImageImageProcessor: halved sides by edge bounds, aspect ratio <= 4
    "glm-image": MediaSpec(14, 56 * 56, 28 * 28 * 1280, CLIP_MEAN, CLIP_STD, "pil", resize="glm-image"),
}
#: video processors: ``Qwen2VLVideoProcessor`` (also Qwen2.5-VL's) and ``Qwen3VLVideoProcessor`` defaults
VIDEO_SPECS: dict[str, MediaSpec] = {
    "qwen2-vl": MediaSpec(14, 128 * 28 * 28, 28 * 28 * 768, CLIP_MEAN, CLIP_STD, "torch"),
    "qwen2.5-vl": MediaSpec(14, 128 * 28 * 28, 28 * 28 * 768, CLIP_MEAN, CLIP_STD, "torch"),
    "qwen3-vl": MediaSpec(
        16, 128 * 32 * 32, 32 * 32 * 768, HALF, HALF, "torch", frames="qwen3-vl", fps=2, resize="volume"
    ),
    # Glm4vVideoProcessor (and Glm46V's): 2 fps by duration, the clip's volume bounded
    "glm4v": MediaSpec(
        14, 112 * 112, 28 * 28 * 2 * 30000, CLIP_MEAN, CLIP_STD, "torch", frames="glm4v", fps=2, resize="volume"
    ),
    # Glm46VVideoProcessor: GLM-4V's resize, frame rate by duration (3, 1, 0.5 fps; fps not read)
    "glm4.6v": MediaSpec(
        14, 112 * 112, 28 * 28 * 2 * 30000, CLIP_MEAN, CLIP_STD, "torch", frames="glm4.6v", resize="volume"
    ),
    # Ernie4_5_VLMoeVideoProcessor: every frame (16 to 180), padded to an even count, one frame per row
    "ernie4.5-vl": MediaSpec(
        14,
        299 * 28 * 28,
        1196 * 28 * 28,
        CLIP_MEAN,
        CLIP_STD,
        "torch",
        temporal_patch_size=1,
        frame_multiple=2,
        frames="ernie4.5-vl",
        min_frames=16,
        max_frames=180,
    ),
    # HYV4VLVideoProcessor: its sample_frames (Qwen3-VL's rule, 2 fps, 2 to 1024 frames; the class's
    # do_sample_frames=False takes every frame: num_frames=F), never scaled up, a token budget per clip
    # (4096 = its unused shortest_edge), at most 1024 x 1024 pixels a frame, raster rows, T = 1
    "hy-v4-vl": MediaSpec(
        16,
        4096,
        33554432,
        HALF,
        HALF,
        "torch",
        temporal_patch_size=1,
        frames="qwen3-vl",
        fps=2,
        min_frames=2,
        max_frames=1024,
        resize="hy-v4-vl",
        rows="raster",
        max_frame_pixels=1024 * 1024,
    ),
    # Cosmos3EdgeVideoProcessor: Qwen3-VL's sampling (2 fps, 4 to 768), the volume rule with T = 1, rows (P, P, C, T)
    "cosmos3-edge": MediaSpec(
        16,
        64 * 64,
        24 * 1024 * 1024,
        HALF,
        HALF,
        "torch",
        temporal_patch_size=1,
        frames="qwen3-vl",
        fps=2,
        resize="volume",
        patch_layout="ppct",
    ),
}
