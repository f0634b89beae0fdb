"""The vision validation tasks (recipes/tasks/validate_vision.py, digits.py): data by hand, the range check, smoke runs."""

from __future__ import annotations

import pytest
import torch

from mmpos.runner import run_recipe
from recipes.data import oracle_grids as og
from recipes.tasks.validate_vision import TokenModel, learned_at_positions, min_class_accuracy, rotary_margin

ORACLE_RECIPES = ["validate_rope_mixed", "validate_peg", "validate_peg_padding", "validate_fuzzy", "validate_fourier"]
DIGIT_RECIPES = ["validate_irpe_digits", "digits_vit_pretrain", "digits_vit_finetune"]


def _g(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------------- data by hand
def test_diagonal_pairs_count_the_diagonal_not_the_anti_diagonal():
    marks, target = og.diagonal_pairs(64, 5, _g())
    m = marks
    inner = m[:, 2:, 2:][:, :3, :3] + m[:, :-2, :-2][:, :3, :3]  # (i+1, j+1) + (i-1, j-1) for i, j in 1..3
    assert torch.equal(target[:, 1:4, 1:4], inner)
    assert (target[:, 0] == og.IGNORE).all() and (target[:, :, -1] == og.IGNORE).all()


def test_left_neighbour_keeps_objects_in_their_columns():
    tokens, target = og.left_neighbour(32, 6, 8, (0, 4), 5, _g())
    assert (tokens[..., 4:] == 0).all() and tokens[..., :4].max() <= 5
    scored = target != og.IGNORE
    assert torch.equal(target[..., 1:][scored[..., 1:]], tokens[..., :-1][scored[..., 1:]])
    assert not scored[..., 0].any() and not scored[..., 6:].any()  # only cells right of an object


def test_border_and_bands_by_hand():
    _, edge = og.border(2, 4, 5, 3, _g())
    assert edge[0].tolist() == [[1] * 5, [1, 0, 0, 0, 1], [1, 0, 0, 0, 1], [1] * 5]
    _, band = og.bands(1, 10, 10, 3, 4, _g())
    # centres (i + 0.5) / 10 * 4 = 0.2, 0.6, 1.0, ...: cells 2 and 7 sit on a band edge and are not scored
    assert band[0, 0].tolist() == [0, 0, og.IGNORE, 1, 1, 2, 2, og.IGNORE, 3, 3]
    assert band[0, 9, 0].item() == 12


def test_bands_under_a_sub_cell_shift_by_hand():
    _, plain = og.bands(1, 8, 8, 3, 4, _g())
    _, moved = og.bands(1, 8, 8, 3, 4, _g(), shift=0.25)
    # centres (i + 0.5) / 8 * 4 = 0.25, 0.75, 1.25, ...; shifted (i + 0.75) / 8 * 4 = 0.375, 0.875, 1.375, ...
    assert plain[0, 0].tolist() == [0, 0, 1, 1, 2, 2, 3, 3] == moved[0, 0].tolist()
    _, edge = og.bands(1, 8, 8, 3, 8, _g(), shift=0.47)  # (i + 0.97) in band units: within the tolerance
    assert (edge == og.IGNORE).all()
    _, back = og.bands(1, 8, 8, 3, 8, _g(), shift=-0.4)  # (i + 0.1): region i, scored
    assert back[0, 0].tolist() == list(range(8)) and back[0, 3, 0].item() == 24
    with pytest.raises(ValueError, match="shift"):
        og.bands(1, 8, 8, 3, 8, _g(), shift=0.5)


def test_min_class_accuracy_by_hand():
    target = torch.tensor([[1, 1, 2, 2, og.IGNORE], [3, 3, 3, 1, 2]])
    pred = torch.tensor([[1, 1, 2, 0, 5], [3, 3, 0, 1, 2]])
    # class 1: 3/3, class 2: 2/3, class 3: 2/3
    assert min_class_accuracy(pred, target) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="same shape"):
        min_class_accuracy(pred.reshape(-1), target)


