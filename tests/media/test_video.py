"""mmpos.media.video (``read_video``, ``video_patches``, ``VideoPatches``) against the installed Hugging Face video
processors: Qwen2-VL / Qwen2.5-VL / Qwen3-VL's on clips written here (and the positions their segments give a tiny
model), and the other families' (GLM-4V, GLM-4.6V, ERNIE-4.5-VL, HY-V4-VL, Cosmos3-Edge, Cohere Compass) built with
their class defaults. ERNIE's drawn timestamps: test_video_ernie_draw.py."""

from __future__ import annotations

import importlib
import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from _media_samples import (
    FAMILIES,
    HF5,
    VIDEO_PRESET,
    family_module,
    hf_size,
    needs_hf,
    needs_tv,
    noise,
    qwen_hf_video,
    video_metadata,
    write_clip,
)

from mmpos import layout, media
from mmpos.media._ops import resolve

pytestmark = pytest.mark.hf  # parity with the installed transformers' processors: run on the oldest too

cv2 = pytest.importorskip("cv2")


# --------------------------------------------------------------------------- Qwen2-VL / Qwen2.5-VL / Qwen3-VL
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
    write_clip(path, np.stack([noise(h, w, seed=i) for i in range(n)]), fps)
    spec = resolve(model, media.VIDEO_SPECS, dict(overrides))
    frames, indices, video_fps, total = media.read_video(path, spec)
    assert (total, video_fps) == (n, fps)
    if model == "qwen3-vl" and len(frames) < spec.temporal_patch_size:
        with pytest.raises(ValueError, match="clip.avi.*at least temporal_patch_size"):
            media.video_patches(path, spec)
        with pytest.raises(ValueError):  # the reference refuses too
            qwen_hf_video(spec, frames)
        return
    ours = media.video_patches(path, spec)
    ref, grid = qwen_hf_video(spec, frames)
    assert ours.segment.grid_thw == grid
    assert torch.equal(ours.pixel_values, ref)
    np.testing.assert_array_equal(ours.frame_indices, indices)
    if HF5:  # Qwen2.5-VL seconds per temporal patch: temporal_patch_size / sampled fps (4.x used the asked fps)
        meta = video_metadata(total, video_fps, indices.tolist())
        assert math.isclose(ours.segment.second_per_grid, spec.temporal_patch_size / meta.sampled_fps, rel_tol=1e-12)
    qwen3 = importlib.import_module("transformers.models.qwen3_vl.processing_qwen3_vl").Qwen3VLProcessor
    assert list(ours.timestamps) == qwen3._calculate_timestamps(None, indices, video_fps, spec.temporal_patch_size)


@needs_tv
def test_video_decoding_matches_hf_opencv_reader(tmp_path):
    from transformers.video_utils import read_video_opencv

    path = tmp_path / "clip.avi"
    write_clip(path, np.stack([noise(33, 47, seed=i) for i in range(11)]), 12.0)
    frames, indices, _, _ = media.read_video(path, "qwen3-vl")
    ref, meta = read_video_opencv(str(path), sample_indices_fn=lambda metadata, **kw: indices)
    assert meta.total_num_frames == 11 and meta.fps == 12.0
    np.testing.assert_array_equal(frames, np.asarray(ref))


@needs_tv
@pytest.mark.skipif(
    not HF5, reason="transformers 4.x Qwen3-VL refuses frames smaller than 32 pixels; 5.x scales them up"
)
def test_qwen3_tiny_frames_parity_with_hf():
    frames = np.stack([noise(9, 20, seed=i) for i in range(4)])
    spec = media.VIDEO_SPECS["qwen3-vl"]
    ours = media.video_patches(frames, spec, video_fps=4.0, fps=None, num_frames=4)
    ref, grid = qwen_hf_video(spec, frames)
    assert ours.segment.grid_thw == grid
    assert torch.equal(ours.pixel_values, ref)


def test_array_video_equals_file_and_layout(tmp_path):
    frames = np.stack([noise(40, 56, seed=i) for i in range(6)])
    path = tmp_path / "clip.avi"
    write_clip(path, frames, 3.0)
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
    frames = np.stack([noise(32, 32, seed=i) for i in range(20)])
    path = tmp_path / "cut.avi"
    write_clip(path, frames, 10.0)
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
    write_clip(one, frames[:1], 10.0)
    with pytest.raises(ValueError, match="one.avi.*cannot sample 0 frames"):  # HF divides by zero here
        media.video_patches(one, fps=2.0)


def test_zero_fps_container(tmp_path, monkeypatch):
    """A container whose frame rate reads 0 (OpenCV returns 0 when the stream has none)."""
    path = tmp_path / "nofps.avi"
    write_clip(path, np.stack([noise(32, 32, seed=i) for i in range(4)]), 10.0)
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
    write_clip(path, np.stack([noise(56, 84, seed=i) for i in range(n)]), container_fps)
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
    write_clip(path, np.stack([noise(64, 96, seed=i) for i in range(8)]), 4.0)  # 2 s at 4 fps
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


