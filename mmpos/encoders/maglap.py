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

import inspect

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._validate import check_bool, check_float, check_int
from ..coords import Coords
from .base import AdditiveEncoder
from .registry import register_encoder

__all__ = ["PRESETS", "MagLapEncoder"]

EIGVAL_MODES = ("phi", "concat", None)

# The reference's MagLapNet configurations (presets.py ``magnetic_laplacian_preset``, models.py);
# "elem_dim": None means the reference's 2 * (dim // 32).
_GEISLER2023 = {
    "elem_dim": None,
    "num_heads": 4,
    "attention": True,
    "sign_invariant": False,
    "eigval": "concat",
    "phi_layers": 1,
    "rho_layers": 1,
    "final_activation": True,
    "qkv_bias": False,
    "norm_replaces": True,
}
PRESETS: dict[str, dict] = {  # the two reference presets differ only in dropout
    "geisler2023-sorting": {**_GEISLER2023, "dropout": 0.15},
    "geisler2023-playground": {**_GEISLER2023, "dropout": 0.1},
}


def _mlp(in_dim: int, width: int, layers: int, final_activation: bool) -> nn.Sequential:
    """``layers`` Linear layers of width ``width`` with ReLU between (and after the last when asked)."""
    mods: list[nn.Module] = []
    for i in range(layers):
        mods.append(nn.Linear(in_dim if i == 0 else width, width))
        if i < layers - 1 or final_activation:
            mods.append(nn.ReLU())
    return nn.Sequential(*mods)


class _EigenAttention(nn.Module):
    """Multi-head attention across the eigenvector tokens of a node (the reference's ``MultiHeadAttention``).

    ``x`` ``(M, T, E)``, ``keep`` ``(M, T)`` bool -> ``(M, T, E)``; q/k/v ``Linear(E, H * key_dim)``
    (bias optional), output ``Linear(H * key_dim, E)``; dropout on the attention weights.
    """

    def __init__(self, dim: int, num_heads: int, key_dim: int, qkv_bias: bool, dropout: float) -> None:
        super().__init__()
        self.num_heads, self.key_dim, self.dropout = num_heads, key_dim, dropout
        inner = num_heads * key_dim
        self.q = nn.Linear(dim, inner, bias=qkv_bias)
        self.k = nn.Linear(dim, inner, bias=qkv_bias)
        self.v = nn.Linear(dim, inner, bias=qkv_bias)
        self.out = nn.Linear(inner, dim)

    def forward(self, x: Tensor, keep: Tensor) -> Tensor:
        m, t, _ = x.shape
        q, k, v = (f(x).view(m, t, self.num_heads, self.key_dim).transpose(1, 2) for f in (self.q, self.k, self.v))
        mask = keep[:, None, None, :]  # (M, 1, 1, T): padding keys masked (the first pair is never padding)
        p = self.dropout if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)  # (M, H, T, key_dim)
        return self.out(out.transpose(1, 2).reshape(m, t, -1))


