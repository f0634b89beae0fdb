"""The rotary core: frequency plans, angles and the rotation of q / k.

A head of dimension ``D`` holds ``D / 2`` rotary *pairs*; the first ``P`` of them
(``P = rotary_dim / 2``) are rotated, the rest pass through (partial rotary).
A :class:`FrequencyPlan` says, for every rotated pair, how its angle is made from
the token coordinates::

    angle[b, (h,) n, p] = sum_a pos[b, n, a] * weight[(h,) a, p]

``weight`` is ``(A, P)`` (shared by all heads) or ``(H, A, P)`` (per head). A plan
where pair ``p`` reads one axis ``a`` at frequency ``f`` has ``weight[a, p] = f`` and
zeros elsewhere: 1-D RoPE, axial 2-D/3-D RoPE, M-RoPE (chunked and interleaved),
MHRoPE, HoPE and VRoPE are all such plans; RoPE-Mixed learns a dense ``weight``.
The sum is written as a product and a sum over the (few) axes, not as a matmul, so
that a one-hot plan gives exactly ``pos * f`` even where TF32 matmuls are enabled.

Two layouts of the pairs inside a head are supported:

* ``"half"`` -- pair ``i`` is ``(x[i], x[i + P])`` (``rotate_half``; Llama, Qwen, HF)
* ``"interleaved"`` -- pair ``i`` is ``(x[2i], x[2i + 1])`` (GPT-J, rope-vit)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ._validate import check_axes, check_float, check_int, check_ints
from .coords import Coords

__all__ = [
    "CONVENTIONS",
    "FrequencyPlan",
    "Rotation",
    "apply_rotary",
    "coords_angles",
    "plan_angles",
    "rope_frequencies",
    "rotate_qk",
]

CONVENTIONS = ("half", "interleaved")


def rope_frequencies(pairs: int, theta: float = 10000.0) -> Tensor:
    """The 1-D RoPE spectrum ``theta ** (-2 i / (2 pairs))``, ``i < pairs``, float32 ``(pairs,)``.

    Computed as Hugging Face transformers computes ``inv_freq`` (so values match bit for bit).
    """
    pairs = check_int(pairs, "pairs")  # 2.5 or True: a clear error, not a spectrum of another size
    theta = check_float(theta, "theta")  # inf, NaN, a string: a clear error, not inf / NaN angles
    dim = 2 * pairs
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def _check_head_dim(head_dim: int, rotary_dim: int | None) -> int:
    head_dim = check_int(head_dim, "head_dim", even=True)
    rotary_dim = (
        head_dim
        if rotary_dim is None
        else check_int(rotary_dim, f"rotary_dim (head_dim={head_dim})", 2, high=head_dim, even=True)
    )
    return rotary_dim // 2


def _check_sections(sections: Sequence[int], total: int, axes: tuple[str, ...]) -> tuple[int, ...]:
    """One non-negative pair count per axis, summing to the ``total`` rotary pairs (ints only: ``1.5`` is refused)."""
    sections = check_ints(sections, "sections", low=0)
    if any(s < 0 for s in sections) or sum(sections) != total:
        raise ValueError(
            f"sections must be non-negative and sum to the {total} rotary pairs, got {list(sections)} (sum {sum(sections)})"
        )
    if len(sections) != len(axes):
        raise ValueError(f"sections must hold one count per axis {axes}, got {list(sections)}")
    return sections


def _chunk_index(sections: tuple[int, ...]) -> Tensor:
    """``(sum(sections),)`` long: section ``i`` of consecutive pairs reads axis ``i``."""
    return torch.repeat_interleave(torch.arange(len(sections)), torch.tensor(sections))


@dataclass(frozen=True, eq=False)
class FrequencyPlan:
    """Which axis and frequency every rotary pair uses.

    Attributes:
        weight: ``(A, P)`` or ``(H, A, P)`` float32; see the module docstring.
        axes: the ``A`` coordinate axes read (names in :attr:`Coords.axes`).
        head_dim: ``D``; pairs ``P .. D/2`` are not rotated.
        convention: ``"half"`` or ``"interleaved"``.
    """

    weight: Tensor
    axes: tuple[str, ...]
    head_dim: int
    convention: str = "half"

    def __post_init__(self) -> None:
        object.__setattr__(self, "axes", check_axes(self.axes))
        pairs = _check_head_dim(self.head_dim, None)
        w = self.weight
        if not isinstance(w, Tensor) or not w.is_floating_point():  # an int weight would give integer angles
            kind = w.dtype if isinstance(w, Tensor) else type(w).__name__
            raise TypeError(f"weight must be a floating-point tensor (A, P) or (H, A, P), got {kind}")
        if w.dim() not in (2, 3) or w.shape[-2] != len(self.axes):
            raise ValueError(
                f"weight must be (A, P) or (H, A, P) with A={len(self.axes)} axes {self.axes}, got {tuple(w.shape)}"
            )
        if not 0 < w.shape[-1] <= pairs:
            raise ValueError(f"weight must cover 1..{pairs} rotary pairs (head_dim={self.head_dim}), got {w.shape[-1]}")
        if self.convention not in CONVENTIONS:
            raise ValueError(f"convention must be one of {CONVENTIONS}, got {self.convention!r}")

    @property
    def pairs(self) -> int:
        """Number of rotated pairs ``P``."""
        return self.weight.shape[-1]

    @property
    def num_heads(self) -> int | None:
        """``H`` for a per-head plan, ``None`` when all heads share the plan."""
        return self.weight.shape[0] if self.weight.dim() == 3 else None

    # ---------------------------------------------------------------- constructors
    @classmethod
    def from_assignment(
        cls,
        axis_index: Tensor,
        freq: Tensor,
        axes: Sequence[str],
        head_dim: int,
        convention: str = "half",
    ) -> FrequencyPlan:
        """Pair ``p`` reads axis ``axis_index[(h,) p]`` at frequency ``freq[(h,) p]``.

        ``axis_index`` is ``(P,)`` or ``(H, P)`` long; ``-1`` leaves the pair unrotated.
        ``freq`` broadcasts against it.
        """
        axes = check_axes(axes)
        axis_index = torch.as_tensor(axis_index)
        if axis_index.is_floating_point() or axis_index.is_complex() or axis_index.dtype == torch.bool:
            # torch.as_tensor(..., dtype=long) would truncate 0.7 to axis 0
            raise TypeError(
                f"axis_index must be an integer tensor (axis numbers, -1: unrotated), got {axis_index.dtype}"
            )
        axis_index = axis_index.long()
        if axis_index.dim() not in (1, 2):
            raise ValueError(f"axis_index must be (P,) or (H, P), got shape {tuple(axis_index.shape)}")
        freq = torch.as_tensor(freq)
        if freq.is_complex() or freq.dtype == torch.bool or not bool(torch.isfinite(freq).all()):
            raise ValueError(f"freq must hold finite real frequencies, got {freq.dtype} {freq.flatten()[:4].tolist()}")
        try:
            freq = freq.to(torch.float32).expand(axis_index.shape)
        except RuntimeError:
            raise ValueError(
                f"freq of shape {tuple(freq.shape)} must broadcast against axis_index {tuple(axis_index.shape)}"
            ) from None
        a = len(axes)
        if axis_index.numel() and (axis_index.min() < -1 or axis_index.max() >= a):
            raise ValueError(f"axis_index must lie in [-1, {a - 1}] for axes {axes}")
        onehot = axis_index.unsqueeze(-2) == torch.arange(a).view(a, 1)  # (..., A, P)
        weight = torch.where(onehot, freq.unsqueeze(-2), torch.zeros(()))
        return cls(weight, tuple(axes), head_dim, convention)

    @classmethod
    def rope(
        cls,
        head_dim: int,
        theta: float = 10000.0,
        rotary_dim: int | None = None,
        axis: str = "seq",
        convention: str = "half",
    ) -> FrequencyPlan:
        """1-D RoPE (Su et al., 2021) on axis ``axis``; ``rotary_dim < head_dim`` for partial rotary."""
        pairs = _check_head_dim(head_dim, rotary_dim)
        if not isinstance(axis, str) or not axis:
            raise ValueError(f"axis must name one coordinate axis (a non-empty str), got {axis!r}")
        freq = rope_frequencies(pairs, theta)
        return cls.from_assignment(torch.zeros(pairs, dtype=torch.long), freq, (axis,), head_dim, convention)

    @classmethod
    def axial(
        cls,
        head_dim: int,
        axes: Sequence[str] = ("h", "w"),
        sections: Sequence[int] | None = None,
        theta: float = 100.0,
        rotary_dim: int | None = None,
        convention: str = "half",
    ) -> FrequencyPlan:
        """Axial N-D RoPE: consecutive ``sections`` of pairs read ``axes`` in order.

        Each section ``s`` has its own 1-D spectrum ``theta ** (-k / s)``, ``k < s``
        (rope-vit's ``100 ** (-4k / D)`` for two axes of ``D / 4`` pairs each).
        """
        pairs = _check_head_dim(head_dim, rotary_dim)
        axes = check_axes(axes)
        if sections is None:
            if pairs % len(axes):
                raise ValueError(f"rotary pairs {pairs} do not split evenly over axes {axes}; pass sections")
            sections = [pairs // len(axes)] * len(axes)
        sections = _check_sections(sections, pairs, axes)
        index = _chunk_index(sections)
        freq = torch.cat([rope_frequencies(s, theta) for s in sections if s])
        return cls.from_assignment(index, freq, axes, head_dim, convention)

    @classmethod
    def cyclic_axes(
        cls,
        head_dim: int,
        sections: Sequence[int],
        axes: Sequence[str] = ("t", "h", "w"),
        theta: float = 10000.0,
        convention: str = "half",
    ) -> FrequencyPlan:
        """Axes take turns over the shared 1-D spectrum (Qwen3-VL, MRoPE-I).

        Pair ``p`` reads axis ``a = p mod A`` while ``p < A * sections[a]``; the pairs left
        over read ``axes[0]``. Sections ``[24, 20, 20]`` of 64 pairs give ``THW`` x 20,
        then ``TTTT``.
        """
        pairs = _check_head_dim(head_dim, None)
        axes = check_axes(axes)
        sections = _check_sections(sections, pairs, axes)
        p = torch.arange(pairs)
        index = torch.zeros(pairs, dtype=torch.long)
        for a in range(1, len(axes)):
            index[(p % len(axes) == a) & (p < len(axes) * sections[a])] = a
        return cls.from_assignment(index, rope_frequencies(pairs, theta), axes, head_dim, convention)

    @classmethod
    def chunked_axes(
        cls,
        head_dim: int,
        sections: Sequence[int],
        axes: Sequence[str] = ("t", "h", "w"),
        theta: float = 10000.0,
        convention: str = "half",
    ) -> FrequencyPlan:
        """Consecutive sections of the *shared* 1-D spectrum per axis (M-RoPE, Qwen2/2.5-VL).

        ``sections`` count rotary pairs, e.g. ``[16, 24, 24]`` for ``head_dim=128``: pairs
        0-15 (highest frequencies) read ``t``, 16-39 ``h``, 40-63 ``w``.
        """
        pairs = _check_head_dim(head_dim, None)
        axes = check_axes(axes)
        sections = _check_sections(sections, pairs, axes)
        index = _chunk_index(sections)
        return cls.from_assignment(index, rope_frequencies(pairs, theta), axes, head_dim, convention)

    @classmethod
    def per_head(
        cls,
        head_dim: int,
        num_heads: int,
        head_sections: Sequence[int],
        axes: Sequence[str] = ("t", "h", "w"),
        theta: float = 10000.0,
        convention: str = "half",
    ) -> FrequencyPlan:
        """Each head reads one axis with the full spectrum (MHRoPE).

        ``head_sections`` count heads per axis (e.g. ``[2, 3, 3]`` of 8 KV heads); heads
        beyond their sum are not rotated. ``weight`` is ``(num_heads, A, P)``.
        """
        pairs = _check_head_dim(head_dim, None)
        axes = check_axes(axes)
        num_heads = check_int(num_heads, "num_heads")
        head_sections = check_ints(head_sections, "head_sections", low=0)  # 1.5 heads is refused, not read as 1
        if len(head_sections) != len(axes) or sum(head_sections) > num_heads:
            raise ValueError(
                f"head_sections must hold one non-negative head count per axis {axes} summing to at most "
                f"num_heads={num_heads}, got {list(head_sections)}"
            )
        head_axis = torch.full((num_heads,), -1, dtype=torch.long)
        head_axis[: sum(head_sections)] = torch.repeat_interleave(torch.arange(len(axes)), torch.tensor(head_sections))
        index = head_axis.view(num_heads, 1).expand(num_heads, pairs)
        return cls.from_assignment(index, rope_frequencies(pairs, theta), axes, head_dim, convention)


# -------------------------------------------------------------------- functions
def plan_angles(weight: Tensor, pos: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """Angles from a plan ``weight`` and positions ``pos`` ``(B, N, A)``.

    Returns ``(B, N, P)`` for an ``(A, P)`` weight and ``(B, H, N, P)`` for ``(H, A, P)``.
    """
    pos = pos.to(dtype)
    w = weight.to(dtype)
    if w.dim() == 2:
        return (pos.unsqueeze(-1) * w).sum(-2)  # (B, N, A, 1) * (A, P) -> (B, N, P)
    return (pos[:, None, :, :, None] * w[None, :, None]).sum(-2)  # (B, H, N, A, P) -> (B, H, N, P)


#: bytes of ``q`` or ``k`` per block of tokens in the eager CPU rotation (its scratch buffer stays in cache)
_BLOCK_BYTES = 1 << 20


def _pair_tables(cos: Tensor, sin: Tensor, convention: str) -> tuple[Tensor, Tensor]:
    """``(B, Ht, N, 2P)`` tables from ``(B, N, P)`` or ``(B, Ht, N, P)`` cos / sin (``Ht = 1`` when shared).

    Full-width, in the channel order of ``convention``: ``cos`` on both members of a pair, and
    ``-sin`` on the member whose partner moves into it first, ``+sin`` on the other, so that
    ``x * cos2 + swap(x) * sin2`` is the rotation (:func:`_swap_pairs`).
    """
    if cos.dim() == 3:
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    if convention == "half":  # [c, c], [-s, s]
        return torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)
    if convention == "interleaved":  # c0 c0 c1 c1 .., -s0 s0 -s1 s1 ..
        return torch.stack((cos, cos), dim=-1).flatten(-2), torch.stack((-sin, sin), dim=-1).flatten(-2)
    raise ValueError(f"convention must be one of {CONVENTIONS}, got {convention!r}")


def _swap_pairs(x: Tensor, convention: str) -> Tensor:
    """A new tensor with the two members of every pair exchanged (``[x2, x1]`` for ``"half"``)."""
    if convention == "half":
        return x.unflatten(-1, (2, -1)).flip(-2).flatten(-2)
    return x.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)


def _empty_in_layout(x: Tensor) -> Tensor:
    """An uninitialised tensor of ``x``'s shape whose memory runs in the order of ``x``'s strides."""
    order = sorted(range(x.dim()), key=lambda d: x.stride(d), reverse=True)
    return x.new_empty([x.shape[d] for d in order]).permute([order.index(d) for d in range(x.dim())])


def _rotate(x: Tensor, cos2: Tensor, sin2: Tensor, convention: str, exact: bool, out: Tensor | None = None) -> Tensor:
    """Rotate ``x`` ``(B, H, N, 2P)`` by ``(B, Ht, N, 2P)`` tables in ``x.dtype`` (``Ht`` divides ``H``).

    The rotation is ``x * cos2 + swap(x) * sin2``, per pair ``(x1 c - x2 s, x2 c + x1 s)``. Hugging Face
    (``q * cos + rotate_half(q) * sin``) rounds each product, then their sum; ``exact`` keeps that
    rounding (products and sums commute exactly in IEEE arithmetic), so outputs are bit-identical.
    ``exact=False`` fuses the cosine product into the sum (``addcmul``: one rounding fewer).

    ``out`` (same shape, dtype and device as ``x``; ``x`` itself for a rotation in place) receives the
    result; ``None`` allocates it in ``x``'s memory order. Eager, without autograd, the work runs in
    token blocks of ``_BLOCK_BYTES`` (on CPU; one block on other devices, where the caching allocator
    makes a temporary cheap and every block is a launch): the block's sine products go into one reused,
    cache-sized buffer, its cosine products straight into ``out`` (element by element, so ``out`` may be
    ``x``), and the buffer is added in place; nothing but ``out`` and that buffer is allocated and q / k
    cross main memory once each way. Under ``torch.compile`` or autograd the same operations are written
    out of place (inductor fuses them into one pass) and copied into ``out`` when it is given.
    """
    h = x.shape[1]
    heads = cos2.shape[1]
    if h % heads:
        raise ValueError(f"per-head rotary angles for {heads} heads cannot serve {h} heads")
    grouped = 1 < heads < h
    target = out
    if grouped:  # (B, Ht, G, N, 2P): query heads grouped per key head (GQA), tables (B, Ht, 1, N, 2P)
        x, cos2, sin2 = x.unflatten(1, (heads, h // heads)), cos2.unsqueeze(2), sin2.unsqueeze(2)
        target = None if out is None else out.unflatten(1, (heads, h // heads))
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or cos2.requires_grad or sin2.requires_grad)
    if torch.compiler.is_compiling() or needs_grad:
        rotated = _swap_pairs(x, convention) * sin2
        rotated = rotated + x * cos2 if exact else torch.addcmul(rotated, x, cos2)
        if target is None:
            return rotated.flatten(1, 2) if grouped else rotated
        target.copy_(rotated)
        return out
    if target is None:
        target = _empty_in_layout(x)
    _rotate_in_blocks(target, x, cos2, sin2, convention, exact)
    if out is not None:
        return out
    return target.flatten(1, 2) if grouped else target


def _swapped_products(buf: Tensor, x: Tensor, sin2: Tensor, convention: str) -> None:
    """``buf = swap(x) * sin2``, each product rounded, read from ``x``'s halves (no swapped copy of ``x``)."""
    p = x.shape[-1] // 2
    if convention == "half":  # (x2 * -s, x1 * s)
        torch.mul(x[..., p:], sin2[..., :p], out=buf[..., :p])
        torch.mul(x[..., :p], sin2[..., p:], out=buf[..., p:])
    else:  # pairs (2i, 2i + 1): (x[2i + 1] * -s, x[2i] * s)
        torch.mul(x[..., 1::2], sin2[..., 0::2], out=buf[..., 0::2])
        torch.mul(x[..., 0::2], sin2[..., 1::2], out=buf[..., 1::2])


def _rotate_in_blocks(out: Tensor, x: Tensor, cos2: Tensor, sin2: Tensor, convention: str, exact: bool) -> None:
    """``out = x * cos2 + swap(x) * sin2`` over token blocks (dimension -2) through one buffer; ``out`` may be ``x``."""
    n = x.shape[-2]
    rows = n if x.device.type != "cpu" else max(1, min(n, _BLOCK_BYTES * n // max(1, x.numel() * x.element_size())))
    buf = _empty_in_layout(x[..., :rows, :])
    for i in range(0, n, rows):  # token blocks of fixed size: a cache tile, not a loop over tokens
        j = min(i + rows, n)
        block, xb, ob = buf[..., : j - i, :], x[..., i:j, :], out[..., i:j, :]
        _swapped_products(block, xb, sin2[..., i:j, :], convention)  # (-x2 s, x1 s), rounded
        if exact:
            torch.mul(xb, cos2[..., i:j, :], out=ob)  # x1 c, x2 c, rounded (in place when out is x)
            ob.add_(block)  # + (-x2 s, x1 s), rounded
        else:
            torch.addcmul(block, xb, cos2[..., i:j, :], out=ob)  # one rounding of x c + (-x2 s, x1 s)


def _check_out(out: Tensor, x: Tensor, name: str) -> None:
    if not isinstance(out, Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(out).__name__}")
    if out.shape != x.shape or out.dtype != x.dtype or out.device != x.device:
        raise ValueError(
            f"{name} must match its input: shape {tuple(x.shape)}, {x.dtype} on {x.device}; "
            f"got shape {tuple(out.shape)}, {out.dtype} on {out.device}"
        )


def apply_rotary(
    x: Tensor, cos: Tensor, sin: Tensor, convention: str = "half", exact: bool = True, out: Tensor | None = None
) -> Tensor:
    """Rotate ``x`` ``(B, H, N, D)`` by angles whose ``cos``/``sin`` are ``(B, N, P)`` or ``(B, H', N, P)``.

    The first ``2P`` channels are rotated (pairs laid out per ``convention``); the rest
    pass through. ``cos``/``sin`` are used in ``x.dtype`` (as Hugging Face does); per-head
    angles for ``H'`` heads serve ``H`` query heads in groups of ``H / H'`` (grouped-query attention).
    ``exact=True`` rounds as Hugging Face's ``apply_rotary_pos_emb`` does (bit-identical outputs);
    ``exact=False`` fuses a multiply into the add (``addcmul``): faster eagerly, and in bf16/fp16
    one rounding closer to the exact rotation.

    ``out``: a tensor of ``x``'s shape, dtype and device to write the result into and return
    (a KV-cache slot, a slice of a fused QKV buffer), or ``x`` itself to rotate in place; the
    values are bit-identical to the out-of-place call. An ``out`` that overlaps the bytes ``x`` spans
    without being ``x`` is a ``ValueError``.
    """
    if out is not None:
        _check_out(out, x, "out")
        _check_no_overlap(out, x, "out", alias_ok=True)
    cos2, sin2 = _pair_tables(cos, sin, convention)
    return _rotate_channels(x, cos2.to(x.dtype), sin2.to(x.dtype), convention, exact, out)


def _rotate_channels(
    x: Tensor, cos2: Tensor, sin2: Tensor, convention: str, exact: bool, out: Tensor | None = None
) -> Tensor:
    """:func:`_rotate` on the first ``2P`` channels of ``x``; the rest are copied after them (or into ``out``)."""
    rotary = cos2.shape[-1]
    if rotary == x.shape[-1]:
        return _rotate(x, cos2, sin2, convention, exact, out)
    if out is None:
        return torch.cat((_rotate(x[..., :rotary], cos2, sin2, convention, exact), x[..., rotary:]), dim=-1)
    _rotate(x[..., :rotary], cos2, sin2, convention, exact, out[..., :rotary])
    if torch.compiler.is_compiling() or not _same_memory(out, x):  # (in place, a copy onto itself is harmless)
        out[..., rotary:].copy_(x[..., rotary:])
    return out


def _same_memory(a: Tensor, b: Tensor) -> bool:
    """Whether ``a`` and ``b`` are the same view of the same memory (an in-place call)."""
    return a.data_ptr() == b.data_ptr() and a.stride() == b.stride() and a.shape == b.shape


def _span(t: Tensor) -> tuple[int, int]:
    """The byte range ``[first, last]`` a strided tensor's elements lie in."""
    last = sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True)) if t.numel() else -1
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size() - 1


def _check_no_overlap(out: Tensor, x: Tensor, name: str, alias_ok: bool) -> None:
    """``out`` must be ``x`` itself (when ``alias_ok``) or lie outside the bytes ``x`` spans: a partial
    overlap would overwrite input that is still to be read. (Not checked while compiling.)"""
    if torch.compiler.is_compiling() or out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr():
        return
    if alias_ok and _same_memory(out, x):
        return
    (a0, a1), (b0, b1) = _span(out), _span(x)
    if a0 <= b1 and b0 <= a1:
        what = "the input itself (in place) or memory outside it" if alias_ok else "memory outside k"
        raise ValueError(f"{name} must be {what}: it overlaps input that is still to be read")


def rotate_qk(q: Tensor, k: Tensor, angles: Tensor, convention: str = "half") -> tuple[Tensor, Tensor]:
    """Rotate ``q`` ``(B, Hq, N, D)`` and ``k`` ``(B, Hk, N, D)`` by ``angles`` (float32/64)."""
    cos, sin = angles.cos(), angles.sin()
    return apply_rotary(q, cos, sin, convention), apply_rotary(k, cos, sin, convention)


@dataclass(frozen=True, eq=False)
class Rotation:
    """The ``cos`` / ``sin`` of one rotary encoder at one set of coordinates.

    Made once per forward (:meth:`mmpos.encoders.base.RotaryEncoder.rotation`) and applied by
    every layer of a stack, as timm's EVA and Hugging Face models compute their rotary
    tables once and hand them to every block. :func:`mmpos.nn.attention` accepts it in its
    ``encoders`` list in place of the encoder.

    Attributes:
        cos, sin: ``(B, N, P)`` (plan shared by the heads) or ``(B, Hk, N, P)`` (per-head plan:
            key heads ``Hk``, query heads grouped per key head), float32 or float64.
        convention: ``"half"`` or ``"interleaved"``.
        head_dim: ``D`` of q and k.
        exact: round as Hugging Face's ``apply_rotary_pos_emb`` (bit-identical); ``False``: the
            faster fused rotation of :func:`apply_rotary`.
    """

    cos: Tensor
    sin: Tensor
    convention: str
    head_dim: int
    exact: bool = True

    def rotate(
        self, q: Tensor, k: Tensor, coords: Coords | None = None, out: tuple[Tensor, Tensor] | None = None
    ) -> tuple[Tensor, Tensor]:
        """Rotate ``q`` ``(B, Hq, N, D)`` and ``k`` ``(B, Hk, N, D)``; ``coords`` is not read.

        ``out``: ``(q_out, k_out)`` of the shapes, dtypes and devices of ``q`` and ``k`` to write into and
        return (KV-cache slots, slices of a fused QKV buffer), bit-identical to the out-of-place call;
        ``out=(q, k)`` rotates in place (:meth:`rotate_`). An output overlapping its input without being
        it, or ``q_out`` (other than ``q``) overlapping ``k``, is a ``ValueError``.
        """
        if q.shape[-1] != self.head_dim or k.shape[-1] != self.head_dim:
            raise ValueError(f"q and k must have head_dim={self.head_dim}, got {q.shape[-1]} and {k.shape[-1]}")
        if not (q.is_floating_point() and k.is_floating_point()):  # an int rotation would truncate to integers
            raise TypeError(f"q and k must be floating-point tensors, got {q.dtype} and {k.dtype}")
        if q.dim() != 4 or k.dim() != 4:
            raise ValueError(f"q and k must be (B, H, N, D), got shapes {tuple(q.shape)} and {tuple(k.shape)}")
        n, b = self.cos.shape[-2], self.cos.shape[0]
        if q.shape[2] != n or k.shape[2] != n:  # never broadcast one token's angles over every token
            raise ValueError(
                f"this Rotation holds angles for {n} tokens, got q with {q.shape[2]} and k with {k.shape[2]} "
                "tokens; compute it from the coordinates of these tokens (encoder.rotation(coords))"
            )
        if b not in (1, q.shape[0]) or b not in (1, k.shape[0]):
            raise ValueError(
                f"this Rotation holds angles for batch {b}, got q batch {q.shape[0]}, k batch {k.shape[0]}"
            )
        if self.cos.dim() == 4 and (k.shape[1] != self.cos.shape[1] or q.shape[1] % self.cos.shape[1]):
            raise ValueError(
                f"per-head rotary angles for {self.cos.shape[1]} key heads: k must have {self.cos.shape[1]} heads and "
                f"q a multiple of it, got q {q.shape[1]} and k {k.shape[1]} heads"
            )
        q_out = k_out = None
        if out is not None:
            if not isinstance(out, (tuple, list)) or len(out) != 2:
                raise TypeError(f"out must be a pair (q_out, k_out) of tensors, got {type(out).__name__}")
            q_out, k_out = out
            _check_out(q_out, q, "out[0] (for q)")
            _check_out(k_out, k, "out[1] (for k)")
            _check_no_overlap(q_out, q, "out[0] (for q)", alias_ok=True)
            _check_no_overlap(k_out, k, "out[1] (for k)", alias_ok=True)
            if not torch.compiler.is_compiling() and not _same_memory(q_out, q):  # q first: k must survive
                _check_no_overlap(q_out, k, "out[0] (for q)", alias_ok=False)
        cos2, sin2 = _pair_tables(self.cos, self.sin, self.convention)  # once for q and k
        return (
            _rotate_channels(q, cos2.to(q.dtype), sin2.to(q.dtype), self.convention, self.exact, q_out),
            _rotate_channels(k, cos2.to(k.dtype), sin2.to(k.dtype), self.convention, self.exact, k_out),
        )

    def rotate_(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """Rotate ``q`` and ``k`` in place (``rotate(q, k, out=(q, k))``) and return them; bit-identical
        to :meth:`rotate`. Under autograd, ``q`` and ``k`` must not be leaves that require grad."""
        return self.rotate(q, k, out=(q, k))


def coords_angles(
    plan_weight: Tensor, axes: tuple[str, ...], coords: Coords, dtype: torch.dtype | None = None
) -> Tensor:
    """Angles for ``coords``: reads ``axes`` from ``coords`` and applies :func:`plan_angles`.

    Computed in float32, or float64 when the positions are float64.
    """
    pos = coords.pos if coords.axes == axes else coords.select(*axes).pos
    if dtype is None:
        dtype = torch.float64 if pos.dtype == torch.float64 else torch.float32
    return plan_angles(plan_weight, pos, dtype)
