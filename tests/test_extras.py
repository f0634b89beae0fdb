"""mmpos._extras: a missing optional package is one clear ImportError naming it and the extra."""

import subprocess
import sys

import pytest

from mmpos._extras import PACKAGES, requires


def test_a_missing_optional_package_names_the_package_and_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "timm", None)  # `import timm` now raises ModuleNotFoundError
    with (
        pytest.raises(
            ModuleNotFoundError, match=r"^timm is not installed; .* 'timm' extra: pip install 'mmpos-torch\[timm\]'$"
        ),
        requires("timm"),
    ):
        import timm  # noqa: F401


def test_a_submodule_of_a_missing_package_is_reported_by_its_top_level_name(monkeypatch):
    for name in ("torch_geometric", "torch_geometric.data"):  # as if never installed, even if another test imported it
        monkeypatch.setitem(sys.modules, name, None)
    message = r"^torch-geometric is not installed; .*\[graph\]'$"
    with pytest.raises(ModuleNotFoundError, match=message), requires("graph"):
        from torch_geometric.data import Data  # noqa: F401


def test_other_import_errors_pass_unchanged():
    with pytest.raises(ModuleNotFoundError, match="No module named 'no_such_module_xyz'"), requires("timm"):
        import no_such_module_xyz  # noqa: F401


def test_every_optional_package_is_an_extra_of_the_project():
    tomllib = pytest.importorskip("tomllib")
    from pathlib import Path

    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
    declared = " ".join(str(v) for extra in project["optional-dependencies"].values() for v in extra)
    assert project["dependencies"] == ["torch>=2.5", "numpy"]
    for package in PACKAGES.values():
        assert package in declared, package


def test_the_core_imports_without_the_extras():
    """``import mmpos`` and a rotary encoder with attention, with every optional package hidden."""
    hidden = ", ".join(repr(m) for m in PACKAGES)
    code = (
        f"import sys\nfor m in ({hidden},): sys.modules[m] = None\n"
        "import torch, mmpos\n"
        "from mmpos.nn import attention\n"
        "rope = mmpos.create('rope-axial', dim=64, num_heads=4)\n"
        "coords = mmpos.Coords.grid(4, 4, batch=2)\n"
        "q = k = v = torch.randn(2, 4, 16, 16)\n"
        "print(tuple(attention(q, k, v, coords, encoders=[rope]).shape))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "(2, 4, 16, 16)"
