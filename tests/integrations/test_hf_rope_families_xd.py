"""``use_rope`` on the families whose vision tokens end every merged row with a newline token, positioned by
:mod:`mmpos.integrations.hf_families` (XD-RoPE): HunYuan-VL (``N = len(mrope_section)`` rows of position ids, its
sections cutting the channels of ``cos`` / ``sin``) and HY-V4-VL (MLA attention, a token indexer, images and
videos). The model's own scheme through mmpos reproduces the unpatched logits and greedy ``generate`` bit for bit;
a swapped scheme runs a cached ``generate`` equal to a full forward. Tiny random configs built from each family's
config class; transformers 4.57.1 lacks both (skipped with the reason)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from _tiny_hf import TEXT as TINY_TEXT
from _tiny_hf import assert_own_scheme_is_exact, assert_swap_is_consistent, reloaded_in_bfloat16, vision_batch

from mmpos.integrations.hf_rope import current_rope, use_rope

pytestmark = pytest.mark.hf
IMG, VID, START, END, NEWLINE = 120, 121, 122, 123, 124
SUPPRESS = [IMG, VID, START, END, NEWLINE]
TEXT = dict(TINY_TEXT, pad_token_id=0, bos_token_id=1, eos_token_id=2)  # ids inside the tiny vocabulary
#: a HunYuan-VL / HY-V4-VL vision tower: 2 x 2 patches of 3 x 2 x 2 values merged into one token
VISION = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_attention_heads": 2,
    "num_hidden_layers": 1,
    "patch_size": 2,
    "spatial_merge_size": 2,
    "max_image_size": 16,
    "out_hidden_size": 64,
}
SWAPS = [
    ("mrope-i", {}),
    ("vrope", {}),
    ("v2pe", {"delta": 0.25}),
    ("hope", {"temporal_scale": 0.75}),
    ("videorope", {}),
    ("qwen2-vl", {}),
    ("flat", {}),
]


def _need(cls):
    if not hasattr(transformers, cls):
        pytest.skip(f"transformers {transformers.__version__} has no {cls} (added in a later release)")


# ------------------------------------------------------------------------- HunYuan-VL
#: N = 3, 4, 5 rows; head_dim 16 (8 rotary pairs)
SECTIONS = {"n3": [2, 3, 3], "n4": [2, 2, 2, 2], "n5": [2, 2, 2, 1, 1]}


def _hunyuan(section, **rope):
    _need("HunYuanVLForConditionalGeneration")
    text = dict(
        TEXT,
        head_dim=16,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": section, **rope},
    )
    cfg = transformers.HunYuanVLConfig(
        text_config=text, vision_config=VISION, image_token_id=IMG, im_start_id=START, im_end_id=END
    )
    torch.manual_seed(0)
    return transformers.HunYuanVLForConditionalGeneration(cfg).eval()


def _hunyuan_batch():
    """Two left-padded prompts, a 4 x 6- and a 4 x 4-patch image: 2 x (3 + 1) and 2 x (2 + 1) tokens (a newline per
    merged row), each run with its 2 boundary tokens (the image tokens the processor writes)."""
    first = [5, 6] + [IMG] * (8 + 2) + [7, 30, 9, 10]
    second = [11] + [IMG] * (6 + 2) + [12, 13]
    return vision_batch(first, second, [[1, 4, 6], [1, 4, 4]], row=12, image_id=IMG)


@pytest.fixture(scope="module", params=list(SECTIONS))
def hunyuan(request):
    return _hunyuan(SECTIONS[request.param])


@torch.no_grad()
def test_hunyuan_vl_own_scheme_gives_the_model_logits(hunyuan):
    """N rows, chunks of ``2 * section[k]`` channels reading row k: the two channels of a rotary pair may read
    different rows, as the model's ``recomposition_frequencies`` lays them."""
    assert_own_scheme_is_exact(hunyuan, _hunyuan_batch(), "hunyuan-vl", SUPPRESS)


