import re

import pytest
import torch

import mmpos
from mmpos import Coords
from mmpos.encoders.irpe import bucket_ids
from mmpos.layout import Text, Video, build
from mmpos.rotary import rope_frequencies
from mmpos.viz import extrapolation_maps, layout_rows, plan_table, query_index, similarity_map


def _randomize(module, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return module


def test_query_index_finds_the_token_by_coordinates():
    coords = Coords.grid(4, 5, num_prefix_tokens=1)
    assert query_index(coords, (2, 3)) == 1 + 2 * 5 + 3
    with pytest.raises(ValueError, match="not the position of any token"):
        query_index(coords, (4, 0))
    with pytest.raises(ValueError, match="one coordinate per axis"):
        query_index(coords, (1,))


@pytest.mark.parametrize("name", ["rope-axial", "rope"])
def test_rope_map_is_translation_invariant(name):
    enc = mmpos.create(name, dim=64, num_heads=2)
    coords = Coords.grid(12, 12)
    a = similarity_map(enc, coords, (4, 4)).on_grid()
    b = similarity_map(enc, coords, (6, 7)).on_grid()
    if name == "rope":  # 1-D RoPE reads the raster order: a shift by (2, 3) is a shift of 27 tokens
        a, b = a.flatten(), b.flatten()
        torch.testing.assert_close(a[: 144 - 27], b[27:])
    else:
        torch.testing.assert_close(a[:10, :9], b[2:, 3:])
        assert a[4, 4] == pytest.approx(1.0) and a.max() == pytest.approx(1.0)


def test_constant_content_is_the_mean_cosine_of_the_angle_differences():
    enc = mmpos.create("rope-axial", dim=32, num_heads=1)  # 16 pairs, all rotated
    coords = Coords.grid(5, 6)
    smap = similarity_map(enc, coords, (2, 3))
    angles = enc.angles(coords.to(dtype=torch.float64))[0]  # (N, P)
    expected = torch.cos(angles - angles[smap.query]).mean(-1)
    torch.testing.assert_close(smap.values[0], expected)


def test_axial_map_is_separable_and_mixed_is_not():
    coords = Coords.grid(10, 10)
    axial = similarity_map(mmpos.create("rope-axial", dim=64, num_heads=1), coords, (3, 6)).on_grid()
    residual = axial - axial.mean(0, keepdim=True) - axial.mean(1, keepdim=True) + axial.mean()
    assert residual.abs().max() < 1e-12  # f(dh) + g(dw)
    torch.manual_seed(0)
    mixed = similarity_map(mmpos.create("rope-mixed", dim=64, num_heads=1), coords, (3, 6)).on_grid()
    residual = mixed - mixed.mean(0, keepdim=True) - mixed.mean(1, keepdim=True) + mixed.mean()
    assert residual.abs().max() > 1e-2


def test_per_head_plan_gives_one_map_per_head():
    enc = mmpos.create("mhrope", head_dim=16, num_heads=4, head_sections=[1, 1, 1])
    smap = similarity_map(enc, Coords.grid(3, 4, 5), (1, 2, 2))
    assert smap.values.shape == (4, 60)
    t_head, h_head, w_head, plain = (smap.on_grid(h) for h in range(4))
    assert torch.all(t_head == t_head[:, :1, :1])  # reads t only: constant over each frame
    assert torch.all(h_head == h_head[:1, :, :1])
    assert torch.all(w_head == w_head[:1, :1, :])
    assert torch.all(plain == 1)  # the fourth KV head is not rotated


def test_random_content_is_seeded_and_one_at_the_query():
    enc = mmpos.create("rope-axial", dim=64, num_heads=1)
    coords = Coords.grid(6, 6)
    a = similarity_map(enc, coords, (2, 2), content="random", seed=1)
    b = similarity_map(enc, coords, (2, 2), content="random", seed=1)
    c = similarity_map(enc, coords, (2, 2), content="constant")
    torch.testing.assert_close(a.values, b.values)
    assert not torch.allclose(a.values, c.values)
    assert a.values[0, a.query] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="content must be one of"):
        similarity_map(enc, coords, (2, 2), content="zeros")


@pytest.mark.parametrize("seed", [True, 1.0, -1, 2**64, "0", None])
def test_seed_must_be_an_unsigned_64_bit_int(seed):
    enc = mmpos.create("rope-axial", dim=16, num_heads=1)
    match = rf"seed must be an int in \[0, {2**64 - 1}\], got {re.escape(repr(seed))}"
    with pytest.raises(ValueError, match=match):
        similarity_map(enc, Coords.grid(3, 3), (1, 1), content="random", seed=seed)
    with pytest.raises(ValueError, match=match):
        extrapolation_maps(enc, (3, 3), (1, 1), content="random", seed=seed)
    np = pytest.importorskip("numpy")
    a = similarity_map(enc, Coords.grid(3, 3), (1, 1), content="random", seed=np.int64(3))
    torch.testing.assert_close(
        a.values, similarity_map(enc, Coords.grid(3, 3), (1, 1), content="random", seed=3).values
    )


