from pathlib import Path

import pytest
import torch

import mmpos
from mmpos import Coords
from mmpos.runner.sweep import run_recipe
from recipes.tasks.scaling import RULES, defined_rules, rule_scaling, scaled_encoders

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ["profile=smoke", "device=cpu"]


def test_scaled_encoders_equals_building_with_the_rule_and_restores():
    plain = mmpos.create("rope-axial", head_dim=16)
    coords = Coords.grid(8, 8)
    before = plain.angles(coords)
    for rule in RULES:
        scaling = rule_scaling(rule, 2.0, (4.0, 4.0))
        with scaled_encoders(plain, scaling):
            inside = plain.angles(coords)
        built = mmpos.create("rope-axial", head_dim=16, scaling=scaling)
        torch.testing.assert_close(inside, built.angles(coords), rtol=0, atol=0)
        assert torch.equal(plain.angles(coords), before) and plain.rescale is None and plain.attention_factor == 1.0


def test_rule_variants():
    assert rule_scaling("yarn@ratio", 2.0, (4.0,))["ramp"] == "ratio"
    with pytest.raises(ValueError, match="must be 'ratio'"):
        rule_scaling("yarn@paper", 2.0, (4.0,))


def test_scaled_encoders_on_a_learned_plan_keeps_the_parameter():
    mixed = mmpos.create("rope-mixed", head_dim=16, num_heads=2)
    weight = mixed.weight.detach().clone()
    with scaled_encoders(mixed, rule_scaling("linear", 2.0, (4.0, 4.0))):
        assert torch.equal(mixed.weight, weight) and mixed.rescale is not None
    with (
        pytest.raises(ValueError, match="only the position rules"),
        scaled_encoders(mixed, rule_scaling("yarn", 2.0, (4.0, 4.0))),
    ):
        pass
    assert mixed.rescale is None


def test_a_learned_plan_is_evaluated_with_the_position_rules_only():
    rules = [*RULES, "ref-shape", "yarn@ratio"]
    mixed = mmpos.create("rope-mixed", head_dim=16, num_heads=2)
    assert defined_rules(mixed, rules) == ["linear", "ref-shape"]
    assert defined_rules(mmpos.create("rope-axial", head_dim=16), rules) == rules


def test_text_scaling_smoke(tmp_path):
    run = run_recipe(ROOT / "recipes" / "configs" / "text_scaling.yaml", SMOKE, out=tmp_path)
    (final,) = run["finals"]
    assert set(final["metrics"]) == {"bpb", "bpb@4L"} | {f"bpb@4L:{r}" for r in RULES}
    assert all(0 < v < 16 for v in final["metrics"].values())


@pytest.mark.timm
def test_vit_scaling_smoke(tmp_path):
    run = run_recipe(ROOT / "recipes" / "configs" / "vit_scaling.yaml", SMOKE, out=tmp_path)
    (final,) = run["finals"]
    ratio = {"acc@2x:ntk-by-parts@ratio", "acc@2x:yarn@ratio"}
    assert set(final["metrics"]) == {"acc", "acc@2x"} | {f"acc@2x:{r}" for r in RULES} | ratio