@torch.no_grad()
@pytest.mark.parametrize("scheme, options", [*SWAPS, ("mhrope", {"head_sections": [0, 1, 1]})], ids=lambda v: str(v))
def test_hunyuan_vl_swapped_scheme_cached_generate(hunyuan, scheme, options):
    """The image blocks in tokens (newline column included), the boundary tokens as text; the scheme's three rows in
    the model's last three."""
    assert_swap_is_consistent(hunyuan, _hunyuan_batch(), scheme, options, SUPPRESS)


@torch.no_grad()
def test_hunyuan_vl_text_prompts_keep_the_model_logits(hunyuan):
    """On text every row holds the 1-D position: every scheme is 1-D RoPE there."""
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11], [0, 0, 3, 4, 5, 6, 7]])
    inputs = {"input_ids": ids, "attention_mask": (ids != 0).long()}
    use_rope(hunyuan, "own")
    ref = hunyuan(**inputs).logits
    for scheme in ("hunyuan-vl", "mrope-i", "vrope", "flat"):
        use_rope(hunyuan, scheme)
        assert torch.equal(hunyuan(**inputs).logits, ref), scheme
    use_rope(hunyuan, "own")


@torch.no_grad()
def test_hunyuan_vl_ntk_alpha():
    """The checkpoints' ``rope_type "dynamic"`` with a fixed ``alpha`` (transformers' ``ntk_alpha``: theta stretched by
    ``alpha ** (d / (d - 2))``, static) under ``scaling="own"``: the own scheme exact, a swapped scheme consistent."""
    model = _hunyuan(SECTIONS["n4"], rope_type="dynamic", alpha=1000.0, factor=1.0)
    assert model.model.language_model.rotary_emb.rope_type == "ntk_alpha"
    assert_own_scheme_is_exact(model, _hunyuan_batch(), "hunyuan-vl", SUPPRESS)
    assert_swap_is_consistent(model, _hunyuan_batch(), "mrope-i", {}, SUPPRESS)


def test_hunyuan_vl_errors():
    model = _hunyuan(SECTIONS["n4"])
    with pytest.raises(ValueError, match="scaling must be None on model_type 'hunyuan_vl'"):
        use_rope(model, "hunyuan-vl", scaling={"rule": "linear", "factor": 2.0})
    assert current_rope(model) == "own"
    with pytest.raises(ValueError, match="delta"):
        use_rope(model, "v2pe", delta=2.0)
    with pytest.raises(ValueError, match="delta applies only to schemes"):  # not silently dropped on the own scheme
        use_rope(model, "hunyuan-vl", delta=0.5)
    with pytest.raises(ValueError, match="advance applies to another scheme's blocks"):
        use_rope(model, "hunyuan-vl", advance="max")
    assert current_rope(model) == "own"
    use_rope(model, "mrope-i")
    inputs = _hunyuan_batch()
    inputs["image_grid_thw"] = torch.tensor([[1, 4, 6], [1, 4, 8]])  # the second run holds 8 tokens, not 10 or 12
    with pytest.raises(ValueError, match="image_grid_thw: image 1 holds 10 tokens .* holds 8"):
        model.model.get_rope_index(
            inputs["input_ids"], inputs["mm_token_type_ids"], inputs["image_grid_thw"], inputs["attention_mask"]
        )


def test_hunyuan_vl_mutation_pairs_instead_of_channels():
    """The own rotation read as pairs (chunked M-RoPE over (w, h, image)) is not the model's: the per-channel plan is
    what makes the own-scheme test pass (N = 3, where the pair reading is a well-formed plan)."""
    from mmpos.integrations import hf_rope

    model = _hunyuan(SECTIONS["n3"])
    inputs = _hunyuan_batch()
    with torch.no_grad():
        ref = model(**inputs).logits
        old = hf_rope._CHANNEL_SECTIONS
        hf_rope._CHANNEL_SECTIONS = ()
        try:
            use_rope(model, "hunyuan-vl")
            assert not torch.allclose(model(**inputs).logits, ref)
        finally:
            hf_rope._CHANNEL_SECTIONS = old
            use_rope(model, "own")


