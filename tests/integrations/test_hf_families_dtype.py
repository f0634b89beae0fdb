"""The family front ends (mmpos.integrations.hf_families) return position ids in the dtype of ``input_ids`` (as the
models do) and refuse, with :func:`mmpos._arrays.ids_in_dtype`'s error, ids that dtype cannot hold: nothing wraps
around silently.

HunYuan-VL's ids are bounded by the row length ``L`` and the batch's image count ``K`` (an index among a row's
tokens, a row or column of an image, the image's index in the batch), GLM-Image's by ``L``: int32 cannot overflow
without a batch of more than 2**31 tokens (8 GiB of int32 ids) or images, so the refusal is shown on int16 / int8
ids, the same check on the smallest batches that reach it. MiniCPM-V 4.7 returns int64 whatever ``input_ids``'
dtype (transformers' ``MiniCPMV4_7Model.get_rope_index`` builds ``torch.long`` ids)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from mmpos.integrations.hf_families import glm_image_rope_index, hunyuan_vl_rope_index, minicpmv4_7_rope_index

IMAGE = 3  # token ids below 127: the same batch in every integer dtype


def _hunyuan(sections=(16, 16, 16, 16)):
    return SimpleNamespace(
        model_type="hunyuan_vl",
        image_token_id=IMAGE,
        vision_config=SimpleNamespace(spatial_merge_size=2),
        text_config=SimpleNamespace(rope_parameters={"mrope_section": list(sections)}),
    )


def _refused(value: int, dtype: torch.dtype) -> str:
    return rf"position ids reach {value}, beyond the range of input_ids' dtype {dtype} "


@pytest.mark.parametrize("sections", [(16, 16, 16, 16), (20, 22, 22)])
def test_hunyuan_vl_long_row_refused_in_int16(sections):
    """Text only, 40000 tokens: the 1-D position reaches 39999 > 32767."""
    config = _hunyuan(sections)
    ids = torch.full((1, 40000), 50, dtype=torch.int64)
    wide, deltas = hunyuan_vl_rope_index(config, ids)
    assert wide.dtype == torch.int64 and int(wide.max()) == 39999 and wide[:, 0, -1].tolist() == [39999] * len(sections)
    narrow, narrow_deltas = hunyuan_vl_rope_index(config, ids.to(torch.int32))
    assert narrow.dtype == narrow_deltas.dtype == torch.int32
    assert torch.equal(narrow, wide.to(torch.int32)) and torch.equal(narrow_deltas, deltas.to(torch.int32))
    with pytest.raises(ValueError, match=_refused(39999, torch.int16)):
        hunyuan_vl_rope_index(config, ids.to(torch.int16))
    mask = torch.ones_like(ids)
    mask[0, :7232] = 0  # left padding: 32768 real tokens, the last at 32767 (fits)
    ok, _ = hunyuan_vl_rope_index(config, ids.to(torch.int16), attention_mask=mask)
    assert ok.dtype == torch.int16 and int(ok.max()) == 32767
    mask[0, 7231] = 1  # one more real token: 32768
    with pytest.raises(ValueError, match=_refused(32768, torch.int16)):
        hunyuan_vl_rope_index(config, ids.to(torch.int16), attention_mask=mask)


def test_hunyuan_vl_image_index_refused_in_int8():
    """130 samples of one image each (a 1 x 1 merged grid: a token and its newline): the image index counts the
    batch's images, up to 129 > 127, in rows of 2 tokens (rope_deltas: the largest id + 1 - 2)."""
    config = _hunyuan()
    ids = torch.full((130, 2), IMAGE, dtype=torch.int64)
    grid = torch.tensor([[1, 2, 2]]).repeat(130, 1)
    wide, deltas = hunyuan_vl_rope_index(config, ids, grid)
    assert wide[3, :, 0].tolist() == list(range(130)) and deltas.view(-1).tolist() == [0] + list(range(129))
    with pytest.raises(ValueError, match=_refused(129, torch.int8)):
        hunyuan_vl_rope_index(config, ids.to(torch.int8), grid)
    narrow, narrow_deltas = hunyuan_vl_rope_index(config, ids[:127].to(torch.int8), grid[:127])  # up to 126: fits
    assert narrow.dtype == torch.int8 and torch.equal(narrow, wide[:, :127].to(torch.int8))
    assert torch.equal(narrow_deltas, deltas[:127].to(torch.int8))


def test_glm_image_long_row_refused_in_int16():
    config = SimpleNamespace(model_type="glm_image", image_start_token_id=1, image_end_token_id=2, image_token_id=IMAGE)
    ids = torch.full((2, 33000), 50, dtype=torch.int64)
    mask = torch.ones_like(ids)
    mask[1, :1000] = 0
    wide, deltas = glm_image_rope_index(config, ids, attention_mask=mask)
    assert wide[:, 0, -1].tolist() == [32999] * 3 and wide[:, 1, -1].tolist() == [31999] * 3
    assert deltas.dtype == torch.int64 and deltas.tolist() == [[0], [0]]
    narrow, narrow_deltas = glm_image_rope_index(config, ids.to(torch.int32), attention_mask=mask)
    assert narrow.dtype == narrow_deltas.dtype == torch.int32 and torch.equal(narrow, wide.to(torch.int32))
    with pytest.raises(ValueError, match=_refused(32999, torch.int16)):
        glm_image_rope_index(config, ids.to(torch.int16), attention_mask=mask)
    ok, ok_deltas = glm_image_rope_index(config, ids[:, :32768].to(torch.int16))  # up to 32767: fits
    assert ok.dtype == ok_deltas.dtype == torch.int16 and int(ok.max()) == 32767


def test_minicpmv4_7_ids_are_int64_in_every_dtype():
    """As the reference: int64 ids from int16 input_ids, past int16's range (40000 text tokens)."""
    names = ("image_token_id", "video_token_id", "slice_start_id", "slice_end_id", "image_start_id", "image_end_id")
    config = SimpleNamespace(model_type="minicpmv4_7", downsample_mode="16x", newline_id=9)
    for k, name in enumerate(names):
        setattr(config, name, 3 + k)
    ids = torch.full((1, 40000), 50, dtype=torch.int16)
    pos, deltas = minicpmv4_7_rope_index(config, ids)
    assert pos.dtype == deltas.dtype == torch.int64 and pos[:, 0, -1].tolist() == [39999] * 3
