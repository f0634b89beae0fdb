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
  the tests in ``tests/media/`` compare against those processors.
* **MiniCPM-V 4.6 / 4.7** slice an image into a grid of crops plus a thumbnail: :func:`image_slices`
  and :func:`video_slices` (``models/minicpmv4_6/{image_processing_pil,video_processing}_minicpmv4_6.py``)
  return the crops' rows and the ``target_sizes`` that
  :func:`mmpos.integrations.hf_families.minicpmv4_7_rope_index` reads.

Shapes: ``pixel_values`` ``(t * h * w, 3 * temporal_patch_size * patch_size ** 2)`` with
``(t, h, w) = segment.grid_thw`` in patches before the spatial merge.

Modules (the names above are imported from :mod:`mmpos.media`): :mod:`~mmpos.media.specs` (:class:`MediaSpec`,
the presets), :mod:`~mmpos.media.resize` (:func:`smart_resize`, :func:`smart_resize_video`),
:mod:`~mmpos.media.images` (:func:`load_image`, :func:`image_patches`), :mod:`~mmpos.media.frames`
(:func:`sample_frame_indices`), :mod:`~mmpos.media.video` (:func:`read_video`, :func:`video_patches`, ERNIE's
drawn timestamps) and :mod:`~mmpos.media.slices` (MiniCPM-V).
"""

from .frames import GLM46V_FPS as GLM46V_FPS
from .frames import GLM46V_MAX_DURATION as GLM46V_MAX_DURATION
from .frames import GLM46V_MAX_FRAMES as GLM46V_MAX_FRAMES
from .frames import sample_frame_indices
from .images import ImagePatches, image_patches, load_image
from .images import ImageSource as ImageSource
from .resize import smart_resize, smart_resize_video
from .slices import DOWNSAMPLE_MODES as DOWNSAMPLE_MODES
from .slices import (
    SLICE_SPECS,
    VIDEO_SLICE_SPECS,
    ImageSlices,
    SliceSpec,
    VideoSlices,
    image_slices,
    minicpm_frame_indices,
    video_slices,
)
from .specs import CLIP_MEAN as CLIP_MEAN
from .specs import CLIP_STD as CLIP_STD
from .specs import FRAME_RULES as FRAME_RULES
from .specs import HALF as HALF
from .specs import IMAGE_SPECS, VIDEO_SPECS, MediaSpec
from .specs import PATCH_LAYOUTS as PATCH_LAYOUTS
from .specs import RESAMPLES as RESAMPLES
from .specs import RESIZES as RESIZES
from .specs import ROW_ORDERS as ROW_ORDERS
from .video import VideoPatches, read_video, video_patches

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
