"""Image and video files to vision patches and layout segments, as the Qwen-VL processors do.

Models: Qwen2-VL (Wang et al. 2024, https://arxiv.org/abs/2409.12191: naive dynamic
resolution, 14-pixel patches merged 2 x 2, 2-frame temporal patches), Qwen2.5-VL (Bai et al.
2025, https://arxiv.org/abs/2502.13923: absolute time, ``second_per_grid``) and Qwen3-VL
(textual timestamps between frames, 16-pixel patches).

:func:`image_patches` and :func:`video_patches` take a file (or bytes, a ``PIL.Image``, an
array) and return the pixel rows the Qwen-VL vision towers take, ``(N, C * T * P * P)``
float32, with the :class:`~mmpos.layout.Image` / :class:`~mmpos.layout.Video` segment that
:func:`mmpos.layout.build` turns into positions. The rules are those of the Hugging Face
processors (transformers 5.24 and 4.57, read for facts in
``models/qwen2_vl/image_processing_pil_qwen2_vl.py``, ``image_processing_qwen2_vl.py``,
``video_processing_qwen2_vl.py``, ``models/qwen3_vl/video_processing_qwen3_vl.py``,
``processing_qwen2_5_vl.py``, ``processing_qwen3_vl.py``); the tests compare grids and
pixel rows against those processors directly.

* **Load**: EXIF orientation applied; transparency composited onto white, every other mode
  converted to RGB (as transformers 5.x and ``qwen-vl-utils`` do; transformers 4.57 drops
  the alpha channel instead).
* **Resize** (:func:`smart_resize`): both sides a multiple of ``patch_size * merge_size``,
  area within ``[min_pixels, max_pixels]``, aspect ratio kept; bicubic. ``resample="pil"``
  is Pillow's bicubic on uint8 (the PIL image processors), ``resample="torch"`` is
  ``torch.nn.functional.interpolate(mode="bicubic", antialias=True)`` on uint8 (what
  torchvision does on CPU: the torchvision image processors and every video processor).
* **Normalise**: ``(x / 255 - mean) / std`` in float32 (``"pil"``: rescale in float64 then
  cast, as NumPy transformers does; ``"torch"``: ``(x - 255 mean) / (255 std)``, torchvision's
  fused form).
* **Patchify**: frames padded to a multiple of ``temporal_patch_size`` by repeating the last
  one (a still image is repeated ``temporal_patch_size`` times); row ``r`` is patch
  ``(t, h, w)`` in the order ``t``, ``h // m``, ``w // m``, ``h % m``, ``w % m``
  (``m = merge_size``), so the ``m * m`` patches of one merged token are consecutive rows and
  the merged tokens run in raster order -- the order :mod:`mmpos.layout` assigns positions
  in. Each row holds ``(C, T, P, P)`` values.
* **Videos** are read with OpenCV (frame count and rate from the container). Frame sampling
  follows ``frames``: ``"qwen2-vl"`` (Qwen2-VL / Qwen2.5-VL: all frames, or ``fps`` /
  ``num_frames`` rounded to ``temporal_patch_size``, indices ``arange(0, n, n / k)``) or
  ``"qwen3-vl"`` (``fps=2`` by default, clamped to ``[min_frames, max_frames]``, indices
  ``linspace(0, n - 1, k).round()``, and the joint (frames, height, width) resize).
  ``second_per_grid = temporal_patch_size / sampled_fps`` with ``sampled_fps`` the real
  rate of the kept frames (transformers 5.x; 4.57 used the *requested* fps), and
  :attr:`VideoPatches.timestamps` are Qwen3-VL's per temporal patch (mean of its first and
  last frame's time).

* **Other families** (GLM-4V, GLM-4.6V, GLM-Image, ERNIE-4.5-VL, PaddleOCR-VL, Hunyuan-VL, HY-V4-VL,
  Cosmos3-Edge): presets of the same functions, their processors' rules as :class:`MediaSpec` fields
  (``resize``, ``rows``, ``patch_layout``, ``frame_multiple``, ``frames``, ``max_duration``,
  ``max_frame_pixels``, ``timestamp_font``); read for facts in transformers 5.24's
  ``models/glm4v/{image_processing_pil_glm4v,video_processing_glm4v}.py``,
  ``models/glm46v/video_processing_glm46v.py``, ``models/glm_image/image_processing_pil_glm_image.py``,
  ``models/ernie4_5_vl_moe/*processing*.py``, ``models/paddleocr_vl/image_processing_pil_paddleocr_vl.py``,
  ``models/hunyuan_vl/image_processing_pil_hunyuan_vl.py``, ``models/hy_v4_vl/video_processing_hy_v4_vl.py``
  and ``models/cosmos3_edge/{image_processing_pil_cosmos3_edge,video_processing_cosmos3_edge}.py``;
  ``tests/test_media_families*.py`` compare against those processors.
* **MiniCPM-V 4.6 / 4.7** slice an image into a grid of crops plus a thumbnail: :func:`image_slices`
  and :func:`video_slices` (``models/minicpmv4_6/{image_processing_pil,video_processing}_minicpmv4_6.py``)
  return the crops' rows and the ``target_sizes`` that
  :func:`mmpos.integrations.hf_families.minicpmv4_7_rope_index` reads.

Shapes: ``pixel_values`` ``(t * h * w, 3 * temporal_patch_size * patch_size ** 2)`` with
``(t, h, w) = segment.grid_thw`` in patches before the spatial merge.
"""

