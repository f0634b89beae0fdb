"""Shared by the tests of :mod:`mmpos.media` (tests/media/): sample images and clips, and the installed Hugging Face
processors they are compared with -- Qwen2-VL / Qwen3-VL's, and the other families' built as their classes'
defaults (transformers 5.x: the ``...Pil`` (Pillow bicubic) and torchvision classes; 4.57: the NumPy and
``...Fast`` classes). A family the installed release lacks is skipped with the reason."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch
from PIL import Image as PILImage

from mmpos import media

try:
    import transformers

    HF5 = int(transformers.__version__.split(".")[0]) >= 5
except ImportError:  # the loading, error and layout tests still run
    transformers, HF5 = None, False
needs_hf = pytest.mark.skipif(transformers is None, reason="parity with the HF processors needs transformers")
try:
    import torchvision  # noqa: F401

    HAS_TORCHVISION = True
except ImportError:
    HAS_TORCHVISION = False
needs_tv = pytest.mark.skipif(
    transformers is None or not HAS_TORCHVISION, reason="the HF torchvision / video processors need torchvision"
)


def noise(h: int, w: int, seed: int = 0, channels: int = 3) -> np.ndarray:
    """A gradient plus noise in uint8 (wrapping), so resampling has structure to get wrong."""
    rng = np.random.default_rng(seed)
    rows = (np.arange(h) * 255 // max(h - 1, 1)).astype(np.uint8)[:, None, None]
    cols = (np.arange(w) * 127 // max(w - 1, 1)).astype(np.uint8)[None, :, None]
    shift = (np.arange(channels) * 40).astype(np.uint8)
    return rows + cols + shift + rng.integers(0, 60, (h, w, channels), dtype=np.uint8)


def write_clip(path, frames: np.ndarray, fps: float) -> None:
    """``frames`` ``(T, H, W, 3)`` RGB uint8 written to ``path`` as MJPG at ``fps``."""
    import cv2

    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), fps, (frames.shape[2], frames.shape[1]))
    assert writer.isOpened()
    for frame in frames:
        writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))
    writer.release()


def video_metadata(total: int, fps: float, indices=None, **fields):
    """transformers' ``VideoMetadata`` of a clip of ``total`` frames at ``fps``."""
    from transformers.video_utils import VideoMetadata

    return VideoMetadata(total_num_frames=total, fps=fps, frames_indices=indices, **fields)


# --------------------------------------------------------------------------- Qwen2-VL / Qwen3-VL
def qwen_image_processor(resample: str):
    """The HF image processor class that resizes as ``resample`` does (5.x: ``...Pil`` / torchvision;
    4.x: the NumPy ``Qwen2VLImageProcessor`` / ``Qwen2VLImageProcessorFast``)."""
    if resample == "torch" and not HAS_TORCHVISION:
        pytest.skip("the torchvision image processor needs torchvision")
    if HF5:
        if resample == "pil":
            return importlib.import_module(
                "transformers.models.qwen2_vl.image_processing_pil_qwen2_vl"
            ).Qwen2VLImageProcessorPil
        return importlib.import_module("transformers.models.qwen2_vl.image_processing_qwen2_vl").Qwen2VLImageProcessor
    if resample == "pil":
        return importlib.import_module("transformers.models.qwen2_vl.image_processing_qwen2_vl").Qwen2VLImageProcessor
    return importlib.import_module(
        "transformers.models.qwen2_vl.image_processing_qwen2_vl_fast"
    ).Qwen2VLImageProcessorFast


def qwen_kwargs(spec: media.MediaSpec) -> dict:
    return {
        "size": {"shortest_edge": spec.min_pixels, "longest_edge": spec.max_pixels},
        "patch_size": spec.patch_size,
        "merge_size": spec.merge_size,
        "temporal_patch_size": spec.temporal_patch_size,
        "image_mean": list(spec.mean),
        "image_std": list(spec.std),
    }


def qwen_hf_image(spec: media.MediaSpec, image: PILImage.Image):
    # transformers 4.57's NumPy image processor ignores a valid ``size`` (keeps its defaults): give min/max too
    proc = qwen_image_processor(spec.resample)(
        **qwen_kwargs(spec), min_pixels=spec.min_pixels, max_pixels=spec.max_pixels
    )
    # 4.x guesses the channel axis from the shape (wrong for an image 3 pixels tall): tell it
    extra = {"input_data_format": "channels_last"} if not HF5 and spec.resample == "pil" else {}
    out = proc(images=[image], return_tensors="pt", **extra)
    return out["pixel_values"], tuple(out["image_grid_thw"][0].tolist())


def qwen_hf_video(spec: media.MediaSpec, frames: np.ndarray):
    name = "qwen3_vl" if spec.frames == "qwen3-vl" else "qwen2_vl"
    module = importlib.import_module(f"transformers.models.{name}.video_processing_{name}")
    cls = module.Qwen3VLVideoProcessor if name == "qwen3_vl" else module.Qwen2VLVideoProcessor
    kwargs = {"cap_pixels_per_frame": False} if HF5 else {}
    proc = cls(**qwen_kwargs(spec), do_sample_frames=False, **kwargs)
    out = proc(videos=[torch.from_numpy(frames).permute(0, 3, 1, 2)], return_tensors="pt")
    return out["pixel_values_videos"], tuple(out["video_grid_thw"][0].tolist())


def qwen_sampler(rule):
    """The Qwen video processor whose ``sample_frames`` follows ``rule`` (class defaults)."""
    name = "qwen3_vl" if rule == "qwen3-vl" else "qwen2_vl"
    module = importlib.import_module(f"transformers.models.{name}.video_processing_{name}")
    return module.Qwen3VLVideoProcessor() if name == "qwen3_vl" else module.Qwen2VLVideoProcessor()


# --------------------------------------------------------------------------- the other families
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


def family_module(family: str, kind: str, suffix: str = ""):
    name = FAMILIES[family][0]
    try:
        return importlib.import_module(f"transformers.models.{name}.{kind}_{name}{suffix}")
    except ImportError:
        pytest.skip(f"transformers {transformers.__version__} has no {name} {kind} (the family is newer)")


def family_image_class(family: str, resample: str):
    """5.x: ``...Pil`` (Pillow bicubic) / torchvision class; 4.57: the NumPy class / ``...Fast``."""
    base = FAMILIES[family][1]
    if HF5:
        if resample == "pil":
            return getattr(family_module(family, "image_processing_pil"), base + "Pil")
        return getattr(family_module(family, "image_processing"), base)
    if resample == "pil":
        return getattr(family_module(family, "image_processing"), base)
    return getattr(family_module(family, "image_processing", "_fast"), base + "Fast")


def hf_size(spec: media.MediaSpec) -> dict:
    return {"shortest_edge": spec.min_pixels, "longest_edge": spec.max_pixels}
