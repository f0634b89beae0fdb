"""docs/integrations-hf.md, section "Try it without downloads": its ``python`` blocks, in order, in one
namespace, on the installed transformers (``make test`` runs the ``hf`` tests on 4.57.1 and 5.24)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
from transformers import Qwen2VLForConditionalGeneration  # at collection, as the other hf tests (slow import)

pytestmark = pytest.mark.hf

DOC = Path(__file__).resolve().parents[1] / "docs" / "integrations-hf.md"


def _section_blocks() -> list[str]:
    text = DOC.read_text()
    section = text.split("## Try it without downloads\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.DOTALL)


def test_try_it_without_downloads_blocks_run():
    blocks = _section_blocks()
    assert len(blocks) == 4
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, DOC.name, "exec"), namespace)  # noqa: S102 (the docs are ours)
    ns = namespace
    model, inputs, positions = ns["model"], ns["inputs"], ns["positions"]
    assert isinstance(model, Qwen2VLForConditionalGeneration)
    # the model took the hand-built inputs (it raises when image features and image tokens disagree)
    assert ns["own"].shape == (1, 13, 128)
    assert not torch.equal(ns["swapped"], ns["own"])  # the swap changed the positions the model used
    assert torch.equal(ns["restored"], ns["own"])  # "own" restored the model exactly
    assert ns["patches"].pixel_values.shape == inputs["pixel_values"].shape  # (24, 24): the rows built by hand
    assert torch.equal(ns["image_inputs"]["image_grid_thw"], inputs["image_grid_thw"])
    assert ns["logits"].shape == (1, 13, 128) and not torch.equal(ns["logits"], ns["own"])  # other pixels
    assert ns["generated"].shape == (1, 13 + 4) and torch.equal(ns["generated"][:, :13], inputs["input_ids"])
    # the positions the doc prints are the ones the patched model computes (and the table in the doc)
    from mmpos.integrations.hf import use_rope

    use_rope(model, "mrope-i")
    kwargs = {k: inputs[k] for k in ("image_grid_thw", "attention_mask", "mm_token_type_ids") if k in inputs}
    ids, _ = model.model.get_rope_index(inputs["input_ids"], **kwargs)
    assert torch.equal(ids, positions)
    expected = [
        [0, 1, 2, 3, 3, 3, 3, 3, 3, 6, 7, 8, 9],
        [0, 1, 2, 0, 0, 0, 1, 1, 1, 6, 7, 8, 9],
        [0, 1, 2, 0, 1, 2, 0, 1, 2, 6, 7, 8, 9],
    ]
    assert positions[:, 0].tolist() == expected
    # a forward with those positions gives the logits of the swapped model
    with torch.no_grad():
        assert torch.equal(model(**inputs, position_ids=positions).logits, ns["swapped"])
    use_rope(model, "own")


def test_config_persistence_block_runs():
    """The block of "The swap is written into the config": save_pretrained -> from_pretrained keeps the swap."""
    from mmpos.integrations.hf import installed_rule

    if installed_rule() == "hf-4.57":
        pytest.skip("transformers 4.57.1 reloads a saved tiny Qwen2-VL config as its text config (without mmpos too)")
    section = DOC.read_text().split("### The swap is written into the config\n", 1)[1].split("\n### ", 1)[0]
    (block,) = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    exec(compile(block, DOC.name, "exec"), {})  # noqa: S102 (the docs are ours)