from __future__ import annotations

import io
import math
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ._extras import requires
from ._validate import check_bytes, check_float, check_int, is_real
from .layout import Image, Text, Video

with requires("media"):  # one line naming the package and the extra when it is missing
    from PIL import Image as PILImage
    from PIL import ImageDraw, ImageFont, ImageOps, UnidentifiedImageError

__all__ = [
    "IMAGE_SPECS",
    "SLICE_SPECS",
    "VIDEO_SLICE_SPECS",
    "VIDEO_SPECS",
    "ImagePatches",
    "ImageSlices",
    "MediaSpec",
    "SliceSpec",
    "VideoPatches",
    "VideoSlices",
    "image_patches",
    "image_slices",
    "load_image",
    "minicpm_frame_indices",
    "read_video",
    "sample_frame_indices",
    "smart_resize",
    "smart_resize_video",
    "video_patches",
    "video_slices",
]

ImageSource = str | os.PathLike | bytes | PILImage.Image | np.ndarray
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
            ``"hy-v4-vl"`` (:func:`hy_v4_vl_resize`; HY-V4-VL videos) or ``"glm-image"``
            (:func:`glm_image_resize`; GLM-Image).
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
        if self.resample not in RESAMPLES:
            raise ValueError(f"MediaSpec.resample must be one of {RESAMPLES}, got {self.resample!r}")
        if self.frames not in FRAME_RULES:
            raise ValueError(f"MediaSpec.frames must be one of {FRAME_RULES}, got {self.frames!r}")
        if self.resize not in RESIZES:
            raise ValueError(f"MediaSpec.resize must be one of {RESIZES}, got {self.resize!r}")
        if self.rows not in ROW_ORDERS:
            raise ValueError(f"MediaSpec.rows must be one of {ROW_ORDERS}, got {self.rows!r}")
        if self.patch_layout not in PATCH_LAYOUTS:
            raise ValueError(f"MediaSpec.patch_layout must be one of {PATCH_LAYOUTS}, got {self.patch_layout!r}")
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


