"""Images to Qwen-VL patch rows: :func:`load_image`, :func:`image_patches` -> :class:`ImagePatches`.

Qwen2-VL (Wang et al. 2024, https://arxiv.org/abs/2409.12191: naive dynamic resolution); read for facts in
transformers 5.24's ``models/qwen2_vl/image_processing_pil_qwen2_vl.py`` and ``image_processing_qwen2_vl.py``.
Shapes: ``pixel_values`` ``(h * w, 3 * T * P * P)`` with ``(1, h, w) = segment.grid_thw`` in patches.
"""

from __future__ import annotations

import io
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from torch import Tensor

from .._extras import requires
from ..layout import Image
from ._ops import patchify, resize_normalize, resolve, source_name, target_size
from .specs import IMAGE_SPECS, MediaSpec

with requires("media"):  # one line naming the package and the extra when it is missing
    from PIL import Image as PILImage
    from PIL import ImageOps, UnidentifiedImageError

__all__ = ["ImagePatches", "image_patches", "load_image"]

ImageSource = str | os.PathLike | bytes | PILImage.Image | np.ndarray


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
        return _to_rgb(ImageOps.exif_transpose(source), source_name(source))
    if isinstance(source, (bytes, bytearray, memoryview)):
        opener: object = io.BytesIO(bytes(source))
    elif isinstance(source, (str, os.PathLike)):
        opener = Path(source)
        if not opener.exists():
            raise ValueError(f"image file {source_name(source)} does not exist")
        if not opener.is_file():
            raise ValueError(f"image file {source_name(source)} is not a file (a directory?)")
    else:
        raise TypeError(f"image must be a path, bytes, PIL.Image or uint8 array, got {type(source).__name__}")
    try:
        with PILImage.open(opener) as image:  # type: ignore[arg-type]
            image.load()  # decode now: a truncated file fails here, not later
            return _to_rgb(ImageOps.exif_transpose(image), source_name(source))
    except PILImage.DecompressionBombError as err:  # a header claiming far more pixels than PIL's limit
        raise ValueError(
            f"image {source_name(source)} is refused as a possible decompression bomb: {err} (raise "
            "PIL.Image.MAX_IMAGE_PIXELS if you trust the file)"
        ) from None
    except ValueError as err:
        if str(err).startswith("image "):  # _to_rgb's own message already names the file
            raise
        raise ValueError(f"cannot decode image {source_name(source)}: {err}") from err
    except (UnidentifiedImageError, OSError, SyntaxError, EOFError, struct.error) as err:
        raise ValueError(f"cannot decode image {source_name(source)}: {type(err).__name__}: {err}") from err


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
    spec = resolve(spec, IMAGE_SPECS, overrides)
    if spec.timestamp_font is not None:
        raise ValueError("MediaSpec.timestamp_font draws the times of video frames: set it to None for an image")
    rgb = np.array(load_image(source))  # (H, W, 3) uint8
    size = target_size(spec.temporal_patch_size, rgb.shape[0], rgb.shape[1], spec)
    rows, grid = patchify(resize_normalize(rgb[None], size, spec), spec)
    return ImagePatches(rows, Image(grid), size)
