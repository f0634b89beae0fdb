import pytest
import torch
import torch.nn.functional as F

from mmpos.coords import Coords
from mmpos.encoders.fuzzy import FuzzyPositionEmbedding
from mmpos.encoders.registry import create, encoder_info
from mmpos.nn.blocks import Transformer
from mmpos.nn.vit import VisionTransformer


def _encoder(dim=6, grid_size=(5, 7), **kwargs):
    torch.manual_seed(0)
    enc = create("fuzzy", dim=dim, grid_size=grid_size, **kwargs)
    with torch.no_grad():
        enc.pos_embed.normal_()  # values of order 1 so that mistakes show
    return enc


def _table_rows(enc):
    return enc.pos_embed[0].flatten(1).T  # (gh * gw, D), row-major


def _bilinear(table, pos):
    """Reference bilinear read of ``table`` (D, gh, gw) at normalized (row, col) ``pos`` (M, 2).

    align_corners=False: pixel = ((u + 1) * n - 1) / 2, clamped to [0, n - 1] (border).
    """
    _, gh, gw = table.shape
    out = []
    for u_r, u_c in pos.tolist():
        r = min(max(((u_r + 1) * gh - 1) / 2, 0.0), gh - 1)
        c = min(max(((u_c + 1) * gw - 1) / 2, 0.0), gw - 1)
        r0, c0 = int(r), int(c)
        r1, c1 = min(r0 + 1, gh - 1), min(c0 + 1, gw - 1)
        fr, fc = r - r0, c - c0
        out.append(
            (1 - fr) * (1 - fc) * table[:, r0, c0]
            + (1 - fr) * fc * table[:, r0, c1]
            + fr * (1 - fc) * table[:, r1, c0]
            + fr * fc * table[:, r1, c1]
        )
    return torch.stack(out)


def test_eval_equals_table_on_training_grid_and_is_deterministic():
    enc = _encoder().eval()
    coords = Coords.grid(5, 7, num_prefix_tokens=1)
    emb = enc.embed(coords)
    assert emb.shape == (1, 36, 6)
    torch.testing.assert_close(emb[0, 1:], _table_rows(enc), rtol=0, atol=1e-6)
    assert torch.equal(emb[:, :1], torch.zeros(1, 1, 6))  # prefix tokens get no PE
    assert torch.equal(enc.embed(coords), emb)
    # the learned grid is read in (row, col) order: the transposed table would not match
    assert not torch.allclose(emb[0, 1:], enc.pos_embed[0].transpose(1, 2).flatten(1).T[:35])


def test_training_offsets_stay_within_half_a_cell():
    enc = _encoder().train()
    coords = Coords.grid(5, 7, num_prefix_tokens=2)
    ref, cell = enc.reference_positions(coords)
    torch.testing.assert_close(cell, torch.tensor([2 / 5, 2 / 7]))
    torch.manual_seed(1)
    pos = enc.sample_positions(coords, batch=64)
    assert pos.shape == (64, 35, 2)
    offsets = (pos - ref) / cell  # in cell units
    assert offsets.abs().max() <= 0.5
    assert offsets.abs().max() > 0.45 and (offsets > 0).any() and (offsets < 0).any()
    assert not torch.allclose(offsets[0], offsets[1])  # drawn per sample, not shared by the batch
    assert offsets.mean().abs() < 0.02 and abs(offsets.var().item() - 1 / 12) < 0.01  # U(-0.5, 0.5)


def test_training_samples_bilinearly_between_neighbours():
    enc = _encoder(grid_size=(4, 6)).train()
    coords = Coords.grid(4, 6, num_prefix_tokens=1)
    torch.manual_seed(3)
    pos = enc.sample_positions(coords, batch=2)
    torch.manual_seed(3)
    emb = enc.embed(coords, batch=2)
    table = enc.pos_embed[0].detach()
    for b in range(2):
        torch.testing.assert_close(emb[b, 1:], _bilinear(table, pos[b]), rtol=1e-5, atol=1e-5)
    # every sampled value lies between the values of the token's cell and its neighbours
    grid = emb[:, 1:].reshape(2, 4, 6, -1)
    padded = F.pad(table.unsqueeze(0), (1, 1, 1, 1), mode="replicate")[0]  # border cells repeat
    hood = padded.unfold(1, 3, 1).unfold(2, 3, 1).flatten(-2)  # (D, 4, 6, 9)
    low, high = hood.amin(-1).permute(1, 2, 0), hood.amax(-1).permute(1, 2, 0)
    assert ((grid >= low - 1e-6) & (grid <= high + 1e-6)).all()
    assert not torch.allclose(grid[0], table.permute(1, 2, 0))  # training does jitter


def test_gradient_flows_to_the_grid():
    for train in (False, True):
        enc = _encoder().train(train)
        x = torch.randn(3, 36, 6)
        enc(x, Coords.grid(5, 7, num_prefix_tokens=1)).pow(2).sum().backward()
        grad = enc.pos_embed.grad
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0
        if not train:
            assert (grad != 0).all()  # every cell is read once at evaluation


