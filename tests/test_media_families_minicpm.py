"""mmpos.media.image_slices (MiniCPM-V 4.6 / 4.7 slicing) against the installed ``MiniCPMV4_6ImageProcessor``
(PIL and torchvision classes): rows, ``target_sizes``, grid; and image -> slices -> token ids -> position ids equal
to the model's own ``get_rope_index`` on the processor's ``target_sizes``."""

from __future__ import annotations

import importlib
import types
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image as PILImage

from mmpos import media

transformers = pytest.importorskip("transformers", reason="parity with the HF processors needs transformers")
pytest.importorskip("torchvision", reason="the HF torchvision image processor needs torchvision")


def _processor(resample: str):
    name = "image_processing_pil_minicpmv4_6" if resample == "pil" else "image_processing_minicpmv4_6"
    try:
        module = importlib.import_module(f"transformers.models.minicpmv4_6.{name}")
    except ImportError:
        pytest.skip(f"transformers {transformers.__version__} has no minicpmv4_6 (the family is newer)")
    return module.MiniCPMV4_6ImageProcessorPil if resample == "pil" else module.MiniCPMV4_6ImageProcessor


def _noise(h: int, w: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rows = (np.arange(h) * 255 // max(h - 1, 1)).astype(np.uint8)[:, None, None]
    return rows + np.array([0, 40, 80], np.uint8) + rng.integers(0, 60, (h, w, 3), dtype=np.uint8)


def test_preset_is_the_processor_default():
    proc, spec = _processor("pil")(), media.SLICE_SPECS["minicpm-v4.7"]
    assert (proc.patch_size, proc.scale_resolution, proc.max_slice_nums) == (
        spec.patch_size,
        spec.scale_resolution,
        spec.max_slices,
    )
    assert (proc.downsample_mode, proc.slice_mode) == (spec.downsample_mode, spec.slice_mode)
    assert tuple(proc.image_mean) == spec.mean and tuple(proc.image_std) == spec.std


# (height, width, overrides): unsliced and scaled up (tiny, odd, long), just over one slice, sliced 1 x 2, 2 x 4,
# 4 x 1, fewer slices allowed, slicing off
CASES = [
    (5, 7, {}),
    (37, 91, {}),
    (100, 2000, {}),
    (448, 449, {}),
    (500, 700, {}),
    (1200, 1700, {}),
    (2000, 300, {}),
    (1200, 1700, {"max_slices": 4}),
    (900, 900, {"slice_mode": False}),
]


@pytest.mark.parametrize("mode", ["16x", "4x"])
@pytest.mark.parametrize("resample", ["pil", "torch"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}-{'-'.join(map(str, c[2].values()))}")
def test_slices_parity_with_hf(case, resample, mode):
    h, w, overrides = case
    pixels = _noise(h, w, seed=h + 3 * w)
    ours = media.image_slices(pixels, resample=resample, downsample_mode=mode, **overrides)
    hf = {"max_slice_nums": overrides["max_slices"]} if "max_slices" in overrides else {}
    hf.update({"slice_mode": overrides["slice_mode"]} if "slice_mode" in overrides else {})
    out = _processor(resample)(downsample_mode=mode, **hf)(images=[PILImage.fromarray(pixels)], return_tensors="pt")
    assert torch.equal(ours.target_sizes, out["target_sizes"])
    assert list(ours.grid or (0, 0)) == list(out["grids"][0])
    assert out["num_patches_per_image"] == [ours.target_sizes.shape[0]]
    torch.testing.assert_close(ours.navit(), out["pixel_values"], rtol=0, atol=0)
    merge = 4 if mode == "16x" else 2
    assert ours.crop_tokens == tuple((out["target_sizes"].prod(-1) // merge**2).tolist())


def test_grid_worked_example():
    """1200 x 1700 over 448^2: ceil(10.2) -> 9 slices at most; of 8 and 9 slices, 2 x 4 has the aspect nearest
    to log(1700 / 1200) (|0.348 - log 2| = 0.345 beats 3 x 3's 0.348); crops resized to one size, in raster order."""
    out = media.image_slices(_noise(1200, 1700))
    assert out.grid == (2, 4) and out.target_sizes.shape == (9, 2)
    assert out.pixel_values.shape == (int(out.target_sizes.prod(-1).sum()), 3 * 14 * 14)
    assert out.target_sizes[1:].unique(dim=0).shape == (1, 2)  # every slice the same size
    assert media.image_slices(_noise(300, 400)).grid is None  # under one slice's area: the thumbnail only


def test_image_to_position_ids_equals_the_model():
    """image -> image_slices -> placeholder ids -> minicpmv4_7_rope_index equals MiniCPMV4_7Model.get_rope_index
    on the ids and the HF processor's target_sizes."""
    from mmpos.integrations.hf_families import minicpmv4_7_rope_index

    try:
        cm = importlib.import_module("transformers.models.minicpmv4_7.configuration_minicpmv4_7")
        mm = importlib.import_module("transformers.models.minicpmv4_7.modeling_minicpmv4_7")
    except ImportError:
        pytest.skip(f"transformers {transformers.__version__} has no minicpmv4_7 (the family is newer)")
    names = ("image_token_id", "video_token_id", "image_start_id", "image_end_id", "slice_start_id", "slice_end_id")
    ids = dict(zip((*names, "newline_id"), range(5001, 5008), strict=True))
    config = cm.MiniCPMV4_7Config(**ids)
    owner = SimpleNamespace(config=config)
    for name in ("get_vision_position_ids", "_group_visual_frames"):
        setattr(owner, name, types.MethodType(getattr(mm.MiniCPMV4_7Model, name), owner))
    owner._frame_end_idx = mm.MiniCPMV4_7Model._frame_end_idx
    images = [_noise(1200, 1700), _noise(37, 91, seed=1), _noise(2000, 300, seed=2)]
    prompt, sizes = [11, 12], []
    for image in images:
        s = media.image_slices(image)
        prompt += [21, 22] + s.placeholder_ids(5001, 5003, 5004, 5005, 5006, 5007) + [13]  # text (an image id)
        sizes.append(s.target_sizes)
    out = _processor("pil")()(images=[PILImage.fromarray(i) for i in images], return_tensors="pt")
    assert torch.equal(torch.cat(sizes), out["target_sizes"])
    input_ids = torch.tensor([prompt])
    mm_types = (input_ids == 5001).long()
    ref, ref_deltas = mm.MiniCPMV4_7Model.get_rope_index(
        owner, input_ids, mm_types, out["target_sizes"], None, downsample_mode="16x", attention_mask=None
    )
    pos, deltas = minicpmv4_7_rope_index(config, input_ids, target_sizes=torch.cat(sizes))
    assert torch.equal(pos, ref) and torch.equal(deltas, ref_deltas)


def test_slice_spec_errors():
    with pytest.raises(ValueError, match="SliceSpec.downsample_mode must be one of"):
        media.SliceSpec(downsample_mode="8x")
    with pytest.raises(TypeError, match="SliceSpec.slice_mode must be a bool"):
        media.SliceSpec(slice_mode=1)
    with pytest.raises(ValueError, match="MediaSpec.resample must be one of"):
        media.SliceSpec(resample="bilinear")
    with pytest.raises(TypeError, match=r"unknown SliceSpec field\(s\) \['max_slice_nums'\]"):
        media.image_slices(_noise(10, 10), max_slice_nums=4)
    with pytest.raises(ValueError, match="spec must be a SliceSpec or one of"):
        media.image_slices(_noise(10, 10), "minicpm-v2")
