"""The public surface: docs/api.md, the modules' ``__all__`` and the encoder registry agree."""

import importlib
import inspect
import pathlib
import re
import subprocess
import sys

import pytest

import mmpos

API_MD = (pathlib.Path(__file__).parents[1] / "docs" / "api.md").read_text()
# documented modules: the page's ``## `mmpos.x` `` headings and the integration table's rows
DOCUMENTED = re.findall(r"^## `(mmpos[\w.]*)`", API_MD, re.MULTILINE) + re.findall(
    r"^\| `(mmpos\.integrations\.\w+)` \|", API_MD, re.MULTILINE
)
API_WORDS = set(re.findall(r"[A-Za-z_]\w*", API_MD))


def test_api_page_documents_the_package_and_its_subpackages():
    for module in ("mmpos", "mmpos.layout", "mmpos.schemes", "mmpos.nn", "mmpos.graph", "mmpos.integrations.pyg"):
        assert module in DOCUMENTED, module


def test_api_page_lists_every_public_integration_module():
    folder = pathlib.Path(mmpos.__file__).parent / "integrations"
    public = {f"mmpos.integrations.{p.stem}" for p in folder.glob("*.py") if not p.stem.startswith("_")}
    assert public - set(DOCUMENTED) == set()


def test_top_level_names_resolve():
    for name in mmpos.__all__:
        assert hasattr(mmpos, name), name


@pytest.mark.parametrize("module", DOCUMENTED)
def test_documented_modules_export_what_they_list_and_the_page_names_it(module):
    mod = importlib.import_module(module)
    for name in getattr(mod, "__all__", []):
        assert hasattr(mod, name), f"{module}.{name} is in __all__ but does not exist"
        assert name in API_WORDS, f"{module}.{name} is exported but docs/api.md does not name it"


def test_importing_mmpos_loads_no_optional_integration():
    code = (
        "import sys, mmpos, mmpos.integrations; "
        "print(sorted(m for m in ('transformers', 'open_clip') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("info", mmpos.list_encoders(), ids=lambda i: i.name)
def test_every_encoder_cites_its_paper_and_states_shapes(info):
    """The registry entry names a paper; the encoder's module docstring links it and gives shapes."""
    assert info.kind in ("none", "additive", "conv", "rotary", "bias") and info.paper
    if info.kind == "none":
        return
    doc = inspect.getmodule(info.factory).__doc__ + (info.factory.__doc__ or "")
    assert "arxiv.org" in doc.lower(), info.name
    assert "shape" in doc.lower() or "(B, " in doc, info.name


def test_media_names_resolve():
    """Every name in ``mmpos.media.__all__`` exists."""
    from mmpos import media

    assert all(hasattr(media, name) for name in media.__all__)
