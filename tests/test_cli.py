"""The ``mmpos`` command: list, info, run, cp (``python -m mmpos.cli`` runs in tests/recipes/test_ddp.py).

Also: every user mistake is one line on stderr with exit status 2; argument order; diverged runs
and failed writes (status 1); Ctrl-C (status 130, the ``--resume`` command); start-up without torch.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from torch import nn

import mmpos
from mmpos.cli import main
from mmpos.runner import Task, list_recipes, register_task

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
    assert "no config.yaml in it" in capsys.readouterr().err


def test_list_recipes_shows_every_shipped_recipe_with_its_description(capsys):
    assert main(["list", "recipes"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["name", "description"]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert sorted(rows) == list_recipes()
    description = yaml.safe_load((CONFIGS / "quickstart.yaml").read_text())["description"]
    assert rows["quickstart"].split(None, 1)[1] == description


def test_list_schemes_shows_every_scheme_with_its_encoder_paper_reference_and_families(capsys):
    from mmpos.schemes import SCHEMES

    assert main(["list", "schemes"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[-6:] == ["paper;", "reference;", "Hugging", "Face", "model", "types"]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert sorted(rows) == sorted(SCHEMES)
    for name, scheme in SCHEMES.items():
        name_, axes, encoder, rest = rows[name].split(None, 3)
        assert (name_, axes, encoder) == (name, ",".join(scheme.axes), scheme.encoder)
        fields = rest.split("; ")
        assert fields[:2] == [scheme.paper, scheme.reference]  # every shipped scheme has both
        assert fields[2:] == ([", ".join(scheme.model_types)] if scheme.model_types else [])


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


# ---------------------------------------------------------------------------- one line per mistake, exit status

_SMOKE = ["profile=smoke", "encoders=[none]", "device=cpu", "progress=false"]


def _one_line_error(capsys, code: int, needle: str, status: int = 2) -> str:
    """The exit status, and stderr: one line (after one-line warnings, if any) holding ``needle``."""
    err = capsys.readouterr().err.strip()
    assert code == status, err
    lines = [line for line in err.splitlines() if not line.startswith("mmpos run: warning: ")]
    assert len(lines) == 1 and needle in lines[0], err
    return lines[0]


def test_malformed_yaml(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("task: spatial_relations\nencoders: [none\n")
    _one_line_error(capsys, main(["run", str(bad), "--out", str(tmp_path)]), "not valid YAML (line 3")
    bad.write_bytes(b"task: spatial_relations\nname: caf\xe9\n")  # Latin-1, not UTF-8
    _one_line_error(capsys, main(["run", str(bad), "--out", str(tmp_path)]), f"{bad}: not UTF-8 text")


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
        ("encoders=rope", "'encoders' must be a list, got the single value 'rope'; write encoders=[rope]"),
        ("seeds=3", "write seeds=[3]"),
        ("encoders=[ropee]", "unknown encoder 'ropee' (did you mean 'rope'?)"),
        ("encoders=[../x]", "one folder name inside --out"),
        ("optim.betas=[0.9,x]", "optim.betas' must be a list of two numbers"),
    ],
)
def test_config_mistakes(tmp_path, capsys, override, needle):
    out = tmp_path / "runs"
    _one_line_error(capsys, main(["run", "quickstart", *_SMOKE, override, "--out", str(out)]), needle)
    assert not out.exists() or not any(out.rglob("config.yaml"))  # no half-written run folder


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["run", "quickstart", "--steps", "10"], "write steps=10"),
        (["run", "quickstart", "--steps=10"], "write steps=10"),
        (["run", "quickstart", "--optim.lr", "3e-4"], "write optim.lr=3e-4"),
        (["run", "quickstart", "--outt", "x"], "did you mean --out?"),
        (["lsit"], "invalid choice: 'lsit'"),
        (["cp", "quickstart"], "the following arguments are required: dest"),
        (["list", "recipez"], "invalid choice: 'recipez'"),
    ],
)
def test_argument_mistakes_are_one_line_with_the_fix(capsys, argv, needle):
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own errors: one line too
        code = e.code
    _one_line_error(capsys, code, needle)


def test_warnings_are_one_line_without_a_source_path(tmp_path, capsys):
    args = ["run", "quickstart", *_SMOKE, "encoders=[ropee]", "--out", str(tmp_path)]  # baseline 'none' dropped
    assert main(args) == 2
    err = capsys.readouterr().err.splitlines()
    warning = [line for line in err if "warning" in line]
    assert warning and all(line.startswith("mmpos run: warning: ") for line in warning), err
    assert not any(".py:" in line for line in err), err
    assert len(err) == len(warning) + 1  # the warnings, then the one-line error


def test_out_is_a_file(tmp_path, capsys):
    (tmp_path / "f").write_text("")
    _one_line_error(capsys, main(["run", "quickstart", *_SMOKE, "--out", str(tmp_path / "f")]), "is a file")


def test_damaged_checkpoints_and_resume_argument_orders(tmp_path, capsys):
    args = ["run", "quickstart", *_SMOKE, "name=r", "--out", str(tmp_path)]
    assert main(args) == 0
    folder = tmp_path / "quickstart" / "r"
    pair = folder / "none" / "seed0"
    (pair / "final.json").unlink()
    capsys.readouterr()
    assert main(["run", "quickstart", "--resume", str(folder), "progress=false"]) == 0  # recipe, then overrides
    assert (pair / "final.json").exists()
    assert main(["run", "--resume", str(folder), "progress=false"]) == 0  # no recipe at all
    _one_line_error(capsys, main(["run", "vit_spatial", "--resume", str(folder)]), "not 'vit_spatial'")
    _one_line_error(capsys, main(["run", "--resume", str(folder), "steps=3"]), "may be overridden")
    _one_line_error(capsys, main(["run", "--resume", str(pair)]), f"the run folder above it is {folder}")
    (pair / "final.json").unlink()
    for name in ("last.pt", "prev.pt"):
        (pair / name).write_bytes(b"not a checkpoint")
    err = _one_line_error(capsys, main(["run", "--resume", str(folder)]), "no checkpoint can be trusted")
    assert "last.pt is damaged" in err and "prev.pt is damaged" in err
    text = (folder / "config.yaml").read_text()
    (folder / "config.yaml").write_text(text[: len(text) // 2])
    _one_line_error(capsys, main(["run", "--resume", str(folder)]), f"{folder / 'config.yaml'} is damaged")


def test_diverged_run_is_one_line_with_status_1(tmp_path, capsys, monkeypatch):
    from mmpos.runner import train

    def boom(*a, **k):
        raise train.TrainingDiverged("none seed 0: the training loss became nan at step 3")

    monkeypatch.setattr("mmpos.runner.sweep.train_run", boom)
    assert main(["run", "quickstart", *_SMOKE, "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "failed: none seed 0: the training loss became nan" in err


# ---------------------------------------------------------------------------- Ctrl-C and failed writes in a run

_SIGNAL = {"at": None, "sent": None}


@register_task("cli_toy", defaults={})
def _cli_toy(cfg, encoder, seed, device) -> Task:
    model = nn.Linear(4, 2)
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(32, 4, generator=g), torch.randint(2, (32,), generator=g)

    def train_batch(step):
        if _SIGNAL["at"] == step:
            _SIGNAL["sent"] = step
            os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C: Python raises KeyboardInterrupt here
        return x, y

    def evaluate(m):
        return {"acc": (m(x).argmax(-1) == y).float().mean().item()}

    return Task(model, train_batch, lambda m, b: F.cross_entropy(m(b[0]), b[1]), evaluate, metric="acc")


def _toy_recipe(tmp_path: Path) -> Path:
    path = tmp_path / "toy.yaml"
    path.write_text("task: cli_toy\nsteps: 8\neval_every: 2\nencoders: [none]\ndevice: cpu\nprogress: false\n")
    return path


def test_ctrl_c_prints_the_resume_command_and_exits_130(tmp_path, capsys):
    # Python's own Ctrl-C handler, as a user's `mmpos run` has it, whatever this test worker ran before (one CI run
    # on 2 workers saw the interrupted run finish with status 0; the cause was not found)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _ctrl_c_run_and_resume(tmp_path, capsys)
    finally:
        signal.signal(signal.SIGINT, previous)


def _ctrl_c_run_and_resume(tmp_path, capsys):
    recipe = _toy_recipe(tmp_path)
    _SIGNAL["at"], _SIGNAL["sent"] = 5, None  # after the checkpoints of steps 2 and 4
    try:
        code = main(["run", str(recipe), "name=c", "--out", str(tmp_path / "runs")])
    finally:
        _SIGNAL["at"] = None
    assert _SIGNAL["sent"] == 5, "the run never asked for step 5's batch"
    folder = tmp_path / "runs" / "toy" / "c"
    err = _one_line_error(capsys, code, f"interrupted; continue the run with: mmpos run --resume {folder}", 130)
    assert "Traceback" not in err
    assert main(["run", "--resume", str(folder)]) == 0  # the printed command works
    assert (folder / "none" / "seed0" / "final.json").exists()
    _SIGNAL["at"] = 0  # before anything was saved: the folder is removed, nothing to resume
    try:
        code = main(["run", str(recipe), "name=d", "--out", str(tmp_path / "runs")])
    finally:
        _SIGNAL["at"] = None
    _one_line_error(capsys, code, "interrupted before anything was saved; nothing to resume", 130)
    assert not (tmp_path / "runs" / "toy" / "d").exists()


def test_a_full_disk_is_one_line_with_status_1_and_the_run_resumes(tmp_path, capsys, monkeypatch):
    from mmpos.runner import train

    real = torch.save

    def full(obj, f):
        if obj["step"] == 4:
            raise OSError(28, os.strerror(28))
        real(obj, f)

    monkeypatch.setattr(train.torch, "save", full)
    code = main(["run", str(_toy_recipe(tmp_path)), "name=f", "--out", str(tmp_path / "runs")])
    folder = tmp_path / "runs" / "toy" / "f"
    err = _one_line_error(capsys, code, "mmpos run: failed: no space left on device while writing", 1)
    assert err.endswith(f"; once fixed, continue with: mmpos run --resume {folder}")
    assert not [p for p in folder.rglob("*") if ".tmp" in p.name]
    monkeypatch.setattr(train.torch, "save", real)
    assert main(["run", "--resume", str(folder)]) == 0


# ---------------------------------------------------------------------------- start-up without torch

NO_TORCH = """
import sys, time
t0 = time.perf_counter()
from mmpos.cli import main
for argv in (["--help"], ["run", "--help"], ["list", "recipes"], ["cp", "quickstart", {dest!r}]):
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    assert code == 0, argv
heavy = sorted(m for m in ("torch", "numpy", "mmpos.coords", "mmpos.runner.train") if m in sys.modules)
assert heavy == [], heavy
print("seconds", time.perf_counter() - t0)
"""


def test_help_list_recipes_and_cp_do_not_import_torch(tmp_path):
    code = NO_TORCH.format(dest=str(tmp_path / "q.yaml"))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "q.yaml").exists() and "usage: mmpos" in proc.stdout


LAZY_IMPORT = """
import sys, mmpos
assert "torch" not in sys.modules
print(mmpos.Coords.__name__, mmpos.FrequencyPlan.__name__, mmpos.rotary.__name__, len(mmpos.list_encoders()) > 0)
"""


def test_import_mmpos_is_lazy_but_complete():
    proc = subprocess.run([sys.executable, "-c", LAZY_IMPORT], capture_output=True, text=True, timeout=120, check=False)
    assert proc.stdout.split() == ["Coords", "FrequencyPlan", "mmpos.rotary", "True"], proc.stderr[-2000:]
    assert all(hasattr(mmpos, n) for n in mmpos.__all__) and set(mmpos.__all__) <= set(dir(mmpos))
