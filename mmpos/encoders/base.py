"""Base classes, one per hook point of attention.

=========  ===================================================  ==========================
kind       contract                                             applied by
=========  ===================================================  ==========================
additive   ``embed(coords) -> (B, N, D)``, added to the tokens   :class:`mmpos.nn.Transformer`
conv       ``forward(x, coords) -> x`` on ``(B, N, D)`` tokens   :class:`mmpos.nn.Transformer`
rotary     ``rotate(q, k, coords) -> (q, k)``, ``(B, H, N, Dh)`` :func:`mmpos.nn.attention`
bias       ``bias(q, k, coords) -> (B, H, N, N)`` logits term    :func:`mmpos.nn.attention`
           and optionally ``output(attn, coords) -> (B, H, N, Dh)``
=========  ===================================================  ==========================
"""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor, nn

from .._validate import check_int
from ..coords import Coords
from ..rotary import FrequencyPlan, Rotation, coords_angles
from ..scaling import RopeScaling, as_scaling, build_scaling, rescaled_weight

__all__ = [
    "AdditiveEncoder",
    "BiasEncoder",
    "ConvEncoder",
    "PositionEncoder",
    "RotaryEncoder",
    "resolve_head_dim",
]


class PositionEncoder(nn.Module):
    """Common base: ``kind`` names the hook point."""

    kind: ClassVar[str] = ""


class AdditiveEncoder(PositionEncoder):
    """Adds ``embed(coords)`` ``(B or 1, N, D)`` to the tokens ``x`` ``(B, N, D)``."""

    kind = "additive"

    def embed(self, coords: Coords) -> Tensor:
        raise NotImplementedError

    def forward(self, x: Tensor, coords: Coords) -> Tensor:
        if not x.is_floating_point():  # x + emb.to(x.dtype) would truncate the encoding to integers
            raise TypeError(f"x must be a floating-point tensor, got {x.dtype}")
        coords.check_tokens(x.shape[0], x.shape[1])
        emb = self.embed(coords)
        if emb.shape[-1] != x.shape[-1]:
            raise ValueError(f"x has width {x.shape[-1]} but this encoder embeds to dim={emb.shape[-1]}")
        return x + emb.to(x.dtype)


class ConvEncoder(PositionEncoder):
    """Mixes tokens on their grid: ``forward(x, coords) -> x``, ``x`` ``(B, N, D)``."""

    kind = "conv"


