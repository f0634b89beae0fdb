import json
from pathlib import Path

import pytest
import torch
from open_clip.transformer import VisionTransformer

from mmpos.runner.sweep import run_recipe
from mmpos.runner.tasks import get_task
from recipes.data import video
from recipes.tasks.multimodal import _layout_options, parse_scheme, vision_tower
from recipes.vlm import PatchTokens

pytestmark = pytest.mark.open_clip  # open_clip towers converted by mmpos

RECIPES = Path(__file__).resolve().parents[2] / "recipes" / "configs"
TOWER = {"vision": {"width": 16, "layers": 1, "heads": 2, "patch_size": 4, "pos": "none"}}


@pytest.mark.parametrize(
    ("recipe", "metrics"),
    [
        ("vlm_grounding", {"acc", "acc@new_grids", "acc_below", "acc_right"}),
        ("video_temporal", {"acc", "acc_hidden"}),
        ("v2pe_long", {"acc", "acc@2", "acc@4"}),
    ],
)
def test_smoke_profile_runs_every_encoder(recipe, metrics, tmp_path):
    result = run_recipe(RECIPES / f"{recipe}.yaml", ["profile=smoke", "device=cpu", "threads=1"], out=tmp_path)
    cfg = result["config"]
    assert [f["encoder"] for f in result["finals"]] == cfg["encoders"] and len(cfg["encoders"]) >= 4
    for final in result["finals"]:
        assert set(final["metrics"]) == metrics and final["step"] == cfg["steps"]
        assert all(0.0 <= v <= 1.0 for v in final["metrics"].values())
    assert (result["folder"] / "results.md").exists()
    assert len(json.loads((result["folder"] / "results.json").read_text())) == len(cfg["encoders"])


def test_train_batches_are_pure_functions_of_the_step():
    cfg = {
        **TOWER,
        "batch_size": 4,
        "decoder": {"dim": 16, "depth": 1, "num_heads": 2, "num_kv_heads": 2, "theta": 10.0},
        "data": {"questions": ["relations", "absolute"], "train_grids": [[2, 2], [2, 3]], "eval_grids": [[3, 3]],
                 "eval_size": 8, "cell": 8, "eval_delta": 0.0625, "hope_scale": 0.75},
    }  # fmt: skip
    task = get_task("vlm_grounding").build(cfg, "hope", 0, torch.device("cpu"))
    a, b = task.train_batch(3), task.train_batch(3)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert a[0].shape == (4, 3, 2 * 8, 3 * 8)  # step 3 -> grid index 1 -> (2, 3) cells of 8 px
    assert not torch.equal(task.train_batch(2)[0][:, :, :, :16], a[0][:, :, :, :16])
    loss, logs = task.loss(task.model, a)
    assert loss.ndim == 0 and torch.isfinite(loss) and 0.0 <= logs["acc"] <= 1.0
    assert {"acc", "acc@new_grids", "acc_what", "acc_where", "acc_below", "acc_right"} == set(task.evaluate(task.model))


