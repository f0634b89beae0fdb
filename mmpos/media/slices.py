"""MiniCPM-V 4.6 / 4.7 slicing: an image (or each sampled frame) as a thumbnail plus a grid of crops,
:func:`image_slices` -> :class:`ImageSlices`, :func:`video_slices` -> :class:`VideoSlices`.

MiniCPM-V (Yao et al. 2024, https://arxiv.org/abs/2408.01800: adaptive visual encoding by slices); read for facts
in transformers 5.24's ``models/minicpmv4_6/{image_processing_pil,video_processing}_minicpmv4_6.py``;
``tests/media/test_slices.py`` compares against those processors. Shapes: rows ``(N, 3 * P * P)``,
``target_sizes`` ``(K, 2)`` int32 in patches.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .._validate import check_float, check_int
from ._ops import patchify, resize_normalize, resolve_preset, sample_video
from .images import ImageSource, load_image
from .specs import HALF, MediaSpec

__all__ = [
    "SLICE_SPECS",
    "VIDEO_SLICE_SPECS",
    "ImageSlices",
    "SliceSpec",
    "VideoSlices",
    "image_slices",
    "minicpm_frame_indices",
    "video_slices",
]

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
    ``models/minicpmv4_6/image_processing_pil_minicpmv4_6.py``; ``tests/media/test_slices.py`` compares rows
    and ``target_sizes`` against that processor.

    Args:
        source: path, encoded bytes, ``PIL.Image`` or uint8 array (see :func:`load_image`).
        spec: a key of :data:`SLICE_SPECS` or a :class:`SliceSpec`.
        **overrides: :class:`SliceSpec` fields to change (``max_slices=4``, ``downsample_mode="4x"``).
    """
    spec = resolve_preset(spec, SLICE_SPECS, overrides, SliceSpec)
    return _slice(np.array(load_image(source)), spec)


def _slice(rgb: np.ndarray, spec: SliceSpec) -> ImageSlices:
    """One uint8 ``(H, W, 3)`` image (or video frame) as MiniCPM-V crops (see :func:`image_slices`)."""
    rows_spec, p = _row_spec(spec), spec.patch_size
    height, width = rgb.shape[:2]
    grid = _slice_grid(height, width, spec) if spec.slice_mode else None
    thumb = _fit(height, width, spec, upscale=grid is None)
    crops = [resize_normalize(rgb[None], thumb, rows_spec)]  # (1, 3, h, w) each
    sizes = [thumb]
    if grid is not None:
        rows, cols = grid
        unit = (max(round(height / rows) * rows, rows), max(round(width / cols) * cols, cols))  # sides divisible
        ch, cw = _fit(unit[0] / rows, unit[1] / cols, spec, upscale=True)
        canvas = resize_normalize(rgb[None], (ch * rows, cw * cols), rows_spec)
        crops += [canvas[..., i * ch : (i + 1) * ch, j * cw : (j + 1) * cw] for i in range(rows) for j in range(cols)]
        sizes += [(ch, cw)] * (rows * cols)
    pixel_values = torch.cat([patchify(crop, rows_spec)[0] for crop in crops])
    target_sizes = torch.tensor([(h // p, w // p) for h, w in sizes], dtype=torch.int32)
    tokens = tuple(h * w // (p * p * spec.merge**2) for h, w in sizes)
    return ImageSlices(pixel_values, target_sizes, grid, tokens)


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
    spec = resolve_preset(spec, VIDEO_SLICE_SPECS, overrides, SliceSpec)
    frames, indices, fps, total = sample_video(
        source, video_fps, lambda n, rate: minicpm_frame_indices(n, rate, spec.max_frames, spec.stack_frames)
    )
    return VideoSlices(tuple(_slice(unit, spec) for unit in _units(frames, total, fps, spec)), indices, fps)
