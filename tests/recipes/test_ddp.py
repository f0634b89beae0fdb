"""DDP smoke: the quickstart under ``torchrun --nproc_per_node 2`` (gloo, CPU) matches one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch.distributed

from mmpos.runner import run_recipe

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
        reason="torch.distributed with gloo is not available",
    ),
]

ARGS = ["profile=smoke", "encoders=[sincos]", "baseline=null", "device=cpu", "progress=false", "threads=1"]


def _records(folder):
    return [json.loads(line) for line in (folder / "sincos" / "seed0" / "metrics.jsonl").read_text().splitlines()]


def test_torchrun_two_cpu_processes_match_a_single_process(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "mmpos.cli",
        "run",
        "quickstart",
        *ARGS,
        "name=ddp",
        "--out",
        str(tmp_path),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("| rank | encoder |") == 1  # only rank 0 prints the table
    assert sorted(p.name for p in (tmp_path / "quickstart").iterdir()) == ["ddp"]  # and writes one folder
    ddp = tmp_path / "quickstart" / "ddp"
    assert (ddp / "results.md").exists() and (ddp / "sincos" / "seed0" / "best.pt").exists()

    single = run_recipe("quickstart", [*ARGS, "name=single"], out=tmp_path)["folder"]
    a, b = _records(ddp), _records(single)
    assert [r["step"] for r in a] == [r["step"] for r in b]
    # each rank takes half of the same global batch and DDP averages the gradients: the same training
    for ra, rb in zip(a, b):
        if "loss" in ra:
            assert ra["loss"] == pytest.approx(rb["loss"], abs=1e-4)
            assert ra["lr"] == rb["lr"]


def test_graph_recipe_under_torchrun_matches_a_single_process(tmp_path):
    # digraph_playground: graph batches (PyG-style collation of variable-size graphs) split over two ranks
    args = ["profile=smoke", "encoders=[maglap]", "baseline=null", "device=cpu", "progress=false", "threads=1"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    cmd += ["-m", "mmpos.cli", "run", "digraph_playground", *args, "name=ddp", "--out", str(tmp_path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("| rank | encoder |") == 1
    ddp = tmp_path / "digraph_playground" / "ddp"
    single = run_recipe("digraph_playground", [*args, "name=single"], out=tmp_path)["folder"]

    def records(folder):
        path = folder / "maglap" / "seed0" / "metrics.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()]

    a, b = records(ddp), records(single)
    assert [r["step"] for r in a] == [r["step"] for r in b] and any("loss" in r for r in a)
    for ra, rb in zip(a, b):
        if "loss" in ra:
            assert ra["loss"] == pytest.approx(rb["loss"], abs=1e-4)
    final = [json.loads((f / "maglap" / "seed0" / "final.json").read_text()) for f in (ddp, single)]
    for key in ("test_acc", "id_acc"):
        assert final[0]["metrics"][key] == pytest.approx(final[1]["metrics"][key], abs=1e-6)
