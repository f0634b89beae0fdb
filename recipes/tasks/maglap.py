"""Decisive magnetic-Laplacian tasks: ``maglap_direction`` (synthetic) and ``maglap_programs`` (real graphs).

Paper: Geisler et al., "Transformers Meet Directed Graphs", ICML 2023 (arXiv:2302.00049).
Sec. 3 claims that the magnetic Laplacian's complex eigenvectors encode edge direction, which
the symmetric Laplacian (``q = 0``) cannot; Sec. 6 (Table 4) measures it on ogbg-code2, whose
graphs are Python ASTs. Reference: google-deepmind/digraph_transformer.

``maglap_direction`` (:mod:`recipes.data.dag_direction`): per node of a random DAG, is it nearer
the sinks than the sources (depth > height)? Every graph is followed by its reversal, which flips
every label and leaves the undirected graph unchanged, so ``none`` and ``lap`` are at chance by
construction (their predictions for a graph and its reversal are the same); no node features.

``maglap_programs`` (:mod:`recipes.data.program_graphs`): program graphs of the installed standard
library's functions (AST + next-statement + data-flow edges, node feature = AST class); for every
ordered pair ``(u, v)`` where one node reaches the other, does ``u`` reach ``v`` ("``u`` is an
ancestor of ``v``")? Exactly half the pairs are positive. ``data.node_features: false`` drops the
AST classes (the structure alone: the classes tell much of the direction by themselves). Train on functions of
``data.train_nodes`` nodes, test on larger ones (``data.test_nodes``); ``id_acc`` on held-out
functions of the training sizes.

Encoders (one name each):

* ``none``: no PE; ``lap``: :class:`~mmpos.encoders.maglap.MagLapEncoder` on Laplacian eigenvectors
  (``q = 0``); ``maglap``: the same with relative potential ``data.q``;
* ``drw``: directional random walks + PageRank (node features and attention bias);
* ``oracle``: the positive control, the answer's ingredients as node features (depth and height for
  ``maglap_direction``; the node's preorder index, along which every edge points, for
  ``maglap_programs``). It must reach 90 % or the run is "not measured".

Model: :class:`mmpos.nn.GraphTransformer` (``readout="none"`` per node, ``"pair"`` per pair).
Metrics: ``test_acc`` (ranks runs) and ``id_acc``; ``maglap_direction`` also reports
``test_pair_consistency``, the share of labelled nodes whose predictions for a graph and its
reversal differ (1.0 = the encoder sees direction everywhere, 0.0 = blind).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mmpos.runner.tasks import Task, parse_encoders, register_task

from ..data.dag_direction import direction_pairs
from ..data.program_graphs import NODE_TYPES, ancestor_pairs, stdlib_program_graphs

ENCODERS = ("none", "lap", "maglap", "drw", "oracle")

_MODEL = {"dim": 32, "depth": 2, "num_heads": 4, "mlp_ratio": 2.0, "elem_dim": 16, "eig_attention": False}
DIRECTION_DEFAULTS: dict[str, Any] = {
    "model": dict(_MODEL),
    "data": {
        "train_nodes": [8, 16],
        "test_nodes": [17, 24],
        "train_graphs": 400,  # x2: each with its reversal
        "test_graphs": 100,
        "id_graphs": 100,
        "data_seed": 20_261_201,
        "k": 8,
        "q": 0.25,
        "q_relative": True,
        "walk_length": 3,
        "ppr_alpha": 0.1,
        "eval_batch": 64,
    },
}
PROGRAM_DEFAULTS: dict[str, Any] = {
    "model": dict(_MODEL),
    "data": {
        "train_nodes": [12, 32],
        "test_nodes": [33, 64],
        "train_graphs": 1000,
        "test_graphs": 200,
        "id_graphs": 200,
        "node_features": True,
        "k": 16,
        "q": 0.25,
        "q_relative": True,
        "walk_length": 3,
        "ppr_alpha": 0.1,
        "eval_batch": 32,
    },
}


def _check(encoder: str, task: str) -> str:
    name = parse_encoders(encoder, combine=False).names[0]
    if name not in ENCODERS:
        raise ValueError(f"{task}: encoder must be one of {ENCODERS}, got {encoder!r}")
    return name


def _raw(key: tuple) -> tuple:
    """The graphs of ``key``: ``("direction", sizes, num, seed)`` or ``("programs", train, test, counts, split)``."""
    if key[0] == "direction":
        return _direction_graphs(*key[1:])
    return _program_graphs(*key[1:4])[key[4]]


@lru_cache(maxsize=16)
def _with_pe(key: tuple, encoder: str, k: int, q: float, q_relative: bool, walk_length: int, ppr_alpha: float):
    """The graphs of ``key`` (see :func:`_raw`) with the encoder's PE attributes (once per process and encoder)."""
    from mmpos.integrations.pyg import AddDirectionalRandomWalkPE, AddMagneticLaplacianPE

    graphs = [g.clone() for g in _raw(key)]
    if encoder in ("lap", "maglap"):
        pe = AddMagneticLaplacianPE(k, q=0.0 if encoder == "lap" else q, q_relative=q_relative)
        return tuple(pe.apply_many(graphs))
    if encoder == "drw":
        return tuple(AddDirectionalRandomWalkPE(walk_length, ppr_alpha, mode="both")(g) for g in graphs)
    return tuple(graphs)


