"""Directed-graph tasks: ``sorting_networks`` and ``digraph_playground``.

``sorting_networks``: does a sequence of comparators sort? Only the PE tells the order.

Data: :mod:`recipes.data.sorting_networks` (the benchmark of Geisler et al., ICML 2023):
networks on 7-11 channels for training, 13-16 channels for the test (longer networks
than any seen in training), a held-out set on the training lengths (``id_acc``). One
node per comparator, edges from the previous comparator on each of its channels, node
features: sine-cosine features of the two channel indices only.

Model: :class:`mmpos.nn.GraphTransformer` (mean readout, two classes) with the run's
encoder:

* ``none``: no PE (the model sees a set of comparators and their channels);
* ``lap``: :class:`~mmpos.encoders.maglap.MagLapEncoder` on Laplacian eigenvectors (``q = 0``);
* ``maglap``: the same on magnetic-Laplacian eigenvectors (relative ``q = data.q``);
* ``drw``: directional random walks and PageRank, relative (attention bias) and absolute (node features);
* ``oracle``: the positive control, no PE but one more node feature, whether the comparators up to
  this one already sort (:func:`~recipes.data.sorting_networks.sorted_prefix`): the label is whether
  any node carries it, so a model that can find one node among hundreds must solve the task.

``data.order_index: true`` adds the comparator's index in the sequence to the node features (the
reference's base config, ``exclude_canonical=False``; its sorting-network preset and the default
here leave it out). ``model.readout``: ``mean`` (the reference's pooling) or ``max`` (per-node
logits, then the largest over each graph's nodes).

Networks are generated once per process and data config (same data for every encoder
and seed), and their PEs once per encoder.

``digraph_playground``: for every ordered pair of nodes of a random directed graph
(:mod:`recipes.data.digraphs`; Erdős–Rényi or DAG), predict whether ``u`` reaches ``v``
(``data.target: reach``) or the directed distance class ``0..max_dist`` with "unreachable"
as one more class (``data.target: dist``). No node features: the PE is the only signal.
Train on small graphs, test on larger ones. Metrics: pair accuracy ``test_acc`` (ranks runs)
and ``id_acc`` (training sizes), and for ``reach`` the balanced accuracy ``test_bacc``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mmpos.encoders.sincos import sincos_embed
from mmpos.nn.graph_transformer import GraphTransformer
from mmpos.runner.tasks import Task, register_task

from ..data.digraphs import directed_distances, random_digraph
from ..data.sorting_networks import TEST_CHANNELS, TRAIN_CHANNELS, build_dataset, network_graph, sorted_prefix

ENCODERS = ("none", "lap", "maglap", "drw")
SORTING_ENCODERS = (*ENCODERS, "oracle")
READOUTS = ("mean", "max")

DEFAULTS: dict[str, Any] = {
    "model": {
        "dim": 64,
        "depth": 3,
        "num_heads": 4,
        "mlp_ratio": 2.0,
        "elem_dim": 16,
        "eig_attention": False,
        "readout": "mean",
    },
    "data": {
        "train_channels": list(TRAIN_CHANNELS),
        "test_channels": list(TEST_CHANNELS),
        "train_networks": 1000,
        "test_networks": 100,
        "id_networks": 100,
        "data_seed": 20_230_723,
        "feat_dim": 32,
        "k": 16,
        "q": 0.25,
        "q_relative": True,
        "walk_length": 3,
        "ppr_alpha": 0.1,
        "eval_batch": 32,
        "order_index": False,
    },
}


@lru_cache(maxsize=4)
def _networks(channels: tuple[int, ...], num: int, seed: int, reverse: bool, feat_dim: int, order_index: bool) -> tuple:
    from torch_geometric.data import Data

    out = []
    for net in build_dataset(channels, num, seed, reverse=reverse):
        edge_index, chans = network_graph(net.comparators, net.num_channels, order_index=order_index)
        x = sincos_embed(chans[:, -2:].float().unsqueeze(0), feat_dim)[0]  # (c, feat_dim): channels i, j
        if order_index:  # (c, 2 * feat_dim): then the comparator's index
            x = torch.cat([x, sincos_embed(chans[:, :1].float().unsqueeze(0), feat_dim)[0]], 1)
        oracle = torch.from_numpy(sorted_prefix(net.comparators, net.num_channels)).float().unsqueeze(1)  # (c, 1)
        y = torch.tensor([int(net.label)])
        out.append(Data(x=x, edge_index=edge_index, y=y, num_nodes=len(chans), oracle_pe=oracle))
    return tuple(out)


@lru_cache(maxsize=16)
def _with_eigvecs(key: tuple, k: int, q: float, q_relative: bool) -> tuple:
    from mmpos.integrations.pyg import AddMagneticLaplacianPE

    pe = AddMagneticLaplacianPE(k, q=q, q_relative=q_relative)
    return tuple(pe.apply_many([g.clone() for g in _networks(*key)]))


@lru_cache(maxsize=16)
def _with_walks(key: tuple, walk_length: int, ppr_alpha: float) -> tuple:
    from mmpos.integrations.pyg import AddDirectionalRandomWalkPE

    drw = AddDirectionalRandomWalkPE(walk_length, ppr_alpha, mode="both")
    return tuple(drw(g.clone()) for g in _networks(*key))


def _split(d: dict[str, Any], which: str) -> tuple:
    channels = tuple(d["test_channels"] if which == "test" else d["train_channels"])
    num = d[f"{which}_networks"]
    seed = d["data_seed"] + {"train": 0, "test": 1, "id": 2}[which]
    return channels, num, seed, which == "test", d["feat_dim"], bool(d["order_index"])


def _model(encoder: str, m: dict[str, Any], d: dict[str, Any], in_dim: int | None, out_dim: int, **kw: Any):
    """The recipes' GraphTransformer: the encoder name decides which PE hooks it has."""
    from mmpos.integrations.pyg import AddDirectionalRandomWalkPE

    drw_channels = AddDirectionalRandomWalkPE(d["walk_length"], d["ppr_alpha"]).num_channels
    eig = {"k": d["k"], "elem_dim": m["elem_dim"], "attention": m["eig_attention"]}
    node_pe_dim = kw.pop("node_pe_dim", drw_channels if encoder == "drw" else None)
    return GraphTransformer(
        in_dim,
        m["dim"],
        m["depth"],
        m["num_heads"],
        out_dim,
        maglap=eig if encoder in ("lap", "maglap") else None,
        node_pe_dim=node_pe_dim,
        pair_dim=drw_channels if encoder == "drw" else None,
        mlp_ratio=m["mlp_ratio"],
        **kw,
    )


