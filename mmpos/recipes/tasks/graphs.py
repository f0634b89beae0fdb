"""``sorting_networks``: does a sequence of comparators sort? Only the PE tells the order.

Data: :mod:`mmpos.data.sorting_networks` (the benchmark of Geisler et al., ICML 2023):
networks on 7-11 channels for training, 13-16 channels for the test (longer networks
than any seen in training), a held-out set on the training lengths (``id_acc``). One
node per comparator, edges from the previous comparator on each of its channels, node
features: sine-cosine features of the two channel indices only.

Model: :class:`mmpos.nn.GraphTransformer` (mean readout, two classes) with the run's
encoder:

* ``none``: no PE (the model sees a set of comparators and their channels);
* ``lap``: :class:`~mmpos.encoders.maglap.MagLapEncoder` on Laplacian eigenvectors (``q = 0``);
* ``maglap``: the same on magnetic-Laplacian eigenvectors (relative ``q = data.q``);
* ``drw``: directional random walks and PageRank, relative (attention bias) and absolute (node features).

Networks are generated once per process and data config (same data for every encoder
and seed), and their PEs once per encoder.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ...data.sorting_networks import TEST_CHANNELS, TRAIN_CHANNELS, build_dataset, network_graph
from ...encoders.sincos import sincos_embed
from ...nn.graph_transformer import GraphTransformer
from . import Task, register_task

ENCODERS = ("none", "lap", "maglap", "drw")

DEFAULTS: dict[str, Any] = {
    "model": {"dim": 64, "depth": 3, "num_heads": 4, "mlp_ratio": 2.0, "elem_dim": 16, "eig_attention": False},
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
        "walk_length": 3,
        "ppr_alpha": 0.1,
        "eval_batch": 32,
    },
}


@lru_cache(maxsize=4)
def _networks(channels: tuple[int, ...], num: int, seed: int, reverse: bool, feat_dim: int) -> tuple:
    from torch_geometric.data import Data

    out = []
    for net in build_dataset(channels, num, seed, reverse=reverse):
        edge_index, chans = network_graph(net.comparators, net.num_channels)
        x = sincos_embed(chans.float().unsqueeze(0), feat_dim)[0]  # (c, feat_dim)
        out.append(Data(x=x, edge_index=edge_index, y=torch.tensor([int(net.label)]), num_nodes=len(chans)))
    return tuple(out)


@lru_cache(maxsize=16)
def _with_eigvecs(key: tuple, k: int, q: float) -> tuple:
    from ...integrations.pyg import AddMagneticLaplacianPE

    return tuple(AddMagneticLaplacianPE(k, q=q).apply_many([g.clone() for g in _networks(*key)]))


@lru_cache(maxsize=16)
def _with_walks(key: tuple, walk_length: int, ppr_alpha: float) -> tuple:
    from ...integrations.pyg import AddDirectionalRandomWalkPE

    drw = AddDirectionalRandomWalkPE(walk_length, ppr_alpha, mode="both")
    return tuple(drw(g.clone()) for g in _networks(*key))


def _split(d: dict[str, Any], which: str) -> tuple:
    channels = tuple(d["test_channels"] if which == "test" else d["train_channels"])
    num = d[f"{which}_networks"]
    seed = d["data_seed"] + {"train": 0, "test": 1, "id": 2}[which]
    return channels, num, seed, which == "test", d["feat_dim"]


@register_task("sorting_networks", defaults=DEFAULTS)
def build(cfg: dict[str, Any], encoder: str, seed: int, device: torch.device) -> Task:
    from torch_geometric.data import Batch

    from ...integrations.pyg import AddDirectionalRandomWalkPE

    if encoder not in ENCODERS:
        raise ValueError(f"sorting_networks: encoder must be one of {ENCODERS}, got {encoder!r}")
    m, d = cfg["model"], cfg["data"]
    drw_channels = AddDirectionalRandomWalkPE(d["walk_length"], d["ppr_alpha"]).num_channels

    def graphs(which: str) -> tuple:
        key = _split(d, which)
        if encoder in ("lap", "maglap"):
            return _with_eigvecs(key, d["k"], 0.0 if encoder == "lap" else d["q"])
        if encoder == "drw":
            return _with_walks(key, d["walk_length"], d["ppr_alpha"])
        return _networks(*key)

    train, evals = graphs("train"), {"test_acc": graphs("test"), "id_acc": graphs("id")}
    model = GraphTransformer(
        d["feat_dim"],
        m["dim"],
        m["depth"],
        m["num_heads"],
        2,
        maglap={"k": d["k"], "elem_dim": m["elem_dim"], "attention": m["eig_attention"]}
        if encoder in ("lap", "maglap")
        else None,
        node_pe_dim=drw_channels if encoder == "drw" else None,
        pair_dim=drw_channels if encoder == "drw" else None,
        mlp_ratio=m["mlp_ratio"],
    )

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
        logits = model(batch)
        y = batch.y.view(-1)
        return F.cross_entropy(logits, y), {"train_acc": (logits.argmax(-1) == y).float().mean().item()}

    def evaluate(model: nn.Module) -> dict[str, float]:
        out = {}
        for name, items in evals.items():
            correct = 0
            for i in range(0, len(items), d["eval_batch"]):
                batch = collate(items[i : i + d["eval_batch"]]).to(device)
                correct += (model(batch).argmax(-1) == batch.y.view(-1)).sum().item()
            out[name] = correct / len(items)
        return out

    return Task(model=model, train_batch=train_batch, loss=loss, evaluate=evaluate, metric="test_acc")
