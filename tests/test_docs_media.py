"""docs/media.md: every ``python`` block of the page, in order, in one namespace (the page writes an image and a
clip with Pillow and OpenCV, and runs a tiny Qwen2-VL)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

pytest.importorskip("cv2")
needs_hf = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None, reason="the page runs a tiny Qwen2-VL (transformers)"
)


@needs_hf
def test_docs_example(tmp_path, monkeypatch):
    """Every ``python`` block of docs/media.md, in order, in one namespace (files written to tmp_path)."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "media.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.DOTALL)
    assert len(blocks) == 7  # the Qwen walk-through (5), the other families' presets (1), MiniCPM-V slices (1)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, "docs/media.md", "exec"), namespace)  # noqa: S102 (the docs are ours)
    assert namespace["tokens"].shape[1] == len(namespace["prompt"]) + 4