# ------------------------------------------------------------------------- HY-V4-VL
def _hy_v4_vl(index_topk):
    """MLA attention (a rotary slice of 16 channels per head, one shared rotary key head), hyper-connections and a
    token indexer keeping ``index_topk`` keys (it scores them with the same cos / sin)."""
    _need("HYV4VLForConditionalGeneration")
    text = dict(
        TEXT,
        moe_intermediate_size=32,
        n_routed_experts=4,
        num_experts_per_tok=2,
        q_lora_rank=32,
        kv_lora_rank=16,
        qk_nope_head_dim=8,
        qk_rope_head_dim=16,
        v_head_dim=16,
        index_topk=index_topk,
        index_head_dim=16,
        index_n_heads=2,
        hc_mult=2,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [4, 2, 2]},
    )
    cfg = transformers.HYV4VLConfig(text_config=text, vision_config=VISION, image_token_id=IMG, video_token_id=VID)
    torch.manual_seed(0)
    return transformers.HYV4VLForConditionalGeneration(cfg).eval()


def _hy_v4_vl_batch():
    """Two left-padded prompts: a 4 x 6-patch image (2 x (3 + 1) tokens, a newline per merged row) then a 2-frame
    4 x 4-patch video (2 x 2 x (2 + 1)); a 4 x 4-patch image (2 x 3)."""
    first = [5, 6] + [IMG] * 8 + [7, 30] + [VID] * 12 + [9, 10]
    second = [11] + [IMG] * 6 + [12, 13]
    return vision_batch(first, second, [[1, 4, 6], [1, 4, 4]], [[2, 4, 4]], row=12, image_id=IMG, video_id=VID)


@pytest.fixture(scope="module")
def hy_v4_vl():
    """index_topk 64: the indexer keeps every key, so that a cached decode equals a full forward (with fewer keys
    the model's own cached decode differs from its full forward, by ~4e-3 on this config)."""
    return _hy_v4_vl(64)


@torch.no_grad()
@pytest.mark.parametrize("index_topk", [4, 64])
def test_hy_v4_vl_own_scheme_gives_the_model_logits(index_topk):
    model = _hy_v4_vl(index_topk)  # 4: the indexer selects keys by scores from mmpos's cos / sin
    assert_own_scheme_is_exact(model, _hy_v4_vl_batch(), "hy-v4-vl", SUPPRESS)


@torch.no_grad()
@pytest.mark.parametrize("family", ["hunyuan_vl", "hy_v4_vl"])
def test_own_scheme_in_bfloat16(family, tmp_path):
    """Loaded with ``from_pretrained(..., dtype=torch.bfloat16)`` (the rotary's ``inv_freq`` stays float32, as
    mmpos's plan): the own scheme is exact in bfloat16 too."""
    model, inputs, own = (
        (_hunyuan(SECTIONS["n4"]), _hunyuan_batch(), "hunyuan-vl")
        if family == "hunyuan_vl"
        else (_hy_v4_vl(4), _hy_v4_vl_batch(), "hy-v4-vl")
    )
    model = reloaded_in_bfloat16(model, tmp_path)
    inputs = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in inputs.items()}
    assert_own_scheme_is_exact(model, inputs, own, SUPPRESS)


@torch.no_grad()
@pytest.mark.parametrize("scheme, options", SWAPS, ids=[s for s, _ in SWAPS])
def test_hy_v4_vl_swapped_scheme_cached_generate(hy_v4_vl, scheme, options):
    assert_swap_is_consistent(hy_v4_vl, _hy_v4_vl_batch(), scheme, options, SUPPRESS)


def test_hy_v4_vl_refuses_mhrope(hy_v4_vl):
    """Its indexer (and MLA's one shared rotary key head) take the shared cos / sin: no per-head rotation."""
    with pytest.raises(ValueError, match="scheme 'mhrope' cannot reach HYV4VLAttention"):
        use_rope(hy_v4_vl, "mhrope", head_sections=[1, 1, 2])
    assert current_rope(hy_v4_vl) == "own"
