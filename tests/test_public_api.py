import importlib
import inspect

import pytest

import mmpos

DOCUMENTED = [
    "mmpos.coords", "mmpos.rotary", "mmpos.layout", "mmpos.registry", "mmpos.encoders", "mmpos.nn",
    "mmpos.layers", "mmpos.integrations", "mmpos.integrations.timm", "mmpos.integrations.open_clip",
    "mmpos.integrations.checkpoint", "mmpos.integrations.hf", "mmpos.recipes",
]


def test_top_level_names_resolve():
    for name in mmpos.__all__:
        assert hasattr(mmpos, name), name


@pytest.mark.parametrize("module", DOCUMENTED)
def test_documented_modules_export_what_they_list(module):
    mod = importlib.import_module(module)
    for name in getattr(mod, "__all__", []):
        assert hasattr(mod, name), f"{module}.{name}"


@pytest.mark.parametrize("info", mmpos.list_encoders(), ids=lambda i: i.name)
def test_every_encoder_cites_its_paper_and_states_shapes(info):
    """The registry entry names a paper; the encoder's module docstring links it and gives shapes."""
    assert info.kind in ("none", "additive", "conv", "rotary", "bias") and info.paper
    if info.kind == "none":
        return
    doc = inspect.getmodule(info.factory).__doc__ + (info.factory.__doc__ or "")
    assert "arxiv.org" in doc.lower(), info.name
    assert "shape" in doc.lower() or "(B, " in doc, info.name