def test_directed_neighbour_copies_the_pointed_cell():
    values, dirs, target = og.directed_neighbour(16, 5, 5, 7, _g())
    for b, i, j in [(0, 2, 2), (3, 1, 3), (5, 4, 0)]:
        dr, dc = og.DIRECTIONS[dirs[b, i, j]]
        r, c = i + dr, j + dc
        expected = values[b, r, c].item() if 0 <= r < 5 and 0 <= c < 5 else og.IGNORE
        assert target[b, i, j].item() == expected


def test_nearest_neighbour_is_scale_free():
    xy, tokens, target = og.nearest_neighbour_points(8, 10, 4, _g(3))
    xy2, tokens2, target2 = og.nearest_neighbour_points(8, 10, 4, _g(3), scale=2.0)
    assert torch.allclose(xy2, 2 * xy) and torch.equal(tokens, tokens2) and torch.equal(target, target2)
    d = torch.cdist(xy[0], xy[0]).fill_diagonal_(float("inf"))
    i = int((target[0] != og.IGNORE).nonzero()[0])
    assert target[0, i] == tokens[0, d[i].argmin()]


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: og.diagonal_pairs(2, 2, _g()), "at least 3"),
        (lambda: og.left_neighbour(2, 4, 4, (3, 2), 2, _g()), "cols"),
        (lambda: og.border(0, 4, 4, 2, _g()), "batch"),
        (lambda: og.nearest_neighbour_points(2, 2, 2, _g()), "at least 3"),
    ],
)
def test_bad_sizes_are_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# --------------------------------------------------------------------------- the range check
def test_an_axial_plan_has_no_margin_for_the_diagonal_pair():
    freqs = torch.zeros(2, 8)
    freqs[0, :4] = torch.logspace(0, -1.5, 4)  # h pairs
    freqs[1, 4:] = torch.logspace(0, -1.5, 4)  # w pairs
    assert rotary_margin(freqs, [(1, 1), (-1, -1)], 6) == pytest.approx(0.0, abs=1e-9)
    assert rotary_margin(freqs, [(1, 1)], 6) > 0.05  # one offset is separable: axial can single it out


def test_a_mixed_plan_can_single_out_the_diagonal_pair():
    w = torch.linspace(0.3, 3.0, 8)
    freqs = torch.stack([torch.cat([w[:4], w[4:]]), torch.cat([w[:4], -w[4:]])])  # along (1, 1) and (1, -1)
    assert rotary_margin(freqs, [(1, 1), (-1, -1)], 6) > 0.05


# --------------------------------------------------------------------------- models
def test_circular_peg_is_translation_equivariant_and_zero_padding_is_not():
    cfg = {"dim": 16, "depth": 1, "num_heads": 1, "mlp_ratio": 2.0}
    ids = torch.randint(0, 5, (2, 6, 6), generator=_g())
    rolled = ids.roll(2, dims=-1)
    outs = {}
    for padding in ("circular", "zeros"):
        torch.manual_seed(0)
        model = TokenModel(5, 3, ["peg"], cfg, (6, 6), ("h", "w"), peg_padding=padding).eval()
        a = model({"ids": ids}).reshape(2, 6, 6, 3).roll(2, dims=2)
        outs[padding] = torch.allclose(a, model({"ids": rolled}).reshape(2, 6, 6, 3), atol=1e-5)
    assert outs == {"circular": True, "zeros": False}


def test_learned_at_positions_is_the_table_timms_bicubic_and_the_cubic_kernel():
    import torch.nn.functional as F

    from mmpos import Coords
    from mmpos.encoders.learned import LearnedPositionEmbedding

    torch.manual_seed(0)
    enc = LearnedPositionEmbedding(3, (4, 4), std=1.0)
    table = enc.pos_embed.detach().reshape(1, 4, 4, 3).permute(0, 3, 1, 2)  # (1, D, 4, 4)
    same = learned_at_positions(enc, Coords.grid(4, 4)).detach()
    assert torch.allclose(same, enc.pos_embed.detach(), atol=1e-5)  # the cell centres: the table itself
    up = F.interpolate(table, size=(6, 6), mode="bicubic", align_corners=False)
    assert torch.allclose(
        learned_at_positions(enc, Coords.grid(6, 6)).detach(), up.flatten(2).transpose(1, 2), atol=1e-5
    )
    # half a cell to the right: the cubic convolution kernel (a = -0.75) at t = 0.5, row 1, column 1 -> 1.5
    w = torch.tensor([-0.09375, 0.59375, 0.59375, -0.09375])
    half = learned_at_positions(enc, Coords.grid(4, 4).shifted((0.0, 0.5))).detach()
    assert torch.allclose(half[0, 1 * 4 + 1], (table[0, :, 1, :4] * w).sum(-1), atol=1e-5)


