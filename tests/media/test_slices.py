"""mmpos.media.image_slices / video_slices (MiniCPM-V 4.6 / 4.7 slicing) against the installed
``MiniCPMV4_6ImageProcessor`` (PIL and torchvision classes) and ``MiniCPMV4_6VideoProcessor``: rows, ``target_sizes``,
grids, sampled frames; and image / clip -> slices -> token ids -> position ids equal to the model's own
``get_rope_index`` on the processor's ``target_sizes``."""

from __future__ import annotations

import importlib
import types
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image as PILImage

from mmpos import media

pytestmark = pytest.mark.hf  # parity with the installed transformers' processors: run on the oldest too

transformers = pytest.importorskip("transformers", reason="parity with the HF processors needs transformers")
pytest.importorskip("torchvision", reason="the HF torchvision image / video processors need torchvision")
VideoMetadata = importlib.import_module("transformers.video_utils").VideoMetadata


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


def _model():
    try:
        cm = importlib.import_module("transformers.models.minicpmv4_7.configuration_minicpmv4_7")
        mm = importlib.import_module("transformers.models.minicpmv4_7.modeling_minicpmv4_7")
    except ImportError:
        pytest.skip(f"transformers {transformers.__version__} has no minicpmv4_7 (the family is newer)")
    names = ("image_token_id", "video_token_id", "image_start_id", "image_end_id", "slice_start_id", "slice_end_id")
    config = cm.MiniCPMV4_7Config(**dict(zip((*names, "newline_id"), range(5001, 5008), strict=True)))
    owner = SimpleNamespace(config=config)
    for name in ("get_vision_position_ids", "_group_visual_frames"):
        setattr(owner, name, types.MethodType(getattr(mm.MiniCPMV4_7Model, name), owner))
    owner._frame_end_idx = mm.MiniCPMV4_7Model._frame_end_idx
    return config, mm.MiniCPMV4_7Model, owner


MARKERS = (5003, 5004, 5005, 5006, 5007)  # image_start, image_end, slice_start, slice_end, newline


def test_image_to_position_ids_equals_the_model():
    """image -> image_slices -> placeholder ids -> minicpmv4_7_rope_index equals MiniCPMV4_7Model.get_rope_index
    on the ids and the HF processor's target_sizes."""
    from mmpos.integrations.hf_families import minicpmv4_7_rope_index

    config, model, owner = _model()
    images = [_noise(1200, 1700), _noise(37, 91, seed=1), _noise(2000, 300, seed=2)]
    prompt, sizes = [11, 12], []
    for image in images:
        s = media.image_slices(image)
        prompt += [21, 22] + s.placeholder_ids(5001, *MARKERS) + [13]  # text (an image id) before it
        sizes.append(s.target_sizes)
    out = _processor("pil")()(images=[PILImage.fromarray(i) for i in images], return_tensors="pt")
    assert torch.equal(torch.cat(sizes), out["target_sizes"])
    input_ids = torch.tensor([prompt])
    mm_types = (input_ids == 5001).long()
    ref, ref_deltas = model.get_rope_index(
        owner, input_ids, mm_types, out["target_sizes"], None, downsample_mode="16x", attention_mask=None
    )
    pos, deltas = minicpmv4_7_rope_index(config, input_ids, target_sizes=torch.cat(sizes))
    assert torch.equal(pos, ref) and torch.equal(deltas, ref_deltas)


# --------------------------------------------------------------------------- videos
def _video_processor(**kwargs):
    try:
        module = importlib.import_module("transformers.models.minicpmv4_6.video_processing_minicpmv4_6")
    except ImportError:
        pytest.skip(f"transformers {transformers.__version__} has no minicpmv4_6 (the family is newer)")
    return module.MiniCPMV4_6VideoProcessor(**kwargs)


def _hf_video(frames: np.ndarray, fps: float, **kwargs):
    proc = _video_processor(**kwargs)
    total = frames.shape[0]
    meta = VideoMetadata(total_num_frames=total, fps=fps, duration=total / fps, width=frames.shape[2])
    meta.height = frames.shape[1]
    indices = list(proc.sample_frames(meta))
    video = torch.from_numpy(frames).permute(0, 3, 1, 2)
    return indices, proc(videos=[video], video_metadata=[meta], do_sample_frames=True, return_tensors="pt")


# (frames, fps, height, width, overrides): one frame a second (fractional duration, under 1 s), sliced frames,
# a clip longer than max_frames seconds (every 0.1 s, thinned), max_frames lowered, slicing off; stacked
# sub-frames: 1 a second (the frame itself), 2 (a row or a column), 3, 4 (2 x 2), 6 (one row), thinned, sliced
VIDEO_CASES = [
    (25, 10.0, 50, 70, {}),
    (3, 24.0, 300, 500, {}),
    (16, 8.0, 500, 700, {}),
    (30, 1.0, 20, 24, {"max_frames": 12}),  # 30 s > 12: 300 times thinned to 12 frames
    (40, 2.0, 60, 60, {"max_frames": 8}),
    (12, 4.0, 480, 640, {"slice_mode": False}),
    (25, 10.0, 50, 70, {"stack_frames": 2}),
    (16, 8.0, 60, 40, {"stack_frames": 3}),
    (30, 6.0, 40, 60, {"stack_frames": 4}),
    (30, 6.0, 64, 64, {"stack_frames": 5}),
    (30, 6.0, 40, 60, {"stack_frames": 7}),
    (50, 2.0, 30, 30, {"stack_frames": 3, "max_frames": 8}),
    (9, 4.0, 300, 500, {"stack_frames": 3}),
]


