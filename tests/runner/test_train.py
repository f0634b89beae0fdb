"""Recipe runner: config resolution and errors, a training run, checkpoints, exact resume, sweeps, and
reliability: resolved configs on resume, diverging runs, damaged files, locked folders, checks before training."""

from __future__ import annotations

import fcntl
import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from torch import nn

from mmpos.runner import ConfigError, Task, parse_overrides, register_task, resolve_config, run_recipe
from mmpos.runner.config import RUNNER_DEFAULTS
from mmpos.runner.sweep import find_recipe, results_table
from mmpos.runner.train import RunError

# ---------------------------------------------------------------------------- a toy task

_INTERRUPT = {"at": None}  # step at which train_batch raises, to simulate a killed run
_NAN = {"at": None, "step": 0}  # step from which the loss is NaN, to simulate a diverging run
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
        _NAN["step"] = step
        if _INTERRUPT["at"] == step:
            raise KeyboardInterrupt(f"simulated interruption at step {step}")
        return _blobs(cfg["batch_size"], seed * 1_000_003 + step, t["classes"])

    def loss(model, batch):
        x, y = batch
        out = F.cross_entropy(model(x), y)
        return out * math.nan if _NAN["at"] is not None and _NAN["at"] <= _NAN["step"] else out

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
        ("baseline=rope", "'baseline' must be one of the swept encoders ['none'] or null, got 'rope'"),
        ("logger=wandb", "'logger' must be 'jsonl' or 'tensorboard', got 'wandb'"),
    ],
)
def test_resolve_errors_name_the_key(override, message, monkeypatch):
    monkeypatch.setattr("mmpos.runner.tasks._import_all", lambda: None)  # keep the unknown-task case fast
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
    assert {p.name for p in run.iterdir()} == {"metrics.jsonl", "last.pt", "prev.pt", "best.pt", "final.json"}
    assert (folder / "config.yaml").read_text().splitlines()[-1].startswith("# mmpos sha256 ")
    records = _records(folder)
    assert [r["step"] for r in records if "eval" in r] == [4, 8, 12]
    assert [r["step"] for r in records if "loss" in r] == [2, 4, 6, 8, 10, 12]
    last = torch.load(run / "last.pt", weights_only=True)
    assert last["step"] == 12 and set(last) >= {"model", "optimizer", "scheduler", "rng"}
    best = torch.load(run / "best.pt", weights_only=True)
    assert best["metrics"]["acc"] == max(r["eval"]["acc"] for r in records if "eval" in r)
    assert resolve_config(yaml.safe_load((folder / "config.yaml").read_text()))["steps"] == 12
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
    with pytest.raises(FileNotFoundError, match=f"no config.yaml in it; the run folder above it is {cut}"):
        run_recipe(None, resume=cut / "none")  # --resume DIR reads DIR's own config.yaml, never one above
    resumed = run_recipe(None, ["progress=false"], resume=cut)["folder"]
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


# ---------------------------------------------------------------------------- reliability (issue 10, issue 11 s.1)


def _interrupted(tmp_path, at: int, **over) -> Path:
    _INTERRUPT["at"] = at
    try:
        with pytest.raises(KeyboardInterrupt):
            run_recipe(_toy(**over), out=tmp_path, name="toy")
    finally:
        _INTERRUPT["at"] = None
    return tmp_path / "toy" / over["name"]


def test_resume_keeps_profile_and_overrides_of_the_saved_config(tmp_path):
    profiled = {"profile": "small", "profiles": {"small": {"steps": 4, "eval_every": 2, "log_every": 1}}}
    over = ["steps=12", "eval_every=4", "log_every=2"]  # overrides win over the profile
    full = run_recipe(_toy(name="full", **profiled), over, out=tmp_path, name="toy")["folder"]
    _INTERRUPT["at"] = 6
    try:
        with pytest.raises(KeyboardInterrupt):
            run_recipe(_toy(name="cut", **profiled), over, out=tmp_path, name="toy")
    finally:
        _INTERRUPT["at"] = None
    cut = tmp_path / "toy" / "cut"
    saved = yaml.safe_load((cut / "config.yaml").read_text())
    assert saved["steps"] == 12 and saved["eval_every"] == 4 and saved["profile"] == "small"
    res = run_recipe(None, ["progress=false"], resume=cut)
    assert res["config"]["steps"] == 12 and res["config"]["eval_every"] == 4  # not the profile's 4 / 2
    assert _final(cut)["step"] == 12 and _final(cut)["metrics"] == _final(full)["metrics"]
    assert _records(cut) == _records(full)