@pytest.mark.parametrize("mode", ["bias", "ctx"])
def test_bias_row_equals_encoder_bias(mode):
    enc = _randomize(mmpos.create("irpe", dim=32, num_heads=2, mode=mode, rpe_on="qk"))
    coords = Coords.grid(7, 7, num_prefix_tokens=1)
    smap = similarity_map(enc, coords, (3, 3))
    u = torch.ones(1, 2, 50, 16)
    torch.testing.assert_close(smap.values, enc.bias(u, u, coords)[0, :, smap.query].double())
    if mode == "bias":  # the row is a lookup: tokens in one bucket share a value
        ids, _ = bucket_ids((7, 7), "product", 1.9, num_prefix_tokens=1)
        row, values = ids[smap.query], smap.values[0]
        for b in row.unique():
            assert values[row == b].unique().numel() == 1


def test_additive_map_is_the_cosine_similarity_of_the_embeddings():
    enc = mmpos.create("sincos", dim=32)
    coords = Coords.grid(6, 6, num_prefix_tokens=1)
    smap = similarity_map(enc, coords, (1, 4))
    emb = enc.embed(coords)[0].double()
    expected = torch.nn.functional.cosine_similarity(emb, emb[smap.query : smap.query + 1], dim=-1)
    expected[0] = 0  # the class token has no embedding
    torch.testing.assert_close(smap.values[0], expected)
    assert smap.values[0, smap.query] == pytest.approx(1.0)


@pytest.mark.parametrize("query", [(4, 4), (0, 7)])
def test_peg_map_is_zero_outside_its_kernel_support(query):
    enc = mmpos.create("peg", dim=8, kernel_size=3)
    torch.nn.init.normal_(enc.proj.bias)  # a bias must not show: the map is a difference
    smap = similarity_map(enc, Coords.grid(8, 8, num_prefix_tokens=1), query)
    grid = smap.on_grid()
    rows, cols = torch.meshgrid(torch.arange(8), torch.arange(8), indexing="ij")
    inside = ((rows - query[0]).abs() <= 1) & ((cols - query[1]).abs() <= 1)
    assert torch.all(grid[~inside] == 0)
    assert torch.all(grid[inside] > 0)
    assert smap.values[0, 0] == 0  # the class token is passed through


def test_peg3d_map_spans_neighbouring_frames():
    enc = mmpos.create("peg3d", dim=4)
    grid = similarity_map(enc, Coords.grid(4, 5, 5), (1, 2, 2)).on_grid()
    assert grid.shape == (4, 5, 5)
    assert torch.all(grid[3] == 0) and torch.all(grid[:3, 1:4, 1:4] > 0)


def test_extrapolation_of_rope_repeats_the_local_pattern():
    enc = mmpos.create("rope-axial", dim=64, num_heads=1)
    train, wide = extrapolation_maps(enc, (8, 8), (4, 4), factor=2)
    assert train.on_grid().shape == (8, 8) and wide.on_grid().shape == (16, 16)
    assert wide.query_cell == (8, 8)
    torch.testing.assert_close(train.on_grid(), wide.on_grid()[4:12, 4:12])


def test_extrapolation_of_a_learned_table_resamples_it():
    enc = mmpos.create("learned", dim=16, grid_size=(6, 6))
    train, wide = extrapolation_maps(enc, (6, 6), (3, 3), factor=2)
    assert wide.values.shape == (1, 144) and wide.values[0, wide.query] == pytest.approx(1.0)
    assert not torch.allclose(train.on_grid(), wide.on_grid()[3:9, 3:9])


def test_plan_table_of_interleaved_mrope():
    table = plan_table(mmpos.create("mrope-i", head_dim=128))
    assert table.axes == ("t", "h", "w") and table.axis.shape == (1, 64)
    p = torch.arange(64)
    expected = torch.where(p < 60, p % 3, torch.zeros_like(p))  # THW x 20, then TTTT
    assert torch.equal(table.axis[0], expected)
    torch.testing.assert_close(table.freq[0], rope_frequencies(64, 10000.0).double())


def test_plan_table_marks_unrotated_pairs():
    table = plan_table(mmpos.FrequencyPlan.per_head(8, 3, [1, 0, 1]))
    assert table.axis.shape == (3, 4)
    assert torch.all(table.axis[0] == 0) and torch.all(table.axis[1] == 2) and torch.all(table.axis[2] == -1)


def test_layout_rows_follow_the_coords_and_mark_the_video():
    layout = build([[Text(5), Video((2, 4, 6)), Text(3)]], "vrope")
    rows = layout_rows(layout)
    assert rows.axes == ("c0", "c1", "c2", "c3") and rows.values.shape == (4, 20)
    torch.testing.assert_close(rows.values, layout.coords.pos[0].T.double())
    assert rows.blocks == ((5, 17, int(mmpos.Modality.VIDEO)),)


def test_layout_rows_drop_padding():
    layout = build([[Text(3)], [Text(2), Video((1, 2, 2)), Text(1)]], "qwen2-vl", padding_side="left")
    rows = layout_rows(layout, sample=0)
    assert rows.values.shape == (3, 3) and rows.blocks == ()
    torch.testing.assert_close(rows.values, torch.arange(3.0).double().expand(3, 3))
    with pytest.raises(ValueError, match="sample"):
        layout_rows(layout, sample=2)


def test_bad_encoder_is_a_type_error():
    with pytest.raises(TypeError, match="rotary, bias, additive or conv"):
        similarity_map(torch.nn.Linear(2, 2), Coords.grid(2, 2), (0, 0))
