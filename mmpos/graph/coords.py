"""Coordinates of the nodes of a batch of graphs, with their graph PEs.

:class:`GraphCoords` is a :class:`mmpos.Coords` (one token per node, axis ``"node"``
holding the node index within its graph, ``mask`` for padding nodes) that also carries
the inputs of graph position encoders, so they reach models through the ordinary
hooks: additive encoders read the node-level fields, bias encoders the pairwise one.

Fields (``B`` graphs padded to ``N`` nodes; all optional):

* ``eigvec`` complex ``(B, N, Q, K)`` and ``eigval`` float ``(B, Q, K)``, ``eig_mask``
  bool ``(B, K)``: magnetic-Laplacian eigenpairs (``Q`` potentials, ``K`` pairs);
* ``node_pe`` float ``(B, N, F)``: other node features such as absolute random walks;
* ``pair`` float ``(B, N, N, P)``: pairwise features such as relative random walks.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from ..coords import Coords

__all__ = ["GraphCoords"]


def _shape_error(name: str, want: str, got: Tensor) -> ValueError:
    return ValueError(f"{name} must have shape {want}, got {tuple(got.shape)}")


@dataclass(frozen=True, eq=False)
class GraphCoords(Coords):
    """:class:`mmpos.Coords` of graph nodes plus graph PEs (see the module docstring)."""

    eigvec: Tensor | None = None
    eigval: Tensor | None = None
    eig_mask: Tensor | None = None
    node_pe: Tensor | None = None
    pair: Tensor | None = None

    def __post_init__(self, *args, **kwargs) -> None:
        super().__post_init__(*args, **kwargs)
        b, n = self.pos.shape[:2]
        if self.eigvec is not None:
            if self.eigvec.dim() != 4 or tuple(self.eigvec.shape[:2]) != (b, n):
                raise _shape_error("eigvec", f"(B, N, Q, K) with (B, N) = {(b, n)}", self.eigvec)
            qk = tuple(self.eigvec.shape[2:])
            if self.eigval is None or tuple(self.eigval.shape) != (b, *qk):
                got = None if self.eigval is None else tuple(self.eigval.shape)
                raise ValueError(f"eigval must have shape (B, Q, K) = {(b, *qk)} to match eigvec, got {got}")
            if self.eig_mask is None or tuple(self.eig_mask.shape) != (b, qk[1]):
                got = None if self.eig_mask is None else tuple(self.eig_mask.shape)
                raise ValueError(f"eig_mask must have shape (B, K) = {(b, qk[1])} to match eigvec, got {got}")
        if self.node_pe is not None and (self.node_pe.dim() != 3 or tuple(self.node_pe.shape[:2]) != (b, n)):
            raise _shape_error("node_pe", f"(B, N, F) with (B, N) = {(b, n)}", self.node_pe)
        if self.pair is not None and (self.pair.dim() != 4 or tuple(self.pair.shape[:3]) != (b, n, n)):
            raise _shape_error("pair", f"(B, N, N, P) with (B, N) = {(b, n)}", self.pair)