def test_non_finite_loss_stops_the_run_and_marks_it_failed(tmp_path):
    from mmpos.runner.train import TrainingDiverged

    _NAN["at"] = 6
    try:
        with pytest.raises(TrainingDiverged, match="loss became nan at step 8"):
            run_recipe(_toy(name="nan"), out=tmp_path, name="toy")
    finally:
        _NAN["at"] = None
    folder, run = tmp_path / "toy" / "nan", tmp_path / "toy" / "nan" / "none" / "seed0"
    assert not (run / "final.json").exists() and not (folder / "results.md").exists()
    assert json.loads((run / "failed.json").read_text())["step"] == 8
    assert "TrainingDiverged" in json.loads((folder / "failed.json").read_text())["error"]
    assert torch.load(run / "last.pt", weights_only=True)["step"] == 4  # the last good checkpoint
    assert all(math.isfinite(r.get("loss", 0.0)) for r in _records(folder))  # no NaN reached the log
    with pytest.raises(ConfigError, match="optim.lr' must be a finite number"):
        resolve_config(_toy(), ["optim.lr=.inf"])


def test_torn_metrics_tail_is_dropped_with_a_warning(tmp_path):
    full = run_recipe(_toy(name="full"), out=tmp_path, name="toy")["folder"]
    cut = _interrupted(tmp_path, 6, name="cut")
    with open(cut / "none" / "seed0" / "metrics.jsonl", "a") as f:
        f.write('{"step": 6, "lo')  # killed mid-line
    with pytest.warns(UserWarning, match=r"metrics.jsonl: dropped a torn last line"):
        run_recipe(None, resume=cut)
    assert _records(cut) == _records(full) and _final(cut)["metrics"] == _final(full)["metrics"]


def test_damaged_metrics_line_is_named(tmp_path):
    cut = _interrupted(tmp_path, 6, name="cut")
    log = cut / "none" / "seed0" / "metrics.jsonl"
    lines = log.read_text().splitlines()
    log.write_text("\n".join([lines[0], "{garbage", *lines[1:]]) + "\n")
    with pytest.raises(RunError, match=r"metrics.jsonl: line 2 is damaged"):
        run_recipe(None, resume=cut)


def test_truncated_last_checkpoint_falls_back_to_the_previous_one(tmp_path):
    full = run_recipe(_toy(name="full"), out=tmp_path, name="toy")["folder"]
    cut = _interrupted(tmp_path, 10, name="cut")  # checkpoints at steps 4 (prev.pt) and 8 (last.pt)
    run = cut / "none" / "seed0"
    assert torch.load(run / "prev.pt", weights_only=True)["step"] == 4
    data = (run / "last.pt").read_bytes()
    (run / "last.pt").write_bytes(data[: len(data) // 2])
    with pytest.warns(UserWarning, match=r"last.pt is damaged"):
        run_recipe(None, resume=cut)
    assert _final(cut)["metrics"] == _final(full)["metrics"] and _records(cut) == _records(full)


def test_no_temporary_files_are_left(tmp_path):
    folder = run_recipe(_toy(name="a"), out=tmp_path, name="toy")["folder"]
    assert not [p for p in folder.rglob("*") if ".tmp" in p.name]


def test_a_running_folder_is_locked(tmp_path):
    cut = _interrupted(tmp_path, 6, name="cut")
    with open(cut / ".lock", "a+") as held:  # another process holding the run
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(RunError, match="is in use"):
            run_recipe(None, resume=cut)
        assert not (cut / "none" / "seed0" / "final.json").exists()
    run_recipe(None, resume=cut)  # released: it resumes
    assert (cut / "none" / "seed0" / "final.json").exists()


@pytest.mark.parametrize(
    "name, message",
    [("../x", "one folder name"), ("/tmp/abs", "one folder name"), ("a/b", "one folder name"), (2024, "a string")],
)
def test_run_names_stay_inside_out(tmp_path, name, message):
    with pytest.raises(ConfigError, match=message):
        run_recipe(_toy(name=name), out=tmp_path / "runs", name="toy")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "x").exists()


def test_out_pointing_at_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="is a file"):
        run_recipe(_toy(name="a"), out=tmp_path / "file", name="toy")