@register_task("sorting_networks", defaults={**DEFAULTS, "validation": {}})
def build(cfg: dict[str, Any], encoder: str, seed: int, device: torch.device) -> Task:
    from torch_geometric.data import Batch

    if encoder not in SORTING_ENCODERS:
        raise ValueError(f"sorting_networks: encoder must be one of {SORTING_ENCODERS}, got {encoder!r}")
    m, d = cfg["model"], cfg["data"]
    if m["readout"] not in READOUTS:
        raise ValueError(f"sorting_networks: model.readout must be one of {READOUTS}, got {m['readout']!r}")

    def graphs(which: str) -> tuple:
        key = _split(d, which)
        if encoder in ("lap", "maglap"):
            return _with_eigvecs(key, d["k"], 0.0 if encoder == "lap" else d["q"], d["q_relative"])
        if encoder == "drw":
            return _with_walks(key, d["walk_length"], d["ppr_alpha"])
        return _networks(*key)

    train, evals = graphs("train"), {"test_acc": graphs("test"), "id_acc": graphs("id")}
    readout = "none" if m["readout"] == "max" else "mean"
    oracle = {"node_pe_dim": 1, "node_pe_attr": "oracle_pe"} if encoder == "oracle" else {}
    in_dim = d["feat_dim"] * (2 if d["order_index"] else 1)
    model = _model(encoder, m, d, in_dim, 2, readout=readout, **oracle)

    def forward(model: nn.Module, batch) -> torch.Tensor:
        """``(B, 2)`` logits: the model's mean readout, or the largest per-node logits of each graph."""
        out = model(batch)
        if readout == "none":  # (num_nodes, 2) -> (B, 2)
            out = torch.full((batch.num_graphs, 2), float("-inf"), device=out.device, dtype=out.dtype).scatter_reduce(
                0, batch.batch.unsqueeze(1).expand_as(out), out, "amax"
            )
        return out

    def collate(items) -> Any:
        return Batch.from_data_list(list(items))

    def train_batch(step: int):
        bs = cfg["batch_size"]
        epoch, offset = divmod(step * bs, len(train))
        order = np.random.default_rng((seed, epoch)).permutation(len(train))
        idx = [order[(offset + i) % len(train)] for i in range(bs)]
        return collate([train[i] for i in idx])

    def loss(model: nn.Module, batch):
        batch = batch.to(device)
        logits = forward(model, batch)
        y = batch.y.view(-1)
        return F.cross_entropy(logits, y), {"train_acc": (logits.argmax(-1) == y).float().mean().item()}

    def evaluate(model: nn.Module) -> dict[str, float]:
        out = {}
        for name, items in evals.items():
            correct = 0
            for i in range(0, len(items), d["eval_batch"]):
                batch = collate(items[i : i + d["eval_batch"]]).to(device)
                correct += (forward(model, batch).argmax(-1) == batch.y.view(-1)).sum().item()
            out[name] = correct / len(items)
        return out

    # chance of test_acc: the better constant answer on the test split (a positive, its negative and the
    # reversed network per network; reversals rarely sort); the training split and id_acc are balanced.
    positives = sum(int(g.y) for g in evals["test_acc"]) / len(evals["test_acc"])
    chance = max(positives, 1.0 - positives)
    return Task(model=model, train_batch=train_batch, loss=loss, evaluate=evaluate, metric="test_acc", chance=chance)


