"""docs/your-own-model.md: every ``python`` block, in order, in one namespace (the guide's code runs in CI)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.timm  # the guide converts a timm ViT

DOC = Path(__file__).resolve().parents[1] / "docs" / "your-own-model.md"


def test_your_own_model_blocks_run():
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.DOTALL)
    assert len(blocks) == 4
    torch.manual_seed(0)
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(DOC.name), "exec"), namespace)  # noqa: S102 (the docs are ours)
    # the guide's hand-written bias attention and ViT really ran
    assert namespace["out"].shape == namespace["q"].shape
    assert namespace["vit"].patch_embed.grid_size == (6, 8)
