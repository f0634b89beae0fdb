"""The one grammar of a recipe's ``encoders:`` entries (``mmpos.runner.tasks.parse_encoders``)."""

import pathlib

import pytest
import torch

from mmpos.runner.config import load_yaml
from mmpos.runner.tasks import NUMBER, EncoderSpec, encoder_names, parse_encoders
from recipes.tasks.multimodal import parse_scheme
from recipes.tasks.vision import build_vit_finetune

CONFIGS = pathlib.Path(__file__).parents[2] / "recipes" / "configs"


def test_the_three_forms_parse_into_items():
    assert parse_encoders("learned+irpe") == EncoderSpec("learned+irpe", (("learned", None), ("irpe", None)))
    assert parse_encoders(" rope-axial + peg ").names == ["rope-axial", "peg"]
    spec = parse_encoders("v2pe@rand", {"v2pe": ("rand", NUMBER)}, combine=False)
    assert spec.items == (("v2pe", "rand"),) and spec.variant == "rand"
    assert parse_encoders("v2pe@0.0625", {"v2pe": ("rand", NUMBER)}).variant == "0.0625"
    whole = parse_encoders("learned+irpe@scratch", ("scratch",), whole_run=True)
    assert whole.names == ["learned", "irpe"] and whole.variant == "scratch"
    assert encoder_names("none") == ["none"]


@pytest.mark.parametrize(
    ("entry", "kwargs", "message"),
    [
        ("a+", {}, r"encoders entry 'a\+': each item must be 'name' or 'name@variant', got ''"),
        ("a@", {}, r"each item must be 'name' or 'name@variant', got 'a@'"),
        ("rope@x", {}, r"encoders entry 'rope@x': 'rope@x' is not accepted; this task takes 'rope' without '@'"),
        ("peg@fast", {"variants": ("scratch",)}, r"'peg@fast' is not accepted; this task takes 'peg@scratch'"),
        ("v2pe@small", {"variants": {"v2pe": ("rand", NUMBER)}}, r"takes 'v2pe@rand', 'v2pe@<number>'"),
        ("v2pe@nan", {"variants": {"v2pe": (NUMBER,)}}, r"'v2pe@nan' is not accepted"),
        ("hope@1+v2pe", {"variants": (NUMBER,), "combine": False}, r"takes one name, not several joined by '\+'"),
        ("learned@scratch+irpe", {"variants": ("scratch",), "whole_run": True}, r"write it once, after 'irpe'"),
    ],
)
def test_bad_entries_get_one_line_naming_the_entry_and_what_is_accepted(entry, kwargs, message):
    with pytest.raises(ValueError, match=message) as err:
        parse_encoders(entry, **kwargs)
    assert "\n" not in str(err.value) and repr(entry) in str(err.value)


def _task_parser(task: str):
    """The parse the task's own builder applies to one ``encoders:`` entry."""
    from recipes.tasks import v2pe_recall, validate_vision

    if task in ("vlm_grounding", "v2pe_long", "video_temporal"):
        return parse_scheme
    if task in ("vit_finetune", "digits_vit_finetune"):  # "<enc>@scratch": the same model from scratch
        return lambda entry: parse_encoders(entry, ("scratch",), whole_run=True)
    variants = {
        "tpe_neighbours": ({"2d-tpe": ("anneal",)}, False),
        "temporal_copy": ({"hope": (NUMBER,)}, False),
        "v2pe_recall": (v2pe_recall._VARIANTS, False),
    }
    if task.startswith("validate_vision"):
        return lambda entry: parse_encoders(entry, validate_vision._VARIANTS)
    if task in variants:
        accepted, combine = variants[task]
        return lambda entry: parse_encoders(entry, accepted, combine=combine)
    return parse_encoders


def test_every_shipped_recipe_entry_still_parses_for_its_task():
    """The recipes' YAMLs keep working unchanged: each task's own parser accepts every entry."""
    seen = 0
    for path in sorted(CONFIGS.glob("*.yaml")):
        cfg = load_yaml(path)
        entries = list(cfg.get("encoders") or []) + [cfg["baseline"]] * ("baseline" in cfg)
        for profile in (cfg.get("profiles") or {}).values():
            entries += list((profile or {}).get("encoders") or [])
        parse = _task_parser(cfg["task"])
        for entry in entries:
            parse(entry)
            seen += 1
    assert seen > 20


def test_vit_finetune_refuses_other_variants_before_building():
    with pytest.raises(ValueError, match="'peg@fast' is not accepted; this task takes 'peg@scratch'"):
        build_vit_finetune({}, "peg@fast", 0, torch.device("cpu"))
    with pytest.raises(ValueError, match=r"v2pe@small.*'v2pe@rand', 'v2pe@<number>'"):
        parse_scheme("v2pe@small")