def test_a_shift_reads_both_tables_at_the_shifted_positions():
    from mmpos import Coords

    cfg = {"dim": 8, "depth": 1, "num_heads": 1, "mlp_ratio": 2.0}
    ids = torch.randint(0, 3, (2, 4, 4), generator=_g())
    for name in ("learned", "fuzzy"):
        torch.manual_seed(0)
        model = TokenModel(3, 2, [name], cfg, (4, 4), ("h", "w"), pos_kwargs={name: {"std": 1.0}}).eval()
        enc = model.transformer.pos_encoders[name]
        plain = model({"ids": ids})
        assert torch.allclose(model({"ids": ids, "shift": (0.0, 0.0)}), plain, atol=1e-5)
        moved = model({"ids": ids, "shift": (0.25, 0.25)})
        assert not torch.allclose(moved, plain, atol=1e-3)
        assert "embed" not in vars(enc)  # the bicubic read is undone after the forward
        if name == "fuzzy":  # ViTAR's table read bilinearly at (1.25, 1.25): weights 9/16, 3/16, 3/16, 1/16
            t = enc.pos_embed.detach()[0]  # (D, 4, 4)
            hand = (9 * t[:, 1, 1] + 3 * t[:, 1, 2] + 3 * t[:, 2, 1] + t[:, 2, 2]) / 16
            got = enc.embed(Coords.grid(4, 4).shifted(0.25)).detach()[0, 1 * 4 + 1]
            assert torch.allclose(got, hand, atol=1e-5)


# --------------------------------------------------------------------------- smoke runs
@pytest.mark.parametrize("recipe", ORACLE_RECIPES + ["validate_irpe"])
def test_validation_recipe_smoke(recipe, tmp_path):
    result = run_recipe(recipe, ["profile=smoke", "device=cpu", "progress=false"], out=tmp_path)
    assert "Verdicts" in result["table"] and "not measured" in result["table"]  # one seed: never a verdict
    assert all(f"{f['metric']}:aulc" in f["metrics"] for f in result["finals"])


@pytest.mark.parametrize("recipe", DIGIT_RECIPES)
def test_digit_recipe_smoke(recipe, tmp_path):
    pytest.importorskip("sklearn")
    result = run_recipe(recipe, ["profile=smoke", "device=cpu", "progress=false"], out=tmp_path)
    assert result["finals"] and result["table"]


def test_real_digits_splits_are_disjoint_and_offline():
    pytest.importorskip("sklearn")
    from recipes.data.digits import digit_batch, digit_images, load_split

    train, test = load_split("train"), load_split("test")
    assert (len(train[1]), len(test[1])) == (1437, 360)
    from sklearn.datasets import load_digits

    every = torch.as_tensor(load_digits().images, dtype=torch.float32) / 16
    assert torch.equal(test[0], every[::5]) and torch.equal(train[0][:4], every[[1, 2, 3, 4]])  # split by index
    images = digit_images(torch.tensor([[3, 7]]), "test", _g())
    assert images.shape == (1, 2, 8, 8)
    big, labels = digit_batch(4, "train", 16, _g())
    assert labels.shape == (4,) and labels.max() <= 9
    assert big.shape == (4, 3, 16, 16) and torch.equal(big[:, 0, ::2, ::2], big[:, 0, 1::2, 1::2])
    with pytest.raises(ValueError, match="split"):
        load_split("val")
