"""torch-geometric integration: directed-graph PE transforms and the module that feeds them to PyG layers.

* :class:`AddMagneticLaplacianPE`: magnetic-Laplacian eigenvectors (complex, direction-aware);
  ``attr_name=None`` concatenates ``[Re, Im]`` onto ``data.x`` as PyG's PE transforms do;
* :class:`AddDirectionalRandomWalkPE`: forward/reverse random walks and PageRank,
  absolute (node features) and relative (pairwise, for attention biases);
* :class:`MagLapNodePE`: a batch's PE attributes -> node features ``(num_nodes, dim)``, the ``x``
  that :class:`torch_geometric.nn.GPSConv` (or any PyG layer) takes, without hand-written glue.

The transforms follow PyG's conventions (``BaseTransform``, ``attr_name``, ``__repr__``,
usable inside ``T.Compose`` and as a dataset ``pre_transform``). Models that consume them:
:class:`mmpos.encoders.maglap.MagLapEncoder` and :class:`mmpos.nn.GraphTransformer`.
Docs: ``docs/encoders/magnetic-laplacian.md``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .._validate import check_int
from ..encoders.maglap import MagLapEncoder
from ..graph.transforms import AddDirectionalRandomWalkPE, AddMagneticLaplacianPE

__all__ = ["AddDirectionalRandomWalkPE", "AddMagneticLaplacianPE", "MagLapNodePE"]


class MagLapNodePE(nn.Module):
    r"""Node features for PyG layers from :class:`AddMagneticLaplacianPE`'s attributes.

    ``forward(batch) -> (num_nodes, dim)``: the :class:`~mmpos.encoders.maglap.MagLapEncoder`
    output per node, plus ``Linear(in_dim, dim)(batch.x)`` when ``in_dim`` is given — the ``x``
    that :class:`torch_geometric.nn.GPSConv` takes (``GPSConv(dim, conv)(h, batch.edge_index,
    batch.batch)``). It reads ``batch[attr_name]`` ``(N, K)`` or ``(N, Q, K)``,
    ``batch[attr_name + "_eigval"]`` ``(B, K)`` / ``(B, Q, K)`` and ``batch[attr_name + "_mask"]``
    ``(B, K)``, and spreads the per-graph ones to nodes through ``batch.batch`` (a single
    :class:`~torch_geometric.data.Data` works too).

    Args:
        dim: output width. k: eigenpairs per potential. num_q: potentials (1 for a float ``q``).
        in_dim: width of ``batch.x`` to embed and add (``None``: the PE alone).
        attr_name: the transform's ``attr_name``.
        **encoder_kwargs: passed to :class:`~mmpos.encoders.maglap.MagLapEncoder` (``preset=``, ...).
    """

    def __init__(
        self,
        dim: int,
        k: int,
        num_q: int = 1,
        in_dim: int | None = None,
        attr_name: str = "maglap_pe",
        **encoder_kwargs: Any,
    ) -> None:
        super().__init__()
        if not isinstance(attr_name, str) or not attr_name:
            raise ValueError(f"attr_name must be a non-empty str (the transform's), got {attr_name!r}")
        check_int(in_dim, "in_dim", none_ok=True)
        self.attr_name = attr_name
        self.encoder = MagLapEncoder(dim, k, num_q, **encoder_kwargs)
        self.input = None if in_dim is None else nn.Linear(in_dim, dim)

    def forward(self, batch: Any) -> Tensor:
        name = self.attr_name
        vec, val, mask = batch[name], batch[f"{name}_eigval"], batch[f"{name}_mask"]
        if vec.dim() == 2:  # one q: (N, K) -> (N, 1, K), (B, K) -> (B, 1, K)
            vec, val = vec.unsqueeze(-2), val.unsqueeze(-2)
        index = getattr(batch, "batch", None)
        if index is None:  # a single Data: one graph
            index = vec.new_zeros(vec.shape[0], dtype=torch.long)
        out = self.encoder.encode(vec, val[index], mask[index])  # (N, dim)
        if self.input is not None:
            if batch.x is None:
                raise ValueError("MagLapNodePE(in_dim=...) embeds batch.x, but the batch has no x")
            out = out + self.input(batch.x)
        return out