def test_vision_tower_gives_patch_tokens_at_any_size():
    tower, width = vision_tower(TOWER)
    assert width == 16 and isinstance(tower, PatchTokens)
    for h, w in [(8, 8), (12, 20), (32, 8)]:
        assert tower(torch.rand(2, 3, h, w)).shape == (2, (h // 4) * (w // 4), 16)
    assert all(p.grad is None for p in tower.parameters())
    tower(torch.rand(1, 3, 8, 12)).sum().backward()
    assert all(p.grad is not None for p in tower.parameters())  # no unused parameter (DDP-safe)


def test_vision_tower_with_2d_rope_inside():
    tower, _ = vision_tower({"vision": {**TOWER["vision"], "pos": "rope-axial"}})
    assert tower(torch.rand(1, 3, 12, 8)).shape == (1, 6, 16)


def test_patch_tokens_needs_a_converted_tower():
    plain = VisionTransformer(8, 4, 16, 1, 2, 4.0, output_dim=16, output_tokens=True)
    with pytest.raises(ValueError, match="converted"):
        PatchTokens(plain)


def test_encoder_strings():
    assert parse_scheme("v2pe@0.25") == ("v2pe", "0.25") and parse_scheme("flat") == ("flat", None)
    data = {"eval_delta": 0.125, "hope_scale": 0.75}
    assert _layout_options("v2pe", "rand", data, training=True) == {"training": True}
    assert _layout_options("v2pe", "rand", data, training=False) == {"delta": 0.125}
    assert _layout_options("v2pe", "0.5", data, training=True) == {"delta": 0.5}
    assert _layout_options("hope", None, data, training=False) == {"temporal_scale": 0.75}
    assert _layout_options("hope", "1.5", data, training=False) == {"temporal_scale": 1.5}
    with pytest.raises(ValueError, match="layout scheme"):
        parse_scheme("rope")
    with pytest.raises(ValueError, match="visual step"):
        _layout_options("v2pe", None, data, training=False)
    with pytest.raises(ValueError, match="number in \\(0, 1\\] or 'rand'"):
        _layout_options("v2pe", "small", data, training=False)
    with pytest.raises(ValueError, match="takes no '@' option"):
        _layout_options("mrope-i", "2", data, training=False)


def test_unknown_question_source():
    cfg = {**TOWER, "batch_size": 2, "decoder": {"dim": 16, "depth": 1, "num_heads": 2, "num_kv_heads": 2, "theta": 10.0},
           "data": {"questions": ["counting"], "train_grids": [[2, 2]], "eval_grids": [[2, 2]], "eval_size": 4,
                    "cell": 8, "eval_delta": 0.0625, "hope_scale": 0.75}}  # fmt: skip
    with pytest.raises(ValueError, match="data.questions"):
        get_task("vlm_grounding").build(cfg, "flat", 0, torch.device("cpu"))


def test_video_task_with_both_question_sources():
    cfg = {**TOWER, "batch_size": 4, "decoder": {"dim": 16, "depth": 1, "num_heads": 2, "num_kv_heads": 2, "theta": 10.0},
           "data": {"questions": ["hidden", "events"], "frames": 3, "grids": [[2, 2]], "cell": 8, "pool_size": 8,
                    "eval_size": 8, "eval_delta": 0.0625, "hope_scale": 0.75}}  # fmt: skip
    task = get_task("video_temporal").build(cfg, "vrope", 0, torch.device("cpu"))
    clips, question, _, _ = task.train_batch(1)  # step 1 -> the `events` pool
    assert clips.shape == (4, 3, 3, 16, 16) and set(question[:, 0].tolist()) <= {video.WHEN, video.EVENT}
    assert torch.isfinite(task.loss(task.model, task.train_batch(0))[0])
    assert set(task.evaluate(task.model)) == {"acc", "acc_hidden", "acc_when", "acc_where"}


def test_circlerope_age_variant_gives_the_decoder_one_layout_per_layer():
    """``circlerope@strategy_4``: decoder blocks 0 and 2 see the Circle-RoPE coordinates, block 1 the qwen2.5-vl
    layout of the same tokens (pre-hooks on the blocks); plain ``circlerope`` gives every block the same."""
    assert parse_scheme("circlerope@strategy_4") == ("circlerope", "strategy_4")
    with pytest.raises(ValueError, match="strategy_1"):
        parse_scheme("circlerope@strategy_1")
    cfg = {**TOWER, "batch_size": 2, "decoder": {"dim": 16, "depth": 3, "num_heads": 2, "num_kv_heads": 2, "theta": 10.0},
           "data": {"questions": ["absolute"], "train_grids": [[2, 2]], "eval_grids": [[2, 2]], "eval_size": 4,
                    "cell": 8, "eval_delta": 0.0625, "hope_scale": 0.75}}  # fmt: skip
    seen = {}
    for encoder in ("circlerope@strategy_4", "circlerope"):
        task = get_task("vlm_grounding").build(cfg, encoder, 0, torch.device("cpu"))
        blocks = task.model.decoder.blocks
        calls = seen.setdefault(encoder, [])
        hooks = [b.register_forward_pre_hook(lambda m, args, calls=calls: calls.append(args[1])) for b in blocks]
        loss, _ = task.loss(task.model, task.train_batch(0))
        for h in hooks:
            h.remove()
        assert torch.isfinite(loss)
    age, plain = seen["circlerope@strategy_4"], seen["circlerope"]
    assert age[0] is age[2] and age[0] is not age[1] and plain[0] is plain[1] is plain[2]
    torch.testing.assert_close(age[0].pos, plain[0].pos, rtol=0, atol=0)  # the Circle-RoPE layout
    assert age[1].pos.shape == age[0].pos.shape and not torch.equal(age[1].pos, age[0].pos)  # the qwen2.5-vl layout
