"""Encoder registry: names and arguments that do not exist get errors that say what does."""

import pytest

import mmpos
from mmpos.encoders.registry import CONTEXT_KEYS, check_arguments, create_in_model, encoder_info, make_info


def test_misspelled_encoder_name_suggests_the_close_one():
    with pytest.raises(ValueError, match=r"unknown encoder 'rope-axail' \(did you mean 'rope-axial'\?\)"):
        mmpos.create("rope-axail", dim=64, num_heads=4)


def test_unknown_argument_names_the_encoder_and_what_it_takes():
    with pytest.raises(
        ValueError, match=r"encoder 'rope' takes no argument 'thet' \(did you mean 'theta'\?\); it takes"
    ):
        mmpos.create("rope", dim=64, num_heads=4, thet=100.0)
    with pytest.raises(ValueError, match="encoder 'sincos' takes no argument 'colour'; it takes"):
        create_in_model("sincos", {"dim": 64, "num_heads": 4}, colour=1)


def test_context_keys_an_encoder_does_not_take_are_not_errors():
    """Models hand every encoder the same context; only explicit kwargs are checked."""
    enc = create_in_model("rope", {"dim": 64, "num_heads": 4, "grid_size": (4, 4), "layer": 0})
    assert enc is not None
    check_arguments("rope", {"dim": 64, "theta": 10.0})  # accepted arguments pass


# ---------------------------------------------------------------- one record per encoder
def test_list_encoders_filters_by_glob():
    names = [i.name for i in mmpos.list_encoders("rope*")]
    assert names == ["rope", "rope-axial", "rope-mixed"]
    assert [i.name for i in mmpos.list_encoders("irpe-*-k")] == sorted(
        n for n in (i.name for i in mmpos.list_encoders()) if n.startswith("irpe-") and n.endswith("-k")
    )
    assert mmpos.list_encoders("nothing*") == []
    with pytest.raises(TypeError, match="pattern must be a glob string"):
        mmpos.list_encoders(3)


def test_kind_is_read_from_the_class_and_checked():
    for info in mmpos.list_encoders():
        if info.kind == "none":
            assert info.cls is None
        else:
            assert info.cls is not None and info.cls.kind == info.kind, info.name
    from mmpos.encoders.rope import RoPE1d

    with pytest.raises(ValueError, match="disagrees with the class's kind 'rotary'"):
        make_info("x", RoPE1d, "-", kind="bias")
    with pytest.raises(ValueError, match="cannot read its kind"):
        make_info("x", lambda dim: None, "-")
    assert make_info("x", lambda dim: None, "-", kind="additive").kind == "additive"


def test_records_carry_what_the_outer_parts_read():
    learned = encoder_info("learned")
    assert learned.static_grid and learned.abs_table == "pos_embed" and learned.prefix_rows
    assert learned.context["prefix_rows"] == "num_prefix_tokens" and learned.no_weight_decay == ("*",)
    assert encoder_info("irpe").static_grid and encoder_info("irpe-cross-ctx-k").static_grid
    assert not encoder_info("sincos").static_grid
    assert encoder_info("rope").shared and encoder_info("rope-axial").shared and encoder_info("mrope").shared
    assert not encoder_info("rope-mixed").shared and not encoder_info("irpe").shared
    assert {i.name for i in mmpos.list_encoders() if i.mrope_section} >= {"mrope", "mrope-i", "hope"}
    assert not encoder_info("vrope").mrope_section
    assert "num_prefix_tokens" not in encoder_info("irpe").context.values()  # iRPE keeps its own default
    for info in mmpos.list_encoders():
        assert set(info.context) <= set(CONTEXT_KEYS), info.name


def test_shared_encoder_with_parameters_is_refused(monkeypatch):
    from mmpos.encoders import registry
    from mmpos.encoders.registry import model_context
    from mmpos.encoders.rope_nd import MixedRoPE
    from mmpos.nn.placement import Placement

    registry._load()
    monkeypatch.setitem(registry._REGISTRY, "wrong", make_info("wrong", MixedRoPE, "-", shared=True))
    with pytest.raises(ValueError, match="registered shared=True .* but has parameters"):
        Placement("wrong", None, model_context(32, 4, 2, axes=("h", "w"))).shared()
    with pytest.raises(ValueError, match="only rotary encoders"):
        make_info("x", encoder_info("irpe").factory, "-", shared=True)


def test_context_keys_are_checked():
    with pytest.raises(ValueError, match="context keys must be among"):
        create_in_model("rope", {"dim": 64, "num_heads": 4, "colour": 1})
    with pytest.raises(ValueError, match="context must map keys"):
        make_info("x", encoder_info("rope").factory, "-", context={"dim": "width"})


@pytest.mark.parametrize("info", mmpos.list_encoders(), ids=lambda i: i.name)
def test_every_record_names_its_paper_and_reference_implementation(info):
    assert info.paper
    if info.kind != "none":
        repo, _, where = info.reference.partition(" ")
        assert repo.count("/") == 1 and where, f"{info.name}: reference must be 'owner/repo path/to/file'"
