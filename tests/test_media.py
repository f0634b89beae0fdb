"""mmpos.media against the Hugging Face Qwen-VL image and video processors, on files written here."""

from __future__ import annotations

import importlib
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image as PILImage

from mmpos import layout, media
from mmpos.media._ops import resolve

cv2 = pytest.importorskip("cv2")
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


def _image_processor(resample: str):
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


def _kwargs(spec: media.MediaSpec) -> dict:
    return {
        "size": {"shortest_edge": spec.min_pixels, "longest_edge": spec.max_pixels},
        "patch_size": spec.patch_size,
        "merge_size": spec.merge_size,
        "temporal_patch_size": spec.temporal_patch_size,
        "image_mean": list(spec.mean),
        "image_std": list(spec.std),
    }


def _hf_image(spec: media.MediaSpec, image: PILImage.Image):
    # transformers 4.57's NumPy image processor ignores a valid ``size`` (keeps its defaults): give min/max too
    proc = _image_processor(spec.resample)(**_kwargs(spec), min_pixels=spec.min_pixels, max_pixels=spec.max_pixels)
    # 4.x guesses the channel axis from the shape (wrong for an image 3 pixels tall): tell it
    extra = {"input_data_format": "channels_last"} if not HF5 and spec.resample == "pil" else {}
    out = proc(images=[image], return_tensors="pt", **extra)
    return out["pixel_values"], tuple(out["image_grid_thw"][0].tolist())


def _hf_video(spec: media.MediaSpec, frames: np.ndarray):
    name = "qwen3_vl" if spec.frames == "qwen3-vl" else "qwen2_vl"
    module = importlib.import_module(f"transformers.models.{name}.video_processing_{name}")
    cls = module.Qwen3VLVideoProcessor if name == "qwen3_vl" else module.Qwen2VLVideoProcessor
    kwargs = {"cap_pixels_per_frame": False} if HF5 else {}
    proc = cls(**_kwargs(spec), do_sample_frames=False, **kwargs)
    out = proc(videos=[torch.from_numpy(frames).permute(0, 3, 1, 2)], return_tensors="pt")
    return out["pixel_values_videos"], tuple(out["video_grid_thw"][0].tolist())


def _noise(h: int, w: int, seed: int = 0, channels: int = 3) -> np.ndarray:
    """A gradient plus noise in uint8 (wrapping), so resampling has structure to get wrong."""
    rng = np.random.default_rng(seed)
    rows = (np.arange(h) * 255 // max(h - 1, 1)).astype(np.uint8)[:, None, None]
    cols = (np.arange(w) * 127 // max(w - 1, 1)).astype(np.uint8)[None, :, None]
    shift = (np.arange(channels) * 40).astype(np.uint8)
    return rows + cols + shift + rng.integers(0, 60, (h, w, channels), dtype=np.uint8)


def _write_clip(path, frames: np.ndarray, fps: float) -> None:
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), fps, (frames.shape[2], frames.shape[1]))
    assert writer.isOpened()
    for frame in frames:
        writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))
    writer.release()


# --------------------------------------------------------------------------- images
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
    PILImage.fromarray(_noise(h, w)).save(path)
    spec = resolve(model, media.IMAGE_SPECS, {"resample": resample, **overrides})
    ours = media.image_patches(path, spec)
    ref, grid = _hf_image(spec, media.load_image(path))
    assert ours.segment == layout.Image(grid)
    assert ours.pixel_values.dtype == torch.float32
    assert torch.equal(ours.pixel_values, ref)


@needs_hf
@pytest.mark.parametrize("mode", ["RGBA", "LA", "P", "L", "CMYK"])
def test_image_modes_parity_with_hf(tmp_path, mode):
    rgba = _noise(45, 61, channels=4)
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
    ref, grid = _hf_image(spec, PILImage.open(path))
    ours = media.image_patches(path)
    assert ours.segment.grid_thw == grid
    assert torch.equal(ours.pixel_values, ref)


