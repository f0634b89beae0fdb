"""The ``mmpos`` command: list, info, run, cp (``python -m mmpos.cli`` runs in tests/recipes/test_ddp.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import mmpos
from mmpos.cli import main
from mmpos.runner import list_recipes

CONFIGS = Path(mmpos.__file__).parents[1] / "recipes" / "configs"


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


def test_list_recipes_shows_every_shipped_recipe_with_its_description(capsys):
    assert main(["list", "recipes"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["name", "description"]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert sorted(rows) == list_recipes()
    description = yaml.safe_load((CONFIGS / "quickstart.yaml").read_text())["description"]
    assert rows["quickstart"].split(None, 1)[1] == description


def test_cp_copies_a_shipped_recipe_and_refuses_to_overwrite(tmp_path, capsys):
    dest = tmp_path / "mine.yaml"
    assert main(["cp", "quickstart", str(dest)]) == 0
    assert dest.read_text() == (CONFIGS / "quickstart.yaml").read_text()  # comments and all
    assert f"mmpos run {dest}" in capsys.readouterr().out
    dest.write_text("task: mine\n")
    assert main(["cp", "quickstart", str(dest)]) == 2
    err = capsys.readouterr().err
    assert err == f"mmpos cp: error: {dest} exists; add --force to overwrite it\n"
    assert dest.read_text() == "task: mine\n"
    assert main(["cp", "quickstart", str(dest), "--force"]) == 0
    assert dest.read_text() == (CONFIGS / "quickstart.yaml").read_text()
    assert main(["cp", "vit_spatial", str(tmp_path)]) == 0  # into a folder: keeps the recipe's name
    assert (tmp_path / "vit_spatial.yaml").read_text() == (CONFIGS / "vit_spatial.yaml").read_text()


def test_cp_copy_runs_as_a_user_recipe(tmp_path, capsys):
    dest = tmp_path / "mine.yaml"
    assert main(["cp", "quickstart", str(dest)]) == 0
    args = ["profile=smoke", "encoders=[none]", "device=cpu", "progress=false", "name=mine", "--out", str(tmp_path)]
    assert main(["run", str(dest), *args]) == 0
    assert (tmp_path / "mine" / "mine" / "results.md").exists()  # run folder named after the file


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["cp", "quickstrat", "x.yaml"], "mmpos cp: error: no shipped recipe 'quickstrat'; did you mean 'quickstart'?"),
        (["cp", "quickstart", "no/such/folder/x.yaml"], "mmpos cp: error: folder no/such/folder does not exist"),
        (["run", "quickstrat"], "mmpos run: error: no recipe 'quickstrat': not a file, and no shipped recipe"),
    ],
)
def test_cli_mistakes_are_one_line_with_exit_status_2(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1, err


def test_bad_subcommand_arguments_exit_2():
    for argv in (["list", "recipez"], ["cp", "quickstart"], ["frobnicate"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2, argv


HEAVY = ("timm", "torchvision", "open_clip", "transformers", "torch_geometric")

LAZY_CHECK = """
import sys
from mmpos.cli import main
heavy = {heavy!r}
loaded = lambda: sorted(m for m in heavy if m in sys.modules)
assert loaded() == [], ("import mmpos.cli", loaded())
for argv in (["list", "recipes"], ["info"], ["cp", "quickstart", {dest!r}], ["list"]):
    assert main(argv) == 0, argv
    assert loaded() == [], (argv, loaded())
"""


def test_cli_commands_load_no_model_library(tmp_path):
    """``mmpos list``, ``list recipes``, ``info`` and ``cp`` answer without importing timm, open_clip, transformers."""
    code = LAZY_CHECK.format(heavy=HEAVY, dest=str(tmp_path / "q.yaml"))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "q.yaml").exists()
