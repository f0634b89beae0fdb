"""Recipe runner: config resolution and errors, a training run, checkpoints, exact resume, sweeps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mmpos.recipes import ConfigError, Task, parse_overrides, register_task, resolve_config, run_recipe
from mmpos.recipes.config import RUNNER_DEFAULTS
from mmpos.recipes.sweep import find_recipe, results_table

# ---------------------------------------------------------------------------- a toy task

_INTERRUPT = {"at": None}  # step at which train_batch raises, to simulate a killed run
_TOY_DEFAULTS = {"toy": {"hidden": 16, "dropout": 0.2, "classes": 3}}


def _blobs(n: int, seed: int, classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(classes, (n,), generator=g)
    centers = torch.randn(classes, 8, generator=torch.Generator().manual_seed(7)) * 1.5
    return centers[y] + torch.randn(n, 8, generator=g), y


@register_task("toy_blobs", defaults=_TOY_DEFAULTS)
def _build_toy(cfg, encoder, seed, device) -> Task:
    t = cfg["toy"]
    model = nn.Sequential(
        nn.Linear(8, t["hidden"]), nn.ReLU(), nn.Dropout(t["dropout"]), nn.Linear(t["hidden"], t["classes"])
    )
    eval_x, eval_y = _blobs(64, 999, t["classes"])

    def train_batch(step: int):
        if _INTERRUPT["at"] == step:
            raise KeyboardInterrupt(f"simulated interruption at step {step}")
        return _blobs(cfg["batch_size"], seed * 1_000_003 + step, t["classes"])

    def loss(model, batch):
        x, y = batch
        return F.cross_entropy(model(x), y)

    def evaluate(model):
        logits = model(eval_x.to(device))
        return {
            "acc": (logits.argmax(-1).cpu() == eval_y).float().mean().item(),
            "loss": F.cross_entropy(logits.cpu(), eval_y).item(),
        }

    return Task(model, train_batch, loss, evaluate, metric="acc")


def _toy(**over) -> dict:
    cfg = {
        "task": "toy_blobs",
        "steps": 12,
        "batch_size": 16,
        "eval_every": 4,
        "log_every": 2,
        "seeds": [0],
        "encoders": ["none"],
        "device": "cpu",
        "progress": False,
        "optim": {"lr": 0.02},
    }
    cfg.update(over)
    return cfg


# ---------------------------------------------------------------------------- config


def test_parse_overrides_nested_and_yaml_values():
    got = parse_overrides(
        ["optim.lr=3e-4", "encoders=[none, rope]", "name=null", "steps=5", "model.pos_kwargs.learned.std=0.2"]
    )
    assert got == {
        "optim": {"lr": 3e-4},
        "encoders": ["none", "rope"],
        "name": None,
        "steps": 5,
        "model": {"pos_kwargs": {"learned": {"std": 0.2}}},
    }


@pytest.mark.parametrize("bad", ["steps", "=3", "optim..lr=1", "a=[1,"])
def test_parse_overrides_errors(bad):
    with pytest.raises(ConfigError, match="override"):
        parse_overrides([bad])


def test_resolve_fills_defaults_and_applies_profile_then_overrides():
    recipe = _toy(profile="small", profiles={"small": {"steps": 3, "optim": {"lr": 0.5}}})
    cfg = resolve_config(recipe)
    assert cfg["steps"] == 3 and cfg["optim"]["lr"] == 0.5
    assert cfg["optim"]["weight_decay"] == RUNNER_DEFAULTS["optim"]["weight_decay"]
    assert cfg["toy"] == _TOY_DEFAULTS["toy"]
    cfg = resolve_config(recipe, ["steps=7", "toy.hidden=4"])  # overrides win over the profile
    assert cfg["steps"] == 7 and cfg["optim"]["lr"] == 0.5 and cfg["toy"]["hidden"] == 4
    assert resolve_config(recipe, ["profile=null"])["steps"] == 12


@pytest.mark.parametrize(
    "override, message",
    [
        ("stpes=3", "unknown config key 'stpes'; did you mean 'steps'"),
        ("optim.lrr=1", "unknown config key 'optim.lrr'; did you mean 'optim.lr'"),
        ("toy.hiden=3", "unknown config key 'toy.hiden'; did you mean 'toy.hidden'"),
        ("profile=big", "unknown profile 'big'"),
        ("steps=0", "'steps' must be an integer >= 1"),
        ("seeds=[0,0]", "'seeds' must be a list without repeats"),
        ("encoders=[]", "'encoders' must be a non-empty list"),
        ("optim=3", "'optim' must be a mapping"),
        ("task=no_such_task", "unknown task 'no_such_task'"),
    ],
)
def test_resolve_errors_name_the_key(override, message, monkeypatch):
    monkeypatch.setattr("mmpos.recipes.tasks._import_all", lambda: None)  # keep the unknown-task case fast
    with pytest.raises(ConfigError if "task" not in message else ValueError, match=message.replace("[", r"\[")):
        resolve_config(_toy(), [override])


def test_unused_profile_is_validated_too():
    with pytest.raises(ConfigError, match="profiles.gpu: unknown config key 'stepz'"):
        resolve_config(_toy(profiles={"gpu": {"stepz": 3}}))


def test_find_recipe_by_name_and_path(tmp_path):
    assert find_recipe("quickstart").name == "quickstart.yaml"
    p = tmp_path / "mine.yaml"
    p.write_text("task: toy_blobs\n")
    assert find_recipe(p) == p
    with pytest.raises(FileNotFoundError, match="quickstart"):
        find_recipe("no-such-recipe")


# ---------------------------------------------------------------------------- runs


def _final(folder: Path, encoder="none", seed=0) -> dict:
    return json.loads((folder / encoder / f"seed{seed}" / "final.json").read_text())


def _records(folder: Path, encoder="none", seed=0) -> list[dict]:
    return [json.loads(line) for line in (folder / encoder / f"seed{seed}" / "metrics.jsonl").read_text().splitlines()]


def test_run_writes_folder_and_checkpoints_load_weights_only(tmp_path):
    res = run_recipe(_toy(name="a"), out=tmp_path, name="toy")
    folder = res["folder"]
    assert folder == tmp_path / "toy" / "a"
    run = folder / "none" / "seed0"
    assert {p.name for p in run.iterdir()} == {"metrics.jsonl", "last.pt", "best.pt", "final.json"}
    records = _records(folder)
    assert [r["step"] for r in records if "eval" in r] == [4, 8, 12]
    assert [r["step"] for r in records if "loss" in r] == [2, 4, 6, 8, 10, 12]
    last = torch.load(run / "last.pt", weights_only=True)
    assert last["step"] == 12 and set(last) >= {"model", "optimizer", "scheduler", "rng"}
    best = torch.load(run / "best.pt", weights_only=True)
    assert best["metrics"]["acc"] == max(r["eval"]["acc"] for r in records if "eval" in r)
    assert resolve_config(__import__("yaml").safe_load((folder / "config.yaml").read_text()))["steps"] == 12
    assert _final(folder)["metrics"] == records[-1]["eval"] and _final(folder)["metrics"]["acc"] > 0.5
    with pytest.raises(FileExistsError, match="--resume"):
        run_recipe(_toy(name="a"), out=tmp_path, name="toy")


def test_resume_after_interruption_ends_with_identical_metrics(tmp_path):
    full = run_recipe(_toy(name="full"), out=tmp_path, name="toy")["folder"]
    _INTERRUPT["at"] = 6  # dies between the checkpoints of steps 4 and 8
    try:
        with pytest.raises(KeyboardInterrupt):
            run_recipe(_toy(name="cut"), out=tmp_path, name="toy")
    finally:
        _INTERRUPT["at"] = None
    cut = tmp_path / "toy" / "cut"
    assert not (cut / "none" / "seed0" / "final.json").exists()
    assert torch.load(cut / "none" / "seed0" / "last.pt", weights_only=True)["step"] == 4
    with pytest.raises(ConfigError, match="only"):
        run_recipe(None, ["steps=20"], resume=cut)
    resumed = run_recipe(None, ["progress=false"], resume=cut / "none")["folder"]
    assert resumed == cut
    a, b = _final(full), _final(cut)
    assert a["metrics"] == b["metrics"] and a["best"] == b["best"]  # exactly equal, not approximately
    assert _records(full) == _records(cut)  # the loss curve too, without the lines written after step 4
    sa = torch.load(full / "none" / "seed0" / "last.pt", weights_only=True)["model"]
    sb = torch.load(cut / "none" / "seed0" / "last.pt", weights_only=True)["model"]
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    # resuming a finished run changes nothing
    again = run_recipe(None, resume=cut)
    assert again["finals"][0]["metrics"] == a["metrics"]


def test_sweep_over_encoders_and_seeds_writes_ranked_table_and_plot(tmp_path, capsys):
    res = run_recipe(
        "quickstart",
        ["profile=smoke", "encoders=[none,sincos]", "seeds=[0,1]", "device=cpu", "progress=false"],
        out=tmp_path,
    )
    folder = res["folder"]
    assert folder.parent == tmp_path / "quickstart"
    table = (folder / "results.md").read_text()
    assert table == res["table"] and table in capsys.readouterr().out
    rows = [line for line in table.splitlines() if line.startswith(("| 1 ", "| 2 "))]
    assert len(rows) == 2 and all("±" in r for r in rows)
    assert "| rank | encoder | acc | acc@1.5x | acc@2x |" in table
    assert (folder / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    finals = json.loads((folder / "results.json").read_text())
    assert sorted((f["encoder"], f["seed"]) for f in finals) == [("none", 0), ("none", 1), ("sincos", 0), ("sincos", 1)]


def test_results_table_ranks_by_metric_direction():
    finals = [
        {
            "encoder": e,
            "seed": s,
            "metrics": {"err": v},
            "metric": "err",
            "higher_is_better": False,
            "seconds": 1.0,
            "params": 10,
        }
        for e, s, v in [("a", 0, 0.5), ("a", 1, 0.7), ("b", 0, 0.1), ("b", 1, 0.3)]
    ]
    lines = results_table(finals).splitlines()
    assert lines[2].startswith("| 1 | b | 0.2000 ± 0.1414") and lines[3].startswith("| 2 | a | 0.6000 ± 0.1414")
    assert "lower is better" in results_table(finals)


def test_results_table_marks_a_metric_an_encoder_lacks():
    finals = [
        {"encoder": e, "seed": s, "metrics": m, "metric": "acc", "higher_is_better": True, "seconds": 1.0, "params": 1}
        for e, s, m in [
            ("a", 0, {"acc": 0.5, "acc@2x": 0.4}),
            ("a", 1, {"acc": 0.7, "acc@2x": 0.2}),
            ("b", 0, {"acc": 0.9}),
            ("b", 1, {"acc": 0.8}),
        ]
    ]
    lines = results_table(finals).splitlines()
    assert lines[2] == "| 1 | b | 0.8500 ± 0.0707 | – | 1 | 1.0 |"
    assert lines[3].startswith("| 2 | a | 0.6000 ± 0.1414 | 0.3000 ± 0.1414 |")