def test_image_inputs_agree(tmp_path):
    rgb = _noise(50, 70)
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
    rgb = _noise(30, 80)
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
        media.image_patches(_noise(*hw))
    with pytest.raises(ValueError):
        _hf_image(media.IMAGE_SPECS["qwen2-vl"], PILImage.fromarray(_noise(*hw)))


def test_bad_image_files(tmp_path):
    good = tmp_path / "good.jpg"
    PILImage.fromarray(_noise(64, 64)).save(good, quality=90)
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


def test_public_names_resolve():
    assert all(hasattr(media, name) for name in media.__all__)


def test_spec_validation():
    with pytest.raises(ValueError, match="spec must be"):
        media.image_patches(_noise(8, 8), "qwen9")
    with pytest.raises(TypeError, match="unknown MediaSpec field"):
        media.image_patches(_noise(8, 8), patchsize=16)
    with pytest.raises(ValueError, match="resample"):
        media.image_patches(_noise(8, 8), resample="bilinear")
    with pytest.raises(ValueError, match="min_pixels"):
        media.MediaSpec(14, 100, 10, media.CLIP_MEAN, media.CLIP_STD, "pil")
    with pytest.raises(ValueError, match="exclusive"):
        media.MediaSpec(14, 1, 10, media.CLIP_MEAN, media.CLIP_STD, "pil", fps=1, num_frames=4)
    with pytest.raises(ValueError, match="std"):
        media.MediaSpec(14, 1, 10, media.CLIP_MEAN, (1, 0, 1), "pil")


# --------------------------------------------------------------------------- videos
def _metadata(total, fps, indices=None):
    from transformers.video_utils import VideoMetadata

    return VideoMetadata(total_num_frames=total, fps=fps, frames_indices=indices)


def _hf_sampler(rule):
    name = "qwen3_vl" if rule == "qwen3-vl" else "qwen2_vl"
    module = importlib.import_module(f"transformers.models.{name}.video_processing_{name}")
    return module.Qwen3VLVideoProcessor() if name == "qwen3_vl" else module.Qwen2VLVideoProcessor()


@needs_tv
@pytest.mark.parametrize("total,video_fps", [(1, 25.0), (7, 30.0), (16, 24.0), (125, 29.97), (900, 30.0)])
@pytest.mark.parametrize("rule", ["qwen2-vl", "qwen3-vl"])
@pytest.mark.parametrize("want", [{"fps": 2.0}, {"fps": 0.5}, {"num_frames": 6}, {}])
def test_frame_indices_parity_with_hf(total, video_fps, rule, want):
    spec = resolve(rule, media.VIDEO_SPECS, {"fps": None, "num_frames": None, **want})
    proc = _hf_sampler(rule)
    if rule == "qwen2-vl" and not want:  # HF's Qwen2-VL default is do_sample_frames=False: every frame
        np.testing.assert_array_equal(media.sample_frame_indices(total, video_fps, spec), np.arange(total))
        return
    try:
        ref = np.asarray(proc.sample_frames(_metadata(total, video_fps), **want)).astype(np.int64)
    except (ValueError, ZeroDivisionError):
        with pytest.raises(ValueError, match="cannot sample"):
            media.sample_frame_indices(total, video_fps, spec)
        return
    if rule == "qwen3-vl" and not want:  # HF then samples at its default 2 fps; mmpos's preset does the same
        spec = media.VIDEO_SPECS["qwen3-vl"]
    np.testing.assert_array_equal(media.sample_frame_indices(total, video_fps, spec), ref)


CLIPS = [  # frames, height, width, fps, spec overrides
    (1, 40, 60, 10.0, {}),
    (5, 37, 53, 10.0, {}),
    (9, 64, 48, 7.0, {"fps": 2.0}),
    (12, 30, 170, 24.0, {"num_frames": 4}),
]


