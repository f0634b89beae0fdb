"""mmpos.age: CircleRoPE's AGE strategies against the reference's table, and the per-layer coordinates."""

import pytest
import torch

from mmpos.age import AGE_STRATEGIES, age_coords, age_layers
from mmpos.layout import Image, Text, build

#: lose4578/CircleRoPE modular_qwen2_5_vl_circle_rope.py AGE_index_dict, as written there (True: circle_index,
#: False: m_index), for Qwen2.5-VL-3B's 36 layers
_T, _F = True, False
REFERENCE_AGE = {
    "strategy_2": [_T, _T, _T, _T, _T, _T, _T, _T, _T, _T, _T, _T,
                   _T, _T, _T, _T, _T, _T, _F, _F, _F, _F, _F, _F,
                   _F, _F, _F, _F, _F, _F, _F, _F, _F, _F, _F, _F],
    "strategy_3": [_F, _F, _F, _F, _F, _F, _F, _F, _F, _F, _F, _F,
                   _F, _F, _F, _F, _F, _F, _T, _T, _T, _T, _T, _T,
                   _T, _T, _T, _T, _T, _T, _T, _T, _T, _T, _T, _T],
    "strategy_4": [_T, _F, _T, _F, _T, _F, _T, _F, _T, _F, _T, _F,
                   _T, _F, _T, _F, _T, _F, _T, _F, _T, _F, _T, _F,
                   _T, _F, _T, _F, _T, _F, _T, _F, _T, _F, _T, _F],
}  # fmt: skip


def test_strategies_at_depth_36_are_the_reference_table():
    assert set(AGE_STRATEGIES) == set(REFERENCE_AGE)
    for strategy, flags in REFERENCE_AGE.items():
        assert list(age_layers(strategy, 36)) == flags, strategy


def test_strategies_at_other_depths_follow_the_rules():
    """Qwen2.5-VL-7B's 28 layers (the reference asserts depth 36): halves of 14, the even layers."""
    assert age_layers("strategy_2", 28) == (True,) * 14 + (False,) * 14
    assert age_layers("strategy_3", 28) == (False,) * 14 + (True,) * 14
    assert age_layers("strategy_4", 28) == (True, False) * 14
    assert age_layers("strategy_4", 3) == (True, False, True)
    assert age_layers("strategy_2", 5) == (True, True, False, False, False)
    assert age_layers("strategy_3", 5) == (False, False, True, True, True)
    assert age_layers([True, False, False], 3) == (True, False, False)


def test_bad_strategies_and_depths_are_refused():
    with pytest.raises(ValueError, match="strategy must be one of"):
        age_layers("strategy_1", 36)  # named by the reference's config.json, absent from its table
    with pytest.raises(ValueError, match="depth must be a positive int"):
        age_layers("strategy_4", 0)
    with pytest.raises(ValueError, match="one bool per layer \\(depth = 4\\), got 3"):
        age_layers([True, False, True], 4)
    with pytest.raises(TypeError, match="sequence of bools"):
        age_layers([1, 0], 2)


def test_age_coords_picks_the_two_layouts_by_layer():
    segments = [[Text(2), Image((1, 4, 4)), Text(3)]] * 2
    circle = build(segments, "circlerope").coords
    qwen = build(segments, "qwen2.5-vl").coords
    layers = age_coords("strategy_4", circle, qwen, depth=4)
    assert [c is circle for c in layers] == [True, False, True, False]
    assert [c is qwen for c in layers] == [False, True, False, True]
    assert age_coords([False, True], circle, qwen)[1] is circle
    assert not torch.equal(circle.pos, qwen.pos)  # two different layouts of the same tokens
    with pytest.raises(ValueError, match="depth is required"):
        age_coords("strategy_2", circle, qwen)
    with pytest.raises(ValueError, match="same tokens on the same axes"):
        age_coords("strategy_4", circle, build([[Text(2), Image((1, 4, 4))]] * 2, "qwen2.5-vl").coords, depth=4)
    with pytest.raises(TypeError, match="must be Coords"):
        age_coords("strategy_4", circle, qwen.pos, depth=4)
