"""Renamed public names: each old name still works, warns (``DeprecationWarning``) and names the new one."""

import importlib
import warnings

import pytest

from mmpos._deprecate import module_aliases, renamed_arguments

CLASS_RENAMES = [
    ("mmpos.encoders.rope", "Rope1d", "RoPE1d"),
    ("mmpos.encoders.rope_nd", "AxialRope", "AxialRoPE"),
    ("mmpos.encoders.rope_nd", "MixedRope", "MixedRoPE"),
    ("mmpos.encoders.mrope", "MRope", "MRoPE"),
    ("mmpos.encoders.mrope", "MRopeInterleaved", "MRoPEInterleaved"),
    ("mmpos.encoders.mrope", "MHRope", "MHRoPE"),
    ("mmpos.encoders.mrope", "VRope", "VRoPE"),
]


@pytest.mark.parametrize(("module", "old", "new"), CLASS_RENAMES, ids=[r[1] for r in CLASS_RENAMES])
def test_old_class_name_warns_and_is_the_new_class(module, old, new):
    mod = importlib.import_module(module)
    assert new in mod.__all__ and old not in mod.__all__
    with pytest.warns(DeprecationWarning, match=rf"{module}\.{old} is deprecated; use {module}\.{new}"):
        alias = getattr(mod, old)
    assert alias is getattr(mod, new)


def test_from_import_of_an_old_name_warns_at_the_import_line():
    with pytest.warns(DeprecationWarning) as record:
        from mmpos.encoders.rope import Rope1d  # noqa: F401
    assert record[0].filename == __file__


def test_new_class_names_do_not_warn_and_unknown_names_still_fail():
    mod = importlib.import_module("mmpos.encoders.mrope")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert mod.MRoPE.__name__ == "MRoPE"
    with pytest.raises(AttributeError, match="has no attribute 'Mrope'"):
        mod.Mrope  # noqa: B018


def test_module_aliases_and_renamed_arguments_on_their_own():
    getattr_ = module_aliases(__name__, {"old_helper": "test_module_aliases_and_renamed_arguments_on_their_own"})
    with pytest.warns(DeprecationWarning):
        assert getattr_("old_helper") is test_module_aliases_and_renamed_arguments_on_their_own

    @renamed_arguments(old="new")
    def f(x, new=0):
        return x + new

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert f(1, new=2) == 3
    with pytest.warns(DeprecationWarning, match=r"f\(old=...\) is deprecated; use new="):
        assert f(1, old=2) == 3
    with pytest.raises(TypeError, match="both new= and its deprecated name old="):
        f(1, new=2, old=2)


def test_irpe_skip_is_now_num_prefix_tokens():
    import torch

    from mmpos import create
    from mmpos.encoders.irpe import IRPE, bucket_ids, num_buckets

    with pytest.warns(DeprecationWarning, match=r"IRPE\(skip=...\) is deprecated; use num_prefix_tokens="):
        old = IRPE(head_dim=8, skip=0)
    assert old.num_prefix_tokens == 0 and old.num_buckets == IRPE(head_dim=8, num_prefix_tokens=0).num_buckets
    with pytest.warns(DeprecationWarning, match="use num_prefix_tokens="):  # registry check lets the old name through
        preset = create("irpe-product-ctx-k", head_dim=8, skip=0)
    assert preset.num_prefix_tokens == 0
    with pytest.raises(ValueError, match="takes no argument 'skp'"):
        create("irpe", head_dim=8, skp=0)
    with pytest.warns(DeprecationWarning, match=r"bucket_ids\(prefix=...\)"):
        ids, size = bucket_ids((3, 4), "product", 1.9, prefix=1)
    new_ids, new_size = bucket_ids((3, 4), "product", 1.9, num_prefix_tokens=1)
    assert torch.equal(ids, new_ids) and size == new_size
    with pytest.warns(DeprecationWarning, match=r"num_buckets\(prefix=...\)"):
        assert num_buckets("product", 1.9, prefix=1) == new_size


def test_viz_prefix_is_now_num_prefix_tokens():
    from mmpos import create
    from mmpos.viz.maps import extrapolation_maps

    enc = create("rope-axial", head_dim=16)
    new = extrapolation_maps(enc, (3, 4), (1, 1), num_prefix_tokens=1)[0]
    with pytest.warns(DeprecationWarning, match=r"extrapolation_maps\(prefix=...\)"):
        old = extrapolation_maps(enc, (3, 4), (1, 1), prefix=1)[0]
    assert old.num_prefix_tokens == new.num_prefix_tokens == 1 and old.values.equal(new.values)
    with pytest.warns(DeprecationWarning, match="use SimilarityMap.num_prefix_tokens"):
        assert new.prefix == 1