def test_other_resolutions_resample_bilinearly():
    enc = _encoder().eval()
    for size in [(10, 14), (8, 9), (3, 4), (1, 12)]:
        emb = enc.embed(Coords.grid(*size, num_prefix_tokens=1))
        expected = F.interpolate(enc.pos_embed, size=size, mode="bilinear", align_corners=False)
        torch.testing.assert_close(emb[0, 1:], expected[0].flatten(1).T, rtol=1e-5, atol=1e-5)
    enc.train()
    assert enc.embed(Coords.grid(9, 11), batch=2).shape == (2, 99, 6)


def test_normalized_coordinates_for_points():
    enc = _encoder(coordinates="normalized").eval()
    i, j = torch.tensor([0, 2, 4, 3]), torch.tensor([0, 6, 1, 3])
    xy = torch.stack([(2 * j + 1) / 7 - 1, (2 * i + 1) / 5 - 1], -1)  # (x, y) = (col, row)
    emb = enc.embed(Coords.points(xy))
    torch.testing.assert_close(emb[0], enc.pos_embed[0, :, i, j].T, rtol=0, atol=1e-6)
    # Coords.normalized() output has the same meaning
    grid = Coords.grid(5, 7)
    torch.testing.assert_close(enc.embed(grid.normalized())[0], _table_rows(enc), rtol=0, atol=1e-6)
    # outside [-1, 1] the border cells are read
    far = enc.embed(Coords.points(torch.tensor([[5.0, -5.0]])))
    torch.testing.assert_close(far[0, 0], enc.pos_embed[0, :, 0, 6])
    # training offsets: half a cell of the learned grid
    enc.train()
    pts = Coords.points(torch.rand(2, 10, 2) * 2 - 1)
    off = (enc.sample_positions(pts) - pts.pos.flip(-1)) / torch.tensor([2 / 5, 2 / 7])
    assert off.abs().max() <= 0.5 + 1e-6


def test_padding_tokens_get_no_pe():
    enc = _encoder(coordinates="normalized").eval()
    coords = Coords.stack([Coords.points(torch.rand(3, 2)), Coords.points(torch.rand(5, 2))])
    emb = enc.embed(coords)
    assert emb.shape == (2, 5, 6)
    assert torch.equal(emb[0, 3:], torch.zeros(2, 6)) and (emb[1].abs().sum(-1) > 0).all()


def test_registry_and_models():
    assert encoder_info("fuzzy").kind == "additive"
    model = Transformer(12, 2, 2, pos="fuzzy", grid_size=(3, 4))
    assert model.pos_encoders["fuzzy"].grid_size == (3, 4)
    assert model(torch.randn(2, 13, 12), Coords.grid(3, 4, num_prefix_tokens=1)).shape == (2, 13, 12)
    vit = VisionTransformer(img_size=16, patch_size=4, dim=16, depth=1, num_heads=2, pos="fuzzy")
    assert vit.transformer.pos_encoders["fuzzy"].grid_size == (4, 4)
    vit(torch.randn(2, 3, 16, 24)).sum().backward()
    assert vit.transformer.pos_encoders["fuzzy"].pos_embed.grad.abs().sum() > 0


def test_errors():
    enc = _encoder()
    with pytest.raises(ValueError, match="grid_shape=None"):
        enc.embed(Coords.points(torch.rand(4, 2), axes=("h", "w")))
    with pytest.raises(ValueError, match="axes"):
        enc.embed(Coords.grid(2, 3, 4))
    with pytest.raises(ValueError, match="axes"):
        enc.embed(Coords.sequence(5))
    with pytest.raises(ValueError, match="coords describe"):
        enc(torch.randn(2, 30, 6), Coords.grid(5, 7))
    with pytest.raises(ValueError, match="coords describe"):
        enc.embed(Coords.grid(5, 7, batch=3), batch=2)
    for bad in [(14,), (0, 3), (2.0, 3), (2, 3, 4)]:
        with pytest.raises(ValueError, match="grid_size"):
            FuzzyPositionEmbedding(4, bad)
    with pytest.raises(ValueError, match="coordinates"):
        FuzzyPositionEmbedding(4, (2, 2), coordinates="points")
    with pytest.raises(ValueError, match="jitter"):
        FuzzyPositionEmbedding(4, (2, 2), jitter=0.7)


@pytest.mark.parametrize("train", [False, True])
def test_compiles_without_graph_breaks(train):
    enc = _encoder().train(train)
    coords = Coords.grid(6, 8, num_prefix_tokens=1)
    x = torch.randn(2, 49, 6)
    out = torch.compile(enc, fullgraph=True, backend="eager")(x, coords)
    assert out.shape == x.shape
    if not train:
        torch.testing.assert_close(out, enc(x, coords))
