"""No host synchronisation in forward: no ``.item()`` / ``bool(tensor)`` in any stack's forward.

A ``TorchDispatchMode`` records every ``aten._local_scalar_dense`` (what ``.item()``,
``bool(tensor)`` and ``int(tensor)`` call; on a GPU each one waits for the device) during a
forward of ``mmpos.nn.Transformer`` with every encoder kind, the small ViT, a converted timm
ViT and an open_clip tower. ``torch.compile(fullgraph=True)`` checks the same for a mixed stack.
"""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from mmpos import Coords
from mmpos.integrations import open_clip as mo
from mmpos.integrations import timm as mt
from mmpos.nn import Transformer, VisionTransformer

pytestmark = [pytest.mark.timm, pytest.mark.open_clip]  # oldest and newest releases

SYNCS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default}


class SyncSpy(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.syncs = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in SYNCS:
            self.syncs.append(str(func))
        return func(*args, **(kwargs or {}))


def _no_sync(fn, *args):
    with torch.no_grad(), SyncSpy() as spy:
        fn(*args)
    assert spy.syncs == []


def test_the_spy_catches_a_sync():
    with SyncSpy() as spy:
        bool(torch.isfinite(torch.ones(3)).all())
        Coords(torch.zeros(1, 2, 1), ("seq",))  # direct construction validates (a sync, outside forward)
    assert len(spy.syncs) >= 2


GRID_ENCODERS = ["learned", "sincos", "fourier", "fuzzy", "peg", "rope", "rope-axial", "rope-mixed", "irpe"]


@pytest.mark.parametrize("pos", GRID_ENCODERS + [["rope-axial", "irpe", "peg"]])
def test_transformer_forward_does_not_sync(pos):
    kwargs = {"irpe": {"mode": "ctx", "rpe_on": "qkv"}} if pos == "irpe" else None
    model = Transformer(32, 2, 4, pos=pos, pos_kwargs=kwargs, grid_size=(3, 4), axes=("h", "w")).eval()
    coords = Coords.grid(3, 4, num_prefix_tokens=1, batch=2)
    _no_sync(model, torch.randn(2, 13, 32), coords)


@pytest.mark.parametrize("pos", ["mrope", "mrope-i", "mhrope", "hope", "rope"])
def test_multimodal_rotary_forward_does_not_sync(pos):
    model = Transformer(32, 2, 4, pos=pos).eval()
    coords = Coords.sequence(9, batch=2)  # text: read on every axis the plan reads
    if pos == "hope":
        coords = Coords.grid(3, 3)
    _no_sync(model, torch.randn(2, 9, 32), coords)


def test_vision_models_do_not_sync():
    vit = VisionTransformer(img_size=16, patch_size=4, dim=32, depth=2, num_heads=4, pos=["rope-axial", "learned"])
    _no_sync(vit.eval(), torch.randn(2, 3, 16, 24))
    timm_vit = mt.create_vit(
        "vit_tiny_patch16_224",
        pos=["rope-mixed", "irpe", "peg"],
        img_size=32,
        patch_size=8,
        depth=2,
        num_classes=3,
        dynamic_img_size=True,
    )
    _no_sync(timm_vit.eval(), torch.randn(1, 3, 32, 40))
    clip = mo.create_model(
        "ViT-B-32",
        pos=["rope-axial", "sincos"],
        embed_dim=16,
        vision_cfg={"image_size": 32, "patch_size": 8, "width": 32, "layers": 2, "head_width": 8},
        text_cfg={"context_length": 8, "vocab_size": 50, "width": 16, "heads": 2, "layers": 1},
    )
    _no_sync(clip.visual.eval(), torch.randn(1, 3, 32, 32))


def test_mixed_stack_compiles_without_graph_break():
    torch._dynamo.reset()
    model = Transformer(
        32, 2, 4, pos=["rope-axial", "rope-mixed", "irpe", "learned"], grid_size=(3, 4), axes=("h", "w")
    ).eval()
    x, coords = torch.randn(2, 13, 32), Coords.grid(3, 4, num_prefix_tokens=1, batch=2)
    with torch.no_grad():  # fullgraph=True raises on any graph break
        torch.testing.assert_close(torch.compile(model, backend="eager", fullgraph=True)(x, coords), model(x, coords))


def test_per_layer_coords_compile_without_graph_break():
    """One ``Coords`` per block (CircleRoPE's AGE, ``mmpos.age.age_coords``): no graph break either."""
    from mmpos.age import age_coords
    from mmpos.layout import Image, Text, build

    torch._dynamo.reset()
    segments = [[Text(2), Image((1, 4, 4)), Text(3)]] * 2
    circle, qwen = build(segments, "circlerope").coords, build(segments, "qwen2.5-vl").coords
    model = Transformer(32, 3, 2, pos="mrope", pos_kwargs={"mrope": {"mrope_section": [2, 3, 3]}}, causal=True).eval()
    x, layers = torch.randn(2, circle.num_tokens, 32), age_coords("strategy_4", circle, qwen, depth=3)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend="eager", fullgraph=True)(x, layers), model(x, layers))
