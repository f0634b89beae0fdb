"""Figures of runs: loss curves read from metrics.jsonl, the results figure, accuracy against resolution."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mmpos.runner.plots import loss_curves, main, plot_resolution, plot_results


def _finals(rows):
    return [
        {"encoder": e, "seed": s, "metrics": m, "metric": "acc", "higher_is_better": True, "seconds": 1.0, "params": 1}
        for e, s, m in rows
    ]


def _log(folder: Path, encoder: str, seed: int, records: list[dict]) -> None:
    run = folder / encoder / f"seed{seed}"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


FINALS = _finals([("none", 0, {"acc": 0.3}), ("none", 1, {"acc": 0.2}), ("rope", 0, {"acc": 0.9})])


def _folder(tmp_path: Path) -> Path:
    _log(tmp_path, "none", 0, [{"step": 2, "loss": 1.5, "lr": 0.1}, {"step": 4, "loss": 1.0, "lr": 0.1},
                               {"step": 4, "eval": {"acc": 0.3}}])  # fmt: skip
    _log(tmp_path, "none", 1, [{"step": 2, "loss": 1.3, "lr": 0.1}, {"step": 4, "loss": 1.4, "lr": 0.1}])
    _log(tmp_path, "rope", 0, [{"step": 2, "loss": 0.5, "lr": 0.1}, {"step": 4, "loss": 0.25, "lr": 0.1}])
    return tmp_path


def test_loss_curves_read_every_seed(tmp_path):
    curves = loss_curves(_folder(tmp_path), FINALS)
    steps, losses = curves["none"]
    assert steps.tolist() == [2, 4] and losses.tolist() == [[1.5, 1.0], [1.3, 1.4]]  # (seeds, steps)
    assert np.allclose(losses.mean(0), [1.4, 1.2]) and losses.min(0).tolist() == [1.3, 1.0]
    assert curves["rope"][1].tolist() == [[0.5, 0.25]]


def test_an_encoder_with_a_missing_log_is_left_out(tmp_path):
    folder = _folder(tmp_path)
    (folder / "none" / "seed1" / "metrics.jsonl").unlink()
    assert set(loss_curves(folder, FINALS)) == {"rope"}


def test_results_figure_has_a_loss_panel_when_the_logs_exist(tmp_path):
    with_curves = plot_results(FINALS, tmp_path / "a.png", "t", _folder(tmp_path / "run"))
    bars_only = plot_results(FINALS, tmp_path / "b.png", "t")
    assert with_curves.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # bars panel 5 in + curves panel 5 in wide, at 120 dpi; bars alone 5 in
    assert Image.open(with_curves).size[0] == 1200 and Image.open(bars_only).size[0] == 600


def test_results_figure_draws_the_tasks_chance_level(tmp_path):
    """A dotted grey line at the chance value: the pixels of the bars figure change where it runs."""
    plain = np.asarray(Image.open(plot_results(FINALS, tmp_path / "a.png")).convert("L"), dtype=float)
    chance = [dict(f, chance=0.25) for f in FINALS]
    lined = np.asarray(Image.open(plot_results(chance, tmp_path / "b.png")).convert("L"), dtype=float)
    assert plain.shape == lined.shape
    rows = np.flatnonzero(np.abs(plain - lined).sum(1) > 0)
    assert rows.size > 0  # the line (and its legend entry) were drawn


def test_task_chance_must_be_a_finite_number():
    from mmpos.runner.tasks import Task

    with pytest.raises(ValueError, match="Task.chance must be a finite number or None, got nan"):
        Task(model=None, train_batch=None, loss=None, evaluate=None, metric="acc", chance=float("nan"))


RESOLUTION = _finals(
    [
        (e, s, {"acc": a, "acc@1.5x": a - 0.1, "acc@2x": a - 0.2, "acc@2x:image": a})
        for e, s, a in [("learned", 0, 0.9), ("learned", 1, 0.8), ("rope", 0, 0.95)]
    ]
)


def test_plot_resolution_and_its_command_line(tmp_path, capsys):
    assert plot_resolution(RESOLUTION, tmp_path / "r.png", chance=0.25).read_bytes()[:4] == b"\x89PNG"
    assert plot_resolution(RESOLUTION, tmp_path / "i.png", "image").is_file()
    with pytest.raises(ValueError, match="acc@<s>x:interp"):
        plot_resolution(RESOLUTION, tmp_path / "x.png", "interp")
    run = tmp_path / "vit_spatial" / "cpu"
    run.mkdir(parents=True)
    (run / "results.json").write_text(json.dumps(RESOLUTION))
    assert main([str(run), str(tmp_path / "cli.png"), "image", "--chance", "0.25"]) == 0
    assert (tmp_path / "cli.png").is_file() and "cli.png" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path), str(tmp_path / "no.png")])
    assert e.value.code == 2 and "results.json does not exist" in capsys.readouterr().err
