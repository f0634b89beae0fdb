"""``maglap``: the eigenvector network of the magnetic-Laplacian positional encoding.

Paper: Geisler et al., "Transformers Meet Directed Graphs", ICML 2023,
https://arxiv.org/abs/2302.00049. Reference: google-deepmind/digraph_transformer,
``models.py`` (``MagLapNet``, and how ``DataflowTransformer`` builds it), ``layers.py``
(``MultiHeadAttention``, ``mlp``) and ``presets.py`` (``magnetic_laplacian_preset``), read for
the architecture:

1. one token per eigenvector (and potential) of a node: ``[Re v_j[u], Im v_j[u]]``;
2. an element MLP ``phi`` (SignNet-style ``phi(x) + phi(-x)`` when ``sign_invariant``); the
   eigenvalue ``lambda_j`` is fed into ``phi`` (``eigval="phi"``, this package's default: the
   eigenvalue passes through the same non-linearity as the vector) or concatenated after it
   (``eigval="concat"``, the reference: token ``[lambda_j, phi(x)]``), or left out (``None``);
3. optional (``attention=True``) LayerNorm + multi-head attention across the ``Q * K`` tokens
   of a node, padding eigenpairs masked (the reference masks ``lambda <= 0`` except the first,
   which also drops true zero eigenvalues of disconnected graphs; here the explicit padding
   mask of :class:`mmpos.integrations.pyg.AddMagneticLaplacianPE` is used);
4. padding tokens zeroed, flattened, dropout, ``rho`` MLP to the model width; the result is
   added to the node tokens (the additive hook).

``preset="geisler2023-sorting"`` / ``"geisler2023-playground"`` select the reference's
configuration of the network for its sorting-network and digraph-playground runs
(:data:`PRESETS`; pair with ``AddMagneticLaplacianPE(preset=...)`` for the transform side:
``k``, ``q`` and the ``sign_rotate`` phase rule). Point by point: eigenvalue concatenated after
``phi``; ``phi`` and ``rho`` one ``Linear`` + ReLU each (the reference's ``mlp(n_layers=1)``,
activation after the last layer too); element width ``2 * (dim // 32)``; attention on
(``maglap_transformer=True``) with the model's LayerNorm *replacing* the tokens before the
residual, ``num_heads=4``, key size ``token width // 4``, no bias on the q/k/v projections;
no SignNet (``maglap_use_signnet=False`` in both presets); dropout 0.15 (sorting) / 0.1
(playground) on the attention weights and the flattened tokens. ``zero_first_negative``
reproduces the reference's SignNet detail for complex input (the ``phi(-x)`` term of the first
eigenvector is dropped); its OGB preset uses it, with a GNN ``phi`` this package does not
implement, so that preset is not offered.

What is invariant (exactly, for any input): with ``sign_invariant=True`` (and
``zero_first_negative=False``) the output does not change when any eigenvector is multiplied
by ``-1`` (at every ``q``). A general phase ``exp(i phi)`` (the ambiguity of complex
eigenvectors at ``q > 0``) is *not* removed by the network, as in the reference; it is fixed
beforehand by the transform's phase normalisation (``normalize=True``), which maps ``v`` and
``exp(i phi) v`` to the same vector. A repeated eigenvalue inside one connected component has
no canonical basis (see :mod:`mmpos.graph.eigen`); the network is not invariant to that choice
(neither is the reference's). ``tests/encoders/test_maglap.py`` checks these statements.

Shapes: :meth:`MagLapEncoder.encode` ``eigvec (..., Q, K)`` complex (or real at
``q = 0``), ``eigval (..., Q, K)``, ``eig_mask (..., K)`` -> ``(..., dim)``;
:meth:`MagLapEncoder.embed` reads a :class:`mmpos.graph.GraphCoords` -> ``(B, N, dim)``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..coords import Coords
from .base import AdditiveEncoder
from .registry import register_encoder

__all__ = ["MagLapEncoder"]


def _positive(value: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


@register_encoder("maglap", kind="additive", paper="Geisler et al. 2023, Transformers Meet Directed Graphs")
class MagLapEncoder(AdditiveEncoder):
    """Magnetic-Laplacian eigenvector encoder (MagLapNet).

    Args:
        dim: output width (the model width).
        k: eigenpairs per potential ``K``.
        num_q: potentials ``Q`` stacked by the transform.
        elem_dim: width of each eigenvector token.
        num_heads: heads of the attention across eigenvectors (``elem_dim`` divisible by it).
        attention: use the attention across eigenvectors (reference: ``maglap_transformer``, default off).
        sign_invariant: SignNet-style ``phi(x) + phi(-x)``.
        use_eigval: feed the eigenvalue to ``phi``.
        dropout: dropout on the flattened tokens (reference default 0).
    """

    def __init__(
        self,
        dim: int,
        k: int,
        num_q: int = 1,
        elem_dim: int = 16,
        num_heads: int = 4,
        attention: bool = False,
        sign_invariant: bool = True,
        use_eigval: bool = True,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.dim, self.k, self.num_q = _positive(dim, "dim"), _positive(k, "k"), _positive(num_q, "num_q")
        _positive(elem_dim, "elem_dim")
        if attention and elem_dim % _positive(num_heads, "num_heads"):
            raise ValueError(f"elem_dim={elem_dim} must be divisible by num_heads={num_heads}")
        self.sign_invariant, self.use_eigval = sign_invariant, use_eigval
        self.phi = nn.Sequential(nn.Linear(3 if use_eigval else 2, elem_dim), nn.ReLU(), nn.Linear(elem_dim, elem_dim))
        self.norm = nn.LayerNorm(elem_dim) if attention else None
        self.attn = nn.MultiheadAttention(elem_dim, num_heads, batch_first=True) if attention else None
        self.drop = nn.Dropout(dropout)
        self.rho = nn.Sequential(nn.Linear(num_q * k * elem_dim, dim), nn.ReLU(), nn.Linear(dim, dim))

    def _phi(self, vec: Tensor, val: Tensor) -> Tensor:
        return self.phi(torch.cat([vec, val], dim=-1) if self.use_eigval else vec)

    def encode(self, eigvec: Tensor, eigval: Tensor, eig_mask: Tensor) -> Tensor:
        """``eigvec (..., Q, K)``, ``eigval (..., Q, K)``, ``eig_mask (..., K)`` bool -> ``(..., dim)``."""
        qk = (self.num_q, self.k)
        if tuple(eigvec.shape[-2:]) != qk or tuple(eigval.shape[-2:]) != qk or eig_mask.shape[-1] != self.k:
            raise ValueError(
                f"expected eigvec and eigval (..., Q, K) = (..., {self.num_q}, {self.k}) and eig_mask (..., {self.k}), "
                f"got {tuple(eigvec.shape)}, {tuple(eigval.shape)}, {tuple(eig_mask.shape)}"
            )
        dtype = self.rho[0].weight.dtype
        vec = torch.stack([eigvec.real, eigvec.imag] if eigvec.is_complex() else [eigvec, torch.zeros_like(eigvec)], -1)
        vec, val = vec.to(dtype), eigval.to(dtype).unsqueeze(-1)  # (..., Q, K, 2), (..., Q, K, 1)
        tok = self._phi(vec, val)
        if self.sign_invariant:
            tok = tok + self._phi(-vec, val)  # (..., Q, K, E)
        lead = tok.shape[:-3]
        tok = tok.reshape(-1, self.num_q * self.k, tok.shape[-1])  # (M, Q*K, E)
        keep = eig_mask.unsqueeze(-2).expand(*eig_mask.shape[:-1], self.num_q, self.k).reshape(-1, self.num_q * self.k)
        if self.attn is not None:
            h = self.norm(tok)
            tok = tok + self.attn(h, h, h, key_padding_mask=~keep, need_weights=False)[0]
        tok = tok * keep.unsqueeze(-1).to(tok.dtype)
        return self.rho(self.drop(tok.flatten(1))).reshape(*lead, self.dim)

    def embed(self, coords: Coords) -> Tensor:
        eigvec = getattr(coords, "eigvec", None)
        if eigvec is None:
            raise ValueError("MagLapEncoder reads eigvec / eigval / eig_mask from mmpos.graph.GraphCoords")
        n = eigvec.shape[1]
        val = coords.eigval.unsqueeze(1).expand(-1, n, -1, -1)
        mask = coords.eig_mask.unsqueeze(1).expand(-1, n, -1)
        out = self.encode(eigvec, val, mask)
        if coords.mask is not None:  # padding nodes get no PE
            out = out * coords.mask.unsqueeze(-1).to(out.dtype)
        return out

    def extra_repr(self) -> str:
        return f"dim={self.dim}, k={self.k}, num_q={self.num_q}, sign_invariant={self.sign_invariant}"
