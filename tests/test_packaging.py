"""Packaging: shipped recipes as package data, one version, license files, changelog.

The wheel itself is built and run outside the checkout by ``.ci/wheel_check.sh`` (``make test``).
"""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import pytest

import mmpos
import recipes
from mmpos.runner import config, find_recipe, list_recipes, packages

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = Path(recipes.__file__).parent / "configs"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_version_is_defined_once_and_read_by_the_build():
    project = PYPROJECT["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "mmpos.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+(\.dev\d+|rc\d+)?", mmpos.__version__)
    defined = [p for p in (ROOT / "mmpos").rglob("*.py") if re.search(r"^__version__\s*=", p.read_text(), re.MULTILINE)]
    assert defined == [ROOT / "mmpos" / "__init__.py"]
    # the installed metadata (editable install here, the wheel in CI) carries the same version
    assert importlib.metadata.version("mmpos-torch") == mmpos.__version__


def test_changelog_has_unreleased_on_top_and_a_section_for_this_version():
    headings = re.findall(r"^## (.+)$", (ROOT / "CHANGELOG.md").read_text(), re.MULTILINE)
    assert headings[0] == "Unreleased"
    assert any(h.split()[0] == mmpos.__version__ for h in headings[1:]), headings


def test_license_and_notice_are_declared_and_shipped():
    project = PYPROJECT["project"]
    assert project["license"] == "Apache-2.0"  # SPDX expression (PEP 639)
    assert set(project["license-files"]) >= {"LICENSE", "NOTICE"}
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert (
        "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text and "END OF TERMS AND CONDITIONS" in text
    )
    assert all(f"{i}. " in text for i in range(1, 10))  # the nine sections
    assert importlib.metadata.metadata("mmpos-torch")["License-Expression"] == "Apache-2.0"
    notice = (ROOT / "NOTICE").read_text()
    assert "WO2024094893A1" in notice and "magnetic-Laplacian" in notice


def test_recipes_are_package_data_found_by_a_glob():
    assert PYPROJECT["tool"]["setuptools"]["package-data"]["recipes"] == ["configs/*.yaml"]
    assert list_recipes() == sorted(p.stem for p in CONFIGS.glob("*.yaml"))
    assert "quickstart" in list_recipes()


def _recipe_package(root: Path, name: str, recipes: dict[str, str], tasks: dict[str, str] | None = None) -> None:
    """A recipe package ``name`` under ``root``: ``configs/<recipe>.yaml`` and ``tasks/<module>.py``."""
    (root / name / "configs").mkdir(parents=True)
    (root / name / "__init__.py").write_text("")
    for stem, text in recipes.items():
        (root / name / "configs" / f"{stem}.yaml").write_text(text)
    if tasks is not None:
        (root / name / "tasks").mkdir()
        (root / name / "tasks" / "__init__.py").write_text("")
        for module, text in tasks.items():
            (root / name / "tasks" / f"{module}.py").write_text(text)


def test_the_shipped_recipe_package_is_registered_by_entry_point():
    assert PYPROJECT["project"]["entry-points"]["mmpos.recipes"] == {"recipes": "recipes"}
    assert "recipes" in packages.recipe_packages()


def test_a_new_yaml_in_the_configs_folder_is_a_recipe_with_no_registration(tmp_path, monkeypatch):
    _recipe_package(
        tmp_path, "my_recipes", {"mine": 'description: "My own task: one line."\ntask: spatial_relations\n'}
    )
    (tmp_path / "my_recipes" / "configs" / "notes.txt").write_text("not a recipe\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(packages, "recipe_packages", lambda: ["my_recipes"])
    assert list_recipes() == ["mine"]
    assert config.recipe_description("mine") == "My own task: one line."
    mine = tmp_path / "my_recipes" / "configs" / "mine.yaml"
    assert find_recipe("mine") == mine == find_recipe("mine.yaml")
    with pytest.raises(FileNotFoundError, match=r"no recipe 'notes': not a file, and no shipped recipe .*\['mine'\]"):
        find_recipe("notes")


def test_a_recipe_package_of_ones_own_adds_recipes_and_tasks(tmp_path, monkeypatch):
    task = (
        "from mmpos.runner.tasks import register_task\n\n"
        "@register_task('own_task')\n"
        "def build(cfg, encoder, seed, device):\n"
        "    raise NotImplementedError\n"
    )
    _recipe_package(tmp_path, "own_recipes", {"own": "task: own_task\n"}, {"own": task})
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(packages, "recipe_packages", lambda: ["own_recipes", "recipes"])
    assert "own" in list_recipes() and "quickstart" in list_recipes()
    from mmpos.runner.tasks import get_task

    assert get_task("own_task").name == "own_task"


def test_a_recipe_name_shipped_twice_is_an_error_naming_both_packages(tmp_path, monkeypatch):
    _recipe_package(tmp_path, "dup_recipes", {"quickstart": "task: spatial_relations\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(packages, "recipe_packages", lambda: ["dup_recipes", "recipes"])
    with pytest.raises(config.ConfigError, match="'quickstart' is shipped by two recipe packages: 'dup_recipes' and"):
        list_recipes()


def test_shipped_recipe_is_found_from_any_folder_and_a_path_wins(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert find_recipe("quickstart") == CONFIGS / "quickstart.yaml"
    (tmp_path / "quickstart").write_text("task: spatial_relations\n")  # a file of that name in the cwd is a path
    assert find_recipe("quickstart") == Path("quickstart")


@pytest.mark.parametrize("name", list_recipes())
def test_every_shipped_recipe_has_a_one_line_description_and_smoke_cpu_gpu_profiles(name):
    raw = config.load_yaml(CONFIGS / f"{name}.yaml")
    assert isinstance(raw.get("description"), str) and raw["description"].strip(), f"{name}: add description:"
    assert "\n" not in raw["description"].strip()  # `mmpos list recipes` shows one line per recipe
    for profile in ("smoke", "cpu", "gpu"):  # tests, a CPU run, one modern GPU in minutes (DESIGN.md)
        assert profile in (raw.get("profiles") or {}), f"{name}: add a {profile} profile"
