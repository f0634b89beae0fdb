"""mmpos.media.images (``load_image``, ``image_patches``) against the installed Hugging Face image processors:
Qwen2-VL / Qwen3-VL's on files written here, and the other families' (GLM-4V, GLM-4.6V, GLM-Image, ERNIE-4.5-VL,
PaddleOCR-VL, Hunyuan-VL, HY-V4-VL, Cosmos3-Edge, Cohere Compass) built with their class defaults."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from _media_samples import (
    FAMILIES,
    HF5,
    PRESET,
    family_image_class,
    hf_size,
    needs_hf,
    needs_tv,
    noise,
    qwen_hf_image,
)
from PIL import Image as PILImage

from mmpos import layout, media
from mmpos.media._ops import resolve

pytestmark = pytest.mark.hf  # parity with the installed transformers' processors: run on the oldest too

# --------------------------------------------------------------------------- Qwen2-VL / Qwen3-VL
# (height, width, overrides): odd, exact, tiny (scaled up to min_pixels), extreme aspect ratios, and
# larger than max_pixels (scaled down; a lowered max_pixels keeps the test fast)
IMAGE_SIZES = [
    (37, 91, {}),
    (28, 28, {}),
    (5, 7, {}),
    (3, 500, {}),
    (640, 11, {}),
    (1200, 1700, {"max_pixels": 160_000}),
]


@needs_hf
@pytest.mark.parametrize("model", ["qwen2-vl", "qwen3-vl"])
@pytest.mark.parametrize("resample", ["pil", "torch"])
@pytest.mark.parametrize("case", IMAGE_SIZES, ids=lambda c: f"{c[0]}x{c[1]}")
def test_image_parity_with_hf(tmp_path, model, resample, case):
    h, w, overrides = case
    path = tmp_path / "x.bmp"  # fast to write at the large size
    PILImage.fromarray(noise(h, w)).save(path)
    spec = resolve(model, media.IMAGE_SPECS, {"resample": resample, **overrides})
    ours = media.image_patches(path, spec)
    ref, grid = qwen_hf_image(spec, media.load_image(path))
    assert ours.segment == layout.Image(grid)
    assert ours.pixel_values.dtype == torch.float32
    assert torch.equal(ours.pixel_values, ref)


@needs_hf
@pytest.mark.parametrize("mode", ["RGBA", "LA", "P", "L", "CMYK"])
def test_image_modes_parity_with_hf(tmp_path, mode):
    rgba = noise(45, 61, channels=4)
    image = PILImage.fromarray(rgba, "RGBA")
    if mode == "P":
        image = image.convert("RGB").quantize(16)
        image.info["transparency"] = 3
    else:
        image = image.convert(mode)
    path = tmp_path / ("x.tiff" if mode == "CMYK" else "x.png")
    image.save(path)
    has_alpha = mode in ("RGBA", "LA", "P")
    if has_alpha and not HF5:
        pytest.skip("transformers 4.x drops the alpha channel; mmpos composites onto white as 5.x does")
    spec = media.IMAGE_SPECS["qwen2-vl"]
    ref, grid = qwen_hf_image(spec, PILImage.open(path))
    ours = media.image_patches(path)
    assert ours.segment.grid_thw == grid
    assert torch.equal(ours.pixel_values, ref)


def test_image_inputs_agree(tmp_path):
    rgb = noise(50, 70)
    path = tmp_path / "x.png"
    PILImage.fromarray(rgb).save(path)
    want = media.image_patches(rgb).pixel_values
    for source in (path, str(path), path.read_bytes(), PILImage.open(path), rgb[..., :3]):
        assert torch.equal(media.image_patches(source).pixel_values, want)
    gray = rgb[..., 0]
    assert torch.equal(
        media.image_patches(gray).pixel_values, media.image_patches(np.repeat(gray[..., None], 3, -1)).pixel_values
    )
    assert torch.equal(media.image_patches(gray[..., None]).pixel_values, media.image_patches(gray).pixel_values)


def test_exif_orientation(tmp_path):
    rgb = noise(30, 80)
    image = PILImage.fromarray(rgb)
    exif = image.getexif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    path = tmp_path / "x.jpg"
    image.save(path, exif=exif)
    loaded = media.load_image(path)
    assert loaded.size == (30, 80)  # (W, H): the displayed image is upright, 80 tall
    assert np.array_equal(np.asarray(loaded), np.asarray(PILImage.open(path).transpose(PILImage.Transpose.ROTATE_270)))


def test_rows_follow_layout_token_order():
    """Row r is patch (t, h, w) with h, w walked as (h // m, w // m, h % m, w % m): the m * m rows of
    merged token k are rows 4k .. 4k + 3, and merged tokens run in raster order."""
    spec = media.MediaSpec(2, 1, 10**6, (0, 0, 0), (1 / 255,) * 3, "pil", temporal_patch_size=1)
    h, w = 8, 12  # 4 x 6 patches of 2 x 2 pixels, 2 x 3 merged tokens
    x = np.zeros((h, w, 3), np.uint8)
    x[..., 0] = np.arange(h)[:, None] // 2  # red = patch row, green = patch column
    x[..., 1] = np.arange(w)[None, :] // 2
    out = media.image_patches(x, spec)
    assert out.segment.grid_thw == (1, 4, 6)
    rows = out.pixel_values.view(-1, 3, 2, 2)[:, :2, 0, 0]  # (24, 2): (patch row, patch col) per row
    expect = [(2 * bi + i, 2 * bj + j) for bi in range(2) for bj in range(3) for i in range(2) for j in range(2)]
    assert rows.tolist() == [list(map(float, e)) for e in expect]


@needs_hf
@pytest.mark.parametrize("hw", [(2, 500), (1000, 3)])
def test_aspect_ratio_over_200_rejected_like_hf(hw):
    with pytest.raises(ValueError, match="aspect ratio"):
        media.image_patches(noise(*hw))
    with pytest.raises(ValueError):
        qwen_hf_image(media.IMAGE_SPECS["qwen2-vl"], PILImage.fromarray(noise(*hw)))


def test_bad_image_files(tmp_path):
    good = tmp_path / "good.jpg"
    PILImage.fromarray(noise(64, 64)).save(good, quality=90)
    truncated = tmp_path / "cut.jpg"
    truncated.write_bytes(good.read_bytes()[: len(good.read_bytes()) // 2])
    with pytest.raises(ValueError, match="cut.jpg"):
        media.image_patches(truncated)
    junk = tmp_path / "junk.png"
    junk.write_bytes(b"not an image at all")
    with pytest.raises(ValueError, match="junk.png"):
        media.load_image(junk)
    with pytest.raises(ValueError, match="missing.png.*does not exist"):
        media.load_image(tmp_path / "missing.png")
    with pytest.raises(ValueError, match="cannot decode image <bytes>"):
        media.load_image(b"\x89PNG broken")
    with pytest.raises(TypeError, match="uint8"):
        media.load_image(np.zeros((4, 4, 3), np.float32))
    with pytest.raises(ValueError, match=r"\(H, W\)"):
        media.load_image(np.zeros((4, 4, 2), np.uint8))
    with pytest.raises(TypeError, match="image must be"):
        media.load_image(123)


# --------------------------------------------------------------------------- the other families
# (height, width, overrides): odd, tiny (scaled up), long and thin, and larger than max_pixels (lowered: fast)
FAMILY_IMAGE_SIZES = [
    (37, 91, {}),
    (5, 7, {}),
    (20, 300, {}),
    (640, 11, {}),
    (300, 423, {}),
    (1200, 1700, {"min_pixels": 56 * 56, "max_pixels": 160_000}),
]


@needs_tv
@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("resample", ["pil", "torch"])
@pytest.mark.parametrize("case", FAMILY_IMAGE_SIZES, ids=lambda c: f"{c[0]}x{c[1]}")
def test_family_image_parity_with_hf(family, resample, case):
    h, w, overrides = case
    spec = replace(media.IMAGE_SPECS[PRESET[family]], **overrides, resample=resample)
    factor = spec.patch_size * spec.merge_size
    if not HF5 and family.startswith("glm") and min(h, w) < factor:
        pytest.skip("transformers 4.57's GLM-4V refuses sides under patch_size * merge_size (5.x scales them up)")
    pixels = noise(h, w, seed=h * 7 + w)
    proc = family_image_class(family, resample)(size=hf_size(spec))
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
    pixels = noise(56, 84)
    raster = media.image_patches(pixels, "paddleocr-vl", min_pixels=1, max_pixels=56 * 84)
    merged = media.image_patches(pixels, "paddleocr-vl", min_pixels=1, max_pixels=56 * 84, rows="merged")
    _, gh, gw = raster.segment.grid_thw
    order = torch.arange(gh * gw).view(gh // 2, 2, gw // 2, 2).permute(0, 2, 1, 3).reshape(-1)
    torch.testing.assert_close(merged.pixel_values, raster.pixel_values[order], rtol=0, atol=0)
    assert not torch.equal(merged.pixel_values, raster.pixel_values)


@needs_tv
@pytest.mark.parametrize("resample", ["pil", "torch"])
@pytest.mark.parametrize(("h", "w"), [(30, 40), (100, 400), (401, 101), (1500, 2000), (57, 57)])
def test_glm_image_edges_with_hf(h, w, resample):
    """GLM-Image's edge rule at the class's bounds: short side scaled up (30 x 40), aspect ratio 4 and just under,
    long side scaled down to round(sqrt(max_pixels)) = 1002 (1500 x 2000), halved odd sides."""
    spec = replace(media.IMAGE_SPECS["glm-image"], resample=resample)
    pixels = noise(h, w, seed=h + w)
    ours = media.image_patches(pixels, spec)
    out = family_image_class("glm-image", resample)()(images=[PILImage.fromarray(pixels)], return_tensors="pt")
    assert ours.segment.grid_thw == tuple(out["image_grid_thw"][0].tolist())
    torch.testing.assert_close(ours.pixel_values, out["pixel_values"], rtol=0, atol=0)


def test_cosmos3_edge_rows_are_pixels_then_channels():
    """Cosmos3-Edge's row holds (P, P, C, T): the Qwen layout (C, T, P, P) of the same patches, transposed."""
    pixels = noise(64, 96)
    ppct = media.image_patches(pixels, "cosmos3-edge", min_pixels=1, max_pixels=64 * 96)
    ctpp = media.image_patches(pixels, "cosmos3-edge", min_pixels=1, max_pixels=64 * 96, patch_layout="ctpp")
    n = ppct.pixel_values.shape[0]
    torch.testing.assert_close(ppct.pixel_values, ctpp.pixel_values.view(n, 3, 16 * 16).transpose(1, 2).reshape(n, -1))
    assert not torch.equal(ppct.pixel_values, ctpp.pixel_values)
