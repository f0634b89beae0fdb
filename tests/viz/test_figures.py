import pytest
import torch

import mmpos
from mmpos import Coords
from mmpos.layout import Text, Video, build
from mmpos.viz import (
    plan_table,
    plot_extrapolation,
    plot_layout,
    plot_plan,
    plot_similarity,
    similarity_map,
)

PNG = b"\x89PNG\r\n\x1a\n"


def _png(path):
    data = path.read_bytes()
    assert data.startswith(PNG) and len(data) < 100_000
    return data


@pytest.mark.parametrize(
    ("name", "coords", "query"),
    [
        ("rope-axial", Coords.grid(6, 7, num_prefix_tokens=1), (2, 3)),  # image
        ("peg3d", Coords.grid(3, 4, 4), (1, 2, 2)),  # strip of frames
        ("rope", Coords.sequence(20), (5,)),  # curve
    ],
)
def test_plot_similarity_writes_the_map_it_returns(tmp_path, name, coords, query):
    enc = mmpos.encoders.registry.create_in_model(name, {"dim": 16, "num_heads": 2})
    smap = plot_similarity(enc, coords, query, tmp_path / "map.png")
    _png(tmp_path / "map.png")
    torch.testing.assert_close(smap.values, similarity_map(enc, coords, query).values)


def test_plot_similarity_per_head(tmp_path):
    torch.manual_seed(0)
    enc = mmpos.create("rope-mixed", dim=32, num_heads=4)
    smap = plot_similarity(enc, Coords.grid(5, 5), (2, 2), tmp_path / "heads.png", head="all")
    assert smap.values.shape == (4, 25)
    _png(tmp_path / "heads.png")
    with pytest.raises(ValueError, match="head must be"):
        plot_similarity(enc, Coords.grid(5, 5), (2, 2), tmp_path / "bad.png", head=4)
    with pytest.raises(ValueError, match=r"\.png"):
        plot_similarity(enc, Coords.grid(5, 5), (2, 2), tmp_path / "map.jpg")


def test_plot_extrapolation_plan_layout(tmp_path):
    enc = mmpos.create("rope-axial", dim=32, num_heads=2)
    train, wide = plot_extrapolation(enc, (4, 4), (2, 2), tmp_path / "extra.png")
    assert train.values.shape == (1, 16) and wide.values.shape == (1, 64)
    table = plot_plan(mmpos.create("mrope", head_dim=32), tmp_path / "plan.png")
    torch.testing.assert_close(table.freq, plan_table(mmpos.create("mrope", head_dim=32)).freq)
    layouts = [build([[Text(2), Video((2, 4, 4)), Text(2)]], s) for s in ("qwen2-vl", "vrope")]
    rows = plot_layout(layouts, tmp_path / "ids.png")
    assert [r.scheme for r in rows] == ["qwen2-vl", "vrope"] and rows[1].values.shape == (4, 12)
    for f in ("extra.png", "plan.png", "ids.png"):
        _png(tmp_path / f)
