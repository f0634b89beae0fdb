import pytest
import torch

import mmpos
from mmpos.viz.cli import main
from mmpos.viz.extrapolation import RULE_CHOICES, plot_scaling_extrapolation, rule_arguments, scaling_maps

PNG = b"\x89PNG\r\n\x1a\n"


def _build(name, **kw):
    def build(scaling):
        torch.manual_seed(0)  # learned initialisations agree between rules
        return mmpos.create(name, head_dim=16, scaling=scaling, **kw)

    return build


def test_position_rules_map_the_larger_grid_onto_the_training_map():
    train, maps = scaling_maps(_build("rope-axial"), (6, 6), (3, 2), factor=2)
    drift = {m.rule: m.drift for m in maps}
    assert [m.rule for m in maps] == list(RULE_CHOICES)
    assert drift["linear"] < 1e-6 and drift["ref-shape"] < 1e-6  # PI: wide[2 i] is train[i]
    assert drift["none"] > 0.01  # plain extrapolation sees positions beyond the training range
    assert all(m.smap.grid_shape == (12, 12) for m in maps) and train.grid_shape == (6, 6)


def test_yarn_map_carries_its_attention_factor():
    _train, (none, yarn) = scaling_maps(_build("rope"), (16,), (8,), factor=4, rules=("none", "yarn"))
    factor = 0.1 * torch.log(torch.tensor(4.0)).item() + 1
    assert yarn.smap.values[0, 32].item() == pytest.approx(factor**2, rel=1e-5)  # q.k at the query itself
    assert none.smap.values[0, 32].item() == pytest.approx(1.0, rel=1e-5)


def test_seed_is_checked_before_building():
    built = []

    def build(scaling):
        built.append(scaling)
        return mmpos.create("rope", head_dim=16)

    with pytest.raises(ValueError, match="seed must be an int in"):
        scaling_maps(build, (8,), (4,), seed=0.5)
    assert built == []


def test_learned_plan_reports_the_rules_it_refuses():
    _, maps = scaling_maps(_build("rope-mixed", num_heads=2), (4, 4), (2, 2), rules=("linear", "yarn"))
    assert maps[0].error is None and maps[0].drift < 1e-6
    assert maps[1].smap is None and "only the position rules" in maps[1].error


def test_bad_arguments():
    with pytest.raises(ValueError, match="rule must be one of"):
        rule_arguments("longrope", (4, 4), 2)
    with pytest.raises(ValueError, match="factor must be an int >= 2"):
        scaling_maps(_build("rope-axial"), (4, 4), (1, 1), factor=1)
    with pytest.raises(TypeError, match="rotary encoders"):
        scaling_maps(lambda s: mmpos.create("sincos", dim=16), (4, 4), (1, 1))


def test_plot_writes_a_png(tmp_path):
    path = tmp_path / "rules.png"
    _train, maps = plot_scaling_extrapolation(_build("rope-axial"), (5, 5), (2, 2), path, rules=("none", "ntk", "yarn"))
    assert path.read_bytes().startswith(PNG) and len(maps) == 3
    with pytest.raises(ValueError, match=r"\.png"):
        plot_scaling_extrapolation(_build("rope-axial"), (5, 5), (2, 2), tmp_path / "x.jpg")


def test_cli_rules(tmp_path, capsys):
    out = tmp_path / "ext.png"
    argv = ["extrapolation", "--encoder", "rope-axial", "--grid", "6x6", "--query", "3,3", "--dim", "64"]
    assert main([*argv, "--rules", "none,linear,yarn", "-o", str(out)]) == 0
    assert out.read_bytes().startswith(PNG)
    assert "linear 0.000" in capsys.readouterr().out
    assert main([*argv, "--rules", "none,pi", "-o", str(out)]) == 2
    assert "rule must be one of" in capsys.readouterr().err