def _model(encoder: str, m: dict[str, Any], d: dict[str, Any], in_dim: int | None, out_dim: int, readout: str):
    from mmpos.integrations.pyg import AddDirectionalRandomWalkPE
    from mmpos.nn.graph_transformer import GraphTransformer

    drw = AddDirectionalRandomWalkPE(d["walk_length"], d["ppr_alpha"]).num_channels
    node_pe = {"drw": drw, "oracle": 2}.get(encoder)
    return GraphTransformer(
        in_dim,
        m["dim"],
        m["depth"],
        m["num_heads"],
        out_dim,
        maglap={"k": d["k"], "elem_dim": m["elem_dim"], "attention": m["eig_attention"]}
        if encoder in ("lap", "maglap")
        else None,
        node_pe_dim=node_pe,
        pair_dim=drw if encoder == "drw" else None,
        mlp_ratio=m["mlp_ratio"],
        readout=readout,
        node_pe_attr="oracle_pe" if encoder == "oracle" else "drw_pe",
    )


def _sampler(train: tuple, batch_size: int, seed: int):
    from torch_geometric.data import Batch

    def train_batch(step: int):
        epoch, offset = divmod(step * batch_size, len(train))
        order = np.random.default_rng((seed, epoch)).permutation(len(train))
        return Batch.from_data_list([train[order[(offset + i) % len(train)]] for i in range(batch_size)])

    return train_batch


@lru_cache(maxsize=4)
def _direction_graphs(sizes: tuple[int, int], num: int, seed: int) -> tuple:
    from torch_geometric.data import Data

    out = []
    for item in direction_pairs(num, sizes, seed):
        n = item["num_nodes"]
        oracle = torch.stack([item["depth"], item["height"]], -1).float() / 8.0  # (n, 2)
        out.append(
            Data(edge_index=item["edge_index"], num_nodes=n, y=item["label"], y_mask=item["mask"], oracle_pe=oracle)
        )
    return tuple(out)


@register_task("maglap_direction", defaults={**DIRECTION_DEFAULTS, "validation": {}})
def build_direction(cfg: dict[str, Any], encoder: str, seed: int, device: torch.device) -> Task:
    from torch_geometric.data import Batch

    encoder = _check(encoder, "maglap_direction")
    m, d = cfg["model"], cfg["data"]
    pe = (d["k"], float(d["q"]), bool(d["q_relative"]), d["walk_length"], d["ppr_alpha"])

    def graphs(which: str) -> tuple:
        sizes = tuple(d["test_nodes"] if which == "test" else d["train_nodes"])
        seed = d["data_seed"] + {"train": 0, "test": 1, "id": 2}[which]
        return _with_pe(("direction", sizes, d[f"{which}_graphs"], seed), encoder, *pe)

    train, evals = graphs("train"), {"test": graphs("test"), "id": graphs("id")}
    model = _model(encoder, m, d, None, 2, "none")

    def loss(model: nn.Module, batch):
        batch = batch.to(device)
        logits = model(batch)[batch.y_mask]
        y = batch.y[batch.y_mask]
        return F.cross_entropy(logits, y), {"train_acc": (logits.argmax(-1) == y).float().mean().item()}

    def evaluate(model: nn.Module) -> dict[str, float]:
        out = {}
        for name, items in evals.items():
            preds, ys, masks = [], [], []
            for i in range(0, len(items), d["eval_batch"]):
                batch = Batch.from_data_list(list(items[i : i + d["eval_batch"]])).to(device)
                preds.append(model(batch).argmax(-1))
                ys.append(batch.y)
                masks.append(batch.y_mask)
            pred, y, mask = torch.cat(preds), torch.cat(ys), torch.cat(masks)
            out[f"{name}_acc"] = (pred[mask] == y[mask]).float().mean().item()
            if name == "test":  # graph 2i and 2i + 1 are reversals of each other, node for node
                sizes = torch.tensor([g.num_nodes for g in items])
                starts = torch.cumsum(sizes, 0) - sizes
                fwd = torch.cat([torch.arange(s, s + n) for s, n in zip(starts[0::2].tolist(), sizes[0::2].tolist())])
                rev = fwd + sizes[0::2].repeat_interleave(sizes[0::2])
                keep = mask[fwd]
                out["test_pair_consistency"] = (pred[fwd][keep] != pred[rev][keep]).float().mean().item()
        return out

    return Task(
        model=model,
        train_batch=_sampler(train, cfg["batch_size"], seed),
        loss=loss,
        evaluate=evaluate,
        metric="test_acc",
        chance=0.5,  # balanced by construction: every graph with its reversal / half the pairs positive
    )