def test_saved_config_records_the_out_folder_used(tmp_path):
    folder = run_recipe(_toy(name="a"), out=tmp_path / "elsewhere", name="toy")["folder"]
    assert yaml.safe_load((folder / "config.yaml").read_text())["out"] == str(tmp_path / "elsewhere")


def test_resume_refuses_another_recipe_or_out(tmp_path):
    cut = _interrupted(tmp_path, 6, name="cut")
    with pytest.raises(ConfigError, match="continues a run of recipe 'toy', not 'quickstart'"):
        run_recipe("quickstart", resume=cut)
    with pytest.raises(ConfigError, match="the run stays in"):
        run_recipe(None, out=tmp_path / "other", resume=cut)
    run_recipe("toy", out=tmp_path, resume=cut)  # the same recipe and out are fine


def test_device_that_does_not_exist_is_a_value_error():
    from mmpos.runner.train import resolve_device

    with pytest.raises(ValueError, match="device='tpu'"):
        resolve_device("tpu")


_SMOKE = ["profile=smoke", "encoders=[none,learned]", "device=cpu", "progress=false"]


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.pos_kwargs.learnd={std: 0.2}", "'learnd' is not an encoder; did you mean 'learned'"),
        ("model.pos_kwargs.learned.stdd=0.2", "encoder 'learned' takes no argument 'stdd' \\(did you mean 'std'\\?\\)"),
        ("model.pos_kwargs.learned.std=.nan", "encoder 'learned': std must be a finite number"),
        ("data.eval_size=0", "cannot be built and evaluated with this config"),
    ],
)
def test_bad_settings_fail_before_any_folder_is_made(tmp_path, override, message):
    with pytest.raises(ConfigError, match=message):
        run_recipe("quickstart", [*_SMOKE, override], out=tmp_path)
    assert not (tmp_path / "quickstart").exists() or not any((tmp_path / "quickstart").iterdir())


def test_a_first_run_that_fails_leaves_no_folder(tmp_path):
    @register_task("toy_broken", defaults=_TOY_DEFAULTS)
    def _build(cfg, encoder, seed, device):
        task = _build_toy(cfg, encoder, seed, device)

        def train_batch(step):  # builds and evaluates fine, then fails in the first training step
            raise ValueError("broken data")

        return Task(task.model, train_batch, task.loss, task.evaluate, metric="acc")

    with pytest.raises(ValueError, match="broken data"):
        run_recipe(_toy(task="toy_broken", name="b"), out=tmp_path, name="toy")
    assert not (tmp_path / "toy" / "b").exists()


# ---------------------------------------------------------------------------- one training loop, loggers


def test_fit_trains_exactly_as_a_run_does(tmp_path):
    from mmpos.runner.train import fit, seed_everything

    cfg = resolve_config(_toy(name="ref"))
    run = run_recipe(cfg, out=tmp_path, name="toy")["folder"]
    seed_everything(0)
    task = _build_toy(cfg, "none", 0, torch.device("cpu"))
    model = fit(task, cfg, torch.device("cpu"))
    saved = torch.load(run / "none" / "seed0" / "last.pt", weights_only=True)["model"]
    assert all(torch.equal(v, saved[k]) for k, v in model.state_dict().items())  # the same loop: bit-identical


def test_fit_raises_on_a_non_finite_loss():
    from mmpos.runner.train import TrainingDiverged, fit

    cfg = resolve_config(_toy())
    _NAN["at"] = 3
    try:
        with pytest.raises(TrainingDiverged, match="NaN or infinite within 12 steps"):
            fit(_build_toy(cfg, "none", 0, torch.device("cpu")), cfg, torch.device("cpu"))
    finally:
        _NAN["at"] = None


