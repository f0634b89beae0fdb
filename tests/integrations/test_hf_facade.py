import pytest

from mmpos.integrations import hf, hf_rope, hf_rope_index

pytestmark = pytest.mark.hf


def test_facade_exposes_the_documented_names():
    assert hf.get_rope_index is hf_rope_index.get_rope_index
    assert hf.use_rope is hf_rope.use_rope
    assert set(hf.__all__) <= set(dir(hf))
