"""The families with their own token layouts (mmpos.integrations.hf_families): hy_v4_vl, hunyuan_vl
and glm_image. :func:`get_rope_index` (from ``mm_token_type_ids`` and from the token ids) equals
the family's own ``get_rope_index`` of the installed transformers on random batches (several
images and videos per sample, left and right padding); hand-worked examples from the references'
docstrings; bad prompts are refused. transformers 4.57 has none of them (skipped, with the reason)."""

from __future__ import annotations

import importlib
import random
import types
from types import SimpleNamespace

import pytest
import torch

transformers = pytest.importorskip("transformers")
from _hf_samples import MINICPM_IDS

from mmpos import layout
from mmpos.integrations.hf_families import (
    FAMILY_ROPE_INDEX,
    glm_image_decode_position_ids,
    minicpmv4_7_rope_index,
    newline_blocks,
)
from mmpos.integrations.hf_rope_index import get_rope_index, scheme_for_config
from mmpos.schemes import resolve_options, scheme_for_model_type

pytestmark = pytest.mark.hf
CLASSES = {
    "hy_v4_vl": ("HYV4VLConfig", "HYV4VLModel"),
    "hunyuan_vl": ("HunYuanVLConfig", "HunYuanVLModel"),
    "glm_image": ("GlmImageConfig", "GlmImageModel"),
    "minicpmv4_7": ("MiniCPMV4_7Config", "MiniCPMV4_7Model"),
}


def _family(model_type: str, **config_kwargs):
    """``(config, model class)`` of ``model_type`` in the installed transformers (skip if it lacks it)."""
    try:
        cm = importlib.import_module(f"transformers.models.{model_type}.configuration_{model_type}")
        mm = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    except ImportError:
        pytest.skip(f"transformers {transformers.__version__} has no {model_type} (added in a later release)")
    config_name, model_name = CLASSES[model_type]
    return getattr(cm, config_name)(**config_kwargs), getattr(mm, model_name)


def _hunyuan(sections=(16, 16, 16, 16)):
    rope = {"rope_theta": 10000.0, "rope_type": "default", "mrope_section": list(sections)}
    return _family("hunyuan_vl", text_config={"rope_parameters": rope, "head_dim": 2 * sum(sections)})


def _owner(model_cls, config):
    owner = SimpleNamespace(config=config)
    owner.get_vision_position_ids = types.MethodType(model_cls.get_vision_position_ids, owner)
    return owner


def _pad(rows, padding_side):
    """``(B, L)`` ids, types and mask of the ``(ids, types)`` rows, padded on ``padding_side``."""
    length = max(len(r) for r, _ in rows)
    out = [torch.zeros(len(rows), length, dtype=torch.long) for _ in range(3)]
    for i, (r, k) in enumerate(rows):
        cols = slice(0, len(r)) if padding_side == "right" else slice(length - len(r), length)
        out[0][i, cols], out[1][i, cols], out[2][i, cols] = torch.tensor(r), torch.tensor(k), 1
    return out


def _grid(g):
    return torch.tensor(g, dtype=torch.long).view(-1, 3) if g else None


