"""The vision validation tasks (recipes/tasks/validate_vision.py, digits.py): data by hand, the range check, smoke runs."""

from __future__ import annotations

import pytest
import torch

from mmpos.runner import run_recipe
from recipes.data import oracle_grids as og
from recipes.tasks.validate_vision import TokenModel, rotary_margin

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
