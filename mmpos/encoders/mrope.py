"""The multimodal rotary family: M-RoPE (chunked, interleaved), MHRoPE, VRoPE, HoPE, VideoRoPE, MM-RoPE, V2PE.

Every method here is a :class:`~mmpos.rotary.FrequencyPlan` -- which rotary pair reads
which coordinate axis at which frequency, per head for MHRoPE -- applied by the shared
rotary core; they differ only in the plan and in the positions their layout
(:mod:`mmpos.layout`) gives the tokens. Pair ``p`` of ``P = head_dim / 2`` always has
the 1-D RoPE frequency ``theta ** (-p / P)`` (pair 0 rotates fastest).

==================  ======================  ===========================================
encoder             axes read               pair ``p`` reads
==================  ======================  ===========================================
mrope               ``t, h, w``             ``t`` / ``h`` / ``w`` in consecutive chunks
                                            of ``mrope_section`` pairs (``[16, 24, 24]``)
mrope-i             ``t, h, w``             axis ``p mod 3`` while ``p < 3 * section``,
                                            then ``t`` (``[24, 20, 20]``: THW x20, TTTT)
mhrope              ``t, h, w``             KV head ``j`` reads one axis with all pairs
                                            (``head_sections`` count KV heads, e.g.
                                            ``[2, 3, 3]``); leftover heads unrotated
vrope               ``c0, c1, c2, c3``      combination ``c{p mod 4}``
mmrope              ``t, h, w``             ``t, t, h, w, h, w, h, w`` by ``p mod 8``
hope                ``h, w``                pairs ``< P - section_t``: ``h`` (even ``p``),
                                            ``w`` (odd ``p``); the last ``section_t``
                                            (lowest-frequency) pairs: zero frequency
v2pe                ``seq``                 ``seq`` (1-D RoPE at fractional positions)
==================  ======================  ===========================================

GRAPE (``grape``, ``grape-i``, ``grape-learned``) is :mod:`mmpos.encoders.grape`.

A 1-D coordinate set (axes ``("seq",)``) is read as text: the same position on every
axis the plan reads, so ``mrope``, ``mrope-i``, ``vrope`` (and ``mhrope`` when its
``head_sections`` use every KV head) equal 1-D RoPE on text-only input. ``hope``
does not: its zero-frequency pairs are unrotated for every token, text included, as
in the reference implementation.

Shapes: q ``(B, Hq, N, D)``, k ``(B, Hkv, N, D)``; angles ``(B, N, D/2)`` or, for
``mhrope``, ``(B, Hkv, N, D/2)`` (query heads use ``repeat_interleave`` of the KV-head
angles, the grouping of grouped-query attention). Angles are float32, float64 when the
positions are float64 (``v2pe`` at long contexts).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import torch
from torch import Tensor

from .._validate import check_int, check_ints, is_int
from ..coords import Coords
from ..rotary import FrequencyPlan, rope_frequencies
from ..scaling import RopeScaling
from .base import RotaryEncoder, resolve_head_dim
from .registry import register_encoder

__all__ = [
    "AXIS_ORDERS",
    "MMROPE_PATTERN",
    "V2PE",
    "HoPE",
    "MHRoPE",
    "MMRoPE",
    "MRoPE",
    "MRoPEInterleaved",
    "VRoPE",
    "VideoRoPE",
    "default_mrope_section",
    "hope_plan",
    "mhrope_plan",
    "mmrope_plan",
    "mrope_plan",
    "videorope_plan",
    "vrope_plan",
]

THW = ("t", "h", "w")
VROPE_AXES = ("c0", "c1", "c2", "c3")


def _pairs(head_dim: int) -> int:
    return check_int(head_dim, "head_dim", even=True) // 2


#: how M-RoPE gives its rotary pairs to the axes t, h, w: ``"chunked"`` (Qwen2/2.5-VL:
#: ``TTT..HHH..WWW``) or ``"cyclic"`` (Qwen3-VL's "interleaved MRoPE", MRoPE-I: ``THWTHW..``).
#: Not the pair *convention* (``"half"`` / ``"interleaved"``: which two channels form a pair).
AXIS_ORDERS = ("chunked", "cyclic")


def _check_axis_order(axis_order: str) -> str:
    if axis_order not in AXIS_ORDERS:
        raise ValueError(f"axis_order must be one of {AXIS_ORDERS}, got {axis_order!r}")
    return axis_order


def default_mrope_section(head_dim: int, axis_order: str = "chunked") -> tuple[int, int, int]:
    """Rotary pairs per ``(t, h, w)`` in the proportions of the Qwen configs.

    ``axis_order="chunked"`` (Qwen2/2.5-VL): ``t = P // 4``, ``h = (P - t) // 2``,
    ``w = P - t - h`` (``[16, 24, 24]`` for ``P = 64``). ``"cyclic"`` (Qwen3-VL):
    ``h = w = 5 P // 16``, ``t = P - 2 h`` (``[24, 20, 20]``).
    """
    p = _pairs(head_dim)
    if _check_axis_order(axis_order) == "cyclic":
        h = 5 * p // 16
        return (p - 2 * h, h, h)
    t = p // 4
    h = (p - t) // 2
    return (t, h, p - t - h)


def _check_section(section: Sequence[int], total: int, what: str, name: str = "mrope_section") -> tuple[int, ...]:
    out = check_ints(section, name, low=0, length=3)  # (1.9, 1, 2) is refused, not read as (1, 1, 2)
    if sum(out) != total:
        raise ValueError(f"{name} must hold 3 non-negative {what} (t, h, w) summing to {total}, got {list(out)}")
    return out


def _check_axes(axes: Sequence[str]) -> tuple[str, ...]:
    if isinstance(axes, str) or not isinstance(axes, Sequence):
        raise TypeError(f"axes must be a sequence of 3 axis names, got {axes!r}")
    axes = tuple(axes)
    if len(axes) != 3 or not all(isinstance(a, str) and a for a in axes) or len(set(axes)) != 3:
        raise ValueError(f"axes must be 3 distinct non-empty axis names, got {axes!r}")
    return axes


def mrope_plan(
    head_dim: int,
    mrope_section: Sequence[int] | None = None,
    axis_order: str = "chunked",
    theta: float = 10000.0,
    convention: str = "half",
    axes: Sequence[str] = THW,
) -> FrequencyPlan:
    """M-RoPE plan: ``axis_order`` ``"chunked"`` (Qwen2/2.5-VL) or ``"cyclic"`` (Qwen3-VL's
    interleaved MRoPE, MRoPE-I); see :data:`AXIS_ORDERS`.

    ``mrope_section`` counts rotary pairs per ``(t, h, w)`` and sums to ``head_dim / 2``.
    Cyclic sections must give every axis exactly its count under the rule of
    Qwen3-VL's ``apply_interleaved_mrope`` (roughly ``3 * section[h or w] <= head_dim / 2``).
    ``axes`` names the three axes in section order (default ``("t", "h", "w")``; HunYuan-VL's
    scheme reads ``("w", "h", "image")``).
    """
    p = _pairs(head_dim)
    axis_order = _check_axis_order(axis_order)
    axes = _check_axes(axes)
    section = default_mrope_section(head_dim, axis_order) if mrope_section is None else mrope_section
    section = _check_section(section, p, "rotary pair counts")
    if axis_order == "chunked":
        return FrequencyPlan.chunked_axes(head_dim, section, axes, theta, convention)
    plan = FrequencyPlan.cyclic_axes(head_dim, section, axes, theta, convention)
    counts = tuple(int(c) for c in (plan.weight != 0).sum(-1))  # pairs per axis (pair 0 has freq 1)
    if counts != section:
        raise ValueError(
            f"cyclic mrope_section {list(section)} gives (t, h, w) {list(counts)} pairs: h and w take every "
            f"third pair below 3 * section, so 3 * section[h or w] must not exceed head_dim/2 = {p}"
        )
    return plan


def mhrope_plan(
    head_dim: int,
    num_kv_heads: int,
    head_sections: Sequence[int] | None = None,
    theta: float = 10000.0,
    convention: str = "half",
) -> FrequencyPlan:
    """MHRoPE plan ``(num_kv_heads, 3, P)``: KV heads ``[0, s_t)`` read ``t``, the next
    ``s_h`` read ``h``, the next ``s_w`` read ``w``, each with the full spectrum; heads
    beyond ``sum(head_sections)`` are not rotated. Default ``t = H // 4``,
    ``h = w = (H - t) // 2`` (``[2, 3, 3]`` for 8 KV heads, as the reference); with fewer than
    4 KV heads the default would leave an axis without a head, so ``head_sections`` must be given."""
    _pairs(head_dim)
    num_kv_heads = check_int(num_kv_heads, "num_kv_heads")
    if head_sections is None:
        if num_kv_heads < 4:  # the default would give an axis no head (t for 3, every axis for 1)
            raise ValueError(
                f"mhrope rotates each KV head by one of the 3 axes (t, h, w): num_kv_heads={num_kv_heads} cannot hold "
                f"the default head_sections (t = num_kv_heads // 4 = {num_kv_heads // 4} heads); use at least 4 KV "
                "heads, or pass head_sections explicitly (e.g. [1, 1, 1] with 3; a 0 leaves that axis unencoded)"
            )
        t = num_kv_heads // 4
        head_sections = (t, (num_kv_heads - t) // 2, (num_kv_heads - t) // 2)
    sections = check_ints(head_sections, "head_sections", low=0, length=3)  # no silent int() of 1.5
    if sum(sections) > num_kv_heads:
        raise ValueError(
            f"head_sections must hold 3 non-negative KV-head counts (t, h, w) summing to at most "
            f"num_kv_heads={num_kv_heads}, got {list(sections)}"
        )
    return FrequencyPlan.per_head(head_dim, num_kv_heads, sections, THW, theta, convention)


def vrope_plan(head_dim: int, theta: float = 10000.0, convention: str = "half") -> FrequencyPlan:
    """VRoPE plan: pair ``p`` reads axis ``c{p mod 4}`` (no pair carries time)."""
    p = _pairs(head_dim)
    index = torch.arange(p) % len(VROPE_AXES)
    return FrequencyPlan.from_assignment(index, rope_frequencies(p, theta), VROPE_AXES, head_dim, convention)


def hope_plan(
    head_dim: int, mrope_section: Sequence[int] | None = None, theta: float = 10000.0, convention: str = "half"
) -> FrequencyPlan:
    """HoPE hybrid frequency allocation on axes ``("h", "w")``.

    With ``mrope_section = (s_t, s_h, s_w)``: pairs ``p < s_h + s_w`` read ``h`` (even
    ``p``) and ``w`` (odd ``p``); the last ``s_t`` pairs, the lowest frequencies, get
    frequency zero (temporal NoPE). ``[16, 24, 24]``: ``hwhw...`` x48, then 16 unrotated.
    """
    p = _pairs(head_dim)
    section = default_mrope_section(head_dim) if mrope_section is None else mrope_section
    s_t, _, _ = _check_section(section, p, "rotary pair counts")
    spatial = torch.arange(p - s_t) % 2  # 0 -> h, 1 -> w
    index = torch.cat([spatial, torch.full((s_t,), -1, dtype=torch.long)])
    return FrequencyPlan.from_assignment(index, rope_frequencies(p, theta), ("h", "w"), head_dim, convention)


def videorope_plan(
    head_dim: int, mrope_section: Sequence[int] | None = None, theta: float = 10000.0, convention: str = "half"
) -> FrequencyPlan:
    """VideoRoPE low-frequency temporal allocation on axes ``("t", "h", "w")``.

    With ``mrope_section = (s_t, s_h, s_w)``: pairs ``p < s_h + s_w`` read ``h`` (even ``p``)
    and ``w`` (odd ``p``), the last ``s_t`` pairs -- the lowest frequencies -- read ``t``
    (Wiselnn570/VideoRoPE ``apply_m_modify_multimodal_rotary_pos_emb``: ``[16, 24, 24]`` ->
    ``hwhw...`` x48, then ``t`` x16). HoPE's allocation with the temporal pairs rotated.
    """
    p = _pairs(head_dim)
    section = default_mrope_section(head_dim) if mrope_section is None else mrope_section
    s_t, _, _ = _check_section(section, p, "rotary pair counts")
    spatial = torch.arange(p - s_t) % 2 + 1  # 1 -> h, 2 -> w
    index = torch.cat([spatial, torch.zeros(s_t, dtype=torch.long)])  # 0 -> t on the lowest frequencies
    return FrequencyPlan.from_assignment(index, rope_frequencies(p, theta), THW, head_dim, convention)


#: MM-RoPE's meta component: 8 rotary pairs read ``t, t, h, w, h, w, h, w`` (the 2:3:3 ratio, repeated)
MMROPE_PATTERN = (0, 0, 1, 2, 1, 2, 1, 2)


def mmrope_plan(head_dim: int, theta: float = 10000.0, convention: str = "half") -> FrequencyPlan:
    """MM-RoPE distributed allocation on axes ``("t", "h", "w")``: pair ``p`` reads axis
    ``MMROPE_PATTERN[p mod 8]`` (``T, T, H, W, H, W, H, W`` per meta component of 8 pairs; a
    remainder keeps the pattern), so every axis spans the whole spectrum in the 2:3:3 ratio.
    JJJYmmm/Multimodal-RoPEs ``freq_allocation/mmrope.py`` (``MMRopeEmbedding.apply_transformation``)."""
    p = _pairs(head_dim)
    index = torch.tensor(MMROPE_PATTERN)[torch.arange(p) % len(MMROPE_PATTERN)]
    return FrequencyPlan.from_assignment(index, rope_frequencies(p, theta), THW, head_dim, convention)


class _MultimodalRotary(RotaryEncoder):
    """Reads a 1-D ``("seq",)`` coordinate set as text (the same position on every axis)."""

    #: scaling rules treat all pairs as one spectrum, sectioned over the axes (as transformers and vLLM scale M-RoPE)
    scaling_spectrum = "shared"

    def positions(self, coords: Coords) -> Coords:
        if coords.axes == ("seq",) and self.axes != ("seq",):
            b, n, _ = coords.pos.shape
            return replace(coords, pos=coords.pos.expand(b, n, len(self.axes)), axes=self.axes, _trusted=True)
        missing = [a for a in self.axes if a not in coords.axes]
        if missing:
            raise ValueError(
                f"{type(self).__name__} reads axes {self.axes} (or a 1-D ('seq',) text sequence); "
                f"coords have axes {coords.axes}"
            )
        return coords


class _PatternRotary(_MultimodalRotary):
    """A plan from ``(head_dim, theta, convention)`` alone (its pattern fixes the sections): ``plan_of``."""

    plan_of: Callable[..., FrequencyPlan]

    def __init__(
        self,
        dim: int | None = None,
        num_heads: int | None = None,
        head_dim: int | None = None,
        theta: float = 10000.0,
        convention: str = "half",
        scaling: RopeScaling | dict | None = None,
    ) -> None:
        plan = self.plan_of(resolve_head_dim(dim, num_heads, head_dim), theta, convention)
        super().__init__(plan, scaling=scaling)


class _SectionedRotary(_MultimodalRotary):
    """A plan from ``(head_dim, mrope_section, theta, convention)``: the subclass names it as ``plan_of``."""

    plan_of: Callable[..., FrequencyPlan]

    def __init__(
        self,
        dim: int | None = None,
        num_heads: int | None = None,
        head_dim: int | None = None,
        mrope_section: Sequence[int] | None = None,
        theta: float = 10000.0,
        convention: str = "half",
        scaling: RopeScaling | dict | None = None,
    ) -> None:
        plan = self.plan_of(resolve_head_dim(dim, num_heads, head_dim), mrope_section, theta, convention)
        super().__init__(plan, scaling=scaling)


@register_encoder(
    "mrope",
    paper="Wang et al. 2024, Qwen2-VL M-RoPE (arXiv:2409.12191)",
    reference="huggingface/transformers src/transformers/models/qwen2_vl/modeling_qwen2_vl.py (Qwen2VLRotaryEmbedding)",
)
class MRoPE(_MultimodalRotary):
    """Multimodal RoPE with chunked sections (Qwen2-VL, Qwen2.5-VL).

    Paper: Wang et al., "Qwen2-VL: Enhancing Vision-Language Model's Perception of the World
    at Any Resolution", 2024, https://arxiv.org/abs/2409.12191. Reference: Hugging Face
    transformers ``models/qwen2_vl/modeling_qwen2_vl.py`` (``Qwen2VLRotaryEmbedding``,
    ``apply_multimodal_rotary_pos_emb``); tests compare with it directly.

    Reads coordinates ``("t", "h", "w")`` (layouts ``qwen2-vl``, ``qwen2.5-vl``).

    Args:
        dim, num_heads, head_dim: the head size (``head_dim`` or ``dim // num_heads``).
        mrope_section: rotary pairs per ``(t, h, w)``, summing to ``head_dim / 2``;
            default :func:`default_mrope_section` (``[16, 24, 24]`` for ``head_dim=128``).
        theta: base of the spectrum (Qwen2-VL checkpoints use ``1e6``).
        convention: ``"half"`` (HF) or ``"interleaved"``.
        scaling: a length / resolution scaling rule per axis (:class:`~mmpos.scaling.RopeScaling` or a
            dict of its arguments); the pairs form one spectrum shared by the axes. Every encoder of this
            module takes it.
        axes: the names of the three axes in section order (default ``("t", "h", "w")``); a scheme whose
            coordinates name them otherwise says so in ``Scheme.encoder_kwargs`` (HunYuan-VL's
            ``("w", "h", "image")``).
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
        axes: Sequence[str] = THW,
    ) -> None:
        head_dim = resolve_head_dim(dim, num_heads, head_dim)
        plan = mrope_plan(head_dim, mrope_section, self.axis_order, theta, convention, axes)
        super().__init__(plan, scaling=scaling)


