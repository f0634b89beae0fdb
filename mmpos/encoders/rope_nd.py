"""``rope-axial`` and ``rope-mixed``: 2-D / 3-D rotary position embedding on continuous coordinates.

Paper: Heo et al., "Rotary Position Embedding for Vision Transformer", ECCV 2024,
https://arxiv.org/abs/2403.13298. Reference: naver-ai/rope-vit, ``models/vit_rope.py``
(``compute_axial_cis``, ``init_random_2d_freqs``, ``compute_mixed_cis``, ``init_t_xy``) and
``self-attn/rope_self_attn.py``; timm ``layers/pos_embed_sincos.py`` (``RotaryEmbeddingCat``,
``RotaryEmbeddingMixed``) is compared against in the tests.

Both are :class:`~mmpos.rotary.FrequencyPlan` s read at the token coordinates, so any grid
size (other resolutions, non-square), fractional positions and free 3-D points work, and
prefix (class) tokens, whose positions are 0, are left unrotated as rope-vit does:

* axial -- pair ``p`` of section ``a`` turns by ``pos[a] * theta ** (-k / s_a)`` (``k`` the
  pair's index inside its section of ``s_a`` pairs); rope-vit: ``theta = 100``, two sections of
  ``head_dim / 4`` pairs, ``x`` (column, ``w``) first, interleaved pairs.
* mixed -- every head ``h`` of every layer learns a dense ``(A, P)`` weight:
  ``angle[h, p] = sum_a pos[a] * weight[h, a, p]`` (``x fx + y fy`` in 2-D, ``+ z fz`` in 3-D).

rope-vit's exact angles: ``axes=("w", "h"), convention="interleaved"`` (``theta=100`` axial,
``theta=10`` mixed). The package default is ``axes=("h", "w"), convention="half"``.

Shapes: q ``(B, Hq, N, D)``, k ``(B, Hk, N, D)``; angles ``(B, N, P)`` (axial) or
``(B, Hk, N, P)`` (mixed, one weight ``(Hk, A, P)`` per layer, shared by the query heads of a
key/value group).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .._validate import check_axes, check_float, check_ints
from ..rotary import FrequencyPlan
from ..scaling import RopeScaling
from .base import RotaryEncoder, resolve_head_dim
from .registry import register_encoder

__all__ = ["AxialRoPE", "MixedRoPE", "mixed_frequencies"]


def _random_frames(num_heads: int, num_axes: int, rotate: bool, generator: torch.Generator | None) -> Tensor:
    """One orthonormal frame per head, ``(H, A, A)``; row ``a`` is the direction of section ``a``.

    2-D: rope-vit's frame, directions at ``alpha`` and ``alpha + pi / 2`` with ``alpha ~ U(0, 2 pi)``
    drawn as rope-vit and timm draw it (``torch.rand`` per head, ``0`` when not ``rotate``).
    3-D and more: a Haar-random orthogonal matrix (QR of a Gaussian, signs fixed), identity when
    not ``rotate`` -- rope-vit is 2-D only, this is the same construction one dimension up.
    """
    if num_axes == 2:
        if rotate:
            alpha = torch.rand(num_heads, generator=generator) * 2 * torch.pi
        else:
            alpha = torch.zeros(num_heads)
        turn = alpha[:, None] + torch.tensor([0.0, torch.pi / 2])  # (H, 2): section 0 at alpha, 1 at alpha + pi/2
        return torch.stack([turn.cos(), turn.sin()], dim=-1)  # (H, 2 sections, 2 axes)
    if not rotate:
        return torch.eye(num_axes).expand(num_heads, num_axes, num_axes).clone()
    q, r = torch.linalg.qr(torch.randn(num_heads, num_axes, num_axes, generator=generator))
    return q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)


def mixed_frequencies(
    head_dim: int,
    num_heads: int,
    axes: Sequence[str] = ("h", "w"),
    sections: Sequence[int] | None = None,
    theta: float = 10.0,
    rotate: bool = True,
    generator: torch.Generator | None = None,
) -> Tensor:
    """RoPE-Mixed initial frequencies, ``(num_heads, A, head_dim / 2)`` float32.

    Pair ``p`` of section ``a`` gets the axial magnitude ``theta ** (-k / s_a)`` along the
    direction of section ``a`` in a random per-head frame (:func:`_random_frames`). In 2-D with
    ``axes=("w", "h")`` this is rope-vit's ``init_random_2d_freqs(head_dim, num_heads, theta)``
    with ``weight[h, 0] = fx``, ``weight[h, 1] = fy`` -- the same numbers for the same seed.
    """
    axes = tuple(axes)
    if len(axes) < 2:
        raise ValueError(f"axes must name at least 2 axes for RoPE-Mixed (use 'rope' for 1-D), got {axes}")
    axial = FrequencyPlan.axial(head_dim, axes, sections, theta).weight  # (A, P), one non-zero per column
    magnitude = axial.sum(0)  # (P,)
    section = axial.argmax(0)  # (P,) section (= axis) index of every pair
    frames = _random_frames(num_heads, len(axes), rotate, generator)  # (H, A sections, A axes)
    return (frames[:, section, :] * magnitude[:, None]).transpose(1, 2).contiguous()  # (H, A, P)


@register_encoder(
    "rope-axial",
    paper="Heo et al. 2024, RoPE-ViT axial (arXiv:2403.13298)",
    reference="naver-ai/rope-vit models/vit_rope.py (compute_axial_cis)",
)
class AxialRoPE(RotaryEncoder):
    """Axial 2-D / 3-D RoPE: a section of rotary pairs per axis, each with its own spectrum.

    Args:
        dim: model width (with ``num_heads`` gives ``head_dim``), or pass ``head_dim``.
        num_heads: number of attention heads.
        head_dim: ``D``.
        theta: spectrum base (rope-vit: 100).
        axes: coordinate axes read, in section order, e.g. ``("h", "w")``, ``("t", "h", "w")``,
            ``("x", "y", "z")``; ``("w", "h")`` is rope-vit's order.
        sections: rotary pairs per axis (default: equal, ``rotary_dim / 2`` must then divide).
        rotary_dim: rotate only the first ``rotary_dim`` channels of a head.
        convention: ``"half"`` (rotate_half) or ``"interleaved"`` (rope-vit's complex pairs).
        scaling: a resolution-scaling rule per axis (:class:`~mmpos.scaling.RopeScaling` or a dict of
            its arguments); each axis's section is its own spectrum.
    """

    def __init__(
        self,
        dim: int | None = None,
        num_heads: int | None = None,
        head_dim: int | None = None,
        theta: float = 100.0,
        axes: Sequence[str] = ("h", "w"),
        sections: Sequence[int] | None = None,
        rotary_dim: int | None = None,
        convention: str = "half",
        scaling: RopeScaling | dict | None = None,
    ) -> None:
        head_dim = resolve_head_dim(dim, num_heads, head_dim)
        axes, theta = check_axes(axes), check_float(theta, "theta")
        sections = None if sections is None else check_ints(sections, "sections", low=0, length=len(axes))
        plan = FrequencyPlan.axial(head_dim, axes, sections, theta, rotary_dim, convention)
        super().__init__(plan, scaling=scaling)


@register_encoder(
    "rope-mixed",
    paper="Heo et al. 2024, RoPE-ViT mixed (arXiv:2403.13298)",
    reference="naver-ai/rope-vit models/vit_rope.py (init_random_2d_freqs, compute_mixed_cis)",
    shared=False,  # learned frequencies per layer, as in the paper
    no_weight_decay=("weight",),  # rope-vit's no_weight_decay returns "freqs"
)
class MixedRoPE(RotaryEncoder):
    """RoPE-Mixed: learnable per-head frequencies mixing the axes; build one per layer.

    ``weight`` is an ``(Hk, A, P)`` :class:`~torch.nn.Parameter` initialised by
    :func:`mixed_frequencies`. rope-vit excludes it from weight decay (``no_weight_decay``
    returns ``"freqs"``); do the same in the optimizer.

    Args:
        dim, num_heads, head_dim: as :class:`AxialRoPE`.
        num_kv_heads: key/value heads (GQA); the frequencies are per key/value head so that a
            query and the key it attends with turn alike. Defaults to ``num_heads``.
        theta: magnitude base (rope-vit: 10).
        axes, sections: as :class:`AxialRoPE` (at least two axes).
        rotate: random per-head frame (rope-vit's default); ``False`` starts from axial.
        convention: ``"half"`` or ``"interleaved"``.
        generator: random source for the initial frames (default: the global one).
        scaling: only the position rules ``linear`` and ``ref-shape`` (:mod:`mmpos.scaling`): the learned
            weight is divided per axis in ``forward`` (positions rescaled); the spectral rules (NTK, YaRN, ...)
            are refused, as learned frequencies are no RoPE spectrum.
    """

    def __init__(
        self,
        dim: int | None = None,
        num_heads: int | None = None,
        head_dim: int | None = None,
        num_kv_heads: int | None = None,
        theta: float = 10.0,
        axes: Sequence[str] = ("h", "w"),
        sections: Sequence[int] | None = None,
        rotate: bool = True,
        convention: str = "half",
        generator: torch.Generator | None = None,
        scaling: RopeScaling | dict | None = None,
    ) -> None:
        head_dim = resolve_head_dim(dim, num_heads, head_dim)
        axes, theta = check_axes(axes, min_len=2), check_float(theta, "theta")
        sections = None if sections is None else check_ints(sections, "sections", low=0, length=len(axes))
        heads = num_kv_heads if num_kv_heads is not None else num_heads
        if not isinstance(heads, int) or heads <= 0:
            raise ValueError(
                "rope-mixed learns frequencies per head: num_heads (or num_kv_heads) must be a positive int, "
                f"got {heads!r}"
            )
        weight = mixed_frequencies(head_dim, heads, axes, sections, theta, rotate, generator)
        super().__init__(FrequencyPlan(weight, tuple(axes), head_dim, convention), learnable=True, scaling=scaling)
