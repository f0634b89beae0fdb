"""Documented errors, one table: each row a call, the exception it must raise and a regex that names the argument
(or the part of a model) at fault. Rows marked ``hf`` build a tiny random Qwen2-VL of the installed transformers
(``make test`` runs them on 4.57.1 and 5.24)."""

from __future__ import annotations

import os
from collections.abc import Callable

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


def _use_rope_yarn():
    from mmpos.integrations.hf import use_rope

    model = _qwen2_vl()
    rope = _rope_dict(model)
    rope.pop("type", None)
    rope["rope_type"] = "yarn"
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
    use_rope(model, "mhrope")


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
        "use_rope-rope_type-yarn",
        _use_rope_yarn,
        ValueError,
        r"default rope_type only, got rope_type='yarn'",
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
        r"_OddRotary returns cos of shape \(2, 2, 2, 2, 2\): unknown cos / sin shape",
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
]


@pytest.mark.parametrize("call, exc, match", CASES)
def test_documented_error(call, exc, match):
    with pytest.raises(exc, match=match) as info:
        call()
    assert type(info.value) is exc  # not a subclass standing in for it
