"""GLM-OCR's images with mmpos.media's ``"glm4.6v"`` preset. transformers 5.24 ships ``glm_ocr`` without a processor
of its own (no entry in the auto image / video / processor maps); its checkpoint (``zai-org/GLM-OCR``,
``preprocessor_config.json``) names ``Glm46VImageProcessor`` and ``Glm46VProcessor`` with the class defaults except
``size["longest_edge"] = 9633792`` (= 28 * 28 * 12288; the class: 28 * 28 * 15000), as GLM-4.6V-Flash's does. So
``"glm4.6v"`` with ``max_pixels=9633792`` is GLM-OCR's image preprocessing: checked bit for bit (rtol 0, atol 0)
against the installed ``Glm46VImageProcessor`` (Pillow and torchvision classes) built with that checkpoint's
values. transformers 4.57.1 lacks both (skipped)."""

from __future__ import annotations

import importlib
from dataclasses import replace

import pytest
import torch
from _media_samples import noise
from PIL import Image as PILImage

from mmpos import media

pytestmark = pytest.mark.hf  # parity with the installed transformers' processors: run on the oldest too

transformers = pytest.importorskip("transformers", reason="parity with the HF processors needs transformers")
pytest.importorskip("torchvision", reason="the HF torchvision image processor needs torchvision")

#: zai-org/GLM-OCR preprocessor_config.json (all other fields are Glm46VImageProcessor's defaults)
CHECKPOINT = {
    "size": {"shortest_edge": 12544, "longest_edge": 9633792},
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
}
SPEC = replace(media.IMAGE_SPECS["glm4.6v"], max_pixels=CHECKPOINT["size"]["longest_edge"])
# (height, width): odd, tiny (scaled up), long and thin, a page scan above max_pixels (scaled down)
SIZES = [(37, 91), (5, 7), (20, 300), (640, 11), (300, 423), (3508, 2480)]


def _require_glm_ocr():
    try:
        importlib.import_module("transformers.models.glm_ocr")
    except ImportError:
        pytest.skip(f"transformers {transformers.__version__} has no glm_ocr (added in a later release)")


def _processor(resample: str):
    _require_glm_ocr()
    if resample == "pil":
        module = importlib.import_module("transformers.models.glm46v.image_processing_pil_glm46v")
        return module.Glm46VImageProcessorPil(**CHECKPOINT)
    module = importlib.import_module("transformers.models.glm46v.image_processing_glm46v")
    return module.Glm46VImageProcessor(**CHECKPOINT)


def test_glm_ocr_has_no_processor_of_its_own():
    """The premise: a GLM-OCR checkpoint's processor is the one its config names (Glm46V's), none is mapped."""
    _require_glm_ocr()
    auto = importlib.import_module("transformers.models.auto.auto_mappings")
    for names in ("IMAGE_PROCESSOR_MAPPING_NAMES", "VIDEO_PROCESSOR_MAPPING_NAMES", "PROCESSOR_MAPPING_NAMES"):
        assert "glm_ocr" not in getattr(auto, names) and "glm46v" in getattr(auto, names), names


def test_checkpoint_differs_from_the_class_defaults_in_max_pixels_only():
    """The checkpoint's values are the preset's with ``max_pixels`` lowered (the class's defaults are the preset's,
    tests/media/test_specs.py); the spec here holds them."""
    base = media.IMAGE_SPECS["glm4.6v"]
    assert (base.min_pixels, base.max_pixels) == (CHECKPOINT["size"]["shortest_edge"], 28 * 28 * 15000)
    assert (SPEC.patch_size, SPEC.temporal_patch_size, SPEC.merge_size) == (14, 2, 2)
    assert SPEC.mean == tuple(CHECKPOINT["image_mean"]) and SPEC.std == tuple(CHECKPOINT["image_std"])
    proc = _processor("pil")
    assert dict(proc.size) == CHECKPOINT["size"] and proc.resample == 3  # bicubic, as the preset


@pytest.mark.parametrize("resample", ["pil", "torch"])
@pytest.mark.parametrize("case", SIZES, ids=lambda c: f"{c[0]}x{c[1]}")
def test_image_parity_with_glm_ocr_checkpoint_processor(resample, case):
    h, w = case
    pixels = noise(h, w, seed=h * 7 + w)
    spec = replace(SPEC, resample=resample)
    ours = media.image_patches(pixels, spec)
    out = _processor(resample)(images=[PILImage.fromarray(pixels)], return_tensors="pt")
    assert ours.segment.grid_thw == tuple(out["image_grid_thw"][0].tolist())
    torch.testing.assert_close(ours.pixel_values, out["pixel_values"], rtol=0, atol=0)
    if (h, w) == (3508, 2480):  # the checkpoint's cap binds (the class default would keep more tokens)
        default = media.image_patches(pixels, replace(media.IMAGE_SPECS["glm4.6v"], resample=resample))
        assert default.pixel_values.shape[0] > ours.pixel_values.shape[0]
