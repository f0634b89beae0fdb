"""Sweep tables: paired differences from the recipe's baseline with a bootstrap interval, worked by hand."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from mmpos.cli import main
from mmpos.runner import ConfigError, resolve_config
from mmpos.runner.config import find_recipe, load_yaml
from mmpos.runner.stats import (
    bootstrap_interval,
    check_validation,
    learning_curve_area,
    paired_differences,
    verdicts,
)
from mmpos.runner.sweep import results_table


def _finals(rows, metric="acc", higher=True):
    """``[(encoder, seed, {metric: value})]`` -> the runner's final.json dicts."""
    return [
        {
            "encoder": e,
            "seed": s,
            "metrics": m,
            "metric": metric,
            "higher_is_better": higher,
            "seconds": 1.0,
            "params": 1,
        }
        for e, s, m in rows
    ]


def test_bootstrap_of_three_values_is_their_range():
    # A resample repeating one value has probability 1/27 = 3.7% > 2.5%, so both
    # quantiles of the resampled means sit on the smallest and the largest value.
    assert bootstrap_interval([0.6, 0.1, 0.2]) == pytest.approx((0.1, 0.6), abs=1e-12)
    assert bootstrap_interval([0.3, 0.3, 0.3]) == pytest.approx((0.3, 0.3), abs=1e-12)


def test_bootstrap_of_four_values_by_hand():
    # values [0, 0, 0, 1]: a resample's mean is k/4 with k ~ Binomial(4, 1/4):
    # P(k=0) = 81/256, P(k<=2) = 243/256 = 94.9%, P(k<=3) = 255/256 = 99.6%
    # -> the 2.5% quantile is 0 and the 97.5% quantile is 3/4.
    assert bootstrap_interval([0.0, 1.0, 0.0, 0.0]) == pytest.approx((0.0, 0.75), abs=1e-12)


def test_bootstrap_matches_exact_enumeration_for_five_values():
    values = np.array([0.10, -0.05, 0.20, 0.02, 0.07])
    means = np.sort([values[list(i)].mean() for i in itertools.product(range(5), repeat=5)])  # all 3125 resamples
    exact = np.quantile(means, [0.025, 0.975])
    low, high = bootstrap_interval(values)
    assert abs(low - exact[0]) < 0.01 and abs(high - exact[1]) < 0.01  # Monte Carlo error of 10 000 resamples
    assert bootstrap_interval(values) == (low, high)  # fixed seed: the same interval every time


@pytest.mark.parametrize("bad, match", [([1.0], "at least 2"), ([[1.0, 2.0]], "1-D")])
def test_bootstrap_needs_two_values(bad, match):
    with pytest.raises(ValueError, match=match):
        bootstrap_interval(bad)


HAND = _finals(
    [  # seeds listed out of order: pairs are matched by seed, not by position
        ("none", 0, {"acc": 0.25, "acc@2x": 0.25}),
        ("rope", 2, {"acc": 0.85, "acc@2x": 0.50}),
        ("none", 1, {"acc": 0.30, "acc@2x": 0.20}),
        ("rope", 0, {"acc": 0.90, "acc@2x": 0.45}),
        ("none", 2, {"acc": 0.20, "acc@2x": 0.30}),
        ("peg", 0, {"acc": 0.20}),
        ("rope", 1, {"acc": 0.80, "acc@2x": 0.40}),
        ("peg", 1, {"acc": 0.40}),
        ("peg", 2, {"acc": 0.25}),
    ]
)


def test_paired_differences_by_hand():
    rows = {r["encoder"]: r["diff"] for r in paired_differences(HAND, "none")}
    assert list(rows) == ["rope", "peg"]  # ranked, baseline left out
    # rope - none, seeds 0, 1, 2: acc 0.65, 0.50, 0.65; acc@2x 0.20, 0.20, 0.20
    assert rows["rope"]["acc"] == pytest.approx({"mean": 0.6, "low": 0.5, "high": 0.65, "seeds": 3})
    assert rows["rope"]["acc@2x"] == pytest.approx({"mean": 0.2, "low": 0.2, "high": 0.2, "seeds": 3})
    # peg - none: -0.05, 0.10, 0.05; peg has no acc@2x
    assert rows["peg"]["acc"] == pytest.approx({"mean": 0.1 / 3, "low": -0.05, "high": 0.10, "seeds": 3})
    assert "acc@2x" not in rows["peg"]