# --------------------------------------------------------------------------- the other families
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


def _family_hf_video(family: str, spec: media.MediaSpec, frames: np.ndarray, fps: float):
    cls = getattr(family_module(family, "video_processing"), FAMILIES[family][2])
    kwargs = {"size": hf_size(spec), "fps": spec.fps} if spec.fps else {"size": hf_size(spec)}
    if family == "ernie4.5-vl":  # mmpos draws no timestamps on frames (it would need the checkpoint's font)
        kwargs.update(draw_on_frames=False, min_frames=spec.min_frames, max_frames=spec.max_frames)
    elif family == "glm4v":
        kwargs["max_duration"] = spec.max_duration
    elif family == "cohere-compass":  # the per-frame pixel cap of 5.x, off by default (as in the Qwen tests above)
        kwargs["cap_pixels_per_frame"] = False
    elif family == "hy-v4-vl":
        kwargs.update(max_image_size={"longest_edge": spec.max_frame_pixels}, min_frames=spec.min_frames)
    proc = cls(**kwargs)
    total = frames.shape[0]
    meta = video_metadata(total, fps, duration=total / fps, width=frames.shape[2])
    meta.height = frames.shape[1]
    indices = np.asarray(proc.sample_frames(meta, fps=spec.fps) if spec.fps else proc.sample_frames(meta))
    video = torch.from_numpy(frames).permute(0, 3, 1, 2)
    out = proc(videos=[video], video_metadata=[meta], do_sample_frames=True, return_tensors="pt")
    return indices, out["pixel_values_videos"], tuple(out["video_grid_thw"][0].tolist())


@needs_tv
@pytest.mark.parametrize("family", [f for f in FAMILIES if FAMILIES[f][2]])
@pytest.mark.parametrize("case", VIDEO_CASES, ids=lambda c: f"{c[0]}f{c[1]:g}fps{c[2]}x{c[3]}")
def test_family_video_parity_with_hf(family, case):
    total, fps, h, w, overrides = case
    if family != "glm4v":
        overrides = {k: v for k, v in overrides.items() if k != "max_duration"}
    spec = replace(media.VIDEO_SPECS[VIDEO_PRESET[family]], **overrides)
    family_module(family, "video_processing")  # skips a family the release lacks
    if not HF5 and family == "glm4v" and total / fps * spec.fps < 1:
        pytest.skip("transformers 4.57's GLM-4V samples no frame from a clip under 1 / fps seconds (5.x takes one)")
    if not HF5 and family == "glm4v" and min(h, w) < spec.patch_size * spec.merge_size:
        pytest.skip("transformers 4.57's GLM-4V refuses sides under patch_size * merge_size (5.x scales them up)")
    rng = np.random.default_rng(total)
    frames = np.stack([noise(h, w, seed=int(s)) for s in rng.integers(0, 10**6, total)])
    ours = media.video_patches(frames, spec, video_fps=fps)
    indices, theirs, grid = _family_hf_video(family, spec, frames, fps)
    assert ours.frame_indices.tolist() == indices.tolist()
    assert ours.segment.grid_thw == grid
    torch.testing.assert_close(ours.pixel_values, theirs, rtol=0, atol=0)
    assert ours.segment.second_per_grid == pytest.approx(spec.temporal_patch_size / (len(indices) / total * fps))


def test_ernie_frames_padded_not_merged():
    """ERNIE-4.5-VL rows hold one frame (``3 * 14 * 14``); an odd frame count is padded to even, grid t = frames."""
    frames = np.stack([noise(56, 56, seed=i) for i in range(17)])
    out = media.video_patches(frames, "ernie4.5-vl", video_fps=4.0, min_pixels=1, max_pixels=56 * 56)
    assert out.frame_indices.tolist() == list(range(17))  # every frame: 17 in [16, 180]
    assert out.segment.grid_thw == (18, 4, 4) and out.pixel_values.shape == (18 * 16, 3 * 14 * 14)
    torch.testing.assert_close(out.pixel_values[-16:], out.pixel_values[-32:-16], rtol=0, atol=0)


def _hy_video(frames: np.ndarray, fps: float, **kwargs):
    cls = family_module("hy-v4-vl", "video_processing").HYV4VLVideoProcessor
    total = frames.shape[0]
    meta = video_metadata(total, fps, duration=total / fps, width=frames.shape[2])
    meta.height = frames.shape[1]
    video = torch.from_numpy(frames).permute(0, 3, 1, 2)
    out = cls(**kwargs)(videos=[video], video_metadata=[meta], return_tensors="pt")
    return out["pixel_values_videos"], tuple(out["video_grid_thw"][0].tolist())


@needs_tv
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
    frames = np.stack([noise(h, w, seed=int(s)) for s in rng.integers(0, 10**6, total)])
    spec = replace(media.VIDEO_SPECS["hy-v4-vl"], **overrides, fps=None, num_frames=total)
    ours = media.video_patches(frames, spec, video_fps=2.0)
    kwargs = {"size": hf_size(spec), "max_image_size": {"longest_edge": spec.max_frame_pixels}}
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