# --------------------------------------------------------------------------- HY-V4-VL
def _hy_batch(rng, config, batch, padding_side):
    m = config.vision_config.spatial_merge_size
    rows, images, videos = [], [], []
    for _ in range(batch):
        ids, kinds = [], []
        for _ in range(rng.randint(0, 4)):
            n = rng.randint(1, 3)
            ids += [rng.randrange(10, 1000) for _ in range(n)]
            kinds += [0] * n
            h, w = m * rng.randint(1, 4), m * rng.randint(1, 4)
            if rng.random() < 0.5:
                images.append((1, h, w))
                k, token, kind = (h // m) * (w // m + 1), config.image_token_id, 1
            else:
                t = rng.randint(1, 3)
                videos.append((t, h, w))
                k, token, kind = t * (h // m) * (w // m + 1), config.video_token_id, 2
            ids += [token] * k
            kinds += [kind] * k
        n = rng.randint(1, 3)
        ids += [rng.randrange(10, 1000) for _ in range(n)]
        kinds += [0] * n
        rows.append((ids, kinds))
    return (*_pad(rows, padding_side), _grid(images), _grid(videos))


@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_hy_v4_vl_equals_the_installed_get_rope_index(padding_side):
    config, model_cls = _family("hy_v4_vl")
    owner = _owner(model_cls, config)
    rng = random.Random(f"hy-{padding_side}")
    for trial in range(12):
        input_ids, mm_types, mask, images, videos = _hy_batch(rng, config, rng.randint(1, 4), padding_side)
        ref_ids, ref_deltas = model_cls.get_rope_index(owner, input_ids, mm_types, images, videos, mask)
        for extra in ({"mm_token_type_ids": mm_types}, {}):
            ids, deltas = get_rope_index(config, input_ids, images, videos, mask, **extra)
            assert torch.equal(ids, ref_ids), (trial, extra.keys())
            assert torch.equal(deltas, ref_deltas), trial


def test_hy_v4_vl_hand_worked_and_build():
    """The reference docstring's example: a 2-frame video of 2 x 2 merged tokens (rows of 3 with the
    newline) after nothing: t 0 x 6, 3 x 6; h 0,0,0,1,1,1,3,3,3,4,4,4; w 0,1,2,0,1,2,3,4,5,3,4,5; text at 6.
    ``layout.build`` gives the same with the grid in tokens, newline column included."""
    config, _ = _family("hy_v4_vl")
    vid = config.video_token_id
    ids = torch.tensor([[vid] * 12 + [11, 12]])
    pos, deltas = get_rope_index(config, ids, video_grid_thw=torch.tensor([[2, 4, 4]]))
    assert pos[0, 0].tolist() == [0] * 6 + [3] * 6 + [6, 7]
    assert pos[1, 0].tolist() == [0, 0, 0, 1, 1, 1, 3, 3, 3, 4, 4, 4, 6, 7]
    assert pos[2, 0].tolist() == [0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7]
    assert deltas.tolist() == [[8 - 14]]
    lay = layout.build([[layout.Video((2, 2, 3)), layout.Text(2)]], "hy-v4-vl", spatial_merge_size=1, rule="hf-5.3")
    assert torch.equal(lay.position_ids, pos) and torch.equal(lay.rope_deltas, deltas)
    with pytest.raises(ValueError, match=r"holds 12 tokens, but its run of placeholder tokens holds 11"):
        get_rope_index(config, ids[:, 1:], video_grid_thw=torch.tensor([[2, 4, 4]]))
    with pytest.raises(ValueError, match="holds 2 grids, but input_ids holds 1 runs of video tokens"):
        get_rope_index(config, ids, video_grid_thw=torch.tensor([[2, 4, 4], [1, 2, 2]]))
    with pytest.raises(ValueError, match="rule must be one of .* transformers 4.57 has no hy_v4_vl"):
        get_rope_index(config, ids, video_grid_thw=torch.tensor([[2, 4, 4]]), rule="hf-4.57")


# --------------------------------------------------------------------------- HunYuan-VL
def _hunyuan_batch(rng, config, batch, padding_side):
    m = config.vision_config.spatial_merge_size
    rows, images = [], []
    for _ in range(batch):
        ids, kinds = [], []
        for _ in range(rng.randint(0, 4)):
            n = rng.randint(1, 3)
            ids += [rng.randrange(10, 1000) for _ in range(n)] + [config.im_start_id]
            kinds += [0] * (n + 1)
            h, w = m * rng.randint(1, 4), m * rng.randint(1, 4)
            images.append((1, h, w))
            k = (h // m) * (w // m + 1) + rng.choice((0, 2))  # with or without the 2 boundary tokens
            ids += [config.image_token_id] * k + [config.im_end_id]
            kinds += [1] * k + [0]
        n = rng.randint(1, 3)
        ids += [rng.randrange(10, 1000) for _ in range(n)]
        kinds += [0] * n
        rows.append((ids, kinds))
    return (*_pad(rows, padding_side), _grid(images))


@pytest.mark.parametrize("sections", [(16, 16, 16, 16), (20, 22, 22), (8, 8, 16, 16, 16)])
@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_hunyuan_vl_equals_the_installed_get_rope_index(padding_side, sections):
    config, model_cls = _hunyuan(sections)
    owner = _owner(model_cls, config)
    rng = random.Random(f"hunyuan-{padding_side}-{sections}")
    for trial in range(10):
        input_ids, mm_types, mask, images = _hunyuan_batch(rng, config, rng.randint(1, 4), padding_side)
        ref_ids, ref_deltas = model_cls.get_rope_index(owner, input_ids, mm_types, images, mask)
        for extra in ({"mm_token_type_ids": mm_types}, {}):
            ids, deltas = get_rope_index(config, input_ids, images, attention_mask=mask, **extra)
            assert ids.shape == (len(sections), *input_ids.shape)
            assert torch.equal(ids, ref_ids), (trial, extra.keys())
            assert torch.equal(deltas, ref_deltas), trial


def test_hunyuan_vl_hand_worked():
    """Text 2, then an image of 1 x 1 merged tokens (a row of 2 with the newline) with its 2 boundary
    tokens, text 1; in a second sample an image without boundary tokens: the image index counts
    across the batch (the reference's)."""
    config, _ = _hunyuan((16, 16, 16, 16))
    img = config.image_token_id
    ids = torch.tensor([[5, 6, img, img, img, img, 7], [5, img, img, 7, 8, 9, 9]])
    mask = torch.tensor([[1] * 7, [1] * 5 + [0, 0]])
    pos, deltas = get_rope_index(config, ids, torch.tensor([[1, 2, 2], [1, 2, 2]]), attention_mask=mask)
    assert pos[:, 0].tolist() == [
        [0, 1, 2, 3, 4, 5, 6],  # the 1-D axis
        [0, 1, 2, 0, 1, 5, 6],  # width: the newline column is column 1
        [0, 1, 2, 0, 0, 5, 6],  # height
        [0, 1, 2, 0, 0, 5, 6],  # image index 0
    ]
    assert pos[:, 1].tolist() == [
        [0, 1, 2, 3, 4, 0, 0],
        [0, 0, 1, 3, 4, 0, 0],
        [0, 0, 0, 3, 4, 0, 0],
        [0, 1, 1, 3, 4, 0, 0],
    ]
    assert deltas.tolist() == [[0], [0]]
    with pytest.raises(ValueError, match=r"holds 2 tokens \(a newline per row\), or 4 with its boundary tokens"):
        get_rope_index(config, ids[:1, :5], torch.tensor([[1, 2, 2]]))
    with pytest.raises(ValueError, match="mrope_section'\\] must hold >= 3 sections"):
        get_rope_index(_hunyuan((32, 32))[0], ids, torch.tensor([[1, 2, 2], [1, 2, 2]]))
    with pytest.raises(ValueError, match="video_grid_thw must be None"):
        get_rope_index(config, ids, video_grid_thw=torch.tensor([[1, 2, 2]]))


@pytest.mark.parametrize("sections", [(16, 16, 16, 16), (20, 22, 22), (8, 8, 16, 16, 16)])
def test_hunyuan_vl_holes_and_images_across_rows(sections):
    """Padding holes (text tokens masked inside a row) and images at the rows' ends and starts (no
    padding: an image ending a row right before one starting the next, in flat order): the installed
    ``get_rope_index`` (with 3 axes a row ending in an image has its largest id on a text token before it),
    and the ``hunyuan-vl`` scheme packed over :func:`newline_blocks` gives the last three rows (the token-id
    path writes its ids itself); int32 ids come back as int32."""
    config, model_cls = _hunyuan(sections)
    owner = _owner(model_cls, config)
    options = resolve_options("hunyuan-vl", rule="hf-5.3")
    rng = random.Random(f"hunyuan-holes-{sections}")
    img, m = config.image_token_id, config.vision_config.spatial_merge_size
    for trial in range(12):
        if trial % 3 == 2:  # every row: an image first and last, text between them, no padding
            parts, grids = [], []
            for _ in range(rng.randint(2, 4)):
                sizes = []
                for _ in range(2):
                    h, w = m * rng.randint(1, 3), m * rng.randint(1, 3)
                    grids.append((1, h, w))
                    sizes.append((h // m) * (w // m + 1) + rng.choice((0, 2)))
                parts.append(sizes)
            length = max(a + b for a, b in parts) + 3
            rows = []
            for a, b in parts:
                text = length - a - b
                rows.append(
                    (
                        [img] * a + [rng.randrange(10, 1000) for _ in range(text)] + [img] * b,
                        [1] * a + [0] * text + [1] * b,
                    )
                )
            input_ids, mm_types, mask = _pad(rows, "left")
            images = _grid(grids)
        else:
            input_ids, mm_types, mask, images = _hunyuan_batch(
                rng, config, rng.randint(1, 4), ("left", "right")[trial % 2]
            )
            holes = (torch.rand(input_ids.shape, generator=torch.Generator().manual_seed(trial)) < 0.2) & (
                mm_types == 0
            )
            mask = mask.masked_fill(holes, 0)
        ref_ids, ref_deltas = model_cls.get_rope_index(owner, input_ids, mm_types, images, mask)
        for dtype in (torch.int64, torch.int32):
            for extra in ({"mm_token_type_ids": mm_types}, {}):
                ids, deltas = get_rope_index(config, input_ids.to(dtype), images, attention_mask=mask, **extra)
                assert ids.dtype == deltas.dtype == dtype
                assert torch.equal(ids.long(), ref_ids), (trial, dtype, extra.keys())
                assert torch.equal(deltas.long(), ref_deltas), (trial, dtype)
        real, blocks = newline_blocks(config, input_ids, images, attention_mask=mask, mm_token_type_ids=mm_types)
        lay = layout.pack(real, blocks, "hunyuan-vl", options)
        assert torch.equal(lay.position_ids, ref_ids[-3:]), trial
        if len(sections) > 3:  # the 1-D axis holds each row's largest text id (pack's text top, its last real token's)
            assert torch.equal(lay.rope_deltas, ref_deltas), trial


# --------------------------------------------------------------------------- GLM-Image
def _glm_image_batch(rng, config, batch, padding_side, with_counts=True):
    rows, grids, per_sample = [], [], []
    for _ in range(batch):
        ids, own = [], []
        for _ in range(rng.randint(0, 3)):  # source images
            n = rng.randint(1, 3)
            ids += [rng.randrange(10, 1000) for _ in range(n)] + [config.image_start_token_id]
            g = (rng.randint(1, 2), rng.randint(1, 4), rng.randint(1, 4))
            own.append(g)
            ids += [config.image_token_id] * (g[0] * g[1] * g[2]) + [config.image_end_token_id]
        n = rng.randint(1, 3)
        ids += [rng.randrange(10, 1000) for _ in range(n)] + [config.image_start_token_id]  # generation starts
        own += [(1, rng.randint(1, 4), rng.randint(1, 4)) for _ in range(rng.randint(1, 2))]  # target grids
        rows.append((ids, [0] * len(ids)))
        grids += own
        per_sample.append(len(own))
    input_ids, _, mask = _pad(rows, padding_side)
    return input_ids, mask, _grid(grids), torch.tensor(per_sample)


@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_glm_image_equals_the_installed_get_rope_index(padding_side):
    config, model_cls = _family("glm_image")
    owner = _owner(model_cls, config)
    rng = random.Random(f"glm-image-{padding_side}")
    for trial in range(12):
        batch = rng.randint(1, 4)
        input_ids, mask, grids, per_sample = _glm_image_batch(rng, config, batch, padding_side)
        ref_ids, ref_deltas = model_cls.get_rope_index(owner, input_ids, grids, per_sample, mask)
        ids, deltas = get_rope_index(config, input_ids, grids, attention_mask=mask, images_per_sample=per_sample)
        assert torch.equal(ids, ref_ids) and torch.equal(deltas, ref_deltas), trial
        decode = glm_image_decode_position_ids(config, input_ids, grids, per_sample, mask)
        assert torch.equal(decode, owner._cached_decode_position_ids), trial
    # one sample without images_per_sample: it reads every grid (the reference's fallback)
    input_ids, mask, grids, _ = _glm_image_batch(rng, config, 1, padding_side)
    ref_ids, _ = model_cls.get_rope_index(owner, input_ids, grids, None, mask)
    assert torch.equal(get_rope_index(config, input_ids, grids, attention_mask=mask)[0], ref_ids)
    assert torch.equal(glm_image_decode_position_ids(config, input_ids, grids), owner._cached_decode_position_ids)


def test_glm_image_hand_worked():
    """Text 1, image start, a 2 x 3 image, image end, text 1, image start (generation): the image at
    (2, 2 + i, 2 + j), the end token at 2 + max(2, 3) = 5; decoding a 1 x 2 target grid at 7."""
    config, _ = _family("glm_image")
    s, e, img = config.image_start_token_id, config.image_end_token_id, config.image_token_id
    ids = torch.tensor([[9, s] + [img] * 6 + [e, 9, s]])
    grids = torch.tensor([[1, 2, 3], [1, 1, 2]])
    pos, deltas = get_rope_index(config, ids, grids, images_per_sample=torch.tensor([2]))
    assert pos[0, 0].tolist() == [0, 1, 2, 2, 2, 2, 2, 2, 5, 6, 7]
    assert pos[1, 0].tolist() == [0, 1, 2, 2, 2, 3, 3, 3, 5, 6, 7]
    assert pos[2, 0].tolist() == [0, 1, 2, 3, 4, 2, 3, 4, 5, 6, 7] and deltas.tolist() == [[0]]
    decode = glm_image_decode_position_ids(config, ids, grids, torch.tensor([2]))
    assert decode.tolist() == [[[8, 8, 10], [8, 8, 10], [8, 9, 10]]]
    with pytest.raises(ValueError, match=r"holds 6 tokens, but 5 tokens lie between its image start and end"):
        get_rope_index(config, torch.cat([ids[:, :7], ids[:, 8:]], 1), grids, images_per_sample=torch.tensor([2]))
    with pytest.raises(ValueError, match="images_per_sample must be >= 0 and sum to the 2 grids"):
        get_rope_index(config, ids, grids, images_per_sample=torch.tensor([3]))
    with pytest.raises(ValueError, match="model_type 'glm_image' reads"):
        get_rope_index(config, ids, grids, video_grid_thw=grids)


def test_families_are_registry_entries():
    for model_type in FAMILY_ROPE_INDEX:
        scheme = scheme_for_model_type(model_type)
        assert scheme.model_types == (model_type,) and scheme.reference.startswith("huggingface/transformers")
    assert scheme_for_config(SimpleNamespace(model_type="hunyuan_vl")) == "hunyuan-vl"
    with pytest.raises(ValueError, match="images_per_sample applies to model_type 'glm_image' only"):
        get_rope_index(SimpleNamespace(model_type="qwen2_vl"), torch.zeros(1, 2, dtype=torch.long), images_per_sample=1)


# --------------------------------------------------------------------------- MiniCPM-V 4.7


def _minicpm():
    config, model_cls = _family("minicpmv4_7", **MINICPM_IDS)
    owner = _owner(model_cls, config)
    owner._group_visual_frames = types.MethodType(model_cls._group_visual_frames, owner)
    owner._frame_end_idx = model_cls._frame_end_idx
    return config, model_cls, owner


def _minicpm_batch(rng, batch, padding_side, merge):
    c = MINICPM_IDS
    rows, sizes, video_sizes = [], [], []
    for _ in range(batch):
        ids, kinds = [], []

        def put(token, kind, n=1, ids=ids, kinds=kinds):
            ids.extend([token] * n)
            kinds.extend([kind] * n)

        def text(n, ids=ids, kinds=kinds):
            ids.extend(rng.randrange(10, 1000) for _ in range(n))
            kinds.extend([0] * n)

        def frame(token, kind, table, rows_cols, same_slices):
            th, tw = rng.randint(1, 4), rng.randint(1, 4)
            table.append((th * merge, tw * merge))
            put(c["image_start_id"], 0)
            put(token, kind, th * tw)
            put(c["image_end_id"], 0)
            r, k = rows_cols
            sh, sw = rng.randint(1, 3), rng.randint(1, 3)
            for row in range(r):
                if row:
                    put(c["newline_id"], 0)
                for _ in range(k):
                    if not same_slices:
                        sh, sw = rng.randint(1, 3), rng.randint(1, 3)
                    table.append((sh * merge, sw * merge))
                    put(c["slice_start_id"], 0)
                    put(token, kind, sh * sw)
                    put(c["slice_end_id"], 0)

        text(rng.randint(1, 4))
        for _ in range(rng.randint(0, 3)):
            shape = rng.choice([(0, 0), (1, 2), (2, 2), (2, 3), (3, 1)])
            if rng.random() < 0.6:
                text(rng.randint(1, 3))  # the image's id, as text
                frame(c["image_token_id"], 1, sizes, shape, same_slices=False)
                if rng.random() < 0.3:  # a second picture right against it (only a newline between): one group
                    put(c["newline_id"], 0)
                    frame(c["image_token_id"], 1, sizes, rng.choice([(0, 0), (1, 2)]), same_slices=False)
            else:
                shape = rng.choice([(0, 0), (1, 2)])
                for _ in range(rng.randint(1, 3)):  # a clip's frames, one after the other
                    frame(c["video_token_id"], 2, video_sizes, shape, same_slices=True)
            text(rng.randint(1, 3))
        rows.append((ids, kinds))
    grid2 = lambda g: torch.tensor(g, dtype=torch.long).view(-1, 2) if g else None
    return (*_pad(rows, padding_side), grid2(sizes), grid2(video_sizes))


@pytest.mark.parametrize("mode", ["16x", "4x"])
@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_minicpmv4_7_equals_the_installed_get_rope_index(padding_side, mode):
    config, model_cls, owner = _minicpm()
    merge = 2 if mode == "4x" else 4
    rng = random.Random(f"minicpm-{padding_side}-{mode}")
    for trial in range(12):
        input_ids, mm_types, mask, sizes, video_sizes = _minicpm_batch(rng, rng.randint(1, 4), padding_side, merge)
        ref_ids, ref_deltas = model_cls.get_rope_index(
            owner, input_ids, mm_types, sizes, video_sizes, downsample_mode=mode, attention_mask=mask
        )
        for extra in ({"mm_token_type_ids": mm_types}, {}):
            ids, deltas = minicpmv4_7_rope_index(
                config,
                input_ids,
                target_sizes=sizes,
                target_sizes_videos=video_sizes,
                downsample_mode=mode,
                attention_mask=mask,
                **extra,
            )
            assert torch.equal(ids, ref_ids), (trial, extra.keys())
            assert torch.equal(deltas, ref_deltas), trial


def test_minicpmv4_7_hand_worked():
    """Text 2, then a 1 x 2 thumbnail (target size 4 x 8 at 16x) over a canvas of 1 x 2 slices of
    1 x 1 tokens, text 1: the <image> marker at the halo (t 2, h = w = 1), the thumbnail at
    (2, 2, 2 + j), </image> at the far corner (2, 3, 4), each <slice> at its slice's corner."""
    config, _, _ = _minicpm()
    c = MINICPM_IDS
    img = c["image_token_id"]
    ids = [11, 12, c["image_start_id"], img, img, c["image_end_id"]]
    ids += [c["slice_start_id"], img, c["slice_end_id"], c["slice_start_id"], img, c["slice_end_id"], 13]
    sizes = torch.tensor([[4, 8], [4, 4], [4, 4]])
    pos, deltas = minicpmv4_7_rope_index(config, torch.tensor([ids]), target_sizes=sizes)
    assert pos[0, 0].tolist() == [0, 1] + [2] * 10 + [5]
    assert pos[1, 0].tolist() == [0, 1, 1, 2, 2, 3, 2, 2, 2, 2, 2, 2, 5]
    assert pos[2, 0].tolist() == [0, 1, 1, 2, 3, 4, 2, 2, 2, 3, 3, 3, 5]
    assert deltas.tolist() == [[6 - 13]]
    with pytest.raises(ValueError, match=r"a thumbnail of 1 x 1 tokens \(target size / 4\) has 2 tokens"):
        minicpmv4_7_rope_index(config, torch.tensor([ids]), target_sizes=torch.tensor([[4, 4], [4, 4], [4, 4]]))
    with pytest.raises(ValueError, match="config must set the marker token ids"):
        minicpmv4_7_rope_index(_family("minicpmv4_7")[0], torch.tensor([ids]), target_sizes=sizes)


def test_minicpmv4_7_registry_and_get_rope_index():
    """The registry reads it by model_type; get_rope_index names the function that reads its crops;
    ``layout.build`` places a thumbnail-only canvas as the token path does when no markers surround it."""
    config, _, _ = _minicpm()
    assert scheme_for_config(config) == "minicpm-v"
    with pytest.raises(ValueError, match="call mmpos.integrations.hf_families.minicpmv4_7_rope_index"):
        get_rope_index(config, torch.zeros(1, 3, dtype=torch.long))
    img = MINICPM_IDS["image_token_id"]
    ids = torch.tensor([[11, 12] + [img] * 6 + [13]])  # a 2 x 3 crop with no markers: its own group
    pos, _ = minicpmv4_7_rope_index(config, ids, target_sizes=torch.tensor([[8, 12]]))
    lay = layout.build([[layout.Text(1), layout.Image((1, 2, 3)), layout.Text(1)]], "minicpm-v", spatial_merge_size=1)
    # the token path: the first text token at 0, the <image> slot (here text token 12) at the halo, the crop at 1
    assert torch.equal(pos[:, 0, 2:], lay.position_ids[:, 0, 1:]) and pos[:, 0, 1].tolist() == [1, 0, 0]


def test_minicpmv4_7_crops_at_the_first_token_and_against_each_other():
    """Edge cases of the reference's walk: a thumbnail at a sample's first token (its ``<image>`` slot
    is index -1: the base coat misses the frame, which keeps the first coat 0, 1, 2, ...), a crop right
    against one of the other modality (the next frame's slot is the last token of the crop before),
    text between two slices, a frame running to the sample's end; equal to the installed release."""
    config, model_cls, owner = _minicpm()
    c = MINICPM_IDS
    img, vid = c["image_token_id"], c["video_token_id"]
    rows = [
        ([vid, img, img, 11, c["image_start_id"], vid, vid], [2, 1, 1, 0, 0, 2, 2]),
        (
            [img] * 4 + [c["slice_start_id"], img, c["slice_end_id"], 12, c["slice_start_id"], img, c["image_end_id"]],
            [1] * 4 + [0, 1, 0, 0, 0, 1, 0],
        ),
        ([11, vid, vid, img, c["slice_start_id"], img, img, c["slice_end_id"]], [0, 2, 2, 1, 0, 1, 1, 0]),
    ]
    for padding_side in ("left", "right"):
        input_ids, mm_types, mask = _pad(rows, padding_side)
        sizes = torch.tensor([[4, 8], [8, 8], [4, 4], [4, 4], [4, 4], [4, 8]])
        videos = torch.tensor([[4, 4], [4, 8], [4, 8]])
        ref = model_cls.get_rope_index(owner, input_ids, mm_types, sizes, videos, attention_mask=mask)
        got = minicpmv4_7_rope_index(
            config, input_ids, mm_types, target_sizes=sizes, target_sizes_videos=videos, attention_mask=mask
        )
        assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1]), padding_side