@register_encoder(
    "mrope-i",
    paper="Huang et al. 2025, MRoPE-Interleave (arXiv:2510.23095)",
    reference="JJJYmmm/Multimodal-RoPEs multimodal_ropes/freq_allocation/mrope_i.py",
)
class MRoPEInterleaved(MRoPE):
    """Multimodal RoPE with interleaved sections (Qwen3-VL, MRoPE-I).

    Paper: Huang et al., "Revisiting Multimodal Positional Encoding in Vision-Language
    Models", 2025, https://arxiv.org/abs/2510.23095. References: JJJYmmm/Multimodal-RoPEs
    ``multimodal_ropes/freq_allocation/mrope_i.py``; Hugging Face transformers
    ``models/qwen3_vl/modeling_qwen3_vl.py`` (``Qwen3VLTextRotaryEmbedding.apply_interleaved_mrope``),
    which tests compare with directly.

    Pair ``p`` reads axis ``p mod 3`` while ``p < 3 * mrope_section[p mod 3]``; the rest read
    ``t``. Default sections ``[24, 20, 20]`` for ``head_dim=128``. Reads ``("t", "h", "w")``
    (layouts ``qwen3-vl``, ``mrope-i`` with spatial reset). Arguments as :class:`MRoPE`.
    """

    axis_order = "cyclic"


