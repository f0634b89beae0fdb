"""Directed-graph PEs: mmpos against torch-geometric's ``AddLaplacianEigenvectorPE``, on CPU.

Two workloads, as in issue 8:

* ``small``: 10,000 sorting-network graphs (5,000 networks on 7-11 channels, each with its
  negative; :mod:`recipes.data.sorting_networks`), ``k = 16``;
* ``big``: one random directed graph of 100,000 nodes and 400,000 edges, ``k = 16``.

Methods: PyG ``AddLaplacianEigenvectorPE(k)`` on the directed graph (its default
``is_undirected=False``: ``eig``/``eigs`` of the non-symmetric Laplacian, real part) and
with ``is_undirected=True`` on the symmetrised graph (``eigh``/``eigsh``, the q = 0
problem); mmpos ``AddMagneticLaplacianPE`` at ``q = 0`` and ``q' = 0.25`` (relative), one
graph per call (as a dataset transform) and, for the small graphs, ``apply_many`` (one
batched ``eigh`` per graph size). Every job runs in a fresh subprocess: time is the wall
time of the PE computation alone; peak memory is the subprocess's peak RSS above its RSS
before the computation (``resource.getrusage``; Linux reports kilobytes). A job past
``--timeout`` seconds is reported as such. Threads: ``--threads`` (OpenMP/BLAS).

    python benchmarks/graphs.py [--graphs 10000] [--nodes 100000] [--k 16] [--threads 2] [--out results.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

SMALL = ["pyg", "pyg-undirected", "mmpos-q0", "mmpos-q0.25", "mmpos-q0-many", "mmpos-q0.25-many"]
BIG = ["mmpos-q0", "mmpos-q0.25", "pyg-undirected"]


def _small_graphs(num: int, cache: Path):
    import torch

    if cache.is_file():
        return torch.load(cache)
    from recipes.data.sorting_networks import TRAIN_CHANNELS, build_dataset, network_graph

    graphs = []
    for net in build_dataset(TRAIN_CHANNELS, num // 2, seed=0):
        ei, chans = network_graph(net.comparators, net.num_channels)
        graphs.append((ei, len(chans)))
    torch.save(graphs, cache)
    return graphs


def _big_graph(n: int):
    import torch

    g = torch.Generator().manual_seed(0)
    ei = torch.randint(0, n, (2, 4 * n), generator=g)
    return [(ei[:, ei[0] != ei[1]], n)]


def _job(workload: str, method: str, args) -> dict:
    """Runs in the subprocess: returns seconds and peak RSS growth (MB)."""
    import torch
    import torch_geometric.transforms as T
    from torch_geometric.data import Data
    from torch_geometric.utils import to_undirected

    from mmpos.integrations.pyg import AddMagneticLaplacianPE

    graphs = _small_graphs(args.graphs, Path(args.cache)) if workload == "small" else _big_graph(args.nodes)
    undirected = method == "pyg-undirected"
    data = [Data(edge_index=to_undirected(ei) if undirected else ei, num_nodes=n) for ei, n in graphs]
    if method.startswith("pyg"):
        tr = T.AddLaplacianEigenvectorPE(args.k, is_undirected=undirected)
    else:
        q = float(method.split("-")[1][1:])
        tr = AddMagneticLaplacianPE(args.k, q=q)
    torch.manual_seed(0)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start, cpu = time.perf_counter(), time.process_time()
    if method.endswith("-many"):
        tr.apply_many(data)
    else:
        for d in data:
            tr(d)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"seconds": seconds, "cpu_seconds": cpu, "peak_mb": (peak - base) / 1024, "graphs": len(data)}


def _run(workload: str, method: str, args) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--job",
        workload,
        method,
        "--graphs",
        str(args.graphs),
        "--nodes",
        str(args.nodes),
    ]
    cmd += ["--k", str(args.k), "--cache", args.cache]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "OPENBLAS_NUM_THREADS": str(args.threads)}
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout, check=True)
    except subprocess.TimeoutExpired:
        return {"workload": workload, "method": method, "seconds": None, "note": f"timeout > {args.timeout} s"}
    except subprocess.CalledProcessError as e:
        return {"workload": workload, "method": method, "seconds": None, "note": e.stderr.strip().splitlines()[-1]}
    return {"workload": workload, "method": method, **json.loads(out.stdout.strip().splitlines()[-1])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--graphs", type=int, default=10_000)
    p.add_argument("--nodes", type=int, default=100_000)
    p.add_argument("--k", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--cache", default="/tmp/mmpos_bench_sorting_graphs.pt")
    p.add_argument("--only", choices=["small", "big"], default=None)
    p.add_argument("--out", default=None)
    p.add_argument("--job", nargs=2, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.job:
        print(json.dumps(_job(*args.job, args)))
        return
    if args.only != "big":
        _small_graphs(args.graphs, Path(args.cache))  # generate once, outside the timed jobs
    rows = []
    for workload, methods in (("small", SMALL), ("big", BIG)):
        if args.only and args.only != workload:
            continue
        for method in methods:
            rows.append(_run(workload, method, args))
            print(json.dumps(rows[-1]), flush=True)
    print(
        f"\n{datetime.date.today()}, {platform.processor() or platform.machine()}, threads={args.threads}, k={args.k}"
    )
    print("| workload | method | wall (s) | CPU (s) | vs PyG (CPU) | peak RSS growth (MB) |\n|---|---|---|---|---|---|")
    for r in rows:
        ref = next((x for x in rows if x["workload"] == r["workload"] and x["method"] == "pyg-undirected"), None)
        t, c = r.get("seconds"), r.get("cpu_seconds")
        ratio = f"{ref['cpu_seconds'] / c:.2f}x" if c and ref and ref.get("cpu_seconds") else "–"
        wall = f"{t:.2f}" if t is not None else r.get("note", "–")
        cpu = f"{c:.2f}" if c is not None else "–"
        peak = f"{r['peak_mb']:.0f}" if "peak_mb" in r else "–"
        print(f"| {r['workload']} | {r['method']} | {wall} | {cpu} | {ratio} | {peak} |")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