@pytest.mark.parametrize(
    "case", VIDEO_CASES, ids=lambda c: f"{c[0]}f{c[1]:g}fps{c[2]}x{c[3]}-{len(c[4])}{sum(c[4].values())}"
)
def test_video_slices_parity_with_hf(case):
    total, fps, h, w, overrides = case
    rng = np.random.default_rng(total)
    frames = np.stack([_noise(h, w, seed=int(s)) for s in rng.integers(0, 10**6, total)])
    ours = media.video_slices(frames, video_fps=fps, **overrides)
    names = {"max_frames": "max_num_frames", "slice_mode": "slice_mode", "stack_frames": "stack_frames"}
    indices, out = _hf_video(frames, fps, **{names[k]: v for k, v in overrides.items()})
    assert ours.frame_indices.tolist() == [int(i) for i in indices]
    assert out["num_frames_per_video"] == [len(ours.frames)]
    assert torch.equal(ours.target_sizes, out["target_sizes_videos"])
    assert [list(f.grid or (0, 0)) for f in ours.frames] == out["grids_videos"].tolist()
    torch.testing.assert_close(ours.navit(), out["pixel_values_videos"], rtol=0, atol=0)


@pytest.mark.parametrize(
    ("total", "fps", "max_frames", "want"),
    [
        (25, 10.0, 128, [0, 10, 20]),  # 2.5 s: seconds 0, 1, 2
        (3, 24.0, 128, [0]),  # 1/8 s: one frame
        (10, 2.0, 4, [0, 3, 6, 9]),  # 5 s > 4: every 0.1 s, int(t * 2) = 0 x 5, 1 x 5, ...; entries 0, 16, 32, 49
    ],
)
def test_minicpm_frame_indices_worked_examples(total, fps, max_frames, want):
    """MiniCPM-V's sampling by hand: one frame a second, or every 0.1 s thinned (``sample_frames``)."""
    assert media.minicpm_frame_indices(total, fps, max_frames).tolist() == want


def test_stacked_frames_by_hand():
    """``stack_frames=3`` on 2.5 s at 10 fps: main frames 0, 10, 20, then the sub-frames at 1/3, 2/3, 4/3, 5/3, 7/3 s
    (int(t * 10): 3, 6, 13, 16, 23); seconds 0 and 1 get a composite of two frames, second 2 of one (the frame)."""
    assert media.minicpm_frame_indices(25, 10.0, stack_frames=3).tolist() == [0, 10, 20, 3, 6, 13, 16, 23]
    frames = np.stack([_noise(40, 60, seed=i) for i in range(25)])
    clip = media.video_slices(frames, video_fps=10.0, stack_frames=3)
    assert len(clip.frames) == 6  # main 0, composite (3, 6), main 10, composite (13, 16), main 20, composite (23)
    # two 40 x 60 frames make a column (60 / 86 is nearer to square than 126 / 40), a 6-pixel black line between
    column = np.zeros((86, 60, 3), np.uint8)
    column[:40], column[46:] = frames[13], frames[16]
    want = media.image_slices(column, "minicpm-v4.6", resample="torch")
    torch.testing.assert_close(clip.frames[3].pixel_values, want.pixel_values, rtol=0, atol=0)
    alone = media.image_slices(frames[23], resample="torch")  # one sub-frame: the frame itself
    torch.testing.assert_close(clip.frames[5].pixel_values, alone.pixel_values, rtol=0, atol=0)


def test_video_file_equals_its_frames(tmp_path):
    """A file is decoded (OpenCV) and sampled as the array of its decoded frames."""
    import cv2

    path = tmp_path / "clip.avi"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 4.0, (80, 48))
    for i in range(10):
        writer.write(_noise(48, 80, seed=i))
    writer.release()
    from_file = media.video_slices(path)
    frames, _, fps, _ = media.read_video(path, "qwen2-vl")  # every frame
    from_array = media.video_slices(frames, video_fps=fps)
    assert from_file.frame_indices.tolist() == [0, 4, 8] == from_array.frame_indices.tolist()  # 2.5 s
    torch.testing.assert_close(from_file.pixel_values, from_array.pixel_values, rtol=0, atol=0)


def test_video_to_position_ids_equals_the_model():
    """clip -> video_slices -> placeholder ids -> minicpmv4_7_rope_index equals the model's get_rope_index on the
    HF processor's target_sizes_videos (sliced frames: each a thumbnail and 1 x 2 slices)."""
    from mmpos.integrations.hf_families import minicpmv4_7_rope_index

    config, model, owner = _model()
    frames = np.stack([_noise(500, 700, seed=i) for i in range(12)])
    clip = media.video_slices(frames, video_fps=4.0)
    _, out = _hf_video(frames, 4.0)
    assert torch.equal(clip.target_sizes, out["target_sizes_videos"]) and clip.frames[0].grid == (1, 2)
    input_ids = torch.tensor([[11, 12] + clip.placeholder_ids(5002, *MARKERS) + [13]])
    mm_types = 2 * (input_ids == 5002).long()
    ref, ref_deltas = model.get_rope_index(
        owner, input_ids, mm_types, None, out["target_sizes_videos"], downsample_mode="16x", attention_mask=None
    )
    pos, deltas = minicpmv4_7_rope_index(config, input_ids, target_sizes_videos=clip.target_sizes)
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
    with pytest.raises(ValueError, match="video_fps must be given for an array video"):
        media.video_slices(np.zeros((4, 20, 20, 3), np.uint8))
    with pytest.raises(ValueError, match="video_fps applies to array videos only"):
        media.video_slices("clip.avi", video_fps=2.0)
    with pytest.raises(TypeError, match="video must be a file path"):
        media.video_slices([1, 2])
