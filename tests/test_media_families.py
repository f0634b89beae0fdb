"""mmpos.media presets of the families whose processors differ from Qwen2-VL's (GLM-4V, GLM-4.6V, GLM-Image,
ERNIE-4.5-VL, PaddleOCR-VL, Hunyuan-VL, HY-V4-VL, Cosmos3-Edge), against the installed Hugging Face image and video processors, built with their class defaults."""

from __future__ import annotations

import importlib
from dataclasses import replace

import numpy as np
import pytest
import torch
from PIL import Image as PILImage

from mmpos import media

transformers = pytest.importorskip("transformers", reason="parity with the HF processors needs transformers")
pytest.importorskip("torchvision", reason="the HF torchvision image / video processors need torchvision")
HF5 = int(transformers.__version__.split(".")[0]) >= 5
VideoMetadata = importlib.import_module("transformers.video_utils").VideoMetadata

# family -> (module, image class per resample on 5.x, on 4.x (None: absent), video class or None)
FAMILIES = {
    "glm4v": ("glm4v", "Glm4vImageProcessor", "Glm4vVideoProcessor"),
    "glm46v": ("glm46v", "Glm46VImageProcessor", "Glm46VVideoProcessor"),
    "ernie4.5-vl": ("ernie4_5_vl_moe", "Ernie4_5_VLMoeImageProcessor", "Ernie4_5_VLMoeVideoProcessor"),
    "paddleocr-vl": ("paddleocr_vl", "PaddleOCRVLImageProcessor", None),
    "hunyuan-vl": ("hunyuan_vl", "HunYuanVLImageProcessor", None),
    "hy-v4-vl": ("hy_v4_vl", "HYV4VLImageProcessor", "HYV4VLVideoProcessor"),
    "cosmos3-edge": ("cosmos3_edge", "Cosmos3EdgeImageProcessor", "Cosmos3EdgeVideoProcessor"),
    "glm-image": ("glm_image", "GlmImageImageProcessor", None),
    # = Qwen2-VL's image and Qwen3-VL's video processor
    "cohere-compass": ("cohere_compass", "CohereCompassImageProcessor", "CohereCompassVideoProcessor"),
}
PRESET = {
    "glm4v": "glm4v",
    "glm46v": "glm4.6v",
    "ernie4.5-vl": "ernie4.5-vl",
    "paddleocr-vl": "paddleocr-vl",
    "hunyuan-vl": "hunyuan-vl",
    "hy-v4-vl": "hy-v4-vl",
    "cosmos3-edge": "cosmos3-edge",
    "glm-image": "glm-image",
    "cohere-compass": "qwen2-vl",
}
VIDEO_PRESET = {**PRESET, "cohere-compass": "qwen3-vl"}


def _module(family: str, kind: str, suffix: str = ""):
    name = FAMILIES[family][0]
    try:
        return importlib.import_module(f"transformers.models.{name}.{kind}_{name}{suffix}")
    except ImportError:
        pytest.skip(f"transformers {transformers.__version__} has no {name} {kind} (the family is newer)")


def _image_class(family: str, resample: str):
    """5.x: ``...Pil`` (Pillow bicubic) / torchvision class; 4.57: the NumPy class / ``...Fast``."""
    base = FAMILIES[family][1]
    if HF5:
        if resample == "pil":
            return getattr(_module(family, "image_processing_pil"), base + "Pil")
        return getattr(_module(family, "image_processing"), base)
    if resample == "pil":
        return getattr(_module(family, "image_processing"), base)
    return getattr(_module(family, "image_processing", "_fast"), base + "Fast")


def _size(spec: media.MediaSpec) -> dict:
    return {"shortest_edge": spec.min_pixels, "longest_edge": spec.max_pixels}


