"""Documented errors, one table: each row a call, the exception it must raise and a regex that names the argument
(or the part of a model) at fault. Rows marked ``hf`` build a tiny random Qwen2-VL of the installed transformers
(``make test`` runs them on 4.57.1 and 5.24)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable

import numpy as np
import pytest
import torch
from torch import nn

import mmpos
from mmpos import Coords
from mmpos.encoders.registry import register_encoder
from mmpos.nn import Attention, attention

try:  # at collection, as the other hf test modules (a slow import); the hf rows skip without it
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration
except ImportError:
    Qwen2VLConfig = Qwen2VLForConditionalGeneration = None


def row(name: str, call: Callable[[], object], exc: type[Exception], match: str, marks=()):
    return pytest.param(call, exc, match, id=name, marks=marks)


# ---------------------------------------------------------------- registry
def _register_bad_kind():
    register_encoder("my-encoder", kind="rotation", paper="-")


def _register_duplicate():
    mmpos.list_encoders()  # every built-in encoder registered
    register_encoder("rope", kind="rotary", paper="-")(lambda **kwargs: None)


# ---------------------------------------------------------------- mmpos.nn attention
def _qkv():
    return (torch.randn(1, 2, 6, 8) for _ in range(3))


def _float_mask_function():
    attention(*_qkv(), attn_mask=torch.zeros(1, 1, 6, 6))  # an additive float mask, as SDPA would take


def _float_mask_module():
    Attention(16, 2)(torch.randn(1, 6, 16), attn_mask=torch.ones(1, 1, 6, 6, dtype=torch.int64))


def _dropout_function(p: float) -> Callable[[], object]:
    return lambda: attention(*_qkv(), dropout_p=p)


# ---------------------------------------------------------------- timm
def _timm_block(block_fn: str) -> Callable[[], object]:
    def call():
        import timm.models.vision_transformer as tv

        from mmpos.integrations import timm as mt

        model = tv.VisionTransformer(
            img_size=16, patch_size=8, embed_dim=16, depth=1, num_heads=2, num_classes=2, block_fn=getattr(tv, block_fn)
        )
        mt.convert(model, pos="rope")

    return call


# ---------------------------------------------------------------- Hugging Face use_rope
def _qwen2_vl():
    if Qwen2VLConfig is None:
        pytest.skip("needs transformers (the hf extra)")
    text = {
        "vocab_size": 64,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
    }
    vision = {"depth": 1, "embed_dim": 16, "hidden_size": 32, "num_heads": 2, "patch_size": 2}
    config = Qwen2VLConfig(text_config=text, vision_config=vision, image_token_id=60)
    return Qwen2VLForConditionalGeneration(config)


def _rope_dict(model) -> dict:
    """The text config's RoPE dict: ``rope_parameters`` (transformers 5) or ``rope_scaling`` (4.x)."""
    cfg = model.config.text_config
    params = getattr(cfg, "rope_parameters", None)
    return params if isinstance(params, dict) and "rope_theta" in params else cfg.rope_scaling


def _use_rope_unknown_rope_type():
    from mmpos.integrations.hf import use_rope

    model = _qwen2_vl()
    rope = _rope_dict(model)
    rope.pop("type", None)
    rope["rope_type"] = "wobbly"  # (yarn and the other HF rules are carried over: mmpos.scaling)
    use_rope(model, "vrope")


def _use_rope_no_theta():
    from mmpos.integrations.hf import use_rope

    model = _qwen2_vl()
    cfg = model.config.text_config
    for name in ("rope_parameters", "rope_theta"):
        if hasattr(cfg, name):
            setattr(cfg, name, None)
    use_rope(model, "vrope")


def _use_rope_unknown_attention():
    from mmpos.integrations.hf import use_rope

    model = _qwen2_vl()
    attn = model.model.language_model.layers[0].self_attn
    attn.q_proj = None  # neither q_norm/k_norm nor q_proj/k_proj: where would MHRoPE hook?
    use_rope(model, "mhrope", head_sections=[1, 0, 1])  # 2 KV heads


