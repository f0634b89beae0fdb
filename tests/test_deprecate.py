"""Deprecation: the helpers of :mod:`mmpos._deprecate` (for renames after a release) and the pre-release aliases that are gone."""

import warnings

import pytest

from mmpos._deprecate import module_aliases, renamed_arguments


def test_module_aliases_and_renamed_arguments_on_their_own():
    """The helpers kept for renames after a release: each warning names the new name and the removal release."""
    getattr_ = module_aliases(
        __name__, {"old_helper": "test_module_aliases_and_renamed_arguments_on_their_own"}, remove_in="0.3.0"
    )
    with pytest.warns(DeprecationWarning, match=r"old_helper is deprecated and will be removed in mmpos 0\.3\.0; use"):
        assert getattr_("old_helper") is test_module_aliases_and_renamed_arguments_on_their_own
    with pytest.raises(AttributeError, match="has no attribute 'other'"):
        getattr_("other")

    @renamed_arguments("0.3.0", old="new")
    def f(x, new=0):
        return x + new

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert f(1, new=2) == 3
    with pytest.warns(
        DeprecationWarning, match=r"f\(old=...\) is deprecated and will be removed in mmpos 0\.3\.0; use new="
    ):
        assert f(1, old=2) == 3
    with pytest.raises(TypeError, match="both new= and its deprecated name old="):
        f(1, new=2, old=2)
    with pytest.raises(ValueError, match="remove_in must be a release"):
        renamed_arguments("soon", old="new")
    with pytest.raises(ValueError, match="remove_in must be a release"):
        module_aliases(__name__, {}, remove_in=None)


@pytest.mark.parametrize(
    ("module", "old"),
    [
        ("mmpos.encoders.rope", "Rope1d"),
        ("mmpos.encoders.rope_nd", "AxialRope"),
        ("mmpos.encoders.rope_nd", "MixedRope"),
        ("mmpos.encoders.mrope", "MRope"),
        ("mmpos.encoders.mrope", "MHRope"),
    ],
)
def test_pre_release_class_aliases_are_gone(module, old):
    """Nothing was released with these names: no alias is kept (the CHANGELOG lists the renames)."""
    import importlib

    with pytest.raises(AttributeError, match=f"has no attribute '{old}'"):
        getattr(importlib.import_module(module), old)


def test_pre_release_argument_aliases_are_gone():
    from mmpos import create
    from mmpos.encoders.irpe import IRPE, bucket_ids
    from mmpos.viz.maps import extrapolation_maps

    with pytest.raises(TypeError, match="skip"):
        IRPE(head_dim=8, skip=0)
    with pytest.raises(ValueError, match="takes no argument 'skip'"):
        create("irpe-product-ctx-k", head_dim=8, skip=0)
    with pytest.raises(TypeError, match="prefix"):
        bucket_ids((3, 4), "product", 1.9, prefix=1)
    with pytest.raises(TypeError, match="prefix"):
        extrapolation_maps(create("rope-axial", head_dim=16), (3, 4), (1, 1), prefix=1)
