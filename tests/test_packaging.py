"""Packaging: shipped recipes as package data, one version, license files, changelog.

The wheel itself is built and run outside the checkout by ``.ci/wheel_check.sh`` (``make test``).
"""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import pytest

import mmpos
from mmpos.recipes import config, find_recipe, list_recipes

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = Path(mmpos.__file__).parent / "recipes" / "configs"
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
    assert PYPROJECT["tool"]["setuptools"]["package-data"]["mmpos.recipes"] == ["configs/*.yaml"]
    assert list_recipes() == sorted(p.stem for p in CONFIGS.glob("*.yaml"))
    assert "quickstart" in list_recipes()


def test_a_new_yaml_in_the_configs_folder_is_a_recipe_with_no_registration(tmp_path, monkeypatch):
    (tmp_path / "mine.yaml").write_text('description: "My own task: one line."\ntask: spatial_relations\n')
    (tmp_path / "notes.txt").write_text("not a recipe\n")
    monkeypatch.setattr(config, "_configs", lambda: tmp_path)
    assert list_recipes() == ["mine"]
    assert config.recipe_description("mine") == "My own task: one line."
    assert find_recipe("mine") == tmp_path / "mine.yaml" == find_recipe("mine.yaml")
    with pytest.raises(FileNotFoundError, match=r"no recipe 'notes': not a file, and no shipped recipe .*\['mine'\]"):
        find_recipe("notes")


def test_shipped_recipe_is_found_from_any_folder_and_a_path_wins(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert find_recipe("quickstart") == CONFIGS / "quickstart.yaml"
    (tmp_path / "quickstart").write_text("task: spatial_relations\n")  # a file of that name in the cwd is a path
    assert find_recipe("quickstart") == Path("quickstart")


@pytest.mark.parametrize("name", list_recipes())
def test_every_shipped_recipe_has_a_one_line_description_and_a_smoke_profile(name):
    raw = config.load_yaml(CONFIGS / f"{name}.yaml")
    assert isinstance(raw.get("description"), str) and raw["description"].strip(), f"{name}: add description:"
    assert "\n" not in raw["description"].strip()  # `mmpos list recipes` shows one line per recipe
    assert "smoke" in (raw.get("profiles") or {}), f"{name}: add a smoke profile"
