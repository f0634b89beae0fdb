"""Encoder registry: names and arguments that do not exist get errors that say what does."""

import pytest

import mmpos
from mmpos.encoders.registry import check_arguments, create_in_model


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