def _noise(h: int, w: int, seed: int = 0) -> np.ndarray:
    """A gradient plus noise in uint8 (wrapping), so resampling has structure to get wrong."""
    rng = np.random.default_rng(seed)
    rows = (np.arange(h) * 255 // max(h - 1, 1)).astype(np.uint8)[:, None, None]
    cols = (np.arange(w) * 127 // max(w - 1, 1)).astype(np.uint8)[None, :, None]
    return rows + cols + np.array([0, 40, 80], np.uint8) + rng.integers(0, 60, (h, w, 3), dtype=np.uint8)


# --------------------------------------------------------------------------- presets = class defaults
@pytest.mark.parametrize("family", list(FAMILIES))
def test_presets_are_the_processor_defaults(family):
    """Each preset holds the defaults of the family's processor classes (the tests below build them bare)."""
    image = _image_class(family, "pil")()
    spec = media.IMAGE_SPECS[PRESET[family]]
    size = image.size if isinstance(image.size, dict) else dict(image.size)
    assert (size["shortest_edge"], size["longest_edge"]) == (spec.min_pixels, spec.max_pixels)
    assert (image.patch_size, image.merge_size) == (spec.patch_size, spec.merge_size)
    assert image.temporal_patch_size == spec.temporal_patch_size
    assert tuple(image.image_mean) == spec.mean and tuple(image.image_std) == spec.std
    if FAMILIES[family][2] is None:
        return
    kwargs = {"draw_on_frames": False} if family == "ernie4.5-vl" else {}
    video = getattr(_module(family, "video_processing"), FAMILIES[family][2])(**kwargs)
    spec = media.VIDEO_SPECS[VIDEO_PRESET[family]]
    assert (video.size["shortest_edge"], video.size["longest_edge"]) == (spec.min_pixels, spec.max_pixels)
    assert (video.patch_size, video.merge_size) == (spec.patch_size, spec.merge_size)
    assert tuple(video.image_mean) == spec.mean and tuple(video.image_std) == spec.std
    if family == "ernie4.5-vl":  # frames padded to 2, one frame per row
        assert video.temporal_patch_size == 2 == spec.frame_multiple and spec.temporal_patch_size == 1
        assert (video.min_frames, video.max_frames, video.fps) == (spec.min_frames, spec.max_frames, spec.fps)
    elif family == "glm46v":  # its sampling reads no fps (a rate by duration)
        assert video.temporal_patch_size == spec.temporal_patch_size == 2 and spec.fps is None
    elif family in ("cohere-compass", "hy-v4-vl", "cosmos3-edge"):  # Qwen3-VL's sampling rule
        assert (video.temporal_patch_size, video.fps) == (spec.temporal_patch_size, spec.fps)
        assert (video.min_frames, video.max_frames) == (spec.min_frames, spec.max_frames)
        assert spec.frames == "qwen3-vl"
        if family == "hy-v4-vl":  # the per-frame cap
            assert video.max_image_size["longest_edge"] == spec.max_frame_pixels
    else:
        assert (video.temporal_patch_size, video.fps, video.max_duration) == (2, spec.fps, spec.max_duration)


# --------------------------------------------------------------------------- images
# (height, width, overrides): odd, tiny (scaled up), long and thin, and larger than max_pixels (lowered: fast)
IMAGE_SIZES = [
    (37, 91, {}),
    (5, 7, {}),
    (20, 300, {}),
    (640, 11, {}),
    (300, 423, {}),
    (1200, 1700, {"min_pixels": 56 * 56, "max_pixels": 160_000}),
]


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("resample", ["pil", "torch"])
@pytest.mark.parametrize("case", IMAGE_SIZES, ids=lambda c: f"{c[0]}x{c[1]}")
def test_image_parity_with_hf(family, resample, case):
    h, w, overrides = case
    spec = replace(media.IMAGE_SPECS[PRESET[family]], **overrides, resample=resample)
    factor = spec.patch_size * spec.merge_size
    if not HF5 and family.startswith("glm") and min(h, w) < factor:
        pytest.skip("transformers 4.57's GLM-4V refuses sides under patch_size * merge_size (5.x scales them up)")
    pixels = _noise(h, w, seed=h * 7 + w)
    proc = _image_class(family, resample)(size=_size(spec))
    extra = {"input_data_format": "channels_last"} if not HF5 and resample == "pil" else {}
    if family == "glm-image" and (min(h, w) < factor or max(h, w) > 4 * min(h, w)):  # refused by both
        with pytest.raises(ValueError, match="GLM-Image needs"):
            media.image_patches(pixels, spec)
        with pytest.raises(ValueError):
            proc(images=[PILImage.fromarray(pixels)], return_tensors="pt")
        return
    ours = media.image_patches(pixels, spec)
    out = proc(images=[PILImage.fromarray(pixels)], return_tensors="pt", **extra)
    assert ours.segment.grid_thw == tuple(out["image_grid_thw"][0].tolist())
    theirs = out["pixel_values"].reshape(ours.pixel_values.shape[0], -1)  # PaddleOCR-VL's, Hunyuan's: (N, C*T, P, P)
    torch.testing.assert_close(ours.pixel_values, theirs, rtol=0, atol=0)


def test_paddleocr_rows_are_raster_order():
    """PaddleOCR-VL's rows run over patches in raster order, Qwen's over merged tokens: the same values permuted."""
    pixels = _noise(56, 84)
    raster = media.image_patches(pixels, "paddleocr-vl", min_pixels=1, max_pixels=56 * 84)
    merged = media.image_patches(pixels, "paddleocr-vl", min_pixels=1, max_pixels=56 * 84, rows="merged")
    _, gh, gw = raster.segment.grid_thw
    order = torch.arange(gh * gw).view(gh // 2, 2, gw // 2, 2).permute(0, 2, 1, 3).reshape(-1)
    torch.testing.assert_close(merged.pixel_values, raster.pixel_values[order], rtol=0, atol=0)
    assert not torch.equal(merged.pixel_values, raster.pixel_values)


# --------------------------------------------------------------------------- videos
# (frames, fps, height, width, overrides): GLM-4V's duration rule (fractional seconds, < 1 s, a clip past
# max_duration with it lowered), ERNIE's all-frames rule (odd counts padded), clips scaled up and down
VIDEO_CASES = [
    (16, 8.0, 64, 96, {}),
    (25, 10.0, 50, 70, {}),
    (7, 6.0, 90, 40, {}),
    (33, 24.0, 20, 30, {}),
    (40, 4.0, 64, 64, {"max_duration": 3.0, "min_pixels": 28 * 28 * 4, "max_pixels": 28 * 28 * 16}),
    (19, 3.0, 300, 400, {"min_pixels": 28 * 28 * 8, "max_pixels": 28 * 28 * 2 * 40}),
    (95, 3.0, 28, 28, {"min_pixels": 28 * 28 * 4, "max_pixels": 28 * 28 * 16}),  # 31.7 s: GLM-4.6V at 1 fps
]


def _hf_video(family: str, spec: media.MediaSpec, frames: np.ndarray, fps: float):
    cls = getattr(_module(family, "video_processing"), FAMILIES[family][2])
    kwargs = {"size": _size(spec), "fps": spec.fps} if spec.fps else {"size": _size(spec)}
    if family == "ernie4.5-vl":  # mmpos draws no timestamps on frames (it would need the checkpoint's font)
        kwargs.update(draw_on_frames=False, min_frames=spec.min_frames, max_frames=spec.max_frames)
    elif family == "glm4v":
        kwargs["max_duration"] = spec.max_duration
    elif family == "cohere-compass":  # the per-frame pixel cap of 5.x, off by default (as in test_media.py)
        kwargs["cap_pixels_per_frame"] = False
    elif family == "hy-v4-vl":
        kwargs.update(max_image_size={"longest_edge": spec.max_frame_pixels}, min_frames=spec.min_frames)
    proc = cls(**kwargs)
    total = frames.shape[0]
    meta = VideoMetadata(total_num_frames=total, fps=fps, duration=total / fps, width=frames.shape[2])
    meta.height = frames.shape[1]
    indices = np.asarray(proc.sample_frames(meta, fps=spec.fps) if spec.fps else proc.sample_frames(meta))
    video = torch.from_numpy(frames).permute(0, 3, 1, 2)
    out = proc(videos=[video], video_metadata=[meta], do_sample_frames=True, return_tensors="pt")
    return indices, out["pixel_values_videos"], tuple(out["video_grid_thw"][0].tolist())


@pytest.mark.parametrize("family", [f for f in FAMILIES if FAMILIES[f][2]])
@pytest.mark.parametrize("case", VIDEO_CASES, ids=lambda c: f"{c[0]}f{c[1]:g}fps{c[2]}x{c[3]}")
def test_video_parity_with_hf(family, case):
    total, fps, h, w, overrides = case
    if family != "glm4v":
        overrides = {k: v for k, v in overrides.items() if k != "max_duration"}
    spec = replace(media.VIDEO_SPECS[VIDEO_PRESET[family]], **overrides)
    _module(family, "video_processing")  # skips a family the release lacks
    if not HF5 and family == "glm4v" and total / fps * spec.fps < 1:
        pytest.skip("transformers 4.57's GLM-4V samples no frame from a clip under 1 / fps seconds (5.x takes one)")
    if not HF5 and family == "glm4v" and min(h, w) < spec.patch_size * spec.merge_size:
        pytest.skip("transformers 4.57's GLM-4V refuses sides under patch_size * merge_size (5.x scales them up)")
    rng = np.random.default_rng(total)
    frames = np.stack([_noise(h, w, seed=int(s)) for s in rng.integers(0, 10**6, total)])
    ours = media.video_patches(frames, spec, video_fps=fps)
    indices, theirs, grid = _hf_video(family, spec, frames, fps)
    assert ours.frame_indices.tolist() == indices.tolist()
    assert ours.segment.grid_thw == grid
    torch.testing.assert_close(ours.pixel_values, theirs, rtol=0, atol=0)
    assert ours.segment.second_per_grid == pytest.approx(spec.temporal_patch_size / (len(indices) / total * fps))


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


def test_ernie_frames_padded_not_merged():
    """ERNIE-4.5-VL rows hold one frame (``3 * 14 * 14``); an odd frame count is padded to even, grid t = frames."""
    frames = np.stack([_noise(56, 56, seed=i) for i in range(17)])
    out = media.video_patches(frames, "ernie4.5-vl", video_fps=4.0, min_pixels=1, max_pixels=56 * 56)
    assert out.frame_indices.tolist() == list(range(17))  # every frame: 17 in [16, 180]
    assert out.segment.grid_thw == (18, 4, 4) and out.pixel_values.shape == (18 * 16, 3 * 14 * 14)
    torch.testing.assert_close(out.pixel_values[-16:], out.pixel_values[-32:-16], rtol=0, atol=0)


def test_family_spec_errors():
    with pytest.raises(ValueError, match="MediaSpec.resize must be one of"):
        media.MediaSpec(14, 1, 10, media.CLIP_MEAN, media.CLIP_STD, "pil", resize="bilinear")
    with pytest.raises(ValueError, match="MediaSpec.rows must be one of"):
        media.MediaSpec(14, 1, 10, media.CLIP_MEAN, media.CLIP_STD, "pil", rows="column")
    with pytest.raises(ValueError, match='max_frame_pixels is read by resize="hy-v4-vl" only'):
        media.MediaSpec(14, 1, 10, media.CLIP_MEAN, media.CLIP_STD, "pil", max_frame_pixels=100)
    with pytest.raises(ValueError, match="MediaSpec.patch_layout must be one of"):
        media.MediaSpec(14, 1, 10, media.CLIP_MEAN, media.CLIP_STD, "pil", patch_layout="hwc")
    with pytest.raises(ValueError, match="frame_multiple"):
        media.MediaSpec(14, 1, 10, media.CLIP_MEAN, media.CLIP_STD, "pil", frame_multiple=0)
    with pytest.raises(ValueError, match='frames="glm4v" samples by fps only'):
        media.video_patches(np.zeros((4, 28, 28, 3), np.uint8), "glm4v", video_fps=2.0, num_frames=4)
    with pytest.raises(ValueError, match=r"num_frames=8 must lie in \[min_frames, max_frames\] = \[16, 180\]"):
        media.video_patches(np.zeros((20, 28, 28, 3), np.uint8), "ernie4.5-vl", video_fps=2.0, num_frames=8)


# --------------------------------------------------------------------------- GLM-Image, HY-V4-VL, Cosmos3-Edge
@pytest.mark.parametrize("resample", ["pil", "torch"])
@pytest.mark.parametrize(("h", "w"), [(30, 40), (100, 400), (401, 101), (1500, 2000), (57, 57)])
def test_glm_image_edges_with_hf(h, w, resample):
    """GLM-Image's edge rule at the class's bounds: short side scaled up (30 x 40), aspect ratio 4 and just under,
    long side scaled down to round(sqrt(max_pixels)) = 1002 (1500 x 2000), halved odd sides."""
    spec = replace(media.IMAGE_SPECS["glm-image"], resample=resample)
    pixels = _noise(h, w, seed=h + w)
    ours = media.image_patches(pixels, spec)
    out = _image_class("glm-image", resample)()(images=[PILImage.fromarray(pixels)], return_tensors="pt")
    assert ours.segment.grid_thw == tuple(out["image_grid_thw"][0].tolist())
    torch.testing.assert_close(ours.pixel_values, out["pixel_values"], rtol=0, atol=0)


def _hy_video(frames: np.ndarray, fps: float, **kwargs):
    cls = _module("hy-v4-vl", "video_processing").HYV4VLVideoProcessor
    total = frames.shape[0]
    meta = VideoMetadata(total_num_frames=total, fps=fps, duration=total / fps, width=frames.shape[2])
    meta.height = frames.shape[1]
    video = torch.from_numpy(frames).permute(0, 3, 1, 2)
    out = cls(**kwargs)(videos=[video], video_metadata=[meta], return_tensors="pt")
    return out["pixel_values_videos"], tuple(out["video_grid_thw"][0].tolist())


@pytest.mark.parametrize(
    ("total", "h", "w", "overrides"),
    [
        (1, 70, 50, {}),  # one frame
        (5, 33, 200, {}),  # thin frame
        (3, 700, 900, {"max_frame_pixels": 256 * 256}),  # the per-frame cap binds
        (9, 120, 150, {"max_pixels": 32 * 32 * 40}),  # the clip budget binds (a newline token per row)
    ],
)
def test_hy_v4_vl_every_frame_with_hf(total, h, w, overrides):
    """The class default ``do_sample_frames=False`` takes every frame: mmpos's ``num_frames=F`` (linspace over F)."""
    rng = np.random.default_rng(total)
    frames = np.stack([_noise(h, w, seed=int(s)) for s in rng.integers(0, 10**6, total)])
    spec = replace(media.VIDEO_SPECS["hy-v4-vl"], **overrides, fps=None, num_frames=total)
    ours = media.video_patches(frames, spec, video_fps=2.0)
    kwargs = {"size": _size(spec), "max_image_size": {"longest_edge": spec.max_frame_pixels}}
    theirs, grid = _hy_video(frames, 2.0, **kwargs)
    assert ours.frame_indices.tolist() == list(range(total)) and ours.segment.grid_thw == grid
    torch.testing.assert_close(ours.pixel_values, theirs, rtol=0, atol=0)


def test_hy_v4_vl_budget_worked_example():
    """HY-V4-VL's size by hand: 12 frames of 300 x 400, a budget of 61 merged tokens (32-pixel factor): no row
    count above 1 leaves a column (61 // (12 r) - 1 < floor(400 r / 300)); one row: min(61 // 12 - 1, ceil(800 /
    300) - 1) = 2 columns -> 32 x 64 pixels."""
    frames = np.zeros((12, 300, 400, 3), np.uint8)
    small = media.video_patches(frames, "hy-v4-vl", video_fps=2.0, num_frames=12, max_pixels=32 * 32 * 61)
    assert small.size == (32, 64) and small.segment.grid_thw == (12, 2, 4)
    assert media.video_patches(frames, "hy-v4-vl", video_fps=2.0, num_frames=12).size == (288, 384)  # not scaled up


def test_cosmos3_edge_rows_are_pixels_then_channels():
    """Cosmos3-Edge's row holds (P, P, C, T): the Qwen layout (C, T, P, P) of the same patches, transposed."""
    pixels = _noise(64, 96)
    ppct = media.image_patches(pixels, "cosmos3-edge", min_pixels=1, max_pixels=64 * 96)
    ctpp = media.image_patches(pixels, "cosmos3-edge", min_pixels=1, max_pixels=64 * 96, patch_layout="ctpp")
    n = ppct.pixel_values.shape[0]
    torch.testing.assert_close(ppct.pixel_values, ctpp.pixel_values.view(n, 3, 16 * 16).transpose(1, 2).reshape(n, -1))
    assert not torch.equal(ppct.pixel_values, ctpp.pixel_values)