@register_encoder(
    "mhrope",
    paper="Huang et al. 2025, Multi-Head RoPE (arXiv:2510.23095)",
    reference="JJJYmmm/Multimodal-RoPEs multimodal_ropes/freq_allocation/mhrope.py (MHRopeEmbedding)",
)
class MHRoPE(_MultimodalRotary):
    """Multi-Head RoPE: each KV head rotates by one axis with the full 1-D spectrum.

    Paper: Huang et al., "Revisiting Multimodal Positional Encoding in Vision-Language
    Models", 2025, https://arxiv.org/abs/2510.23095. Reference: JJJYmmm/Multimodal-RoPEs
    ``multimodal_ropes/freq_allocation/mhrope.py`` (``MHRopeEmbedding.apply_transformation``)
    and the README's ``apply_multihead_rotary_pos_emb`` (query heads: ``repeat_interleave``).

    Reads ``("t", "h", "w")`` (layout ``mhrope``). Angles are ``(B, Hkv, N, D/2)``.

    Args:
        dim, num_heads, head_dim: the head size.
        num_kv_heads: KV heads (default ``num_heads``); query heads are grouped per KV head.
        head_sections: KV heads per ``(t, h, w)`` (default ``[2, 3, 3]`` for 8 KV heads,
            see :func:`mhrope_plan`); heads beyond their sum are not rotated.
        theta, convention: as :class:`MRoPE`.
    """

    def __init__(
        self,
        dim: int | None = None,
        num_heads: int | None = None,
        head_dim: int | None = None,
        num_kv_heads: int | None = None,
        head_sections: Sequence[int] | None = None,
        theta: float = 10000.0,
        convention: str = "half",
        scaling: RopeScaling | dict | None = None,
    ) -> None:
        head_dim = resolve_head_dim(dim, num_heads, head_dim)
        kv = num_kv_heads if num_kv_heads is not None else num_heads
        if kv is None:
            raise ValueError("pass num_kv_heads (or num_heads) to mhrope")
        if num_heads is None:
            kv = check_int(kv, "num_kv_heads")
        elif not is_int(kv) or kv <= 0 or num_heads % kv:
            raise ValueError(f"num_kv_heads must be a positive divisor of num_heads={num_heads}, got {kv!r}")
        super().__init__(mhrope_plan(head_dim, kv, head_sections, theta, convention), scaling=scaling)
        self.num_kv_heads = kv

    def rotate(self, q: Tensor, k: Tensor, coords: Coords) -> tuple[Tensor, Tensor]:
        if k.shape[1] != self.num_kv_heads or q.shape[1] % self.num_kv_heads:
            raise ValueError(
                f"mhrope was built for {self.num_kv_heads} KV heads: k must have {self.num_kv_heads} heads and q a "
                f"multiple of it, got q {q.shape[1]} and k {k.shape[1]} heads"
            )
        return super().rotate(q, k, coords)