@needs_tv
@pytest.mark.parametrize("model", ["qwen2-vl", "qwen2.5-vl", "qwen3-vl"])
@pytest.mark.parametrize("clip", CLIPS, ids=lambda c: f"{c[0]}f{c[1]}x{c[2]}")
def test_video_parity_with_hf(tmp_path, model, clip):
    n, h, w, fps, overrides = clip
    if model == "qwen3-vl" and min(h, w) < 32 and not HF5:
        pytest.skip("transformers 4.x Qwen3-VL refuses frames smaller than 32 pixels; 5.x scales them up")
    path = tmp_path / "clip.avi"
    _write_clip(path, np.stack([_noise(h, w, seed=i) for i in range(n)]), fps)
    spec = resolve(model, media.VIDEO_SPECS, dict(overrides))
    frames, indices, video_fps, total = media.read_video(path, spec)
    assert (total, video_fps) == (n, fps)
    if model == "qwen3-vl" and len(frames) < spec.temporal_patch_size:
        with pytest.raises(ValueError, match="clip.avi.*at least temporal_patch_size"):
            media.video_patches(path, spec)
        with pytest.raises(ValueError):  # the reference refuses too
            _hf_video(spec, frames)
        return
    ours = media.video_patches(path, spec)
    ref, grid = _hf_video(spec, frames)
    assert ours.segment.grid_thw == grid
    assert torch.equal(ours.pixel_values, ref)
    np.testing.assert_array_equal(ours.frame_indices, indices)
    if HF5:  # Qwen2.5-VL seconds per temporal patch: temporal_patch_size / sampled fps (4.x used the asked fps)
        meta = _metadata(total, video_fps, indices.tolist())
        assert math.isclose(ours.segment.second_per_grid, spec.temporal_patch_size / meta.sampled_fps, rel_tol=1e-12)
    qwen3 = importlib.import_module("transformers.models.qwen3_vl.processing_qwen3_vl").Qwen3VLProcessor
    assert list(ours.timestamps) == qwen3._calculate_timestamps(None, indices, video_fps, spec.temporal_patch_size)


@needs_tv
def test_video_decoding_matches_hf_opencv_reader(tmp_path):
    from transformers.video_utils import read_video_opencv

    path = tmp_path / "clip.avi"
    _write_clip(path, np.stack([_noise(33, 47, seed=i) for i in range(11)]), 12.0)
    frames, indices, _, _ = media.read_video(path, "qwen3-vl")
    ref, meta = read_video_opencv(str(path), sample_indices_fn=lambda metadata, **kw: indices)
    assert meta.total_num_frames == 11 and meta.fps == 12.0
    np.testing.assert_array_equal(frames, np.asarray(ref))


@needs_tv
@pytest.mark.skipif(
    not HF5, reason="transformers 4.x Qwen3-VL refuses frames smaller than 32 pixels; 5.x scales them up"
)
def test_qwen3_tiny_frames_parity_with_hf():
    frames = np.stack([_noise(9, 20, seed=i) for i in range(4)])
    spec = media.VIDEO_SPECS["qwen3-vl"]
    ours = media.video_patches(frames, spec, video_fps=4.0, fps=None, num_frames=4)
    ref, grid = _hf_video(spec, frames)
    assert ours.segment.grid_thw == grid
    assert torch.equal(ours.pixel_values, ref)