def test_resume_may_change_the_baseline_of_the_table(tmp_path):
    folder = run_recipe(_toy(name="b", encoders=["none", "wide"], seeds=[0, 1]), out=tmp_path, name="toy")["folder"]
    assert "Paired" not in (folder / "results.md").read_text()
    again = run_recipe(None, ["baseline=wide"], resume=folder)
    assert "Paired difference from `wide`" in again["table"] and again["config"]["baseline"] == "wide"


def _scalars(run: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run))
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


def test_tensorboard_logger_writes_the_same_scalars(tmp_path):
    pytest.importorskip("tensorboard")
    folder = run_recipe(_toy(name="tb", logger="tensorboard"), out=tmp_path, name="toy")["folder"]
    run = folder / "none" / "seed0"
    assert list(run.glob("events.out.tfevents.*")) and (run / "metrics.jsonl").is_file()
    records = _records(folder)
    loss = [(r["step"], r["loss"]) for r in records if "loss" in r]
    acc = [(r["step"], r["eval"]["acc"]) for r in records if "eval" in r]
    assert [s for s, _ in _scalars(run, "train/loss")] == [s for s, _ in loss]
    assert [v for _, v in _scalars(run, "train/loss")] == pytest.approx([v for _, v in loss], rel=1e-6)  # float32
    got = _scalars(run, "eval/acc")
    assert [s for s, _ in got] == [4, 8, 12] and [v for _, v in got] == pytest.approx([v for _, v in acc], rel=1e-6)


def test_tensorboard_after_resume_drops_the_events_past_the_checkpoint(tmp_path):
    pytest.importorskip("tensorboard")
    cut = _interrupted(tmp_path, 6, name="cut", logger="tensorboard")  # logged steps 2, 4, 6; checkpoint at 4
    run_recipe(None, resume=cut)
    loss = [(r["step"], r["loss"]) for r in _records(cut) if "loss" in r]
    got = _scalars(cut / "none" / "seed0", "train/loss")
    assert [s for s, _ in got] == [2, 4, 6, 8, 10, 12] == [s for s, _ in loss]  # step 6 once, from the resumed run
    assert [v for _, v in got] == pytest.approx([v for _, v in loss], rel=1e-6)


def test_missing_tensorboard_is_named_before_training(tmp_path, monkeypatch, capsys):
    import sys

    from mmpos.cli import main

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails as if not installed
    with pytest.raises(ConfigError, match="logger: tensorboard needs the 'tensorboard' package: pip install"):
        run_recipe(_toy(name="x", logger="tensorboard"), out=tmp_path, name="toy")
    assert not (tmp_path / "toy" / "x").exists()
    args = ["run", "quickstart", *_SMOKE, "logger=tensorboard", "--out", str(tmp_path)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'tensorboard' package" in err and not (tmp_path / "quickstart").exists()


# ---------------------------------------------------------------------------- integrity on resume (issue 22)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """An uninterrupted toy run: what every resumed run below must end with, exactly."""
    return run_recipe(_toy(name="full"), out=tmp_path_factory.mktemp("ref"), name="toy")["folder"]


def _same_as(reference: Path, folder: Path) -> None:
    assert _final(folder)["metrics"] == _final(reference)["metrics"] and _records(folder) == _records(reference)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file() and p.name != ".lock"}


def test_checkpoints_carry_payload_and_config_digests_and_the_record_count(tmp_path):
    from mmpos.runner.config import config_digest
    from mmpos.runner.train import payload_digest

    cut = _interrupted(tmp_path, 10, name="cut")  # checkpoints at steps 4 (prev.pt) and 8 (last.pt)
    run = cut / "none" / "seed0"
    cfg = resolve_config(yaml.safe_load((cut / "config.yaml").read_text()))
    lines = (run / "metrics.jsonl").read_text().splitlines()
    for name, step in (("prev.pt", 4), ("last.pt", 8), ("best.pt", None)):
        ckpt = torch.load(run / name, weights_only=True)
        integrity = ckpt.pop("integrity")
        assert integrity["payload_sha256"] == payload_digest(ckpt)
        assert integrity["config_sha256"] == config_digest(cfg)
        if step is not None:
            assert integrity["records"] == sum(json.loads(line)["step"] <= step for line in lines)
    assert config_digest(cfg) == config_digest({**cfg, "progress": True, "device": "cuda"})  # resume may change them
    assert config_digest(cfg) != config_digest({**cfg, "steps": 13})


