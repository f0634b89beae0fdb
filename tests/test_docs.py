"""Every fenced ``python`` block of README.md and docs/**/*.md runs as pasted.

A page's blocks run in order in one fresh namespace (later blocks build on earlier ones), in the
folder of a temporary directory, after ``torch.manual_seed(0)``. A block that cannot run here (it needs
downloaded weights, a GPU, or a file of the reader's) is fenced ``python no-run`` and says so in the
text around it; the harness counts those too and checks that each is at least valid Python. Pages
whose blocks import an integration carry its marker, so ``make test-oldest`` runs them again on the
oldest supported release. A comment ``# (2, 197, 384)`` after ``name = ...`` states ``name``'s shape, and
is checked.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
# ```python [no-run]\n ... ``` (the info string's first word is the language, as GitHub reads it)
FENCE = re.compile(r"^```python( no-run)?[ \t]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
# ``name = ...  # (2, 197, 384)``: a shape comment, checked after the block runs
SHAPE_COMMENT = re.compile(r"^(\w+) = .*#\s*\((\d+(?:, \d+)*)\)", re.MULTILINE)
# an import of an integration in a block -> the pytest marker its tests carry
MARKERS = {"transformers": "hf", "timm": "timm", "open_clip": "open_clip", "torch_geometric": "pyg"}


def _blocks(page: Path) -> list[tuple[bool, str]]:
    """``(runnable, source)`` for every fenced python block of ``page``, in order."""
    return [(not no_run, source) for no_run, source in FENCE.findall(page.read_text(encoding="utf-8"))]


def _imported(source: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def _params():
    for page in PAGES:
        blocks = _blocks(page)
        if not blocks:
            continue
        imported = set().union(*(_imported(source) for _, source in blocks))
        marks = [getattr(pytest.mark, MARKERS[name]) for name in sorted(imported & MARKERS.keys())]
        yield pytest.param(page, id=str(page.relative_to(ROOT)), marks=marks)


@pytest.mark.parametrize("page", list(_params()))
def test_every_python_block_of_the_page_runs(page, tmp_path, monkeypatch):
    blocks = _blocks(page)
    for name in sorted(set().union(*(_imported(source) for _, source in blocks)) & MARKERS.keys()):
        pytest.importorskip(name)
    monkeypatch.chdir(tmp_path)  # files a block writes land here
    torch.manual_seed(0)
    namespace: dict = {"__name__": "__docs__"}
    for i, (runnable, source) in enumerate(blocks, 1):
        code = compile(source, f"{page.relative_to(ROOT)} (python block {i})", "exec")
        if not runnable:
            continue
        exec(code, namespace)  # noqa: S102 (the docs are ours)
        for name, shape in SHAPE_COMMENT.findall(source):
            expected = tuple(int(s) for s in shape.split(", "))
            assert tuple(namespace[name].shape) == expected, f"{code.co_filename}: {name} has shape {expected}"


def test_the_harness_finds_the_blocks():
    counts = [(runnable, page) for page in PAGES for runnable, _ in _blocks(page)]
    runnable = sum(r for r, _ in counts)
    print(f"\ndocumentation python blocks: {len(counts)} on {len({p for _, p in counts})} pages, {runnable} run")
    assert runnable >= 40 and runnable / len(counts) >= 0.9, (runnable, len(counts))
