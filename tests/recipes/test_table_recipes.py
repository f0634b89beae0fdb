"""table_proxy: the smoke profile runs every encoder; batches; the model reads the right coordinates."""

import copy
import json
from pathlib import Path

import pytest
import torch

from mmpos.runner.sweep import run_recipe
from mmpos.runner.tasks import get_task
from recipes.tasks.tables import DEFAULTS, TableLM, table_layout

RECIPES = Path(__file__).resolve().parents[2] / "recipes" / "configs"


def test_smoke_profile_runs_every_encoder(tmp_path):
    result = run_recipe(RECIPES / "table_proxy.yaml", ["profile=smoke", "device=cpu", "threads=1"], out=tmp_path)
    cfg = result["config"]
    assert [f["encoder"] for f in result["finals"]] == ["rope", "rope-axial", "2d-tpe"]
    metrics = {"acc", "count@4x4", "count@6x5", "offset@4x4", "offset@6x5"}
    for final in result["finals"]:
        assert set(final["metrics"]) == metrics and final["step"] == cfg["steps"]
        assert all(0.0 <= v <= 1.0 for v in final["metrics"].values())
    assert len(json.loads((result["folder"] / "results.json").read_text())) == 3


def _cfg():
    cfg = copy.deepcopy(DEFAULTS)
    cfg["batch_size"] = 4
    cfg["model"].update(dim=16, depth=1, num_heads=2)
    cfg["data"].update(eval_sizes=[[4, 4]], eval_size=4, train_max=5)
    return cfg


def test_train_batches_are_pure_and_alternate_tasks():
    task = get_task("table_proxy").build(_cfg(), "2d-tpe", 0, torch.device("cpu"))
    a, b = task.train_batch(3), task.train_batch(3)
    assert torch.equal(a["tokens"], b["tokens"]) and torch.equal(a["answer"], b["answer"])
    assert a["shape"][0] == 4 and task.train_batch(2)["shape"][0] == 2  # offset (question) / count
    loss, logs = task.loss(task.model, a)
    assert loss.ndim == 0 and torch.isfinite(loss) and "router_entropy" in logs
    loss.backward()
    assert task.model.blocks[0].attn.router.gate_1.weight.grad is not None


@pytest.mark.parametrize("encoder", ["rope", "rope-axial", "2d-tpe"])
def test_model_reads_the_coordinates_of_its_encoder(encoder):
    model = TableLM(50, 10, encoder, dim=16, depth=1, num_heads=2)
    lay = table_layout(2, 3, 4, 1, 0)
    coords = model.coords(lay)
    expected = {"rope": ("row_order",), "rope-axial": ("row", "col"), "2d-tpe": ("row_order", "col_order")}[encoder]
    assert coords.axes == expected
    if encoder == "rope-axial":
        assert torch.equal(coords.pos, lay.grid_coords.pos)
    else:
        assert torch.equal(coords.pos[..., 0], torch.arange(lay.order_coords.num_tokens, dtype=torch.float)[None])
    assert model(torch.randint(50, (2, lay.order_coords.num_tokens)), lay).shape == (2, 10)
    with pytest.raises(ValueError, match="encoder"):
        TableLM(50, 10, "alibi")