@lru_cache(maxsize=2)
def _program_graphs(train: tuple[int, int], test: tuple[int, int], counts: tuple[int, int, int]) -> dict[str, tuple]:
    from torch_geometric.data import Data

    buckets = [(train[0], train[1], counts[0]), (test[0], test[1], counts[1]), (train[0], train[1], counts[2])]
    out = {}
    for name, graphs in zip(("train", "test", "id"), stdlib_program_graphs(buckets)):
        items = []
        for g in graphs:
            n = g.num_nodes
            mask, label = ancestor_pairs(g.edge_index, n)
            x = F.one_hot(g.node_type, len(NODE_TYPES) + 1).float()
            order = torch.arange(n, dtype=torch.float32)  # preorder: every edge points forward
            oracle = torch.stack([order / 64.0, torch.full((n,), n / 64.0)], -1)
            items.append(
                Data(
                    x=x,
                    edge_index=g.edge_index,
                    num_nodes=n,
                    pair_mask=mask.flatten(),
                    pair_label=label.flatten(),
                    oracle_pe=oracle,
                )
            )
        out[name] = tuple(items)
    return out


@register_task("maglap_programs", defaults={**PROGRAM_DEFAULTS, "validation": {}})
def build_programs(cfg: dict[str, Any], encoder: str, seed: int, device: torch.device) -> Task:
    from torch_geometric.data import Batch

    encoder = _check(encoder, "maglap_programs")
    m, d = cfg["model"], cfg["data"]
    pe = (d["k"], float(d["q"]), bool(d["q_relative"]), d["walk_length"], d["ppr_alpha"])
    key = (
        "programs",
        tuple(d["train_nodes"]),
        tuple(d["test_nodes"]),
        (d["train_graphs"], d["test_graphs"], d["id_graphs"]),
    )
    train, evals = (
        _with_pe((*key, "train"), encoder, *pe),
        {k: _with_pe((*key, k), encoder, *pe) for k in ("test", "id")},
    )
    model = _model(encoder, m, d, len(NODE_TYPES) + 1 if d["node_features"] else None, 2, "pair")

    def pair_logits(model: nn.Module, batch):
        sizes = batch.ptr[1:] - batch.ptr[:-1]
        nodes = torch.arange(int(sizes.max()), device=sizes.device)[None] < sizes[:, None]  # (B, N)
        real = nodes[:, :, None] & nodes[:, None, :]  # (B, N, N)
        dense_mask = torch.zeros(real.shape, dtype=torch.bool, device=real.device)
        dense_label = torch.zeros(real.shape, dtype=torch.long, device=real.device)
        dense_mask[real] = batch.pair_mask  # row-major (u, v) per graph, in graph order
        dense_label[real] = batch.pair_label.long()
        return model(batch)[dense_mask], dense_label[dense_mask]

    def loss(model: nn.Module, batch):
        logits, y = pair_logits(model, batch.to(device))
        return F.cross_entropy(logits, y), {"train_acc": (logits.argmax(-1) == y).float().mean().item()}

    def evaluate(model: nn.Module) -> dict[str, float]:
        out = {}
        for name, items in evals.items():
            correct = total = 0
            for i in range(0, len(items), d["eval_batch"]):
                logits, y = pair_logits(model, Batch.from_data_list(list(items[i : i + d["eval_batch"]])).to(device))
                correct += (logits.argmax(-1) == y).sum().item()
                total += y.numel()
            out[f"{name}_acc"] = correct / total
        return out

    return Task(
        model=model,
        train_batch=_sampler(train, cfg["batch_size"], seed),
        loss=loss,
        evaluate=evaluate,
        metric="test_acc",
        chance=0.5,  # balanced by construction: every graph with its reversal / half the pairs positive
    )
