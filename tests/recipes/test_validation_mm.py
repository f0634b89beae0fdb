"""The decisive validation tasks of the M-RoPE family, V2PE, 2D-TPE and the magnetic Laplacian (issue 20).

Smoke runs of every recipe (seconds) and the properties the tasks rest on: a graph and its
reversal carry flipped labels and the same symmetric PE, program graphs are DAGs, the
rotary range check separates chunked from interleaved M-RoPE only over long ranges.
"""

import math
from pathlib import Path

import pytest
import torch

from mmpos.runner.config import load_yaml, resolve_config
from mmpos.runner.sweep import run_recipe
from mmpos.runner.tasks import get_task

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "recipes" / "configs"
SMOKE = ["profile=smoke", "device=cpu", "progress=false"]


def _smoke(tmp_path, name: str, encoders: str, verdicts: bool = False) -> list[dict]:
    """Smoke run of some encoders; without ``verdicts`` the claims (which name other encoders) are dropped."""
    extra = [] if verdicts else ["validation={}"]
    result = run_recipe(CONFIGS / f"{name}.yaml", [*SMOKE, f"encoders={encoders}", *extra], out=tmp_path)
    finals = result["finals"]
    for f in finals:
        assert not any(math.isnan(v) for v in f["metrics"].values())
    return finals


# --------------------------------------------------------------------------- magnetic Laplacian
@pytest.mark.pyg
def test_maglap_direction_smoke(tmp_path):
    finals = _smoke(tmp_path, "maglap_direction", "[lap,maglap,oracle]", verdicts=True)
    assert {f["encoder"] for f in finals} == {"lap", "maglap", "oracle"}
    for f in finals:
        assert {"test_acc", "id_acc", "test_pair_consistency"} <= set(f["metrics"])
    lap = next(f for f in finals if f["encoder"] == "lap")
    assert lap["chance"] == 0.5  # the task declares its chance level
    lap = lap["metrics"]
    assert (
        lap["test_acc"] == 0.5 and lap["id_acc"] == 0.5 and lap["test_pair_consistency"] == 0.0
    )  # blind by construction: exactly at the declared chance


def test_reversal_flips_every_label():
    from recipes.data.dag_direction import depth_height, direction_pairs

    items = direction_pairs(5, (6, 10), seed=3)
    assert len(items) == 10
    for fwd, rev in zip(items[0::2], items[1::2]):
        assert torch.equal(fwd["edge_index"].flip(0), rev["edge_index"])
        assert torch.equal(fwd["mask"], rev["mask"]) and fwd["mask"].any()
        m = fwd["mask"]
        assert torch.equal(fwd["label"][m], 1 - rev["label"][m])
    depth, height = depth_height(torch.tensor([[0, 1], [1, 2]]), 3)  # the path 0 -> 1 -> 2
    assert depth.tolist() == [0, 1, 2] and height.tolist() == [2, 1, 0]
    with pytest.raises(ValueError, match="DAG"):
        depth_height(torch.tensor([[0, 1], [1, 0]]), 2)


@pytest.mark.pyg
def test_symmetric_pe_cannot_tell_a_graph_from_its_reversal():
    cfg = resolve_config(load_yaml(CONFIGS / "maglap_direction.yaml"), SMOKE)
    build = get_task("maglap_direction").build
    lap = build(cfg, "lap", 0, torch.device("cpu")).train_batch(0)
    mag = build(cfg, "maglap", 0, torch.device("cpu")).train_batch(0)
    assert lap.maglap_pe.is_complex() and mag.maglap_pe.is_complex()
    with pytest.raises(ValueError, match="encoder must be one of"):
        build(cfg, "rope", 0, torch.device("cpu"))


def test_program_graphs_are_dags_with_balanced_ancestor_pairs():
    from recipes.data.program_graphs import NODE_TYPES, ancestor_pairs, stdlib_program_graphs

    (small, large) = stdlib_program_graphs([(10, 20, 5), (21, 40, 3)])
    assert len(small) == 5 and len(large) == 3
    for g in small + large:
        assert (g.edge_index[0] < g.edge_index[1]).all()  # every edge points forward in preorder: a DAG
        assert g.node_type.max() <= len(NODE_TYPES) and g.node_type[0] == NODE_TYPES.index("FunctionDef")
        mask, label = ancestor_pairs(g.edge_index, g.num_nodes)
        assert 2 * int(label.sum()) == int(mask.sum()) > 0  # a pair and its reversal: exactly half positive
        assert not (label & label.T).any()
    with pytest.raises(ValueError, match="bucket"):
        stdlib_program_graphs([(30, 20, 1)])


@pytest.mark.pyg
def test_maglap_programs_smoke(tmp_path):
    finals = _smoke(tmp_path, "maglap_programs", "[maglap,oracle]")
    for f in finals:
        assert {"test_acc", "id_acc"} <= set(f["metrics"]) and f["chance"] == 0.5


