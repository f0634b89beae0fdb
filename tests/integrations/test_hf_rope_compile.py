"""The decoding steps of a ``use_rope``-swapped tiny Qwen2.5-VL read no tensor on the host: the whole model's step
traces with ``torch.compile(fullgraph=True)`` through a backend that refuses host reads
(:func:`test_hf_rope_age_compile._no_sync_backend`), with a ``DynamicCache`` and a ``StaticCache``, and gives the
logits of one eager forward over the generated sequence: one rotation for every head (vrope, grape-i) and per-head
angles through the projection hooks (mhrope). (A dynamic scaling rule rescales by the current call's
length, so its cached steps are not a longer full forward: its compile check is test_hf_rope_scaling's.)"""

import pytest
import torch

transformers = pytest.importorskip("transformers")
from test_hf_rope_age import _inputs, _model
from test_hf_rope_age_compile import assert_compiled_decoding_is_a_full_forward

from mmpos.integrations.hf_rope import use_rope

pytestmark = pytest.mark.hf
#: (scheme, options, cache): one rotation for every head, with either cache, and per-head angles (mhrope)
SWAPS = [
    ("vrope", {}, "static"),
    ("grape-i", {}, "dynamic"),
    ("mhrope", {"head_sections": [0, 1, 1]}, "static"),
]


@torch.no_grad()
@pytest.mark.parametrize("scheme, options, kind", SWAPS, ids=[f"{s}-{k}" for s, _, k in SWAPS])
def test_swapped_decoding_compiles_without_host_reads_and_equals_a_full_forward(scheme, options, kind):
    model, inputs = _model("qwen2.5-vl"), _inputs("qwen2.5-vl")
    use_rope(model, scheme, **options)
    assert_compiled_decoding_is_a_full_forward(model, inputs, kind)
