"""GRAPE: Group Representational Position Encoding, multiplicative form, for ``t, h, w`` positions.

Paper: Zhang et al., "Group Representational Position Encoding", ICLR 2026,
https://arxiv.org/abs/2512.07805 (project model-architectures/GRAPE). A position acts on q and k
by ``G(n) = exp(n L)``, ``L`` a sum of rank-2 skew generators ``a b^T - b a^T`` (a plane spanned
by orthonormal ``a``, ``b``, turning at a frequency); scores depend only on offsets when the
generators commute. Reference for the multimodal (``t, h, w``) form: JJJYmmm/Multimodal-RoPEs
``multimodal_ropes/freq_allocation/grape.py`` (``GRAPEEmbedding``, config ``configs/grape.py``).

==================  =========================================================================
encoder             what
==================  =========================================================================
grape               canonical planes (pairs of channels), chunked over ``t, h, w`` by
                    ``mrope_section``, frequencies ``f ** (1 / log_freq_scale)``: a
                    :class:`~mmpos.rotary.FrequencyPlan` (``grape_mode="canonical"``,
                    ``frequency_allocation="chunked"``)
grape-i             canonical planes, pair ``p`` on axis ``p mod 3`` (``"interleaved"``)
grape-learned       trainable planes applied to q and k directly (``grape_mode`` ``"axis"``,
                    ``"mixed"``, ``"block_mixed"``): not a frequency plan, no cos / sin
==================  =========================================================================

Shapes: q ``(B, Hq, N, D)``, k ``(B, Hkv, N, D)``; positions ``(B or 1, N, 3)`` on axes
``("t", "h", "w")`` (a 1-D ``("seq",)`` sequence is read as text, the same position on the three
axes); canonical angles ``(B, N, D/2)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._validate import check_bool, check_float, check_int
from ..coords import Coords
from ..rotary import CONVENTIONS, FrequencyPlan, rope_frequencies
from ..scaling import RopeScaling, as_scaling, build_scaling
from .base import RotaryEncoder, resolve_head_dim
from .mrope import AXIS_ORDERS, MRoPE, mrope_plan
from .registry import register_encoder

__all__ = ["GRAPE", "GRAPE_MODES", "GRAPEInterleaved", "GRAPELearned", "grape_plan"]

THW = ("t", "h", "w")

#: the learned-plane modes of the reference (``grape_mode``; ``"canonical"`` is :class:`GRAPE`)
GRAPE_MODES = ("axis", "mixed", "block_mixed")


def grape_plan(
    head_dim: int,
    mrope_section: Sequence[int] | None = None,
    axis_order: str = "chunked",
    theta: float = 10000.0,
    convention: str = "half",
    log_freq_scale: float = 1.0,
) -> FrequencyPlan:
    """Multiplicative GRAPE with canonical commuting planes on axes ``("t", "h", "w")``:
    ``G(t, h, w) = exp(t L_t) exp(h L_h) exp(w L_w)``, each generator a sum of rank-2 rotations
    in disjoint coordinate pairs (GRAPE's appendix G, the drop-in ``cos``/``sin`` mode of
    JJJYmmm/Multimodal-RoPEs ``freq_allocation/grape.py``, ``grape_mode="canonical"``).

    Pair ``p`` turns at ``f_p ** (1 / log_freq_scale)`` (``f_p`` the RoPE spectrum; the reference
    warps ``exp(log f_p / log_freq_scale)``; ``1`` is RoPE's spectrum). ``axis_order="chunked"``:
    consecutive chunks of ``mrope_section`` pairs read ``t``, ``h``, ``w`` (M-RoPE's plan at
    ``log_freq_scale=1``); ``"cyclic"``: pair ``p`` reads axis ``p mod 3`` over all pairs (the
    reference's ``frequency_allocation="interleaved"``; no ``mrope_section``).
    """
    if axis_order not in AXIS_ORDERS:
        raise ValueError(f"axis_order must be one of {AXIS_ORDERS}, got {axis_order!r}")
    s = check_float(log_freq_scale, "log_freq_scale")
    if axis_order == "chunked":  # M-RoPE's chunks (mrope_plan checks head_dim and the section)
        plan = mrope_plan(head_dim, mrope_section, "chunked", theta, convention)
    else:
        if mrope_section is not None:
            raise ValueError(
                f"mrope_section applies to axis_order='chunked' only (cyclic GRAPE reads axis p mod 3), "
                f"got {mrope_section!r}"
            )
        pairs = check_int(head_dim, "head_dim", even=True) // 2
        index = torch.arange(pairs) % 3
        plan = FrequencyPlan.from_assignment(index, rope_frequencies(pairs, theta), THW, head_dim, convention)
    if s == 1:
        return plan
    # exp(log f / s): the reference's warp; a pair that does not read an axis keeps 0 (exp(-inf) = 0)
    return FrequencyPlan(torch.exp(plan.weight.log() / s), plan.axes, plan.head_dim, plan.convention)


@register_encoder(
    "grape",
    paper="Zhang et al. 2025, GRAPE: Group Representational Position Encoding (arXiv:2512.07805)",
    reference="JJJYmmm/Multimodal-RoPEs multimodal_ropes/freq_allocation/grape.py (GRAPEEmbedding, canonical mode)",
)
class GRAPE(MRoPE):
    """Multiplicative GRAPE, canonical commuting planes, chunked over ``t, h, w``.

    Paper: Zhang et al., "Group Representational Position Encoding", ICLR 2026,
    https://arxiv.org/abs/2512.07805 (project model-architectures/GRAPE). Reference for the
    multimodal form: JJJYmmm/Multimodal-RoPEs ``multimodal_ropes/freq_allocation/grape.py``
    (``GRAPEEmbedding`` with ``grape_mode="canonical"``, the drop-in ``cos``/``sin`` mode): see
    :func:`grape_plan`. At ``log_freq_scale=1`` it is M-RoPE's plan (the paper: RoPE is GRAPE
    with canonical planes and the log-uniform spectrum). The learned-plane modes are
    :class:`GRAPELearned` (``grape-learned``).

    Reads ``("t", "h", "w")`` (positions: the ``grape`` layout, JJJYmmm ``get_mrope_index``).

    Args:
        dim, num_heads, head_dim, mrope_section, theta, convention, scaling: as :class:`MRoPE`
            (``mrope_section`` only for the chunked ``grape``).
        log_freq_scale: the spectrum warp ``f ** (1 / s)``, ``> 0`` (default 1, the reference's).
    """

    axis_order = "chunked"

    def __init__(
        self,
        dim: int | None = None,
        num_heads: int | None = None,
        head_dim: int | None = None,
        mrope_section: Sequence[int] | None = None,
        theta: float = 10000.0,
        convention: str = "half",
        scaling: RopeScaling | dict | None = None,
        log_freq_scale: float = 1.0,
    ) -> None:
        head_dim = resolve_head_dim(dim, num_heads, head_dim)
        plan = grape_plan(head_dim, mrope_section, self.axis_order, theta, convention, log_freq_scale)
        RotaryEncoder.__init__(self, plan, scaling=scaling)  # GRAPE's plan, not M-RoPE's: MRoPE.__init__ skipped


@register_encoder(
    "grape-i",
    paper="Zhang et al. 2025, GRAPE: Group Representational Position Encoding (arXiv:2512.07805), cyclic planes",
    reference="JJJYmmm/Multimodal-RoPEs multimodal_ropes/freq_allocation/grape.py (GRAPEEmbedding, interleaved)",
    mrope_section=False,  # the cycle fixes the counts: a model's mrope_section is not handed to it
)
class GRAPEInterleaved(GRAPE):
    """Multiplicative GRAPE, canonical commuting planes, pair ``p`` on axis ``p mod 3``
    (the reference's ``frequency_allocation="interleaved"``: every axis spans the spectrum).

    Paper: Zhang et al., "Group Representational Position Encoding", https://arxiv.org/abs/2512.07805.
    Reference: JJJYmmm/Multimodal-RoPEs ``freq_allocation/grape.py`` (``_select_axis_by_pattern``
    with ``(0, 1, 2)``). As :class:`GRAPE`; ``mrope_section`` must stay ``None`` (the cycle fixes
    the counts: ``ceil(P/3)``, ``floor((P+1)/3)``, ``floor(P/3)`` pairs for ``t, h, w``). Shapes as
    the module's: angles ``(B, N, D/2)``.
    """

    axis_order = "cyclic"


_NO_COS_SIN = "grape-learned turns q and k in learned planes (rotate); it has no cos / sin of channel pairs to share"


def _narrower(new: torch.dtype, old: torch.dtype) -> bool:
    return new.is_floating_point and old.is_floating_point and torch.finfo(new).bits < torch.finfo(old).bits


def _orthonormal(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """``a`` normalised, ``b`` orthogonalised to it and normalised (the reference's ``get_orthonormal_planes``)."""
    a = F.normalize(a, dim=-1)
    b = F.normalize(b - (b * a).sum(-1, keepdim=True) * a, dim=-1)
    return a, b


def _turn(x: Tensor, a: Tensor, b: Tensor, angle: Tensor) -> Tensor:
    """``x + sum_p [(R(angle_p) - I) restricted to span(a_p, b_p)] x``.

    ``x`` ``(B, H, N, K, C)`` (``K`` channel blocks of width ``C``), ``a``, ``b`` ``(K, P, C)`` orthonormal
    per plane, ``angle`` ``(B or 1, N, K, P)`` float.
    """
    p = a.shape[-2]
    ab = torch.cat([a, b], -2).to(x.dtype)  # (K, 2P, C): both vectors of every plane, one projection each way
    xab = torch.einsum("bhnkc,kqc->bhnkq", x, ab)  # coordinates in each plane: x_a, then x_b
    xa, xb = xab[..., :p], xab[..., p:]
    cos, sin = angle.cos().to(x.dtype).unsqueeze(1), angle.sin().to(x.dtype).unsqueeze(1)  # (B, 1, N, K, P)
    # the turned coordinates minus the old ones, as the reference computes them
    d = torch.cat([xa * cos - xb * sin - xa, xa * sin + xb * cos - xb], -1)
    return x + torch.einsum("bhnkq,kqc->bhnkc", d, ab)


@register_encoder(
    "grape-learned",
    paper="Zhang et al. 2025, GRAPE: Group Representational Position Encoding (arXiv:2512.07805), learned planes",
    reference="JJJYmmm/Multimodal-RoPEs multimodal_ropes/freq_allocation/grape.py (AxisGrapeRotation, "
    "MixedAxisGrapeRotation, BlockMixedGrapeRotation)",
    shared=False,  # trainable planes: one instance per layer
    no_weight_decay=("*",),
)
class GRAPELearned(RotaryEncoder):
    """Multiplicative GRAPE with trainable rank-2 planes, applied to q and k directly.

    Paper: Zhang et al., "Group Representational Position Encoding", ICLR 2026,
    https://arxiv.org/abs/2512.07805. Reference: JJJYmmm/Multimodal-RoPEs
    ``multimodal_ropes/freq_allocation/grape.py`` (``GRAPEEmbedding.apply_qk`` with ``grape_mode``
    ``"axis"`` / ``"mixed"`` / ``"block_mixed"``; defaults of ``configs/grape.py``). Each plane ``p``
    has raw vectors ``a_p``, ``b_p``; ``a`` is normalised, ``b`` orthogonalised to ``a`` and
    normalised, and a vector ``x`` (a query or key head) becomes

    ``x + sum_p [(cos θ_p - 1) x_a - sin θ_p x_b] a_p + [sin θ_p x_a + (cos θ_p - 1) x_b] b_p``

    with ``x_a = a_p . x``, ``x_b = b_p . x``: the rotation by ``θ_p`` in the plane ``span(a_p, b_p)``.
    The planes are summed, not composed, so the map is a rotation (and the scores relative) only when
    the planes of a sum are mutually orthogonal, as they are at ``rope_init``.

    * ``mode="axis"`` (the reference's "GRAPE-MRoPE"): three banks of ``num_planes`` planes over the
      whole head, ``t``'s then ``h``'s then ``w``'s applied in turn, ``θ_p = f_p * pos_axis``.
    * ``mode="mixed"``: one bank; plane ``p`` has a learned phase direction ``u_p`` (3 numbers,
      normalised): ``θ_p = f_p * (u_p . (t, h, w))``.
    * ``mode="block_mixed"``: the head is cut into ``D / block_size`` blocks of ``block_size`` channels,
      each with ``planes_per_block`` planes in it and their own directions; plane ``p`` of every block
      turns at ``f_p`` of a ``planes_per_block`` spectrum.

    The frequencies ``f`` are the RoPE spectrum ``theta ** (-2 i / D)`` (``D / 2`` values), subsampled
    at ``round(linspace(0, D/2 - 1, n))`` when ``n`` planes differ from ``D / 2``, warped
    ``f ** (1 / log_freq_scale)``; they are fixed (buffer). At ``rope_init`` (the reference's default)
    plane ``p`` spans channels ``(2p, 2p + 1)`` of its bank or block (``convention="interleaved"``; with
    ``"half"``, channels ``(p, p + C/2)``, the ``rotate_half`` pairing) and plane ``i`` (counted over
    blocks) has the direction of axis ``i mod 3``. So ``mixed`` starts as ``grape-i`` and ``axis`` as a
    rotation of pair ``p`` by ``f_p (t + h + w)``; ``rope_init=False`` draws ``a``, ``b`` and the directions
    from ``N(0, 0.02^2)``.

    Reads ``("t", "h", "w")`` (positions: the ``grape`` layout). ``rotate(q, k, coords)`` takes q
    ``(B, Hq, N, D)``, k ``(B, Hkv, N, D)``; the turn runs in q's dtype, the angles in float32. There is
    no ``cos`` / ``sin`` of channel pairs (``rotation`` raises; ``angles`` gives the planes' angles), so the encoder is not shared across layers
    (one instance per layer in :class:`mmpos.nn.Transformer`) and :func:`mmpos.integrations.hf_rope.use_rope`
    cannot install it.

    Args:
        dim, num_heads, head_dim: the head size ``D``.
        mode: ``"axis"``, ``"mixed"`` (default) or ``"block_mixed"`` (:data:`GRAPE_MODES`).
        theta: base of the spectrum. log_freq_scale: the warp ``s > 0`` (default 1).
        num_planes: planes per bank for ``axis`` / ``mixed``, ``1 .. D/2`` (default ``D / 2``).
        block_size: channels per block for ``block_mixed`` (default 16; at most ``D``, which it must divide).
        planes_per_block: ``1 .. block_size / 2`` (default ``block_size / 2``).
        rope_init: start from the canonical planes (default ``True``) or from random ones.
        learnable: train the planes and directions (default ``True``).
        convention: the channel pairing of the canonical start, ``"interleaved"`` (the reference's) or ``"half"``.
        scaling: a static length-scaling rule (:mod:`mmpos.scaling`) applied to the source spectrum before the
            subsampling and the warp (as the reference's ``inv_freq`` carries the model's ``rope_scaling``); rules
            with an attention factor or a dynamic rule are refused.
    """

    def __init__(
        self,
        dim: int | None = None,
        num_heads: int | None = None,
        head_dim: int | None = None,
        mode: str = "mixed",
        theta: float = 10000.0,
        log_freq_scale: float = 1.0,
        num_planes: int | None = None,
        block_size: int = 16,
        planes_per_block: int | None = None,
        rope_init: bool = True,
        learnable: bool = True,
        convention: str = "interleaved",
        scaling: RopeScaling | dict | None = None,
    ) -> None:
        nn.Module.__init__(self)  # no frequency plan: the planes are parameters (RotaryEncoder.__init__ skipped)
        d = check_int(resolve_head_dim(dim, num_heads, head_dim), "head_dim", even=True)
        if mode not in GRAPE_MODES:
            raise ValueError(f"mode must be one of {GRAPE_MODES} (canonical planes: encoder 'grape'), got {mode!r}")
        if convention not in CONVENTIONS:
            raise ValueError(f"convention must be one of {CONVENTIONS}, got {convention!r}")
        check_bool(rope_init, "rope_init")
        check_bool(learnable, "learnable")
        s = check_float(log_freq_scale, "log_freq_scale")
        self.mode, self.axes, self.head_dim, self.convention = mode, THW, d, convention
        self.attention_factor, self.rescale = 1.0, None
        if mode == "block_mixed":
            size = min(check_int(block_size, "block_size"), d)  # the reference's min(block_size, rotary_dim)
            if d % size or size % 2:
                raise ValueError(f"block_size must be even and divide head_dim={d}, got {block_size}")
            per_block = size // 2 if planes_per_block is None else check_int(planes_per_block, "planes_per_block")
            if per_block > size // 2:
                raise ValueError(f"planes_per_block must be at most block_size / 2 = {size // 2}, got {per_block}")
            if num_planes is not None:
                raise ValueError(
                    f"num_planes applies to modes 'axis' and 'mixed' (here: planes_per_block), got {num_planes!r}"
                )
            shape, planes = (d // size, per_block, size), per_block
        else:
            if planes_per_block is not None:
                raise ValueError(f"planes_per_block applies to mode='block_mixed' only, got {planes_per_block!r}")
            planes = d // 2 if num_planes is None else check_int(num_planes, "num_planes")
            if planes > d // 2:
                raise ValueError(f"num_planes must be at most head_dim / 2 = {d // 2}, got {planes}")
            shape = (3, planes, d) if mode == "axis" else (planes, d)
        self.block_size = shape[-1]
        freq = rope_frequencies(d // 2, theta)  # (D/2,) the reference's source inv_freq
        if scaling is not None:  # a static rule acts on the source spectrum, as on the reference's inv_freq
            plan, factor, rescale = build_scaling(FrequencyPlan(freq[None], ("seq",), d), scaling)
            if rescale is not None or factor != 1.0:
                raise ValueError(
                    f"grape-learned takes static scaling rules without an attention factor (they change the "
                    f"frequencies only), got {scaling!r}"
                )
            freq = plan.weight[0]
        self.scaling = as_scaling(scaling)
        if planes != d // 2:
            freq = freq[torch.linspace(0, d // 2 - 1, planes).round().long()]
        if s != 1:
            freq = torch.exp(freq.log() / s)
        self.register_buffer("freq", freq, persistent=False)  # (planes,)
        # a, b: axis (3, P, D), one bank per axis; mixed (P, D); block_mixed (K, P, C)
        self.a = nn.Parameter(torch.empty(shape), requires_grad=learnable)
        self.b = nn.Parameter(torch.empty(shape), requires_grad=learnable)
        if mode == "axis":
            self.register_parameter("axis_weight", None)
        else:
            self.axis_weight = nn.Parameter(torch.empty(*shape[:-1], 3), requires_grad=learnable)  # (..., P, 3)
        self.reset_parameters(rope_init)

    def reset_parameters(self, rope_init: bool = True) -> None:
        """The canonical start (``rope_init``) or ``N(0, 0.02^2)`` draws, as the reference's ``reset_parameters``."""
        with torch.no_grad():
            params = [self.a, self.b] + ([] if self.axis_weight is None else [self.axis_weight])
            if not rope_init:
                for p in params:
                    nn.init.normal_(p, std=0.02)
                return
            planes, width = self.a.shape[-2], self.a.shape[-1]
            p = torch.arange(planes)
            first, second = (2 * p, 2 * p + 1) if self.convention == "interleaved" else (p, p + width // 2)
            self.a.zero_()[..., p, first] = 1.0
            self.b.zero_()[..., p, second] = 1.0
            if self.axis_weight is not None:  # plane i (counted over blocks): the direction of axis i mod 3
                flat = self.axis_weight.zero_().view(-1, 3)
                i = torch.arange(flat.shape[0])
                flat[i, i % 3] = 1.0

    def _apply(self, fn, recurse=True):
        # model.to(torch.bfloat16) moves the frequencies and the phase directions but keeps them float32: they
        # multiply positions (in the thousands), where bfloat16's 8 bits would misplace the angle by radians.
        # The planes a, b follow the module (the turn runs in q's dtype).
        # (.double() raises them: only a cast to fewer bits is undone.)
        freq, direction = self.freq, None if self.axis_weight is None else self.axis_weight.data  # the masters
        nn.Module._apply(self, fn, recurse)
        if _narrower(self.freq.dtype, freq.dtype):
            self.freq = freq.to(self.freq.device)
        if direction is not None and _narrower(self.axis_weight.dtype, direction.dtype):
            self.axis_weight.data = direction.to(self.axis_weight.device)
            if self.axis_weight.grad is not None:
                self.axis_weight.grad = self.axis_weight.grad.to(direction.dtype)
        return self

    positions = MRoPE.positions  # a 1-D ("seq",) sequence reads as the same position on t, h, w

    def planes(self) -> tuple[Tensor, Tensor]:
        """The orthonormalised planes ``(a, b)``, each of the parameters' shape."""
        return _orthonormal(self.a, self.b)

    def _positions(self, coords: Coords) -> Tensor:
        pos = self.positions(coords).select(*THW).pos  # (B or 1, N, 3)
        return pos.to(torch.promote_types(pos.dtype, torch.float32))

    def _angles(self, pos: Tensor) -> Tensor:
        """Plane angles ``(B or 1, N, K, P)`` at ``pos`` ``(B or 1, N, 3)``: ``K = 3`` banks (``axis``), 1 (``mixed``)
        or the blocks (``block_mixed``)."""
        freq = self.freq.to(pos.dtype)
        if self.mode == "axis":
            return pos[..., None] * freq  # bank i turns by its axis' position
        u = F.normalize(self.axis_weight.to(pos.dtype), dim=-1)  # (P, 3) or (K, P, 3): the phase directions
        return torch.einsum("bnc,kpc->bnkp", pos, u if self.mode == "block_mixed" else u[None]) * freq

    def _turn_heads(self, x: Tensor, a: Tensor, b: Tensor, angle: Tensor) -> Tensor:
        n, d = x.shape[:-1], x.shape[-1]
        if self.mode == "axis":  # t's bank, then h's, then w's, each over the whole head
            x = x.unsqueeze(-2)
            for axis in range(3):
                x = _turn(x, a[axis, None], b[axis, None], angle[:, :, axis, None])
            return x.reshape(*n, d)
        if self.mode == "mixed":
            a, b = a[None], b[None]  # one block of D channels
        return _turn(x.reshape(*n, a.shape[0], d // a.shape[0]), a, b, angle).reshape(*n, d)

    def turn(self, x: Tensor, pos: Tensor) -> Tensor:
        """``x`` ``(B, H, N, D)`` turned at positions ``pos`` ``(B or 1, N, 3)`` (``t, h, w``)."""
        pos = pos.to(torch.promote_types(pos.dtype, torch.float32))
        return self._turn_heads(x, *self.planes(), self._angles(pos))

    def rotate(self, q: Tensor, k: Tensor, coords: Coords) -> tuple[Tensor, Tensor]:
        self.check_qk(q, k, coords)
        a, b = self.planes()  # once for q and k
        angle = self._angles(self._positions(coords))
        return self._turn_heads(q, a, b, angle), self._turn_heads(k, a, b, angle)

    def angles(self, coords: Coords) -> Tensor:
        """The angle of every plane, ``(B, N, 3 P)`` (``axis``: ``t``'s bank, ``h``'s, ``w``'s), ``(B, N, P)``
        (``mixed``) or ``(B, N, K P)`` (``block_mixed``, block-major); not the angles of channel pairs."""
        return self._angles(self._positions(coords)).flatten(-2)

    def rotation(self, coords: Coords):
        raise TypeError(_NO_COS_SIN)

    def extra_repr(self) -> str:
        return (
            f"mode={self.mode!r}, head_dim={self.head_dim}, planes={tuple(self.a.shape[:-1])}, "
            f"block={self.block_size}, convention={self.convention!r}"
        )