class _OddRotary(nn.Module):
    def forward(self, x, position_ids):
        return torch.zeros(2, 2, 2, 2, 2), torch.zeros(2, 2, 2, 2, 2)


def _use_rope_unknown_rotary_output():
    from mmpos.integrations.hf import use_rope

    model = _qwen2_vl()
    model.model.language_model.rotary_emb = _OddRotary()
    use_rope(model, "vrope")


# ---------------------------------------------------------------- mmpos.media
def _read_empty_video():
    import tempfile

    import cv2

    from mmpos import media

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "empty.avi")
        cv2.VideoWriter(path, cv2.VideoWriter_fourcc(*"MJPG"), 8.0, (32, 32)).release()  # a container, no frame
        media.read_video(path, "qwen2-vl")


# ---------------------------------------------------------------- encoders refuse what they cannot encode (issue 22)
def _rope_rotation(n: int):
    return mmpos.create("rope", head_dim=8).rotation(Coords.sequence(n))


def _int32_ids_beyond_range():
    pytest.importorskip("transformers")
    from transformers import Qwen2_5_VLConfig

    from mmpos.integrations.hf_rope_index import get_rope_index

    config = Qwen2_5_VLConfig()
    config.vision_config.tokens_per_second = 2
    ids = torch.tensor([[151652, 151656, 151656, 151656, 151653]], dtype=torch.int32)  # START, 3 video, END
    get_rope_index(config, ids, video_grid_thw=torch.tensor([[3, 2, 2]]), second_per_grid_ts=torch.tensor([1e9]))


def _int32_packed_ids_beyond_range():
    pytest.importorskip("transformers")
    from transformers import Qwen2_5_VLConfig

    from mmpos.integrations.hf_rope_index import packed_rope_index

    config = Qwen2_5_VLConfig()
    config.vision_config.tokens_per_second = 2
    ids = torch.tensor([[5, 151652, 151656, 151656, 151656, 151653]], dtype=torch.int32)  # text | START, 3 video, END
    cu = torch.tensor([0, 1, 6])
    packed_rope_index(config, ids, cu, video_grid_thw=torch.tensor([[3, 2, 2]]), second_per_grid_ts=torch.tensor([1e9]))


ENCODER_CASES = [
    *(
        row(
            f"mhrope-{kv}-kv-heads",
            lambda kv=kv: mmpos.create("mhrope", head_dim=16, num_kv_heads=kv),
            ValueError,
            rf"3 axes \(t, h, w\): num_kv_heads={kv} cannot hold the default head_sections",
        )
        for kv in (1, 2, 3)
    ),
    row(
        "rotation-of-one-token-for-six",
        lambda: attention(*_qkv(), coords=Coords.sequence(6), encoders=[_rope_rotation(1)]),
        ValueError,
        r"this Rotation holds angles for 1 tokens, got q with 6 and k with 6 tokens",
    ),
    row(
        "rotation-integer-q",
        lambda: _rope_rotation(6).rotate(torch.ones(1, 2, 6, 8, dtype=torch.int64), torch.randn(1, 2, 6, 8)),
        TypeError,
        r"q and k must be floating-point tensors, got torch.int64 and torch.float32",
    ),
    row(
        "rope-bool-k",
        lambda: mmpos.create("rope", head_dim=8).rotate(
            torch.randn(1, 2, 6, 8), torch.ones(1, 2, 6, 8, dtype=torch.bool), Coords.sequence(6)
        ),
        TypeError,
        r"q and k must be floating-point tensors",
    ),
    row(
        "additive-integer-x",
        lambda: mmpos.create("sincos", dim=8)(torch.ones(1, 6, 8, dtype=torch.int32), Coords.sequence(6)),
        TypeError,
        r"x must be a floating-point tensor, got torch.int32",
    ),
    row(
        "attention-integer-v",
        lambda: attention(torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8), torch.ones(1, 2, 6, 8, dtype=torch.long)),
        TypeError,
        r"q, k, v must be floating-point tensors",
    ),
    row(
        "attention-3d-q",
        lambda: attention(torch.randn(2, 6, 8), torch.randn(2, 6, 8), torch.randn(2, 6, 8)),
        ValueError,
        r"q, k, v must be \(B, H, N, Dh\) tensors, got shapes \(2, 6, 8\)",
    ),
    row(
        "get-rope-index-int32-wraps",
        _int32_ids_beyond_range,
        ValueError,
        r"position ids reach 4000000002, beyond the range of input_ids' dtype torch.int32",
        marks=pytest.mark.hf,
    ),
    row(
        "packed-rope-index-int32-wraps",
        _int32_packed_ids_beyond_range,
        ValueError,
        r"position ids reach \d+, beyond the range of input_ids' dtype torch.int32",
        marks=pytest.mark.hf,
    ),
]


