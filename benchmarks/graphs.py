"""Directed-graph PEs: mmpos ``AddMagneticLaplacianPE`` against torch-geometric's ``AddLaplacianEigenvectorPE``.

One process, the methods interleaved round by round (so that a shared machine's load hits
them alike), the default allocator; versions, threads and the load average are printed.

Workloads (``--only``):

* ``big``: one connected random digraph of ``--nodes`` nodes (default 100,000): a directed
  path through a random node order plus random edges, 2.5 edges per node in all, ``k = 16``.
  Connected so that both libraries solve the same problem (on a disconnected graph PyG's
  single ARPACK run misses repeated zero eigenvalues; mmpos solves each component);
* ``small``: ``--graphs`` sorting-network graphs (``recipes.data.sorting_networks``, 7-11
  channels), ``k = 16``, one transform call per graph and ``apply_many``.

Methods (PyG computes ``k + 1`` pairs and drops the first; mmpos computes ``k``, the first kept):

* ``pyg-f32``: ``AddLaplacianEigenvectorPE(k, is_undirected=True)`` on the symmetrised graph,
  its default float32 Laplacian (ARPACK ``eigsh(L, k + 1, which="SA")`` in single precision);
* ``pyg-f64``: the same with ``data.edge_weight`` float64, so PyG's Laplacian and ARPACK run in
  float64;
* ``mmpos-q0-f32`` / ``mmpos-q0-f64``: ``AddMagneticLaplacianPE(k, q=0.0, dtype=...)``;
* ``mmpos-q0.25-f32`` / ``mmpos-q0.25-f64``: relative ``q' = 0.25`` (complex Hermitian ARPACK on
  the ``n``-dimensional complex problem), and ``mmpos-qa0.01-*`` with absolute ``q = 0.01``
  (``q_relative=False``: on a large graph the relative ``q`` is tiny, 2.5e-6 here).

Time: median wall and process-CPU seconds over ``--rounds`` rounds. Ratios: the method's median
CPU time over PyG's at the same precision (``pyg-f32`` for ``*-f32``, ``pyg-f64`` for ``*-f64``).
Accuracy: the largest difference of the ``k`` non-trivial eigenvalues at ``q = 0`` from
PyG's float64 ones. Peak memory: tracemalloc's peak during one extra call per method (numpy
and scipy report their buffers to it), after the timed rounds.

    python benchmarks/graphs.py [--only big|small] [--nodes 100000] [--rounds 3] [--threads 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import time
import tracemalloc

BIG = [
    "pyg-f32",
    "mmpos-q0-f32",
    "mmpos-q0.25-f32",
    "mmpos-qa0.01-f32",
    "pyg-f64",
    "mmpos-q0-f64",
    "mmpos-q0.25-f64",
    "mmpos-qa0.01-f64",
]
SMALL = ["pyg-f32", "pyg-f64", "mmpos-q0-f64", "mmpos-q0.25-f64", "mmpos-q0-f64-many", "mmpos-q0.25-f64-many"]


def _big_graph(n: int, seed: int = 0):
    import torch

    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(n, generator=g)
    path = torch.stack([order[:-1], order[1:]])
    extra = torch.randint(0, n, (2, int(2.5 * n) - (n - 1)), generator=g)
    ei = torch.cat([path, extra[:, extra[0] != extra[1]]], dim=1)
    return [(ei, n)]


def _small_graphs(num: int):
    from recipes.data.sorting_networks import TRAIN_CHANNELS, build_dataset, network_graph

    graphs = []
    for net in build_dataset(TRAIN_CHANNELS, num // 2, seed=0):
        ei, chans = network_graph(net.comparators, net.num_channels)
        graphs.append((ei, len(chans)))
    return graphs


def _make(method: str, k: int):
    """``(transform, uses_undirected_input, float64_weights, many)`` for a method name."""
    import torch
    import torch_geometric.transforms as T

    from mmpos.integrations.pyg import AddMagneticLaplacianPE

    if method.startswith("pyg"):
        return T.AddLaplacianEigenvectorPE(k, is_undirected=True), True, method.endswith("f64"), False
    _, qname, prec, *rest = method.split("-")
    dtype = torch.float32 if prec == "f32" else torch.float64
    if qname.startswith("qa"):
        tr = AddMagneticLaplacianPE(k, q=float(qname[2:]), q_relative=False, dtype=dtype)
    else:
        tr = AddMagneticLaplacianPE(k, q=float(qname[1:]), dtype=dtype)
    return tr, False, False, bool(rest)


def _data(graphs, undirected: bool, f64: bool):
    import torch
    from torch_geometric.data import Data
    from torch_geometric.utils import to_undirected

    out = []
    for ei, n in graphs:
        e = to_undirected(ei, num_nodes=n) if undirected else ei
        d = Data(edge_index=e, num_nodes=n)
        if f64:
            d.edge_weight = torch.ones(e.shape[1], dtype=torch.float64)
        out.append(d)
    return out


def _call(method: str, graphs, k: int):
    tr, undirected, f64, many = _make(method, k)
    data = _data(graphs, undirected, f64)
    start, cpu = time.perf_counter(), time.process_time()
    out = tr.apply_many(data) if many else [tr(d) for d in data]
    return time.perf_counter() - start, time.process_time() - cpu, out


def _eigvals_pyg_f64(graph, k: int):
    """PyG's float64 eigenvalues of the big graph (its own Laplacian, its eigsh call)."""
    import numpy as np
    import scipy.sparse.linalg as spla
    import torch
    from torch_geometric.utils import get_laplacian, to_scipy_sparse_matrix, to_undirected

    ei, n = graph
    e = to_undirected(ei, num_nodes=n)
    li, lw = get_laplacian(e, torch.ones(e.shape[1], dtype=torch.float64), normalization="sym", num_nodes=n)
    val = spla.eigsh(to_scipy_sparse_matrix(li, lw, n), k=k + 1, which="SA", return_eigenvectors=False)
    return np.sort(val)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", choices=["big", "small"], default="big")
    p.add_argument("--nodes", type=int, default=100_000)
    p.add_argument("--graphs", type=int, default=2000)
    p.add_argument("--k", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--methods", nargs="*", default=None)
    p.add_argument("--no-memory", action="store_true", help="skip the tracemalloc pass (one more call per method)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(args.threads)  # before numpy / scipy load BLAS
    import numpy as np
    import scipy
    import torch
    import torch_geometric

    torch.set_num_threads(args.threads)
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(args.threads)
    except ImportError:
        pass
    graphs = _big_graph(args.nodes) if args.only == "big" else _small_graphs(args.graphs)
    methods = args.methods or (BIG if args.only == "big" else SMALL)
    print(
        f"{datetime.datetime.now():%Y-%m-%d %H:%M}, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs, threads={args.threads}, load average {os.getloadavg()}"
    )
    print(
        f"torch {torch.__version__}, torch-geometric {torch_geometric.__version__}, scipy {scipy.__version__}, "
        f"numpy {np.__version__}; workload {args.only}: {len(graphs)} graph(s), "
        f"{sum(n for _, n in graphs)} nodes, {sum(e.shape[1] for e, _ in graphs)} edges, k={args.k}"
    )
    times: dict[str, list[tuple[float, float]]] = {m: [] for m in methods}
    last = {}
    for r in range(args.rounds):
        for m in methods:
            wall, cpu, out = _call(m, graphs, args.k)
            times[m].append((wall, cpu))
            last[m] = out
            print(f"round {r} {m}: wall {wall:.2f} s, CPU {cpu:.2f} s, load {os.getloadavg()[0]:.1f}", flush=True)
    ref_val = _eigvals_pyg_f64(graphs[0], args.k) if args.only == "big" else None
    peaks = {}
    for m in [] if args.no_memory else methods:
        tracemalloc.start()
        _call(m, graphs, args.k)
        peaks[m] = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
    rows = []
    for m in methods:
        wall = statistics.median(t[0] for t in times[m])
        cpu = statistics.median(t[1] for t in times[m])
        ref = "pyg-f64" if "f64" in m else "pyg-f32"
        ratio = cpu / statistics.median(t[1] for t in times[ref]) if ref in times else None
        err = None
        if ref_val is not None and "-q0-" in m:
            err = float(np.abs(last[m][0].maglap_pe_eigval[0].double().numpy() - ref_val[: args.k]).max())
        rows.append(
            {"method": m, "wall_s": wall, "cpu_s": cpu, "vs_pyg_cpu": ratio, "peak_mib": peaks.get(m), "eig_err": err}
        )
    print(
        "\n| method | wall (s) | CPU (s) | CPU / PyG same precision | peak traced (MiB) | max eigenvalue diff vs PyG f64 |"
    )
    print("|---|---|---|---|---|---|")
    for r in rows:
        ratio = f"{r['vs_pyg_cpu']:.2f}x" if r["vs_pyg_cpu"] is not None else "-"
        err = f"{r['eig_err']:.1e}" if r["eig_err"] is not None else "-"
        peak = f"{r['peak_mib']:.0f}" if r["peak_mib"] is not None else "-"
        print(f"| {r['method']} | {r['wall_s']:.2f} | {r['cpu_s']:.2f} | {ratio} | {peak} | {err} |")
    print(f"load average at the end {os.getloadavg()}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"rows": rows, "times": times, "args": vars(args)}, f, indent=2)


if __name__ == "__main__":
    main()