@register_encoder(
    "vrope",
    paper="Liu et al. 2025, VRoPE (arXiv:2502.11664)",
    reference="johncaged/VRoPE vrope.py (VRoPE.generate_nd_positions)",
)
class VRoPE(_PatternRotary):
    """VRoPE: per-pair positions, the four symmetric combinations of a frame's ``(i, j)``.

    Paper: Liu et al., "VRoPE: Rotary Position Embedding for Video Large Language Models",
    EMNLP 2025, https://arxiv.org/abs/2502.11664. Reference: johncaged/VRoPE ``vrope.py``
    (``VRoPE.generate_nd_positions``: pair ``k`` takes combination ``k mod 4``;
    ``half_time_dim`` is forced to 0, so no pair carries a separate time channel).

    Reads ``("c0", "c1", "c2", "c3")`` (layout ``vrope``: ``i + j``, ``i + (W-1-j)``,
    ``(H-1-i) + j``, ``(H-1-i) + (W-1-j)`` plus the frame offset).

    Args:
        dim, num_heads, head_dim: the head size. theta, convention: as :class:`MRoPE`.
    """

    plan_of = staticmethod(vrope_plan)


@register_encoder(
    "videorope",
    paper="Wei et al. 2025, VideoRoPE (arXiv:2502.05173)",
    reference="Wiselnn570/VideoRoPE videorope-transformer/modeling_videorope.py (apply_m_modify_multimodal_rotary_pos_emb)",
)
class VideoRoPE(_SectionedRotary):
    """VideoRoPE: low-frequency temporal allocation (LTA), the spatial ``h``/``w`` pairs
    alternating on the high frequencies, ``t`` on the lowest ``mrope_section[0]`` pairs.

    Paper: Wei et al., "VideoRoPE: What Makes for Good Video Rotary Position Embedding?",
    ICML 2025, https://arxiv.org/abs/2502.05173. Reference: Wiselnn570/VideoRoPE
    ``videorope-transformer/modeling_videorope.py`` (``apply_m_modify_multimodal_rotary_pos_emb``);
    positions (the diagonal layout, adjustable temporal spacing) from the ``videorope`` layout
    of :mod:`mmpos.schemes` (JJJYmmm/Multimodal-RoPEs ``pos_design/videorope.py``).

    Reads ``("t", "h", "w")``. Args: as :class:`HoPE` (``mrope_section`` default ``[16, 24, 24]``
    for ``head_dim=128``; its ``t`` pairs are rotated here).
    """

    #: (head_dim, mrope_section, theta, convention) -> FrequencyPlan
    plan_of = staticmethod(videorope_plan)