PLAYGROUND_DEFAULTS: dict[str, Any] = {
    "model": {"dim": 64, "depth": 3, "num_heads": 4, "mlp_ratio": 2.0, "elem_dim": 16, "eig_attention": False},
    "data": {
        "target": "reach",
        "acyclic": False,
        "train_nodes": [16, 17],
        "test_nodes": [20, 27],
        "train_graphs": 2000,
        "test_graphs": 200,
        "id_graphs": 200,
        "data_seed": 20_230_724,
        "max_dist": 6,
        "k": 16,
        "q": 0.1,
        "q_relative": True,
        "walk_length": 3,
        "ppr_alpha": 0.1,
        "eval_batch": 64,
    },
}


@lru_cache(maxsize=4)
def _digraphs(sizes: tuple[int, int], num: int, seed: int, acyclic: bool, max_dist: int) -> tuple:
    from torch_geometric.data import Data

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(num):
        edge_index, n = random_digraph(int(rng.integers(sizes[0], sizes[1] + 1)), rng, acyclic=acyclic)
        dist = directed_distances(edge_index, n)
        dist = torch.where((dist < 0) | (dist > max_dist), max_dist + 1, dist)  # last class: unreachable or farther
        out.append(Data(edge_index=edge_index, num_nodes=n, dist=dist.flatten()))
    return tuple(out)


@lru_cache(maxsize=16)
def _playground_pe(
    key: tuple, encoder: str, k: int, q: float, q_relative: bool, walk_length: int, ppr_alpha: float
) -> tuple:
    from mmpos.integrations.pyg import AddDirectionalRandomWalkPE, AddMagneticLaplacianPE

    graphs = [g.clone() for g in _digraphs(*key)]
    if encoder in ("lap", "maglap"):
        pe = AddMagneticLaplacianPE(k, q=0.0 if encoder == "lap" else q, q_relative=q_relative)
        return tuple(pe.apply_many(graphs))
    if encoder == "drw":
        return tuple(AddDirectionalRandomWalkPE(walk_length, ppr_alpha, mode="both")(g) for g in graphs)
    return tuple(graphs)