def _flip_a_weight(path: Path) -> None:
    """One bit of one weight changes; the file stays a loadable checkpoint with its old digest."""
    ckpt = torch.load(path, weights_only=True)
    w = ckpt["model"]["0.weight"]
    w.view(torch.int32)[0, 0] ^= 1
    torch.save(ckpt, path)


@pytest.mark.parametrize("damage", ["weight bit", "byte flip", "zeroed tail"])
def test_a_damaged_last_checkpoint_falls_back_to_prev(tmp_path, reference, damage):
    cut = _interrupted(tmp_path, 10, name="cut")
    last = cut / "none" / "seed0" / "last.pt"
    if damage == "weight bit":
        _flip_a_weight(last)
    else:
        data = bytearray(last.read_bytes())
        if damage == "byte flip":
            data[len(data) // 2] ^= 0x10
        else:
            data[-200:] = bytes(200)
        last.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match=r"last.pt is damaged: .*; resuming from .*prev.pt \(step 4\)"):
        run_recipe(None, resume=cut)
    _same_as(reference, cut)


def test_both_checkpoints_damaged_stop_with_one_line_naming_them(tmp_path):
    cut = _interrupted(tmp_path, 10, name="cut")
    run = cut / "none" / "seed0"
    _flip_a_weight(run / "last.pt")
    (run / "prev.pt").write_bytes(b"not a checkpoint")
    before = _snapshot(cut)
    with pytest.raises(RunError) as e:
        run_recipe(None, resume=cut)
    message = str(e.value)
    assert "\n" not in message and "last.pt is damaged" in message and "prev.pt is damaged" in message
    assert f"delete {run}" in message
    assert _snapshot(cut) == before  # nothing was changed