@register_encoder(
    "mmrope",
    paper="Yuan et al. 2025, Lumos-1 MM-RoPE (arXiv:2507.08801)",
    reference="JJJYmmm/Multimodal-RoPEs multimodal_ropes/freq_allocation/mmrope.py (MMRopeEmbedding)",
)
class MMRoPE(_PatternRotary):
    """MM-RoPE: distributed 2:3:3 meta-component frequency allocation.

    Paper: Yuan et al., "Lumos-1: On Autoregressive Video Generation from a Unified Model
    Perspective", 2025, https://arxiv.org/abs/2507.08801 (MM-RoPE). Reference:
    JJJYmmm/Multimodal-RoPEs ``multimodal_ropes/freq_allocation/mmrope.py``: every 8 consecutive
    rotary pairs read ``t, t, h, w, h, w, h, w`` (:func:`mmrope_plan`), so each axis has high and
    low frequencies (M-RoPE's chunks give ``t`` only the highest). Positions: the ``mmrope`` layout.

    Reads ``("t", "h", "w")``. Args: ``dim``, ``num_heads``, ``head_dim``, ``theta``,
    ``convention``, ``scaling`` as :class:`MRoPE` (no ``mrope_section``: the pattern fixes it).
    """

    plan_of = staticmethod(mmrope_plan)


