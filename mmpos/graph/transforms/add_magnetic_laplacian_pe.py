"""``AddMagneticLaplacianPE``: magnetic-Laplacian eigenvectors of directed graphs."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..._extras import requires
from ..._validate import check_int, is_real
from ..eigen import PHASE_RULES, SOLVERS, MagLapEigen, check_k, maglap_eigenpairs, maglap_eigenpairs_many
from ..laplacian import check_q

with requires("graph"):  # one line naming the package and the extra when it is missing
    from torch_geometric.data import Data
    from torch_geometric.transforms import BaseTransform

__all__ = ["PRESETS", "AddMagneticLaplacianPE"]

# The reference's eigendecomposition settings (google-deepmind/digraph_transformer presets.py,
# ``magnetic_laplacian_preset``: symmetric normalisation, k_excl = 0, relative q, l2 norm).
PRESETS: dict[str, dict] = {
    "geisler2023-sorting": {"k": 25, "q": 0.25, "q_relative": True, "normalize": "sign_rotate"},
    "geisler2023-playground": {"k": 16, "q": 0.1, "q_relative": True, "normalize": "sign_rotate"},
}


class AddMagneticLaplacianPE(BaseTransform):
    r"""Adds the magnetic-Laplacian eigenvector positional encoding from the
    `"Transformers Meet Directed Graphs" <https://arxiv.org/abs/2302.00049>`_ paper
    (Geisler et al., ICML 2023; reference google-deepmind/digraph_transformer,
    ``utils.py`` ``eigv_magnetic_laplacian_numba``) to the given graph.

    For each potential :math:`q`, the :math:`k` smallest eigenpairs of
    :math:`L_q = I - (D^{-1/2} A_s D^{-1/2}) \odot \exp(i 2\pi q (A - A^\top))`
    (see :func:`mmpos.graph.magnetic_laplacian`), the first kept; direction is in the
    phases, which :class:`torch_geometric.transforms.AddLaplacianEigenvectorPE` loses.

    Stored on ``data`` (``n`` nodes; ``Q = len(q)`` when ``q`` is a sequence, and no
    ``Q`` axis for one float):

    * ``data[attr_name]``: complex64 ``(n, k)`` or ``(n, Q, k)``, unit-norm columns;
    * ``data[attr_name + "_eigval"]``: float32 ``(1, k)`` or ``(1, Q, k)`` (ascending);
    * ``data[attr_name + "_mask"]``: bool ``(1, k)``, ``False`` for the zero padding
      when ``n < k``.

    The per-graph entries have a leading 1, so a :class:`~torch_geometric.data.Batch`
    stacks them to ``(B, ...)``. :class:`mmpos.integrations.pyg.MagLapNodePE` turns a
    batch of them into what :class:`torch_geometric.nn.GPSConv` takes.

    With ``attr_name=None`` (as PyG's positional-encoding transforms), the real and
    imaginary parts of the eigenvectors are concatenated onto ``data.x`` (created when it
    is ``None``) as ``(n, 2 Q k)`` features in ``x``'s dtype, ordered ``[Re v (Q, k) flattened,
    Im v (Q, k) flattened]``; eigenvalues and mask are then not stored (PyG stores only
    the vectors too).

    Graphs are solved per connected component (see :mod:`mmpos.graph.eigen`), so every
    zero eigenvalue of a disconnected graph is found.

    Args:
        k (int): eigenpairs per potential.
        q (float or sequence): potential(s); :math:`q'` when :obj:`q_relative`.
            (default: :obj:`0.25`)
        q_relative (bool): use :math:`q = q' / \max(\min(m_{dir}, n), 1)` with
            :math:`m_{dir}` the number of one-way edges, as the reference does.
            (default: :obj:`True`)
        attr_name (str): attribute name prefix. (default: :obj:`"maglap_pe"`)
        normalize (bool or str): phase rule: :obj:`True` (deterministic phase,
            :func:`mmpos.graph.normalize_phase`), :obj:`"sign_rotate"` (the reference's),
            or :obj:`False`. (default: :obj:`True`)
        solver (str): :obj:`"auto"`, :obj:`"dense"` or :obj:`"arpack"`.
            (default: :obj:`"auto"`, ARPACK for components above :obj:`dense_max_nodes` nodes)
        dense_max_nodes (int): see :obj:`solver`. (default: :obj:`512`)
        dtype (torch.dtype): ARPACK's working precision, :obj:`torch.float64` or
            :obj:`torch.float32` (PyG's; followed by a float64 Rayleigh-Ritz step).
            (default: :obj:`torch.float64`)

    :meth:`from_preset` builds the reference's settings (:data:`PRESETS`), to pair with
    ``MagLapEncoder(preset=...)`` of the same name.
    """

    def __init__(
        self,
        k: int,
        q: float | Sequence[float] = 0.25,
        q_relative: bool = True,
        attr_name: str | None = "maglap_pe",
        normalize: bool | str = True,
        solver: str = "auto",
        dense_max_nodes: int = 512,
        dtype: torch.dtype = torch.float64,
    ) -> None:
        self.k = check_k(k)
        qs = check_q(q)
        self.q = qs[0] if is_real(q) else qs  # one potential: a float; several: a tuple of floats
        if attr_name is not None and (not isinstance(attr_name, str) or not attr_name):
            raise ValueError(f"attr_name must be a non-empty str or None (concatenate onto data.x), got {attr_name!r}")
        if solver not in SOLVERS:
            raise ValueError(f"solver must be one of {SOLVERS}, got {solver!r}")
        if normalize not in (True, False, *PHASE_RULES):
            raise ValueError(f"normalize must be True, False or one of {PHASE_RULES}, got {normalize!r}")
        check_int(dense_max_nodes, "dense_max_nodes")
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype!r}")
        self.q_relative = bool(q_relative)
        self.attr_name = attr_name
        self.normalize = normalize
        self.solver = solver
        self.dense_max_nodes = dense_max_nodes
        self.dtype = dtype

    @classmethod
    def from_preset(cls, name: str, **kwargs) -> AddMagneticLaplacianPE:
        """The transform with the reference's ``k``, ``q``, ``q_relative`` and ``sign_rotate`` (:data:`PRESETS`).

        ``kwargs`` set the other arguments (``attr_name``, ``solver``, ...); the preset's own may not be passed.
        """
        if name not in PRESETS:
            raise ValueError(f"name must be one of {tuple(PRESETS)}, got {name!r}")
        clash = sorted(set(kwargs) & set(PRESETS[name]))
        if clash:
            raise ValueError(f"preset {name!r} sets {clash}; pass them without the preset")
        return cls(**PRESETS[name], **kwargs)

    def _store(self, data: Data, eig: MagLapEigen) -> Data:
        vec, val = eig.eigvec.to(torch.complex64), eig.eigval.to(torch.float32)
        if self.attr_name is None:  # PyG's convention: onto data.x
            feat = torch.cat([vec.real.flatten(1), vec.imag.flatten(1)], dim=1)  # (n, 2 Q k)
            if data.x is None:
                data.x = feat
            else:
                x = data.x.view(-1, 1) if data.x.dim() == 1 else data.x
                data.x = torch.cat([x, feat.to(x.device, x.dtype)], dim=-1)
            return data
        if isinstance(self.q, float):
            vec, val = vec[:, 0], val[0]
        data[self.attr_name] = vec
        data[f"{self.attr_name}_eigval"] = val.unsqueeze(0)
        data[f"{self.attr_name}_mask"] = eig.mask.unsqueeze(0)
        return data

    @staticmethod
    def _graph(data: Data) -> tuple[torch.Tensor, int]:
        if data.edge_index is None:
            raise ValueError("data.edge_index must be set (use an empty (2, 0) tensor for a graph without edges)")
        if data.num_nodes is None:
            raise ValueError("data.num_nodes must be known")
        return data.edge_index, int(data.num_nodes)

    def forward(self, data: Data) -> Data:
        edge_index, n = self._graph(data)
        eig = maglap_eigenpairs(
            edge_index,
            n,
            self.k,
            self.q,
            self.q_relative,
            "sym",
            self.normalize,
            self.solver,
            self.dense_max_nodes,
            dtype=self.dtype,
        )
        return self._store(data, eig)

    def apply_many(self, data_list: Sequence[Data]) -> list[Data]:
        """The transform on many small graphs at once: one batched dense ``eigh`` per graph size.

        Same values as calling the transform on each graph with ``solver="dense"``;
        modifies and returns the given objects.
        """
        eigs = maglap_eigenpairs_many(
            [self._graph(d) for d in data_list], self.k, self.q, self.q_relative, self.normalize
        )
        return [self._store(d, e) for d, e in zip(data_list, eigs)]

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(k={self.k}, q={self.q}, q_relative={self.q_relative})"