@pytest.mark.parametrize("damage", ["cut in half", "a section lost", "edited value", "not utf-8", "emptied"])
def test_a_damaged_config_yaml_is_refused_before_anything_changes(tmp_path, damage):
    cut = _interrupted(tmp_path, 6, name="cut")
    path = cut / "config.yaml"
    text = path.read_text()
    if damage == "cut in half":  # still parses as YAML: missing keys would silently take defaults
        path.write_text(text[: len(text) // 2].rsplit("\n", 1)[0] + "\n")
        assert isinstance(yaml.safe_load(path.read_text()), dict)
    elif damage == "a section lost":
        path.write_text("\n".join(line for line in text.splitlines() if not line.startswith("  ")) + "\n")
    elif damage == "edited value":
        path.write_text(text.replace("steps: 12", "steps: 20"))
    elif damage == "not utf-8":
        path.write_bytes(text.encode().replace(b"toy_blobs", b"toy_\xffblobs"))
    else:
        path.write_text("")
    before = _snapshot(cut)
    with pytest.raises(RunError, match=r"config.yaml (is damaged|is missing)") as e:
        run_recipe(None, resume=cut)
    assert "\n" not in str(e.value) and str(path) in str(e.value)
    assert _snapshot(cut) == before


def test_a_shortened_metrics_log_falls_back_or_stops(tmp_path, reference):
    cut = _interrupted(tmp_path, 10, name="cut")  # prev.pt: step 4, last.pt: step 8
    log = cut / "none" / "seed0" / "metrics.jsonl"
    lines = log.read_text().splitlines()
    log.write_text("".join(line + "\n" for line in lines if json.loads(line)["step"] <= 6))  # lost steps 7-8
    with pytest.warns(UserWarning, match=r"metrics.jsonl holds \d+ records up to step 8, last.pt counted \d+"):
        run_recipe(None, resume=cut)  # prev.pt's records are all there: it resumes from step 4
    _same_as(reference, cut)

    cut = _interrupted(tmp_path, 10, name="cut2")
    log = cut / "none" / "seed0" / "metrics.jsonl"
    for text in ("", "\n".join(log.read_text().splitlines()[1:]) + "\n"):  # emptied; first record lost
        log.write_text(text)
        with pytest.raises(RunError, match=r"metrics.jsonl holds \d+ records up to step 8.*up to step 4") as e:
            run_recipe(None, resume=cut)
        assert "\n" not in str(e.value)


def test_checkpoints_of_another_config_are_refused(tmp_path):
    cut = _interrupted(tmp_path, 6, name="cut")
    other = _interrupted(tmp_path, 6, name="other", optim={"lr": 0.03})
    for name in ("last.pt", "prev.pt"):
        src = other / "none" / "seed0" / name
        if src.exists():
            (cut / "none" / "seed0" / name).write_bytes(src.read_bytes())
    with pytest.raises(RunError, match="was trained with another config than the run folder's config.yaml"):
        run_recipe(None, resume=cut)


def test_leftover_temporary_files_are_removed_on_start(tmp_path, reference):
    cut = _interrupted(tmp_path, 6, name="cut")
    leftovers = [cut / ".results.md.tmp4242", cut / "none" / "seed0" / ".last.pt.tmp999"]
    for p in leftovers:
        p.write_bytes(b"half a file")
    keep = cut / "none" / "seed0" / "notes.tmp1"  # not a name atomic_write makes: left alone
    keep.write_text("mine")
    run_recipe(None, resume=cut)
    assert not any(p.exists() for p in leftovers) and keep.exists()
    _same_as(reference, cut)


@pytest.mark.parametrize(
    "code, reason", [(28, "no space left on device"), (30, "read-only file system"), (13, "permission denied")]
)
def test_a_failed_checkpoint_write_is_one_line_leaks_nothing_and_resumes(
    tmp_path, reference, monkeypatch, code, reason
):
    import os

    from mmpos.runner import train

    real = torch.save

    def failing_save(obj, f):
        if obj["step"] == 8:  # the first checkpoint write at step 8 fails after writing part of the file
            f.write(b"partial")
            raise OSError(code, os.strerror(code))
        real(obj, f)

    monkeypatch.setattr(train.torch, "save", failing_save)
    with pytest.raises(train.WriteFailed) as e:
        run_recipe(_toy(name="full-disk"), out=tmp_path, name="toy")
    folder = tmp_path / "toy" / "full-disk"
    run = folder / "none" / "seed0"
    message = str(e.value)
    assert message in (f"{reason} while writing {run / 'best.pt'}", f"{reason} while writing {run / 'last.pt'}")
    assert not [p for p in folder.rglob("*") if ".tmp" in p.name]  # nothing leaked
    assert not (folder / "failed.json").exists() and not (run / "final.json").exists()
    monkeypatch.setattr(train.torch, "save", real)  # the cause is gone: the run resumes and ends as it should
    run_recipe(None, resume=folder)
    _same_as(reference, folder)


def test_a_failed_log_append_leaves_no_torn_line(tmp_path, monkeypatch):
    import os

    from mmpos.runner import train

    writer = train._Writer(tmp_path, active=True)
    writer.log({"step": 1, "loss": 0.5})
    real = os.write

    def short_write(fd, data):
        return real(fd, data[:5])  # the disk fills up mid-line

    monkeypatch.setattr(train.os, "write", short_write)
    with pytest.raises(train.WriteFailed, match=r"^no space left on device while writing .*metrics.jsonl$"):
        writer.log({"step": 2, "loss": 0.25})
    monkeypatch.undo()
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1, "loss": 0.5}\n' and writer.records == 1


def test_a_failed_config_write_leaves_no_run_folder(tmp_path, monkeypatch):
    from mmpos.runner import sweep, train

    def full(path, data):
        raise train.WriteFailed(f"no space left on device while writing {path}", path)

    monkeypatch.setattr(sweep, "atomic_write", full)
    with pytest.raises(train.WriteFailed, match="config.yaml"):
        run_recipe(_toy(name="x"), out=tmp_path, name="toy")
    assert not (tmp_path / "toy" / "x").exists()


@pytest.mark.parametrize("name", ["../../x", "..", "a/b", "/tmp/abs", "", "c:x"])
def test_recipe_names_from_python_stay_inside_out(tmp_path, name):
    with pytest.raises(ConfigError, match="one folder name inside --out|must be a string"):
        run_recipe(_toy(name="a"), out=tmp_path / "runs", name=name)
    assert not (tmp_path / "runs").exists() and not (tmp_path / "x").exists()


@pytest.mark.parametrize("encoder", ["../x", "a/b", ".."])
def test_encoder_names_that_would_leave_the_run_folder_are_refused(encoder):
    with pytest.raises(ConfigError, match="one folder name inside --out"):
        resolve_config(_toy(encoders=[encoder]))


@pytest.mark.parametrize(("key", "value"), [("encoders", "rope"), ("seeds", 0)])
def test_a_scalar_for_a_list_is_refused_with_the_fix(key, value):
    with pytest.raises(ConfigError, match=rf"'{key}' must be a list, got the single value .*; write {key}=\[{value}\]"):
        resolve_config(_toy(**{key: value}))


@pytest.mark.parametrize("betas", [[0.9, "x"], [0.9, 1.5], [0.9], "0.9"])
def test_optim_betas_are_checked_before_the_optimizer(betas):
    with pytest.raises(ConfigError, match="optim.betas' must be a list of two numbers"):
        resolve_config(_toy(optim={"betas": betas}))


def test_an_altered_metrics_record_is_caught(tmp_path, reference):
    """A changed value in a record up to the checkpoint (same count, valid JSON) is not carried into the run."""
    cut = _interrupted(tmp_path, 10, name="cut")
    log = cut / "none" / "seed0" / "metrics.jsonl"
    lines = log.read_text().splitlines()
    record = json.loads(lines[1])
    record["loss"] = record["loss"] + 1.0
    log.write_text("\n".join([lines[0], json.dumps(record), *lines[2:]]) + "\n")
    with pytest.raises(RunError, match=r"the records up to step 8 differ from those last.pt recorded"):
        run_recipe(None, resume=cut)


def test_an_altered_final_json_is_finished_again(tmp_path, reference):
    folder = run_recipe(_toy(name="done"), out=tmp_path, name="toy")["folder"]
    path = folder / "none" / "seed0" / "final.json"
    final = json.loads(path.read_text())
    assert len(final.pop("sha256")) == 64
    final["metrics"]["acc"] = 1.0  # still valid JSON, still this pair's
    path.write_text(json.dumps(final))
    with pytest.warns(UserWarning, match="final.json is damaged; finishing the run from its checkpoint again"):
        again = run_recipe(None, resume=folder)
    assert again["finals"][0]["metrics"] == _final(reference)["metrics"] == _final(folder)["metrics"]


# ---------------------------------------------------------------------------- DDP: kill and resume under torchrun

_DDP_TASK = """
import os, signal
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from mmpos.runner import Task, register_task


def _blobs(n, seed):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(3, (n,), generator=g)
    centers = torch.randn(3, 8, generator=torch.Generator().manual_seed(7)) * 1.5
    return centers[y] + torch.randn(n, 8, generator=g), y


@register_task("ddp_toy")
def build(cfg, encoder, seed, device):
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3))
    eval_x, eval_y = _blobs(64, 999)
    kill = os.environ.get("MMPOS_TEST_KILL")  # "rank:step": that rank dies (SIGKILL) when asked for that batch

    def train_batch(step):
        if kill and dist.get_rank() == int(kill.split(":")[0]) and step == int(kill.split(":")[1]):
            os.kill(os.getpid(), signal.SIGKILL)
        return _blobs(cfg["batch_size"], seed * 1_000_003 + step)

    def loss(model, batch):
        x, y = batch
        torch.rand(1 + int(y.sum()))  # random draws that depend on this rank's rows (as masking a share of tokens)
        return F.cross_entropy(model(x), y)

    def evaluate(model):
        logits = model(eval_x)
        return {"acc": (logits.argmax(-1) == eval_y).float().mean().item(), "loss": F.cross_entropy(logits, eval_y).item()}

    return Task(model, train_batch, loss, evaluate, metric="acc")
"""

_DDP_RECIPE = _toy(task="ddp_toy", task_module="ddp_toy_task", threads=1)


def _torchrun(tmp_path: Path, *args: str, kill: str | None = None):
    import os
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), *filter(None, [env.get("PYTHONPATH")])])
    env.pop("MMPOS_TEST_KILL", None)
    if kill:
        env["MMPOS_TEST_KILL"] = kill
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    cmd += ["-m", "mmpos.cli", "run", *args]
    return subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)


