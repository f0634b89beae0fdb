"""The ``mmpos`` command: list, info, run (``python -m mmpos.cli`` runs in tests/recipes/test_ddp.py)."""

from __future__ import annotations

import mmpos
from mmpos.cli import main


def test_list_shows_every_encoder_with_kind_and_paper(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for info in mmpos.list_encoders():
        assert any(line.split()[:2] == [info.name, info.kind] and info.paper in line for line in out.splitlines())


def test_info_shows_versions_and_device(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert f"mmpos            {mmpos.__version__}" in out
    assert "torch" in out and "timm" in out and "device" in out


def test_run_smoke_and_resume(tmp_path, capsys):
    args = ["run", "quickstart", "profile=smoke", "encoders=[none,rope]", "device=cpu", "progress=false", "name=cli"]
    assert main([*args, "--out", str(tmp_path)]) == 0
    folder = tmp_path / "quickstart" / "cli"
    assert (folder / "results.md").read_text() in capsys.readouterr().out
    assert (folder / "results.png").exists() and (folder / "rope" / "seed0" / "last.pt").exists()
    assert main(["run", "quickstart", "--resume", str(folder)]) == 0  # finished runs are kept as they are
    assert (folder / "results.md").read_text() in capsys.readouterr().out


def test_run_errors_are_one_line_messages(tmp_path, capsys):
    assert main(["run", "quickstart", "stepz=3", "--out", str(tmp_path)]) == 2
    assert "unknown config key 'stepz'; did you mean 'steps'?" in capsys.readouterr().err
    assert main(["run", "no-such-recipe"]) == 2
    assert "no recipe 'no-such-recipe'" in capsys.readouterr().err
    assert main(["run", "quickstart", "--resume", str(tmp_path)]) == 2
    assert "no config.yaml" in capsys.readouterr().err
