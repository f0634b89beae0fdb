import pytest
import torch
from torch import nn

from mmpos.age import age_coords
from mmpos.layout import Image, Text, Video, build
from mmpos.schemes import SCHEMES
from recipes.vlm import TinyVLM, segments_of

P = 4  # patch size of the test towers


class PatchIds(nn.Module):
    """A tower whose patch token ``(i, j)`` is ``[i, j, 0, ...]``: tokens ``(B, Hp * Wp, C)`` in raster order."""

    def __init__(self, width: int = 6) -> None:
        super().__init__()
        self.width = width
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, images):
        b, _, h, w = images.shape
        i, j = torch.meshgrid(torch.arange(h // P), torch.arange(w // P), indexing="ij")
        ids = torch.zeros(h // P * (w // P), self.width)
        ids[:, 0], ids[:, 1] = i.flatten(), j.flatten()
        return self.scale * ids.expand(b, -1, -1)


class PatchMeans(nn.Module):
    """A content tower: the mean colour of every patch, linearly embedded."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.proj = nn.Linear(3, width)

    def forward(self, images):
        patches = nn.functional.avg_pool2d(images, P)  # (B, 3, Hp, Wp)
        return self.proj(patches.flatten(2).transpose(1, 2))


class ThreeTokens(nn.Module):
    def forward(self, images):
        return torch.zeros(images.shape[0], 3, 8)


def _vlm(scheme="qwen2-vl", tower=None, width=8, dim=16, num_heads=2, **kw):
    tower = tower if tower is not None else PatchMeans(width)
    return TinyVLM(tower, width, P, vocab_size=11, scheme=scheme, dim=dim, depth=2, num_heads=num_heads, **kw)


def test_merger_groups_2x2_patches_in_raster_order_of_the_merged_grid():
    model = _vlm(tower=PatchIds(6), width=6)
    model.merger = nn.Flatten(-2)  # expose the merger's input: (B, N, 4 * C)
    merged = model.encode_images(torch.zeros(2, 3, 3 * 2 * P, 4 * 2 * P))  # 6 x 8 patches -> 3 x 4 tokens
    assert merged.shape == (2, 12, 4 * 6)
    groups = merged.view(2, 12, 4, 6)[..., :2]  # (B, N, 4 neighbours, (i, j))
    for n in range(12):
        r, c = divmod(n, 4)  # raster order of the merged grid
        expected = torch.tensor([[2 * r, 2 * c], [2 * r, 2 * c + 1], [2 * r + 1, 2 * c], [2 * r + 1, 2 * c + 1]])
        assert torch.equal(groups[0, n], expected.float()), n


def test_video_frames_are_encoded_like_images_in_t_h_w_order():
    torch.manual_seed(0)
    model = _vlm("mrope-i")
    clip = torch.rand(2, 3, 3, 2 * P, 4 * P)  # (B, T, 3, H, W): 3 frames of 1 x 2 merged tokens
    tokens = model.embed_parts([("video", clip)])
    frames = [model.encode_images(clip[:, f]) for f in range(3)]
    assert tokens.shape == (2, 6, 16)
    torch.testing.assert_close(tokens, torch.cat(frames, dim=1))


def test_segments_of_gives_patch_grids_before_the_merge():
    parts = [
        ("text", torch.zeros(2, 3, dtype=torch.long)),
        ("image", torch.zeros(2, 3, 4 * P, 6 * P)),
        ("video", torch.zeros(2, 5, 3, 2 * P, 2 * P)),
    ]
    assert segments_of(parts, P) == [Text(3), Image((1, 4, 6)), Video((5, 2, 2))]


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_forward_with_the_layout_of_every_scheme(scheme):
    torch.manual_seed(0)
    # 4 KV heads of 8 dims: MHRoPE's default head_sections ([1, 1, 1] + one unrotated head) need >= 4
    model = _vlm(scheme, dim=32, num_heads=4).eval()
    parts = [
        ("text", torch.randint(11, (2, 2))),
        ("image", torch.rand(2, 3, 2 * P, 4 * P)),
        ("video", torch.rand(2, 2, 3, 4 * P, 2 * P)),
        ("text", torch.randint(11, (2, 3))),
    ]
    options = {"v2pe": {"delta": 0.25}, "hope": {"temporal_scale": 0.75}}.get(scheme, {})
    layout = build([segments_of(parts, P)] * 2, scheme, **options)
    logits = model(parts, layout.coords)
    assert logits.shape == (2, 2 + 2 + 4 + 3, 11) and torch.isfinite(logits).all()


@pytest.mark.parametrize("scheme", [name for name, s in sorted(SCHEMES.items()) if s.encoder == "mhrope"])
def test_mhrope_decoder_with_too_few_kv_heads_is_refused(scheme):
    with pytest.raises(ValueError, match="head_sections"):
        _vlm(scheme, num_heads=2)  # 2 KV heads: the default head_sections would leave an axis without a head


def test_positions_reach_the_decoder():
    """Same weights: every scheme that reduces to 1-D RoPE agrees on text, and 2-D schemes differ on images."""
    torch.manual_seed(0)
    reference = _vlm("flat")
    text = [("text", torch.randint(11, (2, 7)))]
    image = [("text", torch.randint(11, (2, 1))), ("image", torch.rand(2, 3, 4 * P, 4 * P)), ("text", text[0][1])]
    outputs = {}
    for scheme in ("flat", "qwen2-vl", "mrope-i", "vrope"):
        model = _vlm(scheme)
        model.load_state_dict(reference.state_dict())  # rotary encoders hold no parameters
        model.eval()
        outputs[scheme] = [model(p, build([segments_of(p, P)] * 2, scheme).coords) for p in (text, image)]
    for scheme in ("qwen2-vl", "mrope-i", "vrope"):
        torch.testing.assert_close(outputs[scheme][0], outputs["flat"][0])
        assert not torch.allclose(outputs[scheme][1], outputs["flat"][1], atol=1e-4)


def test_causal_decoder():
    torch.manual_seed(0)
    model = _vlm("qwen2-vl").eval()
    image = torch.rand(1, 3, 2 * P, 2 * P)
    a = [("image", image), ("text", torch.tensor([[1, 2, 3]]))]
    b = [("image", image), ("text", torch.tensor([[1, 2, 9]]))]
    la, lb = (model(p, build([segments_of(p, P)], "qwen2-vl").coords) for p in (a, b))
    torch.testing.assert_close(la[:, :-1], lb[:, :-1])  # a later token changes no earlier logit


def test_errors():
    with pytest.raises(ValueError, match="scheme must be one of"):
        _vlm("m-rope")
    model = _vlm()
    with pytest.raises(ValueError, match="multiple of 2 \\* patch_size"):
        model.encode_images(torch.zeros(1, 3, 3 * P, 2 * P))
    with pytest.raises(ValueError, match="kind must be"):
        model.embed_parts([("audio", torch.zeros(1, 3))])
    with pytest.raises(ValueError, match="must have shape \\(B, 3, H, W\\)"):
        model.embed_parts([("image", torch.zeros(3, 2 * P, 2 * P))])
    with pytest.raises(ValueError, match="batch size 2, expected 1"):
        model.embed_parts([("text", torch.zeros(1, 2, dtype=torch.long)), ("image", torch.zeros(2, 3, 8, 8))])
    with pytest.raises(ValueError, match="multiple of patch_size"):
        segments_of([("image", torch.zeros(1, 3, 10, 8))], P)
    with pytest.raises(ValueError, match="non-empty"):
        segments_of([], P)
    short = _vlm(tower=ThreeTokens())
    with pytest.raises(ValueError, match="gave 3 tokens for a 2x2 patch grid"):
        short.encode_images(torch.zeros(1, 3, 2 * P, 2 * P))


def test_learned_grape_decoder_trains_its_planes():
    """``pos="grape-learned"`` on the ``grape`` layout: one set of planes per decoder layer, reached by the loss."""
    torch.manual_seed(0)
    model = _vlm("grape", dim=32, num_heads=2, pos="grape-learned", pos_kwargs={"mode": "block_mixed", "block_size": 8})
    encoders = [b.attn.encoders["grape-learned"] for b in model.decoder.blocks]
    assert len({id(e) for e in encoders}) == 2 and encoders[0].mode == "block_mixed"
    parts = [
        ("text", torch.randint(11, (2, 2))),
        ("image", torch.rand(2, 3, 2 * P, 4 * P)),
        ("text", torch.randint(11, (2, 3))),
    ]
    model(parts, build([segments_of(parts, P)] * 2, "grape").coords).logsumexp(-1).sum().backward()
    assert all(e.a.grad.abs().sum() > 0 and e.axis_weight.grad.abs().sum() > 0 for e in encoders)


def test_age_mode_gives_each_decoder_layer_its_positions():
    """``strategy_4`` on 4 layers: layers 0 and 2 read the ``circlerope`` coordinates, 1 and 3 the ``qwen2.5-vl``
    ones (hooks on the blocks see which); all-Circle-RoPE per-layer coordinates equal the plain forward."""
    torch.manual_seed(0)
    model = TinyVLM(PatchMeans(8), 8, P, vocab_size=11, scheme="circlerope", dim=16, depth=4, num_heads=2).eval()
    parts = [
        ("text", torch.randint(11, (2, 2))),
        ("image", torch.rand(2, 3, 4 * P, 4 * P)),
        ("text", torch.randint(11, (2, 3))),
    ]
    segments = [segments_of(parts, P)] * 2
    circle = build(segments, "circlerope").coords
    qwen = build(segments, "qwen2.5-vl", rule="hf-4.57").coords
    seen = []
    hooks = [b.register_forward_pre_hook(lambda m, args: seen.append(args[1])) for b in model.decoder.blocks]
    mixed = model(parts, age_coords("strategy_4", circle, qwen, depth=4))
    for h in hooks:
        h.remove()
    assert [c is circle for c in seen] == [True, False, True, False]
    assert [c is qwen for c in seen] == [False, True, False, True]
    torch.testing.assert_close(model(parts, [circle] * 4), model(parts, circle), rtol=0, atol=0)
    assert not torch.allclose(mixed, model(parts, circle), atol=1e-5)
    assert not torch.allclose(mixed, model(parts, qwen), atol=1e-5)
    with pytest.raises(ValueError, match="one Coords per block \\(4\\)"):
        model(parts, [circle] * 3)
