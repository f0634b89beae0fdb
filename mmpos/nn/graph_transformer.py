"""A transformer over the nodes of each graph of a PyG ``Batch``, with graph PEs.

Each graph's nodes form one padded token sequence (``B`` graphs, ``N`` = most nodes);
padding keys are masked. Position information enters through the hooks of
:mod:`mmpos.nn`: magnetic-Laplacian eigenvectors through the additive hook
(:class:`mmpos.encoders.maglap.MagLapEncoder`), absolute random-walk features through
the additive hook (:class:`NodeFeatureEncoder`), relative random-walk features through
the bias hook (:class:`PairwiseBias`, a :class:`mmpos.encoders.BiasEncoder` adding
``Linear(P -> H)`` of the pairwise features to the attention logits). All read a
:class:`mmpos.graph.GraphCoords` built by :meth:`GraphTransformer.coords`.

Reference for the architecture (a plain transformer on the nodes with the PE added to
the node embeddings, or a bias on the logits): Geisler et al., ICML 2023,
google-deepmind/digraph_transformer ``models.py``. The batch is read by attribute
name (``x``, ``batch``, ``ptr`` and the transforms' attributes), so this module
imports no PyG code.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..coords import Coords
from ..encoders.base import AdditiveEncoder, BiasEncoder
from ..encoders.maglap import MagLapEncoder
from ..encoders.registry import make_info, model_context
from ..graph.coords import GraphCoords
from .blocks import Block
from .placement import Placement, PositionalBackbone, attach

__all__ = ["READOUTS", "RECORDS", "GraphTransformer", "NodeFeatureEncoder", "PairwiseBias"]

READOUTS = ("mean", "none", "pair")


class PairwiseBias(BiasEncoder):
    """``Linear(P -> H)`` of ``coords.pair`` ``(B, N, N, P)`` -> logits bias ``(B, H, N, N)``."""

    def __init__(self, pair_dim: int, num_heads: int) -> None:
        super().__init__()
        self.proj = nn.Linear(pair_dim, num_heads)

    def bias(self, q: Tensor, k: Tensor, coords: Coords) -> Tensor:
        return self.proj(coords.pair.to(q.dtype)).permute(0, 3, 1, 2)


class NodeFeatureEncoder(AdditiveEncoder):
    """MLP of ``coords.node_pe`` ``(B, N, F)`` -> ``(B, N, dim)`` (e.g. absolute random walks)."""

    def __init__(self, in_dim: int, dim: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(in_dim, dim), nn.ReLU(), nn.Linear(dim, dim))

    def embed(self, coords: Coords) -> Tensor:
        out = self.mlp(coords.node_pe.to(self.mlp[0].weight.dtype))
        return out if coords.mask is None else out * coords.mask.unsqueeze(-1).to(out.dtype)


_PAPER = "Geisler et al. 2023, Transformers Meet Directed Graphs (arXiv:2302.00049)"
_REFERENCE = "google-deepmind/digraph_transformer models.py"
#: the graph transformer's encoders, by the name its ``pos_*`` dicts use: each reads ``dim`` (and
#: ``num_heads``) only, so maglap keeps its own attention heads
RECORDS = {
    "maglap": make_info("maglap", MagLapEncoder, _PAPER, reference=_REFERENCE, context={"dim": "dim"}),
    "node_pe": make_info("node_pe", NodeFeatureEncoder, _PAPER, reference=_REFERENCE, context={"dim": "dim"}),
    "pair": make_info("pair", PairwiseBias, _PAPER, reference=_REFERENCE, context={"num_heads": "num_heads"}),
}


def _dense_nodes(value: Tensor, batch: Tensor, local: Tensor, b: int, n: int) -> Tensor:
    out = value.new_zeros((b, n, *value.shape[1:]))
    out[batch, local] = value
    return out


class GraphTransformer(PositionalBackbone, nn.Module):
    """Transformer over graph nodes; graph PEs through the additive and bias hooks.

    Args:
        in_dim: node feature width (``batch.x``), or ``None`` for graphs without node
            features (every node starts from one learned vector, so the PEs are the only signal).
        dim, depth, num_heads, mlp_ratio: the stack.
        out_dim: output width.
        maglap: keyword arguments of :class:`MagLapEncoder` (``k``, ``num_q``, ...), or ``None``.
        node_pe_dim: width of absolute node PEs (``batch[node_pe_attr]``), or ``None``.
        pair_dim: width of relative pairwise PEs (``batch[pair_attr]`` with ``pair_attr + "_index"``), or ``None``.
        readout: ``"mean"`` (one output per graph, ``(B, out_dim)``), ``"none"`` (one per
            node, ``(num_nodes, out_dim)`` in the batch's node order) or ``"pair"`` (one per
            ordered node pair, ``(B, N, N, out_dim)`` from an MLP of ``[h_u, h_v]``; padding pairs are
            meaningless, mask them with ``coords.mask``).
        maglap_attr, node_pe_attr, pair_attr: attribute names written by the transforms.

    Encoders are placed by :class:`~mmpos.nn.placement.Placement` from :data:`RECORDS`, keyed by
    name: ``pos_encoders["maglap"]``, ``pos_encoders["node_pe"]`` and ``blocks[i].attn.encoders["pair"]``.

    ``forward(batch)``; :meth:`coords` builds the dense tokens and :class:`GraphCoords`
    (a data-dependent step: it reads the largest graph size from ``batch.ptr``).
    """

    def __init__(
        self,
        in_dim: int | None,
        dim: int,
        depth: int,
        num_heads: int,
        out_dim: int,
        maglap: dict[str, Any] | None = None,
        node_pe_dim: int | None = None,
        pair_dim: int | None = None,
        mlp_ratio: float = 2.0,
        readout: str = "mean",
        maglap_attr: str = "maglap_pe",
        node_pe_attr: str = "drw_pe",
        pair_attr: str = "drw_pe_pair",
    ) -> None:
        super().__init__()
        if readout not in READOUTS:
            raise ValueError(f"readout must be one of {READOUTS}, got {readout!r}")
        self.readout = readout
        self.maglap_attr, self.node_pe_attr, self.pair_attr = maglap_attr, node_pe_attr, pair_attr
        self.inp = nn.Linear(in_dim, dim) if in_dim is not None else None
        self.start = nn.Parameter(torch.randn(dim) * 0.02) if in_dim is None else None
        names, kwargs = [], {}
        if maglap is not None:
            names.append("maglap")
            kwargs["maglap"] = dict(maglap)
        if node_pe_dim is not None:
            names.append("node_pe")
            kwargs["node_pe"] = {"in_dim": node_pe_dim}
        if pair_dim:
            names.append("pair")
            kwargs["pair"] = {"pair_dim": pair_dim}
        placement = Placement(names, kwargs, model_context(dim, num_heads, depth), records=RECORDS)
        additive, layers, blocks = placement.additive(), [], []
        for _ in range(depth):  # each block's pair bias, then the block (the order of the random init)
            layers.append(placement.layer(len(blocks)))
            blocks.append(Block(dim, num_heads, mlp_ratio))
        self.blocks = nn.ModuleList(blocks)
        attach(self, additive, placement.shared(), placement.convs(), [b.attn for b in blocks], layers, "encoders")
        self.norm = nn.LayerNorm(dim)
        if readout == "pair":
            self.head = nn.Sequential(nn.Linear(2 * dim, dim), nn.ReLU(), nn.Linear(dim, out_dim))
        else:
            self.head = nn.Linear(dim, out_dim)

    def coords(self, batch: Any) -> tuple[Tensor, GraphCoords, Tensor, Tensor]:
        """``(x (B, N, dim), coords, batch_index (n_total,), local_index (n_total,))`` of a PyG batch."""
        ptr = batch.ptr
        b = ptr.numel() - 1
        n = int((ptr[1:] - ptr[:-1]).max())
        graph = batch.batch
        local = torch.arange(graph.numel(), device=ptr.device) - ptr[graph]
        if self.inp is not None:
            x = _dense_nodes(self.inp(batch.x.to(self.inp.weight.dtype)), graph, local, b, n)
        else:
            x = self.start.expand(b, n, -1)
        mask = _dense_nodes(torch.ones_like(graph, dtype=torch.bool), graph, local, b, n)
        fields: dict[str, Tensor] = {}
        if "maglap" in self.pos_encoders:
            vec, val = batch[self.maglap_attr], batch[f"{self.maglap_attr}_eigval"]
            if vec.dim() == 2:  # one potential: add the Q axis
                vec, val = vec.unsqueeze(1), val.unsqueeze(1)
            fields.update(
                eigvec=_dense_nodes(vec, graph, local, b, n), eigval=val, eig_mask=batch[f"{self.maglap_attr}_mask"]
            )
        if "node_pe" in self.pos_encoders:
            fields["node_pe"] = _dense_nodes(batch[self.node_pe_attr], graph, local, b, n)
        if self.blocks and "pair" in self.blocks[0].attn.encoders:
            src, dst = batch[f"{self.pair_attr}_index"]
            feat = batch[self.pair_attr]
            pair = feat.new_zeros((b, n, n, feat.shape[-1]))
            pair[graph[src], local[src], local[dst]] = feat
            fields["pair"] = pair
        pos = local.new_zeros((b, n)).float()
        pos[graph, local] = local.float()
        coords = GraphCoords(pos=pos.unsqueeze(-1), axes=("node",), mask=mask, **fields)
        return x, coords, graph, local

    def forward(self, batch: Any) -> Tensor:
        x, coords, graph, local = self.coords(batch)
        x = self.pos_add(x, coords)
        for block in self.blocks:
            x = block(x, coords)
        x = self.norm(x)
        if self.readout == "none":
            return self.head(x[graph, local])
        if self.readout == "pair":
            n = x.shape[1]
            return self.head(
                torch.cat([x.unsqueeze(2).expand(-1, -1, n, -1), x.unsqueeze(1).expand(-1, n, -1, -1)], -1)
            )
        w = coords.mask.unsqueeze(-1).to(x.dtype)
        return self.head((x * w).sum(1) / w.sum(1))