@pytest.fixture(scope="module")
def ddp_reference(tmp_path_factory):
    """The uninterrupted 2-process run (gloo, CPU) every killed-and-resumed run must end at."""
    import torch.distributed

    if not (torch.distributed.is_available() and torch.distributed.is_gloo_available()):
        pytest.skip("torch.distributed with gloo is not available")
    root = tmp_path_factory.mktemp("ddp")
    (root / "ddp_toy_task.py").write_text(_DDP_TASK)
    (root / "ddp_toy.yaml").write_text(yaml.safe_dump(_DDP_RECIPE))
    proc = _torchrun(root, "ddp_toy.yaml", "name=full", "--out", str(root))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return root, root / "ddp_toy" / "full"


@pytest.mark.slow
@pytest.mark.parametrize("kill, resumes_from", [("1:6", 4), ("0:10", 8)], ids=["rank1-step6", "rank0-step10"])
def test_ddp_run_killed_and_resumed_ends_where_the_uninterrupted_one_does(ddp_reference, kill, resumes_from):
    root, full = ddp_reference
    name = f"cut{kill.replace(':', '_')}"
    proc = _torchrun(root, "ddp_toy.yaml", f"name={name}", "--out", str(root), kill=kill)
    assert proc.returncode != 0, "the run was meant to be killed"
    cut = root / "ddp_toy" / name
    pair = cut / "none" / "seed0"
    assert not (pair / "final.json").exists()
    assert torch.load(pair / "last.pt", weights_only=True)["step"] == resumes_from
    proc = _torchrun(root, "--resume", str(cut))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stdout.count("| rank | encoder |") == 1  # rank 0 alone prints (and writes) the results
    a, b = _final(full), _final(cut)
    assert a["metrics"] == b["metrics"] and a["best"] == b["best"] and a["step"] == b["step"] == 12  # exactly
    assert _records(full) == _records(cut)  # the whole loss curve, without the lines past the checkpoint
    sa = torch.load(full / "none" / "seed0" / "last.pt", weights_only=True)
    sb = torch.load(pair / "last.pt", weights_only=True)
    assert all(torch.equal(sa["model"][k], sb["model"][k]) for k in sa["model"])
    assert not [p.name for p in cut.rglob("*.tmp")]  # nothing the kill left behind survives the resume


def test_checkpoints_hold_each_process_random_state_and_warn_under_another_count(tmp_path, reference):
    from mmpos.runner.train import payload_digest

    cut = _interrupted(tmp_path, 6, name="cut")
    last = cut / "none" / "seed0" / "last.pt"
    ckpt = torch.load(last, weights_only=True)
    assert isinstance(ckpt["rng"], list) and len(ckpt["rng"]) == 1  # one process: one state
    # as if written by 2 processes: resumed by 1, it continues rank 0's state and says the run is not the same
    ckpt.pop("integrity")
    ckpt["rng"] = [ckpt["rng"][0], ckpt["rng"][0]]
    torch.save(
        {
            **ckpt,
            "integrity": {**torch.load(last, weights_only=True)["integrity"], "payload_sha256": payload_digest(ckpt)},
        },
        last,
    )
    with pytest.warns(UserWarning, match=r"written by 2 process\(es\), resumed by 1: every process continues rank 0"):
        run_recipe(None, ["progress=false"], resume=cut)
    _same_as(reference, cut)  # rank 0's state is this process's own here