@register_encoder(
    "hope",
    paper="Li et al. 2025, HoPE (arXiv:2505.20444)",
    reference="hrlics/HoPE modeling_hope.py (apply_hybrid_multimodal_rotary_pos_emb)",
)
class HoPE(_SectionedRotary):
    """HoPE: hybrid frequency allocation, spatial ``h``/``w`` alternating on the high
    frequencies and zero frequency (temporal NoPE) on the lowest ``mrope_section[0]`` pairs.

    Paper: Li et al., "HoPE: Hybrid of Position Embedding for Length Generalization in
    Vision-Language Models", 2025, https://arxiv.org/abs/2505.20444. Reference: hrlics/HoPE
    ``modeling_hope.py`` (``apply_hybrid_multimodal_rotary_pos_emb``: sections
    ``[16, 24, 24]`` -> 48 spatial pairs ``h, w, h, w, ...`` then 16 pairs with cos 1, sin 0).

    Reads ``("h", "w")`` of the ``hope`` layout (whose ``h``, ``w`` already carry the scaled
    temporal index); ``t`` is not read.

    Args:
        dim, num_heads, head_dim: the head size.
        mrope_section: ``(t, h, w)`` pair counts; ``t`` pairs are unrotated (default
            ``[16, 24, 24]`` for ``head_dim=128``).
        theta, convention: as :class:`MRoPE`.
    """

    plan_of = staticmethod(hope_plan)


