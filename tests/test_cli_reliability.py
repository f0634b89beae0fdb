"""``mmpos run``: every user mistake is one line on stderr with exit status 2; argument order; diverged runs."""

from __future__ import annotations

import pytest

from mmpos.cli import main

_SMOKE = ["profile=smoke", "encoders=[none]", "device=cpu", "progress=false"]


def _one_line_error(capsys, code: int, needle: str) -> None:
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and needle in err, err


def test_malformed_yaml(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("task: spatial_relations\nencoders: [none\n")
    _one_line_error(capsys, main(["run", str(bad), "--out", str(tmp_path)]), "not valid YAML (line 3")


@pytest.mark.parametrize(
    "override, needle",
    [
        ("device=tpu", "device='tpu'"),
        ("name=2024", "'name' must be a string"),
        ("name=../../x", "one folder name"),
        ("task_module=no_such_module", "cannot import 'no_such_module'"),
        ("data.eval_size=0", "data.* settings"),
        ("model.pos_kwargs.rope.thetaa=10", "did you mean 'theta'"),
        ("optim.lr=.inf", "finite number"),
    ],
)
def test_config_mistakes(tmp_path, capsys, override, needle):
    out = tmp_path / "runs"
    _one_line_error(capsys, main(["run", "quickstart", *_SMOKE, override, "--out", str(out)]), needle)
    assert not out.exists() or not any(out.rglob("config.yaml"))  # no half-written run folder


def test_out_is_a_file(tmp_path, capsys):
    (tmp_path / "f").write_text("")
    _one_line_error(capsys, main(["run", "quickstart", *_SMOKE, "--out", str(tmp_path / "f")]), "is a file")


def test_corrupt_checkpoint_and_resume_argument_orders(tmp_path, capsys):
    args = ["run", "quickstart", *_SMOKE, "name=r", "--out", str(tmp_path)]
    assert main(args) == 0
    folder = tmp_path / "quickstart" / "r"
    (folder / "none" / "seed0" / "final.json").unlink()
    for name in ("last.pt", "prev.pt"):
        (folder / "none" / "seed0" / name).write_bytes(b"not a checkpoint")
    capsys.readouterr()
    with pytest.warns(UserWarning, match="last.pt is damaged"):  # falls back, then starts over: still runs
        assert main(["run", "quickstart", "--resume", str(folder), "progress=false"]) == 0  # recipe, then overrides
    assert (folder / "none" / "seed0" / "final.json").exists()
    assert main(["run", "--resume", str(folder), "progress=false"]) == 0  # no recipe at all
    _one_line_error(capsys, main(["run", "vit_spatial", "--resume", str(folder)]), "not 'vit_spatial'")
    _one_line_error(capsys, main(["run", "--resume", str(folder), "steps=3"]), "may be overridden")


def test_diverged_run_is_one_line_with_status_1(tmp_path, capsys, monkeypatch):
    from mmpos.runner import runner

    def boom(*a, **k):
        raise runner.TrainingDiverged("none seed 0: the training loss became nan at step 3")

    monkeypatch.setattr("mmpos.runner.sweep.train_run", boom)
    assert main(["run", "quickstart", *_SMOKE, "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "failed: none seed 0: the training loss became nan" in err
