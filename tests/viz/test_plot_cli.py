import subprocess
import sys

import pytest

from mmpos.cli import main as mmpos_main
from mmpos.viz.cli import main

PNG = b"\x89PNG\r\n\x1a\n"


def _png(path):
    data = path.read_bytes()
    assert data.startswith(PNG) and len(data) < 100_000
    return data


CLI_OK = [
    ["similarity", "--encoder", "rope-axial", "--grid", "14x14", "--query", "7,7", "--dim", "64"],
    [
        "similarity",
        "--encoder",
        "irpe",
        "--grid",
        "6x6",
        "--query",
        "0,0",
        "--num-prefix-tokens",
        "1",
        "--random-init",
        "--set",
        "mode=bias",
        "--head",
        "all",
        "--dim",
        "32",
    ],
    ["extrapolation", "--encoder", "rope-mixed", "--grid", "5x5", "--query", "2,2", "--dim", "32"],
    ["plan", "--encoder", "mrope-i"],
    ["layout", "--scheme", "vrope", "text:5,video:2x4x6,text:3"],
    ["layout", "--scheme", "qwen2-vl,v2pe", "text:2,image:4x4,text:1", "--delta", "0.5"],
]


@pytest.mark.parametrize("argv", CLI_OK, ids=lambda a: a[0] + "-" + a[2])
def test_cli_writes_the_figure(tmp_path, capsys, argv):
    out = tmp_path / "fig.png"
    assert main([*argv, "-o", str(out)]) == 0
    _png(out)
    assert "wrote" in capsys.readouterr().out


CLI_BAD = [
    ["similarity", "--encoder", "nope", "--grid", "4x4", "--query", "1,1"],
    ["similarity", "--encoder", "rope-axial", "--grid", "4x4", "--query", "9,1"],
    ["similarity", "--encoder", "rope-axial", "--grid", "4xa", "--query", "1,1"],
    ["similarity", "--encoder", "rope-axial", "--grid", "4x4"],
    ["similarity", "--encoder", "rope-axial", "--grid", "4x4", "--query", "1,1", "--set", "bogus=1"],
    ["plan", "--encoder", "sincos"],
    ["layout", "--scheme", "vrope", "text:5,audio:3"],
    ["layout", "--scheme", "nope", "text:5"],
    ["bogus"],
]


@pytest.mark.parametrize("argv", CLI_BAD, ids=lambda a: "-".join(a[:2]))
def test_cli_mistake_is_one_line_and_status_2(tmp_path, capsys, argv):
    try:
        status = main([*argv, "-o", str(tmp_path / "x.png")])
    except SystemExit as e:  # argparse
        status = e.code
    assert status == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mmpos plot") and "\n" not in err
    assert not (tmp_path / "x.png").exists()


def test_mmpos_plot_goes_through_the_main_cli(tmp_path, capsys):
    out = tmp_path / "plan.png"
    assert mmpos_main(["plot", "plan", "--encoder", "rope-axial", "-o", str(out)]) == 0
    _png(out)
    assert mmpos_main(["plot", "--help"]) == 0
    assert "similarity" in capsys.readouterr().out
    assert mmpos_main(["plot", "plan", "--encoder", "sincos", "-o", str(out)]) == 2


def test_mmpos_plot_loads_matplotlib_only_when_plotting():
    code = "import sys, mmpos.cli; mmpos.cli._parser(); print('matplotlib' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
        == "False"
    )