@register_encoder(
    "v2pe",
    paper="Ge et al. 2024, V2PE (arXiv:2412.09616)",
    reference="OpenGVLab/V2PE internvl/model/internlm2/modeling_internlm2.py (V2PE)",
)
class V2PE(RotaryEncoder):
    """V2PE: 1-D RoPE at the fractional positions of the ``v2pe`` layout.

    Paper: Ge et al., "V2PE: Improving Multimodal Long-Context Capability of Vision-Language
    Models with Variable Visual Position Encoding", 2024, https://arxiv.org/abs/2412.09616.
    Reference: OpenGVLab/V2PE ``internvl/model/internlm2/modeling_internlm2.py`` (class
    ``V2PE``: ``outer(pos_id, inv_freq)`` at float positions, ``rotate_half`` layout).

    Reads ``("seq",)``. Positions in float64 (as the layout builds them) give float64 angles,
    so steps of ``1/256`` stay distinct at ``10**6`` tokens (float32 spacing there is 1/16).

    Args:
        dim, num_heads, head_dim: the head size. theta, convention: as :class:`MRoPE`.
    """

    def __init__(
        self,
        dim: int | None = None,
        num_heads: int | None = None,
        head_dim: int | None = None,
        theta: float = 10000.0,
        convention: str = "half",
        scaling: RopeScaling | dict | None = None,
    ) -> None:
        plan = FrequencyPlan.rope(resolve_head_dim(dim, num_heads, head_dim), theta, None, "seq", convention)
        super().__init__(plan, scaling=scaling)

    def positions(self, coords: Coords) -> Coords:
        if coords.axes != ("seq",):
            raise ValueError(f"v2pe reads 1-D ('seq',) coordinates (the v2pe layout), got axes {coords.axes}")
        return coords