def test_results_table_shows_the_paired_table():
    table = results_table(HAND, "hand", baseline="none")
    assert "Paired difference from `none`" in table
    assert "| rope | +0.6000 [+0.5000, +0.6500] * | +0.2000 [+0.2000, +0.2000] * |" in table
    assert "| peg | +0.0333 [-0.0500, +0.1000] | – |" in table  # interval holds 0: no star
    assert "With 3 seeds the interval is the range" in table
    assert "Paired" not in results_table(HAND, "hand")  # no baseline, no paired table


def test_one_seed_gives_the_difference_without_interval():
    finals = _finals([("none", 0, {"acc": 0.25}), ("rope", 0, {"acc": 0.75})])
    assert paired_differences(finals, "none")[0]["diff"]["acc"]["mean"] == 0.5
    assert math.isnan(paired_differences(finals, "none")[0]["diff"]["acc"]["low"])
    table = results_table(finals, baseline="none")
    assert "| rope | +0.5000 |" in table and "One seed" in table


def test_lower_is_better_keeps_the_sign_of_the_difference():
    finals = _finals([("a", 0, {"err": 0.5}), ("a", 1, {"err": 0.7}), ("b", 0, {"err": 0.1}), ("b", 1, {"err": 0.3})])
    for f in finals:
        f["metric"], f["higher_is_better"] = "err", False
    assert "| a | +0.4000 [+0.4000, +0.4000] * |" in results_table(finals, baseline="b")


def test_baseline_must_be_a_swept_encoder():
    recipe = load_yaml(find_recipe("quickstart"))
    assert resolve_config(recipe)["baseline"] == "none"
    with pytest.raises(ConfigError, match=r"'baseline' must be one of the swept encoders \['rope'\] or null"):
        resolve_config(recipe, ["encoders=[rope]", "baseline=sincos"])  # named by the caller: must be swept
    with pytest.warns(UserWarning, match=r"the recipe's baseline 'none' is not among encoders \['rope'\]"):
        assert resolve_config(recipe, ["encoders=[rope]"])["baseline"] is None  # the recipe's: gives way
    assert resolve_config(recipe, ["encoders=[rope]", "baseline=null"])["baseline"] is None
    with pytest.raises(ValueError, match="not among the encoders"):
        paired_differences(HAND, "sincos")


def test_every_shipped_recipe_names_a_baseline_it_sweeps():
    from mmpos.runner import list_recipes

    for name in list_recipes():
        recipe = load_yaml(find_recipe(name))
        assert recipe.get("baseline") in recipe["encoders"], name
        for profile in recipe.get("profiles", {}):
            resolve_config(recipe, [f"profile={profile}"])  # the baseline stays among each profile's encoders


