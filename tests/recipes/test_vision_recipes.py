from pathlib import Path

import pytest
import torch

from mmpos.runner.config import load_yaml, resolve_config
from mmpos.runner.sweep import run_recipe
from recipes.tasks import vision

pytestmark = pytest.mark.timm  # timm ViTs built by mmpos.integrations.timm

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ["profile=smoke", "device=cpu"]
SETS = {"acc", "acc@1.5x", "acc@2x", "acc@1.5x:image", "acc@2x:image"}
METRICS = SETS | {"acc@1.5x:interp", "acc@2x:interp"}


def _cfg(recipe: str, *overrides: str) -> dict:
    return resolve_config(load_yaml(ROOT / "recipes" / "configs" / f"{recipe}.yaml"), [*SMOKE, *overrides])


@pytest.fixture(scope="module")
def spatial_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    encoders = "encoders=[none,learned,irpe-product-ctx-k,peg,rope-mixed,fuzzy]"
    return run_recipe(ROOT / "recipes" / "configs" / "vit_spatial.yaml", [*SMOKE, encoders], out=out)


def test_vit_spatial_smoke(spatial_run):
    finals = spatial_run["finals"]
    assert [f["encoder"] for f in finals] == ["none", "learned", "irpe-product-ctx-k", "peg", "rope-mixed", "fuzzy"]
    for f in finals:
        assert set(f["metrics"]) == METRICS
        assert all(0.0 <= v <= 1.0 for v in f["metrics"].values())
    assert (spatial_run["folder"] / "learned" / "seed0" / "best.pt").is_file()
    assert "acc@2x" in spatial_run["table"]


def test_vit_finetune_smoke_from_spatial_checkpoint(spatial_run, tmp_path):
    init = str(spatial_run["folder"] / "learned" / "seed{seed}" / "best.pt")
    result = run_recipe(
        ROOT / "recipes" / "configs" / "vit_finetune.yaml",
        [
            *SMOKE,
            "encoders=[rope-axial,rope-axial@scratch]",
            "baseline=rope-axial@scratch",
            f"finetune.init_from={init}",
        ],
        out=tmp_path,
    )
    assert [f["encoder"] for f in result["finals"]] == ["rope-axial", "rope-axial@scratch"]
    assert all(set(f["metrics"]) == METRICS for f in result["finals"])


def test_finetune_starts_from_the_checkpoint_and_scratch_does_not(spatial_run):
    path = spatial_run["folder"] / "learned" / "seed0" / "best.pt"
    cfg = _cfg("vit_finetune", f"finetune.init_from={path}")
    saved = vision.load_checkpoint(path)
    torch.manual_seed(0)
    tuned = vision.build_vit_finetune(cfg, "peg", 0, torch.device("cpu")).model.state_dict()
    torch.manual_seed(0)
    scratch = vision.build_vit_finetune(cfg, "peg@scratch", 0, torch.device("cpu")).model.state_dict()
    key = "blocks.1.attn.qkv.weight"
    assert torch.equal(tuned[key], saved[key]) and not torch.equal(scratch[key], saved[key])
    assert "pos_embed" not in tuned  # PEG drops the absolute table
    torch.manual_seed(0)
    irpe = vision.build_vit_finetune(cfg, "irpe-product-ctx-k", 0, torch.device("cpu")).model.state_dict()
    assert torch.equal(irpe["pos_embed"], saved["pos_encoders.learned.pos_embed"])  # iRPE keeps the APE


def test_missing_checkpoint_pretrains_in_the_task_once(tmp_path):
    cfg = _cfg("vit_finetune", f"finetune.init_from={tmp_path}/missing/seed{{seed}}.pt")
    state = torch.get_rng_state()
    first = vision.initial_weights(cfg, 0, torch.device("cpu"))
    assert torch.equal(state, torch.get_rng_state())  # pretraining leaves the run's RNG alone
    assert vision.initial_weights(cfg, 0, torch.device("cpu")) is first  # cached per seed
    model = vision.build_vit_finetune(cfg, "learned", 0, torch.device("cpu")).model
    assert all(torch.equal(v, first[k]) for k, v in model.state_dict().items())
    fresh = vision.build_model(cfg, ["learned"]).state_dict()
    assert not torch.equal(fresh["blocks.0.mlp.fc1.weight"], first["blocks.0.mlp.fc1.weight"])


def test_train_batches_are_pure_and_eval_sets_share_scenes():
    cfg = _cfg("vit_spatial")
    batch = vision.train_batch_fn(cfg, seed=3)
    assert torch.equal(batch(5)[0], batch(5)[0]) and not torch.equal(batch(5)[0], batch(6)[0])
    sets = vision.eval_sets(cfg, seed=0)
    assert set(sets) == SETS
    assert sets["acc"][0].shape[-1] == 32 and sets["acc@2x"][0].shape[-1] == 64
    assert all(torch.equal(labels, sets["acc"][1]) for _, labels in sets.values())


def test_no_weight_decay_on_position_parameters():
    cfg = _cfg("vit_spatial")
    model = vision.build_model(cfg, ["rope-mixed", "peg"])
    decay, no_decay = vision.param_groups(0.05)(model)
    decayed = {id(p) for p in decay["params"]}
    for name, p in model.named_parameters():
        expect = p.ndim >= 2 and "pos_" not in name and name != "cls_token"
        assert (id(p) in decayed) == expect, name
    assert no_decay["weight_decay"] == 0.0


@pytest.mark.parametrize(
    "recipe, encoder, overrides, match",
    [
        ("vit_finetune", "peg@fast", [], "@scratch"),
        ("vit_spatial", "none", ["data.eval_scales=[1.3]"], "eval_scales"),
        ("vit_spatial", "none", ["data.image_size=36"], "patch_size"),
    ],
)
def test_bad_config_raises(recipe, encoder, overrides, match):
    cfg = _cfg(recipe, *overrides)
    build = vision.build_vit_finetune if recipe == "vit_finetune" else vision.build_vit_spatial
    with pytest.raises(ValueError, match=match):
        build(cfg, encoder, 0, torch.device("cpu"))


def test_interpolated_positions_rescale_to_the_training_grid():
    cfg = _cfg("vit_spatial")
    model = vision.build_model(cfg, ["rope-axial"])
    plain = model.token_coords((64, 64))
    with vision.interpolated_positions(model, (4, 4)):
        scaled = model.token_coords((64, 64))
    assert torch.equal(scaled.pos, plain.pos / 2) and scaled.grid_shape == (8, 8)
    assert torch.equal(model.token_coords((64, 64)).pos, plain.pos)  # restored on exit
    sets = {k: (v[0][:4], v[1][:4]) for k, v in vision.eval_sets(cfg, 0).items()}
    model.eval()
    with torch.no_grad():
        rope = vision.evaluate_fn(cfg, ["rope-axial"], sets, torch.device("cpu"))(model)
        with vision.interpolated_positions(model, (4, 4)):
            expect = (model(sets["acc@2x"][0]).argmax(-1) == sets["acc@2x"][1]).float().mean().item()
        learned = vision.evaluate_fn(cfg, ["learned"], sets, torch.device("cpu"))(model)
    assert rope["acc@2x:interp"] == expect
    assert learned["acc@2x:interp"] == learned["acc@2x"]
