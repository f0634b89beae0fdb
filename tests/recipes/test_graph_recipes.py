from pathlib import Path

import pytest
import torch

from mmpos.runner.config import load_yaml, resolve_config
from mmpos.runner.sweep import run_recipe
from mmpos.runner.tasks import get_task

pytestmark = pytest.mark.pyg  # PyG batches and transforms

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "configs" / "sorting_networks.yaml"
SMOKE = ["profile=smoke", "device=cpu", "progress=false"]


def test_sorting_networks_smoke(tmp_path):
    result = run_recipe(RECIPE, [*SMOKE, "encoders=[none,maglap]"], out=tmp_path)
    finals = result["finals"]
    assert [f["encoder"] for f in finals] == ["none", "maglap"]
    for f in finals:
        assert {"test_acc", "id_acc"} <= set(f["metrics"])  # and the runner's test_acc:aulc
        assert all(0.0 <= v <= 1.0 for v in f["metrics"].values())
    assert "test_acc" in result["table"]


def test_batches_are_deterministic_and_carry_the_pe():
    cfg = resolve_config(load_yaml(RECIPE), SMOKE)
    build = get_task("sorting_networks").build
    task = build(cfg, "maglap", 0, torch.device("cpu"))
    a, b = task.train_batch(3), task.train_batch(3)
    assert torch.equal(a.edge_index, b.edge_index) and torch.equal(a.y, b.y)
    assert a.maglap_pe.is_complex() and a.x.shape[1] == cfg["data"]["feat_dim"]
    walks = build(cfg, "drw", 0, torch.device("cpu")).train_batch(0)
    assert walks.drw_pe_pair.shape[1] == 8 and walks.drw_pe.shape[1] == 8


def test_unknown_encoder_is_a_clear_error():
    cfg = resolve_config(load_yaml(RECIPE), SMOKE)
    with pytest.raises(ValueError, match="encoder must be one of"):
        get_task("sorting_networks").build(cfg, "rope", 0, torch.device("cpu"))


PLAYGROUND = ROOT / "recipes" / "configs" / "digraph_playground.yaml"


@pytest.mark.parametrize("target", ["reach", "dist"])
def test_digraph_playground_smoke(tmp_path, target):
    result = run_recipe(
        PLAYGROUND, [*SMOKE, "encoders=[maglap]", "baseline=null", f"data.target={target}"], out=tmp_path
    )
    metrics = result["finals"][0]["metrics"]
    assert {"test_acc", "id_acc"} <= set(metrics) and all(0.0 <= v <= 1.0 for v in metrics.values())
    assert ("test_bacc" in metrics) == (target == "reach")


def test_playground_targets_are_the_pairwise_distances():
    from recipes.data.digraphs import directed_distances

    cfg = resolve_config(load_yaml(PLAYGROUND), [*SMOKE, "data.target=dist"])
    task = get_task("digraph_playground").build(cfg, "none", 0, torch.device("cpu"))
    batch = task.train_batch(0)
    first = batch.get_example(0)
    n = first.num_nodes
    ref = directed_distances(first.edge_index, n)
    max_dist = cfg["data"]["max_dist"]
    ref = torch.where((ref < 0) | (ref > max_dist), max_dist + 1, ref)
    assert torch.equal(first.dist.view(n, n), ref)


def test_sorted_prefix_is_the_label_and_marks_each_sorting_prefix():
    import numpy as np

    from recipes.data.sorting_networks import build_dataset, is_sorting_network, sorted_prefix

    for net in build_dataset([4, 5], 4, seed=3, reverse=True):
        flags = sorted_prefix(net.comparators, net.num_channels)
        ref = [is_sorting_network(net.comparators[: t + 1], net.num_channels) for t in range(len(net.comparators))]
        assert flags.tolist() == ref and bool(flags.any()) == net.label
        assert flags.dtype == np.bool_ and flags.shape == (len(net.comparators),)
    # a sorted prefix stays sorted: every comparator keeps a sorted input sorted
    assert sorted_prefix([(0, 1), (0, 1)], 2).tolist() == [True, True]
    assert sorted_prefix([(0, 1), (1, 2)], 3).tolist() == [False, False]


def test_oracle_control_readouts_and_order_index():
    cfg = resolve_config(load_yaml(RECIPE), SMOKE)
    build = get_task("sorting_networks").build
    task = build(cfg, "oracle", 0, torch.device("cpu"))
    batch = task.train_batch(0)
    assert batch.oracle_pe.shape == (batch.num_nodes, 1)
    # the oracle feature marks exactly the positives' last node (negatives: none)
    for i in range(batch.num_graphs):
        g = batch.get_example(i)
        assert bool(g.oracle_pe.any()) == bool(g.y) and (not g.y or bool(g.oracle_pe[-1]))
    assert "node_pe" in task.model.pos_encoders
    assert "node_pe" not in build(cfg, "none", 0, torch.device("cpu")).model.pos_encoders
    wide = resolve_config(load_yaml(RECIPE), [*SMOKE, "data.order_index=true", "model.readout=max"])
    task = build(wide, "none", 0, torch.device("cpu"))
    batch = task.train_batch(0)
    assert batch.x.shape[1] == 2 * wide["data"]["feat_dim"]
    loss, stats = task.loss(task.model, batch)
    assert loss.isfinite() and 0.0 <= stats["train_acc"] <= 1.0
    assert set(task.evaluate(task.model)) == {"test_acc", "id_acc"}
    with pytest.raises(ValueError, match="model.readout must be one of"):
        build(resolve_config(load_yaml(RECIPE), [*SMOKE, "model.readout=sum"]), "none", 0, torch.device("cpu"))


def test_chance_is_the_better_constant_on_the_test_split():
    from recipes.data.sorting_networks import build_dataset

    cfg = resolve_config(load_yaml(RECIPE), SMOKE)
    d = cfg["data"]
    task = get_task("sorting_networks").build(cfg, "none", 0, torch.device("cpu"))
    nets = build_dataset(d["test_channels"], d["test_networks"], d["data_seed"] + 1, reverse=True)
    pos = sum(n.label for n in nets) / len(nets)
    assert task.chance == pytest.approx(max(pos, 1 - pos))