def _resolve(spec: str | MediaSpec, table: dict[str, MediaSpec], overrides: dict) -> MediaSpec:
    if isinstance(spec, str):
        if spec not in table:
            raise ValueError(f"spec must be a MediaSpec or one of {tuple(table)}, got {spec!r}")
        spec = table[spec]
    elif not isinstance(spec, MediaSpec):
        raise TypeError(f"spec must be a MediaSpec or a model name, got {type(spec).__name__}")
    known = {f.name for f in fields(MediaSpec)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise TypeError(f"unknown MediaSpec field(s) {unknown}; valid: {sorted(known)}")
    if "fps" in overrides and overrides["fps"] is not None and "num_frames" not in overrides:
        overrides = {**overrides, "num_frames": None}  # an explicit fps replaces the preset's num_frames ...
    if "num_frames" in overrides and overrides["num_frames"] is not None and "fps" not in overrides:
        overrides = {**overrides, "fps": None}  # ... and the other way round
    return replace(spec, **overrides)


# --------------------------------------------------------------------------- images
def _name(source: object) -> str:
    return repr(os.fspath(source)) if isinstance(source, (str, os.PathLike)) else f"<{type(source).__name__}>"


#: PIL modes of more than 8 bits per sample: ``convert("RGB")`` clips them at 255 (saturating to white)
_WIDE_MODES = ("I", "F", "I;16", "I;16B", "I;16L", "I;16N", "I;16S")


def _to_rgb(image: PILImage.Image, name: str = "<PIL.Image>") -> PILImage.Image:
    """Transparency onto a white background, anything else converted to RGB.

    A 16-bit, 32-bit integer (``I``) or float (``F``) image whose values exceed 255 is refused
    (``ValueError`` naming it): converting it to 8 bits would clip every brighter pixel to white.
    """
    if image.mode in _WIDE_MODES:
        low, high = image.getextrema()
        if low < 0 or high > 255:
            raise ValueError(
                f"image {name} has mode {image.mode!r} (more than 8 bits per pixel) with values in [{low}, {high}]: "
                "converting it to 8-bit RGB would clip them to [0, 255] (bright areas turn white); scale it to "
                f"uint8 first, e.g. load_image((np.asarray(img) / {high} * 255).astype(np.uint8))"
            )
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        background = PILImage.new("RGBA", rgba.size, (255, 255, 255, 255))
        return PILImage.alpha_composite(background, rgba).convert("RGB")
    return image if image.mode == "RGB" else image.convert("RGB")


def load_image(source: ImageSource) -> PILImage.Image:
    """An RGB ``PIL.Image`` from a path, encoded bytes, a ``PIL.Image`` or a uint8 array.

    Arrays are ``(H, W)``, ``(H, W, 1)``, ``(H, W, 3)`` (RGB) or ``(H, W, 4)`` (RGBA), uint8.
    EXIF orientation is applied to files, bytes and ``PIL`` images. A file that cannot be
    decoded (missing, not an image, truncated) raises ``ValueError`` naming it.
    """
    if isinstance(source, np.ndarray):
        if source.dtype != np.uint8:
            raise TypeError(f"image array must be uint8, got dtype {source.dtype}")
        if not (source.ndim == 2 or (source.ndim == 3 and source.shape[2] in (1, 3, 4))):
            raise ValueError(f"image array must be (H, W) or (H, W, C) with C in (1, 3, 4), got {source.shape}")
        if source.shape[0] == 0 or source.shape[1] == 0:
            raise ValueError(f"image array must not be empty, got {source.shape}")
        array = source[..., 0] if source.ndim == 3 and source.shape[2] == 1 else source
        return _to_rgb(PILImage.fromarray(np.ascontiguousarray(array)))
    if isinstance(source, PILImage.Image):
        return _to_rgb(ImageOps.exif_transpose(source), _name(source))
    if isinstance(source, (bytes, bytearray, memoryview)):
        opener: object = io.BytesIO(bytes(source))
    elif isinstance(source, (str, os.PathLike)):
        opener = Path(source)
        if not opener.exists():
            raise ValueError(f"image file {_name(source)} does not exist")
        if not opener.is_file():
            raise ValueError(f"image file {_name(source)} is not a file (a directory?)")
    else:
        raise TypeError(f"image must be a path, bytes, PIL.Image or uint8 array, got {type(source).__name__}")
    try:
        with PILImage.open(opener) as image:  # type: ignore[arg-type]
            image.load()  # decode now: a truncated file fails here, not later
            return _to_rgb(ImageOps.exif_transpose(image), _name(source))
    except PILImage.DecompressionBombError as err:  # a header claiming far more pixels than PIL's limit
        raise ValueError(
            f"image {_name(source)} is refused as a possible decompression bomb: {err} (raise "
            "PIL.Image.MAX_IMAGE_PIXELS if you trust the file)"
        ) from None
    except ValueError as err:
        if str(err).startswith("image "):  # _to_rgb's own message already names the file
            raise
        raise ValueError(f"cannot decode image {_name(source)}: {err}") from err
    except (UnidentifiedImageError, OSError, SyntaxError, EOFError, struct.error) as err:
        raise ValueError(f"cannot decode image {_name(source)}: {type(err).__name__}: {err}") from err


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


def _hy_v4_vl_size(
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


def _glm_image_size(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
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


def _target_size(num_frames: int, height: int, width: int, spec: MediaSpec) -> tuple[int, int]:
    """The resized ``(h, w)`` of ``num_frames`` frames by ``spec.resize`` (an image: ``num_frames = T``)."""
    factor = spec.patch_size * spec.merge_size
    if spec.resize == "volume":
        return smart_resize_video(
            num_frames, height, width, spec.temporal_patch_size, factor, spec.min_pixels, spec.max_pixels
        )
    if spec.resize == "hy-v4-vl":
        return _hy_v4_vl_size(num_frames, height, width, factor, spec.max_pixels, spec.max_frame_pixels)
    if spec.resize == "glm-image":
        return _glm_image_size(height, width, factor, spec.min_pixels, spec.max_pixels)
    if spec.resize == "paddleocr":  # PaddleOCR-VL: a short side scaled up to one factor first, aspect kept
        if height < factor:
            height, width = factor, round(width * factor / height)
        if width < factor:
            height, width = round(height * factor / width), factor
    return smart_resize(height, width, factor, spec.min_pixels, spec.max_pixels)


def _resize_normalize(frames: np.ndarray, size: tuple[int, int], spec: MediaSpec) -> Tensor:
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
        return torch.from_numpy(y).permute(0, 3, 1, 2)  # a view; _patchify copies once
    x = torch.from_numpy(np.require(frames, requirements="W")).permute(0, 3, 1, 2)  # (F, 3, H, W) uint8
    if x.shape[-2:] != size:  # uint8 bicubic with antialias, as torchvision resizes on CPU
        x = torch.nn.functional.interpolate(x, size=[h, w], mode="bicubic", align_corners=False, antialias=True)
    mean = torch.tensor(spec.mean) * (1.0 / (1 / 255))  # torchvision's fused rescale + normalise
    std = torch.tensor(spec.std) * (1.0 / (1 / 255))
    return x.float().sub_(mean.view(3, 1, 1)).div_(std.view(3, 1, 1))


def _patchify(x: Tensor, spec: MediaSpec) -> tuple[Tensor, tuple[int, int, int]]:
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


@dataclass(frozen=True, eq=False)
class ImagePatches:
    """One image as vision patches.

    Attributes:
        pixel_values: ``(h * w, 3 * T * P * P)`` float32 rows (``T`` copies of the image).
        segment: :class:`~mmpos.layout.Image` with ``grid_thw = (1, h, w)`` in patches.
        size: the resized ``(height, width)`` in pixels.
    """

    pixel_values: Tensor
    segment: Image
    size: tuple[int, int]


def image_patches(source: ImageSource, spec: str | MediaSpec = "qwen2-vl", **overrides) -> ImagePatches:
    """Load, resize, normalise and patchify one image.

    Args:
        source: path, encoded bytes, ``PIL.Image`` or uint8 array (see :func:`load_image`).
        spec: a key of :data:`IMAGE_SPECS` or a :class:`MediaSpec`.
        **overrides: :class:`MediaSpec` fields to change (``min_pixels=...``, ``resample="torch"``).
    """
    spec = _resolve(spec, IMAGE_SPECS, overrides)
    if spec.timestamp_font is not None:
        raise ValueError("MediaSpec.timestamp_font draws the times of video frames: set it to None for an image")
    rgb = np.array(load_image(source))  # (H, W, 3) uint8
    size = _target_size(spec.temporal_patch_size, rgb.shape[0], rgb.shape[1], spec)
    rows, grid = _patchify(_resize_normalize(rgb[None], size, spec), spec)
    return ImagePatches(rows, Image(grid), size)


# --------------------------------------------------------------------------- videos
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


def read_video(
    path: str | os.PathLike, spec: str | MediaSpec = "qwen2-vl", **overrides
) -> tuple[np.ndarray, np.ndarray, float, int]:
    """Decode the sampled frames of a video file with OpenCV.

    Returns ``frames`` ``(F, H, W, 3)`` uint8 RGB, their ``indices`` ``(F,)``, the container's
    frame rate and frame count. An unreadable file, a clip of zero frames, a frame rate that
    is not positive or fewer decodable frames than the container reports raise ``ValueError``
    naming the file.
    """
    spec = _resolve(spec, VIDEO_SPECS, overrides)
    return _decode(path, lambda total, fps: sample_frame_indices(total, fps, spec))


def _decode(
    path: str | os.PathLike, sample: Callable[[int, float], np.ndarray]
) -> tuple[np.ndarray, np.ndarray, float, int]:
    """:func:`read_video`'s decoding: ``sample(total, fps)`` gives the indices to keep (a ``ValueError`` it
    raises is re-raised naming the file)."""
    import cv2

    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"video path must be a str or os.PathLike, got {type(path).__name__}")
    name = _name(path)
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
    spec = _resolve(spec, VIDEO_SPECS, overrides)
    if not isinstance(source, (np.ndarray, str, os.PathLike)):
        raise TypeError(
            f"video must be a file path (str / os.PathLike) or uint8 frames (F, H, W, 3), got {type(source).__name__}"
        )
    if isinstance(source, np.ndarray):
        if source.dtype != np.uint8 or source.ndim != 4 or source.shape[3] != 3 or 0 in source.shape:
            raise ValueError(f"video array must be non-empty uint8 (F, H, W, 3), got {source.dtype} {source.shape}")
        if video_fps is None:
            raise ValueError("video_fps must be given for an array video (a positive number: its frame rate)")
        check_float(video_fps, "video_fps (the frame rate of an array video)")
        fps, total = float(video_fps), source.shape[0]
        indices = sample_frame_indices(total, fps, spec)
        frames = source[indices]
        name = "<ndarray>"
    else:
        if video_fps is not None:
            raise ValueError("video_fps applies to array videos only; a file's frame rate comes from its container")
        frames, indices, fps, total = read_video(source, spec)
        name = _name(source)
    if spec.timestamp_font is not None:  # ERNIE-4.5-VL: each frame's time drawn on it, before resizing
        frames = _draw_timestamps(frames, indices, fps, spec.timestamp_font)
    height, width = frames.shape[1:3]
    try:
        size = _target_size(len(frames), height, width, spec)
    except ValueError as err:
        raise ValueError(f"video {name}: {err}") from err
    rows, grid = _patchify(_resize_normalize(frames, size, spec), spec)
    sampled_fps = len(indices) / total * fps
    segment = Video(grid, spec.temporal_patch_size / sampled_fps)
    ts = _timestamps(indices, fps, spec.temporal_patch_size)
    return VideoPatches(rows, segment, indices, fps, ts, size)


# --------------------------------------------------------------------------- MiniCPM-V slices
DOWNSAMPLE_MODES = {"16x": 4, "4x": 2}  # MiniCPM-V's token merge per side: 4 x 4 (two 2 x 2 merges) or 2 x 2


@dataclass(frozen=True)
class SliceSpec:
    """How MiniCPM-V 4.6 / 4.7 slices an image (defaults of ``MiniCPMV4_6ImageProcessor``).

    Attributes:
        patch_size: vision patch side ``P``.
        scale_resolution: the side ``S`` of one slice's target area ``S * S``.
        max_slices: the most slices (``max_slice_nums``).
        downsample_mode: ``"16x"`` (tokens of 4 x 4 patches) or ``"4x"`` (2 x 2); crop sides are
            multiples of ``P`` times that merge.
        slice_mode: slice images larger than ``S * S`` (``False``: the thumbnail only).
        mean, std: per-channel normalisation (RGB).
        resample: ``"pil"`` or ``"torch"`` bicubic (see the module docstring).
        max_frames: videos: the most frames sampled (``max_num_frames``, see :func:`minicpm_frame_indices`).
        stack_frames: videos: ``k > 1`` adds ``k - 1`` frames a second, pasted into one composite image per
            second that follows that second's frame (``1``: none, the processor's default).
    """

    patch_size: int = 14
    scale_resolution: int = 448
    max_slices: int = 9
    downsample_mode: str = "16x"
    slice_mode: bool = True
    mean: tuple[float, float, float] = HALF
    std: tuple[float, float, float] = HALF
    resample: str = "pil"
    max_frames: int = 128
    stack_frames: int = 1

    def __post_init__(self) -> None:
        for name in ("patch_size", "scale_resolution", "max_slices", "max_frames", "stack_frames"):
            check_int(getattr(self, name), f"SliceSpec.{name}", 1)
        if self.downsample_mode not in DOWNSAMPLE_MODES:
            raise ValueError(
                f"SliceSpec.downsample_mode must be one of {tuple(DOWNSAMPLE_MODES)}, got {self.downsample_mode!r}"
            )
        if not isinstance(self.slice_mode, bool):
            raise TypeError(f"SliceSpec.slice_mode must be a bool, got {type(self.slice_mode).__name__}")
        # mean / std / resample: checked as a MediaSpec's (the rows are made by the same functions)
        _row_spec(self)

    @property
    def merge(self) -> int:
        """Patches per token side (4 for ``"16x"``, 2 for ``"4x"``)."""
        return DOWNSAMPLE_MODES[self.downsample_mode]


def _row_spec(spec: SliceSpec) -> MediaSpec:
    """The :class:`MediaSpec` whose rows are one crop's patches: raster order, one frame, ``(C, P, P)`` values."""
    p = spec.patch_size
    return MediaSpec(p, 1, 1, spec.mean, spec.std, spec.resample, merge_size=1, temporal_patch_size=1, rows="raster")


#: slicing processors: ``MiniCPMV4_6ImageProcessor`` defaults (MiniCPM-V 4.7 uses the same class)
SLICE_SPECS: dict[str, SliceSpec] = {"minicpm-v4.6": SliceSpec(), "minicpm-v4.7": SliceSpec()}
#: ``MiniCPMV4_6VideoProcessor`` defaults: the same slicing, torchvision's bicubic, at most 128 frames
VIDEO_SLICE_SPECS: dict[str, SliceSpec] = {name: SliceSpec(resample="torch") for name in SLICE_SPECS}


def _fit(height: float, width: float, spec: SliceSpec, upscale: bool) -> tuple[int, int]:
    """A crop's size: scaled to the area ``S * S`` (aspect kept, ``int`` sides) when larger or ``upscale``; then
    each side rounded to a multiple of ``P * merge``, at least one (``find_best_resize``)."""
    if height * width > spec.scale_resolution**2 or upscale:
        aspect = width / height
        height = int(spec.scale_resolution / math.sqrt(aspect))
        width = int(height * aspect)
    unit = spec.patch_size * spec.merge
    return max(round(height / unit) * unit, unit), max(round(width / unit) * unit, unit)


def _slice_grid(height: int, width: int, spec: SliceSpec) -> tuple[int, int] | None:
    """``(rows, cols)`` of slices, or ``None`` for an image of at most one slice's area (``get_sliced_grid``):
    ``n = min(ceil(h w / S^2), max_slices)`` and its neighbours ``n - 1``, ``n + 1`` (not 1, at most
    ``max_slices``), every ``rows x cols`` factorisation; the one whose ``log(cols / rows)`` is nearest to
    ``log(w / h)``, on a tie the most rows, then the fewest slices."""
    n = min(math.ceil(height * width / spec.scale_resolution**2), spec.max_slices)
    if n <= 1:
        return None
    log_aspect = math.log(width / height)
    candidates = [
        (abs(log_aspect - math.log((k // rows) / rows)), -rows, k, rows)
        for k in (n - 1, n, n + 1)
        if 1 < k <= spec.max_slices
        for rows in range(1, k + 1)
        if k % rows == 0
    ]
    _, _, k, rows = min(candidates)
    return rows, k // rows


@dataclass(frozen=True, eq=False)
class ImageSlices:
    """One image as MiniCPM-V crops: a thumbnail, then the slices row by row.

    Attributes:
        pixel_values: ``(N, 3 * P * P)`` float32 rows, each crop's patches in raster order, the
            thumbnail's first; :meth:`navit` gives the processor's ``(1, 3, P, N * P)``.
        target_sizes: ``(K, 2)`` int32 ``(h, w)`` of each crop in patches (``K = 1 + rows * cols``),
            what ``MiniCPMV4_7Model`` and :func:`mmpos.integrations.hf_families.minicpmv4_7_rope_index` read.
        grid: ``(rows, cols)`` of slices, ``None`` when the image is not sliced.
        crop_tokens: LLM tokens of each crop, ``h * w / merge**2`` (the image tokens between its markers).
    """

    pixel_values: Tensor
    target_sizes: Tensor
    grid: tuple[int, int] | None
    crop_tokens: tuple[int, ...]

    def placeholder_ids(
        self, image: int, image_start: int, image_end: int, slice_start: int, slice_end: int, newline: int
    ) -> list[int]:
        """The image's tokens as ``MiniCPMV4_7Processor`` writes them: ``<image>`` thumbnail tokens ``</image>``,
        then each row of slices ``(<slice>`` tokens ``</slice>)*`` with a newline between rows (the
        ``<image_id>`` prefix, if used, is text before it). The arguments are token ids (the config's
        ``image_token_id``, ``image_start_id``, ``image_end_id``, ``slice_start_id``, ``slice_end_id``,
        ``newline_id``); with :attr:`target_sizes` these ids give
        :func:`mmpos.integrations.hf_families.minicpmv4_7_rope_index` its positions."""
        for value, name in (
            (image, "image"),
            (image_start, "image_start"),
            (image_end, "image_end"),
            (slice_start, "slice_start"),
            (slice_end, "slice_end"),
            (newline, "newline"),
        ):
            check_int(value, name, 0)
        ids = [image_start, *[image] * self.crop_tokens[0], image_end]
        if self.grid is not None:
            rows, cols = self.grid
            for i in range(rows):
                ids += [newline] if i else []
                for n in self.crop_tokens[1 + i * cols : 1 + (i + 1) * cols]:
                    ids += [slice_start, *[image] * n, slice_end]
        return ids

    def navit(self) -> Tensor:
        """``pixel_values`` in the processor's layout ``(1, 3, P, N * P)`` (patch ``k`` at columns ``k P .. (k + 1) P``)."""
        return _navit(self.pixel_values)


def _navit(rows: Tensor) -> Tensor:
    """Rows ``(N, 3 * P * P)`` -> MiniCPM-V's NaViT layout ``(1, 3, P, N * P)``."""
    n, d = rows.shape
    p = math.isqrt(d // 3)
    return rows.view(n, 3, p, p).permute(1, 2, 0, 3).reshape(1, 3, p, n * p)


def image_slices(source: ImageSource, spec: str | SliceSpec = "minicpm-v4.6", **overrides) -> ImageSlices:
    """Load an image and slice it as MiniCPM-V 4.6 / 4.7 do (``MiniCPMV4_6ImageProcessor``).

    The thumbnail is the whole image resized by :class:`SliceSpec`'s ``_fit`` rule (scaled up too when the
    image is not sliced); a larger image is also resized to ``rows x cols`` crops of one common size and cut
    into them (raster order). Read for facts in transformers 5.24's
    ``models/minicpmv4_6/image_processing_pil_minicpmv4_6.py``; ``tests/test_media_families.py`` compares rows
    and ``target_sizes`` against that processor.

    Args:
        source: path, encoded bytes, ``PIL.Image`` or uint8 array (see :func:`load_image`).
        spec: a key of :data:`SLICE_SPECS` or a :class:`SliceSpec`.
        **overrides: :class:`SliceSpec` fields to change (``max_slices=4``, ``downsample_mode="4x"``).
    """
    spec = _resolve_slices(spec, SLICE_SPECS, overrides)
    return _slice(np.array(load_image(source)), spec)


def _slice(rgb: np.ndarray, spec: SliceSpec) -> ImageSlices:
    """One uint8 ``(H, W, 3)`` image (or video frame) as MiniCPM-V crops (see :func:`image_slices`)."""
    rows_spec, p = _row_spec(spec), spec.patch_size
    height, width = rgb.shape[:2]
    grid = _slice_grid(height, width, spec) if spec.slice_mode else None
    thumb = _fit(height, width, spec, upscale=grid is None)
    crops = [_resize_normalize(rgb[None], thumb, rows_spec)]  # (1, 3, h, w) each
    sizes = [thumb]
    if grid is not None:
        rows, cols = grid
        unit = (max(round(height / rows) * rows, rows), max(round(width / cols) * cols, cols))  # sides divisible
        ch, cw = _fit(unit[0] / rows, unit[1] / cols, spec, upscale=True)
        canvas = _resize_normalize(rgb[None], (ch * rows, cw * cols), rows_spec)
        crops += [canvas[..., i * ch : (i + 1) * ch, j * cw : (j + 1) * cw] for i in range(rows) for j in range(cols)]
        sizes += [(ch, cw)] * (rows * cols)
    pixel_values = torch.cat([_patchify(crop, rows_spec)[0] for crop in crops])
    target_sizes = torch.tensor([(h // p, w // p) for h, w in sizes], dtype=torch.int32)
    tokens = tuple(h * w // (p * p * spec.merge**2) for h, w in sizes)
    return ImageSlices(pixel_values, target_sizes, grid, tokens)


def _resolve_slices(spec: str | SliceSpec, table: dict[str, SliceSpec], overrides: dict) -> SliceSpec:
    if isinstance(spec, str):
        if spec not in table:
            raise ValueError(f"spec must be a SliceSpec or one of {tuple(table)}, got {spec!r}")
        spec = table[spec]
    elif not isinstance(spec, SliceSpec):
        raise TypeError(f"spec must be a SliceSpec or a model name, got {type(spec).__name__}")
    known = {f.name for f in fields(SliceSpec)}
    if unknown := sorted(set(overrides) - known):
        raise TypeError(f"unknown SliceSpec field(s) {unknown}; valid: {sorted(known)}")
    return replace(spec, **overrides)


def _sub_times(duration: float, stack: int, max_frames: int) -> list[float]:
    """MiniCPM-V's stacked sub-frame times: ``sec + j / stack`` (``j = 1 .. stack - 1``) before the clip's end,
    thinned to ``max_frames * (stack - 1)`` with ``linspace(..., dtype=int)``."""
    times = [t for sec in range(math.ceil(duration)) for j in range(1, stack) if (t := sec + j / stack) < duration]
    most = max_frames * (stack - 1)
    if len(times) > most:
        times = [times[i] for i in np.linspace(0, len(times) - 1, most, dtype=int).tolist()]
    return times


def minicpm_frame_indices(
    total_frames: int, video_fps: float, max_frames: int = 128, stack_frames: int = 1
) -> np.ndarray:
    """MiniCPM-V 4.6 / 4.7's sampled frames (``MiniCPMV4_6VideoProcessor.sample_frames``): one frame a second,
    ``int(s * video_fps)`` for ``s < ceil(duration)``; a clip longer than ``max_frames`` seconds: every 0.1 s
    (``min(int(t * video_fps), last)``), thinned to ``max_frames`` with ``linspace(..., dtype=int)``. With
    ``stack_frames = k > 1`` the frames at ``sec + j / k`` (``j = 1 .. k - 1``, at most ``max_frames * (k - 1)``)
    follow the main ones. ``(F,)`` int64; may repeat in the long-clip rule."""
    check_int(total_frames, "total_frames", 1)
    check_float(video_fps, "video_fps")
    check_int(max_frames, "max_frames", 1)
    check_int(stack_frames, "stack_frames", 1)
    duration, last = total_frames / video_fps, total_frames - 1
    if duration > max_frames:
        times = [round(i * 0.1, 1) for i in range(int(duration / 0.1))]
        indices = [min(int(t * video_fps), last) for t in times]
        if len(indices) > max_frames:
            indices = [indices[i] for i in np.linspace(0, len(indices) - 1, max_frames, dtype=int).tolist()]
    else:
        indices = [int(s * video_fps) for s in range(math.ceil(duration))]
    if stack_frames > 1:
        indices += [min(int(t * video_fps), last) for t in _sub_times(duration, stack_frames, max_frames)]
    return np.array(indices, dtype=np.int64)


def _composite(frames: np.ndarray) -> np.ndarray:
    """MiniCPM-V's sub-frames of one second on one black canvas (``concat_frames_as_image``): 4 frames 2 x 2,
    3 or 2 in the row or column whose canvas is nearer to square (2 on a tie: a row if ``w >= h``), else one
    row; 6-pixel black lines between them. ``(n, h, w, 3)`` -> ``(H, W, 3)`` uint8."""
    n, h, w, _ = frames.shape
    line = 6

    def off_square(rows: int, cols: int) -> float:
        return abs((cols * w + (cols - 1) * line) / max(1, rows * h + (rows - 1) * line) - 1.0)

    if n == 4:
        rows, cols = 2, 2
    elif n in (2, 3) and not (n == 2 and off_square(1, 2) == off_square(2, 1)):
        rows, cols = min([(1, n), (n, 1)], key=lambda rc: off_square(*rc))  # the first on a tie, as argmin
    elif n == 2:
        rows, cols = (1, 2) if w / h >= 1.0 else (2, 1)
    else:
        rows, cols = 1, n
    canvas = np.zeros((rows * h + (rows - 1) * line, cols * w + (cols - 1) * line, 3), np.uint8)
    for k, frame in enumerate(frames):
        r, c = divmod(k, cols)
        canvas[r * (h + line) : r * (h + line) + h, c * (w + line) : c * (w + line) + w] = frame
    return canvas


def _units(frames: np.ndarray, total: int, fps: float, spec: SliceSpec) -> list[np.ndarray]:
    """The images MiniCPM-V slices: each main frame, then (``stack_frames > 1``) that second's sub-frames as one
    :func:`_composite` (``MiniCPMV4_6VideoProcessor._preprocess``)."""
    if spec.stack_frames == 1:
        return list(frames)
    duration = total / fps
    times = _sub_times(duration, spec.stack_frames, spec.max_frames)
    main, sub = (frames[: len(frames) - len(times)], frames[len(frames) - len(times) :]) if times else (frames, [])
    composites, cursor = [], 0
    for sec in range(math.ceil(duration)):
        start = cursor
        while cursor < len(times) and times[cursor] < sec + 1:
            cursor += 1
        composites.append(_composite(sub[start:cursor]) if cursor > start else None)
    units = []
    for i, frame in enumerate(main):
        units.append(frame)
        if i < len(composites) and composites[i] is not None:
            units.append(composites[i])
    return units


@dataclass(frozen=True, eq=False)
class VideoSlices:
    """One clip as MiniCPM-V crops: each sampled frame sliced as an image (:class:`ImageSlices`).

    Attributes:
        frames: one :class:`ImageSlices` per sampled frame, and per composite of sub-frames
            (``stack_frames > 1``), in the processor's order.
        frame_indices: ``(F,)`` indices of the sampled frames in the clip.
        video_fps: the clip's frame rate.
    """

    frames: tuple[ImageSlices, ...]
    frame_indices: np.ndarray
    video_fps: float

    @property
    def pixel_values(self) -> Tensor:
        """``(N, 3 * P * P)`` rows of every frame's crops, frame after frame (thumbnail first in each)."""
        return torch.cat([f.pixel_values for f in self.frames])

    @property
    def target_sizes(self) -> Tensor:
        """``(K, 2)`` int32 ``(h, w)`` in patches of every crop (the model's ``target_sizes_videos``)."""
        return torch.cat([f.target_sizes for f in self.frames])

    def placeholder_ids(
        self, video: int, image_start: int, image_end: int, slice_start: int, slice_end: int, newline: int
    ) -> list[int]:
        """The clip's tokens as ``MiniCPMV4_7Processor`` writes them: each frame as
        :meth:`ImageSlices.placeholder_ids` with the video token, frames one after the other."""
        return [
            i
            for f in self.frames
            for i in f.placeholder_ids(video, image_start, image_end, slice_start, slice_end, newline)
        ]

    def navit(self) -> Tensor:
        """:attr:`pixel_values` in the processor's layout ``(1, 3, P, N * P)`` (its ``pixel_values_videos``)."""
        return _navit(self.pixel_values)


def video_slices(
    source: str | os.PathLike | np.ndarray,
    spec: str | SliceSpec = "minicpm-v4.6",
    *,
    video_fps: float | None = None,
    **overrides,
) -> VideoSlices:
    """Sample a clip and slice each frame as MiniCPM-V 4.6 / 4.7 do (``MiniCPMV4_6VideoProcessor``): the frames of
    :func:`minicpm_frame_indices`, each sliced as :func:`image_slices` slices an image; with ``stack_frames > 1``
    each second's sub-frames pasted into one composite image (sliced too) after that second's frame.

    Args:
        source: a video file (OpenCV), or decoded frames ``(F, H, W, 3)`` uint8 RGB with ``video_fps``.
        spec: a key of :data:`VIDEO_SLICE_SPECS` or a :class:`SliceSpec`.
        video_fps: frame rate of an array ``source``.
        **overrides: :class:`SliceSpec` fields to change (``max_frames=32``, ``slice_mode=False``).
    """
    spec = _resolve_slices(spec, VIDEO_SLICE_SPECS, overrides)
    if isinstance(source, np.ndarray):
        if source.dtype != np.uint8 or source.ndim != 4 or source.shape[3] != 3 or 0 in source.shape:
            raise ValueError(f"video array must be non-empty uint8 (F, H, W, 3), got {source.dtype} {source.shape}")
        if video_fps is None:
            raise ValueError("video_fps must be given for an array video (a positive number: its frame rate)")
        check_float(video_fps, "video_fps (the frame rate of an array video)")
        fps, total = float(video_fps), source.shape[0]
        indices = minicpm_frame_indices(total, fps, spec.max_frames, spec.stack_frames)
        frames = source[indices]
    elif isinstance(source, (str, os.PathLike)):
        if video_fps is not None:
            raise ValueError("video_fps applies to array videos only; a file's frame rate comes from its container")
        frames, indices, fps, total = _decode(
            source, lambda total, rate: minicpm_frame_indices(total, rate, spec.max_frames, spec.stack_frames)
        )
    else:
        raise TypeError(
            f"video must be a file path (str / os.PathLike) or uint8 frames (F, H, W, 3), got {type(source).__name__}"
        )
    return VideoSlices(tuple(_slice(unit, spec) for unit in _units(frames, total, fps, spec)), indices, fps)