@register_task("digraph_playground", defaults=PLAYGROUND_DEFAULTS)
def build_playground(cfg: dict[str, Any], encoder: str, seed: int, device: torch.device) -> Task:
    from torch_geometric.data import Batch

    if encoder not in ENCODERS:
        raise ValueError(f"digraph_playground: encoder must be one of {ENCODERS}, got {encoder!r}")
    m, d = cfg["model"], cfg["data"]
    if d["target"] not in ("reach", "dist"):
        raise ValueError(f"data.target must be 'reach' or 'dist', got {d['target']!r}")
    reach = d["target"] == "reach"
    num_out = 1 if reach else d["max_dist"] + 2

    def graphs(which: str) -> tuple:
        sizes = tuple(d["train_nodes"] if which != "test" else d["test_nodes"])
        offset = {"train": 0, "test": 1, "id": 2}[which]
        key = (sizes, d[f"{which}_graphs"], d["data_seed"] + offset, bool(d["acyclic"]), d["max_dist"])
        return _playground_pe(key, encoder, d["k"], d["q"], d["q_relative"], d["walk_length"], d["ppr_alpha"])

    train, evals = graphs("train"), {"test": graphs("test"), "id": graphs("id")}
    model = _model(encoder, m, d, None, num_out, readout="pair")

    def targets(batch):
        """``(pairs,)`` targets and the ``(B, N, N)`` mask of real off-diagonal pairs."""
        sizes = batch.ptr[1:] - batch.ptr[:-1]
        nodes = torch.arange(int(sizes.max()), device=sizes.device)[None] < sizes[:, None]  # (B, N)
        real = nodes[:, :, None] & nodes[:, None, :]
        mask = real & ~torch.eye(real.shape[1], dtype=torch.bool, device=real.device)
        dense = torch.zeros(real.shape, dtype=torch.long, device=real.device)
        dense[real] = batch.dist  # row-major (u, v) per graph, graphs in order: the same order as real's True entries
        y = dense[mask]
        return (y <= d["max_dist"]).long() if reach else y, mask

    def train_batch(step: int):
        bs = cfg["batch_size"]
        epoch, offset = divmod(step * bs, len(train))
        order = np.random.default_rng((seed, epoch)).permutation(len(train))
        return Batch.from_data_list([train[order[(offset + i) % len(train)]] for i in range(bs)])

    def pair_logits(model: nn.Module, batch):
        y, mask = targets(batch)
        return model(batch)[mask], y

    def loss(model: nn.Module, batch):
        batch = batch.to(device)
        logits, y = pair_logits(model, batch)
        if reach:
            out = F.binary_cross_entropy_with_logits(logits[:, 0], y.float())
            pred = (logits[:, 0] > 0).long()
        else:
            out, pred = F.cross_entropy(logits, y), logits.argmax(-1)
        return out, {"train_acc": (pred == y).float().mean().item()}

    def evaluate(model: nn.Module) -> dict[str, float]:
        out = {}
        for name, items in evals.items():
            preds, ys = [], []
            for i in range(0, len(items), d["eval_batch"]):
                logits, y = pair_logits(model, Batch.from_data_list(list(items[i : i + d["eval_batch"]])).to(device))
                preds.append((logits[:, 0] > 0).long() if reach else logits.argmax(-1))
                ys.append(y)
            pred, y = torch.cat(preds), torch.cat(ys)
            out[f"{name}_acc"] = (pred == y).float().mean().item()
            if reach and name == "test":
                recalls = [(pred[y == c] == c).float().mean().item() for c in (0, 1) if (y == c).any()]
                out["test_bacc"] = sum(recalls) / len(recalls)
        return out

    return Task(model=model, train_batch=train_batch, loss=loss, evaluate=evaluate, metric="test_acc")