class RotaryEncoder(PositionEncoder):
    """Rotates q and k by the angles of a :class:`FrequencyPlan` at the token coordinates.

    The plan's weight is a non-persistent buffer (or a parameter when ``learnable``),
    built once in ``__init__``.
    """

    kind = "rotary"
    #: ``True``: rotate bit-identically to Hugging Face's ``apply_rotary_pos_emb``; set ``False`` for
    #: the faster fused rotation (:func:`mmpos.rotary.apply_rotary`, ``exact=False``)
    exact: bool = True

    #: which pairs form one spectrum for the scaling rules (:mod:`mmpos.scaling`): ``"axis"`` or ``"shared"``
    scaling_spectrum: str = "axis"

    def __init__(self, plan: FrequencyPlan, learnable: bool = False, scaling: RopeScaling | dict | None = None) -> None:
        super().__init__()
        # a static rule is folded into the plan; a dynamic one (or one on a learned plan) acts in forward
        plan, self.attention_factor, self.rescale = build_scaling(plan, scaling, self.scaling_spectrum, learnable)
        self.scaling = as_scaling(scaling)
        self.axes = plan.axes
        self.head_dim = plan.head_dim
        self.convention = plan.convention
        if learnable:
            self.weight = nn.Parameter(plan.weight.clone())
        else:
            self.register_buffer("weight", plan.weight.clone(), persistent=False)

    def _apply(self, fn, recurse=True):
        # Keep the plan in its own precision, fixed or learnable (RoPE-Mixed): ``model.to(torch.bfloat16)``
        # moves it but must not round the frequencies (large positions would get wrong angles).
        fixed, learned = self._buffers.get("weight"), self._parameters.get("weight")
        kept = learned.data if learned is not None else None
        super()._apply(fn, recurse)
        if fixed is not None and self._buffers["weight"].dtype != fixed.dtype:
            self._buffers["weight"] = fixed.to(self._buffers["weight"].device)
        new = self._parameters.get("weight")
        if kept is not None and new is not None and new.dtype != kept.dtype:
            new.data = kept.to(new.device)
            if new.grad is not None:
                new.grad = new.grad.to(kept.dtype)
        return self

    def positions(self, coords: Coords) -> Coords:
        """The coordinates the plan reads (override to adapt, e.g. flatten a grid)."""
        return coords

    def angles(self, coords: Coords) -> Tensor:
        """``(B, N, P)`` (shared plan) or ``(B, H, N, P)`` (per-head plan), float32/64."""
        coords = self.positions(coords)
        return coords_angles(rescaled_weight(self.weight, self.rescale, coords, self.axes), self.axes, coords)

    def rotation(self, coords: Coords) -> Rotation:
        """cos / sin at ``coords``: compute once per forward, apply in every layer (:class:`~mmpos.rotary.Rotation`)."""
        angles = self.angles(coords)
        cos, sin = angles.cos(), angles.sin()
        if self.attention_factor != 1.0:  # YaRN / LongRoPE: cos and sin scaled, as Hugging Face does
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        return Rotation(cos, sin, self.convention, self.head_dim, self.exact)

    def rotate(self, q: Tensor, k: Tensor, coords: Coords) -> tuple[Tensor, Tensor]:
        self.check_qk(q, k, coords)
        return self.rotation(coords).rotate(q, k)

    def check_qk(self, q: Tensor, k: Tensor, coords: Coords) -> None:
        """``q`` ``(B, H, N, head_dim)`` and ``k`` ``(B, H_kv, N_k, head_dim)`` floating point, as ``coords`` holds
        tokens for them (static shape checks: no graph break)."""
        if q.shape[-1] != self.head_dim or k.shape[-1] != self.head_dim:
            raise ValueError(f"q and k must have head_dim={self.head_dim}, got {q.shape[-1]} and {k.shape[-1]}")
        if not (q.is_floating_point() and k.is_floating_point()):
            raise TypeError(f"q and k must be floating-point tensors, got {q.dtype} and {k.dtype}")
        coords.check_tokens(q.shape[0], q.shape[2], "q", heads=q.shape[1])
        coords.check_tokens(k.shape[0], k.shape[2], "k", heads=k.shape[1])

    def extra_repr(self) -> str:
        return (
            f"axes={self.axes}, head_dim={self.head_dim}, pairs={self.weight.shape[-1]}, convention={self.convention!r}"
        )


class BiasEncoder(PositionEncoder):
    """Adds ``bias(q, k, coords)`` to the attention logits (already in scaled units).

    ``q``, ``k`` are ``(B, H, N, Dh)`` *unscaled*; the result is ``(B or 1, H or 1, N, N)``.
    Encoders with ``has_output = True`` also add ``output(attn, coords)`` ``(B, H, N, Dh)``
    to the attention output, given the post-softmax weights ``attn`` ``(B, H, N, N)``.
    """

    kind = "bias"
    has_output: ClassVar[bool] = False

    def bias(self, q: Tensor, k: Tensor, coords: Coords) -> Tensor:
        raise NotImplementedError

    def output(self, attn: Tensor, coords: Coords) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__} has no output term")

    def gathered_bias(self, q: Tensor, coords: Coords) -> tuple[Tensor, Tensor] | None:
        """``bias`` as ``(z, ids)`` with ``bias[..., i, j] = sum_m z[..., i, ids[m, i, j]]``, or ``None``.

        An encoder whose bias is a lookup of per-query bucket scores (iRPE on keys) returns
        them, so :func:`mmpos.nn.attention` can keep no ``(B, H, N, N)`` tensor for backward.
        """
        return None


def resolve_head_dim(dim: int | None, num_heads: int | None, head_dim: int | None) -> int:
    """``head_dim``, or ``dim // num_heads``; ``ValueError`` when neither is usable."""
    dim = None if dim is None else check_int(dim, "dim")
    num_heads = None if num_heads is None else check_int(num_heads, "num_heads")
    if head_dim is not None:
        head_dim = check_int(head_dim, "head_dim")
        if dim is not None and num_heads is not None and dim != head_dim * num_heads:
            raise ValueError(
                f"head_dim={head_dim} disagrees with dim={dim} / num_heads={num_heads}; pass head_dim alone "
                "or dim and num_heads"
            )
        return head_dim
    if dim is None or num_heads is None:
        raise ValueError("pass head_dim, or dim and num_heads")
    if dim % num_heads:
        raise ValueError(f"dim={dim} must be divisible by num_heads={num_heads}")
    return dim // num_heads