def test_array_video_equals_file_and_layout(tmp_path):
    frames = np.stack([_noise(40, 56, seed=i) for i in range(6)])
    path = tmp_path / "clip.avi"
    _write_clip(path, frames, 3.0)
    decoded, _, _, _ = media.read_video(path)
    from_file = media.video_patches(path, "qwen2.5-vl", fps=1.0)
    from_array = media.video_patches(decoded, "qwen2.5-vl", video_fps=3.0, fps=1.0)
    assert torch.equal(from_file.pixel_values, from_array.pixel_values)
    assert from_file.segment == from_array.segment
    t, h, w = from_file.segment.grid_thw
    assert from_file.pixel_values.shape == (t * h * w, 3 * 2 * 14 * 14)
    # fps=1 asks for 2 of the 6 frames at 3 fps; min_frames=4 keeps 4, a real rate of 2 fps
    np.testing.assert_array_equal(from_file.frame_indices, [0, 1, 3, 4])
    assert from_file.segment.second_per_grid == pytest.approx(2 / 2.0)
    out = layout.build([[layout.Text(3), from_file.segment, layout.Text(2)]], "qwen2.5-vl")
    assert out.position_ids.shape == (3, 1, 3 + t * h * w // 4 + 2)
    segs = from_file.qwen3_segments(lambda text: len(text.split()) + 2)  # "<0.5 seconds>": 4 tokens, say
    texts = [layout.Text(4 + 1)] + [layout.Text(1 + 4 + 1)] * (t - 1)  # (end) timestamp start
    assert segs[:-1:2] == texts and segs[1::2] == [layout.Video((1, h, w))] * t and segs[-1] == layout.Text(1)


def test_bad_video_files(tmp_path):
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(b"\x00" * 2048)
    with pytest.raises(ValueError, match="junk.mp4"):
        media.video_patches(junk)
    with pytest.raises(ValueError, match="nothere.mp4.*does not exist"):
        media.video_patches(tmp_path / "nothere.mp4")
    empty = tmp_path / "empty.avi"  # a container with no frames
    writer = cv2.VideoWriter(str(empty), cv2.VideoWriter_fourcc(*"MJPG"), 10.0, (32, 32))
    writer.release()
    with pytest.raises(ValueError, match="empty.avi"):
        media.video_patches(empty)
    frames = np.stack([_noise(32, 32, seed=i) for i in range(20)])
    path = tmp_path / "cut.avi"
    _write_clip(path, frames, 10.0)
    data = path.read_bytes()
    (tmp_path / "cut2.avi").write_bytes(data[: len(data) // 3])
    with pytest.raises(ValueError, match="cut2.avi"):
        media.video_patches(tmp_path / "cut2.avi")
    with pytest.raises(ValueError, match=r"video_fps \(the frame rate of an array video\) must be a finite number > 0"):
        media.video_patches(frames, video_fps=0)
    with pytest.raises(ValueError, match="video_fps applies to array videos only"):
        media.video_patches(path, video_fps=10.0)
    with pytest.raises(ValueError, match="cannot sample"):
        media.video_patches(frames[:1], video_fps=10.0, fps=2.0)
    with pytest.raises(ValueError, match="cannot sample 0 frames"):
        media.video_patches(frames[:3], "qwen3-vl", video_fps=10.0, fps=2.0, min_frames=0)
    one = tmp_path / "one.avi"
    _write_clip(one, frames[:1], 10.0)
    with pytest.raises(ValueError, match="one.avi.*cannot sample 0 frames"):  # HF divides by zero here
        media.video_patches(one, fps=2.0)


def test_zero_fps_container(tmp_path, monkeypatch):
    """A container whose frame rate reads 0 (OpenCV returns 0 when the stream has none)."""
    path = tmp_path / "nofps.avi"
    _write_clip(path, np.stack([_noise(32, 32, seed=i) for i in range(4)]), 10.0)
    real = cv2.VideoCapture

    class ZeroFps:
        def __init__(self, name):
            self._cap = real(name)

        def get(self, prop):
            return 0.0 if prop == cv2.CAP_PROP_FPS else self._cap.get(prop)

        def __getattr__(self, name):
            return getattr(self._cap, name)

    monkeypatch.setattr(cv2, "VideoCapture", ZeroFps)
    with pytest.raises(ValueError, match="nofps.avi.? has frame rate 0.0"):
        media.video_patches(path)


@needs_hf
def test_docs_example(tmp_path, monkeypatch):
    """Every ``python`` block of docs/media.md, in order, in one namespace (files written to tmp_path)."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "media.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.DOTALL)
    assert len(blocks) == 7  # the Qwen walk-through (5), the other families' presets (1), MiniCPM-V slices (1)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, "docs/media.md", "exec"), namespace)  # noqa: S102 (the docs are ours)
    assert namespace["tokens"].shape[1] == len(namespace["prompt"]) + 4


def _logits_given_and_own(model, inputs: dict, positions) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits with the layout's ``position_ids`` and with the model's own ``get_rope_index``."""
    import inspect

    if "mm_token_type_ids" in inspect.signature(model.forward).parameters:  # transformers >= 5.3
        inputs = {**inputs, "mm_token_type_ids": positions.modality}
    with torch.no_grad():
        return model(**inputs, position_ids=positions.position_ids).logits, model(**inputs).logits


@needs_hf
@pytest.mark.parametrize(
    "clip",
    [(16, 8.0, 2.0, [0, 4, 8, 12], 1.0), (15, 5.0, 1.5, [0, 3, 7, 11], 1.5)],  # frames, container fps, fps, ...
    ids=["whole-seconds", "fractional"],
)
def test_qwen2_5_vl_positions_from_file_timestamps(tmp_path, clip):
    """A clip's ``second_per_grid`` drives Qwen2.5-VL's time axis: layout positions from the file's
    segment give the same logits over the video as the model's own ``get_rope_index`` fed ``second_per_grid_ts``."""

    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    n, container_fps, fps, kept, seconds = clip
    if seconds % 1 and not HF5:
        pytest.skip("transformers 4.57 truncates second_per_grid_ts to an integer (as_tensor(..., int64))")
    path = tmp_path / "clip.avi"
    _write_clip(path, np.stack([_noise(56, 84, seed=i) for i in range(n)]), container_fps)
    video = media.video_patches(path, "qwen2.5-vl", fps=fps, min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 6)
    assert video.frame_indices.tolist() == kept  # at least min_frames=4
    assert video.segment.second_per_grid == pytest.approx(seconds)
    vid, start, end = 121, 122, 123
    t, h, w = video.segment.grid_thw
    prompt = [5, 6, start] + [vid] * (t * h * w // 4) + [end, 9, 10]
    positions = layout.build([[layout.Text(3), video.segment, layout.Text(3)]], "qwen2.5-vl")
    text = {"vocab_size": 128, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
            "num_attention_heads": 4, "num_key_value_heads": 2, "bos_token_id": 1, "eos_token_id": 2,
            "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}}  # fmt: skip
    vision = {"depth": 1, "hidden_size": 32, "out_hidden_size": 64, "intermediate_size": 64, "num_heads": 2,
              "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "in_channels": 3,
              "window_size": 56, "fullatt_block_indexes": [0], "tokens_per_second": 2}  # fmt: skip
    config = Qwen2_5_VLConfig(text_config=text, vision_config=vision, image_token_id=120, video_token_id=vid,
                              vision_start_token_id=start, vision_end_token_id=end)  # fmt: skip
    torch.manual_seed(0)
    model = Qwen2_5_VLForConditionalGeneration(config).eval()
    inputs = {
        "input_ids": torch.tensor([prompt]),
        "attention_mask": positions.attention_mask,
        "pixel_values_videos": video.pixel_values,
        "video_grid_thw": torch.tensor([video.segment.grid_thw]),
        "second_per_grid_ts": torch.tensor([video.segment.second_per_grid]),
    }
    ours, own = _logits_given_and_own(model, inputs, positions)
    # up to the last video token (causal: later positions cannot change these logits); the text after a
    # video advances by transformers' release rule (>= 5.3: by max(h, w) only), which layout's ``rule`` selects
    last = 3 + t * h * w // 4
    torch.testing.assert_close(ours[:, :last], own[:, :last], rtol=0, atol=0)
    assert positions.position_ids[0, 0, 3 + h * w // 4] == 3 + int(seconds * 2)  # 2nd temporal patch, 2 tokens/s


@needs_hf
def test_qwen3_vl_timestamp_layout_matches_model(tmp_path):
    """``qwen3_segments`` reproduces Qwen3-VL's ``<t seconds><start>frame<end>`` prompt: layout positions
    give the same logits as a tiny Qwen3-VL's own ``get_rope_index``."""

    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    path = tmp_path / "clip.avi"
    _write_clip(path, np.stack([_noise(64, 96, seed=i) for i in range(8)]), 4.0)  # 2 s at 4 fps
    video = media.video_patches(path, "qwen3-vl", min_pixels=32 * 32 * 8, max_pixels=32 * 32 * 24)
    assert video.segment.grid_thw[0] == 2
    _, h, w = video.segment.grid_thw
    assert video.frame_indices.tolist() == [0, 2, 5, 7] and video.timestamps == (0.25, 1.5)  # 2 fps: 4 frames
    vid, start, end = 121, 122, 123
    stamp = {text: [30 + i for i in range(len(text))] for text in (f"<{s:.1f} seconds>" for s in video.timestamps)}
    prompt = [5, 6]
    for s in video.timestamps:
        prompt += stamp[f"<{s:.1f} seconds>"] + [start] + [vid] * (h * w // 4) + [end]
    prompt += [9, 10]
    segments = [layout.Text(2), *video.qwen3_segments(lambda text: len(stamp[text])), layout.Text(2)]
    positions = layout.build([segments], "qwen3-vl")
    assert positions.position_ids.shape[-1] == len(prompt)
    text = {"vocab_size": 128, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "bos_token_id": 1, "eos_token_id": 2,
            "rope_scaling": {"rope_type": "default", "mrope_section": [4, 2, 2], "mrope_interleaved": True}}  # fmt: skip
    vision = {"depth": 1, "hidden_size": 32, "out_hidden_size": 64, "num_heads": 2, "intermediate_size": 64,
              "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2, "in_channels": 3,
              "num_position_embeddings": 16, "deepstack_visual_indexes": [0]}  # fmt: skip
    config = Qwen3VLConfig(text_config=text, vision_config=vision, image_token_id=120, video_token_id=vid,
                           vision_start_token_id=start, vision_end_token_id=end)  # fmt: skip
    torch.manual_seed(0)
    model = Qwen3VLForConditionalGeneration(config).eval()
    inputs = {
        "input_ids": torch.tensor([prompt]),
        "attention_mask": positions.attention_mask,
        "pixel_values_videos": video.pixel_values,
        "video_grid_thw": torch.tensor([video.segment.grid_thw]),
    }
    ours, own = _logits_given_and_own(model, inputs, positions)
    torch.testing.assert_close(ours, own, rtol=0, atol=0)


@needs_tv
def test_frame_indices_where_the_reference_float_step_overshoots():
    """Qwen2-VL sampling is the reference's float32 arange(0, total, total / n), except where its rounding adds
    an index past the clip -- 367 frames at 24 fps sampled at 2 fps (n = 30) give 31 indices ending at 367, 291
    frames at 1 fps (n = 290) 291 ending at 291, which fail there: mmpos keeps the n evenly spaced frames."""
    proc = _hf_sampler("qwen2-vl")
    spec = resolve("qwen2-vl", media.VIDEO_SPECS, {"fps": 2.0})
    for total, video_fps, n in ((367, 24.0, 30), (291, 1.0, 290)):
        ref = np.asarray(proc.sample_frames(_metadata(total, video_fps), fps=2.0)).astype(np.int64)
        assert len(ref) == n + 1 and ref[-1] == total  # the reference: one index too many, past the last frame
        ours = media.sample_frame_indices(total, video_fps, spec)
        np.testing.assert_array_equal(ours, np.arange(n) * total // n)
        np.testing.assert_array_equal(ours, ref[:n])  # the reference's own indices, without the extra one
    frames = np.zeros((291, 8, 8, 3), np.uint8)
    out = media.video_patches(frames, video_fps=1.0, fps=2.0, min_pixels=28 * 28, max_pixels=28 * 28)
    assert out.frame_indices.tolist() == list(range(290))  # (an IndexError before)