def test_cli_names_a_baseline_outside_the_sweep_in_one_line(tmp_path, capsys):
    code = main(["run", "quickstart", "profile=smoke", "encoders=[rope]", "baseline=sincos", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "baseline" in err and "baseline=null" in err
    assert not any(tmp_path.iterdir())


# --------------------------------------------------------------------------- verdicts (docs/recipes.md)
def _claim_finals(diffs, control=0.95, seeds=None):
    """``b`` at 0.5 every seed, ``a`` at 0.5 + diff, the control ``c`` at ``control``."""
    seeds = range(len(diffs)) if seeds is None else seeds
    rows = []
    for s, d in zip(seeds, diffs):
        rows += [("a", s, {"acc": 0.5 + d}), ("b", s, {"acc": 0.5}), ("c", s, {"acc": control})]
    return _finals(rows)


VALIDATION = {
    "min_seeds": 8,
    "controls": [{"encoder": "c", "metric": "acc", "min": 0.9}],
    "claims": [{"claim": "a beats b", "encoder": "a", "baseline": "b", "metric": "acc"}],
}


def test_verdict_confirmed_when_every_seed_agrees():
    (v,) = verdicts(_claim_finals([0.1] * 8), VALIDATION)
    assert v["verdict"] == "confirmed" and v["diff"]["seeds"] == 8
    assert v["diff"]["mean"] == pytest.approx(0.1) and v["diff"]["low"] == pytest.approx(0.1)
    assert v["controls"] == [("c", "acc", pytest.approx(0.95), 0.9)]


def test_verdict_not_measured_when_the_control_fails_whatever_the_difference():
    (v,) = verdicts(_claim_finals([0.1] * 8, control=0.62), VALIDATION)
    assert v["verdict"] == "not measured"
    assert v["reason"] == "control c reached 0.620 < 0.90 on acc"


def test_verdict_not_measured_with_too_few_seeds():
    (v,) = verdicts(_claim_finals([0.1] * 3), VALIDATION)
    assert (v["verdict"], v["reason"]) == ("not measured", "3 paired seeds < 8")


def test_verdict_not_confirmed_names_the_interval():
    (v,) = verdicts(_claim_finals([0.1, -0.1] * 4), VALIDATION)
    assert v["verdict"] == "not confirmed" and "includes 0" in v["reason"] and "over 8 seeds" in v["reason"]
    (v,) = verdicts(_claim_finals([-0.1] * 8), VALIDATION)
    assert v["verdict"] == "not confirmed" and "opposite" in v["reason"]
    lower = {**VALIDATION, "claims": [{**VALIDATION["claims"][0], "direction": "lower"}]}
    assert verdicts(_claim_finals([-0.1] * 8), lower)[0]["verdict"] == "confirmed"


@pytest.mark.parametrize(
    ("validation", "match"),
    [
        ({"claims": []}, "non-empty list"),
        ({"claims": [{"claim": "x", "encoder": "", "baseline": "b", "metric": "acc"}]}, "encoder must be"),
        (
            {"claims": [{"claim": "x", "encoder": "a", "baseline": "b", "metric": "acc", "direction": "up"}]},
            "direction",
        ),
        ({"controls": [{"metric": "acc"}], "claims": VALIDATION["claims"]}, "a control must be"),
    ],
)
def test_bad_validation_sections_are_named(validation, match):
    with pytest.raises((ValueError, TypeError), match=match):
        check_validation(validation)


def test_encoders_left_out_of_the_sweep_are_not_measured():
    finals = [f for f in _claim_finals([0.1] * 8) if f["encoder"] != "c"]
    (v,) = verdicts(finals, VALIDATION)
    assert (v["verdict"], v["reason"]) == ("not measured", "control c was not swept")
    claim = {**VALIDATION, "controls": [], "claims": [{**VALIDATION["claims"][0], "baseline": "z"}]}
    assert verdicts(finals, claim)[0]["reason"] == "z not swept"


def test_results_table_with_validation_ends_with_the_verdicts():
    table = results_table(_claim_finals([0.1] * 8), baseline="b", validation=VALIDATION)
    assert "| a beats b | a − b (> 0) | acc | c acc 0.950 (≥ 0.90) |" in table
    assert "**confirmed**: +0.1000 [+0.1000, +0.1000] over 8 seeds |" in table
    assert "Verdicts" not in results_table(_claim_finals([0.1] * 8), baseline="b")


def test_learning_curve_area_by_hand(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [{"step": 0, "loss": 1.0}, {"step": 10, "eval": {"acc": 0.2}}, {"step": 20, "eval": {"acc": 0.6}}]
    lines += [{"step": 40, "eval": {"acc": 1.0}}]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    # trapezoids: 10 * 0.4 + 20 * 0.8 = 20 over 30 steps
    assert learning_curve_area(path, "acc") == pytest.approx(20 / 30)
    assert math.isnan(learning_curve_area(path, "missing"))
