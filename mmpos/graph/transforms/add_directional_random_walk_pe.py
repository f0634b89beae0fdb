"""``AddDirectionalRandomWalkPE``: forward and reverse random walks and PageRank."""

from __future__ import annotations

import torch

from ..._extras import requires
from ..random_walk import check_walk, directional_random_walk_node_pe, directional_random_walks

with requires("graph"):  # one line naming the package and the extra when it is missing
    from torch_geometric.data import Data
    from torch_geometric.transforms import BaseTransform

__all__ = ["AddDirectionalRandomWalkPE"]

MODES = ("absolute", "relative", "both")


class AddDirectionalRandomWalkPE(BaseTransform):
    r"""Adds the directional random-walk encodings of the
    `"Transformers Meet Directed Graphs" <https://arxiv.org/abs/2302.00049>`_ paper
    (Geisler et al., ICML 2023; reference google-deepmind/digraph_transformer,
    ``utils.py`` ``k_step_random_walk`` / ``exact_ppr``) to the given graph.

    Walks :math:`T^1, \dots, T^L` with :math:`T = D_{out}^{-1} A` (sinks self-looped),
    personalised PageRank :math:`\alpha (I - (1 - \alpha) T)^{-1}`, for the graph and
    its reverse: :math:`F = 2 (L + [\alpha])` channels (see
    :mod:`mmpos.graph.random_walk`). Unlike
    :class:`torch_geometric.transforms.AddRandomWalkPE` (return probabilities of an
    undirected walk), direction is kept.

    Stored on ``data`` (float32):

    * absolute (``mode`` ``"absolute"`` / ``"both"``): ``data[attr_name]`` ``(n, F)``,
      column sums of the walk matrices (expected walkers per node);
    * relative (``"relative"`` / ``"both"``): the non-zero pairs of the ``(n, n, F)``
      tensor as ``data[attr_name + "_pair_index"]`` ``(2, p)`` (source, target; the
      name holds ``index`` so batching offsets it) and ``data[attr_name + "_pair"]``
      ``(p, F)``; ``torch_geometric.utils.to_dense_adj(index, batch, edge_attr=pair)``
      rebuilds the dense ``(B, N, N, F)`` tensor.

    Args:
        walk_length (int): :math:`L`. (default: :obj:`3`, as the reference)
        ppr_alpha (float, optional): restart probability, :obj:`None` for no PageRank.
            (default: :obj:`0.1`)
        attr_name (str): attribute name prefix. (default: :obj:`"drw_pe"`)
        mode (str): :obj:`"absolute"`, :obj:`"relative"` or :obj:`"both"`. (default: :obj:`"both"`)
        max_nodes (int): largest graph for the dense relative form. (default: :obj:`4096`)
    """

    def __init__(
        self,
        walk_length: int = 3,
        ppr_alpha: float | None = 0.1,
        attr_name: str = "drw_pe",
        mode: str = "both",
        max_nodes: int = 4096,
    ) -> None:
        check_walk(walk_length, ppr_alpha)
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if not isinstance(attr_name, str) or not attr_name:
            raise ValueError(f"attr_name must be a non-empty str, got {attr_name!r}")
        self.walk_length, self.ppr_alpha, self.attr_name, self.mode, self.max_nodes = (
            walk_length,
            ppr_alpha,
            attr_name,
            mode,
            max_nodes,
        )

    @property
    def num_channels(self) -> int:
        """``F``, the channels of either form."""
        return 2 * (self.walk_length + (self.ppr_alpha is not None))

    def forward(self, data: Data) -> Data:
        if data.edge_index is None or data.num_nodes is None:
            raise ValueError("data.edge_index and data.num_nodes must be set")
        n, ei = int(data.num_nodes), data.edge_index
        if self.mode in ("absolute", "both"):
            data[self.attr_name] = directional_random_walk_node_pe(ei, n, self.walk_length, self.ppr_alpha).float()
        if self.mode in ("relative", "both"):
            rel = directional_random_walks(ei, n, self.walk_length, self.ppr_alpha, self.max_nodes)
            src, dst = (rel != 0).any(-1).nonzero(as_tuple=True)
            data[f"{self.attr_name}_pair_index"] = torch.stack([src, dst])
            data[f"{self.attr_name}_pair"] = rel[src, dst].float()
        return data

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}(walk_length={self.walk_length}, ppr_alpha={self.ppr_alpha}, mode={self.mode!r})"
        )
