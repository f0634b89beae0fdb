"""Multi-head attention that applies position encoders at their hook points.

Backends, chosen from the encoders present (static, decided outside the data):

* rotary only (or none): ``F.scaled_dot_product_attention`` with a boolean mask (or
  ``is_causal``), the fused kernels where the device has them;
* bias encoders: SDPA with a float mask holding the biases plus the masks; on CPU, one
  encoder whose bias is gathered from per-query bucket scores (``gathered_bias``: iRPE on
  keys) runs ``mmpos.nn._biased_sdpa`` (flash forward, blocked backward) instead;
* a bias encoder with an output term (e.g. iRPE on values): an eager path that keeps
  the attention weights.

Shapes: q ``(B, Hq, N, Dh)``, k / v ``(B, Hk, N, Dh)`` with ``Hq % Hk == 0``
(grouped-query attention); output ``(B, Hq, N, Dh)``.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._validate import check_bool, check_float, check_int
from ..coords import Coords
from ..encoders.base import BiasEncoder, PositionEncoder, RotaryEncoder
from ..rotary import Rotation
from ._biased_sdpa import gathered_bias_attention, supports_gathered_bias

__all__ = ["Attention", "attention", "attention_mask"]


def attention_mask(coords: Coords | None, n: int, causal: bool, attn_mask: Tensor | None, device) -> Tensor | None:
    """Boolean ``(B or 1, 1 or H, N, N)`` mask (``True`` = may attend), or ``None`` if all may.

    Key padding comes from ``coords.mask``; query rows left with no key (padding under a
    causal mask) attend to themselves, so no row is all ``-inf``.
    """
    mask = None
    if causal:
        mask = torch.ones(n, n, dtype=torch.bool, device=device).tril().view(1, 1, n, n)
    if coords is not None and coords.mask is not None:
        keys = coords.mask[:, None, None, :]  # (B, 1, 1, N)
        mask = keys if mask is None else mask & keys
    if attn_mask is not None:
        if attn_mask.dtype != torch.bool:
            raise ValueError(f"attn_mask must be a bool tensor (True = attend), got {attn_mask.dtype}")
        mask = attn_mask if mask is None else mask & attn_mask
    if mask is not None and coords is not None and coords.mask is not None:
        eye = torch.eye(n, dtype=torch.bool, device=device).view(1, 1, n, n)
        mask = mask | (eye & ~coords.mask[:, None, :, None])  # padding queries see themselves
    return mask


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    coords: Coords | None = None,
    encoders: Sequence[PositionEncoder] = (),
    causal: bool = False,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
) -> Tensor:
    """Scaled dot-product attention with rotary and bias encoders applied.

    Args:
        q, k, v: ``(B, Hq, N, Dh)``, ``(B, Hk, N, Dh)``, ``(B, Hk, N, Dh)``.
        coords: token coordinates (``batch`` 1 or ``B``, ``N`` tokens); needed by encoders.
        encoders: rotary and bias encoders, applied in order; a rotary encoder may be given as its
            :class:`~mmpos.rotary.Rotation` (cos / sin computed once per forward for all layers).
        causal: causal mask.
        attn_mask: optional bool mask broadcastable to ``(B, Hq, N, N)``, ``True`` = attend.
        dropout_p: attention dropout, in ``[0, 1]``.
    """
    check_float(dropout_p, "dropout_p", strict=False, high=1.0)  # a Python float: no device sync
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"q, k, v must be (B, H, N, Dh) tensors, got shapes {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if not (q.is_floating_point() and k.is_floating_point() and v.is_floating_point()):
        raise TypeError(f"q, k, v must be floating-point tensors, got {q.dtype}, {k.dtype}, {v.dtype}")
    b, hq, n, d = q.shape
    hk = k.shape[1]
    if hq % hk:
        raise ValueError(f"query heads ({hq}) must be a multiple of key/value heads ({hk})")
    if encoders and coords is None:
        raise ValueError("coords must be given when encoders are used")
    if coords is not None:
        coords.check_tokens(b, n, "q", heads=hq)
    biases = []
    for enc in encoders:
        if isinstance(enc, (RotaryEncoder, Rotation)):
            q, k = enc.rotate(q, k, coords)
        elif isinstance(enc, BiasEncoder):
            biases.append(enc)
        else:
            raise TypeError(
                f"attention applies rotary and bias encoders; {type(enc).__name__} (kind={enc.kind!r}) "
                "acts on tokens: give it to mmpos.nn.Transformer instead"
            )
    mask = attention_mask(coords, n, causal, attn_mask, q.device)
    gqa = hq != hk
    if not biases:
        if mask is None:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=causal, enable_gqa=gqa)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, enable_gqa=gqa)
    kq = k.repeat_interleave(hq // hk, dim=1) if gqa else k
    vq = v.repeat_interleave(hq // hk, dim=1) if gqa else v
    if len(biases) == 1 and mask is None and not dropout_p and supports_gathered_bias(q):
        parts = biases[0].gathered_bias(q, coords)
        if parts is not None:  # a bucketed key-side bias (iRPE on keys): no (B, H, N, N) tensor kept
            return gathered_bias_attention(q, kq, vq, *parts)
    logit_bias = functools.reduce(operator.add, [enc.bias(q, kq, coords) for enc in biases])  # no 0 + (B,H,N,N) copy
    if mask is not None:
        logit_bias = logit_bias.masked_fill(~mask, float("-inf"))
    outputs = [enc for enc in biases if enc.has_output]
    if not outputs:
        return F.scaled_dot_product_attention(q, kq, vq, attn_mask=logit_bias.to(q.dtype), dropout_p=dropout_p)
    # scale q before the product (as SDPA does: no fp16 overflow of q.k), softmax in float32
    acc = torch.promote_types(q.dtype, torch.float32)  # float32, or float64 for float64 inputs
    logits = ((q * d**-0.5) @ kq.transpose(-2, -1)).to(acc) + logit_bias.to(acc)
    attn = logits.softmax(dim=-1)
    if dropout_p:
        attn = F.dropout(attn, dropout_p)
    out = attn.to(vq.dtype) @ vq
    for enc in outputs:
        out = out + enc.output(attn, coords).to(out.dtype)
    return out


class Attention(nn.Module):
    """Multi-head (grouped-query) self-attention with position encoders.

    Args:
        dim: model width.
        num_heads: query heads; ``head_dim = dim // num_heads``.
        num_kv_heads: key/value heads (GQA); defaults to ``num_heads``.
        encoders: rotary / bias encoders (see :mod:`mmpos.encoders.base`).
        causal: causal self-attention.
        qkv_bias, proj_bias: biases of the projections.
        attn_drop, proj_drop: dropout rates.

    ``forward(x (B, N, dim), coords, attn_mask=None, rotations=()) -> (B, N, dim)``; ``rotations``
    are the stack's shared rotary encoders, computed once per forward, applied before ``encoders``.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        num_kv_heads: int | None = None,
        encoders: Sequence[PositionEncoder] = (),
        causal: bool = False,
        qkv_bias: bool = True,
        proj_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
    ) -> None:
        super().__init__()
        dim, num_heads = check_int(dim, "dim"), check_int(num_heads, "num_heads")
        for flag, name in ((causal, "causal"), (qkv_bias, "qkv_bias"), (proj_bias, "proj_bias")):
            check_bool(flag, name)
        if dim % num_heads:
            raise ValueError(f"dim={dim} must be divisible by num_heads={num_heads}")
        num_kv_heads = num_heads if num_kv_heads is None else check_int(num_kv_heads, "num_kv_heads")
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads={num_heads} must be a multiple of num_kv_heads={num_kv_heads}")
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_dim = dim // num_heads
        self.causal = causal
        self.attn_drop = check_float(attn_drop, "attn_drop", strict=False, high=1.0)
        check_float(proj_drop, "proj_drop", strict=False, high=1.0)
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = nn.Linear(dim, 2 * num_kv_heads * self.head_dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim, bias=proj_bias)
        self.proj_drop = nn.Dropout(proj_drop)
        for enc in encoders:
            if not isinstance(enc, (RotaryEncoder, BiasEncoder)):
                raise TypeError(f"encoders must be rotary or bias encoders, got {type(enc).__name__}")
        self.encoders = nn.ModuleList(encoders)

    def forward(
        self,
        x: Tensor,
        coords: Coords | None = None,
        attn_mask: Tensor | None = None,
        rotations: Sequence[Rotation] = (),
    ) -> Tensor:
        b, n, _ = x.shape
        q = self.q(x).view(b, n, self.num_heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(x).view(b, n, 2, self.num_kv_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        out = attention(
            q,
            k,
            v,
            coords,
            [*rotations, *(self.encoders.values() if isinstance(self.encoders, nn.ModuleDict) else self.encoders)],
            self.causal,
            attn_mask,
            self.attn_drop if self.training else 0.0,
        )
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(b, n, -1)))
