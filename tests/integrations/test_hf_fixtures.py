"""Golden ``get_rope_index`` outputs recorded from each supported transformers release
(``fixtures/rope_index_transformers-<version>.json``, written by ``fixtures/record_rope_index.py``).

Every recorded release is compared with mmpos's rule for it, on any installed release; the
installed release's own ``get_rope_index`` is compared with its file, so an upgrade of
transformers that moves a position shows here.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from mmpos.integrations.hf_rope_index import get_rope_index

pytestmark = pytest.mark.hf

FIXTURES = Path(__file__).with_name("fixtures")
sys.path.insert(0, str(FIXTURES))
import record_rope_index as record

FILES = sorted(FIXTURES.glob("rope_index_transformers-*.json"))


def _rule(version: str) -> str:
    """mmpos's rule for a transformers release: ``hf-5.3`` from 5.3 on, else ``hf-4.57``."""
    major, minor = (int(x) for x in version.split(".")[:2])
    return "hf-5.3" if (major, minor) >= (5, 3) else "hf-4.57"


def test_both_ends_of_the_supported_range_are_recorded():
    versions = {json.loads(f.read_text())["transformers"] for f in FILES}
    assert "4.57.1" in versions and any(v.startswith("5.") for v in versions)


@pytest.mark.parametrize("path", FILES, ids=[f.stem for f in FILES])
def test_mmpos_rule_reproduces_the_recorded_release(path):
    data = json.loads(path.read_text())
    rule = _rule(data["transformers"])
    for case in data["cases"]:
        inputs = record.tensors(case)
        ids, deltas = get_rope_index(record.config_for(case["model_type"]), rule=rule, **inputs)
        assert ids.tolist() == case["position_ids"], case["name"]
        assert deltas.tolist() == case["rope_deltas"], case["name"]


def test_installed_release_matches_its_recording():
    path = FIXTURES / f"rope_index_transformers-{transformers.__version__}.json"
    if not path.exists():
        pytest.skip(f"no recording of transformers {transformers.__version__}: run {record.__file__}")
    for case in json.loads(path.read_text())["cases"]:
        ids, deltas = record.reference(case)
        assert ids.tolist() == case["position_ids"], case["name"]
        assert deltas.tolist() == case["rope_deltas"], case["name"]


def test_the_two_releases_differ_where_documented():
    """What moved between 4.57 and 5.x on the recorded prompts: padding 1 -> 0, rope_deltas
    from the padded to the real length, text after a Qwen2/2.5-VL video, 0.75 s no longer 0."""
    recorded = {json.loads(f.read_text())["transformers"]: json.loads(f.read_text())["cases"] for f in FILES}
    old, new = recorded["4.57.1"], next(v for k, v in recorded.items() if k.startswith("5."))
    q2_old, q2_new = torch.tensor(old[0]["position_ids"]), torch.tensor(new[0]["position_ids"])
    mask = record.tensors(old[0])["attention_mask"].bool()
    assert (q2_old[:, ~mask] == 1).all() and (q2_new[:, ~mask] == 0).all()
    assert not torch.equal(q2_old[:, mask], q2_new[:, mask])  # text after the 4-frame video
    q25_old, q25_new = torch.tensor(old[1]["position_ids"]), torch.tensor(new[1]["position_ids"])
    assert q25_old[0, 0, 2:26].unique().numel() == 1  # 0.75 s truncated to 0: every frame at one t
    assert q25_new[0, 0, 2:26].unique().numel() == 4  # floor(1.5 f): 0, 1, 3, 4
    assert old[2]["position_ids"] != new[2]["position_ids"]  # Qwen3-VL: only the padding value moved
    q3_old, q3_new = torch.tensor(old[2]["position_ids"]), torch.tensor(new[2]["position_ids"])
    mask3 = record.tensors(old[2])["attention_mask"].bool()
    assert torch.equal(q3_old[:, mask3], q3_new[:, mask3])