def _png_bytes(array) -> bytes:
    import io

    from PIL import Image as PILImage

    buf = io.BytesIO()
    PILImage.fromarray(array).save(buf, format="PNG")
    return buf.getvalue()


def _png_header(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width x height`` pixels (a decompression bomb's header, no pixel data)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0")) + chunk(b"IEND", b"")


def _media(name: str, *args, **kwargs):
    from mmpos import media

    return getattr(media, name)(*args, **kwargs)


def _video_spec(model: str = "qwen2-vl", **fields):
    from dataclasses import replace

    from mmpos import media

    return replace(media.VIDEO_SPECS[model], **fields)


def _sixteen_bit():
    import numpy as np

    return _media("load_image", _png_bytes((np.arange(64 * 64).reshape(64, 64) * 15).astype(np.uint16)))


def _float_image():
    import numpy as np
    from PIL import Image as PILImage

    return _media("load_image", PILImage.fromarray(np.full((4, 4), 1000.0, dtype=np.float32)))


ENCODER_CASES += [
    row("attention-float-dim", lambda: Attention(16.0, 2), ValueError, r"dim must be a positive int, got 16.0"),
    row("attention-zero-heads", lambda: Attention(16, 0), ValueError, r"num_heads must be a positive int, got 0"),
    row("attention-kv-heads-bool", lambda: Attention(16, 2, num_kv_heads=True), ValueError, r"num_kv_heads must be"),
    row("attention-causal-int", lambda: Attention(16, 2, causal=1), TypeError, r"causal must be a bool"),
    row(
        "coords-expand-0",
        lambda: Coords.grid(2, 3).expand(0),
        ValueError,
        r"expand\(\) needs a positive int batch, got 0",
    ),
    row("coords-expand-minus-1", lambda: Coords.grid(2, 3).expand(-1), ValueError, r"positive int batch, got -1"),
    row("coords-grid-axes-string", lambda: Coords.grid(2, 3, axes="hw"), ValueError, r"axes must name .* got 'hw'"),
    row("coords-repeated-axes", lambda: Coords(torch.zeros(1, 2, 2), ("h", "h")), ValueError, r"got \('h', 'h'\)"),
    row(
        "maglap-phase-tol-nan",
        lambda: __import__("mmpos.graph").graph.maglap_eigenpairs(torch.tensor([[0], [1]]), 2, 1, phase_tol=math.nan),
        ValueError,
        r"phase_tol must be a finite number >= 0, got nan",
    ),
]
ENCODER_CASES += [
    row(
        "irpe-ratio-allocates-95-GiB",
        lambda: mmpos.create("irpe", head_dim=16, ratio=1e4),
        ValueError,
        r"iRPE tables of ratio=10000.0 \(1,600,080,002 buckets, rpe_on='k'\) would need about 95.4 GiB",
    ),
    row(
        "irpe-grid-ids-32-GiB",
        lambda: mmpos.create("irpe", head_dim=16, grid_size=(256, 256)),
        ValueError,
        r"iRPE bucket ids of a 256 x 256 grid would need about 32.0 GiB",
    ),
    row(
        "irpe-shared-head-int",
        lambda: mmpos.create("irpe", head_dim=16, shared_head=1),
        TypeError,
        r"shared_head must be a bool \(True or False\), got 1",
    ),
    row(
        "layout-allocates-931-GiB",
        lambda: __import__("mmpos.layout").layout.build(
            [[__import__("mmpos.layout").layout.Image((1, 200000, 200000))]], "qwen2-vl"
        ),
        ValueError,
        r"a layout of 1 x 10,000,000,000 tokens would need about 931.3 GiB",
    ),
    row("image-16-bit-saturates", _sixteen_bit, ValueError, r"mode 'I;16' .* values in \[0, 61425\]: converting it"),
    row("image-float-saturates", _float_image, ValueError, r"mode 'F' .* would clip them to \[0, 255\]"),
    row(
        "image-decompression-bomb",
        lambda: _media("load_image", _png_header(100_000, 100_000)),
        ValueError,
        r"image <bytes> is refused as a possible decompression bomb: Image size \(10000000000 pixels\)",
    ),
    row(
        "smart-resize-max-pixels-0",
        lambda: _media("smart_resize", 28, 28, 28, 1, 0),
        ValueError,
        r"max_pixels must be a positive int, got 0",
    ),
    row(
        "smart-resize-min-over-max",
        lambda: _media("smart_resize", 28, 28, 28, 100, 10),
        ValueError,
        r"min_pixels=100 must be <= max_pixels=10",
    ),
    row(
        "smart-resize-video-temporal-0",
        lambda: _media("smart_resize_video", 4, 28, 28, 0, 28, 1, 10**6),
        ValueError,
        r"temporal_factor must be a positive int, got 0",
    ),
    # video sampling (issue 22): 0 fps divided by zero, a negative or inf rate sampled a wrong count silently
    row(
        "sample-frame-indices-fps-0",
        lambda: _media("sample_frame_indices", 10, 0.0, _video_spec(fps=2.0)),
        ValueError,
        r"video_fps must be a finite number > 0, got 0.0",
    ),
    row(
        "sample-frame-indices-fps-negative",
        lambda: _media("sample_frame_indices", 10, -5.0, _video_spec(fps=2.0)),
        ValueError,
        r"video_fps must be a finite number > 0, got -5.0",
    ),
    row(
        "sample-frame-indices-fps-inf-qwen3",
        lambda: _media("sample_frame_indices", 10, math.inf, _video_spec("qwen3-vl")),
        ValueError,
        r"video_fps must be a finite number > 0, got inf",
    ),
    row(
        "sample-frame-indices-spec-name",
        lambda: _media("sample_frame_indices", 10, 30.0, "qwen2-vl"),
        TypeError,
        r"spec must be a MediaSpec \(e.g. VIDEO_SPECS\['qwen2-vl'\]\), got str",
    ),
    row(
        "sample-frame-indices-0-frames",
        lambda: _media("sample_frame_indices", 10, 30.0, _video_spec(num_frames=1)),
        ValueError,
        r"cannot sample 0 frames \(a multiple of temporal_patch_size=2\) from a clip of 10 frames",
    ),
    row(
        "sample-frame-indices-huge-clip",
        lambda: _media("sample_frame_indices", 10**12, 30.0, _video_spec()),
        ValueError,
        r"frame indices of a clip of total_frames=1,000,000,000,000 would need about 7.3 TiB",
    ),
    row(
        "video-patches-none",
        lambda: _media("video_patches", None),
        TypeError,
        r"video must be a file path \(str / os.PathLike\) or uint8 frames \(F, H, W, 3\), got NoneType",
    ),
    row(
        "video-patches-list-with-fps",
        lambda: _media("video_patches", [[0]], video_fps=2.0),
        TypeError,
        r"video must be a file path .* got list",
    ),
    row(
        "video-patches-array-without-fps",
        lambda: _media("video_patches", np.zeros((2, 28, 28, 3), np.uint8)),
        ValueError,
        r"video_fps must be given for an array video",
    ),
    row(
        "video-file-is-a-directory",
        lambda: _media("video_patches", os.path.dirname(__file__)),
        ValueError,
        r"video file '.*tests' is not a file \(a directory\?\)",
    ),
    row(
        "image-file-is-a-directory",
        lambda: _media("load_image", os.path.dirname(__file__)),
        ValueError,
        r"image file '.*tests' is not a file \(a directory\?\)",
    ),
    row(
        "video-patches-one-frame-qwen3",
        lambda: _media("video_patches", np.zeros((1, 32, 32, 3), np.uint8), "qwen3-vl", video_fps=2.0),
        ValueError,
        r"video <ndarray>: Qwen3-VL resizing needs at least temporal_patch_size=2 frames, got 1",
    ),
]


@pytest.mark.parametrize("call, exc, match", ENCODER_CASES)
def test_encoders_refuse_what_they_cannot_encode(call, exc, match):
    with pytest.raises(exc, match=match) as info:
        call()
    assert type(info.value) is exc


def test_large_offsets_keep_integer_positions_exact():
    """Coords.sequence(start=1e8) in float32 gave 4 tokens 2 positions; the builders now pick float64 there."""
    c = Coords.sequence(4, start=10**8)
    assert c.pos.dtype == torch.float64 and c.pos.flatten().tolist() == [1e8, 1e8 + 1, 1e8 + 2, 1e8 + 3]
    assert Coords.sequence(4, start=10).pos.dtype == torch.float32  # the usual case is unchanged
    assert Coords.grid(1, 2**24 + 2).pos.dtype == torch.float64
    angles = mmpos.create("rope", head_dim=8).angles(c)
    assert angles.dtype == torch.float64 and len(set(angles[0, :, 0].tolist())) == 4


def test_float32_positions_beyond_two_to_the_24_warn_once(monkeypatch):
    import warnings

    from mmpos import coords as coords_module

    monkeypatch.setattr(coords_module, "_warned_inexact", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Coords.sequence(4, start=10**8, dtype=torch.float32)
        Coords.sequence(4, start=10**8, dtype=torch.float32)
        Coords.points(torch.tensor([[3.0e7, 0.0], [3.0e7 + 2, 1.0]]))
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and "above 16777216 (2**24) float32 cannot hold every integer" in messages[0]


def test_layout_coords_keep_integer_positions_exact_past_two_to_the_24():
    """A layout's coordinates were float32 whatever the positions: past 2**24 they no longer equalled the int64
    position_ids (60000005 read as 60000004). They are float64 there now, float32 below (unchanged)."""
    from mmpos.layout import Text, Video, build

    # Qwen2.5-VL: t = 3 + frame * tokens_per_second (2) * second_per_grid (1e7); the text after starts at max + 1
    lay = build([[Text(3), Video((4, 4, 4), second_per_grid=1e7), Text(3)]], "qwen2.5-vl")
    ids = lay.position_ids.permute(1, 2, 0)[0]  # (L, 3) int64
    assert ids.dtype == torch.int64 and ids[-3:, 0].tolist() == [60000004, 60000005, 60000006]
    assert lay.coords.pos.dtype == torch.float64 and torch.equal(lay.coords.pos[0], ids.double())
    small = build([[Text(3), Video((4, 4, 4), second_per_grid=1.0), Text(3)]], "qwen2.5-vl")
    assert small.coords.pos.dtype == torch.float32
    assert torch.equal(small.coords.pos[0], small.position_ids.permute(1, 2, 0)[0].float())


def test_layout_float32_position_ids_past_two_to_the_24_warn_once(monkeypatch):
    """HoPE writes float32 position_ids (as its reference): past 2**24 neighbours share an id -- one warning;
    its coordinates keep the packer's exact float64 positions."""
    import warnings

    from mmpos import _validate
    from mmpos.layout import Text, Video, build

    monkeypatch.setattr(_validate, "_warned", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            lay = build([[Text(3), Video((4, 4, 4)), Text(3)]], "hope", temporal_scale=1e7)
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and "scheme 'hope' writes float32 position_ids" in messages[0], messages
    ids = lay.position_ids.permute(1, 2, 0)[0]  # (L, 3) float32: two neighbours merged
    assert ids[-3:, 0].tolist() == [30000004.0, 30000004.0, 30000006.0]
    assert lay.coords.pos.dtype == torch.float64 and lay.coords.pos[0, -3:, 0].tolist() == [3e7 + 4, 3e7 + 5, 3e7 + 6]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build([[Text(3), Video((4, 4, 4)), Text(3)]], "hope", temporal_scale=1.0)
    assert not caught


CASES = [
    row("register_encoder-bad-kind", _register_bad_kind, ValueError, r"kind must be one of .*got 'rotation'"),
    row(
        "register_encoder-duplicate-name", _register_duplicate, ValueError, r"encoder name 'rope' is already registered"
    ),
    row("attention-float-attn_mask", _float_mask_function, ValueError, r"attn_mask must be a bool tensor.*float32"),
    row("Attention-int-attn_mask", _float_mask_module, ValueError, r"attn_mask must be a bool tensor.*int64"),
    row("attention-dropout_p-above-1", _dropout_function(1.5), ValueError, r"dropout_p must be .*<= 1, got 1.5"),
    row("attention-dropout_p-negative", _dropout_function(-0.1), ValueError, r"dropout_p must be .*>= 0.*got -0.1"),
    row("Attention-attn_drop", lambda: Attention(16, 2, attn_drop=2.0), ValueError, r"attn_drop must be .*got 2.0"),
    row("Attention-proj_drop", lambda: Attention(16, 2, proj_drop=float("nan")), ValueError, r"proj_drop must be"),
    row(
        "timm-ResPostBlock",
        _timm_block("ResPostBlock"),
        ValueError,
        r"block must be a timm vision_transformer\.Block, got ResPostBlock",
    ),
    row(
        "timm-ParallelScalingBlock",
        _timm_block("ParallelScalingBlock"),
        ValueError,
        r"block must be a timm vision_transformer\.Block, got ParallelScalingBlock",
    ),
    row(
        "use_rope-unknown-rope_type",
        _use_rope_unknown_rope_type,
        ValueError,
        r"rule must be one of \('linear', .*\), got 'wobbly'",
        marks=pytest.mark.hf,
    ),
    row(
        "use_rope-config-without-theta",
        _use_rope_no_theta,
        ValueError,
        r"neither rope_parameters\['rope_theta'\] nor rope_theta",
        marks=pytest.mark.hf,
    ),
    row(
        "use_rope-attention-without-q_proj",
        _use_rope_unknown_attention,
        ValueError,
        r"neither q_norm/k_norm nor q_proj/k_proj",
        marks=pytest.mark.hf,
    ),
    row(
        "use_rope-unknown-rotary-output",
        _use_rope_unknown_rotary_output,
        ValueError,
        r"_OddRotary returns cos .*: unknown (cos / sin shape|pair layout)",  # names the module and what is odd
        marks=pytest.mark.hf,
    ),
    row("media-read_video-no-frames", _read_empty_video, ValueError, r"video file '.*empty\.avi' has no frames"),
    # docs/encoders/learned.md and sincos.md
    row(
        "learned-grid_size-4-axes",
        lambda: mmpos.create("learned", dim=8, grid_size=(2, 2, 2, 2)),
        ValueError,
        r"grid_size must hold 1 to 3 positive ints",
    ),
    row(
        "learned-interpolation",
        lambda: mmpos.create("learned", dim=8, grid_size=(4, 4), interpolation="cubic"),
        ValueError,
        r"interpolation .*'cubic'",
    ),
    row(
        "learned-negative-std",
        lambda: mmpos.create("learned", dim=8, grid_size=(4, 4), std=-0.02),
        ValueError,
        r"std must be a finite number >= 0",
    ),
    row(
        "learned-grid-with-other-axes",
        lambda: mmpos.create("learned", dim=8, grid_size=(4, 4)).embed(Coords.grid(2, 4, 4)),
        ValueError,
        r"grid_shape \(2, 4, 4\) must have 2 axes like grid_size \(4, 4\)",
    ),
    row(
        "learned-points",
        lambda: mmpos.create("learned", dim=8, grid_size=(4, 4)).embed(Coords.points(torch.rand(1, 5, 2))),
        ValueError,
        r"grid coordinates .*grid_shape=None",
    ),
    row(
        "sincos-temperature",
        lambda: mmpos.create("sincos", dim=8, temperature=0),
        ValueError,
        r"temperature must be a finite number > 0",
    ),
    row(
        "sincos-dim-not-divisible",
        lambda: mmpos.create("sincos", dim=20).embed(Coords.grid(2, 3, 4)),
        ValueError,
        r"dim=20 must be divisible by 2 \* num_axes = 6",
    ),
    # constructors and builders validating through mmpos._validate (issue 22 item 4)
    row(
        "maglap-attention-int",
        lambda: mmpos.create("maglap", dim=8, k=4, attention=1),
        TypeError,
        r"attention must be a bool \(True or False\), got 1",
    ),
    row(
        "maglap-dropout-one",
        lambda: mmpos.create("maglap", dim=8, k=4, dropout=1),
        ValueError,
        r"dropout must be a finite number >= 0 and < 1, got 1",
    ),
    row(
        "block-mlp-ratio-zero",
        lambda: __import__("mmpos.nn").nn.Block(8, 2, mlp_ratio=0),
        ValueError,
        r"mlp_ratio must be a finite number > 0, got 0",
    ),
    row(
        "transformer-conv-after-past-depth",
        lambda: __import__("mmpos.nn").nn.Transformer(8, 2, 2, pos="peg", grid_size=(2, 2), conv_after=(2,)),
        ValueError,
        r"conv_after must hold block indices in \[0, 1\], got \(2,\)",
    ),
    row(
        "transformer-keep-abs-pos-string",
        lambda: __import__("mmpos.nn").nn.placement.Placement(
            "rope", None, {"dim": 8, "num_heads": 2, "head_dim": 4, "depth": 1}, keep_abs_pos="no"
        ),
        TypeError,
        r"keep_abs_pos must be True, False or None, got 'no'",
    ),
    row(
        "scaling-truncate-int",
        lambda: mmpos.scaling.RopeScaling("yarn", 2.0, 16, truncate=1),
        TypeError,
        r"truncate must be a bool \(True or False\), got 1",
    ),
    row(
        "media-spec-mean-scalar",
        lambda: _video_spec(mean=0.5),
        ValueError,
        r"MediaSpec.mean must hold 3 finite numbers \(R, G, B\), got 0.5",
    ),
    row(
        "mhrope-num-kv-heads-bool",
        lambda: mmpos.create("mhrope", head_dim=16, num_heads=4, num_kv_heads=True),
        ValueError,
        r"num_kv_heads must be a positive divisor of num_heads=4, got True",
    ),
    row(
        "graph-ppr-alpha-bool",
        lambda: __import__("mmpos.graph").graph.random_walk.check_walk(3, True),
        ValueError,
        r"ppr_alpha must be None or a finite number > 0 and <= 1, got True",
    ),
    row(
        "graph-q-string",
        lambda: __import__("mmpos.graph").graph.laplacian.check_q("0.25"),
        ValueError,
        r"q must be a finite number or a non-empty sequence of them, got '0.25'",
    ),
]


@pytest.mark.parametrize("call, exc, match", CASES)
def test_documented_error(call, exc, match):
    with pytest.raises(exc, match=match) as info:
        call()
    assert type(info.value) is exc  # not a subclass standing in for it