@register_encoder(
    "maglap",
    paper="Geisler et al. 2023, Transformers Meet Directed Graphs (arXiv:2302.00049)",
    reference="google-deepmind/digraph_transformer models.py (MagLapNet)",
)
class MagLapEncoder(AdditiveEncoder):
    """Magnetic-Laplacian eigenvector encoder (MagLapNet).

    Args:
        dim: output width (the model width).
        k: eigenpairs per potential ``K``.
        num_q: potentials ``Q`` stacked by the transform.
        elem_dim: width of ``phi`` (each eigenvector token).
        num_heads: heads of the attention across eigenvectors.
        attention: use the attention across eigenvectors (default off; the reference's presets turn it on).
        sign_invariant: SignNet-style ``phi(x) + phi(-x)``.
        eigval: ``"phi"`` (into ``phi``, default), ``"concat"`` (after ``phi``, the reference) or ``None``.
        zero_first_negative: with ``sign_invariant`` and complex input, drop ``phi(-x)`` of the first
            eigenvector of each potential (the reference's SignNet).
        phi_layers, rho_layers: Linear layers of ``phi`` and ``rho`` (default 2; the reference 1).
        final_activation: ReLU after the last layer of ``phi`` and ``rho`` too (the reference's ``mlp``).
        key_dim: key / value size per head (default ``token width // num_heads``, which must then divide it).
        qkv_bias: bias on the attention's q/k/v projections (the reference: none).
        norm_replaces: the attention input LayerNorm replaces the tokens before the residual
            (``t = norm(t); t = t + attn(t)``, the reference) instead of pre-norm (``t + attn(norm(t))``).
        dropout: on the attention weights and the flattened tokens (the reference's ``maglap_dropout_p``).
        preset: a key of :data:`PRESETS`; sets the arguments it lists (passing one of them too is an error).
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
        eigval: str | None = "phi",
        zero_first_negative: bool = False,
        phi_layers: int = 2,
        rho_layers: int = 2,
        final_activation: bool = False,
        key_dim: int | None = None,
        qkv_bias: bool = True,
        norm_replaces: bool = False,
        dropout: float = 0.0,
        preset: str | None = None,
    ) -> None:
        super().__init__()
        if preset is not None:
            if preset not in PRESETS:
                raise ValueError(f"preset must be one of {tuple(PRESETS)} or None, got {preset!r}")
            given = {name: value for name, value in locals().items() if name in PRESETS[preset]}
            defaults = {p.name: p.default for p in inspect.signature(MagLapEncoder).parameters.values()}
            clash = [name for name, value in given.items() if value != defaults[name]]
            if clash:
                raise ValueError(f"preset={preset!r} sets {clash}; pass them without the preset")
            cfg = dict(PRESETS[preset])
            if cfg["elem_dim"] is None:
                cfg["elem_dim"] = 2 * max(dim // 32, 1) if isinstance(dim, int) else elem_dim
            elem_dim, num_heads, attention = cfg["elem_dim"], cfg["num_heads"], cfg["attention"]
            sign_invariant, eigval, phi_layers, rho_layers = (
                cfg["sign_invariant"],
                cfg["eigval"],
                cfg["phi_layers"],
                cfg["rho_layers"],
            )
            final_activation, qkv_bias, norm_replaces, dropout = (
                cfg["final_activation"],
                cfg["qkv_bias"],
                cfg["norm_replaces"],
                cfg["dropout"],
            )
        self.dim, self.k, self.num_q = check_int(dim, "dim"), check_int(k, "k"), check_int(num_q, "num_q")
        elem_dim, phi_layers = check_int(elem_dim, "elem_dim"), check_int(phi_layers, "phi_layers")
        rho_layers = check_int(rho_layers, "rho_layers")
        if eigval not in EIGVAL_MODES:
            raise ValueError(f"eigval must be one of {EIGVAL_MODES}, got {eigval!r}")
        dropout = check_float(dropout, "dropout", strict=False, high=1.0, strict_high=True)
        for name, flag in (
            ("attention", attention),
            ("sign_invariant", sign_invariant),
            ("zero_first_negative", zero_first_negative),
            ("final_activation", final_activation),
            ("qkv_bias", qkv_bias),
            ("norm_replaces", norm_replaces),
        ):
            check_bool(flag, name)
        self.preset = preset
        self.sign_invariant, self.eigval, self.zero_first_negative = sign_invariant, eigval, zero_first_negative
        self.norm_replaces = norm_replaces
        width = elem_dim + (eigval == "concat")  # token width after phi
        self.phi = _mlp(2 + (eigval == "phi"), elem_dim, phi_layers, final_activation)
        self.norm = self.attn = None
        if attention:
            check_int(num_heads, "num_heads")
            if key_dim is None:
                if preset is None and width % num_heads:
                    raise ValueError(
                        f"elem_dim={elem_dim} (token width {width}) must be divisible by num_heads={num_heads}, "
                        "or pass key_dim"
                    )
                key_dim = max(width // num_heads, 1)
            self.norm = nn.LayerNorm(width, eps=1e-5)
            self.attn = _EigenAttention(width, num_heads, check_int(key_dim, "key_dim"), qkv_bias, float(dropout))
        self.drop = nn.Dropout(dropout)
        self.rho = _mlp(num_q * k * width, dim, rho_layers, final_activation)

    def _tokens(self, vec: Tensor, val: Tensor, complex_input: bool) -> Tensor:
        """``vec (..., Q, K, 2)``, ``val (..., Q, K, 1)`` -> ``(..., Q, K, width)``."""
        x = torch.cat([vec, val], dim=-1) if self.eigval == "phi" else vec
        tok = self.phi(x)
        if self.sign_invariant:
            neg = self.phi(torch.cat([-vec, val], dim=-1) if self.eigval == "phi" else -vec)
            if self.zero_first_negative and complex_input:
                neg = torch.cat([torch.zeros_like(neg[..., :1, :]), neg[..., 1:, :]], dim=-2)
            tok = tok + neg
        if self.eigval == "concat":
            tok = torch.cat([val, tok], dim=-1)  # the reference puts lambda first
        return tok

    def encode(self, eigvec: Tensor, eigval: Tensor, eig_mask: Tensor) -> Tensor:
        """``eigvec (..., Q, K)``, ``eigval (..., Q, K)``, ``eig_mask (..., K)`` bool -> ``(..., dim)``."""
        qk = (self.num_q, self.k)
        if tuple(eigvec.shape[-2:]) != qk or tuple(eigval.shape[-2:]) != qk or eig_mask.shape[-1] != self.k:
            raise ValueError(
                f"expected eigvec and eigval (..., Q, K) = (..., {self.num_q}, {self.k}) and eig_mask (..., {self.k}), "
                f"got {tuple(eigvec.shape)}, {tuple(eigval.shape)}, {tuple(eig_mask.shape)}"
            )
        dtype = self.phi[0].weight.dtype
        vec = torch.stack([eigvec.real, eigvec.imag] if eigvec.is_complex() else [eigvec, torch.zeros_like(eigvec)], -1)
        vec, val = vec.to(dtype), eigval.to(dtype).unsqueeze(-1)  # (..., Q, K, 2), (..., Q, K, 1)
        tok = self._tokens(vec, val, eigvec.is_complex())  # (..., Q, K, W)
        lead = tok.shape[:-3]
        tok = tok.reshape(-1, self.num_q * self.k, tok.shape[-1])  # (M, Q*K, W)
        keep = eig_mask.unsqueeze(-2).expand(*eig_mask.shape[:-1], self.num_q, self.k).reshape(-1, self.num_q * self.k)
        if self.attn is not None:
            h = self.norm(tok)
            tok = (h if self.norm_replaces else tok) + self.attn(h, keep)
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
        extra = f", preset={self.preset!r}" if self.preset else ""
        return f"dim={self.dim}, k={self.k}, num_q={self.num_q}, sign_invariant={self.sign_invariant}, eigval={self.eigval!r}{extra}"