# --------------------------------------------------------------------------- M-RoPE family
def test_copy_clips_targets():
    from recipes.data.temporal_copy import copy_clips

    values, targets = copy_clips(3, 6, 2, 2, 2, 8, torch.Generator().manual_seed(0))
    assert values.shape == (3, 6, 2, 2) and targets.shape == (3, 24)
    assert (targets[:, :8] == -100).all() and torch.equal(targets[:, 8:], values.flatten(1)[:, :-8])
    held, t2 = copy_clips(2, 8, 1, 1, 1, 8, torch.Generator().manual_seed(0), hold=2)
    assert torch.equal(held[:, 0::2], held[:, 1::2]) and torch.equal(t2[:, 2:], held.flatten(1)[:, :-2])
    with pytest.raises(ValueError, match="frames"):
        copy_clips(1, 2, 1, 1, 2, 8, torch.Generator())


def test_range_check_separates_chunked_from_interleaved_only_over_long_ranges():
    pytest.importorskip("scipy")
    from recipes.tasks.temporal_copy import _margins

    short = [_margins(s, 100.0, 64, 4, 4, 4, 2, 2, 2)[1] for s in ("qwen2-vl", "mrope-i")]
    long = [_margins(s, 100.0, 64, 4, 4, 64, 2, 2, 2)[1] for s in ("qwen2-vl", "mrope-i")]
    assert short[0] == pytest.approx(short[1], abs=1e-6)  # frames 0..3: the same best margin
    assert long[1] > 2 * long[0]  # frames 0..63: interleaved keeps a margin, chunked nearly loses it


def test_temporal_copy_smoke(tmp_path):
    pytest.importorskip("scipy")
    finals = _smoke(tmp_path, "temporal_copy", "[qwen2-vl,hope]")
    for f in finals:
        assert {"acc@6", "acc@8", "fps2_acc", "margin@8", "margin_t@8"} <= set(f["metrics"])
        assert f["chance"] == 1 / 16  # vocab 16, values drawn uniformly


# --------------------------------------------------------------------------- V2PE
def test_stride_positions_follow_the_v2pe_rule():
    from mmpos.layout import build
    from recipes.tasks.v2pe_recall import _segments, recall_positions

    flat = build([_segments(3, 4, 2)], "flat", spatial_merge_size=1).coords.pos[0, :, 0].double()
    assert torch.equal(recall_positions(torch.ones(1, 3), 4, 2)[0], flat)
    pos = recall_positions(torch.tensor([[2, 1]]), 2, 1)[0]  # BOS, SEP, 2 cells at stride 2, SEP, 2 cells, query
    assert pos.tolist() == [0, 1, 3, 5, 6, 7, 8, 9]


def test_v2pe_recall_smoke(tmp_path):
    finals = _smoke(tmp_path, "v2pe_recall", "[none,v2pe@rand,stride@rand,v2pe@0.0625]")
    for f in finals:
        assert {"acc@2", "acc@4"} <= set(f["metrics"]) and f["chance"] == 1 / 16
    cfg = resolve_config(load_yaml(CONFIGS / "v2pe_recall.yaml"), SMOKE)
    with pytest.raises(ValueError, match="needs an option"):
        get_task("v2pe_recall").build(cfg, "stride", 0, torch.device("cpu"))


# --------------------------------------------------------------------------- 2D-TPE
def test_neighbour_targets():
    from recipes.tasks.tpe_neighbours import neighbour_batch

    values = torch.arange(6).view(1, 2, 3)
    tokens, targets = neighbour_batch(values, 10)
    assert tokens.tolist() == [[10, 0, 1, 2, 11, 3, 4, 5, 11, 12]]
    assert targets[0, :, 0].tolist() == [-100, -100, -100, -100, -100, 0, 1, 2, -100, -100]  # above
    assert targets[0, :, 1].tolist() == [-100, -100, 0, 1, -100, -100, 3, 4, -100, -100]  # left


def test_tpe_neighbours_smoke_on_real_values(tmp_path):
    pytest.importorskip("sklearn")
    from recipes.data.real_tables import binned_table, table_windows

    table = binned_table("breast_cancer", 10)
    assert table.shape == (569, 30) and table.min() == 0 and table.max() == 9
    win = table_windows(table, 4, 3, 5, torch.Generator().manual_seed(0), "test")
    assert win.shape == (4, 3, 5)
    with pytest.raises(ValueError, match="does not fit"):
        table_windows(table, 1, 3, 31, torch.Generator(), "train")
    finals = _smoke(tmp_path, "tpe_neighbours", "[rope,2d-tpe@anneal]")
    for f in finals:
        assert {"wide_above", "above@3x6", "left@3x6"} <= set(f["metrics"])
